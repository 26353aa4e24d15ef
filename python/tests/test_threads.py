"""Arrays from two threads: each its own array, and two halves of one array. numpy
releases the GIL in bulk operations, so both threads fault at once."""

import threading

import numpy

import folioswap

MiB = 1 << 20
CHUNK = 1 << 20


def write_and_check(a, start, errors, rounds=2):
    try:
        n = len(a)
        for r in range(rounds):
            base = start + r * 1000
            for i in range(0, n, CHUNK):
                j = min(i + CHUNK, n)
                a[i:j] = numpy.arange(base + i, base + j, dtype=numpy.int64)
            assert int(a.sum()) == n * base + n * (n - 1) // 2, f"sum of round {r}"
            for i in range(0, n, CHUNK):
                j = min(i + CHUNK, n)
                assert (a[i:j] == numpy.arange(base + i, base + j, dtype=numpy.int64)).all(), f"round {r}, [{i}, {j})"
    except BaseException as e:  # reported by the main thread
        errors.append(e)


def run(targets):
    errors = []
    threads = [threading.Thread(target=write_and_check, args=(a, start, errors)) for a, start in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_two_threads_two_arrays():
    engine = folioswap.Engine(memory_high="32M")
    n = 64 * MiB // 8
    a = engine.zeros(n, dtype=numpy.int64)
    b = engine.zeros(n, dtype=numpy.int64, folio_size="64K")
    run([(a, 0), (b, 1 << 30)])
    s = engine.stats()
    assert s["zswpout"] > 0 and s["zswpin"] + s["pswpin"] > 0


def test_two_threads_arrays_from_their_own_engines():
    n = 48 * MiB // 8
    results = {}

    def make(key):
        results[key] = folioswap.Engine(memory_high="16M", folio_size="64K").zeros(n, dtype=numpy.int64)

    makers = [threading.Thread(target=make, args=(k,)) for k in "ab"]
    for t in makers:
        t.start()
    for t in makers:
        t.join()
    run([(results["a"], 5), (results["b"], 99)])


def test_two_threads_on_halves_of_one_array():
    engine = folioswap.Engine(memory_high="32M")
    n = 128 * MiB // 8
    a = engine.zeros(n, dtype=numpy.int64)
    half = n // 2
    run([(a[:half], 0), (a[half:], half)])
    assert int(a.sum()) == n * (n - 1) // 2 + n * 1000  # the last round: 1000 + i everywhere
    s = engine.stats()
    assert s["zswpout"] > 0 and s["zswpin"] + s["pswpin"] > 0
