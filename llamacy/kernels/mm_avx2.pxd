# The AVX2 matrix products (mm_avx2.pyx): the mm_simd column of traits.pyx, one specialisation per type.
from llamacy.kernels.blocks cimport wblock

# Y[t * ldy + r] = dot(W row r, activation row t) for r < rows, t < n_tok (X: n_tok activation rows).
cdef void mm_avx2(const wblock* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                  float* Y, Py_ssize_t ldy) noexcept nogil

# Q4_0, Q4_K, Q6_K and Q8_0 in the row-lane float order (mm_avx2_x8.pxi, mm_avx2_kx8.pxi): the stored rows
# (traits.pyx's mm_simd for them) and the 8-row tiles of LAYOUT_Q4_0_X8 / _Q4_K_X8 / _Q6_K_X8 / _Q8_0_X8
# (their layout slots where the VNNI kernels are off), the same bits either way.
cdef void q4_0_rowlane_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                            float* Y, Py_ssize_t ldy) noexcept nogil
cdef int q4_0_x8_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                      float* Y, Py_ssize_t ldy) noexcept nogil
cdef void q4_k_rowlane_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                            float* Y, Py_ssize_t ldy) noexcept nogil
cdef int q4_k_x8_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                      float* Y, Py_ssize_t ldy) noexcept nogil
cdef void q6_k_rowlane_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                            float* Y, Py_ssize_t ldy) noexcept nogil
cdef int q6_k_x8_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                      float* Y, Py_ssize_t ldy) noexcept nogil
cdef void q8_0_rowlane_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                            float* Y, Py_ssize_t ldy) noexcept nogil
cdef int q8_0_x8_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                      float* Y, Py_ssize_t ldy) noexcept nogil
