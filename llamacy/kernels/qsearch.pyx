# ggml's K-quant scale searches (ggml-quants.c), for the weight quantizers of quantize_rows.pyx: the scalar
# functions as ggml's code reads, and the same searches for 8 sub-blocks at once (the speed path).
from libc.math cimport fabsf

cdef float make_qx_quants(int n, int nmax, const float* x, int8_t* L) noexcept nogil:
    # make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL): a symmetric scale, weights x^2, refined over 18
    # trial scales around nmax/max. L gets values in [0, 2*nmax).
    cdef float amax, iscale, sumlx, suml2, scale, best, w
    cdef float mx = signed_amax(x, n, &amax)
    cdef int i, l, step
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
    cdef float amax, iscale, sumlx = 0, suml2 = 0, w, slx, sl2
    cdef float mx = signed_amax(x, n, &amax)
    cdef int i, l, new_l, itry, n_changed
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


# ---------------------------------------------------------------------------------------------------------
# The same scale searches for 8 sub-blocks at once (the speed path).
#
# The scalar searches are latency-bound chains of float additions that cannot be reordered without changing
# the result. Independent sub-blocks can run side by side, though: lane k below is sub-block k, and every
# lane performs exactly the scalar function's float operations in the same order, with its branches turned
# into selects. Results are therefore bit-identical (tests/test_quantize.py compares both paths), and each
# `for k in range(LANES)` loop over a transposed [value][lane] array compiles to one AVX2 operation.

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
