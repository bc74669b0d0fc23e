"""Two systems measured at the same time on one core: `benches/load/run.py --side-by-side`.

Why: on a shared machine the speed of a core swings by a third between seconds (other tenants
of the host), so two systems measured one after the other differ by that much even when they
are the same binary: an A/A run of rounds of 5 s measured req/s ratios from 0.77 to 1.59. A
ratio taken over the same seconds is immune to those swings: both systems see the same core.

How: each system of a pair runs in a CPU cgroup of its own together with an upstream nginx of
its own, both cgroups on the servers' CPU, each loaded by its own wrk (on the client's CPU) for
the same seconds. The scheduler gives the two cgroups equal shares of the core, and inside
each the gateway shares its half with its upstream exactly as it shares the whole core in the
sequential run; so each system's req/s is what it would reach alone at half the core's speed,
and the ratio of the two is the sequential ratio without the machine's swings. (Without the
cgroups, the two gateways would get equal CPU time whatever their upstream costs, and a
helper thread of a gateway, such as the trace exporter, would get a share of its own: the
ratio would not be the one the sequential run measures.)

What it does not make alike: the two gateways take turns on one core and share its caches, so
a system with the larger code and data pays more for each turn; between two configs of one
binary (tracing, routing, the access log) that stays within the A/A resolution, between
floodgate and the bare proxy it may not (fg-none / pingora-bare measured 0.84x side by side,
0.87-0.89x in sequential runs). And a system that waits on something on the client's CPU
(Redis) is bound by that wait, not by its half of the core: those pairs are left out.

Each round is one such run; a pair's verdict is judged round by round as in the sequential
run: met when every round's ratio reaches the target, missed when none does, else not
resolved. CPU per request (the gateway's own processes, not its upstream) is reported beside.
"""

from __future__ import annotations

import os
import re
import statistics
import threading
from pathlib import Path

V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")

# (system, against, at least, what): the throughput targets of docs/benchmarks.md, judged on
# req/s ratios. The sequential report judges the same pairs, and also fg-global1 and
# fg-global3 against fg-none, left out here: a gateway that waits on Redis every request is
# bound by its round trips, and redis-server shares the client's CPU, which two wrks load side
# by side (fg-global1 measured 0.78x fg-none so, about 0.9x one after the other).
RATIO_TARGETS = [
    ("fg-none", "pingora-bare", 0.92, "floodgate no rules / bare Pingora"),
    ("fg-local", "pingora-bare", 0.90, "one local rule / bare Pingora"),
    ("fg-lease", "fg-local", 0.95, "a leased global rule / a local rule"),
    ("fg-local", "fg-local-notop", 0.97, "GET /top's tracking on / off, one rule"),
    ("fg-log", "fg-none", 0.90, "access log on / off"),
    ("fg-jwt", "fg-key", 0.90, "a cached ES256 token / an API key"),
    ("fg-route-edges", "fg-route", 0.95, "a route with prefix_rewrite, 3 header edits and CORS / without"),
    ("fg-deny-100k", "fg-none", 0.95, "100,000 deny_ips / none"),
    ("fg-trace-0.01", "fg-none", 0.98, "tracing at 1 % / no tracing"),
    ("fg-trace-1", "fg-none", 0.90, "tracing at 100 % / no tracing"),
]

# With `--stock` (`make bench-stock`) the bare proxy is Pingora as published (benches/stock),
# and the pairs against it are judged by what floodgate keeps against that: the vendored
# patches make floodgate's own bare proxy faster, so RATIO_TARGETS' bound for it would judge
# the wrong thing.
STOCK_TARGETS = [
    ("fg-none", "pingora-bare", 0.97, "floodgate no rules / Pingora as published"),
    ("fg-local", "pingora-bare", 0.90, "one local rule / Pingora as published"),
]


