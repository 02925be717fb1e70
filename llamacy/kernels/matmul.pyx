# Quantized matrix products: Y[t, r] = dot(W row r, activation row t), dispatched through the traits table.
#
# Weights stay in their GGUF block format (read in place from the mmap); activations arrive quantized by
# quant.quantize_act_row in the format the weight type pairs with. The kernels are the table's: the AVX2
# tiles (mm_simd, mm_avx2.pyx), the scalar twins (vec_dot, vecdot.pyx: what a portable build runs and what
# the tests hold the SIMD kernels against), and on a CPU with AVX-512 F/BW/VL + VNNI the VNNI kernels
# (mm_vnni, matmul512.pyx: the same numbers, bit for bit, faster with several tokens), which take the
# quantized types and leave the rest to AVX2. They are chosen once, at import (see "AVX-512 VNNI dispatch"
# below); LLAMACY_NO_AVX512=1 keeps AVX2.
#
# Output rows are split over the thread team (parallel.pxd) in chunks of SPLIT_ROWS; nthreads == 1 uses no
# other thread.
from libc.stdint cimport int64_t, uint8_t, uint32_t
from libc.stdio cimport fflush, fprintf, stderr
from libc.stdlib cimport abort

import os
import numpy as np

from llamacy.kernels.parallel cimport parallel_for
from llamacy.kernels.ranges cimport LC_RANGES_MAX, lc_range, lc_ranges_split, lc_ranges_work
from llamacy.kernels.quant cimport (
    IMPL_AUTO, IMPL_SCALAR, IMPL_SIMD, act_row_bytes, quantize_act_row_impl,
)
from llamacy.kernels.simd cimport HAVE_SIMD
from llamacy.kernels.blocks cimport T_Q4_0, T_Q4_1, T_Q4_K, T_Q5_0, T_Q5_K, T_Q6_K, T_Q8_0
from llamacy.kernels.traits cimport (
    LAYOUT_Q4_0_X8, LAYOUT_Q4_1_X8, LAYOUT_Q4_K_X8, LAYOUT_Q5_0_X8, LAYOUT_Q5_K_X8, LAYOUT_Q6_K_X8, LAYOUT_Q8_0_X8,
    N_LAYOUTS, layout_row_bytes, layout_slot, mm_try_fn,
    traits_row_bytes, type_traits, type_traits_of, unknown_type, vec_dot_fn,
)

from llamacy.kernels.parallel import ensure_threads
from llamacy.kernels.traits import row_bytes


# =========================================================================================================
# AVX-512 VNNI dispatch, decided once at import.
#
# matmul512 is compiled for AVX-512, so it is imported only here and only on a CPU that has AVX-512
# F/BW/VL + VNNI (cpu.has_avx512_vnni, which also checks that the OS saves the zmm state): on any other CPU
# not one of its instructions runs, not even its module initialisation. Loaded, it writes its kernels into
# the traits table's mm_vnni column, so matmul() stays nogil and picks them with one pointer test.

# matmul_impl's code for "the AVX-512 VNNI kernels where they apply, AVX2 elsewhere" regardless of
# LLAMACY_NO_AVX512 (tests and benchmarks compare the two paths in one process).
cdef enum:
    IMPL_VNNI = 3
    IMPL_ROWS = 4    # matmul_rows: IMPL_AUTO, but on AVX2 the traits table's mm_rows
    IMPL_TILED = 16  # + a layout id (traits.pxd's LAYOUT_*): weights repacked at load (matmul_tiled)

cdef bint _vnni_found = False  # matmul512 filled in the table's mm_vnni column (this CPU and build)
cdef bint _vnni_on = False     # matmul() uses it: _vnni_found unless LLAMACY_NO_AVX512=1


def _load_vnni():
    """Why the VNNI kernels are or are not in the table; loads matmul512 where this build and CPU can."""
    if not HAVE_SIMD:
        return "portable build"
    from llamacy.kernels import cpu

    if not cpu.has_avx512_vnni():
        return "this CPU lacks AVX-512 F/BW/VL/VNNI"
    try:
        from llamacy.kernels import matmul512
    except ImportError as e:
        return f"matmul512 is not built ({e})"
    matmul512.fill_traits()
    return "available"


