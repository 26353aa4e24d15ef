"""Arrays in engine regions: much larger than memory_high, written, summed and checked;
their faces (dtype, shape, flags); their lifetime."""

import gc
import os
import time

import numpy
import pytest

import folioswap

MiB = 1 << 20
CHUNK = 1 << 20  # elements per vectorised step: 8 MiB of temporaries at most


def mapping_of(a):
    """The engine object at the bottom of `a`'s chain of bases."""
    while isinstance(a, numpy.ndarray):
        a = a.base
    return a


def fill_and_check(a, start=0):
    """Write start, start+1, ... into `a` (1-D int64) chunk by chunk, then sum it and
    compare every element, so that each pass over it swaps when it is over the limit."""
    n = len(a)
    for i in range(0, n, CHUNK):
        j = min(i + CHUNK, n)
        a[i:j] = numpy.arange(start + i, start + j, dtype=numpy.int64)
    total = int(a.sum())
    assert total == n * start + n * (n - 1) // 2
    for i in range(0, n, CHUNK):
        j = min(i + CHUNK, n)
        assert (a[i:j] == numpy.arange(start + i, start + j, dtype=numpy.int64)).all(), f"wrong values in [{i}, {j})"


def test_array_four_times_the_limit_is_written_summed_and_checked():
    engine = folioswap.Engine(memory_high="32M")
    n = 128 * MiB // 8
    a = engine.zeros(n, dtype=numpy.int64)
    assert isinstance(a, numpy.ndarray)
    assert a.shape == (n,) and a.dtype == numpy.int64 and a.nbytes == 128 * MiB
    assert a.flags.writeable and a.flags.c_contiguous and a.flags.aligned
    assert not a[: 1 << 16].any() and not a[-(1 << 16):].any(), "fresh memory must read as zeros"
    fill_and_check(a)
    s = engine.stats()
    assert s["zswpout"] > 0, "nothing was swapped out"
    assert s["zswpin"] + s["pswpin"] > 0, "nothing was swapped in"
    # The limit held: memory_high bounds what is charged (resident, swap cache, pool).
    assert s["memory"]["charged_bytes"] <= 32 * MiB + 8 * MiB, s["memory"]
    assert s["memory"]["managed_bytes"] >= 128 * MiB


def test_float64_2d_and_small_folios():
    engine = folioswap.Engine(memory_high="16M", folio_size="64K", compressor="zstd")
    a = engine.zeros((2048, 4096))  # float64 by default: 64 MiB
    assert a.dtype == numpy.float64 and a.shape == (2048, 4096) and a.flags.c_contiguous
    for r in range(0, 2048, 256):
        a[r : r + 256] = numpy.arange(r * 4096, (r + 256) * 4096, dtype=numpy.float64).reshape(256, 4096)
    n = a.size
    assert a.sum() == n * (n - 1) / 2
    assert a[1234, 567] == 1234 * 4096 + 567
    assert (a[:, 0] == numpy.arange(0, n, 4096)).all()
    s = engine.stats()
    assert s["zswpout"] > 0 and s["zswpin"] + s["pswpin"] > 0
    assert s["per_size"]["64kB"]["zswpout"] > 0, s["per_size"]


@pytest.mark.parametrize(
    "dtype, shape",
    [
        (numpy.float32, (3, 5, 7)),
        ("complex128", [10, 3]),
        ("u1", 4097),
        (numpy.dtype([("x", "<i4"), ("y", "<f8")]), (100,)),
        (numpy.bool_, (2, 2)),
        ("S3", 7),
        ("<M8[s]", 5),
        (">i2", (6,)),
        ("int64", ()),
    ],
)
def test_dtypes_and_shapes_match_numpy_zeros(dtype, shape):
    engine = folioswap.Engine(memory_high="16M", folio_size="4K", swap_file="none")
    a = engine.zeros(shape, dtype=dtype)
    b = numpy.zeros(shape, dtype=dtype)
    assert type(a) is numpy.ndarray
    assert a.shape == b.shape and a.dtype == b.dtype
    assert a.flags.writeable and a.flags.c_contiguous and a.flags.aligned
    assert type(mapping_of(a)).__name__ == "Mapping", "the array must be backed by a region"
    assert a.tobytes() == b.tobytes()
    a.reshape(-1).view("u1")[:] = 0x5A
    assert set(a.tobytes()) == {0x5A}


def test_subarray_dtype_extends_the_shape():
    engine = folioswap.Engine(memory_high="16M", folio_size="4K", swap_file="none")
    a = engine.zeros((4, 2), dtype="(3,)f4")
    assert a.shape == (4, 2, 3) and a.dtype == numpy.float32
    assert numpy.zeros((4, 2), "(3,)f4").shape == a.shape