def targets(args) -> list[tuple[str, str, float, str]]:
    """The targets that apply: RATIO_TARGETS, with the stock proxy's for its pairs under --stock."""
    if not getattr(args, "stock", False):
        return RATIO_TARGETS
    return STOCK_TARGETS + [t for t in RATIO_TARGETS if t[1] != "pingora-bare"]


class Unavailable(Exception):
    """No CPU cgroups can be made here (no controller, or not root): the reason."""


def verdict(ratios: list[float], need: float) -> str:
    """Met when every round's ratio reaches `need`, missed when none does, else not resolved:
    the rounds' spread straddles the target and no verdict can be read from them."""
    if not ratios:
        return "not measured"
    if min(ratios) >= need:
        return "**met**"
    if max(ratios) < need:
        return "**missed**"
    return "**not resolved**"


class CpuGroups:
    """One CPU cgroup per system (v1 `cpu` controller or v2 with `cpu` available), default
    weight each; removed at the end. Root is needed to create them."""

    def __init__(self, tag: str):
        if (V1 / "cgroup.procs").is_file():
            self.base, self.v2 = V1, False
        elif "cpu" in _read(V2 / "cgroup.controllers").split():
            self.base, self.v2 = V2, True
            if "cpu" not in _read(V2 / "cgroup.subtree_control").split():
                try:
                    (V2 / "cgroup.subtree_control").write_text("+cpu")
                except OSError as e:
                    raise Unavailable(f"the cpu controller of {V2} cannot be enabled: {e}")
        else:
            raise Unavailable("no CPU cgroup controller (cgroup v1 `cpu` or v2 `cpu`) here")
        if not os.access(self.base, os.W_OK):
            raise Unavailable(f"{self.base} is not writable (run as root)")
        self.tag = tag
        self.dirs: list[Path] = []

    def wrap(self, name: str, argv: list[str]) -> list[str]:
        """`argv` run inside the cgroup of `name` (created on first use): the shell enters it
        and execs `argv`, so that every process and thread it starts is in it from the start."""
        d = self.base / f"floodgate-bench-{self.tag}-{re.sub(r'[^A-Za-z0-9._-]', '_', name)}"
        if d not in self.dirs:
            d.mkdir(exist_ok=True)
            self.dirs.append(d)
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(d / "cgroup.procs")] + argv

    def remove(self) -> None:
        """Removes the cgroups (their processes stopped: an empty cgroup is removed by rmdir)."""
        for d in reversed(self.dirs):
            try:
                d.rmdir()
            except OSError:
                pass
        self.dirs.clear()


def _read(p: Path) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""


def pairs_of(bench, extra: list[str] | None) -> list[tuple[str, str]]:
    """The pairs measured: each target pair whose two systems run, each variant against its
    base, and `extra` ("A/B"). Only floodgate and the bare proxy run in cgroups of their own
    with upstreams of their own: nginx and Envoy systems cannot be paired."""
    live = {s.name for s in bench.live() if s.kind in ("floodgate", "pingora")}
    out = [(a, b) for a, b, _, _ in targets(bench.args) if a in live and b in live]
    out += [(n, s.baseline) for n, s in bench.systems.items() if "@" in n and n in live and s.baseline in live]
    for p in extra or []:
        a, sep, b = p.partition("/")
        if not sep or a not in live or b not in live:
            raise SystemExit(f"--pair {p}: not two systems that can be paired, A/B (floodgate and bare proxy "
                             f"systems measured: {', '.join(sorted(live))})")
        out.append((a, b))
    return list(dict.fromkeys(out))


