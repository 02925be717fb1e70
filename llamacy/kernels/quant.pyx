# Activation quantization (floats -> ACT_Q8A / ACT_Q8K blocks) and weight row dequantization.
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

# ---------------------------------------------------------------------------------------------------------
# Type tables


cdef Py_ssize_t weight_block_values(int wtype) noexcept nogil:
    if wtype == T_F32 or wtype == T_F16 or wtype == T_BF16:
        return 1
    if (wtype == T_Q4_0 or wtype == T_Q4_1 or wtype == T_Q5_0 or wtype == T_Q5_1
            or wtype == T_Q8_0):
        return 32
    if (wtype == T_Q2_K or wtype == T_Q3_K or wtype == T_Q4_K or wtype == T_Q5_K
            or wtype == T_Q6_K):
        return QK_K
    return 0


cdef Py_ssize_t weight_block_bytes(int wtype) noexcept nogil:
    if wtype == T_F32:
        return 4
    if wtype == T_F16:
        return sizeof(block_f16)
    if wtype == T_BF16:
        return sizeof(block_bf16)
    if wtype == T_Q4_0:
        return sizeof(block_q4_0)
    if wtype == T_Q4_1:
        return sizeof(block_q4_1)
    if wtype == T_Q5_0:
        return sizeof(block_q5_0)
    if wtype == T_Q5_1:
        return sizeof(block_q5_1)
    if wtype == T_Q8_0:
        return sizeof(block_q8_0)
    if wtype == T_Q2_K:
        return sizeof(block_q2_K)
    if wtype == T_Q3_K:
        return sizeof(block_q3_K)
    if wtype == T_Q4_K:
        return sizeof(block_q4_K)
    if wtype == T_Q5_K:
        return sizeof(block_q5_K)
    if wtype == T_Q6_K:
        return sizeof(block_q6_K)
    return 0


cdef int act_format(int wtype) noexcept nogil:
    cdef Py_ssize_t qk = weight_block_values(wtype)
    if qk == 1:
        return ACT_F32
    if qk == 32:
        return ACT_Q8A
    if qk == QK_K:
        return ACT_Q8K
    return -1


cdef Py_ssize_t act_row_bytes(int wtype, Py_ssize_t cols) noexcept nogil:
    cdef int fmt = act_format(wtype)
    if fmt == ACT_F32:
        return cols * sizeof(float)
    if fmt == ACT_Q8A:
        return cols // 32 * sizeof(block_q8a)
    if fmt == ACT_Q8K:
        return cols // QK_K * sizeof(block_q8k)
    return 0


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
    if fmt == ACT_F32:
        memcpy(out, x, cols * sizeof(float))
    elif fmt == ACT_Q8A:
        quantize_row_q8a(x, <block_q8a*>out, cols // 32, simd)
    elif fmt == ACT_Q8K:
        quantize_row_q8k(x, <block_q8k*>out, cols // QK_K, simd)


cdef void quantize_act_row(int wtype, const float* x, void* out, Py_ssize_t cols) noexcept nogil:
    quantize_act_row_impl(wtype, x, out, cols, IMPL_AUTO)


# ---------------------------------------------------------------------------------------------------------
# Row dequantization, bit-exact with gguf.quants.dequantize (numpy float32: products and sums rounded
# separately, hence lc_no_contract where a product feeds an add).


cdef inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) noexcept nogil:
    if j < 4:
        sc[0] = q[j] & 63
        m[0] = q[j + 4] & 63
    else:
        sc[0] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)
        m[0] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


