#!/usr/bin/env python3
"""Real programs with random access at about half their footprint: under `folioswap run`
and under the kernel's own swap (zram, lz4) with the same limit, on the same machine
(BENCHMARKS.md, "Real programs").

Usage (root): scripts/bench_programs.py [--runs 3] [--only sort|pydict ...] [--fraction 0.5 0.75 | --limit MIB ...]
                                       [--sort-mib 400] [--pydict-n 2500000]
                                       [--variant '--swap-file none' ...] [--variant 'FOLIOSWAP_FAULT_MODE=signal' ...]
                                       [--folioswap-arg=--folio=64K ...] [--kernel-swap zram zswap]

Programs (none written here; the inputs are):
- `sort`: GNU sort of a file of random lines (`--sort-mib`), `-S` large enough to sort in
  memory (one malloc'd buffer, a merge sort over line pointers: random access over all
  of it). Random text from a 36-letter alphabet: lz4 cannot compress it;
- `pydict`: CPython building a dict of 2.5 million entries (`--pydict-n`), then as many
  lookups at random keys (the interpreter's heap and a hash table).

Each program first runs with no limit to measure its peak RSS (`ru_maxrss`) and its
output; each limit is a `--fraction` of that peak (or `--limit` MiB). Then, interleaved per run: `folioswap
run --memory-high LIMIT` with default settings, each `--variant` of it, and the kernel:
the program in a memory cgroup (v1 `memory.limit_in_bytes`, or v2 `memory.max`) with
zram (lz4) as the only swap device, and with `--kernel-swap zram zswap` also with a swap
file in /var/tmp behind zswap (lz4 where the kernel's crypto API has it, else zswap's own
compressor). Under cgroup v1 neither zram's memory nor zswap's pool is charged to the
cgroup (the kernel charges zswap's pool to cgroup v2 alone; measured here: a v1 cgroup's
`memory.kmem.max_usage_in_bytes` stayed under 400 KiB while zswap held thousands of
its pages), so folioswap's `--swap-file none` is the like setup: the pool outside the
limit. The kernel's limit is hard: where reclaim cannot keep up the kernel OOM-kills the program
(reported as "failed", as is a run past `--timeout`). Every run's output must equal the unlimited run's;
it comes through a pipe, never into a file inside the kernel's limit (`run_program` says why). Medians of
wall time go to stdout as a Markdown table, then the ratio of each folioswap side's median
to each kernel side's (of the kernel's finished runs, and with its failed runs counted as
its slowest), then a table of what the runs that finished cost in memory: under folioswap the program's peak RSS (its compressed pool lives
in it; the swap file is on disk), under the kernel its peak RSS plus the most zram held
(`mem_used_max`), which the cgroup's limit does not count, or with zswap plus the most
zswap held (`Zswap:` of /proc/meminfo, sampled every 10 ms: the system's whole pool,
which only the run uses).

Settings touched for the kernel runs (zram0's size and algorithm, zswap's `enabled` and
`compressor`, the swap file, swap on, a cgroup) are restored on success, on failure and
on Ctrl-C; the script refuses to start if a swap device is already active or zram0 is in
use. Turning zswap on, even for a while, stops this kernel from swapping large folios in
whole until the next reboot (mm/memory.c, `zswap_never_enabled()`); the programs here
fault 4 KiB pages, but later `folioswap bench usemem --against kernel` runs at 16K-1M
folios on the same boot swap in 4 KiB pages.
"""
import argparse
import hashlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.path.abspath("./target/release/folioswap")
ZRAM = "/sys/block/zram0"
ZSWAP = "/sys/module/zswap/parameters"
SWAP_DIR = "/var/tmp"
# The zswap side's swap file: room for the largest program here several times over.
SWAP_FILE_BYTES = 2 << 30
CGROUP_V1 = "/sys/fs/cgroup/memory"
CGROUP_V2 = "/sys/fs/cgroup/unified"

PYDICT = """
import random
import sys
n = int(sys.argv[1])
d = {}
for i in range(n):
    d[i * 7919 % 10_000_019] = str(i) * 2
random.seed(1)
keys = list(d)
s = 0
for _ in range(n):
    s += len(d[keys[random.randrange(n)]])
print(s)
"""


def write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def read(path):
    with open(path) as f:
        return f.read().strip()


