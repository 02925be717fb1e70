# cython: language_level=3
"""The process-wide thread team that the matmul and attention loops share (see threadpool.h)."""

from libc.stdint cimport int64_t

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
