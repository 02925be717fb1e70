# The weight quantizers (the `from_float` column of traits.pyx): float32 rows -> stored GGML blocks, as
# ggml's reference quantizers write them (ggml-quants.c, quantize_row_*_ref, what llama-quantize runs when it
# has no importance matrix), generic C. Every function takes (x, out, n, lanes): n values, a whole number of
# blocks; lanes: the K-quant scale searches 8 sub-blocks at a time (qsearch.pyx; the same bytes, faster).
#
# Same float32 operations in the same order as the reference, so the legacy types (Q8_0, Q4_0, Q4_1, Q5_0,
# Q5_1) are bit-identical to gguf.quants.quantize (the tests' oracle), and the K-quants follow
# make_qkx2_quants / make_qx_quants / make_q3_quants step by step. The exactness rules are qsearch.pxd's.
from libc.math cimport fabsf, sqrtf
from libc.stdint cimport int8_t, int32_t, uint8_t, uint16_t, uint32_t
from libc.string cimport memcpy, memset

from llamacy.kernels.blocks cimport *
from llamacy.kernels.values cimport q3k_scale, scale_min_k4
from llamacy.kernels.qsearch cimport *

cdef extern from "float.h":
    const float FLT_MAX


cdef void q_f32(const float* x, void* out, Py_ssize_t n, bint lanes) noexcept nogil:
    memcpy(out, x, n * sizeof(float))


cdef void q_f16(const float* x, void* out, Py_ssize_t n, bint lanes) noexcept nogil:
    cdef uint16_t* y = <uint16_t*>out
    cdef Py_ssize_t j
    for j in range(n):
        y[j] = fp16(x[j])


cdef void q_bf16(const float* x, void* out, Py_ssize_t n, bint lanes) noexcept nogil:
    cdef uint16_t* y = <uint16_t*>out
    # ggml_compute_fp32_to_bf16: round to nearest even; a NaN stays a (quiet) NaN.
    cdef Py_ssize_t j
    cdef uint32_t u
    for j in range(n):
        memcpy(&u, &x[j], 4)
        if (u & 0x7fffffff) > 0x7f800000:
            y[j] = <uint16_t>((u >> 16) | 64)
        else:
            y[j] = <uint16_t>((u + (0x7fff + ((u >> 16) & 1))) >> 16)


# ---------------------------------------------------------------------------------------------------------
# Legacy 32-value types (quantize_row_q{8_0,4_0,4_1,5_0,5_1}_ref)


cdef void q_q8_0(const float* x, void* out, Py_ssize_t nvals, bint lanes) noexcept nogil:
    cdef block_q8_0* y = <block_q8_0*>out
    cdef Py_ssize_t nb = nvals // 32
    cdef Py_ssize_t i, j
    cdef float amax, v, d, id
    for i in range(nb):
        amax = 0
        for j in range(32):
            v = fabsf(x[j])
            amax = amax if amax > v else v
        d = amax / 127
        id = <float>1.0 / d if d != 0 else <float>0.0
        y[i].d = fp16(d)
        for j in range(32):
            y[i].qs[j] = <int8_t>round_away(x[j] * id)
        x += 32


cdef inline void min_max(const float* x, int n, float* mn, float* mx) noexcept nogil:
    cdef float lo = FLT_MAX, hi = -FLT_MAX
    cdef int j
    for j in range(n):
        if x[j] < lo:
            lo = x[j]
        if x[j] > hi:
            hi = x[j]
    mn[0] = lo
    mx[0] = hi


# The 4- and 5-bit legacy types, with b bits and qmax = 2^b - 1:
#   Q4_0, Q5_0: d = (the value of largest magnitude) / -2^(b-1), q = min(qmax, trunc(x / d + 2^(b-1) + 0.5));
#   Q4_1, Q5_1: d = (max - min) / qmax, m = min, q = min(qmax, trunc((x - m) / d + 0.5)) (ggml has no clamp
#     there, (max - min)/qmax * qmax rounding to at most qmax + 0.5; the oracle clips, so do we).
# Value j in the low nibble of qs[j], value j + 16 in the high one; the 5th bits in qh.
cdef void q_legacy(const float* x, l45block* y, Py_ssize_t nvals, bint lanes) noexcept nogil:
    cdef bint with_min = l45block is block_q4_1 or l45block is block_q5_1
    cdef int qmax = 15 if l45block is block_q4_0 or l45block is block_q4_1 else 31
    cdef float half = <float>0.5 if with_min else (<float>8.5 if qmax == 15 else <float>16.5)
    cdef Py_ssize_t i, j
    cdef float amax, mn, mx, d, id, x0, x1
    cdef int q0, q1
    cdef uint32_t qh
    for i in range(nvals // 32):
        if l45block is block_q4_1 or l45block is block_q5_1:
            min_max(x, 32, &mn, &mx)
            d = (mx - mn) / qmax
            y[i].m = fp16(mn)
        else:
            d = signed_amax(x, 32, &amax) / -((qmax + 1) // 2)
        id = <float>1.0 / d if d != 0 else <float>0.0
        y[i].d = fp16(d)
        qh = 0
        for j in range(16):
            if l45block is block_q4_1 or l45block is block_q5_1:
                x0 = (x[j] - mn) * id
                x1 = (x[16 + j] - mn) * id
            else:
                x0 = x[j] * id
                x1 = x[16 + j] * id
            q0 = imin(qmax, <int>(x0 + half))
            q1 = imin(qmax, <int>(x1 + half))
            y[i].qs[j] = <uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4))
            qh |= (<uint32_t>(q0 & 0x10) >> 4) << j
            qh |= (<uint32_t>(q1 & 0x10) >> 4) << (j + 16)
        if l45block is block_q5_0 or l45block is block_q5_1:
            memcpy(y[i].qh, &qh, 4)
        x += 32


