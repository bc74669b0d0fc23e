#!/usr/bin/env python3
"""What each patch of the vendored Pingora crates buys, one patch at a time.

The bare proxy (benches/load/bare_proxy.rs, the benches/stock package) is built once per step
of the series, each step one patch more than the one before, in the order the crates build on
each other: pingora-timeout's series, then pingora-http's, pingora-core's and pingora-proxy's.
Step 0 is Pingora as published (with each series' packaging patch 0000, which changes no
code); the last step is the vendored crates as floodgate links them. Every step is built with
the release profile of the main workspace (fat LTO, one codegen unit) against the lock file of
benches/stock, into target/patches/.

Then, for every step:
- instructions and allocations per proxied request under callgrind
  (benches/instructions/run.py, system pingora-bare), independent of how busy the machine is;
- requests a second and CPU per request in one interleaved load run (benches/load/run.py with
  a --bare-variant per step: step 0, then every other step right after it in each round).

Each patch's gain is the difference between its step and the one before. The bare proxy does
not call the API some patches add for floodgate (pingora-http's parsed inserts, reserve and
exported case names): their steps show what they cost the bare proxy, not what they save
floodgate.

    python3 benches/patches/run.py [--rounds 3] [--duration 5] [--skip-build] [--skip-load]

writes target/patches/patches.md and patches.json. Each build takes 2-4 minutes on 2 cores
(the first one longer: every dependency); `make bench-patches` runs it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "target" / "patches"
# The order the crates build on each other: a patch may use what an earlier crate's series
# added (pingora-proxy calls pingora-core's finish_in_place).
CRATES = ["pingora-timeout", "pingora-http", "pingora-core", "pingora-proxy"]
VERSION = "0.9.1"
# Patches that change no code the bare proxy runs: tests only.
TESTS_ONLY = {("pingora-http", "0005-unit-tests-of-the-additions.patch")}


def log(msg: str) -> None:
    print(f"[patches] {msg}", flush=True)


def series(crate: str) -> list[str]:
    d = ROOT / "vendor" / "patches" / f"{crate}-{VERSION}"
    return sorted(p.name for p in d.glob("[0-9][0-9][0-9][0-9]-*.patch"))


def steps() -> list[tuple[str, str, dict[str, int]]]:
    """(crate, patch, patches applied per crate) for each step; step 0 has 0000 of each."""
    applied = {c: 1 for c in CRATES}
    out = [("", "Pingora 0.9.1 as published", dict(applied))]
    for c in CRATES:
        for name in series(c)[1:]:
            applied[c] += 1
            if (c, name) in TESTS_ONLY:
                continue
            out.append((c, name, dict(applied)))
    return out


def build(index: int, applied: dict[str, int], stock_lock: Path) -> Path:
    """The bare proxy of one step, built; returns its binary (copied out of the target dir)."""
    binary = OUT / "bin" / f"step-{index:02d}"
    if binary.is_file():
        return binary
    work = OUT / f"step-{index:02d}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for c in CRATES:
        subprocess.run(["bash", str(ROOT / "vendor" / "series.sh"), "tree", c, str(applied[c]),
                        str(work / c)], check=True, stdout=subprocess.DEVNULL)
    manifest = (ROOT / "benches" / "stock" / "Cargo.toml").read_text()
    manifest = manifest.replace('path = "../load/bare_proxy.rs"',
                                f'path = "{ROOT / "benches" / "load" / "bare_proxy.rs"}"')
    manifest += "\n[patch.crates-io]\n" + "".join(f'{c} = {{ path = "{c}" }}\n' for c in CRATES)
    (work / "Cargo.toml").write_text(manifest)
    shutil.copy(stock_lock, work / "Cargo.lock")
    log(f"step {index}: building ({', '.join(f'{c} {n - 1}' for c, n in applied.items())} patches)")
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=work, check=True,
                   env={**os.environ, "CARGO_TARGET_DIR": str(OUT / "target")})
    binary.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(OUT / "target" / "release" / "bare-proxy-stock", binary)
    return binary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the load run (3)")
    ap.add_argument("--duration", type=float, default=5, help="seconds per load run (5)")
    ap.add_argument("--requests", type=int, default=5000, help="requests counted by callgrind (5000)")
    ap.add_argument("--skip-build", action="store_true", help="use the binaries built before")
    ap.add_argument("--skip-load", action="store_true", help="instructions only")
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: the table from the last run's files in target/patches/")
    args = ap.parse_args()

    OUT.mkdir(parents=True, exist_ok=True)
    plan = steps()
    stock_lock = ROOT / "benches" / "stock" / "Cargo.lock"
    binaries = []
    for i, (_, _, applied) in enumerate(plan):
        b = OUT / "bin" / f"step-{i:02d}"
        if args.skip_build or args.report_only:
            if not b.is_file():
                sys.exit(f"patches: {b} not built (run without --skip-build)")
        else:
            b = build(i, applied, stock_lock)
        binaries.append(b)

    results: list[dict] = []
    for i, ((crate, name, _), b) in enumerate(zip(plan, binaries)):
        out = OUT / f"instr-{i:02d}"
        if not args.report_only:
            subprocess.run([sys.executable, str(ROOT / "benches" / "instructions" / "run.py"),
                            "--bare-proxy", str(b), "--out", str(out), "--only", "pingora-bare",
                            "--requests", str(args.requests)], check=True, stdout=subprocess.DEVNULL)
        r = json.loads((out / "instructions.json").read_text())["results"]["pingora-bare"]
        results.append({"step": i, "crate": crate, "patch": name, "ir": r["ir_per_request"],
                        "allocs": r["allocs_per_request"]})
        log(f"step {i} {crate} {name}: {r['ir_per_request']:,.0f} instructions, "
            f"{r['allocs_per_request']:.2f} allocations per request")

    if not args.skip_load:
        load_out = OUT / "load"
        cmd = [sys.executable, str(ROOT / "benches" / "load" / "run.py"), "--bare-proxy", str(binaries[0]),
               "--out", str(load_out), "--only", "pingora-bare", "--no-redis", "--no-envoy",
               "--skip-half", "--skip-memory", "--rounds", str(args.rounds), "--duration", str(args.duration),
               # One connection count, and the other steps' idle proxies (a few % of a CPU
               # each) are not "other load" that repeats every run.
               "--connections", "32", "--noise-cpus", "1.0"]
        for i, b in enumerate(binaries[1:], start=1):
            cmd += ["--bare-variant", f"s{i:02d}={b}"]
        if not args.report_only:
            subprocess.run(cmd, check=True)
        md = (load_out / "results.md").read_text()
        # "- `pingora-bare@s03` / `pingora-bare`, pair by pair: req/s a, b (median m); CPU ... (median c)"
        for line in md.splitlines():
            m = re.match(r"- `pingora-bare@s(\d+)` / `pingora-bare`, pair by pair: req/s [^(]*\(median ([0-9.]+)\)"
                         r"(?:; CPU per request [^(]*\(median ([0-9.]+)\))?", line)
            if m:
                r = results[int(m.group(1))]
                r["rps_ratio"] = float(m.group(2))
                r["cpu_ratio"] = float(m.group(3)) if m.group(3) else None
        results[0]["rps_ratio"] = 1.0
        results[0]["cpu_ratio"] = 1.0

    lines = ["# What each patch of the vendored Pingora crates buys", "",
             "The bare proxy built once per step, each step one patch more (benches/patches/run.py). "
             "Instructions and allocations per proxied request under callgrind; req/s and CPU per request "
             "as the ratio to step 0 (Pingora 0.9.1 as published) in one interleaved load run, the median "
             "of the rounds' pairs. Δ: against the step before.", "",
             "| step | crate | patch | instr/req | Δ instr | Δ % | allocs/req | Δ allocs | req/s ÷ step 0 | Δ req/s | CPU/req ÷ step 0 |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    prev = None
    for r in results:
        d_ir = f"{r['ir'] - prev['ir']:+,.0f}" if prev else ""
        d_pct = f"{(r['ir'] - prev['ir']) / prev['ir'] * 100:+.1f}%" if prev else ""
        d_al = f"{r['allocs'] - prev['allocs']:+.2f}" if prev else ""
        rr = r.get("rps_ratio")
        d_rr = (f"{(rr / prev['rps_ratio'] - 1) * 100:+.1f}%"
                if prev and rr and prev.get("rps_ratio") else "")
        cr = r.get("cpu_ratio")
        lines.append(f"| {r['step']} | {r['crate']} | {r['patch']} | {r['ir']:,.0f} | {d_ir} | {d_pct} | "
                     f"{r['allocs']:.2f} | {d_al} | {f'{rr:.3f}' if rr else '—'} | {d_rr} | "
                     f"{f'{cr:.3f}' if cr else '—'} |")
        prev = r
    (OUT / "patches.md").write_text("\n".join(lines) + "\n")
    (OUT / "patches.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
