#!/usr/bin/env python3
"""Slowed downloads (`mode = "slow"`): what 1,000 slowed downloads at once cost
floodgate in memory, and whether the upstream is read only as fast as clients are served.

Usage: run.py --floodgate target/release/floodgate [--downloads 1000] [--size 1048576]
              [--rate 64KiB] [--seconds 10] [--baseline] [--nginx nginx]

Starts (all on loopback, all stopped at the end): an upstream (asyncio, one shared buffer, so
its own memory does not grow with the downloads) that serves `GET /download?bytes=N` and counts
the bytes each connection has handed to its socket; floodgate in front of it with one rule that
slows every request past the first (one shared key) to --rate; then opens --downloads
downloads of --size bytes from 64 source addresses and, for --seconds, samples floodgate's RSS
(VmRSS) and, per download, how far the upstream is ahead of the client (bytes the upstream
wrote minus bytes the client read: what sits in socket buffers and in floodgate). Reports RSS
before and at its peak, the growth per download, the largest and median lead of the upstream,
and the rate the clients got. Then the downloads are cut (clients close) and RSS is sampled
once more. `--baseline` runs the same downloads without the rule, the clients reading at
--rate themselves: what Pingora holds for as many slow readers anyway. Then the same downloads
through nginx (one worker, `limit_rate` at --rate; with --baseline, none) in front of the same
upstream, its worker's RSS measured the same way, and the ratio per download.
"""
import argparse, asyncio, os, shutil, signal, socket, subprocess, tempfile, time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import free_port, nginx_conf, rss_kib, stop_processes, wait_port  # noqa: E402  (benches/common.py)

SENT = {}  # connection id -> bytes the upstream has written to its socket
BODY = b"x" * (1 << 20)


def parse_rate(text):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)):
        if text.endswith(unit):
            return int(text[: -len(unit)]) * scale
    raise SystemExit(f"bad rate {text}")


async def serve(reader, writer):
    """One upstream connection: answers each GET /download?bytes=N from the shared buffer."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            line = head.split(b"\r\n", 1)[0].decode()
            target = line.split(" ")[1]
            n = int(target.split("bytes=")[1].split("&")[0]) if "bytes=" in target else 0
            conn = None
            for h in head.split(b"\r\n"):
                if h.lower().startswith(b"x-conn:"):
                    conn = h.split(b":", 1)[1].strip().decode()
            writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: {n}\r\n\r\n".encode())
            sent = 0
            view = memoryview(BODY)
            while sent < n:
                piece = view[: min(len(BODY), n - sent)]
                writer.write(piece)
                await writer.drain()
                sent += len(piece)
                if conn is not None:
                    SENT[conn] = sent
    except (asyncio.IncompleteReadError, ConnectionError, OSError, IndexError, ValueError):
        pass
    except asyncio.CancelledError:
        # The run ending cancels the connections still open. Ended here, not re-raised: on
        # Python 3.11 the stream's done-callback asks a cancelled task for its exception and
        # prints the CancelledError that raises as a traceback.
        pass
    finally:
        writer.close()


async def download(port, source, conn, size, received, started, pace=None):
    r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    w.write(
        f"GET /download?bytes={size} HTTP/1.1\r\nhost: bench\r\nx-client: bench\r\nx-conn: {conn}\r\n\r\n".encode()
    )
    await w.drain()
    started[conn] = time.monotonic()
    try:
        await r.readuntil(b"\r\n\r\n")
        got = 0
        t0 = time.monotonic()
        while got < size:
            d = await r.read(16384 if pace else 65536)
            if not d:
                break
            got += len(d)
            received[conn] = got
            if pace:
                # The baseline: the client itself reads at the rate (floodgate does not slow).
                await asyncio.sleep(max(0.0, t0 + got / pace - time.monotonic()))
    except (asyncio.IncompleteReadError, ConnectionError, OSError, asyncio.CancelledError):
        pass
    finally:
        w.close()


async def run(a, fg_port, up_port, pid, name="floodgate"):
    SENT.clear()
    server = await asyncio.start_server(serve, "127.0.0.1", up_port, backlog=4096)
    # The one request the rule admits at full speed: every later one is slowed.
    first = {}
    await download(fg_port, "127.0.0.1", "warm", 1024, first, {})
    await asyncio.sleep(1)
    before = rss_kib(pid)
    received, started = {}, {}
    sources = [f"127.0.{1 + i // 250}.{1 + i % 250}" for i in range(64)]
    tasks = [
        asyncio.create_task(download(fg_port, sources[i % len(sources)], str(i), a.size, received, started,
                                     parse_rate(a.rate) if a.baseline else None))
        for i in range(a.downloads)
    ]
    peak, leads = before, []
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        await asyncio.sleep(0.5)
        peak = max(peak, rss_kib(pid))
        leads = [SENT.get(c, 0) - received.get(c, 0) for c in started]
    now = time.monotonic()
    rates = [received.get(c, 0) / (now - t) for c, t in started.items() if now > t]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(2)
    after = rss_kib(pid)
    server.close()
    leads.sort()
    rates.sort()
    open_ = len(started)
    done = sum(1 for c in started if received.get(c, 0) >= a.size)
    what = "unslowed downloads read slowly by their clients" if a.baseline else "slowed downloads"
    print(f"{name}: {open_} {what} of {a.size} B at {a.rate}, sampled {a.seconds} s ({done} finished)")
    print(f"{name} RSS: {before / 1024:.1f} MiB before, {peak / 1024:.1f} MiB at peak "
          f"(+{(peak - before) / max(open_, 1):.0f} KiB per download), {after / 1024:.1f} MiB after the clients left")
    if leads:
        print(f"upstream ahead of the client: median {leads[len(leads) // 2] / 1024:.0f} KiB, "
              f"max {leads[-1] / 1024:.0f} KiB (socket buffers + {name}), "
              f"against {a.size / 1024:.0f} KiB per body")
    if rates:
        print(f"client rate: median {rates[len(rates) // 2] / 1024:.1f} KiB/s, max {rates[-1] / 1024:.1f} KiB/s")
    return {"per_download_kib": (peak - before) / max(open_, 1),
            "lead_median_kib": leads[len(leads) // 2] / 1024 if leads else None,
            "rate_median_kib": rates[len(rates) // 2] / 1024 if rates else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--floodgate", default="target/release/floodgate")
    ap.add_argument("--downloads", type=int, default=1000)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--rate", default="64KiB")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--baseline", action="store_true",
                    help="no slowing rule: the clients read at --rate themselves (what Pingora holds for slow readers anyway)")
    ap.add_argument("--nginx", default="nginx",
                    help="nginx to run the same downloads through with limit_rate (skipped when not found)")
    a = ap.parse_args()
    up, fg, fg_admin = free_port(), free_port(), free_port()
    d = tempfile.mkdtemp()
    rule = "" if a.baseline else (
        '[[rules]]\nname = "slowed"\nkey = ["header:x-client"]\nalgorithm = "fixed_window"\n'
        f'limit = 1\nwindow = "1h"\nmode = "slow"\nslow_rate = "{a.rate}"\n'
    )
    with open(f"{d}/gateway.toml", "w") as f:
        f.write(f"""[server]
