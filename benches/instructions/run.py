#!/usr/bin/env python3
"""Instructions and allocations per proxied request, under valgrind's callgrind: a measure
that does not depend on how busy the machine is (the load bench's req/s and CPU per request do).

Each system is run twice under `valgrind --tool=callgrind`: once driven with --warmup
kept-alive requests, once with --warmup + --requests, both stopped with SIGINT. The difference
of the two runs' instruction totals over --requests is the instructions per request, with the
start-up, the first connections and the shutdown cancelled out; the same difference of the calls
into jemalloc's entry points (the global allocator of both binaries) is the allocations per
request. The upstream is nginx answering `return 200 "ok"` (as in benches/load/run.py); the
client is this script: --connections kept-alive connections, each sending `GET /` and reading
the whole answer before its next request.

Systems: pingora-bare (benches/load/bare_proxy.rs), pingora-contract (`--contract`), fg-none
(floodgate, no rules), fg-local (one local token bucket keyed on the client IP admitting
everything: benches/load/run.py's fg-local), fg-global1 (not run by default: the same rule
global, on a redis-server this script starts; with --connections 1 every request makes its
own call, none shares a coalesced one), fg-429 (not run by default: every request over
its limit, answered 429 at the edge) and pingora-429 (`--reject`, its floor); not by
default either: fg-trace-0.01 and fg-trace-1 (fg-none with `[tracing]` at those sample ratios,
exporting to benches/load/otlp_sink.py started here; the export thread's instructions count
with the rest, and the OTLP bytes the sink received per request are reported). The floodgate config is the load bench's:
`threads = 1`, `access_log = false`, one route `match = {}`, `auth = "none"`.

    python3 benches/instructions/run.py --floodgate target/release/floodgate \
        --bare-proxy target/release/bare-proxy --out target/instructions

writes OUT/instructions.md (the table) and OUT/instructions.json, and keeps each run's
callgrind file in OUT (`callgrind_annotate OUT/fg-none.high.out` shows where they go).
About a minute per system and --repeat at the defaults.

Two caveats of instruction counts: a large memcpy (`rep movsb`) counts about an instruction
for every byte or two (Pingora moves its per-request future, about 16 KiB with floodgate's
context, twice per request: some 16,000 "instructions" that take a few hundred cycles), and
valgrind hides the CPU's SHA extensions, so a counter id's SHA-256 is counted in software
(about 3,500 instructions per rule applied).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402

log = common.logger("instructions")
ROOT = Path(__file__).resolve().parents[2]

# jemalloc's allocation entry points as tikv-jemallocator links them (prefixed `_rjem_`).
ALLOC_FNS = ("_rjem_malloc", "_rjem_mallocx", "_rjem_calloc", "_rjem_realloc", "_rjem_rallocx")

def token_bucket_rule(name: str, limit: int, window: str) -> str:
    """A local token bucket keyed on the client IP, matching every request."""
    return (f'\n[[rules]]\nname = "{name}"\nmatch = {{}}\nkey = ["ip"]\nalgorithm = "token_bucket"\n'
            f'limit = {limit}\nwindow = "{window}"\nscope = "local"\n')


# benches/load/run.py's fg-local: admits everything.
LOCAL_RULE = token_bucket_rule("local", 1_000_000_000, "1s")
# benches/load/run.py's fg-global1: the same bucket, global, in Redis.
GLOBAL_RULE = token_bucket_rule("g1", 1_000_000_000, "1s").replace('scope = "local"', 'scope = "global"')
# benches/load/run.py's fg-429: a bucket of one token an hour, every request but the first
# answered 429 (the first is in both runs of a pair, so it cancels out).
REFUSING_RULE = token_bucket_rule("tiny", 1, "1h")


def nginx_conf(d: Path, port: int) -> Path:
    return common.nginx_conf(d, port, 'location / { return 200 "ok"; }', worker_connections=1024)


# The routing systems: (route keys, more [server] keys, a request header), as in
# benches/load/run.py.
ROUTING = {
    "fg-route": (common.ROUTE_PLAIN, "", common.ROUTING_ORIGIN),
    "fg-route-edges": (common.ROUTE_EDGES, "", common.ROUTING_ORIGIN),
    "fg-deny-100k": ("match = {}", common.deny_ips(100_000), None),
}


def scale_routes(n: int, last: bool) -> str:
    """`n` routes, each with its own local rule on it (benches/scale's shape): the one the
    request (`GET /`) takes is a catch-all, last of them (`last`) or first; the others are on
    prefixes `/svcI` it does not match. With the index, the last costs what the first does."""
    names = [f"svc{i}" for i in range(n - 1)]
    names.insert(n - 1 if last else 0, "all")
    out = []
    for name in names:
        match = "{}" if name == "all" else f'{{ path_prefix = "/{name}" }}'
        out.append(f'[[routes]]\nname = "{name}"\nmatch = {match}\nupstream = "upstream"\nauth = "none"\n')
    for name in names:
        out.append(token_bucket_rule(f"r-{name}", 1_000_000_000, "1s")
                   .replace("match = {}", f'match = {{ route = "{name}" }}'))
    return "\n".join(out)


# The tracing systems: `[tracing]` at a sample ratio, exporting over OTLP/HTTP to
# benches/load/otlp_sink.py (started here); the export thread's work is counted with the rest.
TRACING = {"fg-trace-0.01": 0.01, "fg-trace-1": 1.0}


# Systems of 10,000 routes and rules (`make bench-scale` measures them under load).
SCALE = {
    "fg-scale-first": lambda: scale_routes(10_000, last=False),
    "fg-scale-last": lambda: scale_routes(10_000, last=True),
}


def floodgate_conf(d: Path, name: str, port: int, admin: int, upstream: int, rules: str,
                   store: str = 'backend = "memory"', sink: int | None = None) -> Path:
    conf = d / f"{name}.toml"
    route, server, _ = ROUTING.get(name, ("match = {}", "", None))
    if name in SCALE:
        routes = SCALE[name]()
    else:
        routes = f"""[[routes]]
name = "all"
{route}
upstream = "upstream"
auth = "none"
{rules}"""
    conf.write_text(f"""[server]
listen = ["127.0.0.1:{port}"]
admin_listen = "127.0.0.1:{admin}"
threads = 1
grace_period = "1s"
access_log = false
{server}
[store]
{store}

[[upstreams]]
name = "upstream"
targets = ["127.0.0.1:{upstream}"]

{routes}""")
    if name in TRACING and sink is not None:
        with conf.open("a") as f:
            f.write(f'\n[tracing]\notlp_endpoint = "http://127.0.0.1:{sink}/v1/traces"\n'
                    f'sample_ratio = {TRACING[name]}\n')
    return conf


def read_answer(s: socket.socket, buf: bytearray) -> int:
    """Reads one HTTP/1.1 answer with a Content-Length from `s` (leftovers stay in `buf`): its
    status."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("the proxy closed a kept-alive connection")
        buf += chunk
    head, _, _ = bytes(buf).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    m = re.search(rb"\r\ncontent-length:\s*(\d+)", head, re.I)
    need = len(head) + 4 + (int(m.group(1)) if m else 0)
    while len(buf) < need:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("the proxy closed a connection mid-answer")
        buf += chunk
    del buf[:need]
    return status


def drive(port: int, total: int, conns: int, refused: bool = False, header: bytes = b"") -> None:
    """`total` requests over `conns` kept-alive connections, each answered 200 (`refused`: each
    but the first answered 429); `header`: one more header line (with its CRLF) in each."""
    if total == 0:
        return
    req = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: instructions\r\n" + header + b"\r\n"
    errors: list[str] = []
    admitted: list[int] = []

    def one(n: int) -> None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                buf = bytearray()
                for _ in range(n):
                    s.sendall(req)
                    st = read_answer(s, buf)
                    if refused and st == 200:
                        admitted.append(1)
                    elif st != (429 if refused else 200):
                        raise RuntimeError(f"status {st}")
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(str(e))

    share = [total // conns + (1 if i < total % conns else 0) for i in range(conns)]
    threads = [threading.Thread(target=one, args=(n,)) for n in share if n]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"requests failed: {errors[0]}")
    if len(admitted) > 1:
        raise RuntimeError(f"{len(admitted)} requests admitted by a rule that admits one")


def wait_ready(port: int, p: subprocess.Popen, refused: bool, limit: float = 300,
               header: bytes = b"") -> None:
    """Until a `GET /` through the proxy is answered 200 (`refused`: 200 or 429; valgrind starts
    slowly)."""
    end = time.time() + limit
    while time.time() < end:
        if p.poll() is not None:
            raise RuntimeError(f"the proxy exited ({p.returncode}) before it answered")
        try:
            drive(port, 1, 1, refused, header)
            return
        except (OSError, RuntimeError):
            time.sleep(0.5)
    raise RuntimeError("the proxy never answered")


def parse_callgrind(path: Path) -> tuple[int, int]:
    """(instructions, calls into jemalloc's allocation entry points) of a callgrind file."""
    names: dict[str, str] = {}
    total = 0
    allocs = 0
    pending_alloc = False
    with open(path) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                total = int(line.split()[1])
            elif line.startswith("cfn="):
                m = re.match(r"cfn=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                if m:
                    if m.group(2):
                        names[m.group(1)] = m.group(2)
                    name = names.get(m.group(1), "")
                else:
                    name = line[4:].strip()
                pending_alloc = name in ALLOC_FNS
            elif line.startswith("calls="):
                if pending_alloc:
                    allocs += int(line[6:].split()[0])
                pending_alloc = False
            elif line.startswith("fn="):
                m = re.match(r"fn=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                if m and m.group(2):
                    names[m.group(1)] = m.group(2)
    return total, allocs


def sink_bytes(port: int | None) -> int:
    """What the OTLP sink on `port` has received so far, in bytes (0 without a sink)."""
    if port is None:
        return 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as r:
        return int(json.load(r)["bytes"])


def run_once(argv: list[str], port: int, requests: int, conns: int, out: Path, env: dict,
             refused: bool = False, header: bytes = b"") -> tuple[int, int]:
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--separate-threads=no"] + argv
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=open(str(out) + ".log", "w"), env=env, start_new_session=True)
    try:
        wait_ready(port, p, refused, header=header)
        drive(port, requests, conns, refused, header)
        time.sleep(0.5)
    finally:
        common.stop_processes([p], limit=120)
    return parse_callgrind(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--floodgate", default=str(ROOT / "target/release/floodgate"))
    ap.add_argument("--bare-proxy", default=str(ROOT / "target/release/bare-proxy"))
    ap.add_argument("--out", default=str(ROOT / "target/instructions"))
    ap.add_argument("--requests", type=int, default=5000, help="requests measured (5000)")
    ap.add_argument("--warmup", type=int, default=1000, help="requests in both runs (1000)")
    ap.add_argument("--connections", type=int, default=4, help="kept-alive connections (4)")
    ap.add_argument("--only", nargs="*", default=["pingora-bare", "pingora-contract", "fg-none", "fg-local"],
                    help="systems (pingora-bare pingora-contract fg-none fg-local; not by default: fg-global1, "
                         "one global rule on a redis-server started here, fg-429, "
                         "every request over its limit, answered 429, and its floor pingora-429, "
                         "the bare proxy answering 429 in request_filter; fg-route, a path_prefix route, "
                         "fg-route-edges, the same with a prefix_rewrite, 3 header edits and CORS for the "
                         "Origin sent, fg-deny-100k, 100,000 [server] deny_ips; fg-scale-first and "
                         "fg-scale-last, 10,000 routes each with its own local rule, the request's the first "
                         "or the last: against fg-local, one route and one rule; fg-trace-0.01 and "
                         "fg-trace-1, fg-none with [tracing] at those sample ratios, exporting to an "
                         "OTLP/HTTP sink started here)")
    ap.add_argument("--label", default="", help="a suffix for the systems' names in the report (a build's name)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="pairs of runs per system; the report gives their median (1). Two runs of one "
                         "binary differ by up to about 1,500 instructions per request, most of it jemalloc's "
                         "cache upkeep, whose timing varies")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="fg-instr-"))
    procs: list[subprocess.Popen] = []

    def stop() -> None:
        common.stop_processes(procs)

    def run() -> int:
        up = common.free_port()
        nginx_bin = shutil.which("nginx") or "/usr/sbin/nginx"
        nginx = subprocess.Popen([nginx_bin, "-c", str(nginx_conf(tmp, up)), "-p", str(tmp)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        procs.append(nginx)
        common.wait_port(up)
        store = 'backend = "memory"'
        if "fg-global1" in args.only:
            redis_port = common.free_port()
            redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
            procs.append(redis)
            common.wait_port(redis_port)
            store = f'backend = "redis"\nurl = "redis://127.0.0.1:{redis_port}/0"\ntimeout = "1s"'
        sink = None
        if any(n in TRACING for n in args.only):
            sink = common.free_port()
            procs.append(subprocess.Popen([sys.executable, str(ROOT / "benches/load/otlp_sink.py"),
                                           "--port", str(sink)],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
            common.wait_port(sink)
        results = {}
        env = dict(os.environ, RUST_LOG="warn")
        for name in args.only:
            port = common.free_port()
            if name.startswith("pingora-"):
                argv = [args.bare_proxy, "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{up}",
                        "--threads", "1"] + {"pingora-contract": ["--contract"],
                                             "pingora-429": ["--reject"]}.get(name, [])
            else:
                rules = {"fg-local": LOCAL_RULE, "fg-global1": GLOBAL_RULE, "fg-429": REFUSING_RULE}.get(name, "")
                conf = floodgate_conf(tmp, name, port, common.free_port(), up, rules,
                                      store if name == "fg-global1" else 'backend = "memory"', sink)
                argv = [args.floodgate, "-c", str(conf), "--pid-file", str(tmp / f"{name}.pid"),
                        "--upgrade-sock", str(tmp / f"{name}.sock")]
            label = name + args.label
            pairs = []
            for i in range(args.repeat):
                suffix = f".{i + 1}" if args.repeat > 1 else ""
                refused = name.endswith("-429")
                sent = ROUTING.get(name, ("", "", None))[2]
                header = f"{sent[0]}: {sent[1]}\r\n".encode() if sent else b""
                traced = sink if name in TRACING else None
                b0 = sink_bytes(traced)
                lo = run_once(argv, port, args.warmup, args.connections, out / f"{label}{suffix}.low.out", env,
                              refused, header)
                b1 = sink_bytes(traced)
                hi = run_once(argv, port, args.warmup + args.requests, args.connections,
                              out / f"{label}{suffix}.high.out", env, refused, header)
                b2 = sink_bytes(traced)
                exported = ((b2 - b1) - (b1 - b0)) / args.requests
                pairs.append(((hi[0] - lo[0]) / args.requests, (hi[1] - lo[1]) / args.requests, exported))
                more = f", {exported:.0f} bytes exported" if traced else ""
                log(f"{label}{suffix}: {pairs[-1][0]:,.0f} instructions, {pairs[-1][1]:.2f} allocations per request{more}")
            r = {"ir_per_request": statistics.median(p[0] for p in pairs),
                 "allocs_per_request": statistics.median(p[1] for p in pairs),
                 "runs": [{"ir_per_request": p[0], "allocs_per_request": p[1]} for p in pairs]}
            if name in TRACING:
                r["otlp_bytes_per_request"] = statistics.median(p[2] for p in pairs)
            results[label] = r
        base = results.get("pingora-bare" + args.label)
        lines = ["| system | instructions per request | ÷ pingora-bare | allocations per request |",
                 "|---|---:|---:|---:|"]
        for label, r in results.items():
            ratio = f"{r['ir_per_request'] / base['ir_per_request']:.2f}×" if base else "—"
            lines.append(f"| `{label}` | {r['ir_per_request']:,.0f} | {ratio} | {r['allocs_per_request']:.2f} |")
        for label, r in results.items():
            if "otlp_bytes_per_request" in r:
                lines.append(f"\n`{label}` exported {r['otlp_bytes_per_request']:.0f} bytes of OTLP/HTTP per request.")
        (out / "instructions.md").write_text("\n".join(lines) + "\n")
        (out / "instructions.json").write_text(json.dumps(
            {"requests": args.requests, "warmup": args.warmup, "connections": args.connections,
             "results": results}, indent=2))
        print("\n".join(lines))
        return 0

    return common.run_harness(run, stop, log)


if __name__ == "__main__":
    sys.exit(main())
