# Quantized matrix products: the C-level surface other Cython modules cimport.
from libc.stdint cimport uint8_t

# Y[t * ldy + r] = dot(W row r, activation row t) for r < rows, t < n_tok.
# W: `rows` stored rows of type `wtype`, each ggml_types.row_bytes(wtype, cols) bytes, contiguous.
# xq: n_tok activation rows, each act_row_bytes(wtype, cols) bytes, contiguous, made by quantize_act_row.
# Parallel over output rows on `nthreads` threads of the team (1 = run on the calling thread).
# A type without kernels aborts with one line on stderr (traits.unknown_type): callers check types first.
cdef void matmul(const uint8_t* W, int wtype, Py_ssize_t rows, Py_ssize_t cols,
                 const void* xq, Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads) noexcept nogil

# matmul with an explicit kernel family (quant.pxd's IMPL_AUTO / IMPL_SIMD / IMPL_SCALAR, or matmul.pyx's
# IMPL_VNNI).
cdef void matmul_impl(const uint8_t* W, int wtype, Py_ssize_t rows, Py_ssize_t cols,
                      const void* xq, Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads,
                      int impl) noexcept nogil

# matmul for matrices that may keep the file's layout for the model's life (a MoE model's stacked experts:
# where the VNNI kernels are on they go into tiles at load or in idle time, model/repack.py's
# experts_repackable, and the tiles give the bits this gives): where the VNNI kernels are off, the traits
# table's mm_rows, the AVX2 per-lane kernels
# of Q4_0 / Q8_0 / Q4_K / Q6_K instead of the row-lane tiles, whose stored-row path gathers 8 rows into tiles per product (a MoE
# decode on AVX2 took 2.4x the time with it: BENCHMARKS.md). Every product of such a matrix goes through
# here, so each keeps one float order on every path.
cdef void matmul_rows(const uint8_t* W, int wtype, Py_ssize_t rows, Py_ssize_t cols,
                      const void* xq, Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads) noexcept nogil

# matmul of weights repacked at load into 8-row tiles of `layout` (traits.pxd's LAYOUT_*; repack.pyx; rows
# a multiple of 8): the same numbers as the stored rows give. Only where layout_available(layout) (every
# layout with AVX-512 VNNI, Q4_0 / Q8_0 / Q4_K / Q6_K on AVX2); elsewhere it aborts.
cdef void matmul_tiled(const uint8_t* W, int wtype, int layout, Py_ssize_t rows, Py_ssize_t cols, const void* xq,
                       Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads) noexcept nogil
