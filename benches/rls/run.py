#!/usr/bin/env python3
"""floodgate's rate-limit service under load: h2load (Debian `nghttp2-client`) drives unary
`ShouldRateLimit` calls over HTTP/2 cleartext, one hot descriptor, on loopback.

h2load speaks gRPC when given a body file holding the 5-byte gRPC frame header and the
serialized request, with `content-type: application/grpc` and `te: trailers`. It sees only
HTTP statuses (gRPC errors are HTTP 200 too), so every run is checked against floodgate's own
`floodgate_rls_requests_total{result="ok"}`: a run counts only if every call was answered OK.

Systems (floodgate only: Limitador, the issue's peer, is built from its repository and cannot be
built on this machine in reasonable time, so its numbers are not measured here):

  rls-local    one local limit (in process)
  rls-global   one global limit on redis-server (one EVALSHA per decision)
  rls-lease    the same global limit with lease = "auto" (exact; Redis calls per decision ~0)

Usage: python3 benches/rls/run.py [--floodgate target/release/floodgate] [--requests N]
       [--connections 16] [--streams 8] [--out target/bench]
Every process started is stopped at the end, also on an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(tag: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(tag << 3 | 2) + varint(len(payload)) + payload


def grpc_body(domain: str, entries: list[tuple[str, str]]) -> bytes:
    """RateLimitRequest{domain, descriptors: [{entries}]} in a gRPC frame."""
    descriptor = b"".join(field(1, field(1, k.encode()) + field(2, v.encode())) for k, v in entries)
    msg = field(1, domain.encode()) + field(2, descriptor)
    return b"\x00" + len(msg).to_bytes(4, "big") + msg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, what: str, limit: float = 30) -> None:
    end = time.time() + limit
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not listen on {port}")


def metric(admin: int, series: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def redis_evalsha(port: int) -> int:
    out = subprocess.run(["redis-cli", "-p", str(port), "info", "commandstats"],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"cmdstat_evalsha:calls=(\d+)", out)
    return int(m.group(1)) if m else 0


LIMIT = ('name = "hot"\ndomain = "bench"\ndescriptor = [{ key = "user" }]\n'
         'algorithm = "token_bucket"\nlimit = 1000000000000\nwindow = "1s"\n')


def config(system: str, rls: int, admin: int, redis: int) -> str:
    head = (f'[server]\nadmin_listen = "127.0.0.1:{admin}"\nthreads = 1\naccess_log = false\n\n'
            f'[rls]\nlisten = "127.0.0.1:{rls}"\n\n')
    if system == "rls-local":
        return head + "[[rls.limits]]\n" + LIMIT + 'scope = "local"\n'
    store = f'[store]\nbackend = "redis"\nurl = "redis://127.0.0.1:{redis}"\ntimeout = "1s"\n\n'
    extra = 'lease = "auto"\n' if system == "rls-lease" else ""
    return head + store + "[[rls.limits]]\n" + LIMIT + extra


def h2load(port: int, body: str, n: int, c: int, m: int) -> dict:
    url = f"http://127.0.0.1:{port}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    out = subprocess.run(
        ["h2load", "-n", str(n), "-c", str(c), "-m", str(m), "-d", body,
         "-H", "content-type: application/grpc", "-H", "te: trailers", url],
        capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out).group(1))
    ok2xx = int(re.search(r"status codes: (\d+) 2xx", out).group(1))
    t = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", out)
    return {"rps": rps, "2xx": ok2xx, "min": t.group(1), "max": t.group(2), "mean": t.group(3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--floodgate", default="target/release/floodgate")
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--out", default="target/bench")
    a = ap.parse_args()
    for tool in ("h2load", "redis-server", "redis-cli"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing (apt-get install nghttp2-client redis-server)")
    tmp = tempfile.mkdtemp(prefix="fg-rls-bench-")
    body = os.path.join(tmp, "request.bin")
    with open(body, "wb") as f:
        f.write(grpc_body("bench", [("user", "hot")]))
    procs: list[subprocess.Popen] = []
    results = {}
    try:
        redis_port = free_port()
        redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--save", "",
                                  "--appendonly", "no", "--bind", "127.0.0.1"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(redis)
        wait_port(redis_port, redis, "redis-server")
        for system in ("rls-local", "rls-global", "rls-lease"):
            rls, admin = free_port(), free_port()
            path = os.path.join(tmp, f"{system}.toml")
            with open(path, "w") as f:
                f.write(config(system, rls, admin, redis_port))
            fg = subprocess.Popen([a.floodgate, "-c", path, "--pid-file", os.path.join(tmp, "pid"),
                                   "--upgrade-sock", os.path.join(tmp, "sock")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(fg)
            wait_port(rls, fg, "floodgate")
            h2load(rls, body, 2_000, a.connections, a.streams)  # warm-up
            ok_before = metric(admin, 'floodgate_rls_requests_total{result="ok"}')
            calls_before = redis_evalsha(redis_port)
            r = h2load(rls, body, a.requests, a.connections, a.streams)
            ok = metric(admin, 'floodgate_rls_requests_total{result="ok"}') - ok_before
            calls = redis_evalsha(redis_port) - calls_before
            r["answered_ok"] = int(ok)
            r["redis_calls_per_decision"] = calls / a.requests
            if int(ok) != a.requests:
                sys.exit(f"{system}: {int(ok)} of {a.requests} calls answered OK: {r}")
            results[system] = r
            print(system, json.dumps(r), flush=True)
            fg.send_signal(2)
            fg.wait(timeout=10)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(2)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    lines = [f"h2load -n {a.requests} -c {a.connections} -m {a.streams}, one hot descriptor, "
             "everything admitted; floodgate only (Limitador not built here)\n",
             "| system | ShouldRateLimit/s | Redis calls per decision | mean | max |",
             "|---|---:|---:|---:|---:|"]
    for s, r in results.items():
        lines.append(f"| {s} | {r['rps']:,.0f} | {r['redis_calls_per_decision']:.4f} | {r['mean']} | {r['max']} |")
    with open(os.path.join(a.out, "rls.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(a.out, "rls.json"), "w") as f:
        json.dump(results, f, indent=2)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
