# Activation quantization (floats -> ACT_Q8A / ACT_Q8K blocks) and weight row dequantization (the traits
# table's to_float, dequant.pyx).
#
# Activations are quantized once per matrix product, so this is not the hot loop; it must however be
# exact: the SIMD and scalar quantizers give identical bytes (same float operations in the same order,
# round-half-to-even in both), and dequantize_row matches the gguf package's numpy dequantizer bit for bit.
from libc.math cimport fabsf, nearbyintf
from libc.stdint cimport int8_t, int16_t, int32_t, uint8_t, uint16_t, uint32_t
from libc.string cimport memcpy, memset

import numpy as np

from llamacy.kernels.blocks cimport *
from llamacy.kernels.simd cimport *
from llamacy.kernels.traits cimport type_traits, type_traits_of, unknown_type

from llamacy.kernels.traits import row_bytes, traits

# ---------------------------------------------------------------------------------------------------------
# Activation formats: values and bytes per block (blocks.pxd's ACT_*, in that order).

cdef Py_ssize_t ACT_BLOCK_VALUES[N_ACT_FORMATS]
cdef Py_ssize_t ACT_BLOCK_BYTES[N_ACT_FORMATS]
ACT_BLOCK_VALUES[:] = [1, 32, QK_K]
ACT_BLOCK_BYTES[:] = [sizeof(float), sizeof(block_q8a), sizeof(block_q8k)]


cdef int act_format(int wtype) noexcept nogil:
    cdef const type_traits* tt = type_traits_of(wtype)
    return -1 if tt == NULL else tt.act


cdef Py_ssize_t act_row_bytes(int wtype, Py_ssize_t cols) noexcept nogil:
    cdef int fmt = act_format(wtype)
    if fmt < 0:
        return 0
    return cols // ACT_BLOCK_VALUES[fmt] * ACT_BLOCK_BYTES[fmt]


# ---------------------------------------------------------------------------------------------------------
# Activation quantization. Both formats use the q8_0 rule: d = amax/127, q = round_half_even(x * (127/amax)).
# (ggml's q8_K uses -127/max of the signed extreme; any symmetric rule works for the dot products and one
# rule for both formats keeps the SIMD and scalar twins bit-identical regardless of the order of maxima.)


cdef inline float amax_scalar(const float* x, Py_ssize_t n) noexcept nogil:
    cdef float m = 0.0
    cdef Py_ssize_t j
    for j in range(n):
        if fabsf(x[j]) > m:
            m = fabsf(x[j])
    return m


# Quantize n values with the inverse scale `iscale` into qs; returns the sum of the quants.
cdef inline int32_t quant_scalar(const float* x, float iscale, int8_t* qs, Py_ssize_t n) noexcept nogil:
    cdef int32_t s = 0
    cdef int32_t q
    cdef Py_ssize_t j
    for j in range(n):
        q = <int32_t>nearbyintf(x[j] * iscale)
        qs[j] = <int8_t>q
        s += q
    return s


cdef inline float amax_simd(const float* x, Py_ssize_t n) noexcept nogil:
    # n is a multiple of 32: 4 independent max chains
    cdef __m256 sign = _mm256_set1_ps(-0.0)
    cdef __m256 m0 = _mm256_setzero_ps()
    cdef __m256 m1 = _mm256_setzero_ps()
    cdef __m256 m2 = _mm256_setzero_ps()
    cdef __m256 m3 = _mm256_setzero_ps()
    cdef Py_ssize_t j
    for j in range(0, n, 32):
        m0 = _mm256_max_ps(m0, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)))
        m1 = _mm256_max_ps(m1, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j + 8)))
        m2 = _mm256_max_ps(m2, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j + 16)))
        m3 = _mm256_max_ps(m3, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j + 24)))
    return hmax8(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)))


# 32 values -> 32 int8 with inverse scale iscale; returns the sum of the quants.
cdef inline int32_t quant32_simd(const float* x, float iscale, int8_t* qs) noexcept nogil:
    cdef __m256 mul = _mm256_set1_ps(iscale)
    cdef int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC
    cdef __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x), mul), mode))
    cdef __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8), mul), mode))
    cdef __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 16), mul), mode))
    cdef __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 24), mul), mode))
    cdef int32_t s = hsum8_epi32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)))
    # packs work within 128-bit lanes: the result is in dword order 0 4 1 5 2 6 3 7, permute it back
    i0 = _mm256_packs_epi32(i0, i1)
    i2 = _mm256_packs_epi32(i2, i3)
    i0 = _mm256_packs_epi16(i0, i2)
    i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    _mm256_storeu_si256(<__m256i*>qs, i0)
    return s


cdef void quantize_row_q8a(const float* x, block_q8a* y, Py_ssize_t nb, bint simd) noexcept nogil:
    cdef Py_ssize_t i
    cdef float amax, d, iscale
    cdef int32_t s
    for i in range(nb):
        amax = amax_simd(x, 32) if simd else amax_scalar(x, 32)
        d = amax / 127.0
        iscale = 127.0 / amax if amax != 0.0 else 0.0
        s = quant32_simd(x, iscale, y.qs) if simd else quant_scalar(x, iscale, y.qs, 32)
        y.d = d
        y.s = d * <float>s
        x += 32
        y += 1


