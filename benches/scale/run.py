#!/usr/bin/env python3
"""floodgate at the size of a real API business (`make bench-scale`): many keys, many routes,
many rules.

For each case, one floodgate (release build, memory store, `threads = 1`) in front of one nginx
answering `return 200 "ok"`:

  start    seconds from the process's start until `GET /readyz` answers 200
  RSS      resident memory once it has settled after start (MB)
  reload   seconds a `POST /reload` takes after the keys file changed (the whole config and
           keys file read again, checked and swapped in); in brackets, with the keys file
           unchanged (its table is kept)
  first    requests per second to the first route (or the first rule's path)
  last     requests per second to the last one

Cases: 10 keys and one route with one rule (the base); 1,000 and 10,000 routes, each with its
own rule; one route with 10,000 rules each on its own exact path; 100,000 and 1,000,000 keys
(in `keys_file`) and ten routes. Every route requires a key and every request carries one. Each throughput is one
`wrk -t1 -c16 -dDs` run, first and last interleaved `--rounds` times (medians reported).

Targets (the issue this benchmark was written for): the last of 10,000 routes at >= 0.9x the
first, the first at >= 0.9x the base; 100,000 keys <= 40 MB above the base; 1,000,000 keys
start and reload in <= 3 s each and <= 300 bytes of resident memory per key. A ratio whose
rounds spread wider than its distance from the target is reported "not resolved".

Every process started is stopped at the end, also on Ctrl-C or an error. Results:
OUT/scale.md and OUT/scale.json.
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402

log = common.logger("scale")
PROCS: list[subprocess.Popen] = []


def admin(port: int, method: str, path: str, timeout: float = 60) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def keys_file(path: Path, n: int) -> str:
    """Writes `n` keys (sha256 of `secret-I`; a user per three keys, three plans) and returns
    the first key's secret."""
    plans = ("free", "pro", "enterprise")
    with open(path, "w") as f:
        for i in range(n):
            d = hashlib.sha256(f"secret-{i}".encode()).hexdigest()
            f.write(f'[[keys]]\nid = "key-{i:07d}"\nsha256 = "{d}"\n'
                    f'user = "customer-{i // 3}"\nplan = "{plans[i % 3]}"\n\n')
    return "secret-0"


RULE = ('key = ["ip"]\nalgorithm = "fixed_window"\nlimit = 1000000000\nwindow = "1s"\n')


def config(d: Path, port: int, admin_port: int, upstream: int, case: dict) -> tuple[str, str]:
    """Writes the case's gateway.toml (and keys file); returns the first and last paths. Every
    route requires a key and every request carries one, so that the cases differ only in their
    sizes."""
    head = (f'[server]\nlisten = ["127.0.0.1:{port}"]\nadmin_listen = "127.0.0.1:{admin_port}"\n'
            f'threads = 1\ngrace_period = "1s"\naccess_log = false\n\n')
    if case["keys"] > 10:
        keys_file(d / "keys.toml", case["keys"])
        head += '[auth]\nkeys_file = "keys.toml"\n\n'
    else:
        head += "".join(
            f'[[auth.keys]]\nid = "key-{i}"\nsha256 = "{hashlib.sha256(f"secret-{i}".encode()).hexdigest()}"\n\n'
            for i in range(case["keys"]))
    parts = [head, f'[[upstreams]]\nname = "u"\ntargets = ["127.0.0.1:{upstream}"]\n\n']
    n = case["routes"]
    for i in range(n):
        parts.append(f'[[routes]]\nname = "r{i}"\nmatch = {{ path_prefix = "/svc{i}" }}\n'
                     'upstream = "u"\n\n')
    if case.get("path_rules"):
        m = case["path_rules"]
        for i in range(m):
            parts.append(f'[[rules]]\nname = "p{i}"\nmatch = {{ path = "/svc0/p{i}" }}\n{RULE}\n')
        first, last = "/svc0/p0", f"/svc0/p{m - 1}"
    else:
        for i in range(n):
            parts.append(f'[[rules]]\nname = "q{i}"\nmatch = {{ route = "r{i}" }}\n{RULE}\n')
        first, last = "/svc0/x", f"/svc{n - 1}/x"
    (d / "gateway.toml").write_text("".join(parts))
    return first, last


def settle_rss(pid: int, limit: float = 20) -> int:
    """VmRSS (KiB) once three readings half a second apart agree within 1% (or after `limit`
    seconds): the allocator returns what loading left behind a few seconds later."""
    readings: list[int] = []
    end = time.time() + limit
    while time.time() < end:
        readings.append(common.rss_kib(pid))
        last = readings[-3:]
        if len(last) == 3 and max(last) - min(last) <= max(last) / 100:
            break
        time.sleep(0.5)
    return readings[-1]


