# Weight quantization: float32 rows -> stored GGML blocks, for `llamacy convert`.
#
# Distinct from quant.pyx (activations, quantized on every matmul): this runs once per tensor when a model
# file is written, and its output must be what the reference engine writes. Every function below is a port
# of ggml's reference quantizer (ggml-quants.c, quantize_row_*_ref, what llama-quantize runs when it has no
# importance matrix): same float32 operations in the same order, so the legacy types (Q8_0, Q4_0, Q4_1,
# Q5_0, Q5_1) are bit-identical to gguf.quants.quantize (the tests' oracle), and the K-quants follow
# make_qkx2_quants / make_qx_quants / make_q3_quants step by step.
#
# Exactness rules kept throughout:
# - every float constant is a C float (`<float>8.5`), never a double: `x0 + 8.5` would be computed in
#   double and truncated without the float rounding the reference does;
# - no FMA contraction (the pragma below): the reference rounds the product before the sum;
# - fp16 conversions round to nearest even (F16C, or simd.h's exact twin in the portable build).
#
# Rows are independent, so a tensor is quantized with prange over rows (dynamic schedule: K-quant rows cost
# ~20x more than legacy ones, and tensors have from one row to hundreds of thousands).
from cython.parallel cimport prange
from libc.math cimport fabsf, sqrtf
from libc.stdint cimport int8_t, int32_t, uint8_t, uint16_t, uint32_t
from libc.string cimport memcpy, memset
cimport openmp

import numpy as np

from llamacy.kernels.blocks cimport *
from llamacy.kernels.quant cimport dequantize_row, weight_block_bytes, weight_block_values
from llamacy.kernels.simd cimport _cvtsh_ss, _cvtss_sh

cdef extern from *:
    """
    /* ggml's reference quantizers round each product before adding: no fused multiply-adds here. GCC
       contracts a*b+c into an FMA by default (-ffp-contract=fast), which changes roundings and so blocks. */
    #if defined(__clang__)
    #pragma STDC FP_CONTRACT OFF
    #elif defined(__GNUC__)
    #pragma GCC optimize ("fp-contract=off")
    #endif
    """

cdef extern from "float.h":
    const float FLT_MAX

# GROUP_MAX_EPS in ggml-quants.c: a group whose largest |x| is below this is all zero.
cdef float GROUP_MAX_EPS = 1e-15


# ---------------------------------------------------------------------------------------------------------
# Helpers shared by the types


cdef inline uint16_t fp16(float x) noexcept nogil:
    return _cvtss_sh(x, 0)  # 0 = round to nearest even, as GGML_FP32_TO_FP16


cdef inline float fp32(uint16_t h) noexcept nogil:
    return _cvtsh_ss(h)


cdef inline int nearest_int(float fval) noexcept nogil:
    # ggml's round-half-to-even trick: adding 1.5 * 2^23 leaves the rounded integer in the low mantissa
    # bits. Valid for |fval| < 2^22, which every caller guarantees.
    cdef float val = fval + <float>12582912.0
    cdef int32_t i
    memcpy(&i, &val, 4)
    return (i & 0x007fffff) - 0x00400000


cdef inline int round_away(float v) noexcept nogil:
    # roundf (half away from zero) for |v| < 2^22 without the libm call, which keeps the loop vectorizable.
    # v - trunc(v) is exact, so the comparison with 0.5 decides exactly as roundf does.
    cdef int q = <int>v
    cdef float f = v - <float>q
    if f >= <float>0.5:
        q += 1
    elif f <= <float>-0.5:
        q -= 1
    return q


cdef inline int imin(int a, int b) noexcept nogil:
    return a if a < b else b


cdef inline int imax(int a, int b) noexcept nogil:
    return a if a > b else b


# ---------------------------------------------------------------------------------------------------------
# Float types


