# Activation quantization and row dequantization: the C-level surface other Cython modules cimport.
from libc.stdint cimport int8_t, int16_t, uint8_t

# Activation formats. They live only in memory, never in files, so their layout is ours.
# ACT_F32: plain float rows (for F32/F16/BF16 weights).
# ACT_Q8A: for the legacy 32-value types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): per 32 values a float scale d,
#          s = d * sum(qs) (what the offset types Q4_1/Q5_1 need), and 32 int8 values.
# ACT_Q8K: for the K-quants: per 256 values a float scale, 256 int8 values, and 16 sums of 16 values.
cdef enum:
    ACT_F32 = 0
    ACT_Q8A = 1
    ACT_Q8K = 2

ctypedef struct block_q8a:
    float d
    float s
    int8_t qs[32]

ctypedef struct block_q8k:
    float d
    int8_t qs[256]
    int16_t bsums[16]

# Which activation format a weight type multiplies with; -1 for a type the kernels do not support.
cdef int act_format(int wtype) noexcept nogil
# Bytes of one activation row of `cols` values in the format `wtype` multiplies with.
cdef Py_ssize_t act_row_bytes(int wtype, Py_ssize_t cols) noexcept nogil
# Quantize one row of `cols` floats into the activation format of `wtype` (cols a multiple of the block).
cdef void quantize_act_row(int wtype, const float* x, void* out, Py_ssize_t cols) noexcept nogil
# Dequantize one stored row of `cols` values of type `wtype` into floats (embedding lookup, reference).
cdef void dequantize_row(int wtype, const uint8_t* src, float* dst, Py_ssize_t cols) noexcept nogil

# --- Additions (the declarations above are the original contract and stay as they are) ---

# Which kernel family to run: AUTO = SIMD in a SIMD build, scalar twins in a portable build.
# SIMD in a portable build runs the SIMD kernels on simd.h's plain-C intrinsic twins (for tests).
cdef enum:
    IMPL_AUTO = 0
    IMPL_SIMD = 1
    IMPL_SCALAR = 2

# quantize_act_row with an explicit kernel family. Both families give identical bytes.
cdef void quantize_act_row_impl(int wtype, const float* x, void* out, Py_ssize_t cols,
                                int impl) noexcept nogil
# Values per weight block of `wtype` (1 for the float types), 0 if unsupported.
cdef Py_ssize_t weight_block_values(int wtype) noexcept nogil
# Bytes per weight block of `wtype`, 0 if unsupported.
cdef Py_ssize_t weight_block_bytes(int wtype) noexcept nogil
