# ggml's K-quant scale searches (qsearch.pyx) and the small exact helpers the weight quantizers share.
#
# Exactness rules (see quantize.pyx): every float constant a C float (`<float>8.5`), no FMA contraction
# (setup.py builds these modules with -ffp-contract=off), fp16 conversions rounding to nearest even.
from libc.math cimport fabsf
from libc.stdint cimport int8_t, int32_t, uint8_t, uint16_t
from libc.string cimport memcpy

from llamacy.kernels.simd cimport _cvtsh_ss, _cvtss_sh

cdef extern from *:
    """
    /* GROUP_MAX_EPS in ggml-quants.c: a group whose largest |x| is below this is all zero. */
    #define LC_GROUP_MAX_EPS 1e-15f
    """
    const float GROUP_MAX_EPS "LC_GROUP_MAX_EPS"

cdef enum:
    LANES = 8  # sub-blocks searched side by side by the _x8 searches


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


# The value of largest magnitude, sign kept (the first one on ties); its magnitude into amax.
cdef inline float signed_amax(const float* x, int n, float* amax) noexcept nogil:
    cdef float a = 0, mx = 0, ax
    cdef int j
    for j in range(n):
        ax = fabsf(x[j])
        if ax > a:
            a = ax
            mx = x[j]
    amax[0] = a
    return mx


# make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL): L in [0, 2*nmax); returns the scale.
cdef float make_qx_quants(int n, int nmax, const float* x, int8_t* L) noexcept nogil
# make_q3_quants(n, nmax, x, L, do_rmse=true): L in [0, 2*nmax); returns the scale.
cdef float make_q3_quants(int n, int nmax, const float* x, int8_t* L) noexcept nogil
# make_qkx2_quants: x ~ scale * L - the_min with L in [0, nmax]; returns the scale.
cdef float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                            float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                            bint use_mad) noexcept nogil
# The same searches on 8 sub-blocks x[k*n : (k+1)*n] at once, bit-identical per lane.
cdef void make_qkx2_quants_x8(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                              float* scale_out, float* min_out, float rmin, float rdelta, int nstep,
                              bint use_mad) noexcept nogil
cdef void make_qx_quants_x8(int n, int nmax, const float* x, int8_t* L, float* scale_out) noexcept nogil
