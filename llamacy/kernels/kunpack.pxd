# K-quant super-blocks unpacked with SIMD: shared by the AVX2 tiles (mm_avx2.pyx) and the AVX-512 VNNI
# repacking (matmul512.pyx).
#
# Each weight super-block (256 values) is unpacked into a canonical form:
#   value_j = d * sc_g * u_j - doff * off_g       (g = j // 16, u_j unsigned bytes, sc_g and off_g ints)
# so that  dot = d_y * (d * sum_g sc_g * sum_{j in g} u_j q_j  -  doff * sum_g off_g * bsum_g),
# both sums exact in int32 (maddubs u x q, madd with the per-group scales; madd off x bsums).
#   Q2_K: u = 2-bit q, sc = 4-bit scale, off = 4-bit min, doff = dmin
#   Q3_K: u = 3-bit q + 4, sc = 6-bit scale - 32, off = 4 * sc, doff = d
#   Q4_K: u = 4-bit q, sc/off = 6-bit scale/min of the 32-value sub-block, doff = dmin
#   Q5_K: u = 5-bit q, as Q4_K
#   Q6_K: u = 6-bit q + 32, sc = int8 scale, off = 32 * sc, doff = d
# Where doff == d (Q3_K, Q6_K) the kernels take the offset off in integers.
from libc.stdint cimport uint8_t, uint32_t
from libc.string cimport memcpy

from llamacy.kernels.blocks cimport *
from llamacy.kernels.simd cimport *


# Move bit `frm` of every byte to bit `to` (16-bit shifts: the bits that cross bytes are masked off later).
cdef inline __m256i move_bit(__m256i v, int frm, int to) noexcept nogil:
    if frm > to:
        return _mm256_srli_epi16(v, frm - to)
    elif frm < to:
        return _mm256_slli_epi16(v, to - frm)
    return v


# Q4_K/Q5_K: the 12 packed bytes -> 8 scales (bytes 0..7) and 8 mins (bytes 8..15), with 32-bit word ops
# (kquants.scale_min_k4 one at a time).
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


# The 64 quants of sub-blocks 2j and 2j+1 of a Q4_K/Q5_K super-block, as bytes: the low nibbles of
# qs[32j..32j+32) in a, the high ones in c, each with Q5_K's fifth bit from hb (its qh, loaded once).
cdef inline void k45_quants(const k45block* b, int j, __m256i hb, __m256i* a, __m256i* c) noexcept nogil:
    cdef __m256i m4 = _mm256_set1_epi8(0x0F)
    cdef __m256i v = _mm256_loadu_si256(<const __m256i*>(b.qs + 32 * j))
    a[0] = _mm256_and_si256(v, m4)
    c[0] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)
    if k45block is block_q5_K:
        a[0] = _mm256_or_si256(a[0], _mm256_and_si256(move_bit(hb, 2 * j, 4), _mm256_set1_epi8(0x10)))
        c[0] = _mm256_or_si256(c[0], _mm256_and_si256(move_bit(hb, 2 * j + 1, 4), _mm256_set1_epi8(0x10)))


