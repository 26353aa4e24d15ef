#!/usr/bin/env python3
"""The cost of transparency: bench/usemem.c (a standalone usemem) under `folioswap run`
beside `folioswap bench usemem` at the same sizes, per folio size (BENCHMARKS.md,
"Unmodified programs").

Usage: scripts/bench_run.py [--runs 1] [--size 1G] [--limit 512M] [--rounds 4] [--folios 4K,64K,2M]

`bench usemem --threads 2` is one process with two writer threads inside the engine;
`usemem -n 2` is two processes, each with its own engine, sharing one memory_high through
`folioswap run`. Both write every 8-byte word of SIZE per writer ROUNDS times, then verify.
Runs are interleaved (A B A B ...) and medians printed as a Markdown table.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

BIN = "./target/release/folioswap"


def run_engine(folio, a):
    out = subprocess.run([BIN, "bench", "usemem", "--threads", "2", "--size", a.size, "--limit", a.limit,
                          "--folio", folio, "--rounds", str(a.rounds), "--pattern", "seq", "--json"],
                         capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    assert r["verified"], f"bench usemem {folio} failed verification"
    s = r["stats"]
    return {"mb_s": r["throughput_mb_s"], **{k: s.get(k, 0) for k in KEYS}}


KEYS = ["zswpout", "zswpin", "pgmajfault", "thp_swpout", "thp_swpout_fallback", "memory_high_overrun"]


def run_preload(folio, usemem, a):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        out = subprocess.run([BIN, "run", "--quiet", "--memory-high", a.limit, "--folio", folio, "--stats-json", f.name,
                              "--", usemem, "-n", "2", "-r", str(a.rounds), "-v", a.size],
                             capture_output=True, text=True)
        if out.returncode != 0 or out.stdout.count("verified") != 2:
            sys.exit(f"usemem under folioswap run ({folio}) failed: rc {out.returncode}\n{out.stdout}\n{out.stderr}")
        report = json.load(open(f.name))
    runs = [(int(b), int(us)) for b, us in re.findall(r"(\d+) bytes / (\d+) usecs", out.stdout)]
    t = report["total"]
    # As bench usemem counts: all bytes written over the slowest writer's time (usemem's
    # own per-process KB/s, summed, would overstate it when the processes do not overlap).
    mb_s = sum(b for b, _ in runs) / max(us for _, us in runs)
    return {"mb_s": mb_s, **{k: t.get(k, 0) for k in KEYS}}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--size", default="1G")
    p.add_argument("--limit", default="512M")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--folios", default="4K,64K,2M")
    a = p.parse_args()
    usemem = os.path.join(tempfile.gettempdir(), "folioswap-usemem")
    subprocess.run(["cc", "-O2", "-pthread", "-o", usemem, "bench/usemem.c"], check=True)
    rows = {}
    for _ in range(a.runs):
        for folio in a.folios.split(","):
            for name, fn in (("bench usemem (1 process, 2 threads)", lambda f: run_engine(f, a)),
                             ("usemem -n 2 under folioswap run", lambda f: run_preload(f, usemem, a))):
                r = fn(folio)
                print(f"{folio} {name}: {json.dumps(r)}", file=sys.stderr)
                rows.setdefault((folio, name), []).append(r)
    print(f"| folio | how | MB/s | {' | '.join(KEYS)} |")
    print("|---|---|---|" + "---|" * len(KEYS))
    for (folio, name), rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ["mb_s"] + KEYS}
        print(f"| {folio} | {name} | {med['mb_s']:.0f} | " + " | ".join(f"{med[k]:.0f}" for k in KEYS) + " |")


if __name__ == "__main__":
    main()