cdef void row_f16(const float* x, uint16_t* y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(n):
        y[j] = fp16(x[j])


cdef void row_bf16(const float* x, uint16_t* y, Py_ssize_t n) noexcept nogil:
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


cdef void row_q8_0(const float* x, block_q8_0* y, Py_ssize_t nb) noexcept nogil:
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


cdef inline float signed_amax(const float* x, int n) noexcept nogil:
    # The value of largest magnitude, sign kept (the first one on ties).
    cdef float amax = 0, mx = 0
    cdef int j
    for j in range(n):
        if amax < fabsf(x[j]):
            amax = fabsf(x[j])
            mx = x[j]
    return mx


cdef void row_q4_0(const float* x, block_q4_0* y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef float d, id, x0, x1
    cdef int q0, q1
    for i in range(nb):
        d = signed_amax(x, 32) / -8
        id = <float>1.0 / d if d != 0 else <float>0.0
        y[i].d = fp16(d)
        for j in range(16):
            x0 = x[j] * id
            x1 = x[16 + j] * id
            q0 = imin(15, <int>(x0 + <float>8.5))
            q1 = imin(15, <int>(x1 + <float>8.5))
            y[i].qs[j] = <uint8_t>(q0 | (q1 << 4))
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


cdef void row_q4_1(const float* x, block_q4_1* y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef float mn, mx, d, id, x0, x1
    cdef int q0, q1
    for i in range(nb):
        min_max(x, 32, &mn, &mx)
        d = (mx - mn) / 15
        id = <float>1.0 / d if d != 0 else <float>0.0
        y[i].d = fp16(d)
        y[i].m = fp16(mn)
        for j in range(16):
            x0 = (x[j] - mn) * id
            x1 = (x[16 + j] - mn) * id
            q0 = imin(15, <int>(x0 + <float>0.5))
            q1 = imin(15, <int>(x1 + <float>0.5))
            y[i].qs[j] = <uint8_t>(q0 | (q1 << 4))
        x += 32


cdef void row_q5_0(const float* x, block_q5_0* y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef float d, id, x0, x1
    cdef int q0, q1
    cdef uint32_t qh
    for i in range(nb):
        d = signed_amax(x, 32) / -16
        id = <float>1.0 / d if d != 0 else <float>0.0
        y[i].d = fp16(d)
        qh = 0
        for j in range(16):
            x0 = x[j] * id
            x1 = x[16 + j] * id
            q0 = imin(31, <int>(x0 + <float>16.5))
            q1 = imin(31, <int>(x1 + <float>16.5))
            y[i].qs[j] = <uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4))
            qh |= (<uint32_t>(q0 & 0x10) >> 4) << j
            qh |= (<uint32_t>(q1 & 0x10) >> 4) << (j + 16)
        memcpy(y[i].qh, &qh, 4)
        x += 32


cdef void row_q5_1(const float* x, block_q5_1* y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef float mn, mx, d, id, x0, x1
    cdef int q0, q1
    cdef uint32_t qh
    for i in range(nb):
        min_max(x, 32, &mn, &mx)
        d = (mx - mn) / 31
        id = <float>1.0 / d if d != 0 else <float>0.0
        y[i].d = fp16(d)
        y[i].m = fp16(mn)
        qh = 0
        for j in range(16):
            x0 = (x[j] - mn) * id
            x1 = (x[16 + j] - mn) * id
            # ggml has no clamp here ((max-min)/31 * 31 rounds to at most 31.5); the oracle clips, so do we.
            q0 = imin(31, <int>(x0 + <float>0.5))
            q1 = imin(31, <int>(x1 + <float>0.5))
            y[i].qs[j] = <uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4))
            qh |= (<uint32_t>(q0 & 0x10) >> 4) << j
            qh |= (<uint32_t>(q1 & 0x10) >> 4) << (j + 16)
        memcpy(y[i].qh, &qh, 4)
        x += 32


# ---------------------------------------------------------------------------------------------------------
# K-quant scale searches (ggml-quants.c)


cdef float make_qx_quants(int n, int nmax, const float* x, int8_t* L) noexcept nogil:
    # make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL): a symmetric scale, weights x^2, refined over 18
    # trial scales around nmax/max. L gets values in [0, 2*nmax).
    cdef float mx = 0, amax = 0, ax, iscale, sumlx, suml2, scale, best, w
    cdef int i, l, step
    for i in range(n):
        ax = fabsf(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return 0
    iscale = -nmax / mx
    sumlx = 0
    suml2 = 0
    for i in range(n):
        l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])))
        L[i] = <int8_t>(l + nmax)
        w = x[i] * x[i]
        sumlx += w * x[i] * l
        suml2 += w * l * l
    scale = sumlx / suml2 if suml2 != 0 else <float>0.0
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(nmax + <float>0.1 * step) / mx
        sumlx = 0
        suml2 = 0
        for i in range(n):
            l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])))
            w = x[i] * x[i]
            sumlx += w * x[i] * l
            suml2 += w * l * l
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                l = nearest_int(iscale * x[i])
                L[i] = <int8_t>(nmax + imax(-nmax, imin(nmax - 1, l)))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


