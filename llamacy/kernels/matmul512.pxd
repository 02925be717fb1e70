# AVX-512 VNNI matrix products (matmul512.pyx): the C-level surface.
#
# matmul.pyx does not cimport the function: a cimport would import this module (compiled for AVX-512) at
# matmul's import on every CPU. It imports the module only where cpu.has_avx512_vnni() holds, and takes the
# function's address from kernel_capsule() (a PyCapsule named MM512_CAPSULE) as an mm512_fn.
from libc.stdint cimport uint8_t

# Same arguments and result as matmul.pxd's matmul: Y[t * ldy + r] = dot(W row r, activation row t).
# Returns 1 if it computed Y, 0 if it has no kernel for this case (weight type, n_tok, row length): the
# caller then runs the AVX2 kernels. Never call it on a CPU without AVX-512 F/BW/VL + VNNI.
ctypedef int (*mm512_fn)(const uint8_t* W, int wtype, Py_ssize_t rows, Py_ssize_t cols, const void* xq,
                         Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads) noexcept nogil

cdef int mm512(const uint8_t* W, int wtype, Py_ssize_t rows, Py_ssize_t cols, const void* xq,
               Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads) noexcept nogil