cdef void deq_q4_0(const block_q4_0* b, float* y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef float d
    for i in range(nb):
        d = fp16(b[i].d)
        for j in range(16):
            y[j] = d * <float>((b[i].qs[j] & 0xF) - 8)
            y[j + 16] = d * <float>((b[i].qs[j] >> 4) - 8)
        y += 32


cdef void deq_q4_1(const block_q4_1* b, float* y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef float d, m
    for i in range(nb):
        d = fp16(b[i].d)
        m = fp16(b[i].m)
        for j in range(16):
            y[j] = lc_no_contract(d * <float>(b[i].qs[j] & 0xF)) + m
            y[j + 16] = lc_no_contract(d * <float>(b[i].qs[j] >> 4)) + m
        y += 32


cdef void deq_q5_0(const block_q5_0* b, float* y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef float d
    cdef uint32_t qh
    for i in range(nb):
        d = fp16(b[i].d)
        qh = load_u32(b[i].qh)
        for j in range(16):
            y[j] = d * <float>(<int>((b[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16)
            y[j + 16] = d * <float>(<int>((b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16)
        y += 32


cdef void deq_q5_1(const block_q5_1* b, float* y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef float d, m
    cdef uint32_t qh
    for i in range(nb):
        d = fp16(b[i].d)
        m = fp16(b[i].m)
        qh = load_u32(b[i].qh)
        for j in range(16):
            y[j] = lc_no_contract(d * <float>((b[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4))) + m
            y[j + 16] = lc_no_contract(d * <float>((b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4))) + m
        y += 32


cdef void deq_q8_0(const block_q8_0* b, float* y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i, j
    cdef float d
    for i in range(nb):
        d = fp16(b[i].d)
        for j in range(32):
            y[j] = <float>b[i].qs[j] * d
        y += 32


cdef void deq_q2_K(const block_q2_K* b, float* y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i, n, k, l, s
    cdef float d, dmin, dl, ml
    cdef const uint8_t* q
    for i in range(nb):
        d = fp16(b[i].d)
        dmin = fp16(b[i].dmin)
        for n in range(2):  # two halves of 128 values, 32 bytes of qs each
            q = b[i].qs + 32 * n
            for k in range(4):  # 2-bit fields at shift 2k: 32 values each, two sub-blocks of 16
                for s in range(2):
                    dl = d * <float>(b[i].scales[8 * n + 2 * k + s] & 0xF)
                    ml = dmin * <float>(b[i].scales[8 * n + 2 * k + s] >> 4)
                    for l in range(16 * s, 16 * s + 16):
                        y[l] = lc_no_contract(dl * <float>((q[l] >> (2 * k)) & 3)) - ml
                y += 32


cdef inline void q3k_scales(const uint8_t* packed, int8_t* sc) noexcept nogil:
    # 16 6-bit scales: low 4 bits in bytes 0..7 (low nibbles: 0..7, high nibbles: 8..15),
    # high 2 bits in bytes 8..11 (2 bits per scale, scale i at byte 8 + i%4, shift 2*(i//4)); offset 32
    cdef int i
    cdef int lo, hi
    for i in range(16):
        lo = (packed[i % 8] >> (4 * (i // 8))) & 0xF
        hi = (packed[8 + i % 4] >> (2 * (i // 4))) & 3
        sc[i] = <int8_t>((lo | (hi << 4)) - 32)


cdef void deq_q3_K(const block_q3_K* b, float* y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i, n, k, l, s
    cdef float d, dl
    cdef int8_t sc[16]
    cdef const uint8_t* q
    cdef uint8_t m
    for i in range(nb):
        d = fp16(b[i].d)
        q3k_scales(b[i].scales, sc)
        for n in range(2):
            q = b[i].qs + 32 * n
            for k in range(4):
                m = 1 << (4 * n + k)
                for s in range(2):
                    dl = d * <float>sc[8 * n + 2 * k + s]
                    for l in range(16 * s, 16 * s + 16):
                        y[l] = dl * <float>(((q[l] >> (2 * k)) & 3) - (0 if b[i].hmask[l] & m else 4))
                y += 32


cdef void deq_q4_K(const block_q4_K* b, float* y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i, j, l
    cdef float d, dmin, d1, m1, d2, m2
    cdef uint8_t sc, m
    cdef const uint8_t* q
    for i in range(nb):
        d = fp16(b[i].d)
        dmin = fp16(b[i].dmin)
        q = <const uint8_t*>b[i].qs
        for j in range(0, 8, 2):  # 64 values per 32 bytes: low nibbles sub-block j, high nibbles j+1
            get_scale_min_k4(j, b[i].scales, &sc, &m)
            d1 = d * <float>sc
            m1 = dmin * <float>m
            get_scale_min_k4(j + 1, b[i].scales, &sc, &m)
            d2 = d * <float>sc
            m2 = dmin * <float>m
            for l in range(32):
                y[l] = lc_no_contract(d1 * <float>(q[l] & 0xF)) - m1
                y[l + 32] = lc_no_contract(d2 * <float>(q[l] >> 4)) - m2
            q += 32
            y += 64


cdef void deq_q5_K(const block_q5_K* b, float* y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i, j, l
    cdef float d, dmin, d1, m1, d2, m2
    cdef uint8_t sc, m
    cdef const uint8_t* q
    for i in range(nb):
        d = fp16(b[i].d)
        dmin = fp16(b[i].dmin)
        q = <const uint8_t*>b[i].qs
        for j in range(0, 8, 2):
            get_scale_min_k4(j, b[i].scales, &sc, &m)
            d1 = d * <float>sc
            m1 = dmin * <float>m
            get_scale_min_k4(j + 1, b[i].scales, &sc, &m)
            d2 = d * <float>sc
            m2 = dmin * <float>m
            for l in range(32):
                y[l] = lc_no_contract(d1 * <float>((q[l] & 0xF) | (((b[i].qh[l] >> j) & 1) << 4))) - m1
                y[l + 32] = lc_no_contract(
                    d2 * <float>((q[l] >> 4) | (((b[i].qh[l] >> (j + 1)) & 1) << 4))) - m2
            q += 32
            y += 64


cdef void deq_q6_K(const block_q6_K* b, float* y, Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i, n, l, s
    cdef float d
    cdef const uint8_t* ql
    cdef const uint8_t* qh
    cdef const int8_t* sc
    for i in range(nb):
        d = fp16(b[i].d)
        for n in range(2):  # halves of 128 values
            ql = b[i].ql + 64 * n
            qh = b[i].qh + 32 * n
            sc = b[i].scales + 8 * n
            for l in range(32):
                s = l // 16
                y[l] = (d * <float>sc[s]) * <float>(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32)
                y[l + 32] = (d * <float>sc[s + 2]) * <float>(
                    ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32)
                y[l + 64] = (d * <float>sc[s + 4]) * <float>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32)
                y[l + 96] = (d * <float>sc[s + 6]) * <float>(
                    ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32)
            y += 128


cdef void dequantize_row(int wtype, const uint8_t* src, float* dst, Py_ssize_t cols) noexcept nogil:
    cdef Py_ssize_t j
    cdef uint32_t bits
    cdef const uint16_t* h = <const uint16_t*>src
    if wtype == T_F32:
        memcpy(dst, src, cols * sizeof(float))
    elif wtype == T_F16:
        for j in range(cols):
            dst[j] = fp16(h[j])
    elif wtype == T_BF16:
        for j in range(cols):
            bits = (<uint32_t>h[j]) << 16
            memcpy(&dst[j], &bits, 4)
    elif wtype == T_Q4_0:
        deq_q4_0(<const block_q4_0*>src, dst, cols // 32)
    elif wtype == T_Q4_1:
        deq_q4_1(<const block_q4_1*>src, dst, cols // 32)
    elif wtype == T_Q5_0:
        deq_q5_0(<const block_q5_0*>src, dst, cols // 32)
    elif wtype == T_Q5_1:
        deq_q5_1(<const block_q5_1*>src, dst, cols // 32)
    elif wtype == T_Q8_0:
        deq_q8_0(<const block_q8_0*>src, dst, cols // 32)
    elif wtype == T_Q2_K:
        deq_q2_K(<const block_q2_K*>src, dst, cols // QK_K)
    elif wtype == T_Q3_K:
        deq_q3_K(<const block_q3_K*>src, dst, cols // QK_K)
    elif wtype == T_Q4_K:
        deq_q4_K(<const block_q4_K*>src, dst, cols // QK_K)
    elif wtype == T_Q5_K:
        deq_q5_K(<const block_q5_K*>src, dst, cols // QK_K)
    elif wtype == T_Q6_K:
        deq_q6_K(<const block_q6_K*>src, dst, cols // QK_K)


# ---------------------------------------------------------------------------------------------------------
# Python surface (tests, Python callers). Sizes are checked here, before any raw pointer is touched.

HAVE_SIMD_BUILD = bool(HAVE_SIMD)

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
    _check_type(wtype)
    return int(weight_block_values(wtype)), int(weight_block_bytes(wtype))


def act_format_py(int wtype):
    """ACT_F32 (0), ACT_Q8A (1) or ACT_Q8K (2): the activation format `wtype` multiplies with; -1 if none."""
    return act_format(wtype)


def act_row_bytes_py(int wtype, Py_ssize_t cols):
    """Bytes of one quantized activation row of `cols` values for weight type `wtype`."""
    _check_cols(wtype, cols)
    return int(act_row_bytes(wtype, cols))


def struct_sizes():
    """sizeof of every block struct the kernels use: {name: bytes}."""
    return {
        "F32": sizeof(float), "F16": sizeof(block_f16), "BF16": sizeof(block_bf16),
        "Q4_0": sizeof(block_q4_0), "Q4_1": sizeof(block_q4_1), "Q5_0": sizeof(block_q5_0),
        "Q5_1": sizeof(block_q5_1), "Q8_0": sizeof(block_q8_0), "Q2_K": sizeof(block_q2_K),
        "Q3_K": sizeof(block_q3_K), "Q4_K": sizeof(block_q4_K), "Q5_K": sizeof(block_q5_K),
        "Q6_K": sizeof(block_q6_K), "Q8_K": sizeof(block_q8k), "act_q8a": sizeof(block_q8a),
    }


cdef _check_type(int wtype):
    if act_format(wtype) < 0:
        raise ValueError(f"no kernels for weight type {wtype}")


cdef _check_cols(int wtype, Py_ssize_t cols):
    _check_type(wtype)
    cdef Py_ssize_t qk = weight_block_values(wtype)
    if cols <= 0 or cols % qk:
        raise ValueError(f"row length must be a positive multiple of {qk} for type {wtype}, got {cols}")


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
    _check_cols(wtype, cols)
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


def dequantize(int wtype, data, shape):
    """Dequantize raw rows of type `wtype` to float32 of `shape` (last axis = values per row)."""
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    if not shape or any(s < 0 for s in shape):
        raise ValueError(f"bad shape {shape}")
    cdef Py_ssize_t cols = shape[len(shape) - 1]
    _check_cols(wtype, cols)
    cdef Py_ssize_t rows = 1, i
    for s in shape[:len(shape) - 1]:
        rows *= s
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    cdef Py_ssize_t rb = cols // weight_block_values(wtype) * weight_block_bytes(wtype)
    if raw.shape[0] != rows * rb:
        raise ValueError(f"{rows} rows of {cols} values of type {wtype} need {rows * rb} bytes, "
                         f"got {raw.shape[0]}")
    out = np.empty((rows, cols), dtype=np.float32)
    if rows == 0:
        return out.reshape(shape)
    cdef const uint8_t[::1] rv = raw
    cdef float[:, ::1] ov = out
    with nogil:
        for i in range(rows):
            dequantize_row(wtype, &rv[i * rb], &ov[i, 0], cols)
    return out.reshape(shape)
