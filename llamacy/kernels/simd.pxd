# The AVX2/FMA/F16C intrinsics the kernels use, declared for Cython.
#
# The vector types are declared as plain scalars so that Cython passes them through untouched: it only
# ever declares, assigns and passes them; never do arithmetic on them in Cython (`a + b`), call the
# intrinsic. In the SIMD build simd.h includes <immintrin.h>; in the portable build it supplies a plain-C
# twin of every function below (same name, same lane semantics), so the same kernels compile everywhere.
# A vector local must live in a cdef function, never directly in a prange body (Cython would initialise
# it there with an integer).

from libc.stdint cimport int64_t, uint8_t, uint32_t
from libc.string cimport memcpy


cdef extern from "simd.h" nogil:
    # 1 in a build with AVX2+FMA+F16C (real intrinsics), 0 in the portable build (C twins).
    const int HAVE_SIMD "LC_HAVE_SIMD"

    ctypedef long long __m256i
    ctypedef long long __m128i
    ctypedef float __m256
    ctypedef float __m128

    const int _MM_FROUND_TO_NEAREST_INT
    const int _MM_FROUND_NO_EXC

    float _cvtsh_ss(unsigned short h)
    unsigned short _cvtss_sh(float f, int rounding)

    # loads, stores, constants, lane moves
    __m256i _mm256_loadu_si256(const __m256i* p)
    void _mm256_storeu_si256(__m256i* p, __m256i a)
    __m128i _mm_loadu_si128(const __m128i* p)
    __m256i _mm256_setzero_si256()
    __m256i _mm256_set1_epi8(char v)
    __m256i _mm256_set1_epi16(short v)
    __m256i _mm256_set1_epi32(int v)
    __m256i _mm256_set1_epi64x(long long v)
    __m256i _mm256_set_epi64x(long long a3, long long a2, long long a1, long long a0)
    __m256i _mm256_setr_epi32(int a0, int a1, int a2, int a3, int a4, int a5, int a6, int a7)
    __m128i _mm_set_epi32(int a3, int a2, int a1, int a0)
    __m256i _mm256_broadcastsi128_si256(__m128i a)
    __m128i _mm256_castsi256_si128(__m256i a)
    __m128i _mm256_extracti128_si256(__m256i a, int imm)
    __m256i _mm256_inserti128_si256(__m256i a, __m128i b, int imm)
    __m256i _mm256_castsi128_si256(__m128i a)
    __m256i _mm256_unpacklo_epi32(__m256i a, __m256i b)
    __m256i _mm256_unpackhi_epi32(__m256i a, __m256i b)
    __m256i _mm256_unpacklo_epi64(__m256i a, __m256i b)
    __m256i _mm256_unpackhi_epi64(__m256i a, __m256i b)
    __m256i _mm256_permute2x128_si256(__m256i a, __m256i b, int imm)

    # integer arithmetic and logic
    __m256i _mm256_and_si256(__m256i a, __m256i b)
    __m256i _mm256_or_si256(__m256i a, __m256i b)
    __m256i _mm256_xor_si256(__m256i a, __m256i b)
    __m256i _mm256_andnot_si256(__m256i a, __m256i b)
    __m256i _mm256_srli_epi16(__m256i a, int n)
    __m256i _mm256_slli_epi16(__m256i a, int n)
    __m256i _mm256_slli_epi32(__m256i a, int n)
    __m256i _mm256_srai_epi32(__m256i a, int n)
    __m256i _mm256_srlv_epi64(__m256i a, __m256i n)
    __m256i _mm256_add_epi16(__m256i a, __m256i b)
    __m256i _mm256_sub_epi16(__m256i a, __m256i b)
    __m256i _mm256_add_epi32(__m256i a, __m256i b)
    __m256i _mm256_sub_epi32(__m256i a, __m256i b)
    __m256i _mm256_sub_epi8(__m256i a, __m256i b)
    __m256i _mm256_cmpeq_epi8(__m256i a, __m256i b)
    __m256i _mm256_maddubs_epi16(__m256i a_unsigned, __m256i b_signed)
    __m256i _mm256_madd_epi16(__m256i a, __m256i b)
    __m256i _mm256_sign_epi8(__m256i a, __m256i b)
    __m256i _mm256_shuffle_epi8(__m256i a, __m256i mask)
    __m256i _mm256_cvtepu8_epi16(__m128i a)
    __m256i _mm256_cvtepi8_epi16(__m128i a)
    __m256i _mm256_cvtepu16_epi32(__m128i a)
    __m256i _mm256_packs_epi32(__m256i a, __m256i b)
    __m256i _mm256_packs_epi16(__m256i a, __m256i b)
    __m256i _mm256_permutevar8x32_epi32(__m256i a, __m256i idx)
    __m128i _mm_hadd_epi16(__m128i a, __m128i b)
    __m128i _mm_madd_epi16(__m128i a, __m128i b)
    __m128i _mm_add_epi32(__m128i a, __m128i b)
    int _mm_cvtsi128_si32(__m128i a)
    __m128i _mm_unpackhi_epi64(__m128i a, __m128i b)
    __m128i _mm_shuffle_epi32(__m128i a, int imm)
    __m128i _mm_cvtsi32_si128(int a)
    __m128i _mm_unpacklo_epi8(__m128i a, __m128i b)
    __m128i _mm_unpackhi_epi8(__m128i a, __m128i b)
    __m128i _mm_loadl_epi64(const __m128i* p)

    # float
    __m256 _mm256_setzero_ps()
    __m256 _mm256_set1_ps(float v)
    __m256 _mm256_loadu_ps(const float* p)
    void _mm256_storeu_ps(float* p, __m256 a)
    __m256 _mm256_add_ps(__m256 a, __m256 b)
    __m256 _mm256_mul_ps(__m256 a, __m256 b)
    __m256 _mm256_sub_ps(__m256 a, __m256 b)
    __m256 _mm256_max_ps(__m256 a, __m256 b)
    __m256 _mm256_fmadd_ps(__m256 a, __m256 b, __m256 c)
    __m256 _mm256_fnmadd_ps(__m256 a, __m256 b, __m256 c)
    __m256 _mm256_andnot_ps(__m256 a, __m256 b)
    __m256 _mm256_cvtepi32_ps(__m256i a)
    __m256 _mm256_round_ps(__m256 a, int mode)
    __m256i _mm256_cvtps_epi32(__m256 a)
    __m256 _mm256_castsi256_ps(__m256i a)
    __m256 _mm256_cvtph_ps(__m128i a)
    __m128 _mm256_castps256_ps128(__m256 a)
    __m128 _mm256_extractf128_ps(__m256 a, int imm)
    __m128 _mm_add_ps(__m128 a, __m128 b)
    __m128 _mm_mul_ps(__m128 a, __m128 b)
    __m128 _mm_setzero_ps()
    __m128 _mm_castsi128_ps(__m128i a)
    __m128 _mm_cvtph_ps(__m128i a)
    __m256 _mm256_broadcastss_ps(__m128 a)
    __m128 _mm_max_ps(__m128 a, __m128 b)
    __m128 _mm_movehl_ps(__m128 a, __m128 b)
    __m128 _mm_movehdup_ps(__m128 a)
    __m128 _mm_add_ss(__m128 a, __m128 b)
    __m128 _mm_max_ss(__m128 a, __m128 b)
    float _mm_cvtss_f32(__m128 a)

    # Prefetch the cache line at p for reading (a hint; never faults).
    void lc_prefetch(const void* p)
    void lc_prefetch_l2(const void* p)
    # Every line of the nbytes from p on.
    void lc_prefetch_span(const void* p, Py_ssize_t nbytes)
    void lc_prefetch_span_l2(const void* p, Py_ssize_t nbytes)

    # Round x to float now: stops the compiler fusing it into a following add (see simd.h).
    float lc_no_contract(float x)


