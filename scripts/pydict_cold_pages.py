#!/usr/bin/env python3
"""Which pages the dict program of `bench_programs.py` leaves cold in its lookups, page by
page, read from the kernel's accessed bits; and what reading them costs. No folioswap, no
limit, no root: the program inspects itself.

Usage: scripts/pydict_cold_pages.py [N]   (N entries, 300000 by default)

User space has no per-page accessed bits on this kernel (no idle page tracking, no DAMON
for virtual addresses); smaps' `Referenced` has them per VMA. So after the dict's build
this program splits its anonymous read-write mappings into one VMA per page (MADV_DONTDUMP
on every other page: neighbouring VMAs with different flags cannot merge), clears the
accessed bits (`/proc/self/clear_refs`), runs the lookups, and reads smaps: a page is hot
if its VMA is `Referenced`. It prints how much of the resident anonymous memory is cold at
4K, 16K, 64K, 256K and 1M granularity (a chunk is cold if none of its pages was touched),
and the time of the `clear_refs` write and of one smaps read at that many VMAs: what an
engine would pay to age pages this way.
"""
import ctypes
import random
import re
import sys
import time

MADV_DONTDUMP = 16
PAGE = 4096


def anonymous_rw_mappings():
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            path = fields[5] if len(fields) > 5 else ""
            if "rw" in fields[1] and path in ("", "[heap]"):
                out.append((lo, hi))
    return out


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300000
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    d = {}
    for i in range(n):
        d[i * 7919 % 10_000_019] = str(i) * 2
    random.seed(1)
    keys = list(d)
    mappings = anonymous_rw_mappings()
    for lo, hi in mappings:
        for addr in range(lo, hi, 2 * PAGE):
            libc.madvise(addr, PAGE, MADV_DONTDUMP)
    t = time.perf_counter()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("1")
    clear_ms = (time.perf_counter() - t) * 1e3
    s = 0
    for _ in range(n):
        s += len(d[keys[random.randrange(n)]])
    t = time.perf_counter()
    with open("/proc/self/smaps", "rb") as f:
        smaps = f.read().decode()
    read_ms = (time.perf_counter() - t) * 1e3
    hot = {}  # page address -> touched by the lookups
    vmas = 0
    whole = []  # resident VMAs in the mappings that were not split
    start = rss = None
    for line in smaps.splitlines():
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if m:
            start, end = int(m.group(1), 16), int(m.group(2), 16)
            vmas += 1
        elif line.startswith("Rss:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("Referenced:") and rss and any(lo <= start < hi for lo, hi in mappings):
            referenced = int(line.split()[1]) > 0
            if end - start > PAGE:
                whole.append((end - start, referenced))
            # A VMA left whole (madvise refused) counts as one unit at its own size.
            for page in range(start, end, PAGE):
                hot[page] = referenced
    total = len(hot) * PAGE
    print(f"dict of {n} entries: {total / 2**20:.1f} MiB of anonymous memory resident in the lookups, {vmas} VMAs")
    print(f"left whole (size, referenced): {whole}")
    print(f"clear_refs {clear_ms:.1f} ms, one smaps read {read_ms:.1f} ms ({len(smaps) / 2**20:.1f} MiB of text)")
    for chunk in (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20):
        touched = set(page // chunk for page, h in hot.items() if h)
        cold = sum(PAGE for page in hot if page // chunk not in touched)
        print(f"cold at {chunk >> 10:>4}K granularity: {cold / 2**20:5.2f} MiB")
    print(s)


if __name__ == "__main__":
    main()
