# The AVX2 matrix products (mm_avx2.pyx): the mm_simd column of traits.pyx, one specialisation per type.
from llamacy.kernels.blocks cimport wblock

# Y[t * ldy + r] = dot(W row r, activation row t) for r < rows, t < n_tok (X: n_tok activation rows).
cdef void mm_avx2(const wblock* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                  float* Y, Py_ssize_t ldy) noexcept nogil
