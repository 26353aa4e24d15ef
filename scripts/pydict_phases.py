#!/usr/bin/env python3
"""Where the CPython dict program of `bench_programs.py` spends its time under a limit,
phase by phase, under `folioswap run` (default settings) and under the kernel's zram with
the same limit, in turns. Root only (the kernel's side: zram, swapon, a memory cgroup,
all restored on success, failure and Ctrl-C, as `bench_programs.py` does).

Usage (root): scripts/pydict_phases.py [--limit 41] [--runs 5] [--n 300000]

The program is `bench_programs.py`'s pydict with a reading at each phase boundary: build
(the dict's inserts), keys (`list(d)`), lookups (as many random lookups as entries). Each
reading is the monotonic clock, the main thread's own `ru_majflt` and `ru_nvcsw`
(`RUSAGE_THREAD`), and `/proc/vmstat` `pswpin`/`pswpout` (system-wide: the machine must
be otherwise idle). Under folioswap a fault blocks the main thread, so its voluntary
switches count its faults (the kernel counts none there: its swap-ins are major faults of
the thread); under the kernel a swap-in from zram is a major fault and `pswpin`. The rest
of the wall time, start-up and teardown (CPython frees every object at exit, which swaps
in whatever is out), is "outside". Prints one Markdown table of medians, with every run's
figures on stderr as they come.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_programs  # noqa: E402

PROGRAM = """
import random, resource, sys, time
def reading():
    vm = dict(line.split() for line in open("/proc/vmstat"))
    ru = resource.getrusage(resource.RUSAGE_THREAD)
    return time.monotonic(), ru.ru_majflt, ru.ru_nvcsw, int(vm["pswpin"]), int(vm["pswpout"])
r = [reading()]
n = int(sys.argv[1])
d = {}
for i in range(n):
    d[i * 7919 % 10_000_019] = str(i) * 2
r.append(reading())
random.seed(1)
keys = list(d)
r.append(reading())
s = 0
for _ in range(n):
    s += len(d[keys[random.randrange(n)]])
r.append(reading())
print(s)
print("PHASES", " ".join(",".join(str(b - a) for a, b in zip(r[k], r[k + 1])) for k in range(3)), file=sys.stderr)
"""

PHASES = ["build", "keys", "lookups"]


def pswpin():
    with open("/proc/vmstat") as f:
        return int(next(line.split()[1] for line in f if line.startswith("pswpin ")))


def run_once(cmd):
    """Wall seconds, the per-phase readings [(seconds, majflt, nvcsw, pswpin, pswpout)], the
    program's output and the system's pswpin over the whole run."""
    before = pswpin()
    start = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    swapped_in = pswpin() - before
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({r.returncode}): {r.stderr[-500:]}")
    line = next(l for l in r.stderr.splitlines() if l.startswith("PHASES "))
    phases = [tuple(float(x) for x in p.split(",")) for p in line.split()[1:]]
    return wall, phases, r.stdout, swapped_in


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=41, help="MiB")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", type=int, default=300_000, help="entries")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("refusing: the kernel's side needs root (zram, swapon, a memory cgroup)")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(PROGRAM)
        script = f.name
    stats = script + ".json"
    argv = [sys.executable, script, str(a.n)]
    limit = a.limit << 20
    kernel = bench_programs.KernelSwap(["zram"], "1G")
    results = {"folioswap": [], "kernel zram": []}
    try:
        _, _, expected, _ = run_once(argv)
        for i in range(a.runs):
            for side in results:
                if side == "kernel zram":
                    cmd = kernel.command("zram", limit, argv)
                else:
                    cmd = [bench_programs.BIN, "run", "--quiet", "--memory-high", str(limit), "--stats-json", stats, "--"] + argv
                try:
                    wall, phases, out, swapped_in = run_once(cmd)
                except RuntimeError as e:
                    print(f"# {side} run {i + 1}: FAILED: {e}", file=sys.stderr, flush=True)
                    continue
                if out != expected:
                    raise RuntimeError(f"{side}: output differs from the unlimited run")
                # Faults outside the phases: the kernel's swap-ins, folioswap's faults counted
                # by the engine (`pgmajfault`), less those the phases saw.
                if side == "kernel zram":
                    outside = swapped_in - sum(p[3] for p in phases)
                else:
                    with open(stats) as sf:
                        outside = json.load(sf)["total"]["pgmajfault"] - sum(p[2] for p in phases)
                results[side].append((wall, phases + [(0, outside, outside, 0, 0)]))
                cells = " ".join(f"{name} {p[0]:.3f}s/{int(p[1])}/{int(p[2])}/{int(p[3])}/{int(p[4])}" for name, p in zip(PHASES, phases))
                print(f"# {side} run {i + 1}: {wall:.3f} s; s/majflt/nvcsw/pswpin/pswpout: {cells}", file=sys.stderr, flush=True)
    finally:
        kernel.close()
        os.unlink(script)
        if os.path.exists(stats):
            os.unlink(stats)

    def med(side, f):
        xs = [f(w, ph) for w, ph in results[side]]
        return statistics.median(xs) if xs else float("nan")

    sides = list(results)
    print(f"pydict, {a.n} entries, limit {a.limit} MiB, medians of {', '.join(f'{len(results[s])} runs ({s})' for s in sides)}:")
    print()
    print("| phase | " + " | ".join(f"{s} s | {s} faults" for s in sides) + " |")
    print("|---|" + "---|---|" * len(sides))
    for k, name in enumerate(PHASES):
        cells = []
        for s in sides:
            # folioswap's faults block the thread (voluntary switches); the kernel's are major faults.
            col = 2 if s == "folioswap" else 1
            cells.append(f"{med(s, lambda w, ph: ph[k][0]):.3f} | {med(s, lambda w, ph: ph[k][col]):.0f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    outside = [f"{med(s, lambda w, ph: w - sum(p[0] for p in ph)):.3f} | {med(s, lambda w, ph: ph[3][1]):.0f}" for s in sides]
    print("| outside (start-up, teardown) | " + " | ".join(outside) + " |")
    print("| whole run | " + " | ".join(f"{med(s, lambda w, ph: w):.3f} | " for s in sides) + " |")
    k_in = [med("kernel zram", lambda w, ph: ph[k][3]) for k in range(3)]
    k_out = [med("kernel zram", lambda w, ph: ph[k][4]) for k in range(3)]
    print()
    print("kernel pswpin / pswpout per phase (medians): " + ", ".join(f"{n} {i:.0f} / {o:.0f}" for n, i, o in zip(PHASES, k_in, k_out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
