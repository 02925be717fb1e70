# Row dequantization kernels (dequant.pyx): (src, dst, n values), the to_float column of traits.pyx.
from llamacy.kernels.blocks cimport fblock, k23block, k45block, lblock

cdef void deq_float(const fblock* src, float* y, Py_ssize_t n) noexcept nogil
cdef void deq_legacy(const lblock* b, float* y, Py_ssize_t nvals) noexcept nogil
cdef void deq_k45(const k45block* b, float* y, Py_ssize_t nvals) noexcept nogil
cdef void deq_k23(const k23block* b, float* y, Py_ssize_t nvals) noexcept nogil
cdef void deq_q6_K(const void* src, float* y, Py_ssize_t nvals) noexcept nogil
