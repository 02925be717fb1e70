# Helpers for the tests and benchmarks, kept out of the production modules: a C-timed matrix product loop
# (benchmarks/bench_kernels*.py), thread-team coverage counts (tests/test_parallel.py) and Python-level
# entry points to the layer loop's element-wise operations and attention (tests/test_ops.py and
# tests/test_kv_formats.py check them against numpy; benchmarks/bench_attention.py times decode attention).
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t

import time

import numpy as np

from llamacy.kernels.matmul cimport matmul_impl
from llamacy.kernels.ops cimport (KV_F16, KV_F32, KV_Q4_0, KV_Q8_0, N_KV_FORMATS, attend_block, attend_group,
                                  kv_row_bytes, rmsnorm, rope, rope_table, store_kv_row)
from llamacy.kernels.parallel cimport parallel_for
from llamacy.kernels.ranges cimport LC_RANGES_MAX, lc_range, lc_ranges_split, lc_ranges_work

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


# Ranges taken from the front by their owners and stolen from the back (ranges.h): every unit exactly once.

cdef extern from *:
    """
    static inline void lc_test_count(int *p) { __atomic_fetch_add(p, 1, __ATOMIC_RELAXED); }
    """
    void lc_test_count(int* p) noexcept nogil

ctypedef struct _RangesCtx:
    lc_range* ranges
    int n_ranges
    int* counts
    int spin  # busy iterations per unit, so that owners and thieves overlap


cdef void _count_units(void* ctx, uint32_t u0, uint32_t n) noexcept nogil:
    cdef _RangesCtx* c = <_RangesCtx*> ctx
    cdef uint32_t u
    cdef int i
    cdef volatile int sink = 0
    for u in range(u0, u0 + n):
        lc_test_count(&c.counts[u])
        for i in range(c.spin):
            sink = sink + i


cdef void _ranges_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    cdef _RangesCtx* c = <_RangesCtx*> ctx
    lc_ranges_work(c.ranges, c.n_ranges, begin, end, _count_units, ctx)


def check_ranges(uint32_t units, int nthreads, int repeats=1, int spin=0):
    """Run `repeats` jobs of `units` units split into one range per thread (the decode products' way);
    return how often each unit was visited (all should be repeats)."""
    if not 1 <= nthreads <= LC_RANGES_MAX:
        raise ValueError(f"nthreads must be 1..{LC_RANGES_MAX}")
    counts = np.zeros(max(units, 1), dtype=np.intc)
    cdef int[::1] cv = counts
    cdef lc_range ranges[LC_RANGES_MAX]
    cdef _RangesCtx c
    c.ranges = ranges
    c.n_ranges = nthreads
    c.counts = &cv[0]
    c.spin = spin
    cdef int r
    ensure_threads(nthreads)
    with nogil:
        for r in range(repeats):
            lc_ranges_split(ranges, nthreads, units)
            parallel_for(_ranges_task, &c, nthreads, 1, nthreads)
    return counts[:units]


# The element-wise operations of ops.pyx.
def py_rmsnorm(float[::1] x, float[::1] w, float eps):
    out = np.empty(x.shape[0], dtype=np.float32)
    cdef float[::1] o = out
    rmsnorm(&x[0], &w[0], &o[0], x.shape[0], eps)
    return out


def py_rope(float[:, ::1] x, Py_ssize_t n_rot, float pos, float base, int mode):
    """Rotate each row of x (n_heads x head_dim) in place for position pos."""
    if n_rot > x.shape[1] or n_rot % 2:
        raise ValueError("n_rot must be even and at most head_dim")
    cs = np.empty(n_rot, dtype=np.float32)
    cdef float[::1] c = cs
    rope_table(&c[0], n_rot, pos, base, 1.0, NULL)
    rope(&x[0, 0], x.shape[0], x.shape[1], n_rot, &c[0], mode)


# The row formats of ops.pxd by kv_types name (tests hold llamacy.model.kv_types to these numbers).
KV_FMT = {"f32": KV_F32, "f16": KV_F16, "q8_0": KV_Q8_0, "q4_0": KV_Q4_0}
_PLAIN_FMT = {np.dtype(np.float32): KV_F32, np.dtype(np.float16): KV_F16}