# One super-block: its 256 u bytes into u, the 16 group scales sc_g (int16) into S, the offsets off_g
# into O, and d, doff. For Q4_K/Q5_K, whose scales belong to 32-value sub-blocks, S holds each twice, so
# that read as 8 int32 lanes it is (sc_j << 16 | sc_j) per sub-block j.
cdef inline void unpack_k(const kblock* b, uint8_t* u, __m256i* S, __m256i* O, float* d,
                          float* doff) noexcept nogil:
    cdef __m256i m4 = _mm256_set1_epi8(0x0F)
    cdef __m256i v, hb, a, c
    cdef __m128i sm
    cdef int j, n
    if kblock is block_q2_K:
        for n in range(2):
            v = _mm256_loadu_si256(<const __m256i*>(b.qs + 32 * n))
            for j in range(4):
                _mm256_storeu_si256(<__m256i*>(u + 128 * n + 32 * j),
                                    _mm256_and_si256(move_bit(v, 2 * j, 0), _mm256_set1_epi8(3)))
        v = _mm256_cvtepu8_epi16(_mm_loadu_si128(<const __m128i*>b.scales))
        S[0] = _mm256_and_si256(v, _mm256_set1_epi16(0xF))
        O[0] = _mm256_srli_epi16(v, 4)
        d[0] = fp16(b.d)
        doff[0] = fp16(b.dmin)
    elif kblock is block_q3_K:
        hb = _mm256_loadu_si256(<const __m256i*>b.hmask)
        for n in range(2):
            v = _mm256_loadu_si256(<const __m256i*>(b.qs + 32 * n))
            for j in range(4):
                _mm256_storeu_si256(<__m256i*>(u + 128 * n + 32 * j), _mm256_or_si256(
                    _mm256_and_si256(move_bit(v, 2 * j, 0), _mm256_set1_epi8(3)),
                    _mm256_and_si256(move_bit(hb, 4 * n + j, 2), _mm256_set1_epi8(4))))
        S[0] = _mm256_sub_epi16(_mm256_cvtepu8_epi16(k3_scales(b.scales)), _mm256_set1_epi16(32))
        O[0] = _mm256_slli_epi16(S[0], 2)
        d[0] = fp16(b.d)
        doff[0] = d[0]
    elif kblock is block_q4_K or kblock is block_q5_K:
        if kblock is block_q5_K:
            hb = _mm256_loadu_si256(<const __m256i*>b.qh)
        else:
            hb = _mm256_setzero_si256()  # Q4_K has no fifth bits
        for j in range(4):
            k45_quants(b, j, hb, &a, &c)
            _mm256_storeu_si256(<__m256i*>(u + 64 * j), a)
            _mm256_storeu_si256(<__m256i*>(u + 64 * j + 32), c)
        # each 32-value sub-block spans two 16-value groups: repeat every scale and min twice
        sm = k4_scales_mins(b.scales)
        S[0] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sm, sm))
        O[0] = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm))
        d[0] = fp16(b.d)
        doff[0] = fp16(b.dmin)
    elif kblock is block_q6_K:
        for n in range(2):
            a = _mm256_loadu_si256(<const __m256i*>(b.ql + 64 * n))
            c = _mm256_loadu_si256(<const __m256i*>(b.ql + 64 * n + 32))
            hb = _mm256_loadu_si256(<const __m256i*>(b.qh + 32 * n))
            _mm256_storeu_si256(<__m256i*>(u + 128 * n), _mm256_or_si256(
                _mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), _mm256_set1_epi8(0x30))))
            _mm256_storeu_si256(<__m256i*>(u + 128 * n + 32), _mm256_or_si256(
                _mm256_and_si256(c, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), _mm256_set1_epi8(0x30))))
            _mm256_storeu_si256(<__m256i*>(u + 128 * n + 64), _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(hb, _mm256_set1_epi8(0x30))))
            _mm256_storeu_si256(<__m256i*>(u + 128 * n + 96), _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(c, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(hb, 2), _mm256_set1_epi8(0x30))))
        S[0] = _mm256_cvtepi8_epi16(_mm_loadu_si128(<const __m128i*>b.scales))
        O[0] = _mm256_slli_epi16(S[0], 5)
        d[0] = fp16(b.d)
        doff[0] = d[0]


# Q6_K: the unsigned 6-bit values 32s..32s+31 (s = 4n + j) from the low bits a (ql[64n..]), c (ql[64n+32..])
# and the high bits hb (qh[32n..]); the formulas of unpack_k's Q6_K branch. Shared by the AVX2 and VNNI tiles.
cdef inline __m256i k6_values(__m256i a, __m256i c, __m256i hb, int j) noexcept nogil:
    cdef __m256i m4 = _mm256_set1_epi8(0x0F)
    cdef __m256i m3 = _mm256_set1_epi8(0x30)
    if j == 0:
        return _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m3))
    elif j == 1:
        return _mm256_or_si256(_mm256_and_si256(c, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m3))
    elif j == 2:
        return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(hb, m3))
    return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(hb, 2), m3))