def wrk(port: int, path: str, duration: int, key: str) -> float:
    cmd = pinned(["wrk", "-H", f"x-api-key: {key}", "-t1", "-c16", f"-d{duration}s",
                  f"http://127.0.0.1:{port}{path}"], 1)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 30).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if not m:
        raise RuntimeError(f"wrk printed no rate: {out}")
    if non2xx:
        raise RuntimeError(f"{path}: {non2xx.group(1)} answers were not 2xx")
    return float(m.group(1))


def pinned(cmd: list[str], cpu: int) -> list[str]:
    """`cmd` on one CPU when there are two or more (servers on 0, wrk on 1, as make bench)."""
    if PIN and shutil.which("taskset"):
        return ["taskset", "-c", str(cpu)] + cmd
    return cmd


PIN = (os.cpu_count() or 1) >= 2


def start_case(binary: str, upstream: int, case: dict, work: Path) -> dict:
    """Starts the case's floodgate: its process, ports, paths, start time, settled RSS and one
    reload's time."""
    d = work / case["name"].replace(" ", "_").replace(",", "")
    d.mkdir()
    port, admin_port = common.free_port(), common.free_port()
    first, last = config(d, port, admin_port, upstream, case)
    t0 = time.time()
    p = subprocess.Popen(pinned([binary, "-c", str(d / "gateway.toml")], 0),
                         stdout=subprocess.DEVNULL, stderr=open(d / "floodgate.log", "w"))
    PROCS.append(p)
    while True:
        if p.poll() is not None:
            raise RuntimeError(f"{case['name']}: floodgate exited; see {d}/floodgate.log")
        try:
            if admin(admin_port, "GET", "/readyz", 1)[0] == 200:
                break
        except OSError:
            pass
        if time.time() - t0 > 120:
            raise RuntimeError(f"{case['name']}: not ready after 120 s")
        time.sleep(0.02)
    start = time.time() - t0
    rss = settle_rss(p.pid)
    def reload_took() -> float:
        t1 = time.time()
        status, body = admin(admin_port, "POST", "/reload", 120)
        if status != 200:
            raise RuntimeError(f"{case['name']}: reload answered {status}: {body[:200]!r}")
        return time.time() - t1

    # A reload whose keys file did not change takes the table in force; one that did reads
    # the file again: the second is the one the targets are about.
    unchanged = reload_took()
    if (d / "keys.toml").exists():
        with open(d / "keys.toml", "a") as f:
            f.write("# changed\n")
    reload = reload_took()
    return {"proc": p, "port": port, "first_path": first, "last_path": last,
            "row": {"case": case["name"], "keys": case["keys"], "routes": case["routes"],
                    "rules": case.get("path_rules") or case["routes"], "start_s": start,
                    "rss_mb": rss / 1024, "reload_s": reload, "reload_unchanged_s": unchanged}}


def measure(run: dict, base: dict, args) -> dict:
    """Rounds of: the base's first route, the case's first, the case's last (interleaved, so
    that each ratio compares runs a few seconds apart). Stops the case's process."""
    row = run["row"]
    bases, firsts, lasts = [], [], []
    for _ in range(args.rounds):
        bases.append(wrk(base["port"], base["first_path"], args.duration, "secret-0"))
        firsts.append(wrk(run["port"], run["first_path"], args.duration, "secret-0"))
        lasts.append(wrk(run["port"], run["last_path"], args.duration, "secret-0"))
    if run is not base:
        stop(run["proc"])
    row.update({"first": statistics.median(firsts), "last": statistics.median(lasts),
                "base": statistics.median(bases), "firsts": firsts, "lasts": lasts,
                "bases": bases})
    log(f"{row['case']}: start {row['start_s']:.2f} s, RSS {row['rss_mb']:.1f} MB, reload "
        f"{row['reload_s']:.2f} s, first {row['first']:.0f}/s, last {row['last']:.0f}/s "
        f"(base {row['base']:.0f}/s)")
    return row


def stop(p: subprocess.Popen) -> None:
    p.send_signal(2)
    p.wait(10)
    PROCS.remove(p)


def verdict(ratio: float, rounds_lo: float, rounds_hi: float, target: float) -> str:
    """`met` / `missed`, or `not resolved` when the rounds straddle the target."""
    if rounds_lo < target <= rounds_hi or rounds_lo <= target < rounds_hi:
        return "not resolved"
    return "met" if ratio >= target else "missed"