def py_kv_row_bytes(int kv_fmt, Py_ssize_t head_dim):
    """Bytes of one cached row (ops.kv_row_bytes), after the checks its callers make."""
    if not 0 <= kv_fmt < N_KV_FORMATS:
        raise ValueError(f"unknown KV row format {kv_fmt}")
    if kv_fmt >= KV_Q8_0 and head_dim % 32:
        raise ValueError("quantized KV rows need a head_dim that is a multiple of 32")
    return kv_row_bytes(kv_fmt, head_dim)


def _attn_cache(K, V, Py_ssize_t head_dim, int kv_fmt):
    """K, V as contiguous 2-D arrays of one cache format, and that format.

    float32 / float16 arrays [positions, head_dim] give their own format (kv_fmt must be -1 or it); rows of
    a quantized format are uint8 arrays [positions, row bytes] with kv_fmt saying which.
    """
    K = np.ascontiguousarray(K)
    V = np.ascontiguousarray(V)
    if K.dtype != V.dtype or K.ndim != 2 or V.ndim != 2:
        raise ValueError("K and V must be 2-D, both float32, both float16 or both uint8 (quantized rows)")
    if K.shape != V.shape or K.shape[1] == 0:
        raise ValueError("K and V must have the same non-empty shape")
    if K.dtype == np.uint8:
        if kv_fmt < KV_Q8_0:
            raise ValueError("uint8 K and V need a quantized kv_fmt")
    elif K.dtype in _PLAIN_FMT:
        if kv_fmt not in (-1, _PLAIN_FMT[K.dtype]):
            raise ValueError("kv_fmt does not match the dtype of K and V")
        kv_fmt = _PLAIN_FMT[K.dtype]
    else:
        raise ValueError("K and V must be float32, float16, or uint8 rows of a quantized format")
    if K.shape[1] * K.itemsize != py_kv_row_bytes(kv_fmt, head_dim):
        raise ValueError("head_dim mismatch")
    return K, V, kv_fmt


def py_attend(float[::1] q, K, V, Py_ssize_t first, Py_ssize_t last, float scale, float softcap=0.0,
              int kv_fmt=-1, bint stream=False):
    """K, V: [positions, head_dim] float32 or float16, or [positions, row bytes] uint8 rows of kv_fmt
    (ops.KV_Q8_0, KV_Q4_0: py_store_kv_rows writes them). stream: as decoding calls it (rows requested ahead
    of the reads; the same result)."""
    K, V, fmt = _attn_cache(K, V, q.shape[0], kv_fmt)
    if not (0 <= first <= last < K.shape[0]):
        raise ValueError("bad attention range")
    cdef int f = fmt
    cdef const uint8_t[::1] kb = K.reshape(-1).view(np.uint8)
    cdef const uint8_t[::1] vb = V.reshape(-1).view(np.uint8)
    scores = np.empty(K.shape[0], dtype=np.float32)
    out = np.empty(q.shape[0], dtype=np.float32)
    cdef float[::1] s = scores, o = out
    attend_group(&q[0], &kb[0], &vb[0], first, last, q.shape[0], 1, scale, softcap, &s[0], K.shape[0], &o[0],
                 f, stream)
    return out


def py_attend_group(float[:, ::1] q, K, V, Py_ssize_t first, Py_ssize_t last, float scale, float softcap=0.0,
                    int kv_fmt=-1, bint stream=False):
    """q: [heads, head_dim], the query heads of one KV group; K, V as for py_attend.

    Returns [heads, head_dim]: each row what py_attend gives for that head, bit for bit.
    """
    if q.shape[0] == 0:
        raise ValueError("q must be [heads >= 1, head_dim]")
    K, V, fmt = _attn_cache(K, V, q.shape[1], kv_fmt)
    if not (0 <= first <= last < K.shape[0]):
        raise ValueError("bad attention range")
    cdef int f = fmt
    cdef Py_ssize_t ss = K.shape[0]  # each head's scores row: one float per cached position
    cdef const uint8_t[::1] kb = K.reshape(-1).view(np.uint8)
    cdef const uint8_t[::1] vb = V.reshape(-1).view(np.uint8)
    scores = np.empty(q.shape[0] * ss, dtype=np.float32)
    out = np.empty((q.shape[0], q.shape[1]), dtype=np.float32)
    cdef float[::1] s = scores
    cdef float[:, ::1] o = out
    attend_group(&q[0, 0], &kb[0], &vb[0], first, last, q.shape[1], q.shape[0], scale, softcap, &s[0], ss,
                 &o[0, 0], f, stream)
    return out