cdef float make_q3_quants(int n, int nmax, const float* x, int8_t* L) noexcept nogil:
    # make_q3_quants(n, nmax, x, L, do_rmse=true): a symmetric scale, then up to 5 passes moving single
    # values to the level that most improves the weighted fit. L gets values in [0, 2*nmax).
    cdef float mx = 0, amax = 0, ax, iscale, sumlx = 0, suml2 = 0, w, slx, sl2
    cdef int i, l, new_l, itry, n_changed
    for i in range(n):
        ax = fabsf(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return 0
    iscale = -nmax / mx
    for i in range(n):
        l = imax(-nmax, imin(nmax - 1, nearest_int(iscale * x[i])))
        L[i] = <int8_t>l
        w = x[i] * x[i]
        sumlx += w * x[i] * l
        suml2 += w * l * l
    for itry in range(5):
        n_changed = 0
        for i in range(n):
            w = x[i] * x[i]
            slx = sumlx - w * x[i] * L[i]
            if slx > 0:
                sl2 = suml2 - w * L[i] * L[i]
                new_l = imax(-nmax, imin(nmax - 1, nearest_int(x[i] * sl2 / slx)))
                if new_l != L[i]:
                    slx += w * x[i] * new_l
                    sl2 += w * new_l * new_l
                    if sl2 > 0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = <int8_t>new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        L[i] = <int8_t>(L[i] + nmax)
    return sumlx / suml2 if suml2 > 0 else <float>0.0


cdef float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                            float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                            bint use_mad) noexcept nogil:
    # An asymmetric fit x ~ scale * L - the_min with L in [0, nmax]: start from the min/max grid, then try
    # nstep + 1 grid scales, solving each time for the least-squares scale and min (weighted).
    cdef float mn = x[0], mx = x[0], sum_w = weights[0], sum_x, iscale, scale, best_error = 0, diff, w
    cdef float sum_l, sum_l2, sum_xl, D, this_scale, this_min, cur_error
    cdef int i, l, step
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        w = weights[i]
        sum_w += w
        sum_x += w * x[i]
    if mn > 0:
        mn = 0
    if mx == mn:
        for i in range(n):
            L[i] = 0
        the_min[0] = -mn
        return 0
    iscale = nmax / (mx - mn)
    scale = <float>1.0 / iscale
    for i in range(n):
        l = nearest_int(iscale * (x[i] - mn))
        L[i] = <uint8_t>imax(0, imin(nmax, l))
        diff = scale * L[i] + mn - x[i]
        diff = fabsf(diff) if use_mad else diff * diff
        best_error += weights[i] * diff
    if nstep < 1:
        the_min[0] = -mn
        return scale
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * step + nmax) / (mx - mn)
        sum_l = 0
        sum_l2 = 0
        sum_xl = 0
        for i in range(n):
            l = imax(0, imin(nmax, nearest_int(iscale * (x[i] - mn))))
            Laux[i] = <uint8_t>l
            w = weights[i]
            sum_l += w * l
            sum_l2 += w * l * l
            sum_xl += w * l * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = 0
                this_scale = sum_xl / sum_l2
            cur_error = 0
            for i in range(n):
                diff = this_scale * Laux[i] + this_min - x[i]
                diff = fabsf(diff) if use_mad else diff * diff
                cur_error += weights[i] * diff
            if cur_error < best_error:
                for i in range(n):
                    L[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    the_min[0] = -mn
    return scale


cdef inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) noexcept nogil:
    if j < 4:
        d[0] = q[j] & 63
        m[0] = q[j + 4] & 63
    else:
        d[0] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)
        m[0] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


