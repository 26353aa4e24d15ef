#!/usr/bin/env python3
"""How well lz4 and zstd:1 compress the heap of the dict program of `bench_programs.py`.

Runs that program (300 000 keys: the build, then the lookups) in this CPython, then reads its
own anonymous writable mappings of 256 KiB and more (and the brk heap) from
`/proc/self/mem` and compresses every non-zero 4 KiB page alone, and every 64 KiB piece,
with lz4 (block format, as the pool's default codec) and zstd at level 1. Prints the
pages read, the zero pages, and each ratio (bytes of non-zero pages per compressed byte;
a result larger than its input counts as stored raw).

Needs the `lz4` and `zstandard` modules, which the project does not otherwise use:
  python3 -m venv /tmp/ratio-venv && /tmp/ratio-venv/bin/pip install lz4 zstandard
  /tmp/ratio-venv/bin/python scripts/pydict_heap_ratio.py
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_programs import PYDICT  # noqa: E402

try:
    import lz4.block
    import zstandard
except ImportError as e:
    raise SystemExit(f"{e}: install lz4 and zstandard into a virtualenv (see this script's docstring)")

N = 300000
PAGE = 4096
PIECE = 64 << 10


def build_and_look_up():
    """`bench_programs.py`'s own program, run here; its namespace keeps the dict alive."""
    saved, sys.argv = sys.argv, ["pydict", str(N)]
    try:
        namespace = {}
        exec(PYDICT, namespace)  # prints the lookups' sum, as under the benchmark
        return namespace
    finally:
        sys.argv = saved


def heap_mappings():
    for line in open("/proc/self/maps"):
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ (\d+)\s*(.*)", line)
        start, end, perms, inode, name = int(m[1], 16), int(m[2], 16), m[3], m[4], m[5].strip()
        if "rw" in perms and inode == "0" and name in ("", "[heap]") and end - start >= 256 << 10:
            yield start, end


def main():
    keep = build_and_look_up()  # alive while its memory is read
    zc = zstandard.ZstdCompressor(level=1)
    lz4_len = lambda b: min(len(b), len(lz4.block.compress(b, store_size=False)))
    zstd_len = lambda b: min(len(b), len(zc.compress(b)))
    pages = zero = 0
    out = {"lz4": 0, "zstd:1": 0, "lz4 64K": 0, "zstd:1 64K": 0}
    with open("/proc/self/mem", "rb", 0) as mem:
        for start, end in heap_mappings():
            mem.seek(start)
            data = mem.read(end - start)
            for off in range(0, len(data), PIECE):
                piece = data[off:off + PIECE]
                for p in range(0, len(piece), PAGE):
                    page = piece[p:p + PAGE]
                    pages += 1
                    if page.count(0) == PAGE:
                        zero += 1
                        continue
                    out["lz4"] += lz4_len(page)
                    out["zstd:1"] += zstd_len(page)
                if piece.count(0) != len(piece):
                    out["lz4 64K"] += lz4_len(piece)
                    out["zstd:1 64K"] += zstd_len(piece)
    nonzero = (pages - zero) * PAGE
    print(f"pages {pages}, zero {zero}, non-zero {nonzero / 2**20:.1f} MiB (the dict: {len(keep['d'])} keys)")
    for name, n in out.items():
        print(f"{name:10} ratio {nonzero / n:.2f}")


if __name__ == "__main__":
    main()
