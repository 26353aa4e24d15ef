#!/usr/bin/env python3
"""Two settings of `folioswap run` against each other on a real program, in turns: the
CPython dict of `bench_programs.py` (phase times stamped by the program) or GNU sort of a
file of lines. Each pair runs both settings back to back, the first of the pair
alternating, so that a host that speeds up or slows down within the set weighs on both
alike. Root only, as `folioswap run` with a limit.

Usage:
  scripts/ab_programs.py --program dict --limit 41M --pairs 10 \\
      --a FOLIOSWAP_WRITTEN_AGING=0 --b FOLIOSWAP_WRITTEN_AGING=1
  scripts/ab_programs.py --program sort --sort-input /var/tmp/lines50.txt --limit 59M \\
      --pairs 6 --a ... --b ...

`--a`/`--b` take space-separated VAR=VALUE settings for the environment of each side
(empty: the defaults); `--folioswap-a`/`--folioswap-b` run two builds instead;
`--prefix-a`/`--prefix-b` put a command before a side's `folioswap run`, e.g.
`--prefix-b "taskset -c 0"` (the whole run on one CPU). Prints
every run as it ends (wall seconds, the dict's build and lookup seconds, `list(d)` counted
with the build as `pydict_phase_counters.py` counts it, and from the
run's `--stats-json`: faults, pages stored, reads from the swap file), then each side's
medians and the pair ratios B/A. Sort's output is checked against an unlimited run's
(a checksum), the dict's sum against the expected one: a wrong answer stops the script.
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from pydict_phase_counters import PROGRAM as DICT  # noqa: E402  the dict with its phase stamps


def settings(text):
    env = dict(os.environ)
    for item in text.split():
        var, sep, value = item.partition("=")
        if not sep:
            sys.exit(f"--a/--b take VAR=VALUE settings, not {item!r}")
        env[var] = value
    return env


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--program", choices=["dict", "sort"], required=True)
    ap.add_argument("--limit", required=True, help="memory_high of both sides, e.g. 41M")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--a", default="", help="settings of side A (VAR=VALUE ...)")
    ap.add_argument("--b", default="", help="settings of side B (VAR=VALUE ...)")
    default_bin = os.path.join(HERE, "..", "target", "release", "folioswap")
    ap.add_argument("--folioswap-a", default=default_bin)
    ap.add_argument("--folioswap-b", default=default_bin)
    ap.add_argument("--prefix-a", default="", help="command words before side A's `folioswap run`")
    ap.add_argument("--prefix-b", default="", help="command words before side B's `folioswap run`")
    ap.add_argument("--n", type=int, default=300000, help="the dict's entries")
    ap.add_argument("--sort-input", default="/var/tmp/lines50.txt")
    a = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        prog = os.path.join(tmp, "pydict.py")
        with open(prog, "w") as f:
            f.write(DICT)
        if a.program == "sort":
            if not os.path.exists(a.sort_input):
                sys.exit(f"{a.sort_input}: no such file (scripts/bench_programs.py --only sort writes one of random lines)")
            command = ["sort", "-S", "150M", "--parallel=1", a.sort_input]
            expected = hashlib.sha256(subprocess.run(command, stdout=subprocess.PIPE, check=True).stdout).hexdigest()
        else:
            command = [sys.executable, prog, str(a.n), os.path.join(tmp, "stamps")]
            # The unlimited run's answer: the lookups are seeded, so every run must match it.
            expected = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True).stdout.strip()

        sides = {"A": (a.prefix_a.split() + [a.folioswap_a], settings(a.a)), "B": (a.prefix_b.split() + [a.folioswap_b], settings(a.b))}
        runs = {"A": [], "B": []}
        for pair in range(a.pairs):
            order = "AB" if pair % 2 == 0 else "BA"
            for tag in order:
                binary, env = sides[tag]
                stats = os.path.join(tmp, f"stats-{tag}.json")
                start = time.monotonic()
                p = subprocess.run(binary + ["run", "--quiet", "--memory-high", a.limit, "--stats-json", stats, "--"] + command,
                                   env=env, stdout=subprocess.PIPE)
                wall = time.monotonic() - start
                if p.returncode != 0:
                    sys.exit(f"side {tag} failed ({p.returncode})")
                got = hashlib.sha256(p.stdout).hexdigest() if a.program == "sort" else p.stdout.decode().strip()
                if got != expected:
                    sys.exit(f"side {tag}: wrong output ({got[:16]} against {expected[:16]})")
                with open(stats) as f:
                    total = json.load(f)["total"]
                run = {"wall": wall, "faults": total.get("pgmajfault", 0), "stored": total.get("zswpout", 0),
                       "file_reads": total.get("pswpin", 0)}
                if a.program == "dict":
                    with open(os.path.join(tmp, "stamps")) as f:
                        t = [float(x) for x in f.read().split()]
                    # Stamps: start, inserts done, `list(d)` done, lookups done.
                    run["build"], run["lookups"] = t[2] - t[0], t[3] - t[2]
                runs[tag].append(run)
                print(f"{tag} " + " ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in run.items()), flush=True)

    for tag in "AB":
        keys = runs[tag][0].keys()
        print(f"{tag} medians: " + ", ".join(f"{k} {statistics.median(r[k] for r in runs[tag]):.3f}" for k in keys))
    ratios = sorted(b["wall"] / a_["wall"] for a_, b in zip(runs["A"], runs["B"]))
    faster = sum(r < 1 for r in ratios)
    print(f"B/A wall, pair by pair: {' '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.3f}; B faster in {faster} of {len(ratios)}")


if __name__ == "__main__":
    main()