# ---------------------------------------------------------------------------------------------------------
# The same scale searches for 8 sub-blocks at once (the speed path).
#
# The scalar searches are latency-bound chains of float additions that cannot be reordered without changing
# the result. Independent sub-blocks can run side by side, though: lane k below is sub-block k, and every
# lane performs exactly the scalar function's float operations in the same order, with its branches turned
# into selects. Results are therefore bit-identical (tests/test_quantize.py compares both paths), and each
# `for k in range(LANES)` loop over a transposed [value][lane] array compiles to one AVX2 operation.

cdef enum:
    LANES = 8


cdef void make_qkx2_quants_x8(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                              float* scale_out, float* min_out, float rmin, float rdelta, int nstep,
                              bint use_mad) noexcept nogil:
    """make_qkx2_quants on the 8 sub-blocks x[k*n : (k+1)*n] (n <= 32); L, scale_out, min_out per lane."""
    cdef float X[32 * LANES]
    cdef float W[32 * LANES]
    cdef int32_t Lq[32 * LANES]
    cdef int32_t La[32 * LANES]
    cdef float mn[LANES]
    cdef float mn0[LANES]
    cdef float mx[LANES]
    cdef float span[LANES]
    cdef float sum_w[LANES]
    cdef float sum_x[LANES]
    cdef float iscale[LANES]
    cdef float scale[LANES]
    cdef float best[LANES]
    cdef float sum_l[LANES]
    cdef float sum_l2[LANES]
    cdef float sum_xl[LANES]
    cdef float D[LANES]
    cdef float ts[LANES]
    cdef float tm[LANES]
    cdef float err[LANES]
    cdef int32_t upd[LANES]
    cdef int i, k, l, step
    cdef float v, w, diff, num
    for i in range(n):
        for k in range(LANES):
            X[i * LANES + k] = x[k * n + i]
            W[i * LANES + k] = weights[k * n + i]
    for k in range(LANES):
        mn[k] = X[k]
        mx[k] = X[k]
        sum_w[k] = W[k]
        sum_x[k] = sum_w[k] * X[k]
    for i in range(1, n):
        for k in range(LANES):
            v = X[i * LANES + k]
            mn[k] = v if v < mn[k] else mn[k]
            mx[k] = v if v > mx[k] else mx[k]
            sum_w[k] += W[i * LANES + k]
            sum_x[k] += W[i * LANES + k] * v
    for k in range(LANES):
        mn[k] = <float>0.0 if mn[k] > 0 else mn[k]
        mn0[k] = mn[k]
        span[k] = mx[k] - mn[k]  # 0: a flat sub-block, finished below as the scalar code returns early
        iscale[k] = nmax / span[k]
        scale[k] = <float>1.0 / iscale[k]
        best[k] = 0
    for i in range(n):
        for k in range(LANES):
            l = imax(0, imin(nmax, nearest_int(iscale[k] * (X[i * LANES + k] - mn[k]))))
            Lq[i * LANES + k] = l
            diff = scale[k] * l + mn[k] - X[i * LANES + k]
            diff = fabsf(diff) if use_mad else diff * diff
            best[k] += W[i * LANES + k] * diff
    if nstep >= 1:
        for step in range(nstep + 1):
            num = rmin + rdelta * step + nmax
            for k in range(LANES):
                iscale[k] = num / (mx[k] - mn[k])  # mn moves with each improvement, as in ggml
                sum_l[k] = 0
                sum_l2[k] = 0
                sum_xl[k] = 0
            for i in range(n):
                for k in range(LANES):
                    l = imax(0, imin(nmax, nearest_int(iscale[k] * (X[i * LANES + k] - mn[k]))))
                    La[i * LANES + k] = l
                    w = W[i * LANES + k]
                    sum_l[k] += w * l
                    sum_l2[k] += w * l * l
                    sum_xl[k] += w * l * X[i * LANES + k]
            for k in range(LANES):
                D[k] = sum_w[k] * sum_l2[k] - sum_l[k] * sum_l[k]
                ts[k] = (sum_w[k] * sum_xl[k] - sum_x[k] * sum_l[k]) / D[k]
                tm[k] = (sum_l2[k] * sum_x[k] - sum_l[k] * sum_xl[k]) / D[k]
                ts[k] = sum_xl[k] / sum_l2[k] if tm[k] > 0 else ts[k]
                tm[k] = <float>0.0 if tm[k] > 0 else tm[k]
                err[k] = 0
            for i in range(n):
                for k in range(LANES):
                    diff = ts[k] * La[i * LANES + k] + tm[k] - X[i * LANES + k]
                    diff = fabsf(diff) if use_mad else diff * diff
                    err[k] += W[i * LANES + k] * diff
            for k in range(LANES):
                upd[k] = D[k] > 0 and err[k] < best[k]
                best[k] = err[k] if upd[k] else best[k]
                scale[k] = ts[k] if upd[k] else scale[k]
                mn[k] = tm[k] if upd[k] else mn[k]
            for i in range(n):
                for k in range(LANES):
                    Lq[i * LANES + k] = La[i * LANES + k] if upd[k] else Lq[i * LANES + k]
    for k in range(LANES):
        if span[k] == 0:
            scale_out[k] = 0
            min_out[k] = -mn0[k]
        else:
            scale_out[k] = scale[k]
            min_out[k] = -mn[k]
        for i in range(n):
            L[k * n + i] = <uint8_t>(0 if span[k] == 0 else Lq[i * LANES + k])