cdef void quantize_row_q8k(const float* x, block_q8k* y, Py_ssize_t nb, bint simd) noexcept nogil:
    cdef Py_ssize_t i, j, k
    cdef float amax, iscale
    cdef int32_t s
    for i in range(nb):
        amax = amax_simd(x, QK_K) if simd else amax_scalar(x, QK_K)
        iscale = 127.0 / amax if amax != 0.0 else 0.0
        for j in range(0, QK_K, 32):
            if simd:
                quant32_simd(x + j, iscale, y.qs + j)
            else:
                quant_scalar(x + j, iscale, y.qs + j, 32)
        for j in range(16):
            s = 0
            for k in range(16):
                s += y.qs[16 * j + k]
            y.bsums[j] = <int16_t>s
        y.d = amax / 127.0
        x += QK_K
        y += 1


cdef void quantize_act_row_impl(int wtype, const float* x, void* out, Py_ssize_t cols,
                                int impl) noexcept nogil:
    cdef bint simd = impl == IMPL_SIMD or (impl == IMPL_AUTO and HAVE_SIMD)
    cdef int fmt = act_format(wtype)
    if fmt < 0:
        unknown_type(b"quantize_act_row", wtype)
    elif fmt == ACT_F32:
        memcpy(out, x, cols * sizeof(float))
    elif fmt == ACT_Q8A:
        quantize_row_q8a(x, <block_q8a*>out, cols // 32, simd)
    elif fmt == ACT_Q8K:
        quantize_row_q8k(x, <block_q8k*>out, cols // QK_K, simd)


cdef void quantize_act_row(int wtype, const float* x, void* out, Py_ssize_t cols) noexcept nogil:
    quantize_act_row_impl(wtype, x, out, cols, IMPL_AUTO)


cdef void dequantize_row(int wtype, const uint8_t* src, float* dst, Py_ssize_t cols) noexcept nogil:
    cdef const type_traits* tt = type_traits_of(wtype)
    if tt == NULL:
        unknown_type(b"dequantize_row", wtype)
    tt.to_float(src, dst, cols)


# ---------------------------------------------------------------------------------------------------------
# Python surface (tests, Python callers). Sizes are checked here, before any raw pointer is touched.

_IMPLS = {"auto": IMPL_AUTO, "simd": IMPL_SIMD, "scalar": IMPL_SCALAR}


def simd_build():
    """True if this module was compiled with AVX2/FMA/F16C (the SIMD build)."""
    return bool(HAVE_SIMD)


def impl_code(impl):
    """The IMPL_* code for "auto" | "simd" | "scalar"."""
    try:
        return _IMPLS[impl]
    except (KeyError, TypeError):
        raise ValueError(f"impl must be one of {sorted(_IMPLS)}, got {impl!r}") from None


def supported(int wtype):
    """True if the kernels compute with weight type `wtype`."""
    return act_format(wtype) >= 0


def block_layout(int wtype):
    """(values per block, bytes per block) of a supported weight type."""
    t = traits(wtype)
    return t["block_values"], t["block_bytes"]


def act_format_py(int wtype):
    """ACT_F32 (0), ACT_Q8A (1) or ACT_Q8K (2): the activation format `wtype` multiplies with; -1 if none."""
    return act_format(wtype)


def act_row_bytes_py(int wtype, Py_ssize_t cols):
    """Bytes of one quantized activation row of `cols` values for weight type `wtype`."""
    row_bytes(wtype, cols)
    return int(act_row_bytes(wtype, cols))


def act_layout(int fmt):
    """(values per block, bytes per block) of activation format `fmt` (ACT_F32, ACT_Q8A, ACT_Q8K)."""
    if not 0 <= fmt < N_ACT_FORMATS:
        raise ValueError(f"no activation format {fmt}")
    return int(ACT_BLOCK_VALUES[fmt]), int(ACT_BLOCK_BYTES[fmt])


def quantize_act(int wtype, x, impl="auto"):
    """Quantize float rows x[n, cols] (or one row x[cols]) into the activation format of `wtype`.

    Returns uint8[n, act_row_bytes] (or uint8[act_row_bytes] for one row).
    """
    cdef int code = impl_code(impl)
    arr = np.ascontiguousarray(x, dtype=np.float32)
    if arr.ndim not in (1, 2):
        raise ValueError(f"x must be 1-D or 2-D, got shape {arr.shape}")
    one = arr.ndim == 1
    if one:
        arr = arr.reshape(1, -1)
    cdef Py_ssize_t n = arr.shape[0], cols = arr.shape[1], i
    row_bytes(wtype, cols)
    cdef Py_ssize_t rb = act_row_bytes(wtype, cols)
    out = np.empty((n, rb), dtype=np.uint8)
    if n == 0:
        return out
    cdef const float[:, ::1] xv = arr
    cdef uint8_t[:, ::1] ov = out
    with nogil:
        for i in range(n):
            quantize_act_row_impl(wtype, &xv[i, 0], &ov[i, 0], cols, code)
    return out[0] if one else out
