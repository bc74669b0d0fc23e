"""What every benchmark harness under benches/ needs, written once: loopback ports, the CPU and
memory a process used (from /proc), a raw RESP client for Redis's INFO (no redis-cli), an
nginx config, and the signal handling and clean-up around a harness's run.

Each harness imports it with its folder's parent on sys.path:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import common
"""
from __future__ import annotations

import grp
import os
import pwd
import signal
import socket
import subprocess
import time
from typing import Callable

CLK_TCK = os.sysconf("SC_CLK_TCK")


def logger(prefix: str) -> Callable[[str], None]:
    """A `log(msg)` printing `[prefix HH:MM:SS] msg` at once (the runs are long)."""
    def log(msg: str) -> None:
        print(f"[{prefix} {time.strftime('%H:%M:%S')}] {msg}", flush=True)
    return log


def free_port() -> int:
    """A port free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, limit: float = 30) -> None:
    """Waits up to `limit` seconds for 127.0.0.1:port to accept; exits the harness if it never
    does."""
    end = time.time() + limit
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"port {port} never opened")


def rss_kib(pid: int) -> int:
    """VmRSS of a process in KiB (0 if gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far, all its threads (zeros if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK  # utime, stime
    except (OSError, IndexError, ValueError):
        return 0.0, 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    return sum(cpu_times(pid))


def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all CPUs, /proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def redis_command(port: int, *args: str) -> bytes:
    """One command's raw RESP answer over a socket of its own: a bulk string's bytes, or the
    status line of any other answer (bulk strings are all the harnesses ask for)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"".join([f"*{len(args)}\r\n".encode()] +
                           [f"${len(a)}\r\n{a}\r\n".encode() for a in args]))
        buf = b""
        while b"\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError("redis closed the connection")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n")
        if not head.startswith(b"$"):
            return head
        n = int(head[1:])
        while len(rest) < n + 2:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        return rest[:n]


def redis_info(port: int, section: str) -> str:
    """`INFO section`, as text."""
    answer = redis_command(port, "INFO", section)
    if answer.startswith(b"-"):
        raise RuntimeError(f"redis answered {answer!r}")
    return answer.decode()


def run_harness(run: Callable[[], int], stop: Callable[[], None],
                log: Callable[[str], None]) -> int:
    """Runs `run()` with SIGTERM and SIGHUP turned into a clean exit, and `stop()` (which stops
    every process the harness started) afterwards, whatever happened: its exit status."""
    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)
    try:
        return run()
    except KeyboardInterrupt:
        log("interrupted: stopping everything")
        return 130
    except RuntimeError as e:
        log(f"failed: {e}")
        return 1
    finally:
        stop()


def redis_commandstats(port: int) -> dict[str, tuple[int, int]]:
    """(calls, µs spent) per command, from INFO commandstats."""
    out = {}
    for line in redis_info(port, "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            name, _, fields = line.partition(":")
            f = dict(kv.split("=", 1) for kv in fields.split(","))
            out[name[len("cmdstat_"):]] = (int(f.get("calls", 0)), int(f.get("usec", 0)))
    return out


def stop_processes(procs, limit: float = 10) -> None:
    """SIGINT to each process (floodgate then skips its grace period), then SIGKILL to any
    still running after `limit` seconds."""
    for p in procs:
        p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(limit)
        except subprocess.TimeoutExpired:
            p.kill()


def envoy_bootstrap(port: int, admin: int, upstream: int, http_filters: str = "",
                    route_timeout: str = "300s", upstream_host: str = "127.0.0.1",
                    manager_extra: str = "", clusters_extra: str = "", comment: str = "") -> str:
    """An Envoy v3 bootstrap the Envoy runs of every harness share: one HTTP listener on `port`
    routing everything to one static upstream, access logs off (none configured), admin on
    `admin`. `http_filters` go before the router (YAML at its indentation),
    `manager_extra` into the connection manager (after `codec_type`), `clusters_extra` after
    the upstream's cluster. The cluster's circuit breakers are raised far above any connection
    count the benches open, so that Envoy never queues or refuses on their account (the
    defaults are 1,024 connections and requests)."""
    big = 1_000_000
    head = f"# {comment}\n" if comment else ""
    return f"""{head}admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
  - name: bench
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: bench
          codec_type: AUTO{manager_extra}
          route_config:
            name: all
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: upstream, timeout: {route_timeout}}}
          http_filters:{http_filters}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    connect_timeout: 1s
    type: STATIC
    circuit_breakers:
      thresholds:
      - {{max_connections: {big}, max_pending_requests: {big}, max_requests: {big}}}
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: {upstream_host}, port_value: {upstream}}}}}}}{clusters_extra}
"""


def nginx_conf(d, port: int, locations: str, workers: int = 1, http_extra: str = "",
               worker_connections: int = 4096):
    """Writes `d`/nginx.conf: nginx in the foreground with everything it writes under `d` (pid,
    error log, temp paths; the user root runs as, when root), no access log, keep-alive that
    never closes a client's connection, one loopback server with `locations`. Returns its
    path (a pathlib.Path)."""
    from pathlib import Path
    d = Path(d)
    user = ""
    if os.geteuid() == 0:
        pw = pwd.getpwuid(0)
        user = f"user {pw.pw_name} {grp.getgrgid(pw.pw_gid).gr_name};"
    conf = d / "nginx.conf"
    conf.write_text(f"""
{user}
worker_processes {workers};
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
worker_rlimit_nofile {2 * worker_connections + 64};
events {{ worker_connections {worker_connections}; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    {http_extra}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        {locations}
    }}
}}
""")
    return conf


# ---- floodgate's routing systems (benches/load and benches/instructions) ----------------------

# The Origin the routing systems' client sends, allowed by ROUTE_EDGES's cors.
ROUTING_ORIGIN = ("origin", "http://app.bench")
# A route on a path prefix and nothing else: the baseline of ROUTE_EDGES.
ROUTE_PLAIN = 'match = { path_prefix = "/" }'
# The same route with a prefix_rewrite, three header edits and CORS for ROUTING_ORIGIN.
ROUTE_EDGES = (ROUTE_PLAIN + '\nprefix_rewrite = "/v1"\n'
               'request_headers = { set = { "X-Tenant" = "bench", "X-Client" = "${client_ip}" } }\n'
               'response_headers = { set = { "X-Served-By" = "floodgate" } }\n'
               'cors = { allow_origins = ["http://app.bench"] }')


def deny_ips(n: int) -> str:
    """A `[server] deny_ips` line of `n` distinct /24 networks from 10.0.0.0 on, none of them
    loopback (the benchmark's client is in none)."""
    nets = (f'"{10 + i // 65536}.{(i // 256) % 256}.{i % 256}.0/24"' for i in range(n))
    return "deny_ips = [" + ", ".join(nets) + "]\n"
