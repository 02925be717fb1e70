# Quantized matrix products: the C-level surface other Cython modules cimport.
from libc.stdint cimport uint8_t

# Y[t * ldy + r] = dot(W row r, activation row t) for r < rows, t < n_tok.
# W: `rows` stored rows of type `wtype`, each ggml_types.row_bytes(wtype, cols) bytes, contiguous.
# xq: n_tok activation rows, each act_row_bytes(wtype, cols) bytes, contiguous, made by quantize_act_row.
# Parallel over output rows with `nthreads` OpenMP threads (1 = run on the calling thread).
cdef void matmul(const uint8_t* W, int wtype, Py_ssize_t rows, Py_ssize_t cols,
                 const void* xq, Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads) noexcept nogil

# --- Additions (the declaration above is the original contract and stays as it is) ---

# matmul with an explicit kernel family (quant.pxd's IMPL_AUTO / IMPL_SIMD / IMPL_SCALAR).
cdef void matmul_impl(const uint8_t* W, int wtype, Py_ssize_t rows, Py_ssize_t cols,
                      const void* xq, Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads,
                      int impl) noexcept nogil
