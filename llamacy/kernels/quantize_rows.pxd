# The weight quantizers (quantize_rows.pyx): (x, out, n values, lanes), traits.pyx's from_float.
from llamacy.kernels.blocks cimport block_q4_0, block_q4_1, block_q5_0, block_q5_1

ctypedef fused l45block:
    block_q4_0
    block_q4_1
    block_q5_0
    block_q5_1

cdef void q_legacy(const float* x, l45block* y, Py_ssize_t nvals, bint lanes) noexcept nogil
cdef void q_f32(const float* x, void* out, Py_ssize_t n, bint lanes) noexcept nogil
cdef void q_f16(const float* x, void* out, Py_ssize_t n, bint lanes) noexcept nogil
cdef void q_bf16(const float* x, void* out, Py_ssize_t n, bint lanes) noexcept nogil
cdef void q_q8_0(const float* x, void* out, Py_ssize_t n, bint lanes) noexcept nogil
cdef void q_q2_K(const float* x, void* out, Py_ssize_t n, bint lanes) noexcept nogil
cdef void q_q3_K(const float* x, void* out, Py_ssize_t n, bint lanes) noexcept nogil
cdef void q_q4_K(const float* x, void* out, Py_ssize_t n, bint lanes) noexcept nogil
cdef void q_q5_K(const float* x, void* out, Py_ssize_t n, bint lanes) noexcept nogil
cdef void q_q6_K(const float* x, void* out, Py_ssize_t n, bint lanes) noexcept nogil
