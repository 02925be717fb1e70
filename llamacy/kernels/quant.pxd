# Activation quantization and row dequantization: the C-level surface other Cython modules cimport.
from libc.stdint cimport uint8_t

# The activation formats (ACT_*) and their blocks are blocks.pxd's.

# Which activation format a weight type multiplies with; -1 for a type the kernels do not support.
cdef int act_format(int wtype) noexcept nogil
# Bytes of one activation row of `cols` values in the format `wtype` multiplies with.
cdef Py_ssize_t act_row_bytes(int wtype, Py_ssize_t cols) noexcept nogil
# Quantize one row of `cols` floats into the activation format of `wtype` (cols a multiple of the block).
cdef void quantize_act_row(int wtype, const float* x, void* out, Py_ssize_t cols) noexcept nogil
# Dequantize one stored row of `cols` values of type `wtype` into floats (embedding lookup, reference).
cdef void dequantize_row(int wtype, const uint8_t* src, float* dst, Py_ssize_t cols) noexcept nogil

# Which kernel family to run: AUTO = SIMD in a SIMD build, scalar twins in a portable build.
# SIMD in a portable build runs the SIMD kernels on simd.h's plain-C intrinsic twins (for tests).
cdef enum:
    IMPL_AUTO = 0
    IMPL_SIMD = 1
    IMPL_SCALAR = 2

# quantize_act_row with an explicit kernel family. Both families give identical bytes.
cdef void quantize_act_row_impl(int wtype, const float* x, void* out, Py_ssize_t cols,
                                int impl) noexcept nogil