AVX512_STATUS = _load_vnni()
if AVX512_STATUS == "available":
    _vnni_found = True
    from llamacy.kernels import cpu

    if cpu.avx512_allowed():
        _vnni_on = True
    else:
        AVX512_STATUS = "off (LLAMACY_NO_AVX512)"
        from llamacy.kernels.traits import use_avx2_layouts

        use_avx2_layouts()  # no AVX-512 instruction runs: the tiles the AVX2 kernels read, and only those


def _load_amx():
    """Why the AMX prefill tiles (inside the VNNI kernels) run or not; turns them on where they can."""
    if not _vnni_on:
        return "the AVX-512 VNNI kernels are off"
    from llamacy.kernels import matmul512

    if not matmul512.amx_compiled():
        return "not built (the compiler lacks -mamx-tile -mamx-int8)"
    if os.environ.get("LLAMACY_NO_AMX", "") not in ("", "0"):
        return "off (LLAMACY_NO_AMX)"
    if not matmul512.amx_enable(True):
        return "this CPU or OS lacks AMX-INT8"
    return "available"


AMX_STATUS = _load_amx()

# Decode's weight prefetch in the VNNI kernels (matmul512.prefetch_set): bytes ahead within each stored row
# and within the one stream of 8-row tile records; a row distance of 0 is the next-tile walk. "tile": stored
# rows walk the next tile, tile records are requested 192 bytes ahead. On Zen 4 (BENCHMARKS.md, issue #29
# session 21) the walk is the best of those tried for stored rows (Q6_K at 2 threads: 28 GB/s against 15-18
# at 128-1024 bytes ahead), and 128-256 bytes ahead the best for tile records (Q4_K 31 GB/s against 24 with
# the walk, Q8_0 30.6 against 27.4), with one more line a page further on (1.02-1.08x decode, session 25).
# "stream": both in-stream, the distances measured best on an Intel Xeon (session 17; the line a page on not
# measured there). LLAMACY_PREFETCH=tile or stream overrides the CPU's choice.
PREFETCH_MODES = {"tile": (0, 192, 4096), "stream": (1024, 2048, 0)}


def prefetch_set(str mode):
    """Decode's weight prefetch, 'tile' or 'stream' (benchmarks compare them in one process; the results
    are the same bits either way)."""
    global PREFETCH
    if mode not in PREFETCH_MODES:
        raise ValueError(f"prefetch mode must be 'tile' or 'stream', got {mode!r}")
    if _vnni_found:
        from llamacy.kernels import matmul512

        matmul512.prefetch_set(*PREFETCH_MODES[mode])
        PREFETCH = mode


def _default_prefetch():
    """LLAMACY_PREFETCH where it names a mode, else this CPU's: 'stream' on Intel, 'tile' elsewhere."""
    mode = os.environ.get("LLAMACY_PREFETCH", "")
    if mode in PREFETCH_MODES:
        return mode
    from llamacy.kernels import cpu

    return "stream" if cpu.vendor() == "intel" else "tile"


PREFETCH = "tile"  # the kernels' initial state; what they use here is set next
prefetch_set(_default_prefetch())


def amx_set(bint on):
    """Turn the AMX prefill tiles on or off (tests and benchmarks compare the two in one process; the
    results are the same bits); the new state, False where they cannot run."""
    if not _vnni_found:
        return False
    from llamacy.kernels import matmul512

    return matmul512.amx_enable(on)


def pairs_set(bint on):
    """A prompt's products over two 8-row tiles at a time in 512-bit vectors (the VNNI kernels), or one at a
    time (tests and benchmarks compare the two; the same bits either way). LLAMACY_PAIRS=0 starts with it
    off."""
    if _vnni_found:
        from llamacy.kernels import matmul512

        matmul512.pairs_set(on)


if os.environ.get("LLAMACY_PAIRS", "") == "0":
    pairs_set(False)


def vnni_available():
    """True if the AVX-512 VNNI kernels can run here (CPU and build), whether or not matmul uses them."""
    return _vnni_found


