#!/usr/bin/env python3
"""Where the dict program of `bench_programs.py` pays for its faults under `folioswap run`:
the engine's own service time against what the faults cost the program's wall clock,
phase by phase and folio size by folio size. Root only, as `folioswap run` with a limit.

Usage: scripts/pydict_fault_split.py [--limit 41M] [--runs 5] [--n 300000] [--folioswap PATH]

Each run is the dict twice in turns: at the limit, and with a limit far above its
footprint (`--memory-high 1000M`: the same engine, its first touches included, nothing
swapped). The program reads the engine's counters in its own process at each phase
boundary through libfolioswap.so's `folioswap_stats_json()` (the C API, found by
`ctypes` among the preloaded symbols): per folio size, the faults served and the
engine's service time (`fault_latency`: from the message read, or the SIGBUS, to the
wake-up; sum = count x mean), and `pgsteal_direct` (pages the faulting context evicted
itself). The phases: start-up (to the first reading), build (the inserts and
`list(d)`), lookups. The teardown is not read: CPython frees every object after the
last line runs, when the program can no longer ask.

Prints one Markdown table of medians: per phase, the wall seconds at the limit and
unlimited, the faults at the limit and the engine's service milliseconds, by size, and
"wall per fault": (wall at the limit - wall unlimited) / faults at the limit, beside
"service per fault". What lies between the two is the round trip the engine does not
see (the kernel's fault entry and userfaultfd queue, the wake-ups and context switches,
the interruptions of the program's CPU by the reclaimers' TLB shootdowns) and the
reclaim the program waited for.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

PROGRAM = r"""
import ctypes, json, random, sys, time
lib = ctypes.CDLL(None)
lib.folioswap_stats_json.restype = ctypes.c_void_p
lib.free.argtypes = [ctypes.c_void_p]
def reading():
    t = time.monotonic()
    p = lib.folioswap_stats_json()
    s = json.loads(ctypes.string_at(p).decode())
    lib.free(p)
    lat = s["fault_latency"] or {}
    sizes = {k: [v["count"], v["count"] * v["mean_us"]] for k, v in lat.items() if k.endswith("kB")}
    return {"t": t, "sizes": sizes, "direct": s["pgsteal_direct"]}
r = [reading()]
n = int(sys.argv[1])
d = {}
for i in range(n):
    d[i * 7919 % 10_000_019] = str(i) * 2
random.seed(1)
keys = list(d)
r.append(reading())
s = 0
for _ in range(n):
    s += len(d[keys[random.randrange(n)]])
r.append(reading())
print(s)
with open(sys.argv[2], "w") as f:
    json.dump(r, f)
"""

PHASES = ["start-up", "build", "lookups"]


def run_once(folioswap, limit, prog, out, n):
    cmd = [folioswap, "run", "--quiet", "--memory-high", limit, "--", sys.executable, prog, str(n), out]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
    with open(out) as f:
        readings = json.load(f)
    return res.stdout.strip(), readings


def split(readings):
    """Per phase: wall s, {size: (faults, service ms)}, direct pages."""
    out = []
    zero = {"t": None, "sizes": {}, "direct": 0}
    for k, name in enumerate(PHASES):
        a = readings[k - 1] if k > 0 else zero
        b = readings[k]
        sizes = {}
        for size, (count, us) in b["sizes"].items():
            c0, u0 = a["sizes"].get(size, [0, 0.0])
            if count - c0:
                sizes[size] = (count - c0, (us - u0) / 1000)
        wall = b["t"] - a["t"] if a["t"] is not None else None
        out.append((name, wall, sizes, b["direct"] - a["direct"]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", default="41M")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--folioswap", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "folioswap"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: folioswap run with a limit needs it here")
    runs = {"limit": [], "unlimited": []}
    expected = None
    with tempfile.TemporaryDirectory() as tmp:
        prog, out = os.path.join(tmp, "pydict.py"), os.path.join(tmp, "readings.json")
        with open(prog, "w") as f:
            f.write(PROGRAM)
        for i in range(a.runs):
            order = [("limit", a.limit), ("unlimited", "1000M")]
            if i % 2:
                order.reverse()
            for side, limit in order:
                answer, readings = run_once(a.folioswap, limit, prog, out, a.n)
                if expected is None:
                    expected = answer
                elif answer != expected:
                    sys.exit(f"wrong answer at {limit}: {answer} against {expected}")
                phases = split(readings)
                runs[side].append(phases)
                cells = "; ".join(f"{name} {wall or 0:.3f}s {sizes} direct {direct}" for name, wall, sizes, direct in phases)
                print(f"# {side} run {i + 1}: {cells}", file=sys.stderr)

    def med(side, k, f):
        return statistics.median(f(runs[side][j][k]) for j in range(len(runs[side])))

    print(f"\npydict, {a.n} entries, limit {a.limit} against 1000M, medians of {a.runs} runs each, in turns\n")
    print("| phase | wall s, limit | wall s, unlimited | faults at the limit, 4K / 64K / others | engine service ms, 4K / 64K / others | pages evicted by the faulting context | wall per fault µs | service per fault µs |")
    print("|---|---|---|---|---|---|---|---|")
    for k, name in enumerate(PHASES):

        def by(kind, idx):
            def f(p):
                sizes = p[2]
                if kind == "others":
                    return sum(v[idx] for s, v in sizes.items() if s not in ("4kB", "64kB"))
                return sizes.get(kind, (0, 0.0))[idx]

            return f

        faults = [med("limit", k, by(s, 0)) for s in ("4kB", "64kB", "others")]
        service = [med("limit", k, by(s, 1)) for s in ("4kB", "64kB", "others")]
        total_faults = med("limit", k, lambda p: sum(v[0] for v in p[2].values()))
        total_service = med("limit", k, lambda p: sum(v[1] for v in p[2].values()))
        direct = med("limit", k, lambda p: p[3])
        if name == "start-up":
            wall_l = wall_u = per_fault = "–"
        else:
            wl = med("limit", k, lambda p: p[1])
            wu = med("unlimited", k, lambda p: p[1])
            wall_l, wall_u = f"{wl:.3f}", f"{wu:.3f}"
            per_fault = f"{(wl - wu) * 1e6 / total_faults:.1f}" if total_faults else "–"
        per_service = f"{total_service * 1000 / total_faults:.1f}" if total_faults else "–"
        print(
            f"| {name} | {wall_l} | {wall_u} | {' / '.join(f'{x:g}' for x in faults)} | "
            f"{' / '.join(f'{x:.1f}' for x in service)} | {direct:g} | {per_fault} | {per_service} |"
        )


if __name__ == "__main__":
    main()
