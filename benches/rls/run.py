#!/usr/bin/env python3
"""floodgate's rate-limit service side by side with Limitador (Kuadrant's Rust RLS), one run.

h2load (Debian `nghttp2-client`) drives unary `ShouldRateLimit` calls over HTTP/2 cleartext on
loopback, one hot descriptor (`user=hot` in domain `bench`), every call admitted by one limit
that matches it. h2load speaks gRPC when given a body file holding the 5-byte gRPC frame header
and the serialized request, with `content-type: application/grpc` and `te: trailers`.

Systems:

  fg-local            floodgate, one local limit (in process)
  fg-global           floodgate, one global limit on redis-server (exact)
  fg-lease            the same global limit with lease = "auto" (exact)
  limitador-memory    Limitador, `memory` storage (per instance)
  limitador-redis     Limitador, `redis` storage (exact)
  limitador-cached    Limitador, `redis_cached` storage (its docs: "can go over limits")

floodgate's limit is a token bucket, Limitador's a fixed window (the only kind it has), each far
above what a run sends. A system whose binary is missing is reported as not measured, with the
reason. Limitador is built by benches/rls/build_limitador.sh.

Method. Rounds go through the systems in turn (A B C ... A B C ...); each run starts its server,
warms it up, measures, and stops it. The maximum is `h2load -n N -c 16 -m 8` (16 connections x
8 streams); the report gives the median over rounds. Then p99 at half of each system's median
maximum: the same 16 x 8, paced with `h2load --rps` (per connection) at half the maximum, the
latencies from h2load's per-request log. Each run counts only if every call was answered OK:
floodgate by its `floodgate_rls_requests_total{result="ok"}` and the limit's own allowed
decisions, Limitador by its `authorized_calls` (and no `limited_calls`) and a counter under the
limit (`GET /counters/bench`); before the rounds one sample call per system through `nghttp` is
decoded (overall_code OK). Redis calls per decision come from `INFO commandstats` deltas; the
commands a client sends are told from those its scripts run by a MONITOR sample during warm-up
(MONITOR marks script commands `[0 lua]`). Server CPU seconds per decision come from /proc.

Servers are pinned to CPU 0, h2load and redis-server to CPU 1 (two CPUs or more; --no-pin,
--redis-cpus to change). floodgate runs with `threads = 1` (`--threads N`; `[rls] threads` is left
at its default, the server's threads); Limitador answers RLS calls on its
main (single-threaded) runtime. Every process started is stopped at the end, also on an error,
Ctrl-C or SIGTERM. Results: OUT/rls.md (docs/benchmarks.md's tables) and OUT/rls.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402  (benches/common.py: ports, /proc, Redis INFO, clean-up)
PATH_RLS = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
DOMAIN, KEY, VALUE = "bench", "user", "hot"
LIMIT = 1_000_000_000_000  # above anything a run sends: every call is admitted
FG_SYSTEMS = ("fg-local", "fg-global", "fg-lease")
LIM_SYSTEMS = ("limitador-memory", "limitador-redis", "limitador-cached")
SYSTEMS = FG_SYSTEMS + LIM_SYSTEMS
REDIS_SYSTEMS = ("fg-global", "fg-lease", "limitador-redis", "limitador-cached")
EXACT = {"fg-local": "per instance", "fg-global": "yes", "fg-lease": "yes",
         "limitador-memory": "per instance", "limitador-redis": "yes",
         "limitador-cached": 'no ("can go over limits")'}
# The targets: (floodgate system, Limitador system, the ratio floodgate must reach).
TARGETS = (("fg-local", "limitador-memory", 1.2),
           ("fg-global", "limitador-redis", 2.5),
           ("fg-lease", "limitador-cached", 3.0))
P99_TARGET_MS = 1.0
# Commands a client sends itself (no script runs them); the harness's own are not counted.
SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")
CLIENT_ONLY = ("script", "function", "ping", "client", "hello", "select", "auth", "config",
               "multi", "exec", "discard", "watch", "unwatch", "command", "readonly", "quit")
HARNESS = ("info", "monitor")


log = common.logger("rls-bench")


# ---- the request ---------------------------------------------------------------------------

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


def read_varint(buf: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def overall_code(frame: bytes) -> int | None:
    """RateLimitResponse.overall_code (field 1) of a gRPC frame; None when there is no message."""
    if len(frame) < 5:
        return None
    msg = frame[5:5 + int.from_bytes(frame[1:5], "big")]
    i = 0
    while i < len(msg):
        tag, i = read_varint(msg, i)
        kind = tag & 7
        if kind == 0:
            value, i = read_varint(msg, i)
            if tag >> 3 == 1:
                return value
        elif kind == 2:
            n, i = read_varint(msg, i)
            i += n
        elif kind == 1:
            i += 8
        elif kind == 5:
            i += 4
        else:
            return None
    return 0  # proto3 leaves a zero enum out: UNKNOWN


# ---- helpers ---------------------------------------------------------------------------------

free_port = common.free_port
cpu_seconds = common.cpu_seconds
busy_seconds = common.busy_seconds


def http_text(port: int, path: str) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read().decode()


def metric_sum(text: str, name: str, *must: str) -> float:
    """The sum of every series of `name` whose line contains each of `must`."""
    total = 0.0
    for line in text.splitlines():
        if (line.startswith(name) and line[len(name):len(name) + 1] in ("{", " ")
                and all(m in line for m in must)):
            total += float(line.split()[-1])
    return total


def commandstats(port: int) -> dict[str, int]:
    """Calls per command, from INFO commandstats."""
    return {name.lower(): calls for name, (calls, _) in common.redis_commandstats(port).items()}


class Monitor:
    """A MONITOR connection counting commands by who sent them: a client or a script (`lua`)."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(b"MONITOR\r\n")
        self.counts: dict[tuple[str, bool], int] = {}
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        buf = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return
                buf += chunk
                *lines, buf = buf.split(b"\r\n")
                for line in lines:
                    m = re.match(rb'\+[\d.]+ \[\d+ ([^\]]+)\] "([^"]+)"', line)
                    if m:
                        key = (m.group(2).decode().lower(), m.group(1) == b"lua")
                        self.counts[key] = self.counts.get(key, 0) + 1
        except OSError:
            return

    def stop(self) -> dict[str, float]:
        """Per command seen, the share of its calls a client sent (not a script)."""
        time.sleep(0.2)  # the last lines of the sample
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.thread.join(timeout=2)
        names = {n for n, _ in self.counts}
        return {n: self.counts.get((n, False), 0) /
                (self.counts.get((n, False), 0) + self.counts.get((n, True), 0)) for n in names}