def tiles_available():
    """True if matmul reads every tiled layout (kernels/repack.pyx) here: the VNNI kernels are on (this CPU,
    this build, LLAMACY_NO_AVX512 unset)."""
    cdef int layout
    for layout in range(1, N_LAYOUTS):
        if not layout_available(layout):
            return False
    return True


def layout_available(int layout):
    """True if matmul has a kernel for this tiled layout here: every layout where the VNNI kernels are on,
    Q4_0's, Q8_0's, Q4_K's and Q6_K's on any AVX2 build."""
    cdef mm_try_fn* slot = layout_slot(layout)
    return slot != NULL and slot[0] != NULL


def any_tiles_available():
    """True if matmul reads some tiled layout here (layout_available)."""
    return any(layout_available(layout) for layout in range(1, N_LAYOUTS))


def kernel_path():
    """The kernels matmul() runs for quantized weights: "avx512-vnni", "avx2" or "scalar".

    ("avx512-vnni" covers the quantized types with several tokens and the 32-value types in decode; the
    rest of the products run on AVX2 all the same.)
    """
    if _vnni_on:
        return "avx512-vnni"
    return "avx2" if HAVE_SIMD else "scalar"


# =========================================================================================================
# Dispatch


# Decode products hand out their rows as ranges that threads steal from (ranges.h); off: one fixed range a
# thread, as before (benchmarks compare the two in one process; the results are the same bits either way).
cdef bint _steal = True


def steal_set(bint on):
    global _steal
    _steal = on


# Threads split the output rows into chunks of SPLIT_ROWS (a multiple of every kernel's row tile and work
# item, so each row is computed exactly as on one thread), handed out by the thread team (parallel.pxd).
cdef enum:
    SPLIT_ROWS = 16


ctypedef struct MMJob:
    const uint8_t* W
    int wtype
    Py_ssize_t cols
    Py_ssize_t rows
    Py_ssize_t row_bytes
    Py_ssize_t chunk_rows
    const void* xq
    Py_ssize_t n_tok
    float* Y
    Py_ssize_t ldy
    int impl
    lc_range* ranges
    int n_ranges


cdef void _mm_units(void* ctx, uint32_t u0, uint32_t nu) noexcept nogil:
    """Rows of units u0..u0+nu-1 (SPLIT_ROWS each) of a product, on this thread."""
    cdef const MMJob* j = <const MMJob*> ctx
    cdef Py_ssize_t r0 = u0 * SPLIT_ROWS, r1 = min(j.rows, (u0 + nu) * SPLIT_ROWS)
    matmul_impl(j.W + r0 * j.row_bytes, j.wtype, r1 - r0, j.cols, j.xq, j.n_tok, j.Y + r0, j.ldy, 1, j.impl)


cdef void _mm_steal_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    cdef MMJob* j = <MMJob*> ctx
    lc_ranges_work(j.ranges, j.n_ranges, begin, end, _mm_units, ctx)


cdef void _mm_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    cdef MMJob* j = <MMJob*> ctx
    cdef Py_ssize_t c, r0, r1
    for c in range(begin, end):
        r0 = c * j.chunk_rows
        r1 = min(j.rows, r0 + j.chunk_rows)
        matmul_impl(j.W + r0 * j.row_bytes, j.wtype, r1 - r0, j.cols, j.xq, j.n_tok, j.Y + r0, j.ldy, 1,
                    j.impl)


