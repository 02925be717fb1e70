# The scalar dot products (the `vec_dot` column of traits.pyx): one stored weight row x one activation
# row, plain loops over blocks, generic C.
#
# They are what a portable build runs, and the twins the SIMD kernels (mm_avx2.pyx, matmul512.pyx) are
# tested against: the same integer sums, scaled in the same way. K-quants against ACT_Q8K: integer sums per
# super-block, two float multiplies per super-block.
from libc.stdint cimport int8_t, int32_t, uint8_t, uint16_t, uint32_t

from llamacy.kernels.blocks cimport *
from llamacy.kernels.simd cimport fp16
from llamacy.kernels.values cimport fvalue, k23value, k45value, lvalue, q3k_scale, scale_min_k4


# The legacy types against ACT_Q8A: an integer sum per block, scaled by d_w * d_x; the offset types Q4_1
# and Q5_1 add m_w * s_x (s_x = d_x * sum of the block's activation quants).
cdef float vd_legacy(const lblock* w, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const block_q8a* x = <const block_q8a*>vx
    cdef float sumf = 0.0
    cdef int32_t isum
    cdef Py_ssize_t i
    cdef int j
    for i in range(cols // 32):
        isum = 0
        for j in range(32):
            isum += lvalue(w + i, j) * x[i].qs[j]
        if lblock is block_q4_1 or lblock is block_q5_1:
            sumf += (fp16(w[i].d) * x[i].d) * <float>isum + fp16(w[i].m) * x[i].s
        else:
            sumf += (fp16(w[i].d) * x[i].d) * <float>isum
    return sumf


# The float types against ACT_F32.
cdef float vd_float(const fblock* w, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const float* x = <const float*>vx
    cdef float s = 0.0
    cdef Py_ssize_t j
    for j in range(cols):
        s += fvalue(w + j) * x[j]
    return s


cdef float vd_k23(const k23block* w, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const block_q8k* x = <const block_q8k*>vx
    cdef float sumf = 0.0
    cdef int32_t isum, summ, dot
    cdef Py_ssize_t i
    cdef int n, k, h, l, g
    for i in range(cols // QK_K):
        isum = 0
        summ = 0
        for n in range(2):  # 128 values from 32 bytes: 2-bit fields at shifts 0, 2, 4, 6
            for k in range(4):
                for h in range(2):  # two groups of 16 per field
                    g = 8 * n + 2 * k + h
                    dot = 0
                    for l in range(16 * h, 16 * h + 16):
                        dot += k23value(w + i, n, k, l) * x[i].qs[128 * n + 32 * k + l]
                    if k23block is block_q2_K:
                        isum += (w[i].scales[g] & 0xF) * dot
                        summ += (w[i].scales[g] >> 4) * x[i].bsums[g]
                    else:
                        isum += q3k_scale(w[i].scales, g) * dot
        if k23block is block_q2_K:
            sumf += x[i].d * (fp16(w[i].d) * <float>isum - fp16(w[i].dmin) * <float>summ)
        else:
            sumf += x[i].d * (fp16(w[i].d) * <float>isum)
    return sumf


cdef float vd_k45(const k45block* w, const void* vx, Py_ssize_t cols) noexcept nogil:
    cdef const block_q8k* x = <const block_q8k*>vx
    cdef float sumf = 0.0
    cdef int32_t isum, summ, dot
    cdef uint8_t sc, m
    cdef Py_ssize_t i
    cdef int s, l
    for i in range(cols // QK_K):
        isum = 0
        summ = 0
        for s in range(8):
            scale_min_k4(s, w[i].scales, &sc, &m)
            dot = 0
            for l in range(32):
                dot += k45value(w + i, s, l) * x[i].qs[32 * s + l]
            isum += sc * dot
            summ += m * (x[i].bsums[2 * s] + x[i].bsums[2 * s + 1])
        sumf += x[i].d * (fp16(w[i].d) * <float>isum - fp16(w[i].dmin) * <float>summ)
    return sumf


cdef float vd_q6_K(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil:
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