# Horizontal sums and small helpers shared by the kernels.
cdef inline float hsum8(__m256 v) noexcept nogil:
    cdef __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1))
    s = _mm_add_ps(s, _mm_movehl_ps(s, s))
    s = _mm_add_ss(s, _mm_movehdup_ps(s))
    return _mm_cvtss_f32(s)


cdef inline float hmax8(__m256 v) noexcept nogil:
    cdef __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1))
    s = _mm_max_ps(s, _mm_movehl_ps(s, s))
    s = _mm_max_ss(s, _mm_movehdup_ps(s))
    return _mm_cvtss_f32(s)


cdef inline int hsum8_epi32(__m256i v) noexcept nogil:
    cdef __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1))
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s))
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1))
    return _mm_cvtsi128_si32(s)


cdef inline float fp16(unsigned short h) noexcept nogil:
    return _cvtsh_ss(h)


# bfloat16 is the upper half of an IEEE single: exact.
cdef inline float bf16_to_f32(unsigned short h) noexcept nogil:
    cdef uint32_t bits = (<uint32_t>h) << 16
    cdef float f
    memcpy(&f, &bits, 4)
    return f


# ---- block unpacking shared by the AVX2 and AVX-512 kernels ------------------------------------------


cdef inline uint32_t load_u32(const uint8_t* p) noexcept nogil:
    cdef uint32_t v
    memcpy(&v, p, 4)
    return v


cdef inline int64_t load_u64(const uint8_t* p) noexcept nogil:
    cdef int64_t v
    memcpy(&v, p, 8)
    return v


# 16 packed nibbles -> 32 bytes: low nibbles (values 0..15) in the low lane, high nibbles in the high lane.
# One 128-bit broadcast load, one variable shift (0 bits low lane, 4 bits high lane), one mask.
cdef inline __m256i unpack_nibbles(const uint8_t* qs) noexcept nogil:
    cdef __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(<const __m128i*>qs))
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0x0F))


# The 32 bits of qh (little-endian) -> 32 bytes, 0xFF where the bit is set.
cdef inline __m256i unpack_bits(const uint8_t* qh) noexcept nogil:
    cdef __m256i v = _mm256_shuffle_epi8(
        _mm256_set1_epi32(<int>load_u32(qh)),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0))
    # byte k of each 8-byte group keeps all bits but bit k: equal to all-ones iff bit k was set
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe))
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1))