# Every (row, token) pair through the scalar twin.
cdef void mm_scalar(vec_dot_fn fn, const uint8_t* W, Py_ssize_t wrb, Py_ssize_t rows, Py_ssize_t cols,
                    const uint8_t* X, Py_ssize_t xrb, Py_ssize_t n_tok, float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t r, t
    for r in range(rows):
        for t in range(n_tok):
            Y[t * ldy + r] = fn(W + r * wrb, X + t * xrb, cols)


cdef void _mm_split(const uint8_t* W, int wtype, Py_ssize_t rows, Py_ssize_t cols, const void* xq,
                    Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads, int impl,
                    Py_ssize_t row_bytes) noexcept nogil:
    """matmul_impl's rows over the thread team."""
    cdef MMJob job
    cdef lc_range ranges[LC_RANGES_MAX]
    job.W = W
    job.wtype = wtype
    job.cols = cols
    job.rows = rows
    job.row_bytes = row_bytes
    job.xq = xq
    job.n_tok = n_tok
    job.Y = Y
    job.ldy = ldy
    job.impl = impl
    # Decode and small batches stream the weights from memory: one contiguous range per thread keeps each
    # thread's reads one sequential stream for the prefetchers, and a thread done with its range takes over
    # the back of what another has left (ranges.h). Prefill is compute-bound: eight chunks per thread, so
    # that a thread the OS runs late costs the others little.
    if n_tok <= 8 and _steal and nthreads <= LC_RANGES_MAX:
        lc_ranges_split(ranges, nthreads, (rows + SPLIT_ROWS - 1) // SPLIT_ROWS)
        job.ranges = ranges
        job.n_ranges = nthreads
        parallel_for(_mm_steal_task, &job, nthreads, 1, nthreads)
        return
    cdef Py_ssize_t per_thread = 1 if n_tok <= 8 else 8
    job.chunk_rows = SPLIT_ROWS * max(1, rows // (SPLIT_ROWS * per_thread * nthreads))
    parallel_for(_mm_task, &job, (rows + job.chunk_rows - 1) // job.chunk_rows, 1, nthreads)


cdef void matmul_impl(const uint8_t* W, int wtype, Py_ssize_t rows, Py_ssize_t cols,
                      const void* xq, Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads,
                      int impl) noexcept nogil:
    cdef const type_traits* tt = type_traits_of(wtype)
    cdef bint auto = impl == IMPL_AUTO or impl == IMPL_ROWS
    cdef bint vnni = impl == IMPL_VNNI or (auto and _vnni_on)
    cdef bint simd = vnni or impl == IMPL_SIMD or (auto and HAVE_SIMD)
    if tt == NULL:
        unknown_type(b"matmul", wtype)
    if rows <= 0 or n_tok <= 0:
        return
    cdef mm_try_fn tiled = NULL
    cdef mm_try_fn* slot
    if impl >= IMPL_TILED:
        slot = layout_slot(impl - IMPL_TILED)
        if slot == NULL or slot[0] == NULL:
            unknown_type(b"matmul of 8-row tiles (no kernel for this layout here)", wtype)
        tiled = slot[0]
    if nthreads > 1 and rows >= 2 * SPLIT_ROWS:
        _mm_split(W, wtype, rows, cols, xq, n_tok, Y, ldy, nthreads, impl,
                  layout_row_bytes(impl - IMPL_TILED, cols) if tiled != NULL else traits_row_bytes(tt, cols))
        return
    if tiled != NULL:
        if not tiled(W, rows, cols, xq, n_tok, Y, ldy):
            # no other kernel reads the tiles, and an unwritten Y would be wrong numbers
            fprintf(stderr, b"llamacy: out of memory for a matrix product's scratch (%zd tokens)\n", n_tok)
            fflush(stderr)
            abort()
        return
    # the AVX-512 VNNI kernels, where they apply (they return 0 for what they leave to AVX2)
    if vnni and tt.mm_vnni != NULL and tt.mm_vnni(W, rows, cols, xq, n_tok, Y, ldy):
        return
    if simd:
        (tt.mm_rows if impl == IMPL_ROWS else tt.mm_simd)(W, rows, cols, xq, n_tok, Y, ldy)
    else:
        mm_scalar(tt.vec_dot, W, traits_row_bytes(tt, cols), rows, cols, <const uint8_t*>xq,
                  act_row_bytes(wtype, cols), n_tok, Y, ldy)


cdef void matmul(const uint8_t* W, int wtype, Py_ssize_t rows, Py_ssize_t cols,
                 const void* xq, Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads) noexcept nogil:
    matmul_impl(W, wtype, rows, cols, xq, n_tok, Y, ldy, nthreads, IMPL_AUTO)


cdef void matmul_rows(const uint8_t* W, int wtype, Py_ssize_t rows, Py_ssize_t cols, const void* xq,
                      Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads) noexcept nogil:
    matmul_impl(W, wtype, rows, cols, xq, n_tok, Y, ldy, nthreads, IMPL_ROWS)


cdef void matmul_tiled(const uint8_t* W, int wtype, int layout, Py_ssize_t rows, Py_ssize_t cols, const void* xq,
                       Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads) noexcept nogil:
    matmul_impl(W, wtype, rows, cols, xq, n_tok, Y, ldy, nthreads, IMPL_TILED + layout)


# =========================================================================================================
# Python surface. Every size is checked before a raw pointer is touched.

# "simd" is the AVX2 kernels alone (as before the AVX-512 ones existed); "vnni" the AVX-512 VNNI kernels
# where they apply and AVX2 elsewhere, whatever LLAMACY_NO_AVX512 says; "auto" what matmul() runs.
_IMPLS = {"auto": IMPL_AUTO, "simd": IMPL_SIMD, "scalar": IMPL_SCALAR, "vnni": IMPL_VNNI}


cdef int _impl(impl) except -1:
    try:
        code = _IMPLS[impl]
    except (KeyError, TypeError):
        raise ValueError(f"impl must be one of {sorted(_IMPLS)}, got {impl!r}") from None
    if code == IMPL_VNNI and not _vnni_found:
        raise ValueError(f"impl 'vnni' is not available here: {AVX512_STATUS}")
    return code


cdef _weights(W_rows, int wtype, Py_ssize_t cols):
    cdef Py_ssize_t rb = row_bytes(wtype, cols)
    arr = np.ascontiguousarray(W_rows)
    if arr.dtype != np.uint8:
        arr = arr.view(np.uint8)
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2 or arr.shape[1] != rb:
        raise ValueError(f"weights must be uint8[rows, {rb}] for {cols} values of type {wtype}, "
                         f"got shape {arr.shape}")
    return arr


cdef _activations(x):
    arr = np.ascontiguousarray(x, dtype=np.float32)
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise ValueError(f"x must be float32[n, cols] with n >= 1, got shape {np.shape(x)}")
    return arr


cdef _quantize(int wtype, x, int code):
    cdef const float[:, ::1] xv = x
    if code == IMPL_VNNI:  # the activations are the same for both kernel families
        code = IMPL_AUTO
    cdef Py_ssize_t n = xv.shape[0], cols = xv.shape[1], i
    xq = np.empty((n, act_row_bytes(wtype, cols)), dtype=np.uint8)
    cdef uint8_t[:, ::1] qv = xq
    with nogil:
        for i in range(n):
            quantize_act_row_impl(wtype, &xv[i, 0], &qv[i, 0], cols, code)
    return xq


def operands(W_rows, int wtype, x, impl="auto"):
    """(weights uint8[rows, row_bytes], activations quantized for `impl` uint8[n, act_row_bytes], the impl's
    code for matmul_impl, cols), every size checked: what matmul_py multiplies (and the benchmarks time)."""
    cdef int code = _impl(impl)
    xa = _activations(x)
    Wa = _weights(W_rows, wtype, xa.shape[1])
    return Wa, _quantize(wtype, xa, code), code, xa.shape[1]


def matmul_py(W_rows, int wtype, x, int nthreads=1, impl="auto", out=None):
    """Y[n, rows] = x[n, cols] @ W.T, W given as its raw rows uint8[rows, row_bytes] of type `wtype`.

    x is quantized on the fly (with the same kernel family as `impl`), as the forward pass does.
    `out`, if given, is a C-contiguous float32[n, ldy] with ldy >= rows; Y goes to out[:, :rows] (the
    rest of each row is left as it was) and `out` is returned.
    """
    Wa, xq, code, cols_ = operands(W_rows, wtype, x, impl)
    cdef Py_ssize_t n = xq.shape[0], cols = cols_
    if nthreads < 1:
        raise ValueError(f"nthreads must be >= 1, got {nthreads}")
    nthreads = min(nthreads, ensure_threads(nthreads))
    cdef Py_ssize_t rows = Wa.shape[0]
    if out is None:
        Y = np.zeros((n, rows), dtype=np.float32)
    else:
        Y = out
        if (not isinstance(Y, np.ndarray) or Y.dtype != np.float32 or Y.ndim != 2
                or not Y.flags.c_contiguous or not Y.flags.writeable or Y.shape[0] != n
                or Y.shape[1] < rows):
            raise ValueError(f"out must be a writable C-contiguous float32[{n}, >= {rows}] array")
    if rows == 0:
        return Y
    cdef const uint8_t[:, ::1] wv = Wa
    cdef const uint8_t[:, ::1] qv = xq
    cdef float[:, ::1] yv = Y
    cdef Py_ssize_t ldy = Y.shape[1]
    cdef int c = code
    with nogil:
        matmul_impl(&wv[0, 0], wtype, rows, cols, &qv[0, 0], n, &yv[0, 0], ldy, nthreads, c)
    return Y


def matmul_tiled_py(W_tiles, int layout, Py_ssize_t rows, x, int nthreads=1):
    """Y[n, rows] = x[n, cols] @ W.T for a matrix repacked by repack.repack_tiles into `layout` (flat
    uint8, rows a multiple of 8), through the kernel the model runs for it."""
    cdef int wtype = {LAYOUT_Q4_0_X8: T_Q4_0, LAYOUT_Q4_1_X8: T_Q4_1, LAYOUT_Q4_K_X8: T_Q4_K,
                      LAYOUT_Q6_K_X8: T_Q6_K, LAYOUT_Q8_0_X8: T_Q8_0, LAYOUT_Q5_0_X8: T_Q5_0,
                      LAYOUT_Q5_K_X8: T_Q5_K}.get(layout, -1)
    if wtype < 0:
        raise ValueError(f"unknown tile layout {layout}")
    xa = _activations(x)
    cdef Py_ssize_t cols = xa.shape[1], n = xa.shape[0]
    from llamacy.kernels.repack import tile_layout

    Wa = np.ascontiguousarray(W_tiles).view(np.uint8).reshape(-1)
    if tile_layout(wtype, rows, cols) != layout or Wa.shape[0] != rows * layout_row_bytes(layout, cols):
        raise ValueError(f"W_tiles must be the {rows} x {cols} tiles repack_tiles makes")
    if not layout_available(layout):
        raise ValueError(f"no kernel reads tile layout {layout} here (AVX-512 VNNI: {AVX512_STATUS})")
    if nthreads < 1:
        raise ValueError(f"nthreads must be >= 1, got {nthreads}")
    nthreads = min(nthreads, ensure_threads(nthreads))
    xq = _quantize(wtype, xa, IMPL_AUTO)
    Y = np.zeros((n, rows), dtype=np.float32)
    cdef const uint8_t[::1] wv = Wa
    cdef const uint8_t[:, ::1] qv = xq
    cdef float[:, ::1] yv = Y
    with nogil:
        matmul_tiled(&wv[0], wtype, layout, rows, cols, &qv[0, 0], n, &yv[0, 0], rows, nthreads)
    return Y


def vec_dot_py(int wtype, wrow_bytes, xq_bytes, Py_ssize_t cols, impl="auto"):
    """Dot product of one raw weight row with one already-quantized activation row (quant.quantize_act)."""
    cdef int code = _impl(impl)
    cdef Py_ssize_t rb = row_bytes(wtype, cols)
    w = np.frombuffer(bytes(wrow_bytes), dtype=np.uint8) if isinstance(wrow_bytes, (bytes, bytearray)) \
        else np.ascontiguousarray(wrow_bytes).view(np.uint8).reshape(-1)
    xq = np.frombuffer(bytes(xq_bytes), dtype=np.uint8) if isinstance(xq_bytes, (bytes, bytearray)) \
        else np.ascontiguousarray(xq_bytes).view(np.uint8).reshape(-1)
    if w.shape[0] != rb:
        raise ValueError(f"weight row of {cols} values of type {wtype} is {rb} bytes, got {w.shape[0]}")
    if xq.shape[0] != act_row_bytes(wtype, cols):
        raise ValueError(f"activation row of {cols} values is {act_row_bytes(wtype, cols)} bytes, "
                         f"got {xq.shape[0]}")
    cdef const uint8_t[::1] wv = w
    cdef const uint8_t[::1] qv = xq
    cdef float out = 0.0
    with nogil:
        matmul_impl(&wv[0], wtype, 1, cols, &qv[0], 1, &out, 1, 1, code)
    return float(out)


