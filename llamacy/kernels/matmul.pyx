# Quantized matrix products: Y[t, r] = dot(W row r, activation row t).
#
# Weights stay in their GGUF block format (read in place from the mmap); activations arrive quantized by
# quant.quantize_act_row (ACT_Q8A for the 32-value types, ACT_Q8K for the K-quants, ACT_F32 for float
# weights). The inner products are integer SIMD as in the reference engines: quants unpacked to unsigned
# bytes, _mm256_maddubs_epi16 (u8 x s8 -> pairs of int16) then _mm256_madd_epi16 (-> int32), converted to
# float once per block and scaled with one FMA.
#
# Work is cut into tiles of R weight rows x T tokens (tile_lg, tile_k, tile_f). A tile unpacks each weight
# block once and reuses it for its T tokens, and loads each activation block once for its R rows:
#   decode (n_tok == 1): DR rows x 1 token (a matvec), prefetching the weights a few tiles ahead;
#   prefill (n_tok > 1): PR rows x PT tokens, looping over token chunks of TCH inside a group of GR rows so
#   that the group's weight rows stay in L1 while a chunk of activations stays in L2.
# Output rows are split over the thread team (parallel.pxd) in chunks of SPLIT_ROWS; nthreads == 1 uses no
# other thread. Nothing is allocated per call: the tiles live on the stack.
#
# Every SIMD kernel has a scalar twin (vd_*_scalar: plain loops over blocks, one row x one token) that is
# what a portable build runs and what the tests hold the SIMD kernels against.
#
# On a CPU with AVX-512 F/BW/VL + VNNI, matmul first offers the product to matmul512's kernels (the same
# numbers, bit for bit, faster with several tokens); they take the quantized types and leave the rest here.
# They are chosen once, at import (see "AVX-512 VNNI dispatch" below); LLAMACY_NO_AVX512=1 keeps AVX2.
from cpython.pycapsule cimport PyCapsule_GetPointer
from libc.stdint cimport int64_t, int8_t, int16_t, int32_t, uint8_t, uint16_t, uint32_t
from libc.string cimport memcpy

import os
import numpy as np
import time

from llamacy.kernels.blocks cimport *
from llamacy.kernels.parallel cimport parallel_for

from llamacy.kernels.parallel import ensure_threads
from llamacy.kernels.quant cimport (
    ACT_F32, ACT_Q8A, ACT_Q8K, IMPL_AUTO, IMPL_SCALAR, IMPL_SIMD, act_format, act_row_bytes, block_q8a,
    block_q8k, quantize_act_row_impl, weight_block_bytes, weight_block_values,
)
from llamacy.kernels.simd cimport *
# The function pointer type only: cimporting a ctypedef does not import matmul512 (see its .pxd).
from llamacy.kernels.matmul512 cimport mm512_fn

# Tile shapes (see the header comment). MAXR/MAXT bound the register arrays.
cdef enum:
    MAXR = 4
    MAXT = 4
    DR = 4      # decode: rows per tile
    PR = 2      # prefill: rows per tile
    PT = 4      # prefill: tokens per tile
    GR = 16     # prefill: rows per parallel work item
    TCH = 64    # prefill: tokens per chunk
    PF_TILES = 2  # decode: prefetch distance, in tiles



ctypedef fused fblock:
    float
    block_f16
    block_bf16

# Tile shapes as types, so that Cython emits one C function per (block type, shape) with R and T literal
# constants: the compiler then fully unrolls the r/t loops and keeps the accumulators in registers. (Left
# to itself it clones only some call sites and runs the others with the arrays in memory.)
ctypedef struct shape_dec:   # DR rows x 1 token
    char unused
ctypedef struct shape_pp:    # PR rows x PT tokens
    char unused
ctypedef struct shape_p1:    # PR rows x 1 token
    char unused
ctypedef struct shape_1p:    # 1 row x PT tokens
    char unused
ctypedef struct shape_11:    # 1 row x 1 token
    char unused

ctypedef fused tshape:
    shape_dec
    shape_pp
    shape_p1
    shape_1p
    shape_11


cdef inline int shape_rows(const tshape* s) noexcept nogil:
    if tshape is shape_dec:
        return DR
    elif tshape is shape_pp or tshape is shape_p1:
        return PR
    else:
        return 1


cdef inline int shape_toks(const tshape* s) noexcept nogil:
    if tshape is shape_pp or tshape is shape_1p:
        return PT
    else:
        return 1


# =========================================================================================================
# Scalar twins: one weight row x one activation row, plain loops over blocks.