# ---------------------------------------------------------------------------------------------------------
# K-quants (quantize_row_q{2,3,4,5,6}_K_ref): super-blocks of 256 values


cdef inline void pack_2bit(const uint8_t* L, uint8_t* qs) noexcept nogil:
    # Q2_K / Q3_K low bits: byte l of each 32-byte half holds values l, l+32, l+64, l+96 of its 128.
    cdef int j, l
    for j in range(0, QK_K, 128):
        for l in range(32):
            qs[j // 4 + l] = <uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4)
                                       | (L[j + l + 96] << 6))


cdef void q_q2_K(const float* x, void* out, Py_ssize_t nvals, bint lanes) noexcept nogil:
    cdef block_q2_K* y = <block_q2_K*>out
    cdef Py_ssize_t nb = nvals // QK_K
    cdef uint8_t L[QK_K]
    cdef uint8_t Laux[16]
    cdef float weights[QK_K]
    cdef float mins[16]
    cdef float scales[16]
    cdef Py_ssize_t i
    cdef int j, l, ii
    cdef float max_scale, max_min, iscale, d, dm
    cdef float q4scale = 15
    for i in range(nb):
        max_scale = 0
        max_min = 0
        for l in range(QK_K):
            weights[l] = fabsf(x[l])
        if lanes:  # sub-blocks 0-7, then 8-15
            make_qkx2_quants_x8(16, 3, x, weights, L, scales, mins, <float>-0.5, <float>0.1, 15, True)
            make_qkx2_quants_x8(16, 3, x + 128, weights + 128, L + 128, scales + 8, mins + 8, <float>-0.5,
                                <float>0.1, 15, True)
        else:
            for j in range(QK_K // 16):
                scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights + 16 * j, L + 16 * j, &mins[j], Laux,
                                             <float>-0.5, <float>0.1, 15, True)
        for j in range(QK_K // 16):
            if scales[j] > max_scale:
                max_scale = scales[j]
            if mins[j] > max_min:
                max_min = mins[j]
        if max_scale > 0:
            iscale = q4scale / max_scale
            for j in range(QK_K // 16):
                y[i].scales[j] = <uint8_t>nearest_int(iscale * scales[j])
            y[i].d = fp16(max_scale / q4scale)
        else:
            for j in range(QK_K // 16):
                y[i].scales[j] = 0
            y[i].d = fp16(0)
        if max_min > 0:
            iscale = q4scale / max_min
            for j in range(QK_K // 16):
                y[i].scales[j] |= <uint8_t>(nearest_int(iscale * mins[j]) << 4)
            y[i].dmin = fp16(max_min / q4scale)
        else:
            y[i].dmin = fp16(0)
        for j in range(QK_K // 16):
            d = fp32(y[i].d) * (y[i].scales[j] & 0xF)
            if d == 0:
                continue
            dm = fp32(y[i].dmin) * (y[i].scales[j] >> 4)
            for ii in range(16):
                l = nearest_int((x[16 * j + ii] + dm) / d)
                L[16 * j + ii] = <uint8_t>imax(0, imin(3, l))
        pack_2bit(L, y[i].qs)
        x += QK_K


cdef void q_q3_K(const float* x, void* out, Py_ssize_t nvals, bint lanes) noexcept nogil:
    cdef block_q3_K* y = <block_q3_K*>out
    cdef Py_ssize_t nb = nvals // QK_K
    cdef int8_t L[QK_K]
    cdef float scales[16]
    cdef Py_ssize_t i
    cdef int j, l, ii, m
    cdef int8_t li
    cdef uint8_t hm
    cdef float max_scale, amax, scale, iscale, d
    for i in range(nb):
        max_scale = 0
        amax = 0
        for j in range(QK_K // 16):
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j)
            scale = fabsf(scales[j])
            if scale > amax:
                amax = scale
                max_scale = scales[j]
        memset(y[i].scales, 0, 12)
        if max_scale != 0:
            iscale = <float>-32.0 / max_scale
            for j in range(QK_K // 16):
                li = <int8_t>nearest_int(iscale * scales[j])
                li = <int8_t>(imax(-32, imin(31, li)) + 32)
                if j < 8:
                    y[i].scales[j] = li & 0xF
                else:
                    y[i].scales[j - 8] |= <uint8_t>((li & 0xF) << 4)
                li = li >> 4
                y[i].scales[j % 4 + 8] |= <uint8_t>(li << (2 * (j // 4)))
            y[i].d = fp16(<float>1.0 / iscale)
        else:
            y[i].d = fp16(0)
        for j in range(QK_K // 16):
            d = fp32(y[i].d) * q3k_scale(y[i].scales, j)
            if d == 0:
                continue
            for ii in range(16):
                l = nearest_int(x[16 * j + ii] / d)
                L[16 * j + ii] = <int8_t>(imax(-4, imin(3, l)) + 4)
        # The high bit of value j goes to bit j // 32 of hmask[j % 32]; the low 2 bits as in Q2_K.
        memset(y[i].hmask, 0, QK_K // 8)
        m = 0
        hm = 1
        for j in range(QK_K):
            if L[j] > 3:
                y[i].hmask[m] |= hm
                L[j] -= 4
            m += 1
            if m == QK_K // 8:
                m = 0
                hm <<= 1
        pack_2bit(<const uint8_t*>L, y[i].qs)
        x += QK_K


cdef inline void pack_scales_k4(uint8_t* out, const float* scales, const float* mins, float inv_scale,
                                float inv_min) noexcept nogil:
    # 8 six-bit scales and mins into 12 bytes (the inverse of values.scale_min_k4).
    cdef int j
    cdef uint8_t ls, lm
    for j in range(QK_K // 32):
        ls = <uint8_t>nearest_int(inv_scale * scales[j])
        lm = <uint8_t>nearest_int(inv_min * mins[j])
        ls = ls if ls < 63 else 63
        lm = lm if lm < 63 else 63
        if j < 4:
            out[j] = ls
            out[j + 4] = lm
        else:
            out[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            out[j - 4] |= ((ls >> 4) << 6)
            out[j] |= ((lm >> 4) << 6)


cdef inline void fit_k4(const float* x, uint8_t* L, float* scales, float* mins, float* max_scale,
                        float* max_min, int nmax, float rmin, float rdelta, int nstep,
                        bint lanes) noexcept nogil:
    # Q4_K / Q5_K: per 32-value sub-block, weights |x| + rms(x), then make_qkx2_quants.
    cdef uint8_t Laux[32]
    cdef float weights[QK_K]
    cdef float sum_x2, av_x
    cdef int j, l
    max_scale[0] = 0
    max_min[0] = 0
    for j in range(QK_K // 32):
        sum_x2 = 0
        for l in range(32):
            sum_x2 += x[32 * j + l] * x[32 * j + l]
        av_x = sqrtf(sum_x2 / 32)
        for l in range(32):
            weights[32 * j + l] = av_x + fabsf(x[32 * j + l])
    if lanes:
        make_qkx2_quants_x8(32, nmax, x, weights, L, scales, mins, rmin, rdelta, nstep, False)
    else:
        for j in range(QK_K // 32):
            scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights + 32 * j, L + 32 * j, &mins[j], Laux,
                                         rmin, rdelta, nstep, False)
    for j in range(QK_K // 32):
        if scales[j] > max_scale[0]:
            max_scale[0] = scales[j]
        if mins[j] > max_min[0]:
            max_min[0] = mins[j]


cdef inline void requantize_k4(const float* x, uint8_t* L, const uint8_t* packed, uint16_t d16,
                               uint16_t dmin16, int nmax) noexcept nogil:
    # Re-derive L from the scales as they were stored (6-bit, fp16 super-scales).
    cdef uint8_t sc, m
    cdef float d, dm
    cdef int j, ii, l
    for j in range(QK_K // 32):
        scale_min_k4(j, packed, &sc, &m)
        d = fp32(d16) * sc
        if d == 0:
            continue
        dm = fp32(dmin16) * m
        for ii in range(32):
            l = nearest_int((x[32 * j + ii] + dm) / d)
            L[32 * j + ii] = <uint8_t>imax(0, imin(nmax, l))


# Q4_K / Q5_K: one super-block's levels L (0..nmax) and its scales, mins, d and dmin, stored into y.
cdef inline void fit_store_k45(const float* x, k45block* y, uint8_t* L, int nmax, float rmin, float rdelta,
                               int nstep, bint lanes) noexcept nogil:
    cdef float mins[8]
    cdef float scales[8]
    cdef float max_scale, max_min, inv_scale, inv_min
    fit_k4(x, L, scales, mins, &max_scale, &max_min, nmax, rmin, rdelta, nstep, lanes)
    inv_scale = <float>63.0 / max_scale if max_scale > 0 else <float>0.0
    inv_min = <float>63.0 / max_min if max_min > 0 else <float>0.0
    pack_scales_k4(y.scales, scales, mins, inv_scale, inv_min)
    y.d = fp16(max_scale / <float>63.0)
    y.dmin = fp16(max_min / <float>63.0)
    requantize_k4(x, L, y.scales, y.d, y.dmin, nmax)


cdef void q_q4_K(const float* x, void* out, Py_ssize_t nvals, bint lanes) noexcept nogil:
    cdef block_q4_K* y = <block_q4_K*>out
    cdef Py_ssize_t nb = nvals // QK_K
    cdef uint8_t L[QK_K]
    cdef Py_ssize_t i
    cdef int j, l
    cdef uint8_t* q
    for i in range(nb):
        fit_store_k45(x, y + i, L, 15, <float>-1.0, <float>0.1, 20, lanes)
        q = y[i].qs
        for j in range(0, QK_K, 64):
            for l in range(32):
                q[l] = <uint8_t>(L[j + l] | (L[j + l + 32] << 4))
            q += 32
        x += QK_K


cdef void q_q5_K(const float* x, void* out, Py_ssize_t nvals, bint lanes) noexcept nogil:
    cdef block_q5_K* y = <block_q5_K*>out
    cdef Py_ssize_t nb = nvals // QK_K
    cdef uint8_t L[QK_K]
    cdef Py_ssize_t i
    cdef int j, n, l1, l2
    cdef uint8_t m1, m2
    cdef uint8_t* ql
    cdef uint8_t* qh
    for i in range(nb):
        fit_store_k45(x, y + i, L, 31, <float>-0.5, <float>0.1, 15, lanes)
        qh = y[i].qh
        ql = y[i].qs
        memset(qh, 0, QK_K // 8)
        m1 = 1
        m2 = 2
        for n in range(0, QK_K, 64):
            for j in range(32):
                l1 = L[n + j]
                if l1 > 15:
                    l1 -= 16
                    qh[j] |= m1
                l2 = L[n + j + 32]
                if l2 > 15:
                    l2 -= 16
                    qh[j] |= m2
                ql[j] = <uint8_t>(l1 | (l2 << 4))
            m1 <<= 2
            m2 <<= 2
            ql += 32
        x += QK_K


cdef void q_q6_K(const float* x, void* out, Py_ssize_t nvals, bint lanes) noexcept nogil:
    cdef block_q6_K* y = <block_q6_K*>out
    cdef Py_ssize_t nb = nvals // QK_K
    cdef int8_t L[QK_K]
    cdef float scales[16]
    cdef float max_scale, max_abs_scale, scale, iscale, d
    cdef Py_ssize_t i
    cdef int ib, j, ii, l
    cdef uint8_t* ql
    cdef uint8_t* qh
    for i in range(nb):
        max_scale = 0
        max_abs_scale = 0
        if lanes:
            make_qx_quants_x8(16, 32, x, L, scales)
            make_qx_quants_x8(16, 32, x + 128, L + 128, scales + 8)
        else:
            for ib in range(QK_K // 16):
                scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib)
        for ib in range(QK_K // 16):
            scale = scales[ib]
            if fabsf(scale) > max_abs_scale:
                max_abs_scale = fabsf(scale)
                max_scale = scale
        if max_abs_scale < GROUP_MAX_EPS:
            memset(&y[i], 0, sizeof(block_q6_K))
            y[i].d = fp16(0)
            x += QK_K
            continue
        iscale = <float>-128.0 / max_scale
        y[i].d = fp16(<float>1.0 / iscale)
        for ib in range(QK_K // 16):
            y[i].scales[ib] = <int8_t>imin(127, nearest_int(iscale * scales[ib]))
        for j in range(QK_K // 16):
            d = fp32(y[i].d) * y[i].scales[j]
            if d == 0:
                continue
            for ii in range(16):
                l = nearest_int(x[16 * j + ii] / d)
                L[16 * j + ii] = <int8_t>(imax(-32, imin(31, l)) + 32)
        ql = y[i].ql
        qh = y[i].qh
        for j in range(0, QK_K, 128):
            for l in range(32):
                ql[l] = <uint8_t>((L[j + l] & 0xF) | ((L[j + l + 64] & 0xF) << 4))
                ql[l + 32] = <uint8_t>((L[j + l + 32] & 0xF) | ((L[j + l + 96] & 0xF) << 4))
                qh[l] = <uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4)
                                  | ((L[j + l + 96] >> 4) << 6))
            ql += 64
            qh += 32
        x += QK_K