def round_trips(delta: dict[str, int], client_share: dict[str, float]) -> float:
    """Commands a client sent: from the MONITOR sample's share for commands it saw, else script
    calls and client-only commands count and every other command is taken as run by a script."""
    total = 0.0
    for name, calls in delta.items():
        if name in HARNESS:
            continue
        if name in client_share:
            total += calls * client_share[name]
        elif name in SCRIPT_COMMANDS or name in CLIENT_ONLY:
            total += calls
    return total


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest rank."""
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


class Skip(Exception):
    """A system cannot be measured; the message says why."""


# ---- the bench -------------------------------------------------------------------------------

class Bench:
    def __init__(self, a):
        self.a = a
        self.tmp = Path(tempfile.mkdtemp(prefix="fg-rls-bench-"))
        self.procs: list[subprocess.Popen] = []
        self.body = self.tmp / "request.bin"
        self.body.write_bytes(grpc_body(DOMAIN, [(KEY, VALUE)]))
        ncpu = os.cpu_count() or 1
        self.pin = not a.no_pin and ncpu >= 2
        self.server_cpus = {int(c) for c in a.server_cpus.split(",")}
        self.client_cpus = {int(c) for c in a.client_cpus.split(",")}
        self.redis_cpus = {int(c) for c in (a.redis_cpus or a.client_cpus).split(",")}
        self.redis_port = 0
        self.unavailable: dict[str, str] = {}
        self.runs: dict[str, list[dict]] = {s: [] for s in a.only}
        self.half: dict[str, list[dict]] = {s: [] for s in a.only}
        self.samples: dict[str, str] = {}

    def spawn(self, name: str, argv: list[str], cpus: set[int]) -> subprocess.Popen:
        logf = open(self.tmp / f"{name}.log", "ab")
        pin = self.pin

        def pre() -> None:
            if pin:
                os.sched_setaffinity(0, cpus)

        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                             preexec_fn=pre, start_new_session=True)
        logf.close()
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen) -> None:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)  # floodgate: exit now (SIGTERM is its graceful path)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p in self.procs:
            self.procs.remove(p)

    def stop_all(self) -> None:
        for p in list(reversed(self.procs)):
            self.stop(p)

    def log_tail(self, name: str) -> str:
        try:
            return (self.tmp / f"{name}.log").read_text(errors="replace")[-1500:]
        except OSError:
            return ""

    def wait_port(self, port: int, p: subprocess.Popen, name: str, limit: float = 30) -> None:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}: {self.log_tail(name)}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{name} did not listen on {port}: {self.log_tail(name)}")

    # ---- what is available ----

    def check_tools(self) -> None:
        fg = self.a.floodgate
        if not (os.path.isfile(fg) and os.access(fg, os.X_OK)):
            for s in FG_SYSTEMS:
                self.unavailable[s] = f"floodgate binary {fg} missing (cargo build --release)"
        lim = self.a.limitador
        if not lim:
            why = (f"{self.a.limitador_wanted} is not an executable" if self.a.limitador_wanted else
                   "limitador-server not found (build it: benches/rls/build_limitador.sh, "
                   "or `make bench-limitador`; or pass --limitador PATH)")
            for s in LIM_SYSTEMS:
                self.unavailable[s] = why
        if not shutil.which("redis-server"):
            for s in REDIS_SYSTEMS:
                self.unavailable.setdefault(s, "redis-server missing (apt-get install redis-server)")

    def start_redis(self) -> None:
        self.redis_port = free_port()
        p = self.spawn("redis", ["redis-server", "--port", str(self.redis_port), "--save", "",
                                 "--appendonly", "no", "--bind", "127.0.0.1"], self.redis_cpus)
        self.wait_port(self.redis_port, p, "redis")

    # ---- one server ----

    def start(self, system: str) -> dict:
        """Start a system's server; returns what the checks need (its process and ports)."""
        rls, admin = free_port(), free_port()
        redis_url = f"redis://127.0.0.1:{self.redis_port}"
        if system in FG_SYSTEMS:
            cfg = self.tmp / f"{system}.toml"
            cfg.write_text(floodgate_config(system, rls, admin, redis_url, self.a.threads))
            argv = [self.a.floodgate, "-c", str(cfg), "--pid-file", str(self.tmp / f"{system}.pid"),
                    "--upgrade-sock", str(self.tmp / f"{system}.sock")]
        else:
            limits = self.tmp / "limits.yaml"
            limits.write_text(LIMITADOR_LIMITS)
            storage = {"limitador-memory": ["memory"], "limitador-redis": ["redis", redis_url],
                       "limitador-cached": ["redis_cached", redis_url]}[system]
            argv = [self.a.limitador, "-b", "127.0.0.1", "-p", str(rls), "-B", "127.0.0.1",
                    "-P", str(admin), str(limits)] + storage
        p = self.spawn(system, argv, self.server_cpus)
        self.wait_port(rls, p, system)
        self.wait_port(admin, p, system)
        return {"proc": p, "rls": rls, "admin": admin}

    def counts(self, system: str, srv: dict) -> dict:
        """The server's own count of what it answered, for the checks."""
        text = http_text(srv["admin"], "/metrics")
        if system in FG_SYSTEMS:
            return {"ok": metric_sum(text, "floodgate_rls_requests_total", 'result="ok"'),
                    "matched": metric_sum(text, "floodgate_ratelimit_decisions_total",
                                          'rule="hot"', 'result="allowed"'),
                    "over": metric_sum(text, "floodgate_rls_requests_total", 'result="over_limit"')
                    + metric_sum(text, "floodgate_rls_requests_total", 'result="unavailable"')}
        return {"ok": metric_sum(text, "authorized_calls", f'"{DOMAIN}"'),
                "matched": self.limitador_used(srv),
                "over": metric_sum(text, "limited_calls", f'"{DOMAIN}"')}

    def limitador_used(self, srv: dict) -> float:
        """Units counted under the limit (max_value - remaining): proof that the limit matched."""
        counters = json.loads(http_text(srv["admin"], f"/counters/{DOMAIN}"))
        used = 0.0
        for c in counters:
            if c.get("remaining") is not None:
                used += LIMIT - c["remaining"]
        return used

    def sample_call(self, srv: dict) -> str:
        """One call through nghttp: the decoded answer, or why it is not OK."""
        if not shutil.which("nghttp"):
            return "nghttp missing: no sample call"
        r = subprocess.run(["nghttp", "-d", str(self.body), "-H", "content-type: application/grpc",
                            "-H", "te: trailers", f"http://127.0.0.1:{srv['rls']}{PATH_RLS}"],
                           capture_output=True, timeout=10)
        code = overall_code(r.stdout)
        if code != 1:
            raise RuntimeError(f"sample call: overall_code {code} (exit {r.returncode}, "
                               f"{r.stderr.decode(errors='replace')[-300:]})")
        return "overall_code OK"

    def h2load(self, port: int, n: int, rps: int = 0, log_file: Path | None = None) -> dict:
        argv = ["h2load", "-n", str(n), "-c", str(self.a.connections), "-m", str(self.a.streams),
                "-d", str(self.body), "-H", "content-type: application/grpc", "-H", "te: trailers"]
        if rps:
            argv += ["--rps", str(rps)]
        if log_file:
            argv += ["--log-file", str(log_file)]
        argv.append(f"http://127.0.0.1:{port}{PATH_RLS}")
        cpus = self.client_cpus

        def pre() -> None:
            if self.pin:
                os.sched_setaffinity(0, cpus)

        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run(argv, capture_output=True, text=True, preexec_fn=pre,
                           timeout=max(120, n / 1000))
        ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
        client_cpu = ru2.ru_utime + ru2.ru_stime - ru.ru_utime - ru.ru_stime
        out = r.stdout
        m = re.search(r"finished in ([\d.]+)(\w+), ([\d.]+) req/s", out)
        codes = re.search(r"status codes: (\d+) 2xx", out)
        done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed,"
                         r" (\d+) errored", out)
        if r.returncode != 0 or not (m and codes and done):
            raise RuntimeError(f"h2load failed ({r.returncode}): {out[-800:]} {r.stderr[-400:]}")
        secs = float(m.group(1)) / {"s": 1, "ms": 1e3, "us": 1e6}.get(m.group(2), 1)
        t = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", out)
        return {"rps": float(m.group(3)), "seconds": secs, "client_cpu_s": round(client_cpu, 3),
                "2xx": int(codes.group(1)),
                "succeeded": int(done.group(2)), "failed": int(done.group(3)) + int(done.group(4)),
                "mean": t.group(3) if t else "?", "max": t.group(2) if t else "?"}

    def run_once(self, system: str, half_rate: float = 0.0, round_no: int = 0) -> dict:
        """Start, warm up, measure, check, stop. half_rate 0: the maximum; else paced."""
        srv = self.start(system)
        try:
            if system not in self.samples:
                self.samples[system] = self.sample_call(srv)
            uses_redis = system in REDIS_SYSTEMS
            monitor = Monitor(self.redis_port) if uses_redis and not half_rate else None
            try:
                self.h2load(srv["rls"], self.a.warmup)
            finally:
                share = monitor.stop() if monitor else {}
            before = self.counts(system, srv)
            stats_before = commandstats(self.redis_port) if uses_redis else {}
            cpu_before, busy_before = cpu_seconds(srv["proc"].pid), busy_seconds()
            lat_log = self.tmp / f"{system}-{round_no}.lat" if half_rate else None
            if half_rate:
                per_conn = max(1, round(half_rate / self.a.connections))
                n = max(1000, int(per_conn * self.a.connections * self.a.half_seconds))
                r = self.h2load(srv["rls"], n, rps=per_conn, log_file=lat_log)
                r["target_rps"] = per_conn * self.a.connections
            else:
                n = self.a.requests
                r = self.h2load(srv["rls"], n)
            cpu = cpu_seconds(srv["proc"].pid) - cpu_before
            busy = busy_seconds() - busy_before
            if system == "limitador-cached":
                time.sleep(1.5)  # its counters reach Redis on a 1 s flush: count those calls too
            # Before the checks: Limitador's GET /counters reads Redis, which is not the run's.
            stats = commandstats(self.redis_port) if uses_redis else {}
            after = self.counts(system, srv)
            ok = after["ok"] - before["ok"]
            matched = after["matched"] - before["matched"]
            over = after["over"] - before["over"]
            r.update({"requests": n, "answered_ok": int(ok), "counted_under_limit": matched,
                      "over_limit": int(over), "server_cpu_s": round(cpu, 3),
                      "server_cpu_us_per_call": round(cpu / n * 1e6, 2),
                      # Shares of one CPU over the run: the one near 1.0 is what bounds it.
                      "server_cpu_share": round(cpu / r["seconds"], 3),
                      "client_cpu_share": round(r["client_cpu_s"] / r["seconds"], 3),
                      "machine_busy_s": round(busy, 3), "wall_s": round(r["seconds"], 3)})
            problems = []
            if r["2xx"] != n or r["succeeded"] != n:
                problems.append(f"{r['2xx']} HTTP 2xx / {r['succeeded']} succeeded of {n}")
            if int(ok) != n:
                problems.append(f"{int(ok)} of {n} answered OK by the server's count")
            if over:
                problems.append(f"{int(over)} over the limit")
            # The limit must have counted the calls (the cached mode counts in process first).
            if system in ("limitador-memory", "limitador-redis", *FG_SYSTEMS) and int(matched) != n:
                problems.append(f"the limit counted {matched:.0f} of {n}")
            if system == "limitador-cached" and matched <= 0:
                problems.append("the limit counted nothing")
            if problems:
                raise RuntimeError(f"{system}: " + "; ".join(problems) + f": {r}")
            if uses_redis:
                delta = {k: v - stats_before.get(k, 0) for k, v in stats.items()
                         if v - stats_before.get(k, 0) > 0 and k not in HARNESS}
                r["redis_commands_per_call"] = {k: round(v / n, 5) for k, v in sorted(delta.items())}
                if not half_rate:
                    r["redis_client_share"] = share
                    r["redis_calls_per_call"] = round(round_trips(delta, share) / n, 5)
            if lat_log:
                lat = sorted(int(line.split("\t")[2]) / 1000.0
                             for line in lat_log.read_text().splitlines() if line.count("\t") >= 2)
                r["p50_ms"] = round(percentile(lat, 50), 3)
                r["p99_ms"] = round(percentile(lat, 99), 3)
                r["p999_ms"] = round(percentile(lat, 99.9), 3)
                r["max_ms"] = round(lat[-1], 3) if lat else None
                lat_log.unlink()
            return r
        finally:
            self.stop(srv["proc"])

    # ---- the whole run ----

    def run(self) -> None:
        self.check_tools()
        todo = [s for s in self.a.only if s not in self.unavailable]
        if any(s in REDIS_SYSTEMS for s in todo):
            self.start_redis()
        for rnd in range(1, self.a.rounds + 1):
            for s in todo:
                if s in self.unavailable:
                    continue
                try:
                    r = self.run_once(s, round_no=rnd)
                except RuntimeError as e:
                    self.unavailable[s] = f"round {rnd}: {e}"
                    log(f"{s}: not measured: {e}")
                    continue
                self.runs[s].append(r)
                log(f"round {rnd} {s}: {r['rps']:,.0f} calls/s, server {r['server_cpu_us_per_call']} "
                    f"µs CPU/call" + (f", Redis {r['redis_calls_per_call']}/call"
                                      if "redis_calls_per_call" in r else ""))
        for rnd in range(1, self.a.half_rounds + 1):
            for s in todo:
                if s in self.unavailable or not self.runs[s]:
                    continue
                half = statistics.median(r["rps"] for r in self.runs[s]) / 2
                try:
                    r = self.run_once(s, half_rate=half, round_no=rnd)
                except RuntimeError as e:
                    log(f"{s}: half load failed: {e}")
                    self.half[s].append({"error": str(e)})
                    continue
                self.half[s].append(r)
                log(f"half {rnd} {s}: {r['rps']:,.0f} calls/s (asked {r['target_rps']:,}), "
                    f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms")

    # ---- the report ----

    def summary(self) -> dict:
        out = {}
        for s in self.a.only:
            runs = self.runs.get(s) or []
            half = [h for h in self.half.get(s, []) if "p99_ms" in h]
            if not runs:
                out[s] = {"measured": False, "reason": self.unavailable.get(s, "no run")}
                continue
            e = {"measured": True, "rps": statistics.median(r["rps"] for r in runs),
                 "rps_runs": [round(r["rps"]) for r in runs],
                 "cpu_us_per_call": statistics.median(r["server_cpu_us_per_call"] for r in runs),
                 "server_cpu_share": statistics.median(r["server_cpu_share"] for r in runs),
                 "client_cpu_share": statistics.median(r["client_cpu_share"] for r in runs),
                 "exact": EXACT[s]}
            if s in REDIS_SYSTEMS:
                e["redis_calls_per_call"] = statistics.median(r["redis_calls_per_call"] for r in runs)
                names = sorted({k for r in runs for k in r["redis_commands_per_call"]})
                e["redis_commands_per_call"] = {
                    k: statistics.median(r["redis_commands_per_call"].get(k, 0) for r in runs)
                    for k in names}
            if half:
                e["half_rps"] = statistics.median(h["rps"] for h in half)
                e["p50_ms"] = statistics.median(h["p50_ms"] for h in half)
                e["p99_ms"] = statistics.median(h["p99_ms"] for h in half)
                e["p99_runs"] = [h["p99_ms"] for h in half]
            if s in self.unavailable:
                e["note"] = self.unavailable[s]
            out[s] = e
        return out

    def report(self, started: float) -> None:
        summ = self.summary()
        a = self.a
        lines = [
            f"h2load -n {a.requests:,} -c {a.connections} -m {a.streams} (16 connections x 8 "
            "streams unless changed), one hot descriptor, every call admitted and checked; "
            f"medians of {a.rounds} rounds (systems alternated); p99 at half of each maximum "
            f"(`h2load --rps`, same connections and streams, {a.half_seconds:g} s, medians of "
            f"{a.half_rounds}). Servers {'on CPU ' + a.server_cpus + ', h2load on CPU ' + a.client_cpus + ', redis-server on CPU ' + (a.redis_cpus or a.client_cpus) if self.pin else 'not pinned'}.",
            "",
            "| system | ShouldRateLimit/s | runs | server CPU µs/call | CPU share server / h2load "
            "| Redis calls per decision | Redis commands per decision | p99 at half load | exact? |",
            "|---|---:|---|---:|---:|---:|---|---:|---|",
        ]
        for s, e in summ.items():
            if not e["measured"]:
                lines.append(f"| {s} | not measured: {e['reason'][:200]} | | | | | | | |")
                continue
            rc = f"{e['redis_calls_per_call']:.5f}" if "redis_calls_per_call" in e else "—"
            cmds = ", ".join(f"{k} {v:.5g}" for k, v in e.get("redis_commands_per_call", {}).items()) or "—"
            p99 = f"{e['p99_ms']:.2f} ms" if "p99_ms" in e else "—"
            lines.append(f"| {s} | {e['rps']:,.0f} | {' / '.join(f'{x:,}' for x in e['rps_runs'])} "
                         f"| {e['cpu_us_per_call']:.1f} | {e['server_cpu_share']:.2f} / "
                         f"{e['client_cpu_share']:.2f} | {rc} | {cmds} | {p99} | {e['exact']} |")
        lines += ["", "| target | floodgate | Limitador | ratio | needed | met? |",
                  "|---|---:|---:|---:|---:|---|"]
        targets = []
        for fg, lim, need in TARGETS:
            f, lm = summ.get(fg, {}), summ.get(lim, {})
            if f.get("measured") and lm.get("measured"):
                ratio = f["rps"] / lm["rps"]
                met = ratio >= need
                lines.append(f"| {fg} vs {lim} | {f['rps']:,.0f} | {lm['rps']:,.0f} | {ratio:.2f}x "
                             f"| ≥ {need:g}x | {'yes' if met else 'no'} |")
                targets.append({"floodgate": fg, "limitador": lim, "ratio": round(ratio, 3),
                                "needed": need, "met": met})
            else:
                why = "; ".join(x.get("reason", "") for x in (f, lm) if x and not x.get("measured"))
                why = why or "not run (--only)"
                lines.append(f"| {fg} vs {lim} | | | | ≥ {need:g}x | not measured ({why[:160]}) |")
                targets.append({"floodgate": fg, "limitador": lim, "met": None, "reason": why})
        for s, e in summ.items():
            if "p99_ms" in e:
                met = e["p99_ms"] < P99_TARGET_MS
                lines.append(f"| {s} p99 at half load | {e['p99_ms']:.2f} ms | | | < {P99_TARGET_MS:g} ms "
                             f"| {'yes' if met else 'no'} |")
                targets.append({"system": s, "p99_ms": e["p99_ms"], "met": met})
        load = os.getloadavg()
        lines += ["", f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, "
                  f"{time.time() - started:.0f} s, {os.cpu_count()} CPUs, load average at the end "
                  f"{load[0]:.2f}; floodgate {self.a.floodgate}, Limitador {self.a.limitador or '—'}."]
        os.makedirs(a.out, exist_ok=True)
        Path(a.out, "rls.md").write_text("\n".join(lines) + "\n")
        Path(a.out, "rls.json").write_text(json.dumps({
            "summary": summ, "targets": targets, "runs": self.runs, "half_load": self.half,
            "sample_calls": self.samples, "not_measured": self.unavailable,
            "args": {k: v for k, v in vars(a).items()}, "host": platform.node(),
            "cpus": os.cpu_count(), "floodgate_version": version(self.a.floodgate),
            "limitador_version": version(self.a.limitador)}, indent=2, default=str))
        print("\n".join(lines))


def version(binary: str | None) -> str:
    if not binary or not os.access(binary, os.X_OK):
        return ""
    try:
        r = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
        return (r.stdout or r.stderr).strip().splitlines()[-1] if (r.stdout or r.stderr) else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


def floodgate_config(system: str, rls: int, admin: int, redis_url: str, threads: int = 1) -> str:
    # `[rls] threads` is left at its default (the server's threads), as shipped.
    head = (f'[server]\nadmin_listen = "127.0.0.1:{admin}"\nthreads = {threads}\naccess_log = false\n\n'
            f'[rls]\nlisten = "127.0.0.1:{rls}"\n\n')
    limit = (f'[[rls.limits]]\nname = "hot"\ndomain = "{DOMAIN}"\ndescriptor = [{{ key = "{KEY}" }}]\n'
             f'algorithm = "token_bucket"\nlimit = {LIMIT}\nwindow = "1s"\n')
    if system == "fg-local":
        return head + limit + 'scope = "local"\n'
    store = f'[store]\nbackend = "redis"\nurl = "{redis_url}"\ntimeout = "1s"\n\n'
    return head + store + limit + ('lease = "auto"\n' if system == "fg-lease" else "")


LIMITADOR_LIMITS = f"""---
- namespace: {DOMAIN}
  name: hot
  max_value: {LIMIT}
  seconds: 3600
  conditions: []
  variables:
    - descriptors[0].{KEY}
"""


def find_limitador(explicit: str | None) -> str | None:
    """--limitador, `limitador-server` on PATH, or where build_limitador.sh puts it."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("limitador-server")
    if found:
        return found
    p = os.path.join(limitador_target(), "release", "limitador-server")
    return p if os.access(p, os.X_OK) else None


def limitador_target() -> str:
    """Where build_limitador.sh builds (the Makefile's LIMITADOR_TARGET): $LIMITADOR_TARGET, or
    ~/.cache/floodgate/limitador-target."""
    return os.environ.get("LIMITADOR_TARGET") or os.path.expanduser(
        "~/.cache/floodgate/limitador-target")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--floodgate", default=str(ROOT / "target/release/floodgate"))
    ap.add_argument("--limitador", default=None,
                    help="limitador-server (default: on PATH, or release/limitador-server under "
                         "$LIMITADOR_TARGET, default ~/.cache/floodgate/limitador-target)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds at the maximum (default 3)")
    ap.add_argument("--requests", type=int, default=200_000,
                    help="calls per run at the maximum (default 200,000)")
    ap.add_argument("--half-rounds", type=int, default=3, help="rounds at half load (default 3)")
    ap.add_argument("--half-seconds", type=float, default=5.0,
                    help="length of a half-load run in seconds (default 5)")
    ap.add_argument("--warmup", type=int, default=5_000, help="calls before each run (default 5,000)")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--only", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    ap.add_argument("--threads", type=int, default=1,
                    help="floodgate's [server] threads, which [rls] threads follows (default 1)")
    ap.add_argument("--server-cpus", default="0")
    ap.add_argument("--client-cpus", default="1")
    ap.add_argument("--redis-cpus", default=None, help="default: the client's CPUs")
    ap.add_argument("--no-pin", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "target/bench"))
    a = ap.parse_args()
    if a.rounds < 1 or a.requests < 1 or a.connections < 1 or a.streams < 1 or a.half_rounds < 0:
        sys.exit("--rounds, --requests, --connections and --streams must be at least 1")
    a.floodgate = os.path.abspath(a.floodgate)
    a.limitador_wanted = a.limitador
    a.limitador = find_limitador(a.limitador)
    if not shutil.which("h2load"):
        sys.exit("h2load is missing (apt-get install nghttp2-client; `make bench-deps` does)")

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    bench = Bench(a)
    started = time.time()
    try:
        bench.run()
    finally:
        bench.stop_all()
        shutil.rmtree(bench.tmp, ignore_errors=True)
    bench.report(started)


if __name__ == "__main__":
    main()