def py_attend_block(float[:, :, ::1] q, K, V, Py_ssize_t first, Py_ssize_t last0, float scale, float softcap=0.0,
                    int kv_fmt=-1):
    """q: [tokens, heads, head_dim], a prompt's block of tokens at consecutive positions (token i attends
    over first..last0 + i), each with the query heads of one KV group; K, V as for py_attend.

    Returns [tokens, heads, head_dim] through ops.attend_block: each row what py_attend gives for that
    token's head over its positions, bit for bit.
    """
    if q.shape[0] == 0 or q.shape[1] == 0:
        raise ValueError("q must be [tokens >= 1, heads >= 1, head_dim]")
    K, V, fmt = _attn_cache(K, V, q.shape[2], kv_fmt)
    if not (0 <= first <= last0 and last0 + q.shape[0] <= K.shape[0]):
        raise ValueError("bad attention range")
    cdef int f = fmt
    cdef Py_ssize_t ss = K.shape[0] + 3  # a row stride no multiple of 8: the rows start anywhere
    cdef Py_ssize_t B = q.shape[0], G = q.shape[1], hd = q.shape[2]
    cdef const uint8_t[::1] kb = K.reshape(-1).view(np.uint8)
    cdef const uint8_t[::1] vb = V.reshape(-1).view(np.uint8)
    scores = np.empty(B * G * ss, dtype=np.float32)
    out = np.empty((B, G, hd), dtype=np.float32)
    cdef float[::1] s = scores
    cdef float[:, :, ::1] o = out
    attend_block(&q[0, 0, 0], G * hd, &kb[0], &vb[0], first, last0, B, hd, G, scale, softcap, &s[0], ss,
                 &o[0, 0, 0], G * hd, f)
    return out


def py_store_kv_row(float[::1] x, int kv_fmt):
    """x as store_kv_row writes it into a cache of that format: a float32 or float16 array, or the row's
    bytes (uint8) for a quantized format."""
    cdef Py_ssize_t nb = py_kv_row_bytes(kv_fmt, x.shape[0])
    out = np.empty(nb, dtype=np.uint8)
    cdef uint8_t[::1] ob = out
    if x.shape[0]:
        store_kv_row(&ob[0], &x[0], x.shape[0], kv_fmt)
    return out.view({KV_F32: np.float32, KV_F16: np.float16}.get(kv_fmt, np.uint8))


def py_store_kv_rows(float[:, ::1] X, int kv_fmt):
    """Each row of X (positions x head_dim) through store_kv_row: [positions, row bytes] uint8."""
    cdef Py_ssize_t rb = py_kv_row_bytes(kv_fmt, X.shape[1]), i
    out = np.zeros((X.shape[0], rb), dtype=np.uint8)
    cdef uint8_t[:, ::1] ob = out
    if X.shape[1]:
        for i in range(X.shape[0]):
            store_kv_row(&ob[i, 0], &X[i, 0], X.shape[1], kv_fmt)
    return out


