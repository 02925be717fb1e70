# The AVX-512 VNNI (and a few more SSE/AVX2) intrinsics that matmul512 uses, on top of simd.pxd's.
#
# Only matmul512 cimports this: it is the one module compiled with the AVX-512 flags (setup.py), and it runs
# only on a CPU that has them. The vector types are simd.pxd's (plain scalars to Cython: never do arithmetic
# on them in Cython, call the intrinsic).
from libc.stdint cimport int8_t, int32_t

from llamacy.kernels.simd cimport __m128, __m128i, __m256, __m256i

cdef extern from "simd512.h" nogil:
    # AVX512_VNNI + AVX512VL, 256-bit forms.
    # dpbusd: src + per int32 lane the sum of 4 products (unsigned byte of a) x (signed byte of b), no
    # saturation: one instruction for AVX2's maddubs + madd(ones) + add, exact where maddubs does not saturate.
    __m256i _mm256_dpbusd_epi32(__m256i src, __m256i a_unsigned, __m256i b_signed)
    # dpwssd: src + per int32 lane the sum of the 2 products of int16 pairs: madd + add in one instruction.
    __m256i _mm256_dpwssd_epi32(__m256i src, __m256i a, __m256i b)

    # AVX512BW + AVX512VL: int16 lanes of a picked by the int16 lanes of idx (across the 128-bit halves).
    __m256i _mm256_permutexvar_epi16(__m256i idx, __m256i a)
    # AVX512BW + AVX512VL: a + b in the bytes whose bit of k is set, src's byte elsewhere.
    ctypedef unsigned int __mmask32
    __m256i _mm256_mask_add_epi8(__m256i src, __mmask32 k, __m256i a, __m256i b)

    # Make the compiler read the floats at p back from memory from here on (see simd512.h).
    void lc_spill(const float* p)

    # AVX2 and SSE ones simd.pxd does not declare.
    __m256i _mm256_xor_si256(__m256i a, __m256i b)
    __m256i _mm256_hadd_epi32(__m256i a, __m256i b)
    __m256i _mm256_mullo_epi32(__m256i a, __m256i b)
    __m256 _mm256_sub_ps(__m256 a, __m256 b)
    __m128i _mm_setzero_si128()
    void _mm_storeu_si128(__m128i* p, __m128i a)
    __m256i _mm256_unpacklo_epi32(__m256i a, __m256i b)
    __m256i _mm256_unpackhi_epi32(__m256i a, __m256i b)
    __m256i _mm256_unpacklo_epi64(__m256i a, __m256i b)
    __m256i _mm256_unpackhi_epi64(__m256i a, __m256i b)
    __m256i _mm256_permute2x128_si256(__m256i a, __m256i b, int imm)
    __m256i _mm256_castsi128_si256(__m128i a)
    __m256i _mm256_cvtepu8_epi32(__m128i a)
    __m256 _mm256_permutevar8x32_ps(__m256 a, __m256i idx)
    __m256 _mm256_set_m128(__m128 hi, __m128 lo)
    __m256 _mm256_broadcast_ps(const __m128* p)
    __m128i _mm_shuffle_epi8(__m128i a, __m128i mask)
    __m128i _mm_srli_epi16(__m128i a, int n)
    __m128i _mm_and_si128(__m128i a, __m128i b)
    __m128i _mm_or_si128(__m128i a, __m128i b)
    __m128i _mm_setr_epi8(char a0, char a1, char a2, char a3, char a4, char a5, char a6, char a7,
                          char a8, char a9, char a10, char a11, char a12, char a13, char a14, char a15)
    __m128 _mm_loadu_ps(const float* p)
    void _mm_storeu_ps(float* p, __m128 a)
    __m128 _mm_set1_ps(float v)
    __m128 _mm_load_ss(const float* p)
    __m128 _mm_cvtepi32_ps(__m128i a)
    __m128 _mm_fmadd_ps(__m128 a, __m128 b, __m128 c)

cdef extern from "amx.h" nogil:
    # Intel AMX (amx.h): turning the tile unit on, its register roles, and the 16 x 16 tiles.
    const int LC_AMX
    ctypedef struct lc_amxrec:
        int8_t q[8][64]
        float d[16]
        float m[16]
    ctypedef struct lc_kamxrec:
        int8_t u[64][64]
        int32_t sc[16][16]
        int32_t pr[8][16]
        float d[16]
        float dmin[16]
    ctypedef struct lc_k4amxrec:
        int8_t lo[64][64]
        int8_t hi[64][64]
        int32_t pr[4][16]
        float d[16]
        float dmin[16]
    ctypedef struct lc_k3amxrec:
        int8_t e[3][64][64]
        float d[16]
    ctypedef struct lc_q8a:
        pass
    ctypedef struct lc_q8k:
        pass
    int lc_amx_enable()
    void lc_amx_config()
    void lc_amx_config_k()
    void lc_amx_release()
    void lc_amx_lanes_tile(const lc_amxrec* rec, const lc_q8a* y, Py_ssize_t nb, float* out, Py_ssize_t ldo,
                           int nvalid, int with_min)
    void lc_amx_pack_k4(const lc_kamxrec* src, Py_ssize_t nb, lc_k4amxrec* dst)
    void lc_amx_k4_tile(const lc_k4amxrec* rec, const lc_q8k* y, const int32_t* pairs, Py_ssize_t nb, float* out,
                        Py_ssize_t ldo, int nvalid, int nrun)
    void lc_amx_k5_tile(const lc_kamxrec* rec, const lc_q8k* y, const int32_t* pairs, Py_ssize_t nb, float* out,
                        Py_ssize_t ldo, int nvalid)
    void lc_amx_pack_k6(const lc_kamxrec* src, Py_ssize_t nb, lc_k3amxrec* dst)
    void lc_amx_k6_tile(const lc_k3amxrec* rec, const lc_q8k* y, Py_ssize_t nb, float* out, Py_ssize_t ldo,
                        int nvalid)
