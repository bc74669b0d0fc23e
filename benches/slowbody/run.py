#!/usr/bin/env python3
"""Slow request bodies: what slow POST bodies cost the upstream behind
floodgate and behind nginx, side by side on the same 100-worker upstream.

Usage: run.py --floodgate target/release/floodgate [--bodies 256] [--seconds 8]

Starts (all on loopback, all stopped at the end): an upstream with 100 worker threads that
counts the connections it holds; floodgate (body_timeout 5s) and nginx (proxy_request_buffering
on, its default) in front of it; then, for each proxy and each source mix (one IP, 64 IPs),
opens --bodies POSTs whose bodies trickle a byte a second, and reports the most upstream
connections held at once, how many slow clients were answered 408 or closed, and whether a
fresh client's GET was served meanwhile (its latency).
"""
import argparse, asyncio, os, shutil, socket, subprocess, tempfile, threading, time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import free_port, stop_processes, wait_port  # noqa: E402  (benches/common.py)

HELD = {"now": 0, "max": 0}
LOCK = threading.Lock()


def upstream(port):
    """100 workers; each connection is held by one worker until it closes."""
    sem = threading.BoundedSemaphore(100)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(1024)

    def serve(conn):
        with sem:
            with LOCK:
                HELD["now"] += 1
                HELD["max"] = max(HELD["max"], HELD["now"])
            try:
                conn.settimeout(30)
                buf = b""
                while True:
                    while b"\r\n\r\n" not in buf:
                        d = conn.recv(65536)
                        if not d:
                            return
                        buf += d
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    n = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            n = int(line.split(b":")[1])
                    while len(buf) < n:
                        d = conn.recv(65536)
                        if not d:
                            return
                        buf += d
                    buf = buf[n:]
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            except OSError:
                pass
            finally:
                with LOCK:
                    HELD["now"] -= 1
                conn.close()

    def accept():
        while True:
            c, _ = srv.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


async def slow_body(port, source, stats, seconds):
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    except OSError:
        stats["connect_errors"] += 1
        return
    w.write(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n")
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            w.write(b"x")
            await w.drain()
            try:
                data = await asyncio.wait_for(r.read(1024), 1.0)
                if data.startswith(b"HTTP/1.1 408"):
                    stats["408"] += 1
                    return
                if not data:
                    stats["closed"] += 1
                    return
            except asyncio.TimeoutError:
                pass
        stats["still_open"] += 1
    except (OSError, ConnectionError):
        stats["closed"] += 1
    finally:
        w.close()


async def probe(port):
    start = time.monotonic()
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.9.9", 0)), 5)
        w.write(b"GET /x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        data = await asyncio.wait_for(r.read(), 5)
        w.close()
        return f"{data.split(b' ')[1].decode()} in {(time.monotonic() - start) * 1000:.0f} ms"
    except (OSError, asyncio.TimeoutError, IndexError) as e:
        return f"failed ({type(e).__name__})"


async def attack(port, bodies, many_ips, seconds):
    stats = {"408": 0, "closed": 0, "still_open": 0, "connect_errors": 0}
    with LOCK:
        HELD["max"] = HELD["now"]
    sources = [f"127.0.{1 + i // 250}.{1 + i % 250}" for i in range(64)] if many_ips else ["127.0.0.1"]
    tasks = [asyncio.create_task(slow_body(port, sources[i % len(sources)], stats, seconds)) for i in range(bodies)]
    await asyncio.sleep(2)
    p = await probe(port)
    await asyncio.gather(*tasks)
    return stats, HELD["max"], p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--floodgate", default="target/release/floodgate")
    ap.add_argument("--bodies", type=int, default=256)
    ap.add_argument("--seconds", type=int, default=8)
    a = ap.parse_args()
    up, fg, fg_admin, ng = free_port(), free_port(), free_port(), free_port()
    upstream(up)
    d = tempfile.mkdtemp()
    with open(f"{d}/gateway.toml", "w") as f:
        f.write(f"""[server]
listen = ["127.0.0.1:{fg}"]
admin_listen = "127.0.0.1:{fg_admin}"
threads = 2
body_timeout = "5s"
access_log = false

[[upstreams]]
name = "up"
targets = ["127.0.0.1:{up}"]

[[routes]]
name = "all"
upstream = "up"
auth = "none"
""")
    with open(f"{d}/nginx.conf", "w") as f:
        f.write(f"""worker_processes 2; daemon off; pid {d}/nginx.pid; error_log {d}/nginx.err;
events {{ worker_connections 4096; }}
http {{ access_log off; client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;
  client_body_timeout 5s;
  server {{ listen 127.0.0.1:{ng}; location / {{ proxy_pass http://127.0.0.1:{up}; proxy_http_version 1.1; }} }} }}
""")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    procs = [
        subprocess.Popen([a.floodgate, "-c", f"{d}/gateway.toml", "--pid-file", f"{d}/fg.pid", "--upgrade-sock", f"{d}/fg.sock"],
                         stderr=open(f"{d}/fg.log", "w")),
        subprocess.Popen([nginx, "-c", f"{d}/nginx.conf"], stderr=subprocess.DEVNULL),
    ]
    try:
        wait_port(fg)
        wait_port(ng)
        print(f"{a.bodies} slow POST bodies (a byte a second), {a.seconds} s; upstream: 100 workers")
        print("| proxy | sources | upstream connections held (max) | slow clients 408 / closed / still open | fresh GET meanwhile |")
        print("|---|---|---:|---|---|")
        for name, port in (("floodgate", fg), ("nginx", ng)):
            for many in (False, True):
                stats, held, p = asyncio.run(attack(port, a.bodies, many, a.seconds))
                src = "64 IPs" if many else "one IP"
                print(f"| {name} | {src} | {held} | {stats['408']} / {stats['closed']} / {stats['still_open']} | {p} |")
    finally:
        stop_processes(procs, 5)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