def test_zero_size_shapes_give_plain_empty_arrays():
    engine = folioswap.Engine(memory_high="16M", swap_file="none")
    for shape in [0, (0,), (3, 0), (0, 5, 7)]:
        a = engine.zeros(shape, dtype=numpy.int32)
        assert a.shape == numpy.zeros(shape).shape and a.size == 0 and a.dtype == numpy.int32
        assert a.flags.writeable and a.flags.c_contiguous
    assert engine.stats()["memory"]["managed_bytes"] == 0
    # The folio size is checked all the same.
    with pytest.raises(ValueError, match='folio_size="3K" is not valid'):
        engine.zeros(0, folio_size="3K")


def test_bad_zeros_arguments():
    engine = folioswap.Engine(memory_high="16M", swap_file="none")
    with pytest.raises(ValueError, match="negative dimensions"):
        engine.zeros((2, -1))
    with pytest.raises(TypeError, match="shape"):
        engine.zeros("big")
    with pytest.raises(TypeError, match="Python objects"):
        engine.zeros(4, dtype=object)
    with pytest.raises(TypeError):
        engine.zeros(4, dtype="no such dtype")
    with pytest.raises(ValueError) as e:
        engine.zeros(4, folio_size="3K")
    assert str(e.value).startswith('folio_size="3K" is not valid: expected ')


def test_per_region_folio_size():
    engine = folioswap.Engine(memory_high="16M", folio_size="2M", swap_file="none")
    a = engine.zeros(100_000, dtype="u1", folio_size="64K")
    assert mapping_of(a).folio_size == "64K"
    assert mapping_of(a).region_bytes == 131072 and mapping_of(a).nbytes == 100_000
    assert mapping_of(a).address == a.ctypes.data
    b = engine.zeros(100_000, dtype="u1", folio_size=4096)
    assert mapping_of(b).folio_size == "4K"
    c = engine.zeros(100_000, dtype="u1")
    assert mapping_of(c).folio_size == "2M"


def test_array_outlives_the_engines_name():
    a = folioswap.Engine(memory_high="32M").zeros(64 * MiB // 8, dtype=numpy.int64)
    gc.collect()
    # The engine's Python object is gone; its threads must still serve the array.
    fill_and_check(a, start=7)
    fill_and_check(a, start=-3)
    del a
    gc.collect()


def test_view_outlives_the_arrays_name_and_the_engine():
    engine = folioswap.Engine(memory_high="32M")
    a = engine.zeros(64 * MiB // 8, dtype=numpy.int64)
    fill_and_check(a)
    v = a[10:]
    w = a.reshape(8, -1)[3]
    del a, engine
    gc.collect()
    n = 64 * MiB // 8
    assert v[0] == 10 and v[-1] == n - 1
    assert int(v.sum()) == n * (n - 1) // 2 - 45
    assert w[0] == 3 * n // 8
    v[:] = 1  # writes through every folio again: they swap out and in
    assert int(v.sum()) == n - 10 and w[0] == 1
    del v
    gc.collect()
    assert (w == 1).all()


def test_region_is_released_when_the_last_view_goes():
    engine = folioswap.Engine(memory_high="16M", swap_file="none")
    a = engine.zeros(8 * MiB, dtype="u1")
    v = a[100:200]
    assert engine.stats()["memory"]["managed_bytes"] == 8 * MiB
    del a
    gc.collect()
    assert engine.stats()["memory"]["managed_bytes"] == 8 * MiB, "a view must keep the region"
    del v
    gc.collect()
    assert engine.stats()["memory"]["managed_bytes"] == 0, "the region must go with the last view"


def test_signal_fault_mode():
    # pytest enabled faulthandler before: the engine's SIGBUS handler chains to it.
    engine = folioswap.Engine(memory_high="16M", fault_mode="signal", folio_size="64K")
    a = engine.zeros(48 * MiB // 8, dtype=numpy.int64)
    fill_and_check(a)
    s = engine.stats()
    assert s["zswpout"] > 0 and s["zswpin"] + s["pswpin"] > 0


def engine_threads():
    """This process's engine threads (named fsw-...)."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().startswith("fsw-")
        except FileNotFoundError:
            pass
    return n


def wait_for_engine_threads(count):
    """A joined thread leaves /proc a moment after its join returns."""
    deadline = time.monotonic() + 5
    while engine_threads() != count and time.monotonic() < deadline:
        time.sleep(0.01)
    return engine_threads()


def test_engine_threads_stop_with_the_last_array():
    gc.collect()
    before = engine_threads()
    a = folioswap.Engine(memory_high="16M", swap_file="none").zeros(1 << 20, dtype="u1")
    gc.collect()
    running = engine_threads()
    assert running > before, "an engine runs threads"
    v = a[1:]
    del a
    gc.collect()
    v[:] = 1
    assert engine_threads() == running, "a view keeps the engine running"
    del v
    gc.collect()
    assert wait_for_engine_threads(before) == before, "the engine's threads stop with its last array"
