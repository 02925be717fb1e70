# Helpers for the tests and benchmarks, kept out of the production modules: a C-timed matrix product loop
# (benchmarks/bench_kernels*.py) and a thread-team coverage count (tests/test_parallel.py).
from libc.stdint cimport int64_t, uint8_t

import time

import numpy as np

from llamacy.kernels.matmul cimport matmul_impl
from llamacy.kernels.parallel cimport parallel_for

from llamacy.kernels.matmul import operands
from llamacy.kernels.parallel import ensure_threads


def bench_matmul(W_rows, int wtype, x, int nthreads=1, impl="auto", double min_time=0.2,
                 int min_reps=5):
    """Seconds per matmul, the best of repeated C loops of >= 2 ms (activations quantized once, outside).

    Single-threaded runs are timed in thread CPU time (time.thread_time), which does not count the time
    the thread sits descheduled on a shared machine; multi-threaded runs in wall time.
    """
    Wa, xq, code, cols_ = operands(W_rows, wtype, x, impl)
    nthreads = min(max(nthreads, 1), ensure_threads(nthreads))
    cdef Py_ssize_t n = xq.shape[0], cols = cols_
    cdef Py_ssize_t rows = Wa.shape[0]
    cdef int c = code
    Y = np.zeros((n, rows), dtype=np.float32)
    cdef const uint8_t[:, ::1] wv = Wa
    cdef const uint8_t[:, ::1] qv = xq
    cdef float[:, ::1] yv = Y
    cdef int i, iters = 1
    clock = time.thread_time if nthreads == 1 else time.perf_counter
    best = float("inf")
    total = 0.0
    reps = 0
    while True:  # warm up, growing the inner loop until one measurement takes >= 2 ms
        t0 = clock()
        with nogil:
            for i in range(iters):
                matmul_impl(&wv[0, 0], wtype, rows, cols, &qv[0, 0], n, &yv[0, 0], rows, nthreads, c)
        dt = clock() - t0
        if dt >= 0.002:
            break
        iters *= 2
    while total < min_time or reps < min_reps:
        t0 = clock()
        with nogil:
            for i in range(iters):
                matmul_impl(&wv[0, 0], wtype, rows, cols, &qv[0, 0], n, &yv[0, 0], rows, nthreads, c)
        dt = clock() - t0
        total += dt
        reps += 1
        best = min(best, dt / iters)
    return best


# Every item exactly once, under many jobs in a row.

ctypedef struct _CountCtx:
    int* counts
    int64_t n


cdef void _count_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    cdef _CountCtx* c = <_CountCtx*> ctx
    cdef int64_t i
    for i in range(begin, end):
        c.counts[i] += 1


def check_coverage(int64_t n_items, int64_t chunk, int nthreads, int repeats=1):
    """Run `repeats` jobs over n_items; return how often each item was visited (all should be repeats)."""
    counts = np.zeros(max(n_items, 1), dtype=np.intc)
    cdef int[::1] cv = counts
    cdef _CountCtx c
    c.counts = &cv[0]
    c.n = n_items
    cdef int r
    ensure_threads(nthreads)
    with nogil:
        for r in range(repeats):
            parallel_for(_count_task, &c, n_items, chunk, nthreads)
    return counts[:n_items]