class ZswapPeak:
    """The most zswap's pool held (`Zswap:` of /proc/meminfo), sampled every 10 ms in a
    thread from construction to `stop`."""

    def __init__(self):
        self.peak = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self):
        while True:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("Zswap:"):
                        self.peak = max(self.peak, int(line.split()[1]) * 1024)
                        break
            if self.done.wait(0.01):
                return

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.peak


class KernelSwap:
    """The kernel's sides, each in a memory cgroup of its own run's limit: `zram` (zram0,
    lz4, the only swap device) and `zswap` (a swap file in /var/tmp behind zswap). Under
    cgroup v1 neither's memory counts against the limit. One swap device is on at a time
    (`activate`). `close` undoes every setting, also after a failure."""

    def __init__(self, kinds, zram_size):
        if read("/proc/swaps").count("\n") > 0:
            sys.exit("refusing: a swap device is already active (/proc/swaps)")
        if "zram" in kinds:
            if not os.path.exists(ZRAM):
                sys.exit("no /sys/block/zram0 (zram not built in or loaded)")
            if read(f"{ZRAM}/disksize") != "0":
                sys.exit("refusing: zram0 is in use (disksize is not 0)")
        if "zswap" in kinds and not os.path.exists(f"{ZSWAP}/enabled"):
            sys.exit(f"no zswap in this kernel ({ZSWAP}/enabled)")
        self.cgroup = None
        self.active = None
        self.zram_set = False
        self.swap_file = None
        self.zswap_saved = {}
        self.zswap_compressor = None
        self.zswap_peak = None
        try:
            if "zram" in kinds:
                self.zram_set = True
                write(f"{ZRAM}/comp_algorithm", "lz4")
                write(f"{ZRAM}/disksize", zram_size)
                subprocess.run(["mkswap", "/dev/zram0"], check=True, capture_output=True)
            if os.path.exists(f"{ZSWAP}/enabled"):
                for name in ("enabled", "compressor"):
                    self.zswap_saved[name] = read(f"{ZSWAP}/{name}")
            if "zswap" in kinds:
                if subprocess.run(["stat", "-f", "-c", "%T", SWAP_DIR], capture_output=True, text=True).stdout.strip() == "tmpfs":
                    sys.exit(f"{SWAP_DIR} is tmpfs: zswap's swap file needs a disk")
                self.swap_file = os.path.join(SWAP_DIR, f"folioswap-programs-{os.getpid()}.swap")
                fd = os.open(self.swap_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.posix_fallocate(fd, 0, SWAP_FILE_BYTES)
                finally:
                    os.close(fd)
                subprocess.run(["mkswap", self.swap_file], check=True, capture_output=True)
                # zswap takes its compressors from the crypto API, which may lack lz4 where
                # zram (with its own backends) has it: then zswap keeps the one it has.
                try:
                    write(f"{ZSWAP}/compressor", "lz4")
                except OSError as e:
                    print(f"# zswap cannot use lz4 here ({e}): it keeps {self.zswap_saved['compressor']}", file=sys.stderr)
                self.zswap_compressor = read(f"{ZSWAP}/compressor")
                if self.zswap_saved.get("enabled") != "Y":
                    print("# note: turning zswap on (it is turned off again afterwards) also stops the kernel from swapping "
                          "large folios in whole until the next reboot (mm/memory.c: zswap_never_enabled()): later kernel-side "
                          "runs with 16K to 1M folios then swap in 4 KiB pages", file=sys.stderr)
            if os.path.isdir(CGROUP_V1):
                self.cgroup = os.path.join(CGROUP_V1, f"folioswap-bench-{os.getpid()}")
                os.mkdir(self.cgroup)
                self.limit_file = "memory.limit_in_bytes"
            else:
                self.cgroup = os.path.join(CGROUP_V2 if os.path.isdir(CGROUP_V2) else "/sys/fs/cgroup", f"folioswap-bench-{os.getpid()}")
                os.mkdir(self.cgroup)
                self.limit_file = "memory.max"
        except BaseException:
            self.close()
            raise

    def device(self, kind):
        return "/dev/zram0" if kind == "zram" else self.swap_file

    def activate(self, kind):
        """`kind`'s swap device on, alone; zswap on only for the `zswap` side."""
        if self.active == kind:
            return
        if self.active is not None:
            subprocess.run(["swapoff", self.device(self.active)], check=True)
            self.active = None
        if self.zswap_saved:
            write(f"{ZSWAP}/enabled", "Y" if kind == "zswap" else "N")
        subprocess.run(["swapon", "-p", "100", self.device(kind)], check=True)
        self.active = kind

    def command(self, kind, limit, argv):
        self.activate(kind)
        write(os.path.join(self.cgroup, self.limit_file), limit)
        if kind == "zram":
            # The peak zram holds from here on: what the run stored outside the limit.
            write(f"{ZRAM}/mem_used_max", 0)
        else:
            if self.zswap_peak is not None:
                self.zswap_peak.stop()  # a run that failed left its sampler running
            self.zswap_peak = ZswapPeak()
        procs = os.path.join(self.cgroup, "cgroup.procs")
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"] + argv

    def extra_peak(self, kind):
        """What the run held outside its RSS at most: zram's peak (`mem_used_max` of
        mm_stat: compressed data and its allocator's overhead), or zswap's (its sampled
        pool). Called once the run has ended."""
        if kind == "zram":
            return int(read(f"{ZRAM}/mm_stat").split()[4])
        return self.zswap_peak.stop()

    def close(self):
        errors = []
        if self.cgroup and os.path.isdir(self.cgroup):
            for _ in range(50):
                try:
                    os.rmdir(self.cgroup)
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                errors.append(f"could not remove {self.cgroup}")
        if self.active is not None:
            r = subprocess.run(["swapoff", self.device(self.active)])
            if r.returncode != 0:
                errors.append(f"swapoff {self.device(self.active)} failed")
            self.active = None
        for name, value in self.zswap_saved.items():
            try:
                write(f"{ZSWAP}/{name}", value)
            except OSError as e:
                errors.append(f"could not put {ZSWAP}/{name} back to {value}: {e}")
        self.zswap_saved = {}
        if self.zram_set:
            write(f"{ZRAM}/reset", 1)
            self.zram_set = False
        if self.swap_file and os.path.exists(self.swap_file):
            os.unlink(self.swap_file)
        if errors:
            print("RESTORE FAILED: " + "; ".join(errors), file=sys.stderr)


RUNNING = []


def vmstat_swaps():
    """The kernel's swap counters (pages): what a kernel-side run swapped shows that its
    swap was the one meant."""
    with open("/proc/vmstat") as f:
        counters = dict(line.split() for line in f)
    return {k: int(counters.get(k, 0)) for k in ("pswpout", "pswpin", "zswpout", "zswpin", "zswpwb")}


def run_program(argv, timeout=None, env=None):
    """Run `argv`: wall seconds, the digest of its output, peak RSS bytes (the largest of
    the process and the descendants it waited for, as wait4(2) reports: under `folioswap
    run`, the program's, its compressed pool included). Past `timeout` the program is
    killed and RuntimeError raised.

    Its output comes through a pipe and is hashed here as it comes. It is not written to a
    file: the kernel's side runs in a memory cgroup, and a file it writes leaves page cache
    charged to that cgroup's limit, dirty until written back, which folioswap's limit does
    not count. Written to a file, sort's 50 MiB of output at a 59 MiB limit got the kernel
    OOM-killed in 1 of 5 runs and a median of 2.0 s, against 1.7 s and no kill through a
    pipe (5 runs each, in turns); even the dict's one line to a file on ext4 cost it 0.1 s
    (BENCHMARKS.md, "The kernel's side wrote its output into its own limit")."""
    start = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env)
    RUNNING.append(p)
    digest = hashlib.sha256()
    err = bytearray()

    def hash_output():
        for chunk in iter(lambda: p.stdout.read(1 << 20), b""):
            digest.update(chunk)

    def keep_errors():
        for chunk in iter(lambda: p.stderr.read(1 << 16), b""):
            err.extend(chunk)
            del err[:-4096]

    readers = [threading.Thread(target=hash_output, daemon=True), threading.Thread(target=keep_errors, daemon=True)]
    for r in readers:
        r.start()
    reaped = []
    # wait4 in a thread, so that a timeout can kill the run while the exit's rusage (its
    # peak RSS) is still read by the one wait that reaps it.
    waiter = threading.Thread(target=lambda: reaped.append(os.wait4(p.pid, 0)), daemon=True)
    waiter.start()
    try:
        waiter.join(timeout)
        if waiter.is_alive():
            os.killpg(p.pid, signal.SIGKILL)
            waiter.join()
            raise RuntimeError(f"timeout: still running after {timeout} s")
        wall = time.monotonic() - start
    finally:
        p.returncode = 0  # reaped by the waiter: Popen must not wait for it again
        RUNNING.remove(p)
        # A descendant that outlived the program may hold the pipes open: the session's
        # group is killed so that the readers see their end.
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for r in readers:
            r.join()
        p.stdout.close()
        p.stderr.close()
    _, status, usage = reaped[0]
    if status != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed (status {status:#x}): {err.decode(errors='replace')[-800:]}")
    return wall, digest.hexdigest(), usage.ru_maxrss * 1024


def median_failed_slowest(times):
    """The median of `times` with each failed run (None) counted as slower than any that
    finished; None where a failed run is in the middle (most runs failed)."""
    ordered = sorted(times, key=lambda x: float("inf") if x is None else x)
    mid = ordered[(len(ordered) - 1) // 2: len(ordered) // 2 + 1]
    return None if None in mid else statistics.median(mid)


def make_sort_input(path, mib):
    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    with open(path, "w") as f:
        written = 0
        while written < mib << 20:
            line = "".join(rng.choice(alphabet) for _ in range(rng.randrange(20, 80))) + "\n"
            f.write(line)
            written += len(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--fraction", type=float, nargs="+", default=[0.5], help="limits as fractions of the peak RSS")
    ap.add_argument("--limit", nargs="+", default=None, metavar="MIB",
                    help="limits in MiB instead of --fraction (the peak RSS of one unlimited run varies by a fifth for the dict)")
    ap.add_argument("--variant", action="append", default=[], type=str.split, help="another `folioswap run` configuration to time, e.g. '--swap-file none'; "
                    "FOLIOSWAP_NAME=VALUE words set that variable for it, e.g. 'FOLIOSWAP_FAULT_MODE=signal'")
    ap.add_argument("--kernel-swap", nargs="+", choices=["zram", "zswap"], default=["zram"],
                    help="the kernel's sides: zram (its memory outside the limit) and/or zswap over a swap file in /var/tmp")
    ap.add_argument("--sort-mib", type=int, default=400)
    ap.add_argument("--timeout", type=float, default=600, help="seconds after which a limited run is killed (reported as failed)")
    ap.add_argument("--pydict-n", type=int, default=2_500_000, help="entries of the pydict program")
    ap.add_argument("--folioswap-arg", action="append", default=[], help="extra `folioswap run` option (repeatable), e.g. --folioswap-arg=--folio=64K")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("refusing: the kernel's side needs root (zram, swapon, a memory cgroup)")
    tmp = tempfile.mkdtemp(prefix="fsw-programs-", dir="/var/tmp")
    kernel = None

    def on_signal(sig, frame):
        # From here on, Ctrl-C or SIGTERM (even while the input is being made) kills the
        # run, undoes every setting and removes the scratch directory.
        for p in RUNNING:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        if kernel is not None:
            kernel.close()
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(130)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    programs = []
    if a.only is None or "sort" in a.only:
        src = os.path.join(tmp, "lines.txt")
        make_sort_input(src, a.sort_mib)
        programs.append(("sort", ["sort", "-S", f"{a.sort_mib * 3}M", "--parallel=1", src]))
    if a.only is None or "pydict" in a.only:
        script = os.path.join(tmp, "pydict.py")
        with open(script, "w") as f:
            f.write(PYDICT)
        programs.append(("pydict", [sys.executable, script, str(a.pydict_n)]))

    try:
        kernel = KernelSwap(a.kernel_swap, "8G")
    except BaseException:  # its refusals exit (and a signal in it closes what it set up)
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    sides = [("folioswap", [])] + [(f"folioswap {' '.join(v)}", v) for v in a.variant] + [
        (f"kernel zswap ({kernel.zswap_compressor})" if k == "zswap" else f"kernel {k}", k) for k in a.kernel_swap]
    rows = []
    try:
        for name, argv in programs:
            wall0, digest0, rss = run_program(argv)
            limits = [int(m) << 20 for m in a.limit] if a.limit else [int(rss * f) & ~((1 << 20) - 1) for f in a.fraction]
            for limit in limits:
                print(f"# {name}: unlimited {wall0:.2f} s, peak RSS {rss >> 20} MiB, limit {limit >> 20} MiB", file=sys.stderr, flush=True)
                times = {side: [] for side, _ in sides}
                memory = {side: [] for side, _ in sides}
                for i in range(a.runs):
                    for side, extra in sides:
                        env = None
                        if isinstance(extra, str):
                            cmd = kernel.command(extra, limit, argv)
                        else:
                            assigned = [w for w in extra if w.startswith("FOLIOSWAP_") and "=" in w]
                            env = dict(os.environ, **dict(w.split("=", 1) for w in assigned)) if assigned else None
                            options = [w for w in extra if w not in assigned]
                            cmd = [BIN, "run", "--quiet", "--memory-high", str(limit)] + a.folioswap_arg + options + ["--"] + argv
                        swaps_before = vmstat_swaps()
                        try:
                            wall, digest, peak = run_program(cmd, a.timeout, env)
                        except RuntimeError as e:
                            # The kernel's hard limit (cgroup v1) OOM-kills where reclaim cannot keep up.
                            print(f"# {name} {side} run {i + 1}: FAILED: {e}", file=sys.stderr, flush=True)
                            times[side].append(None)
                            continue
                        if digest != digest0:
                            raise RuntimeError(f"{name} under {side}: output differs from the unlimited run")
                        # The memory the run cost: its peak RSS, and for the kernel what
                        # zram or zswap held outside the limit besides (the two peaks may
                        # not coincide, so their sum bounds the kernel's from above).
                        swapped = ""
                        if isinstance(extra, str):
                            peak += kernel.extra_peak(extra)
                            after = vmstat_swaps()
                            swapped = ", " + " ".join(f"{k} {after[k] - v}" for k, v in swaps_before.items())
                        times[side].append(wall)
                        memory[side].append(peak)
                        print(f"# {name} {side} run {i + 1}: {wall:.2f} s, {peak / 2**20:.1f} MiB{swapped}", file=sys.stderr, flush=True)
                rows.append((name, rss, limit, wall0, times, memory))
    finally:
        kernel.close()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        shutil.rmtree(tmp, ignore_errors=True)
    names = [side for side, _ in sides]
    print("| program | peak RSS | limit | unlimited s | " + " | ".join(f"{n} s (median)" for n in names) + " |")
    print("|---|---|---|---|" + "---|" * len(names))
    for name, rss, limit, wall0, t, _ in rows:
        cells = []
        for n in names:
            ok = [x for x in t[n] if x is not None]
            runs = " / ".join("failed" if x is None else f"{x:.2f}" for x in t[n])
            cells.append(f"**{statistics.median(ok):.2f}** ({runs})" if len(ok) * 2 > len(t[n]) else f"failed ({runs})")
        print(f"| {name} | {rss >> 20} MiB | {limit >> 20} MiB | {wall0:.2f} | " + " | ".join(cells) + " |")
    # Issue 14's bar is a ratio: each folioswap side's median over each kernel side's, of
    # the kernel's finished runs and, in brackets, with its failed runs (OOM kills) counted
    # as its slowest.
    ours = [side for side, extra in sides if not isinstance(extra, str)]
    theirs = [side for side, extra in sides if isinstance(extra, str)]
    print()
    print("| program | limit | " + " | ".join(f"{o} / {k}" for o in ours for k in theirs) + " |")
    print("|---|---|" + "---|" * (len(ours) * len(theirs)))
    for name, _, limit, _, t, _ in rows:
        cells = []
        for o in ours:
            mine = [x for x in t[o] if x is not None]
            for k in theirs:
                done = [x for x in t[k] if x is not None]
                if not mine or not done:
                    cells.append("-")
                    continue
                slowest = median_failed_slowest(t[k])
                with_kills = f"{statistics.median(mine) / slowest:.2f}" if slowest else "-"
                cells.append(f"{statistics.median(mine) / statistics.median(done):.2f} ({with_kills})")
        print(f"| {name} | {limit >> 20} MiB | " + " | ".join(cells) + " |")
    # What each side's finished runs cost in memory: folioswap's peak RSS holds its pool;
    # the kernel's is its peak RSS plus zram's or zswap's peak, which lie outside the
    # cgroup's limit.
    print()
    print("| program | limit | " + " | ".join(f"{n} peak MiB (median)" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    for name, _, limit, _, _, m in rows:
        cells = [f"{statistics.median(m[n]) / 2**20:.1f} ({len(m[n])} runs)" if m[n] else "no run finished" for n in names]
        print(f"| {name} | {limit >> 20} MiB | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