cdef float vd_q4_0_scalar(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const block_q4_0* w = <const block_q4_0*>vw
    cdef const block_q8a* x = <const block_q8a*>vx
    cdef float sumf = 0.0
    cdef int32_t isum
    cdef Py_ssize_t i, j
    for i in range(cols // 32):
        isum = 0
        for j in range(16):
            isum += ((w[i].qs[j] & 0xF) - 8) * x[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * x[i].qs[j + 16]
        sumf += (fp16(w[i].d) * x[i].d) * <float>isum
    return sumf


cdef float vd_q4_1_scalar(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const block_q4_1* w = <const block_q4_1*>vw
    cdef const block_q8a* x = <const block_q8a*>vx
    cdef float sumf = 0.0
    cdef int32_t isum
    cdef Py_ssize_t i, j
    for i in range(cols // 32):
        isum = 0
        for j in range(16):
            isum += (w[i].qs[j] & 0xF) * x[i].qs[j] + (w[i].qs[j] >> 4) * x[i].qs[j + 16]
        # x = d*q + m: the m part needs only the activation block's sum, kept in s = d_x * sum(qs)
        sumf += (fp16(w[i].d) * x[i].d) * <float>isum + fp16(w[i].m) * x[i].s
    return sumf


cdef float vd_q5_0_scalar(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const block_q5_0* w = <const block_q5_0*>vw
    cdef const block_q8a* x = <const block_q8a*>vx
    cdef float sumf = 0.0
    cdef int32_t isum, q0, q1
    cdef uint32_t qh
    cdef Py_ssize_t i, j
    for i in range(cols // 32):
        qh = load_u32(w[i].qh)
        isum = 0
        for j in range(16):
            q0 = <int32_t>((w[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16
            q1 = <int32_t>((w[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16
            isum += q0 * x[i].qs[j] + q1 * x[i].qs[j + 16]
        sumf += (fp16(w[i].d) * x[i].d) * <float>isum
    return sumf


cdef float vd_q5_1_scalar(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const block_q5_1* w = <const block_q5_1*>vw
    cdef const block_q8a* x = <const block_q8a*>vx
    cdef float sumf = 0.0
    cdef int32_t isum, q0, q1
    cdef uint32_t qh
    cdef Py_ssize_t i, j
    for i in range(cols // 32):
        qh = load_u32(w[i].qh)
        isum = 0
        for j in range(16):
            q0 = <int32_t>((w[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4))
            q1 = <int32_t>((w[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4))
            isum += q0 * x[i].qs[j] + q1 * x[i].qs[j + 16]
        sumf += (fp16(w[i].d) * x[i].d) * <float>isum + fp16(w[i].m) * x[i].s
    return sumf


cdef float vd_q8_0_scalar(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const block_q8_0* w = <const block_q8_0*>vw
    cdef const block_q8a* x = <const block_q8a*>vx
    cdef float sumf = 0.0
    cdef int32_t isum
    cdef Py_ssize_t i, j
    for i in range(cols // 32):
        isum = 0
        for j in range(32):
            isum += w[i].qs[j] * x[i].qs[j]
        sumf += (fp16(w[i].d) * x[i].d) * <float>isum
    return sumf


cdef float vd_f32_scalar(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const float* w = <const float*>vw
    cdef const float* x = <const float*>vx
    cdef float s = 0.0
    cdef Py_ssize_t j
    for j in range(cols):
        s += w[j] * x[j]
    return s


cdef float vd_f16_scalar(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const uint16_t* w = <const uint16_t*>vw
    cdef const float* x = <const float*>vx
    cdef float s = 0.0
    cdef Py_ssize_t j
    for j in range(cols):
        s += fp16(w[j]) * x[j]
    return s


cdef inline float bf16_to_f32(uint16_t h) noexcept nogil:
    cdef uint32_t bits = (<uint32_t>h) << 16
    cdef float f
    memcpy(&f, &bits, 4)
    return f


cdef float vd_bf16_scalar(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const uint16_t* w = <const uint16_t*>vw
    cdef const float* x = <const float*>vx
    cdef float s = 0.0
    cdef Py_ssize_t j
    for j in range(cols):
        s += bf16_to_f32(w[j]) * x[j]
    return s


# --- K-quants against ACT_Q8K: integer sums per super-block, two float multiplies per super-block.


cdef inline void scale_min_k4(int j, const uint8_t* q, int32_t* sc, int32_t* m) noexcept nogil:
    # Q4_K/Q5_K: 8 6-bit scales and 8 6-bit mins packed in 12 bytes
    if j < 4:
        sc[0] = q[j] & 63
        m[0] = q[j + 4] & 63
    else:
        sc[0] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)
        m[0] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


cdef inline int32_t q3k_scale(const uint8_t* packed, int i) noexcept nogil:
    # Q3_K: 16 6-bit scales, low 4 bits in bytes 0..7 (nibble i // 8), high 2 bits in bytes 8..11; offset 32
    return (((packed[i % 8] >> (4 * (i // 8))) & 0xF) | (((packed[8 + i % 4] >> (2 * (i // 4))) & 3) << 4)) - 32


cdef float vd_q2_K_scalar(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const block_q2_K* w = <const block_q2_K*>vw
    cdef const block_q8k* x = <const block_q8k*>vx
    cdef float sumf = 0.0
    cdef int32_t isum, summ, dot
    cdef Py_ssize_t i, n, k, h, l, g
    cdef const uint8_t* q
    for i in range(cols // QK_K):
        isum = 0
        summ = 0
        for n in range(2):  # 128 values from 32 bytes: 2-bit fields at shifts 0, 2, 4, 6
            q = w[i].qs + 32 * n
            for k in range(4):
                for h in range(2):  # two groups of 16 per field
                    g = 8 * n + 2 * k + h
                    dot = 0
                    for l in range(16 * h, 16 * h + 16):
                        dot += ((q[l] >> (2 * k)) & 3) * x[i].qs[128 * n + 32 * k + l]
                    isum += (w[i].scales[g] & 0xF) * dot
                    summ += (w[i].scales[g] >> 4) * x[i].bsums[g]
        sumf += x[i].d * (fp16(w[i].d) * <float>isum - fp16(w[i].dmin) * <float>summ)
    return sumf


cdef float vd_q3_K_scalar(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const block_q3_K* w = <const block_q3_K*>vw
    cdef const block_q8k* x = <const block_q8k*>vx
    cdef float sumf = 0.0
    cdef int32_t isum, dot
    cdef Py_ssize_t i, n, k, h, l, g
    cdef const uint8_t* q
    cdef uint8_t m
    for i in range(cols // QK_K):
        isum = 0
        for n in range(2):
            q = w[i].qs + 32 * n
            for k in range(4):
                m = 1 << (4 * n + k)
                for h in range(2):
                    g = 8 * n + 2 * k + h
                    dot = 0
                    for l in range(16 * h, 16 * h + 16):
                        # 2 low bits, minus 4 where the high bit (hmask) is clear
                        dot += (((q[l] >> (2 * k)) & 3) - (0 if w[i].hmask[l] & m else 4)) \
                            * x[i].qs[128 * n + 32 * k + l]
                    isum += q3k_scale(w[i].scales, g) * dot
        sumf += x[i].d * (fp16(w[i].d) * <float>isum)
    return sumf


cdef float vd_q4_K_scalar(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const block_q4_K* w = <const block_q4_K*>vw
    cdef const block_q8k* x = <const block_q8k*>vx
    cdef float sumf = 0.0
    cdef int32_t isum, summ, dlo, dhi, sc0, m0, sc1, m1
    cdef Py_ssize_t i, j, l
    for i in range(cols // QK_K):
        isum = 0
        summ = 0
        for j in range(4):  # 32 bytes = 64 values: low nibbles sub-block 2j, high nibbles 2j+1
            scale_min_k4(2 * j, w[i].scales, &sc0, &m0)
            scale_min_k4(2 * j + 1, w[i].scales, &sc1, &m1)
            dlo = 0
            dhi = 0
            for l in range(32):
                dlo += (w[i].qs[32 * j + l] & 0xF) * x[i].qs[64 * j + l]
                dhi += (w[i].qs[32 * j + l] >> 4) * x[i].qs[64 * j + 32 + l]
            isum += sc0 * dlo + sc1 * dhi
            summ += m0 * (x[i].bsums[4 * j] + x[i].bsums[4 * j + 1]) \
                + m1 * (x[i].bsums[4 * j + 2] + x[i].bsums[4 * j + 3])
        sumf += x[i].d * (fp16(w[i].d) * <float>isum - fp16(w[i].dmin) * <float>summ)
    return sumf


cdef float vd_q5_K_scalar(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const block_q5_K* w = <const block_q5_K*>vw
    cdef const block_q8k* x = <const block_q8k*>vx
    cdef float sumf = 0.0
    cdef int32_t isum, summ, dlo, dhi, sc0, m0, sc1, m1
    cdef Py_ssize_t i, j, l
    for i in range(cols // QK_K):
        isum = 0
        summ = 0
        for j in range(4):
            scale_min_k4(2 * j, w[i].scales, &sc0, &m0)
            scale_min_k4(2 * j + 1, w[i].scales, &sc1, &m1)
            dlo = 0
            dhi = 0
            for l in range(32):  # the 5th bit of value l of sub-block s is bit s of qh[l]
                dlo += ((w[i].qs[32 * j + l] & 0xF) | (((w[i].qh[l] >> (2 * j)) & 1) << 4)) \
                    * x[i].qs[64 * j + l]
                dhi += ((w[i].qs[32 * j + l] >> 4) | (((w[i].qh[l] >> (2 * j + 1)) & 1) << 4)) \
                    * x[i].qs[64 * j + 32 + l]
            isum += sc0 * dlo + sc1 * dhi
            summ += m0 * (x[i].bsums[4 * j] + x[i].bsums[4 * j + 1]) \
                + m1 * (x[i].bsums[4 * j + 2] + x[i].bsums[4 * j + 3])
        sumf += x[i].d * (fp16(w[i].d) * <float>isum - fp16(w[i].dmin) * <float>summ)
    return sumf


cdef float vd_q6_K_scalar(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const block_q6_K* w = <const block_q6_K*>vw
    cdef const block_q8k* x = <const block_q8k*>vx
    cdef float sumf = 0.0
    cdef int32_t isum, q1, q2, q3, q4
    cdef Py_ssize_t i, n, l, g
    cdef const uint8_t* ql
    cdef const uint8_t* qh
    cdef const int8_t* sc
    cdef const int8_t* y
    for i in range(cols // QK_K):
        isum = 0
        for n in range(2):  # halves of 128 values
            ql = w[i].ql + 64 * n
            qh = w[i].qh + 32 * n
            sc = w[i].scales + 8 * n
            y = x[i].qs + 128 * n
            for l in range(32):
                g = l // 16
                q1 = <int32_t>((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32
                q2 = <int32_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32
                q3 = <int32_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32
                q4 = <int32_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32
                isum += sc[g] * q1 * y[l] + sc[g + 2] * q2 * y[l + 32] \
                    + sc[g + 4] * q3 * y[l + 64] + sc[g + 6] * q4 * y[l + 96]
        sumf += x[i].d * (fp16(w[i].d) * <float>isum)
    return sumf


ctypedef float (*vd_fn)(const void* w, const void* x, Py_ssize_t cols) noexcept nogil


cdef vd_fn scalar_kernel(int wtype) noexcept nogil:
    if wtype == T_Q4_0:
        return vd_q4_0_scalar
    if wtype == T_Q4_1:
        return vd_q4_1_scalar
    if wtype == T_Q5_0:
        return vd_q5_0_scalar
    if wtype == T_Q5_1:
        return vd_q5_1_scalar
    if wtype == T_Q8_0:
        return vd_q8_0_scalar
    if wtype == T_Q2_K:
        return vd_q2_K_scalar
    if wtype == T_Q3_K:
        return vd_q3_K_scalar
    if wtype == T_Q4_K:
        return vd_q4_K_scalar
    if wtype == T_Q5_K:
        return vd_q5_K_scalar
    if wtype == T_Q6_K:
        return vd_q6_K_scalar
    if wtype == T_F32:
        return vd_f32_scalar
    if wtype == T_F16:
        return vd_f16_scalar
    if wtype == T_BF16:
        return vd_bf16_scalar
    return NULL


# Scalar matmul: every (row, token) pair through the scalar twin.
cdef void mm_scalar(vd_fn fn, const uint8_t* W, Py_ssize_t wrb, Py_ssize_t rows, Py_ssize_t cols,
                    const uint8_t* X, Py_ssize_t xrb, Py_ssize_t n_tok, float* Y, Py_ssize_t ldy,
                    int nthreads) noexcept nogil:
    cdef Py_ssize_t r, t
    for r in range(rows):
        for t in range(n_tok):
            Y[t * ldy + r] = fn(W + r * wrb, X + t * xrb, cols)


# =========================================================================================================
# SIMD kernels for the 32-value types against ACT_Q8A.


# One weight block's quants as 32 bytes: unsigned 0..15 / 0..31 for the 4/5-bit types; for Q8_0 |q| (its
# signs go to sx: the sign trick, since maddubs wants one unsigned operand).
cdef inline __m256i load_qx(const lblock* wb, __m256i* sx) noexcept nogil:
    if lblock is block_q8_0:
        sx[0] = _mm256_loadu_si256(<const __m256i*>wb.qs)
        return _mm256_sign_epi8(sx[0], sx[0])
    elif lblock is block_q4_0 or lblock is block_q4_1:
        return unpack_nibbles(wb.qs)
    else:
        return _mm256_or_si256(unpack_nibbles(wb.qs),
                               _mm256_and_si256(unpack_bits(wb.qh), _mm256_set1_epi8(0x10)))


# maddubs of a row's quants with a token's quants: 16 int16 sums of adjacent products. The offsets of Q4_0
# (-8) and Q5_0 (-16) are taken off in integers with off = maddubs(8 or 16, qy), computed once per token
# block: exact, and no float offset term.
cdef inline __m256i prod16(const lblock* wb, __m256i qx, __m256i sx, __m256i qy, __m256i off) noexcept nogil:
    if lblock is block_q8_0:
        return _mm256_maddubs_epi16(qx, _mm256_sign_epi8(qy, sx))
    elif lblock is block_q4_0 or lblock is block_q5_0:
        return _mm256_sub_epi16(_mm256_maddubs_epi16(qx, qy), off)
    else:
        return _mm256_maddubs_epi16(qx, qy)


cdef inline __m256i token_offset(const lblock* wb, __m256i qy) noexcept nogil:
    if lblock is block_q4_0:
        return _mm256_maddubs_epi16(_mm256_set1_epi8(8), qy)
    elif lblock is block_q5_0:
        return _mm256_maddubs_epi16(_mm256_set1_epi8(16), qy)
    else:
        return qy  # unused


# One tile: R rows starting at w (rows nb blocks apart) x T tokens starting at y (nb blocks apart);
# out[t * ldo + r] = dot. R and T come from the shape type: constants in each generated C function.
#
# Scales: with one token (decode) the block's fp16 pair (d, m) is loaded as 32 bits, converted with one
# F16C op and multiplied by the activation's float pair (d_y, s) in one SSE mul, giving [d*d_y, m*s]:
# lane 0 scales the integer dot (broadcast + FMA), lane 1 is Q4_1/Q5_1's min term m * d_y * sum(qy),
# summed in a vector (for the other types the second half-word is unused). With several tokens, the row
# scale is broadcast once per block and multiplied per token, and the min term is a scalar FMA.
cdef void tile_lg(const lblock* w, const tshape* shape, const block_q8a* y, Py_ssize_t nb,
                  float* out, Py_ssize_t ldo) noexcept nogil:
    cdef int R = shape_rows(shape)
    cdef int T = shape_toks(shape)
    cdef __m256 acc[MAXR][MAXT]
    cdef float moff[MAXR][MAXT]
    cdef __m128 ms[MAXR]
    cdef __m256i qx[MAXR]
    cdef __m256i sx[MAXR]
    cdef __m256 dx[MAXR]
    cdef float mx[MAXR]
    cdef __m256i qy, p, off
    cdef __m256 dy
    cdef __m128 u, v
    cdef __m256i ones = _mm256_set1_epi16(1)
    cdef const lblock* wb
    cdef const block_q8a* yb
    cdef int r, t
    cdef Py_ssize_t b
    for r in range(R):
        if lblock is block_q4_1 or lblock is block_q5_1:
            ms[r] = _mm_setzero_ps()
        for t in range(T):
            acc[r][t] = _mm256_setzero_ps()
            moff[r][t] = 0.0
    cdef const char* pf = <const char*>(w + PF_TILES * R * nb)
    cdef Py_ssize_t pfstep = R * sizeof(lblock)
    cdef Py_ssize_t k
    if T == 1:
        for b in range(nb):
            # Decode streams the weights from memory once: prefetch the tile PF_TILES ahead at the pace
            # this one is read (R blocks' worth per step), so the loads below find it in cache.
            for k in range(0, pfstep, 64):
                lc_prefetch(pf + b * pfstep + k)
            yb = y + b
            qy = _mm256_loadu_si256(<const __m256i*>yb.qs)
            u = _mm_castsi128_ps(_mm_loadl_epi64(<const __m128i*>yb))  # [d_y, s, 0, 0]
            off = token_offset(w, qy)
            for r in range(R):
                wb = w + r * nb + b
                qx[r] = load_qx(wb, &sx[r])
                p = prod16(wb, qx[r], sx[r], qy, off)
                v = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(<int>load_u32(<const uint8_t*>wb))), u)
                acc[r][0] = _mm256_fmadd_ps(_mm256_broadcastss_ps(v),
                                            _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc[r][0])
                if lblock is block_q4_1 or lblock is block_q5_1:
                    ms[r] = _mm_add_ps(ms[r], v)
        for r in range(R):
            if lblock is block_q4_1 or lblock is block_q5_1:
                out[r] = hsum8(acc[r][0]) + _mm_cvtss_f32(_mm_movehdup_ps(ms[r]))
            else:
                out[r] = hsum8(acc[r][0])
        return
    for b in range(nb):
        for r in range(R):
            wb = w + r * nb + b
            qx[r] = load_qx(wb, &sx[r])
            dx[r] = _mm256_set1_ps(fp16(wb.d))
            if lblock is block_q4_1 or lblock is block_q5_1:
                mx[r] = fp16(wb.m)
        for t in range(T):
            yb = y + t * nb + b
            qy = _mm256_loadu_si256(<const __m256i*>yb.qs)
            dy = _mm256_set1_ps(yb.d)
            off = token_offset(w, qy)
            for r in range(R):
                p = prod16(w, qx[r], sx[r], qy, off)
                acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(dx[r], dy),
                                            _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc[r][t])
                if lblock is block_q4_1 or lblock is block_q5_1:
                    moff[r][t] += lc_no_contract(mx[r] * yb.s)  # as the VNNI path: no FMA
    for r in range(R):
        for t in range(T):
            out[t * ldo + r] = hsum8(acc[r][t]) + moff[r][t]


# =========================================================================================================
# SIMD kernels for the K-quants against ACT_Q8K.
#
# Each weight super-block (256 values) is unpacked once into a canonical form, kunpacked, and that is
# dotted with the tile's tokens:
#   value_j = d * sc_g * u_j - doff * off_g       (g = j // 16, u_j unsigned bytes, sc_g and off_g ints)
# so that  dot = d_y * (d * sum_g sc_g * sum_{j in g} u_j q_j  -  doff * sum_g off_g * bsum_g),
# both sums exact in int32 (maddubs u x q, madd with the per-group scales; madd off x bsums).
#   Q2_K: u = 2-bit q, sc = 4-bit scale, off = 4-bit min, doff = dmin
#   Q3_K: u = 3-bit q + 4, sc = 6-bit scale - 32, off = 4 * sc, doff = d
#   Q4_K: u = 4-bit q, sc/off = 6-bit scale/min of the 32-value sub-block, doff = dmin
#   Q5_K: u = 5-bit q, as Q4_K
#   Q6_K: u = 6-bit q + 32, sc = int8 scale, off = 32 * sc, doff = d
# Where doff == d (Q3_K, Q6_K) the offset is taken off in integers.

ctypedef struct kunpacked:
    uint8_t u[256]
    int16_t scx[128]   # per 32-value step j: sc of group 2j in int16 lanes 0..7, of group 2j+1 in 8..15
    int16_t off[16]
    float d
    float doff


# Move bit `frm` of every byte to bit `to` (16-bit shifts: the bits that cross bytes are masked off later).
cdef inline __m256i move_bit(__m256i v, int frm, int to) noexcept nogil:
    if frm > to:
        return _mm256_srli_epi16(v, frm - to)
    elif frm < to:
        return _mm256_slli_epi16(v, to - frm)
    return v


# The 16 group scales S (int16) -> scx: step j's vector is S[2j] x 8 then S[2j+1] x 8 (the dword holding
# both broadcast, then an in-lane byte shuffle keeps the low word in the low lane, the high in the high).
cdef inline void expand_scales(__m256i S, kunpacked* k) noexcept nogil:
    cdef __m256i mask = _mm256_set_epi64x(0x0302030203020302, 0x0302030203020302,
                                          0x0100010001000100, 0x0100010001000100)
    cdef int j
    for j in range(8):
        _mm256_storeu_si256(<__m256i*>&k.scx[16 * j],
                            _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(S, _mm256_set1_epi32(j)), mask))


# Q4_K/Q5_K: the 12 packed bytes -> 8 scales (bytes 0..7) and 8 mins (bytes 8..15), with 32-bit word ops.
cdef inline __m128i k4_scales_mins(const uint8_t* packed) noexcept nogil:
    cdef uint32_t a0, a1, a2, s2, s3
    memcpy(&a0, packed, 4)
    memcpy(&a1, packed + 4, 4)
    memcpy(&a2, packed + 8, 4)
    # scales 0..3: low 6 bits of bytes 0..3; scales 4..7: low nibbles of bytes 8..11 + top bits of 0..3
    # mins 0..3: low 6 bits of bytes 4..7;   mins 4..7: high nibbles of bytes 8..11 + top bits of 4..7
    s2 = a1 & 0x3f3f3f3f
    s3 = ((a2 >> 4) & 0x0f0f0f0f) | (((a1 >> 6) & 0x03030303) << 4)
    return _mm_set_epi32(<int>s3, <int>s2, <int>((a2 & 0x0f0f0f0f) | (((a0 >> 6) & 0x03030303) << 4)),
                         <int>(a0 & 0x3f3f3f3f))


# Q3_K: the 12 packed bytes -> 16 scales + 32 (unsigned 0..63), with 32-bit word ops.
cdef inline __m128i k3_scales(const uint8_t* packed) noexcept nogil:
    cdef uint32_t a0, a1, a2
    memcpy(&a0, packed, 4)
    memcpy(&a1, packed + 4, 4)
    memcpy(&a2, packed + 8, 4)
    return _mm_set_epi32(
        <int>(((a1 >> 4) & 0x0f0f0f0f) | (((a2 >> 6) & 0x03030303) << 4)),
        <int>(((a0 >> 4) & 0x0f0f0f0f) | (((a2 >> 4) & 0x03030303) << 4)),
        <int>((a1 & 0x0f0f0f0f) | (((a2 >> 2) & 0x03030303) << 4)),
        <int>((a0 & 0x0f0f0f0f) | ((a2 & 0x03030303) << 4)))


cdef inline void unpack_k(const kblock* b, kunpacked* k) noexcept nogil:
    cdef __m256i m4 = _mm256_set1_epi8(0x0F)
    cdef __m256i v, hb, a, c, S, O
    cdef __m128i sm
    cdef int j, n
    if kblock is block_q2_K:
        for n in range(2):
            v = _mm256_loadu_si256(<const __m256i*>(b.qs + 32 * n))
            for j in range(4):
                _mm256_storeu_si256(<__m256i*>(k.u + 128 * n + 32 * j),
                                    _mm256_and_si256(move_bit(v, 2 * j, 0), _mm256_set1_epi8(3)))
        v = _mm256_cvtepu8_epi16(_mm_loadu_si128(<const __m128i*>b.scales))
        S = _mm256_and_si256(v, _mm256_set1_epi16(0xF))
        O = _mm256_srli_epi16(v, 4)
        k.d = fp16(b.d)
        k.doff = fp16(b.dmin)
    elif kblock is block_q3_K:
        hb = _mm256_loadu_si256(<const __m256i*>b.hmask)
        for n in range(2):
            v = _mm256_loadu_si256(<const __m256i*>(b.qs + 32 * n))
            for j in range(4):
                _mm256_storeu_si256(<__m256i*>(k.u + 128 * n + 32 * j), _mm256_or_si256(
                    _mm256_and_si256(move_bit(v, 2 * j, 0), _mm256_set1_epi8(3)),
                    _mm256_and_si256(move_bit(hb, 4 * n + j, 2), _mm256_set1_epi8(4))))
        S = _mm256_sub_epi16(_mm256_cvtepu8_epi16(k3_scales(b.scales)), _mm256_set1_epi16(32))
        O = _mm256_slli_epi16(S, 2)
        k.d = fp16(b.d)
        k.doff = k.d
    elif kblock is block_q4_K or kblock is block_q5_K:
        if kblock is block_q5_K:
            hb = _mm256_loadu_si256(<const __m256i*>b.qh)
        for j in range(4):
            v = _mm256_loadu_si256(<const __m256i*>(b.qs + 32 * j))
            a = _mm256_and_si256(v, m4)
            c = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)
            if kblock is block_q5_K:
                a = _mm256_or_si256(a, _mm256_and_si256(move_bit(hb, 2 * j, 4), _mm256_set1_epi8(0x10)))
                c = _mm256_or_si256(c, _mm256_and_si256(move_bit(hb, 2 * j + 1, 4), _mm256_set1_epi8(0x10)))
            _mm256_storeu_si256(<__m256i*>(k.u + 64 * j), a)
            _mm256_storeu_si256(<__m256i*>(k.u + 64 * j + 32), c)
        # each 32-value sub-block spans two 16-value groups: repeat every scale and min twice
        sm = k4_scales_mins(b.scales)
        S = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sm, sm))
        O = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm))
        k.d = fp16(b.d)
        k.doff = fp16(b.dmin)
    elif kblock is block_q6_K:
        for n in range(2):
            a = _mm256_loadu_si256(<const __m256i*>(b.ql + 64 * n))
            c = _mm256_loadu_si256(<const __m256i*>(b.ql + 64 * n + 32))
            hb = _mm256_loadu_si256(<const __m256i*>(b.qh + 32 * n))
            _mm256_storeu_si256(<__m256i*>(k.u + 128 * n), _mm256_or_si256(
                _mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), _mm256_set1_epi8(0x30))))
            _mm256_storeu_si256(<__m256i*>(k.u + 128 * n + 32), _mm256_or_si256(
                _mm256_and_si256(c, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), _mm256_set1_epi8(0x30))))
            _mm256_storeu_si256(<__m256i*>(k.u + 128 * n + 64), _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(hb, _mm256_set1_epi8(0x30))))
            _mm256_storeu_si256(<__m256i*>(k.u + 128 * n + 96), _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(c, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(hb, 2), _mm256_set1_epi8(0x30))))
        S = _mm256_cvtepi8_epi16(_mm_loadu_si128(<const __m128i*>b.scales))
        O = _mm256_slli_epi16(S, 5)
        k.d = fp16(b.d)
        k.doff = k.d
    _mm256_storeu_si256(<__m256i*>k.off, O)
    expand_scales(S, k)


# acc += the dot of one unpacked super-block with one Q8_K block (8 float lanes, summed at the end).
cdef inline __m256 kdot(const kunpacked* k, const block_q8k* y, __m256 acc, bint same_d) noexcept nogil:
    cdef __m256i sumi = _mm256_setzero_si256()
    cdef __m256i p, o
    cdef int j
    for j in range(8):
        p = _mm256_maddubs_epi16(_mm256_loadu_si256(<const __m256i*>(k.u + 32 * j)),
                                 _mm256_loadu_si256(<const __m256i*>(y.qs + 32 * j)))
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_loadu_si256(<const __m256i*>&k.scx[16 * j])))
    o = _mm256_madd_epi16(_mm256_loadu_si256(<const __m256i*>k.off), _mm256_loadu_si256(<const __m256i*>y.bsums))
    if same_d:
        return _mm256_fmadd_ps(_mm256_set1_ps(k.d * y.d), _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi, o)), acc)
    acc = _mm256_fmadd_ps(_mm256_set1_ps(k.d * y.d), _mm256_cvtepi32_ps(sumi), acc)
    return _mm256_fnmadd_ps(_mm256_set1_ps(k.doff * y.d), _mm256_cvtepi32_ps(o), acc)


cdef void tile_k(const kblock* w, const tshape* shape, const block_q8k* y, Py_ssize_t nb,
                 float* out, Py_ssize_t ldo) noexcept nogil:
    cdef int R = shape_rows(shape)
    cdef int T = shape_toks(shape)
    cdef bint same_d = kblock is block_q3_K or kblock is block_q6_K
    cdef kunpacked up[MAXR]
    cdef __m256 acc[MAXR][MAXT]
    cdef const char* pf = <const char*>(w + PF_TILES * R * nb)
    cdef Py_ssize_t pfstep = R * sizeof(kblock)
    cdef Py_ssize_t b, k
    cdef int r, t
    for r in range(R):
        for t in range(T):
            acc[r][t] = _mm256_setzero_ps()
    for b in range(nb):
        if T == 1:  # decode: prefetch the weights PF_TILES tiles ahead (see tile_lg)
            for k in range(0, pfstep, 64):
                lc_prefetch(pf + b * pfstep + k)
        for r in range(R):
            unpack_k(w + r * nb + b, &up[r])
        for t in range(T):
            for r in range(R):
                acc[r][t] = kdot(&up[r], y + t * nb + b, acc[r][t], same_d)
    for r in range(R):
        for t in range(T):
            out[t * ldo + r] = hsum8(acc[r][t])


# =========================================================================================================
# Drivers shared by all quantized types: tiles over rows and tokens, parallel over groups of rows.


# One tile of any quantized type; X is the activation matrix, t0 the tile's first token.
cdef inline void tile_q(const qblock* w, const tshape* shape, const void* X, Py_ssize_t t0,
                        Py_ssize_t nb, float* out, Py_ssize_t ldo) noexcept nogil:
    if qblock is block_q2_K or qblock is block_q3_K or qblock is block_q4_K or qblock is block_q5_K \
            or qblock is block_q6_K:
        tile_k(w, shape, <const block_q8k*>X + t0 * nb, nb, out, ldo)
    else:
        tile_lg(w, shape, <const block_q8a*>X + t0 * nb, nb, out, ldo)


# Decode: rows [g*DR, g*DR + DR) against one token.
cdef inline void q_decode_group(const qblock* W, Py_ssize_t rows, Py_ssize_t nb, const void* X,
                                float* Y, Py_ssize_t g) noexcept nogil:
    cdef Py_ssize_t r = g * DR
    if r + DR <= rows:
        tile_q(W + r * nb, <const shape_dec*>NULL, X, 0, nb, Y + r, 1)
    else:
        while r < rows:
            tile_q(W + r * nb, <const shape_11*>NULL, X, 0, nb, Y + r, 1)
            r += 1


# Prefill: rows [g*GR, g*GR + GR) against all tokens, chunk by chunk of TCH tokens, so that the group's
# weights stay in L1 and the chunk's activations in L2.
cdef inline void q_prefill_group(const qblock* W, Py_ssize_t rows, Py_ssize_t nb, const void* X,
                                 Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, Py_ssize_t g) noexcept nogil:
    cdef Py_ssize_t r0 = g * GR
    cdef Py_ssize_t r1 = min(rows, r0 + GR)
    cdef Py_ssize_t t0 = 0, t1, r, t
    while t0 < n_tok:  # (a C loop: range() with a non-literal step would be a Python loop)
        t1 = min(n_tok, t0 + TCH)
        r = r0
        while r + PR <= r1:
            t = t0
            while t + PT <= t1:
                tile_q(W + r * nb, <const shape_pp*>NULL, X, t, nb, Y + t * ldy + r, ldy)
                t += PT
            while t < t1:
                tile_q(W + r * nb, <const shape_p1*>NULL, X, t, nb, Y + t * ldy + r, ldy)
                t += 1
            r += PR
        while r < r1:
            t = t0
            while t + PT <= t1:
                tile_q(W + r * nb, <const shape_1p*>NULL, X, t, nb, Y + t * ldy + r, ldy)
                t += PT
            while t < t1:
                tile_q(W + r * nb, <const shape_11*>NULL, X, t, nb, Y + t * ldy + r, ldy)
                t += 1
            r += 1
        t0 = t1


cdef void mm_q(const qblock* W, Py_ssize_t rows, Py_ssize_t nb, const void* X, Py_ssize_t n_tok,
               float* Y, Py_ssize_t ldy, int nthreads) noexcept nogil:
    cdef Py_ssize_t g, ngroups
    if n_tok == 1:
        ngroups = (rows + DR - 1) // DR
        for g in range(ngroups):
            q_decode_group(W, rows, nb, X, Y, g)
    else:
        ngroups = (rows + GR - 1) // GR
        for g in range(ngroups):
            q_prefill_group(W, rows, nb, X, n_tok, Y, ldy, g)


# =========================================================================================================
# SIMD kernels for float weights (F32, F16, BF16) against ACT_F32.


cdef inline __m256 load8(const fblock* p) noexcept nogil:
    if fblock is float:
        return _mm256_loadu_ps(p)
    elif fblock is block_f16:
        return _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>p))
    else:  # bf16: the upper half of a float
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(<const __m128i*>p)), 16))


cdef inline float load1(const fblock* p) noexcept nogil:
    if fblock is float:
        return p[0]
    elif fblock is block_f16:
        return fp16(p[0].bits)
    else:
        return bf16_to_f32(p[0].bits)


cdef void tile_f(const fblock* w, const tshape* shape, const float* x, Py_ssize_t cols,
                 float* out, Py_ssize_t ldo) noexcept nogil:
    cdef int R = shape_rows(shape)
    cdef int T = shape_toks(shape)
    cdef __m256 acc[MAXR][MAXT]
    cdef __m256 wv[MAXR]
    cdef __m256 xv
    cdef float tail
    cdef int r, t
    cdef Py_ssize_t k, k8 = cols - cols % 8
    for r in range(R):
        for t in range(T):
            acc[r][t] = _mm256_setzero_ps()
    cdef const char* pf = <const char*>(w + PF_TILES * R * cols)
    cdef Py_ssize_t pk
    for k in range(0, k8, 8):
        if T == 1:  # decode streams the weights: prefetch PF_TILES tiles ahead (see tile_lg)
            for pk in range(0, R * 8 * <Py_ssize_t>sizeof(fblock), 64):
                lc_prefetch(pf + R * k * sizeof(fblock) + pk)
        for r in range(R):
            wv[r] = load8(w + r * cols + k)
        for t in range(T):
            xv = _mm256_loadu_ps(x + t * cols + k)
            for r in range(R):
                acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t])
    for r in range(R):
        for t in range(T):
            tail = 0.0
            for k in range(k8, cols):
                tail += load1(w + r * cols + k) * x[t * cols + k]
            out[t * ldo + r] = hsum8(acc[r][t]) + tail


cdef inline void f_decode_group(const fblock* W, Py_ssize_t rows, Py_ssize_t cols, const float* X,
                                float* Y, Py_ssize_t g) noexcept nogil:
    cdef Py_ssize_t r = g * DR
    if r + DR <= rows:
        tile_f(W + r * cols, <const shape_dec*>NULL, X, cols, Y + r, 1)
    else:
        while r < rows:
            tile_f(W + r * cols, <const shape_11*>NULL, X, cols, Y + r, 1)
            r += 1


cdef inline void f_prefill_group(const fblock* W, Py_ssize_t rows, Py_ssize_t cols, const float* X,
                                 Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, Py_ssize_t g) noexcept nogil:
    cdef Py_ssize_t r0 = g * GR
    cdef Py_ssize_t r1 = min(rows, r0 + GR)
    cdef Py_ssize_t t0 = 0, t1, r, t
    while t0 < n_tok:
        t1 = min(n_tok, t0 + TCH)
        r = r0
        while r + PR <= r1:
            t = t0
            while t + PT <= t1:
                tile_f(W + r * cols, <const shape_pp*>NULL, X + t * cols, cols, Y + t * ldy + r, ldy)
                t += PT
            while t < t1:
                tile_f(W + r * cols, <const shape_p1*>NULL, X + t * cols, cols, Y + t * ldy + r, ldy)
                t += 1
            r += PR
        while r < r1:
            t = t0
            while t + PT <= t1:
                tile_f(W + r * cols, <const shape_1p*>NULL, X + t * cols, cols, Y + t * ldy + r, ldy)
                t += PT
            while t < t1:
                tile_f(W + r * cols, <const shape_11*>NULL, X + t * cols, cols, Y + t * ldy + r, ldy)
                t += 1
            r += 1
        t0 = t1


cdef void mm_f(const fblock* W, Py_ssize_t rows, Py_ssize_t cols, const float* X, Py_ssize_t n_tok,
               float* Y, Py_ssize_t ldy, int nthreads) noexcept nogil:
    cdef Py_ssize_t g, ngroups
    if n_tok == 1:
        ngroups = (rows + DR - 1) // DR
        for g in range(ngroups):
            f_decode_group(W, rows, cols, X, Y, g)
    else:
        ngroups = (rows + GR - 1) // GR
        for g in range(ngroups):
            f_prefill_group(W, rows, cols, X, n_tok, Y, ldy, g)


# =========================================================================================================
# AVX-512 VNNI dispatch, decided once at import.
#
# matmul512 is compiled for AVX-512, so it is imported only here and only on a CPU that has AVX-512
# F/BW/VL + VNNI (cpu.has_avx512_vnni, which also checks that the OS saves the zmm state): on any other CPU
# not one of its instructions runs, not even its module initialisation. Its kernel arrives as a plain
# function pointer (from a PyCapsule), so matmul() stays nogil and picks it with one pointer test.

# matmul_impl's code for "the AVX-512 VNNI kernels where they apply, AVX2 elsewhere" regardless of
# LLAMACY_NO_AVX512 (tests and benchmarks compare the two paths in one process).
cdef enum:
    IMPL_VNNI = 3

cdef mm512_fn _mm512_found = NULL  # matmul512's kernel, if this CPU and this build have it
cdef mm512_fn _mm512 = NULL        # the one matmul() uses: _mm512_found unless LLAMACY_NO_AVX512=1


def _find_mm512():
    """(capsule or None, why): matmul512's kernel where this build and CPU can run it."""
    if not HAVE_SIMD:
        return None, "portable build"
    from llamacy.kernels import cpu

    if not cpu.has_avx512_vnni():
        return None, "this CPU lacks AVX-512 F/BW/VL/VNNI"
    try:
        from llamacy.kernels import matmul512
    except ImportError as e:
        return None, f"matmul512 is not built ({e})"
    return matmul512.kernel_capsule(), "available"


_capsule, AVX512_STATUS = _find_mm512()
if _capsule is not None:
    _mm512_found = <mm512_fn>PyCapsule_GetPointer(_capsule, "llamacy.kernels.matmul512.mm512")
    if os.environ.get("LLAMACY_NO_AVX512", "") in ("", "0"):
        _mm512 = _mm512_found
    else:
        AVX512_STATUS = "off (LLAMACY_NO_AVX512)"
del _capsule


def vnni_available():
    """True if the AVX-512 VNNI kernels can run here (CPU and build), whether or not matmul uses them."""
    return _mm512_found != NULL


def kernel_path():
    """The kernels matmul() runs for quantized weights: "avx512-vnni", "avx2" or "scalar".

    ("avx512-vnni" covers the quantized types with several tokens and the 32-value types in decode; the
    rest of the products run on AVX2 all the same.)
    """
    if _mm512 != NULL:
        return "avx512-vnni"
    return "avx2" if HAVE_SIMD else "scalar"


# =========================================================================================================
# Dispatch


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


cdef void _mm_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    cdef MMJob* j = <MMJob*> ctx
    cdef Py_ssize_t c, r0, r1
    for c in range(begin, end):
        r0 = c * j.chunk_rows
        r1 = min(j.rows, r0 + j.chunk_rows)
        matmul_impl(j.W + r0 * j.row_bytes, j.wtype, r1 - r0, j.cols, j.xq, j.n_tok, j.Y + r0, j.ldy, 1,
                    j.impl)


cdef void matmul_impl(const uint8_t* W, int wtype, Py_ssize_t rows, Py_ssize_t cols,
                      const void* xq, Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads,
                      int impl) noexcept nogil:
    cdef bint simd = impl == IMPL_SIMD or impl == IMPL_VNNI or (impl == IMPL_AUTO and HAVE_SIMD)
    cdef Py_ssize_t qk = weight_block_values(wtype)
    cdef Py_ssize_t nb, per_thread
    cdef vd_fn fn
    cdef mm512_fn fn512 = _mm512 if impl == IMPL_AUTO else _mm512_found if impl == IMPL_VNNI else NULL
    cdef MMJob job
    if rows <= 0 or n_tok <= 0 or qk == 0:
        return
    nb = cols // qk
    if nthreads > 1 and rows >= 2 * SPLIT_ROWS:
        # Decode and small batches stream the weights from memory: one contiguous range per thread keeps
        # each thread's reads one sequential stream for the prefetchers (eight interleaved chunks per
        # thread gave 164 instead of 189 t/s in 2-thread SmolLM2 decode). Prefill is compute-bound:
        # eight chunks per thread, so that a thread the OS runs late costs the others little.
        per_thread = 1 if n_tok <= 8 else 8
        job.W = W
        job.wtype = wtype
        job.cols = cols
        job.rows = rows
        job.row_bytes = nb * weight_block_bytes(wtype)
        job.chunk_rows = SPLIT_ROWS * max(1, rows // (SPLIT_ROWS * per_thread * nthreads))
        job.xq = xq
        job.n_tok = n_tok
        job.Y = Y
        job.ldy = ldy
        job.impl = impl
        parallel_for(_mm_task, &job, (rows + job.chunk_rows - 1) // job.chunk_rows, 1, nthreads)
        return
    nthreads = 1
    # the AVX-512 VNNI kernels, where they apply (they return 0 for what they leave to AVX2)
    if fn512 != NULL and fn512(W, wtype, rows, cols, xq, n_tok, Y, ldy, nthreads):
        return
    if not simd:
        fn = scalar_kernel(wtype)
        if fn != NULL:
            mm_scalar(fn, W, nb * weight_block_bytes(wtype), rows, cols, <const uint8_t*>xq,
                      act_row_bytes(wtype, cols), n_tok, Y, ldy, nthreads)
        return
    if wtype == T_Q4_0:
        mm_q(<const block_q4_0*>W, rows, nb, xq, n_tok, Y, ldy, nthreads)
    elif wtype == T_Q4_1:
        mm_q(<const block_q4_1*>W, rows, nb, xq, n_tok, Y, ldy, nthreads)
    elif wtype == T_Q5_0:
        mm_q(<const block_q5_0*>W, rows, nb, xq, n_tok, Y, ldy, nthreads)
    elif wtype == T_Q5_1:
        mm_q(<const block_q5_1*>W, rows, nb, xq, n_tok, Y, ldy, nthreads)
    elif wtype == T_Q8_0:
        mm_q(<const block_q8_0*>W, rows, nb, xq, n_tok, Y, ldy, nthreads)
    elif wtype == T_Q2_K:
        mm_q(<const block_q2_K*>W, rows, nb, xq, n_tok, Y, ldy, nthreads)
    elif wtype == T_Q3_K:
        mm_q(<const block_q3_K*>W, rows, nb, xq, n_tok, Y, ldy, nthreads)
    elif wtype == T_Q4_K:
        mm_q(<const block_q4_K*>W, rows, nb, xq, n_tok, Y, ldy, nthreads)
    elif wtype == T_Q5_K:
        mm_q(<const block_q5_K*>W, rows, nb, xq, n_tok, Y, ldy, nthreads)
    elif wtype == T_Q6_K:
        mm_q(<const block_q6_K*>W, rows, nb, xq, n_tok, Y, ldy, nthreads)
    elif wtype == T_F32:
        mm_f(<const float*>W, rows, cols, <const float*>xq, n_tok, Y, ldy, nthreads)
    elif wtype == T_F16:
        mm_f(<const block_f16*>W, rows, cols, <const float*>xq, n_tok, Y, ldy, nthreads)
    elif wtype == T_BF16:
        mm_f(<const block_bf16*>W, rows, cols, <const float*>xq, n_tok, Y, ldy, nthreads)


cdef void matmul(const uint8_t* W, int wtype, Py_ssize_t rows, Py_ssize_t cols,
                 const void* xq, Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, int nthreads) noexcept nogil:
    matmul_impl(W, wtype, rows, cols, xq, n_tok, Y, ldy, nthreads, IMPL_AUTO)


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
    if code == IMPL_VNNI and _mm512_found == NULL:
        raise ValueError(f"impl 'vnni' is not available here: {AVX512_STATUS}")
    return code


cdef Py_ssize_t _row_bytes(int wtype, Py_ssize_t cols) except -1:
    cdef Py_ssize_t qk = weight_block_values(wtype)
    if qk == 0:
        raise ValueError(f"no kernels for weight type {wtype}")
    if cols <= 0 or cols % qk:
        raise ValueError(f"row length must be a positive multiple of {qk} for type {wtype}, got {cols}")
    return cols // qk * weight_block_bytes(wtype)


cdef _weights(W_rows, int wtype, Py_ssize_t cols):
    cdef Py_ssize_t rb = _row_bytes(wtype, cols)
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


def matmul_py(W_rows, int wtype, x, int nthreads=1, impl="auto", out=None):
    """Y[n, rows] = x[n, cols] @ W.T, W given as its raw rows uint8[rows, row_bytes] of type `wtype`.

    x is quantized on the fly (with the same kernel family as `impl`), as the forward pass does.
    `out`, if given, is a C-contiguous float32[n, ldy] with ldy >= rows; Y goes to out[:, :rows] (the
    rest of each row is left as it was) and `out` is returned.
    """
    cdef int code = _impl(impl)
    xa = _activations(x)
    cdef Py_ssize_t n = xa.shape[0], cols = xa.shape[1]
    Wa = _weights(W_rows, wtype, cols)
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
    xq = _quantize(wtype, xa, code)
    cdef const uint8_t[:, ::1] wv = Wa
    cdef const uint8_t[:, ::1] qv = xq
    cdef float[:, ::1] yv = Y
    cdef Py_ssize_t ldy = Y.shape[1]
    with nogil:
        matmul_impl(&wv[0, 0], wtype, rows, cols, &qv[0, 0], n, &yv[0, 0], ldy, nthreads, code)
    return Y


def vec_dot_py(int wtype, wrow_bytes, xq_bytes, Py_ssize_t cols, impl="auto"):
    """Dot product of one raw weight row with one already-quantized activation row (quant.quantize_act)."""
    cdef int code = _impl(impl)
    cdef Py_ssize_t rb = _row_bytes(wtype, cols)
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


def bench_matmul(W_rows, int wtype, x, int nthreads=1, impl="auto", double min_time=0.2,
                 int min_reps=5):
    """Seconds per matmul, the best of repeated C loops of >= 2 ms (activations quantized once, outside).

    Single-threaded runs are timed in thread CPU time (time.thread_time), which does not count the time
    the thread sits descheduled on a shared machine; multi-threaded runs in wall time.
    """
    cdef int code = _impl(impl)
    nthreads = min(max(nthreads, 1), ensure_threads(nthreads))
    xa = _activations(x)
    cdef Py_ssize_t n = xa.shape[0], cols = xa.shape[1]
    Wa = _weights(W_rows, wtype, cols)
    xq = _quantize(wtype, xa, code)
    cdef Py_ssize_t rows = Wa.shape[0]
    Y = np.zeros((n, rows), dtype=np.float32)
    cdef const uint8_t[:, ::1] wv = Wa
    cdef const uint8_t[:, ::1] qv = xq
    cdef float[:, ::1] yv = Y
    cdef int i, iters = 1
    clock = time.thread_time if nthreads == 1 else time.perf_counter
    best = float("inf")
    total = 0.0
    reps = 0
    while True:  # warm up, growing the inner loop until one measurement takes >= 2 ms
        t0 = clock()
        with nogil:
            for i in range(iters):
                matmul_impl(&wv[0, 0], wtype, rows, cols, &qv[0, 0], n, &yv[0, 0], rows, nthreads, code)
        dt = clock() - t0
        if dt >= 0.002:
            break
        iters *= 2
    while total < min_time or reps < min_reps:
        t0 = clock()
        with nogil:
            for i in range(iters):
                matmul_impl(&wv[0, 0], wtype, rows, cols, &qv[0, 0], n, &yv[0, 0], rows, nthreads, code)
        dt = clock() - t0
        total += dt
        reps += 1
        best = min(best, dt / iters)
    return best
