#!/usr/bin/env python3
"""The dict program of `bench_programs.py` under `folioswap run`, once, with the engine's
counters split at the program's phases: build (the inserts and `list(d)`), lookups, and
teardown (from the last lookup to the process's exit, where CPython frees every
object). Root only, as `folioswap run` with a limit.

Usage: scripts/pydict_phase_counters.py [--limit 41M] [--folioswap PATH] [--n 300000]

`folioswap stat --interval 0.05 --json` runs beside the program; each of its lines is
stamped with CLOCK_MONOTONIC as it arrives, and the program stamps its phase boundaries on
the same clock. A counter's value in a phase is the difference between the last lines
before its two ends (the second end 50 ms late, to take the sample that covers it): good
to a sampling interval, enough to tell where the swap file is read. Prints the phases'
seconds, then per phase `pgmajfault`, `zswpin`, `pswpin` (reads from the swap file),
`zswpwb` and `swap_ra_hit`. Two builds are compared by running this in turns with
`--folioswap` pointing at each. `--timeline` prints every sample as well (a table row
each: when it arrived, from the program's start; resident and pool memory; and what the
interval before it faulted, wrote back and read from the swap file).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

PROGRAM = """
import random, sys, time
r = [time.monotonic()]
n = int(sys.argv[1])
d = {}
for i in range(n):
    d[i * 7919 % 10_000_019] = str(i) * 2
r.append(time.monotonic())
random.seed(1)
keys = list(d)
r.append(time.monotonic())
s = 0
for _ in range(n):
    s += len(d[keys[random.randrange(n)]])
r.append(time.monotonic())
print(s)
with open(sys.argv[2], "w") as f:
    f.write(" ".join(map(str, r)))
"""

COUNTERS = ["pgmajfault", "zswpin", "pswpin", "zswpwb", "swap_ra_hit"]
INTERVAL = 0.05


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", default="41M")
    ap.add_argument("--folioswap", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "folioswap"))
    ap.add_argument("--n", type=int, default=300000)
    ap.add_argument("--timeline", action="store_true", help="also print every sample: seconds from the program's start, resident and pool MiB, and the faults, pages written back and pages read from the swap file since the sample before")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prog, stamps = os.path.join(tmp, "pydict.py"), os.path.join(tmp, "stamps")
        with open(prog, "w") as f:
            f.write(PROGRAM)
        start = time.monotonic()
        run = subprocess.Popen([a.folioswap, "run", "--quiet", "--memory-high", a.limit, "--", sys.executable, prog, str(a.n), stamps], stdout=subprocess.DEVNULL)
        samples = []
        stats = []

        def read_stat():
            # `folioswap stat` finds a run only once its engine has started (at the first
            # managed allocation): ask again until it does, or the run is over.
            while run.poll() is None:
                stat = subprocess.Popen([a.folioswap, "stat", "--interval", str(INTERVAL), "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                stats.append(stat)
                for line in stat.stdout:
                    sample = json.loads(line)
                    samples.append((time.monotonic(), sample["total"], sample["resident_bytes"], sample["pool_total_bytes"], sample["pool_compressed_bytes"], sample.get("pool_share_bytes") or 0))
                if samples:
                    return
                time.sleep(0.01)

        reader = threading.Thread(target=read_stat, daemon=True)
        reader.start()
        if run.wait() != 0:
            sys.exit(f"folioswap run failed ({run.returncode})")
        end = time.monotonic()
        time.sleep(2 * INTERVAL)
        for stat in stats:
            stat.kill()
        if not samples:
            sys.exit("folioswap stat never found the run")
        with open(stamps) as f:
            t = [float(x) for x in f.read().split()]
    # `list(d)` takes a few milliseconds, under one sample: counted with the build.
    phases = [("build", t[0], t[2]), ("lookups", t[2], t[3]), ("teardown", t[3], end)]

    def at(when):
        last = {}
        for stamp, total, *_ in samples:
            if stamp <= when:
                last = total
        return last

    print(f"wall {end - start:.3f} s; " + ", ".join(f"{name} {b - a:.3f}" for name, a, b in phases))
    for counter in COUNTERS:
        cells = [at(b + INTERVAL).get(counter, 0) - at(a).get(counter, 0) for _, a, b in phases]
        print(f"{counter:12}" + ", ".join(f"{name} {v}" for (name, _, _), v in zip(phases, cells)))
    if a.timeline:
        print(f"t (build ends {t[2] - t[0]:.2f}, lookups {t[3] - t[0]:.2f}) | resident MiB | pool MiB | of it live MiB | pool share MiB | faults | written back | read from the file")
        before = {}
        for stamp, total, resident, pool, live, share in samples:
            delta = {k: total.get(k, 0) - before.get(k, 0) for k in ("pgmajfault", "zswpwb", "pswpin")}
            before = total
            print(f"{stamp - t[0]:.2f} | {resident / 2**20:.1f} | {pool / 2**20:.1f} | {live / 2**20:.1f} | {share / 2**20:.1f} | {delta['pgmajfault']} | {delta['zswpwb']} | {delta['pswpin']}")


if __name__ == "__main__":
    main()