listen = ["127.0.0.1:{fg}"]
admin_listen = "127.0.0.1:{fg_admin}"
threads = 2
access_log = false
max_connections_per_ip = 1024

[[upstreams]]
name = "up"
targets = ["127.0.0.1:{up}"]
read_timeout = "60s"
timeout = "10m"

[[routes]]
name = "all"
upstream = "up"
auth = "none"

{rule}""")
    fgp = subprocess.Popen(
        [a.floodgate, "-c", f"{d}/gateway.toml", "--pid-file", f"{d}/fg.pid", "--upgrade-sock", f"{d}/fg.sock"],
        stderr=open(f"{d}/fg.log", "w"),
    )
    results = {}
    try:
        wait_port(fg)
        results["floodgate"] = asyncio.run(run(a, fg, up, fgp.pid))
    finally:
        stop_processes([fgp], 10)
    if a.nginx and shutil.which(a.nginx):
        results["nginx"] = nginx(a, d, up)
    shutil.rmtree(d, ignore_errors=True)
    if "nginx" in results:
        f, n = results["floodgate"]["per_download_kib"], results["nginx"]["per_download_kib"]
        print(f"per download: floodgate {f:.0f} KiB, nginx {n:.0f} KiB ({f / max(n, 1):.2f}x nginx)")


def nginx(a, d, up):
    """The same downloads through nginx (one worker) with `limit_rate` at --rate (or, with
    --baseline, none): its worker's RSS is what is measured."""
    port = free_port()
    os.makedirs(f"{d}/nginx", exist_ok=True)
    limit = "" if a.baseline else f"limit_rate {parse_rate(a.rate)};"
    conf = nginx_conf(f"{d}/nginx", port, f"""location / {{
            proxy_pass http://127.0.0.1:{up};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_read_timeout 60s;
            {limit}
        }}""")
    p = subprocess.Popen([a.nginx, "-p", f"{d}/nginx", "-c", str(conf)], stderr=open(f"{d}/nginx.log", "w"))
    try:
        wait_port(port)
        worker = None
        for _ in range(50):
            kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
            if kids:
                worker = int(kids[0])
                break
            time.sleep(0.1)
        if worker is None:
            raise SystemExit("nginx started no worker")
        return asyncio.run(run(a, port, up, worker, "nginx"))
    finally:
        stop_processes([p], 10)

if __name__ == "__main__":
    main()