def measure(bench, pairs: list[tuple[str, str]], rounds: int, duration: float, conns: int, log) -> dict:
    """Every pair, `rounds` runs of `duration` seconds with both systems loaded at once."""
    results = {}
    for a, b in pairs:
        sa, sb = bench.systems[a], bench.systems[b]
        both(bench, (sa, sb), conns, min(2.0, duration))  # warm-up
        runs = []
        for rnd in range(rounds):
            # Which wrk starts first alternates: neither side has the core to itself longer.
            order = (sa, sb) if rnd % 2 == 0 else (sb, sa)
            cpu0 = {s.name: sum(bench.cpu(s)) for s in order}
            out = both(bench, order, conns, duration)
            cpu = {s.name: (sum(bench.cpu(s)) - cpu0[s.name]) * 1e6 / max(1, out[s.name]["requests"])
                   for s in order}
            run = {"round": rnd + 1, "rps": [out[a]["rps"], out[b]["rps"]], "cpu_us": [cpu[a], cpu[b]],
                   "p99_us": [out[a]["p99_us"], out[b]["p99_us"]],
                   "errors": [out[a]["errors"], out[b]["errors"]]}
            runs.append(run)
            log(f"side by side {a} / {b} round {rnd + 1}/{rounds}: {run['rps'][0]:.0f} / {run['rps'][1]:.0f} req/s "
                f"= {run['rps'][0] / run['rps'][1]:.3f}; CPU {cpu[a]:.1f} / {cpu[b]:.1f} µs per request")
        results[(a, b)] = runs
    return results


def both(bench, systems, conns: int, duration: float) -> dict:
    """One wrk run against each of `systems`, at the same time; their results by name."""
    out, errors = {}, []

    def go(s):
        try:
            out[s.name] = bench.wrk_run(s.port, conns, duration, bench.header_env(s))
        except Exception as e:  # noqa: BLE001 (re-raised below, in the harness's thread)
            errors.append(e)

    threads = [threading.Thread(target=go, args=(s,)) for s in systems]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def report(results: dict, args, conns: int, head: str) -> str:
    """The side-by-side section: one line per pair, the targets judged round by round."""
    need = {(a, b): (n, what) for a, b, n, what in targets(args)}
    lines = [head, "", "### Side by side", "",
             f"Each pair loaded at once, {args.rounds} rounds of `wrk -t1 -c{conns} -d{args.duration:g}s` per "
             "side; each side in a CPU cgroup of its own with its own upstream nginx, both on the servers' CPU "
             "(benches/load/side_by_side.py says why). Ratios are the first system's over the second's, "
             "round by round (median, then the rounds' range)."
             + (" `pingora-bare` is Pingora as published (benches/stock, `--stock`), judged by the "
                "targets floodgate keeps against it." if getattr(args, "stock", False) else ""), "",
             "| system | against | req/s ratio | rounds | target | verdict | CPU/req | CPU/req ratio |",
             "|---|---|---:|---|---:|---|---:|---:|"]
    for (a, b), runs in results.items():
        rps = [r["rps"][0] / r["rps"][1] for r in runs if r["rps"][1]]
        cpu = [r["cpu_us"][0] / r["cpu_us"][1] for r in runs if r["cpu_us"][1]]
        ca = statistics.median(r["cpu_us"][0] for r in runs)
        cb = statistics.median(r["cpu_us"][1] for r in runs)
        target, what = need.get((a, b), (None, ""))
        t = f"≥ {target}×" if target else "—"
        v = verdict(rps, target) if target else "—"
        lines.append(f"| `{a}` | `{b}` | {statistics.median(rps):.3f}× | {min(rps):.3f}–{max(rps):.3f} | {t} | {v} | "
                     f"{ca:.1f} / {cb:.1f} µs ({ca - cb:+.1f}) | {statistics.median(cpu):.3f}× |")
        errs = sum(sum(r["errors"]) for r in runs)
        if errs:
            lines.append(f"|  | ⚠ {errs} socket errors in this pair's runs | | | | | | |")
    lines += ["", "CPU/req: user + system CPU time of each gateway's own process (not its upstream) per "
              "request, the rounds' median; each side had half the core, so the figures are comparable "
              "within a pair, not with the sequential run's."]
    return "\n".join(lines) + "\n"
