#!/usr/bin/env python3
"""Run `folioswap bench usemem` over a matrix of configurations, several times each, and
print a Markdown table of medians (the numbers in BENCHMARKS.md come from here).

Usage: scripts/bench_usemem.py [--matrix core|swapfile|install|swapin] [--runs 3] [--out results.jsonl]
                               [--only NAME ...] [--plot FILE.svg] [-- extra args]
       scripts/bench_usemem.py --from results.jsonl [--only NAME ...] [--plot FILE.svg]

`--plot` also draws the results (`svgplot.py`: throughput per configuration, fault latency
percentiles); `--from` makes the table and the picture from runs saved with `--out`,
running nothing. Each run's line on stderr says how far the matrix has got and an
estimate of the time left.

`core` is the engine with the compressed pool only (BENCHMARKS.md, engine core);
`swapfile` adds a swap file in /var/tmp, with the pool on (capped at 256M, so it fills
and writes back) and off (`--max-pool 0`: every folio goes to the file). `install` runs the core's
first six configurations on both install paths: UFFDIO_MOVE (`move`) and the UFFDIO_COPY
path of kernels without it (`copy`, forced with FOLIOSWAP_UFFD_MOVE=0). `swapin` runs issue
14's targets with the default settings (3 rounds), 2M under `--swapin always` and `adaptive`.

Each configuration runs `--runs` times, interleaved (A B C A B C ...) so that drift in this
shared VM's speed hits every configuration alike. Every run must verify; a failed run is
reported and makes the script exit non-zero.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import svgplot

BIN = "./target/release/folioswap"
BASE = ["bench", "usemem", "--threads", "2", "--size", "1G", "--limit", "512M", "--rounds", "4", "--json"]

MATRIX = [
    ("2M seq", ["--folio", "2M", "--pattern", "seq"]),
    ("2M --split seq", ["--folio", "2M", "--split", "--pattern", "seq"]),
    ("64K seq", ["--folio", "64K", "--pattern", "seq"]),
    ("4K seq", ["--folio", "4K", "--pattern", "seq"]),
    ("2M rand", ["--folio", "2M", "--pattern", "rand"]),
    ("2M --split rand", ["--folio", "2M", "--split", "--pattern", "rand"]),
    ("64K rand", ["--folio", "64K", "--pattern", "rand"]),
    ("4K rand", ["--folio", "4K", "--pattern", "rand"]),
    ("2M seq signal", ["--folio", "2M", "--pattern", "seq", "--fault-mode", "signal"]),
    ("64K seq signal", ["--folio", "64K", "--pattern", "seq", "--fault-mode", "signal"]),
    ("4K seq signal", ["--folio", "4K", "--pattern", "seq", "--fault-mode", "signal"]),
    ("4K rand signal", ["--folio", "4K", "--pattern", "rand", "--fault-mode", "signal"]),
]


SWAP = ["--swap-file", "/var/tmp:8G"]
POOL_ON = SWAP + ["--max-pool", "256M"]
POOL_OFF = SWAP + ["--max-pool", "0"]

SWAPFILE_MATRIX = [
    (f"{name} {pattern} {pool}", folio + ["--pattern", pattern] + extra)
    for pattern in ["seq", "rand"]
    for pool, extra in [("pool+file", POOL_ON), ("file only", POOL_OFF)]
    for name, folio in [("2M", ["--folio", "2M"]), ("2M --split", ["--folio", "2M", "--split"]), ("64K", ["--folio", "64K"])]
]

# The engine core is the pool alone: no swap file (not even the one made on demand), so
# the pool is not charged to memory_high.
CORE_MATRIX = [(name, args + ["--swap-file", "none"]) for name, args in MATRIX]

INSTALL_MATRIX = [
    (f"{name} {install}", args + ["--swap-file", "none"], {"FOLIOSWAP_UFFD_MOVE": flag})
    for name, args in MATRIX
    if name in ("2M seq", "64K seq", "4K seq", "2M rand", "64K rand", "4K rand")
    for install, flag in [("move", "1"), ("copy", "0")]
]

# Issue 14's targets: the defaults (swap file made on demand, pool charged), with the
# swap-in policy before (`always`) and after (`adaptive`, the default), three rounds.
SWAPIN_MATRIX = [
    (f"{folio} {pattern} {policy}", ["--folio", folio, "--pattern", pattern, "--swapin", policy, "--rounds", "3"])
    for folio, pattern, policies in [
        ("2M", "rand", ["adaptive", "always"]),
        ("2M", "seq", ["adaptive", "always"]),
        ("64K", "rand", ["adaptive"]),
        ("64K", "seq", ["adaptive"]),
        ("4K", "rand", ["adaptive"]),
        ("4K", "seq", ["adaptive"]),
    ]
    for policy in policies
]

MATRICES = {"core": CORE_MATRIX, "swapfile": SWAPFILE_MATRIX, "install": INSTALL_MATRIX, "swapin": SWAPIN_MATRIX}


def base_for(args):
    """BASE, less its --rounds where the configuration sets its own."""
    if "--rounds" not in args:
        return BASE
    i = BASE.index("--rounds")
    return BASE[:i] + BASE[i + 2 :]


def run_one(args, env=None):
    p = subprocess.run([BIN] + base_for(args) + args, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if p.returncode != 0:
        return None, p.stderr.strip()[-500:]
    return json.loads(p.stdout), None


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--matrix", choices=sorted(MATRICES), default="core")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=None, help="append every run's JSON here")
    ap.add_argument("--only", nargs="*", default=None, help="configuration names to run")
    ap.add_argument("--plot", default=None, metavar="FILE.svg", help="also draw the results as an SVG picture")
    ap.add_argument("--from", dest="source", default=None, metavar="JSONL", help="use runs saved with --out instead of running")
    ap.add_argument("extra", nargs="*", help="extra usemem arguments for every run")
    a = ap.parse_args()
    failed = False
    if a.source:
        results = load(a.source, a.only)
        matrix = [(n, None, None) for n in results]
    else:
        matrix = [(c[0], c[1] + a.extra, c[2] if len(c) > 2 else {}) for c in MATRICES[a.matrix] if a.only is None or c[0] in a.only]
        results = {n: [] for n, _, _ in matrix}
        out = open(a.out, "a") if a.out else None
        total, done, start = a.runs * len(matrix), 0, time.monotonic()
        for i in range(a.runs):
            for name, args, env in matrix:
                r, err = run_one(args, env)
                done += 1
                spent = time.monotonic() - start
                progress = f"[{done}/{total}, {spent / 60:.0f} min, about {spent / done * (total - done) / 60:.0f} min left]"
                if r is None or not r["verified"]:
                    failed = True
                    print(f"FAILED {progress}: {name} run {i + 1}: {err or 'verification failed'}", file=sys.stderr)
                    continue
                results[name].append(r)
                extra = f", {r['writes_per_s']:.0f} writes/s" if "writes_per_s" in r else ""
                print(f"# {progress} {name} run {i + 1}: {r['throughput_mb_s']:.0f} MB/s{extra}", file=sys.stderr, flush=True)
                if out:
                    out.write(json.dumps({"name": name, "args": base_for(args) + args, "env": env, "result": r}) + "\n")
                    out.flush()

    print("| configuration | MB/s (median) | runs | writes/s (median) | THP % of resident | fault p50 / p99 µs | zswpout | zswpin | pswpout | pswpin | zswpwb | thp_swpout_fallback | thp_swpin / _fallback |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, _, _ in matrix:
        rs = results[name]
        if not rs:
            print(f"| {name} | failed | | | | | | | | | | | |")
            continue
        mbs = [r["throughput_mb_s"] for r in rs]
        wps = [r["writes_per_s"] for r in rs if "writes_per_s" in r]
        thp = med([r["anon_huge_pct_of_resident"] for r in rs])
        lat = [r["stats"]["fault_latency"]["all"] for r in rs]
        p50 = med([x["p50_us"] for x in lat])
        p99 = med([x["p99_us"] for x in lat])
        # Runs saved before a counter existed have none: the median is then NaN.
        st = lambda k: med([r["stats"][k] for r in rs if k in r["stats"]])
        runs = " / ".join(f"{x:.0f}" for x in mbs)
        w = f"{med(wps):.0f}" if wps else "–"
        counters = " | ".join(f"{st(k):.0f}" for k in ["zswpout", "zswpin", "pswpout", "pswpin", "zswpwb", "thp_swpout_fallback"])
        swpin = f"{st('thp_swpin'):.0f} / {st('thp_swpin_fallback'):.0f}"
        print(f"| {name} | **{med(mbs):.0f}** | {runs} | {w} | {thp:.0f} | {p50:.0f} / {p99:.0f} | {counters} | {swpin} |")
    if a.plot:
        title = f"folioswap bench usemem: {a.source or 'matrix ' + a.matrix}"
        with open(a.plot, "w") as f:
            f.write(svgplot.render([(n, results[n]) for n, _, _ in matrix], title))
        print(f"# drawn: {a.plot}", file=sys.stderr)
    return 1 if failed else 0


def load(path, only):
    """Runs saved with --out, by configuration name in the order first seen."""
    results = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                if only is None or rec["name"] in only:
                    results.setdefault(rec["name"], []).append(rec["result"])
    if not results:
        sys.exit(f"no runs{' named ' + ', '.join(only) if only else ''} in {path}")
    return results


if __name__ == "__main__":
    sys.exit(main())