cdef void make_qx_quants_x8(int n, int nmax, const float* x, int8_t* L, float* scale_out) noexcept nogil:
    """make_qx_quants(rmse_type=1, no weights) on the 8 sub-blocks x[k*n : (k+1)*n] (n <= 16)."""
    cdef float X[16 * LANES]
    cdef int32_t Lq[16 * LANES]
    cdef int32_t La[16 * LANES]
    cdef float mx[LANES]
    cdef float amax[LANES]
    cdef float iscale[LANES]
    cdef float sumlx[LANES]
    cdef float suml2[LANES]
    cdef float scale[LANES]
    cdef float best[LANES]
    cdef int32_t upd[LANES]
    cdef int i, k, l, step
    cdef float v, w
    cdef bint zero
    for i in range(n):
        for k in range(LANES):
            X[i * LANES + k] = x[k * n + i]
    for k in range(LANES):
        mx[k] = 0
        amax[k] = 0
    for i in range(n):
        for k in range(LANES):
            v = X[i * LANES + k]
            upd[k] = fabsf(v) > amax[k]
            amax[k] = fabsf(v) if upd[k] else amax[k]
            mx[k] = v if upd[k] else mx[k]
    for step in range(-10, 10):  # -10: the first fit at nmax/max; then the 18 trial scales
        if step == 0:
            continue
        for k in range(LANES):
            if step == -10:
                iscale[k] = -nmax / mx[k]
            else:
                iscale[k] = -(nmax + <float>0.1 * step) / mx[k]
            sumlx[k] = 0
            suml2[k] = 0
        for i in range(n):
            for k in range(LANES):
                v = X[i * LANES + k]
                l = imax(-nmax, imin(nmax - 1, nearest_int(iscale[k] * v)))
                La[i * LANES + k] = l
                w = v * v
                sumlx[k] += w * v * l
                suml2[k] += w * l * l
        for k in range(LANES):
            if step == -10:
                upd[k] = 1
                scale[k] = sumlx[k] / suml2[k] if suml2[k] != 0 else <float>0.0
                best[k] = scale[k] * sumlx[k]
            else:
                upd[k] = suml2[k] > 0 and sumlx[k] * sumlx[k] > best[k] * suml2[k]
                scale[k] = sumlx[k] / suml2[k] if upd[k] else scale[k]
                best[k] = scale[k] * sumlx[k] if upd[k] else best[k]
        for i in range(n):
            for k in range(LANES):
                Lq[i * LANES + k] = La[i * LANES + k] if upd[k] else Lq[i * LANES + k]
    for k in range(LANES):
        zero = amax[k] < GROUP_MAX_EPS
        scale_out[k] = <float>0.0 if zero else scale[k]
        for i in range(n):
            L[k * n + i] = <int8_t>(0 if zero else Lq[i * LANES + k] + nmax)