def report(rows: list[dict], out: Path) -> str:
    base = rows[0]
    lines = ["| case | keys | routes | rules | start | RSS | reload | req/s first | req/s last |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['keys']:,} | {r['routes']:,} | {r['rules']:,} | {r['start_s']:.2f} s "
            f"| {r['rss_mb']:.1f} MB | {r['reload_s']:.2f} s ({r['reload_unchanged_s']:.2f} s) | {r['first']:,.0f} "
            f"({r['first'] / r['base']:.2f}) | {r['last']:,.0f} ({r['last'] / r['first']:.2f}) |")
    lines.append("")
    lines.append("In brackets: first to the base's first (run beside it in each round), last to"
                 " the case's own first. Medians of the rounds.")
    lines.append("")
    by = {r["case"]: r for r in rows}
    checks = []
    for name in ("10,000 routes", "10,000 path rules"):
        r = by.get(name)
        if not r:
            continue
        pairs = [lo / fi for lo, fi in zip(r["lasts"], r["firsts"])]
        ratio = statistics.median(pairs)
        checks.append(f"- {name}: last / first {ratio:.2f} (rounds {min(pairs):.2f}-{max(pairs):.2f}),"
                      f" target >= 0.9: {verdict(ratio, min(pairs), max(pairs), 0.9)}")
        firsts = [f / b for f, b in zip(r["firsts"], r["bases"])]
        ratio = statistics.median(firsts)
        checks.append(f"- {name}: first / base {ratio:.2f} (rounds {min(firsts):.2f}-{max(firsts):.2f}),"
                      f" target >= 0.9: {verdict(ratio, min(firsts), max(firsts), 0.9)}")
    for name, n in (("100,000 keys", 100_000), ("1,000,000 keys", 1_000_000)):
        r = by.get(name)
        if not r:
            continue
        above = r["rss_mb"] - base["rss_mb"]
        per_key = above * 1024 * 1024 / n
        line = f"- {name}: {above:.1f} MB above the base, {per_key:.0f} bytes per key (target <= 300)"
        if n == 100_000:
            line += f"; target <= 40 MB: {'met' if above <= 40 else 'missed'}"
        else:
            line += (f"; start {r['start_s']:.2f} s, reload {r['reload_s']:.2f} s (target <= 3 s each):"
                     f" {'met' if max(r['start_s'], r['reload_s']) <= 3 else 'missed'}")
        checks.append(line)
    text = "\n".join(lines + checks) + "\n"
    (out / "scale.md").write_text(text)
    (out / "scale.json").write_text(json.dumps(rows, indent=1))
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--floodgate", default="target/release/floodgate")
    ap.add_argument("--out", default="target/bench")
    ap.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    ap.add_argument("--rounds", type=int, default=3, help="first/last runs per case")
    ap.add_argument("--only", nargs="*", help="case names to run (the base always runs)")
    ap.add_argument("--max-keys", type=int, default=1_000_000, help="skip cases with more keys")
    args = ap.parse_args()
    for tool in ("wrk", "nginx"):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            raise SystemExit(f"{tool} is needed (make bench-scale installs it)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = [
        {"name": "base", "keys": 10, "routes": 1},
        {"name": "1,000 routes", "keys": 10, "routes": 1000},
        {"name": "10,000 routes", "keys": 10, "routes": 10000},
        {"name": "10,000 path rules", "keys": 10, "routes": 1, "path_rules": 10000},
        {"name": "100,000 keys", "keys": 100_000, "routes": 10},
        {"name": "1,000,000 keys", "keys": 1_000_000, "routes": 10},
    ]
    cases = [c for c in cases if c["keys"] <= args.max_keys
             and (c["name"] == "base" or not args.only or c["name"] in args.only)]

    def run() -> int:
        work = Path(tempfile.mkdtemp(prefix="floodgate-scale-"))
        upstream = common.free_port()
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        conf = common.nginx_conf(work, upstream, 'location / { return 200 "ok"; }')
        PROCS.append(subprocess.Popen(pinned([nginx, "-c", str(conf)], 0),
                                      stderr=subprocess.DEVNULL))
        common.wait_port(upstream)
        # The base runs throughout: each case's rounds measure it beside their own.
        base = start_case(args.floodgate, upstream, cases[0], work)
        rows = [measure(base, base, args)]
        for c in cases[1:]:
            rows.append(measure(start_case(args.floodgate, upstream, c, work), base, args))
        stop(base["proc"])
        print(report(rows, out))
        shutil.rmtree(work, ignore_errors=True)
        return 0

    return common.run_harness(run, lambda: common.stop_processes(PROCS), log)


if __name__ == "__main__":
    sys.exit(main())