def time_attend_decode(float[:, ::1] q, const uint8_t[:, :] K, const uint8_t[:, :] V, Py_ssize_t n_kv,
                       Py_ssize_t last, int kv_fmt, Py_ssize_t steps):
    """Seconds per step of decode-style attention (benchmarks/bench_attention.py), one time per step.

    K and V: [caches, positions * row bytes], one KV head's cache per row (contiguous within a row; the rows
    may be further apart, so that a cache can start anywhere in a page). Each step is one token of one
    layer: the q.shape[0] query heads split evenly over n_kv KV heads, each KV head's group attending over
    positions 0..last of its own cache. Successive steps take successive caches (wrapping around), so with
    more cache bytes than the last-level cache holds, every step reads its rows from memory, as decode does.
    """
    cdef Py_ssize_t hd = q.shape[1], G = q.shape[0] // n_kv, rb = py_kv_row_bytes(kv_fmt, q.shape[1])
    if n_kv < 1 or q.shape[0] % n_kv or K.shape[0] < n_kv or K.shape[0] != V.shape[0]:
        raise ValueError("q.shape[0] must split evenly over n_kv <= caches KV heads")
    if last < 0 or K.shape[1] < (last + 1) * rb or V.shape[1] != K.shape[1]:
        raise ValueError("each cache must hold last + 1 rows")
    if K.strides[1] != 1 or V.strides[1] != 1:
        raise ValueError("each cache's bytes must be contiguous")
    scores = np.empty(q.shape[0] * (last + 1), dtype=np.float32)
    out = np.empty((q.shape[0], hd), dtype=np.float32)
    times = np.empty(steps, dtype=np.float64)
    cdef float[::1] s = scores
    cdef float[:, ::1] o = out
    cdef Py_ssize_t step, h, c = 0
    for step in range(steps):
        t0 = time.perf_counter()
        with nogil:
            for h in range(n_kv):
                attend_group(&q[h * G, 0], &K[c, 0], &V[c, 0], 0, last, hd, G, 0.125, 0.0,
                             &s[h * G * (last + 1)], last + 1, &o[h * G, 0], kv_fmt, True)
                c = c + 1 if c + 1 < K.shape[0] else 0
        times[step] = time.perf_counter() - t0
    return times


# Streaming read bandwidth (benchmarks/bench_memory.py): the thread team reads a buffer once, in one
# contiguous range per thread (as decode reads its weights), OR-ing 64-byte lines into eight independent
# accumulators: next to no arithmetic, so the figure is what memory delivers, not what a reduction loop can
# consume (numpy's bitwise_or.reduce tops out at ~23 GB/s a thread here, below what one core can read).
ctypedef struct _ReadCtx:
    const uint64_t* p
    int64_t n_lines
    int64_t per_item
    uint64_t sink[256]


cdef void _read_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    cdef _ReadCtx* c = <_ReadCtx*> ctx
    cdef uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0
    cdef int64_t item, i, i0, i1
    cdef const uint64_t* q
    for item in range(begin, end):
        i0 = item * c.per_item
        i1 = min(c.n_lines, i0 + c.per_item)
        for i in range(i0, i1):
            q = c.p + 8 * i
            a0 |= q[0]
            a1 |= q[1]
            a2 |= q[2]
            a3 |= q[3]
            a4 |= q[4]
            a5 |= q[5]
            a6 |= q[6]
            a7 |= q[7]
    c.sink[tid & 255] |= a0 | a1 | a2 | a3 | a4 | a5 | a6 | a7


def _read_view(buf):
    arr = np.ascontiguousarray(buf).reshape(-1).view(np.uint64)
    if arr.shape[0] < 8 or arr.shape[0] % 8:
        raise ValueError("buf must hold a whole number (>= 1) of 64-byte lines")
    return arr


def read_once(buf, int nthreads):
    """(seconds, OR of every 64-bit word of buf): one read of buf (C-contiguous, a whole number of 64-byte
    lines) by nthreads threads of the team, each thread one contiguous range."""
    arr = _read_view(buf)
    cdef const uint64_t[::1] v = arr
    cdef _ReadCtx c
    cdef int i
    c.p = &v[0]
    c.n_lines = arr.shape[0] // 8
    for i in range(256):
        c.sink[i] = 0
    nthreads = min(max(nthreads, 1), ensure_threads(nthreads))
    c.per_item = (c.n_lines + nthreads - 1) // nthreads
    cdef int64_t n_items = (c.n_lines + c.per_item - 1) // c.per_item
    t0 = time.perf_counter()
    with nogil:
        parallel_for(_read_task, &c, n_items, 1, nthreads)
    dt = time.perf_counter() - t0
    cdef uint64_t acc = 0
    for i in range(256):
        acc |= c.sink[i]
    return dt, int(acc)


def read_seconds(buf, int nthreads, int reps=4):
    """Best of reps: seconds for nthreads threads to read buf once (read_once)."""
    return min(read_once(buf, nthreads)[0] for _ in range(reps))
