# The process-wide thread team (threadpool.h): parallel_for hands out chunks of [0, n_items).
from libc.stdint cimport int64_t

cdef extern from "threadpool.h":
    ctypedef void (*lc_task_fn)(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil
    ctypedef struct lc_pool:
        pass

# Run fn(ctx, begin, end, tid) over [0, n_items) in chunks, on up to nthreads threads (the caller is
# one, tid 0; workers have tid 1..nthreads-1, for per-thread scratch).
# Safe to call from several threads: while one job holds the team, another caller runs alone.
cdef void parallel_for(lc_task_fn fn, void* ctx, int64_t n_items, int64_t chunk, int nthreads) noexcept nogil
