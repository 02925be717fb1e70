# cython: language_level=3
"""The process-wide thread team that the matmul and attention loops share (see threadpool.h)."""

from libc.stdint cimport int64_t

import numpy as np

cdef extern from "threadpool.h" nogil:
    lc_pool* lc_pool_create()
    int lc_pool_grow(lc_pool* p, int n_workers)
    void lc_pool_run(lc_pool* p, lc_task_fn fn, void* ctx, int64_t n_items, int64_t chunk, int nthreads)
    void lc_pool_rest(lc_pool* p)

cdef lc_pool* _pool = lc_pool_create()


def ensure_threads(int nthreads) -> int:
    """Make the team big enough for nthreads (the caller counts as one); returns the threads available."""
    if _pool == NULL:
        return 1
    if nthreads > 1:
        return lc_pool_grow(_pool, nthreads - 1) + 1
    return 1


def rest() -> None:
    """Let the team's idle workers sleep now instead of spinning for the next job: for a caller that is
    about to do other work for a while (a millisecond or more) between evaluations."""
    lc_pool_rest(_pool)


cdef void parallel_for(lc_task_fn fn, void* ctx, int64_t n_items, int64_t chunk, int nthreads) noexcept nogil:
    lc_pool_run(_pool, fn, ctx, n_items, chunk, nthreads)


# ---- for the tests: every item exactly once, under many jobs in a row ------------------------------

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