# ---------------------------------------------------------------------------------------------------------
# K-quants (quantize_row_q{2,3,4,5,6}_K_ref): super-blocks of 256 values


cdef inline void pack_2bit(const uint8_t* L, uint8_t* qs) noexcept nogil:
    # Q2_K / Q3_K low bits: byte l of each 32-byte half holds values l, l+32, l+64, l+96 of its 128.
    cdef int j, l
    for j in range(0, QK_K, 128):
        for l in range(32):
            qs[j // 4 + l] = <uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4)
                                       | (L[j + l + 96] << 6))


cdef void row_q2_K(const float* x, block_q2_K* y, Py_ssize_t nb, bint lanes) noexcept nogil:
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


cdef void row_q3_K(const float* x, block_q3_K* y, Py_ssize_t nb) noexcept nogil:
    cdef int8_t L[QK_K]
    cdef float scales[16]
    cdef Py_ssize_t i
    cdef int j, l, ii, m
    cdef int8_t sc, li
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
            if j < 8:
                sc = y[i].scales[j] & 0xF
            else:
                sc = y[i].scales[j - 8] >> 4
            sc = <int8_t>((sc | (((y[i].scales[8 + j % 4] >> (2 * (j // 4))) & 3) << 4)) - 32)
            d = fp32(y[i].d) * sc
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
    # 8 six-bit scales and mins into 12 bytes (the inverse of get_scale_min_k4).
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
        get_scale_min_k4(j, packed, &sc, &m)
        d = fp32(d16) * sc
        if d == 0:
            continue
        dm = fp32(dmin16) * m
        for ii in range(32):
            l = nearest_int((x[32 * j + ii] + dm) / d)
            L[32 * j + ii] = <uint8_t>imax(0, imin(nmax, l))


cdef void row_q4_K(const float* x, block_q4_K* y, Py_ssize_t nb, bint lanes) noexcept nogil:
    cdef uint8_t L[QK_K]
    cdef float mins[8]
    cdef float scales[8]
    cdef float max_scale, max_min, inv_scale, inv_min
    cdef Py_ssize_t i
    cdef int j, l
    cdef uint8_t* q
    for i in range(nb):
        fit_k4(x, L, scales, mins, &max_scale, &max_min, 15, <float>-1.0, <float>0.1, 20, lanes)
        inv_scale = <float>63.0 / max_scale if max_scale > 0 else <float>0.0
        inv_min = <float>63.0 / max_min if max_min > 0 else <float>0.0
        pack_scales_k4(y[i].scales, scales, mins, inv_scale, inv_min)
        y[i].d = fp16(max_scale / <float>63.0)
        y[i].dmin = fp16(max_min / <float>63.0)
        requantize_k4(x, L, y[i].scales, y[i].d, y[i].dmin, 15)
        q = y[i].qs
        for j in range(0, QK_K, 64):
            for l in range(32):
                q[l] = <uint8_t>(L[j + l] | (L[j + l + 32] << 4))
            q += 32
        x += QK_K


cdef void row_q5_K(const float* x, block_q5_K* y, Py_ssize_t nb, bint lanes) noexcept nogil:
    cdef uint8_t L[QK_K]
    cdef float mins[8]
    cdef float scales[8]
    cdef float max_scale, max_min, inv_scale, inv_min
    cdef Py_ssize_t i
    cdef int j, n, l1, l2
    cdef uint8_t m1, m2
    cdef uint8_t* ql
    cdef uint8_t* qh
    for i in range(nb):
        fit_k4(x, L, scales, mins, &max_scale, &max_min, 31, <float>-0.5, <float>0.1, 15, lanes)
        inv_scale = <float>63.0 / max_scale if max_scale > 0 else <float>0.0
        inv_min = <float>63.0 / max_min if max_min > 0 else <float>0.0
        pack_scales_k4(y[i].scales, scales, mins, inv_scale, inv_min)
        y[i].d = fp16(max_scale / <float>63.0)
        y[i].dmin = fp16(max_min / <float>63.0)
        requantize_k4(x, L, y[i].scales, y[i].d, y[i].dmin, 31)
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


cdef void row_q6_K(const float* x, block_q6_K* y, Py_ssize_t nb, bint lanes) noexcept nogil:
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


# ---------------------------------------------------------------------------------------------------------
# Dispatch


cdef bint can_quantize(int wtype) noexcept nogil:
    return (wtype == T_F32 or wtype == T_F16 or wtype == T_BF16 or wtype == T_Q8_0 or wtype == T_Q4_0
            or wtype == T_Q4_1 or wtype == T_Q5_0 or wtype == T_Q5_1 or wtype == T_Q2_K
            or wtype == T_Q3_K or wtype == T_Q4_K or wtype == T_Q5_K or wtype == T_Q6_K)


cdef void quantize_row(int wtype, const float* x, uint8_t* out, Py_ssize_t n, bint lanes) noexcept nogil:
    """One row of n values (a whole number of blocks) into `out` (row_bytes(wtype, n) bytes). `lanes`:
    the K-quant scale searches 8 sub-blocks at a time (same bytes, faster)."""
    if wtype == T_F32:
        memcpy(out, x, n * sizeof(float))
    elif wtype == T_F16:
        row_f16(x, <uint16_t*>out, n)
    elif wtype == T_BF16:
        row_bf16(x, <uint16_t*>out, n)
    elif wtype == T_Q8_0:
        row_q8_0(x, <block_q8_0*>out, n // 32)
    elif wtype == T_Q4_0:
        row_q4_0(x, <block_q4_0*>out, n // 32)
    elif wtype == T_Q4_1:
        row_q4_1(x, <block_q4_1*>out, n // 32)
    elif wtype == T_Q5_0:
        row_q5_0(x, <block_q5_0*>out, n // 32)
    elif wtype == T_Q5_1:
        row_q5_1(x, <block_q5_1*>out, n // 32)
    elif wtype == T_Q2_K:
        row_q2_K(x, <block_q2_K*>out, n // QK_K, lanes)
    elif wtype == T_Q3_K:
        row_q3_K(x, <block_q3_K*>out, n // QK_K)
    elif wtype == T_Q4_K:
        row_q4_K(x, <block_q4_K*>out, n // QK_K, lanes)
    elif wtype == T_Q5_K:
        row_q5_K(x, <block_q5_K*>out, n // QK_K, lanes)
    elif wtype == T_Q6_K:
        row_q6_K(x, <block_q6_K*>out, n // QK_K, lanes)


# ---------------------------------------------------------------------------------------------------------
# Python surface. Shapes and sizes are checked here, before any raw pointer is touched.

QUANTIZE_TYPES = frozenset(
    t for t in (T_F32, T_F16, T_BF16, T_Q8_0, T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K,
                T_Q6_K)
)


cdef Py_ssize_t _row_bytes(int wtype, Py_ssize_t cols) except -1:
    cdef Py_ssize_t qk = weight_block_values(wtype)
    if qk == 0:
        raise ValueError(f"unsupported weight type {wtype}")
    if cols <= 0 or cols % qk:
        raise ValueError(f"rows of type {wtype} need a positive multiple of {qk} values, got {cols}")
    return cols // qk * weight_block_bytes(wtype)


def row_bytes(int wtype, Py_ssize_t cols):
    """Bytes of one stored row of `cols` values of type `wtype`."""
    return int(_row_bytes(wtype, cols))


cdef int _threads(int n_threads, Py_ssize_t work):
    # `work` in units of ~1 ns. Below ~1 ms per thread, starting and joining the threads costs more than it
    # saves (and on a busy machine, a descheduled thread stalls the whole region at its barrier).
    cdef int nt = n_threads if n_threads > 0 else openmp.omp_get_max_threads()
    cdef Py_ssize_t useful = work // 1000000
    return <int>max(1, min(<Py_ssize_t>nt, useful))


cdef bint _is_k_quant(int wtype) noexcept nogil:
    return weight_block_values(wtype) == QK_K


def quantize(int wtype, x, out=None, int n_threads=0, impl="auto"):
    """Quantize float rows x[..., cols] to type `wtype` as ggml's reference quantizer does.

    Returns (or fills `out`, a C-contiguous uint8 array of the right size) the stored bytes as
    uint8[rows, row_bytes], rows = product of the leading dimensions (a 1-D x is one row).
    n_threads <= 0: OpenMP's default. impl: "auto" (K-quant searches 8 sub-blocks at a time) or "scalar"
    (one at a time, as ggml's code reads; for the tests: both give the same bytes).
    """
    if impl not in ("auto", "scalar"):
        raise ValueError(f"impl must be 'auto' or 'scalar', got {impl!r}")
    cdef bint lanes = impl == "auto"
    if not can_quantize(wtype):
        raise ValueError(f"cannot quantize to weight type {wtype}")
    arr = np.ascontiguousarray(x, dtype=np.float32)
    if arr.ndim == 0:
        raise ValueError("x must have at least one dimension")
    cdef Py_ssize_t cols = arr.shape[arr.ndim - 1]
    cdef Py_ssize_t rows = arr.size // cols if cols else 0
    cdef Py_ssize_t rb = _row_bytes(wtype, cols)
    if out is None:
        out = np.empty((rows, rb), dtype=np.uint8)
    elif not (isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.flags.c_contiguous
              and out.size == rows * rb and out.flags.writeable):
        raise ValueError(f"out must be a writable C-contiguous uint8 array of {rows * rb} bytes")
    if rows == 0:
        return out
    cdef const float[:, ::1] xv = arr.reshape(rows, cols)
    cdef uint8_t[::1] ov = out.reshape(-1)
    cdef const float* xp = &xv[0, 0]
    cdef uint8_t* op = &ov[0]
    # A K-quant value costs ~50x a legacy one (the scale searches).
    cdef int nt = _threads(n_threads, rows * cols * (50 if _is_k_quant(wtype) else 1))
    # Enough rows per chunk to amortise scheduling (~16k values), few enough to balance the threads.
    cdef Py_ssize_t chunk = max(1, 16384 // cols)
    cdef Py_ssize_t r
    with nogil:
        if rows == 1 or nt == 1:
            for r in range(rows):
                quantize_row(wtype, xp + r * cols, op + r * rb, cols, lanes)
        else:
            for r in prange(rows, schedule="dynamic", chunksize=chunk, num_threads=nt):
                quantize_row(wtype, xp + r * cols, op + r * rb, cols, lanes)
    return out


def dequantize(int wtype, data, shape, int n_threads=0):
    """Stored rows of type `wtype` -> float32 of `shape` (last axis = values per row); rows in parallel.

    The multi-threaded twin of llamacy.kernels.quant.dequantize (the same row kernels)."""
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(f"bad shape {shape}")
    cdef Py_ssize_t cols = shape[len(shape) - 1]
    cdef Py_ssize_t rb = _row_bytes(wtype, cols)
    cdef Py_ssize_t rows = 1
    for s in shape[:len(shape) - 1]:
        rows *= s
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if raw.shape[0] != rows * rb:
        raise ValueError(f"{rows} rows of {cols} values of type {wtype} need {rows * rb} bytes, "
                         f"got {raw.shape[0]}")
    out = np.empty((rows, cols), dtype=np.float32)
    cdef const uint8_t[::1] rv = raw
    cdef float[:, ::1] ov = out
    cdef const uint8_t* rp = &rv[0]
    cdef float* op = &ov[0, 0]
    cdef int nt = _threads(n_threads, rows * cols)
    cdef Py_ssize_t chunk = max(1, 65536 // cols)
    cdef Py_ssize_t r
    with nogil:
        if rows == 1 or nt == 1:
            for r in range(rows):
                dequantize_row(wtype, rp + r * rb, op + r * cols, cols)
        else:
            for r in prange(rows, schedule="static", chunksize=chunk, num_threads=nt):
                dequantize_row(wtype, rp + r * rb, op + r * cols, cols)
    return out.reshape(shape)
