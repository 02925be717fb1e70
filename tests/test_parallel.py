"""The thread team: every item exactly once, job after job, from one caller or several at once."""

from __future__ import annotations

import threading

import numpy as np
import pytest

parallel = pytest.importorskip("llamacy.kernels.parallel")
testing = pytest.importorskip("llamacy.kernels.testing")


@pytest.mark.parametrize("n_items,chunk", [(1, 1), (7, 3), (1000, 7), (1000, 1000), (1001, 64), (5, 100)])
@pytest.mark.parametrize("nthreads", [1, 2, 4])
def test_every_item_exactly_once(n_items, chunk, nthreads):
    counts = testing.check_coverage(n_items, chunk, nthreads, repeats=3)
    assert counts.shape == (n_items,)
    assert (counts == 3).all()


@pytest.mark.parametrize("units", [0, 1, 2, 5, 64, 997])
@pytest.mark.parametrize("nthreads", [1, 2, 3, 4])
def test_ranges_every_unit_exactly_once(units, nthreads):
    # Decode products' rows: owners take from the front of their range, threads done early steal from the
    # back of the others' (ranges.h). The work per unit keeps owners and thieves on the same ranges at once.
    counts = testing.check_ranges(units, nthreads, repeats=50, spin=200)
    np.testing.assert_array_equal(counts, np.full(units, 50))


def test_ranges_many_jobs_in_a_row():
    # Thousands of short jobs: a late worker must neither miss its range nor take units of the next job's.
    np.testing.assert_array_equal(testing.check_ranges(37, 3, repeats=20000), 20000)


def test_many_jobs_in_a_row():
    # Thousands of short jobs: a worker that wakes late for one job must not claim items of the next.
    counts = testing.check_coverage(97, 1, 3, repeats=20000)
    np.testing.assert_array_equal(counts, 20000)


def test_several_callers_at_once():
    # While one thread's job holds the team, another caller runs its job alone: both complete.
    results = []

    def work():
        results.append(testing.check_coverage(513, 5, 2, repeats=2000))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 3
    for counts in results:
        np.testing.assert_array_equal(counts, 2000)


def test_ensure_threads_reports_the_team():
    assert parallel.ensure_threads(1) == 1
    assert parallel.ensure_threads(3) >= 3


def test_jobs_after_rest_still_run_every_item():
    # rest() sends the waiting workers to sleep; the next job must wake them (or run without them), and a
    # rest() that lands in the middle of a job must not lose items. One thread hammers rest() meanwhile.
    stop = threading.Event()

    def rester():
        while not stop.is_set():
            parallel.rest()

    t = threading.Thread(target=rester)
    t.start()
    try:
        for _ in range(200):
            parallel.rest()
            counts = testing.check_coverage(1001, 8, 3, repeats=5)
            np.testing.assert_array_equal(counts, 5)
    finally:
        stop.set()
        t.join(timeout=30)


@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_read_probe_reads_the_buffer(nthreads):
    # The bandwidth probe of benchmarks/bench_memory.py: a time for a real read, and sizes checked first.
    buf = np.zeros(3 * 2**20 // 8 + 8, dtype=np.uint64)
    buf[0], buf[len(buf) // 2 + 3], buf[-1] = 1, 1 << 40, 1 << 63  # first, middle and last line
    s, seen = testing.read_once(buf, nthreads)
    assert 0 < s < 5
    assert seen == 1 | 1 << 40 | 1 << 63
    assert 0 < testing.read_seconds(buf, nthreads, reps=2) < 5
    with pytest.raises(ValueError, match="64-byte lines"):
        testing.read_seconds(np.ones(12, dtype=np.uint64), nthreads)
    with pytest.raises(ValueError, match="64-byte lines"):
        testing.read_seconds(np.ones(0, dtype=np.uint64), nthreads)
