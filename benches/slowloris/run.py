#!/usr/bin/env python3
"""Slowloris measurement: many slow connections from one IP against a running
floodgate, while a client from another loopback address and the admin /healthz are timed.

Usage: run.py --gateway 127.0.0.1:8080 --admin 127.0.0.1:9901 --pid PID [--connections 20000]
       [--attack | --probe]  (run one of each, side by side, for numbers the attack cannot skew)

Each slow connection sends a partial request head a byte every second. Prints, every second,
the slow connections currently open, a fresh client's request latency, /healthz latency and
the gateway's RSS. Loopback only; stops by itself after --seconds.
"""
import argparse, asyncio, resource, time


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def slow(host, port, stats, stop):
    while not stop.is_set():
        try:
            r, w = await asyncio.open_connection(host, port, local_addr=("127.0.0.1", 0))
        except OSError:
            stats["connect_errors"] += 1
            await asyncio.sleep(1)
            continue
        stats["open"] += 1
        try:
            w.write(b"GET /orders HTTP/1.1\r\nhost: x\r\n")
            while not stop.is_set():
                w.write(b"x")
                await w.drain()
                try:
                    data = await asyncio.wait_for(r.read(1024), 1.0)
                    if not data:
                        break
                    if data.startswith(b"HTTP/1.1 408"):
                        stats["got_408"] += 1
                except asyncio.TimeoutError:
                    pass
        except (OSError, ConnectionError):
            pass
        finally:
            stats["open"] -= 1
            stats["closed"] += 1
            w.close()
        # Closed (a cap or a deadline): dial again a second later, as a patient attacker would.
        await asyncio.sleep(1)


async def timed_get(host, port, path, source):
    start = time.monotonic()
    try:
        r, w = await asyncio.wait_for(
            asyncio.open_connection(host, port, local_addr=(source, 0)), 5)
        w.write(f"GET {path} HTTP/1.1\r\nhost: x\r\nx-api-key: test\r\nconnection: close\r\n\r\n".encode())
        data = await asyncio.wait_for(r.read(64), 5)
        w.close()
        return data.split(b" ")[1].decode(), time.monotonic() - start
    except Exception as e:  # noqa: BLE001 - a measurement reports every failure
        return f"error {type(e).__name__}", time.monotonic() - start


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--admin", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--connections", type=int, default=20000)
    ap.add_argument("--seconds", type=int, default=25)
    ap.add_argument("--probe", action="store_true",
                    help="only time a fresh client and /healthz each second (run it in a second "
                         "process beside an attacking one, so the attack's event loop does not "
                         "delay the probe)")
    ap.add_argument("--attack", action="store_true", help="only hold the slow connections")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    gh, gp = a.gateway.rsplit(":", 1)
    ah, apt = a.admin.rsplit(":", 1)
    stats = {"open": 0, "closed": 0, "connect_errors": 0, "got_408": 0}
    stop = asyncio.Event()
    tasks = []
    worst_client = worst_health = 0.0
    peak_rss = 0.0
    if a.probe:
        a.connections = 0
    for i in range(a.connections):
        tasks.append(asyncio.create_task(slow(gh, int(gp), stats, stop)))
        if i % 500 == 0:
            await asyncio.sleep(0.01)
    t0 = time.monotonic()
    while time.monotonic() - t0 < a.seconds:
        await asyncio.sleep(1)
        if a.attack:
            print(f"t={time.monotonic()-t0:5.1f}s slow_open={stats['open']:6d} closed={stats['closed']:7d} "
                  f"408s={stats['got_408']:6d} connect_errors={stats['connect_errors']}", flush=True)
            continue
        cs, ct = await timed_get(gh, int(gp), "/orders", "127.0.0.2")
        hs, ht = await timed_get(ah, int(apt), "/healthz", "127.0.0.1")
        rss = rss_mb(a.pid)
        peak_rss = max(peak_rss, rss)
        worst_client = max(worst_client, ct)
        worst_health = max(worst_health, ht)
        print(f"t={time.monotonic()-t0:5.1f}s slow_open={stats['open']:6d} closed={stats['closed']:7d} "
              f"408s={stats['got_408']:6d} client={cs} {ct*1000:7.1f}ms healthz={hs} {ht*1000:7.1f}ms rss={rss:7.1f}MB",
              flush=True)
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(f"worst client {worst_client*1000:.1f} ms, worst healthz {worst_health*1000:.1f} ms, peak RSS {peak_rss:.1f} MB")


asyncio.run(main())
