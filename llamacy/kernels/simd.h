/* The SIMD intrinsics the llamacy kernels use, for Cython (declared in simd.pxd).
 *
 * SIMD build (-mavx2 -mfma -mf16c): these are the compiler's own intrinsics from <immintrin.h>.
 * Portable build (no flags): each intrinsic we use gets a plain C twin below with the same name and the
 * same lane semantics, so the SIMD kernels still compile and can be tested on any CPU. The portable twins
 * are slow; a portable build's matmul dispatches to the scalar kernels instead (LC_HAVE_SIMD == 0).
 *
 * Only the intrinsics the kernels call are here: adding one to simd.pxd means adding its twin here.
 */
#ifndef LLAMACY_SIMD_H
#define LLAMACY_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#define LC_HAVE_SIMD 1

#else /* ------------------------------------------------------------------ portable scalar twins */

#define LC_HAVE_SIMD 0

/* Loads and stores take void pointers here: our twins memcpy, so no alignment is assumed. */
typedef union {
    int8_t i8[32]; uint8_t u8[32]; int16_t i16[16]; uint16_t u16[16];
    int32_t i32[8]; uint32_t u32[8]; int64_t i64[4]; uint64_t u64[4];
} __m256i;
typedef union {
    int8_t i8[16]; uint8_t u8[16]; int16_t i16[8]; uint16_t u16[8];
    int32_t i32[4]; uint32_t u32[4]; int64_t i64[2]; uint64_t u64[2];
} __m128i;
typedef struct { float f[8]; } __m256;
typedef struct { float f[4]; } __m128;

#define _MM_FROUND_TO_NEAREST_INT 0x00
#define _MM_FROUND_NO_EXC 0x08

#define LC_I256(name) static inline __m256i name
#define LC_F256(name) static inline __m256 name

static inline int16_t lc_sat16(int32_t v) { return (int16_t)(v > 32767 ? 32767 : v < -32768 ? -32768 : v); }
static inline int8_t lc_sat8(int32_t v) { return (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v); }

/* IEEE half <-> single, exact (round to nearest even on the way down), like F16C. */
static inline float _cvtsh_ss(unsigned short h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal half: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f; memcpy(&f, &bits, 4); return f;
}
static inline unsigned short _cvtss_sh(float f, int rounding) {
    (void)rounding; /* we only ever ask for round-to-nearest-even */
    uint32_t x; memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan (keep nan quiet) */
        return (unsigned short)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 | ((ax >> 13) & 0x3ff) : 0));
    if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) { /* result is subnormal (or zero): align to 2^-24 units and round */
        if (ax < 0x33000000u) return (unsigned short)sign; /* < 2^-25: rounds to zero */
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000, shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (unsigned short)(sign | r);
    }
    uint32_t r = ((ax >> 13) - (112u << 10)), rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (unsigned short)(sign | r);
}

/* --- loads, stores, constants --- */
LC_I256(_mm256_loadu_si256)(const void* p) { __m256i r; memcpy(&r, p, 32); return r; }
static inline void _mm256_storeu_si256(void* p, __m256i a) { memcpy(p, &a, 32); }
static inline __m128i _mm_loadu_si128(const void* p) { __m128i r; memcpy(&r, p, 16); return r; }
LC_I256(_mm256_setzero_si256)(void) { __m256i r; memset(&r, 0, 32); return r; }
LC_I256(_mm256_set1_epi8)(char v) { __m256i r; memset(&r, (unsigned char)v, 32); return r; }
LC_I256(_mm256_set1_epi16)(short v) { __m256i r; for (int i = 0; i < 16; i++) r.i16[i] = v; return r; }
LC_I256(_mm256_set1_epi32)(int v) { __m256i r; for (int i = 0; i < 8; i++) r.i32[i] = v; return r; }
LC_I256(_mm256_set1_epi64x)(long long v) { __m256i r; for (int i = 0; i < 4; i++) r.i64[i] = v; return r; }
LC_I256(_mm256_set_epi64x)(long long a3, long long a2, long long a1, long long a0) {
    __m256i r; r.i64[0] = a0; r.i64[1] = a1; r.i64[2] = a2; r.i64[3] = a3; return r;
}
LC_I256(_mm256_setr_epi32)(int a0, int a1, int a2, int a3, int a4, int a5, int a6, int a7) {
    __m256i r; r.i32[0] = a0; r.i32[1] = a1; r.i32[2] = a2; r.i32[3] = a3;
    r.i32[4] = a4; r.i32[5] = a5; r.i32[6] = a6; r.i32[7] = a7; return r;
}
static inline __m128i _mm_set_epi32(int a3, int a2, int a1, int a0) {
    __m128i r; r.i32[0] = a0; r.i32[1] = a1; r.i32[2] = a2; r.i32[3] = a3; return r;
}
LC_I256(_mm256_broadcastsi128_si256)(__m128i a) { __m256i r; memcpy(&r, &a, 16); memcpy(r.u8 + 16, &a, 16); return r; }
static inline __m128i _mm256_castsi256_si128(__m256i a) { __m128i r; memcpy(&r, &a, 16); return r; }
static inline __m128i _mm256_extracti128_si256(__m256i a, int i) { __m128i r; memcpy(&r, a.u8 + 16 * (i & 1), 16); return r; }
LC_I256(_mm256_inserti128_si256)(__m256i a, __m128i b, int i) { memcpy(a.u8 + 16 * (i & 1), &b, 16); return a; }
LC_I256(_mm256_castsi128_si256)(__m128i a) { __m256i r; memset(&r, 0, 32); memcpy(r.u8, &a, 16); return r; }
LC_I256(_mm256_unpacklo_epi32)(__m256i a, __m256i b) {
    __m256i r; for (int h = 0; h < 2; h++) for (int i = 0; i < 2; i++) { r.u32[4 * h + 2 * i] = a.u32[4 * h + i]; r.u32[4 * h + 2 * i + 1] = b.u32[4 * h + i]; } return r; }
LC_I256(_mm256_unpackhi_epi32)(__m256i a, __m256i b) {
    __m256i r; for (int h = 0; h < 2; h++) for (int i = 0; i < 2; i++) { r.u32[4 * h + 2 * i] = a.u32[4 * h + 2 + i]; r.u32[4 * h + 2 * i + 1] = b.u32[4 * h + 2 + i]; } return r; }
LC_I256(_mm256_unpacklo_epi64)(__m256i a, __m256i b) {
    __m256i r; for (int h = 0; h < 2; h++) { r.u64[2 * h] = a.u64[2 * h]; r.u64[2 * h + 1] = b.u64[2 * h]; } return r; }
LC_I256(_mm256_unpackhi_epi64)(__m256i a, __m256i b) {
    __m256i r; for (int h = 0; h < 2; h++) { r.u64[2 * h] = a.u64[2 * h + 1]; r.u64[2 * h + 1] = b.u64[2 * h + 1]; } return r; }
/* only the selectors the kernels use: 0x20 (low halves of a, b) and 0x31 (high halves) */
LC_I256(_mm256_permute2x128_si256)(__m256i a, __m256i b, int imm) {
    __m256i r; int o = (imm & 1) ? 16 : 0; memcpy(r.u8, a.u8 + o, 16); memcpy(r.u8 + 16, b.u8 + o, 16); return r; }

/* --- integer arithmetic and logic --- */
LC_I256(_mm256_and_si256)(__m256i a, __m256i b) { for (int i = 0; i < 4; i++) a.u64[i] &= b.u64[i]; return a; }
LC_I256(_mm256_or_si256)(__m256i a, __m256i b) { for (int i = 0; i < 4; i++) a.u64[i] |= b.u64[i]; return a; }
LC_I256(_mm256_xor_si256)(__m256i a, __m256i b) { for (int i = 0; i < 4; i++) a.u64[i] ^= b.u64[i]; return a; }
LC_I256(_mm256_andnot_si256)(__m256i a, __m256i b) { for (int i = 0; i < 4; i++) a.u64[i] = ~a.u64[i] & b.u64[i]; return a; }
LC_I256(_mm256_srli_epi16)(__m256i a, int n) { for (int i = 0; i < 16; i++) a.u16[i] = n > 15 ? 0 : (uint16_t)(a.u16[i] >> n); return a; }
LC_I256(_mm256_slli_epi16)(__m256i a, int n) { for (int i = 0; i < 16; i++) a.u16[i] = n > 15 ? 0 : (uint16_t)(a.u16[i] << n); return a; }
LC_I256(_mm256_slli_epi32)(__m256i a, int n) { for (int i = 0; i < 8; i++) a.u32[i] = n > 31 ? 0 : a.u32[i] << n; return a; }
LC_I256(_mm256_srlv_epi64)(__m256i a, __m256i n) {
    for (int i = 0; i < 4; i++) a.u64[i] = n.u64[i] > 63 ? 0 : a.u64[i] >> n.u64[i];
    return a;
}
LC_I256(_mm256_add_epi16)(__m256i a, __m256i b) { for (int i = 0; i < 16; i++) a.i16[i] = (int16_t)(a.i16[i] + b.i16[i]); return a; }
LC_I256(_mm256_sub_epi16)(__m256i a, __m256i b) { for (int i = 0; i < 16; i++) a.i16[i] = (int16_t)(a.i16[i] - b.i16[i]); return a; }
LC_I256(_mm256_add_epi32)(__m256i a, __m256i b) { for (int i = 0; i < 8; i++) a.u32[i] += b.u32[i]; return a; }
LC_I256(_mm256_sub_epi32)(__m256i a, __m256i b) { for (int i = 0; i < 8; i++) a.u32[i] -= b.u32[i]; return a; }
LC_I256(_mm256_sub_epi8)(__m256i a, __m256i b) { for (int i = 0; i < 32; i++) a.u8[i] = (uint8_t)(a.u8[i] - b.u8[i]); return a; }
LC_I256(_mm256_cmpeq_epi8)(__m256i a, __m256i b) { for (int i = 0; i < 32; i++) a.u8[i] = a.u8[i] == b.u8[i] ? 0xff : 0; return a; }
/* a: unsigned bytes, b: signed bytes; adjacent products summed into saturated int16. */
LC_I256(_mm256_maddubs_epi16)(__m256i a, __m256i b) {
    __m256i r;
    for (int i = 0; i < 16; i++)
        r.i16[i] = lc_sat16((int32_t)a.u8[2 * i] * b.i8[2 * i] + (int32_t)a.u8[2 * i + 1] * b.i8[2 * i + 1]);
    return r;
}
LC_I256(_mm256_madd_epi16)(__m256i a, __m256i b) {
    __m256i r;
    for (int i = 0; i < 8; i++)
        r.u32[i] = (uint32_t)((int32_t)a.i16[2 * i] * b.i16[2 * i]) + (uint32_t)((int32_t)a.i16[2 * i + 1] * b.i16[2 * i + 1]);
    return r;
}
LC_I256(_mm256_sign_epi8)(__m256i a, __m256i b) {
    for (int i = 0; i < 32; i++) a.i8[i] = b.i8[i] < 0 ? (int8_t)(-a.i8[i]) : b.i8[i] == 0 ? 0 : a.i8[i];
    return a;
}
LC_I256(_mm256_shuffle_epi8)(__m256i a, __m256i m) { /* within each 128-bit lane */
    __m256i r;
    for (int i = 0; i < 32; i++) r.u8[i] = (m.u8[i] & 0x80) ? 0 : a.u8[(i & 16) | (m.u8[i] & 15)];
    return r;
}
LC_I256(_mm256_cvtepu8_epi16)(__m128i a) { __m256i r; for (int i = 0; i < 16; i++) r.i16[i] = a.u8[i]; return r; }
LC_I256(_mm256_cvtepi8_epi16)(__m128i a) { __m256i r; for (int i = 0; i < 16; i++) r.i16[i] = a.i8[i]; return r; }
LC_I256(_mm256_cvtepu16_epi32)(__m128i a) { __m256i r; for (int i = 0; i < 8; i++) r.i32[i] = a.u16[i]; return r; }
LC_I256(_mm256_packs_epi32)(__m256i a, __m256i b) { /* per 128-bit lane: 4 from a, 4 from b */
    __m256i r;
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < 4; i++) { r.i16[8 * l + i] = lc_sat16(a.i32[4 * l + i]); r.i16[8 * l + 4 + i] = lc_sat16(b.i32[4 * l + i]); }
    return r;
}
LC_I256(_mm256_packs_epi16)(__m256i a, __m256i b) {
    __m256i r;
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < 8; i++) { r.i8[16 * l + i] = lc_sat8(a.i16[8 * l + i]); r.i8[16 * l + 8 + i] = lc_sat8(b.i16[8 * l + i]); }
    return r;
}
LC_I256(_mm256_permutevar8x32_epi32)(__m256i a, __m256i idx) { __m256i r; for (int i = 0; i < 8; i++) r.i32[i] = a.i32[idx.u32[i] & 7]; return r; }
static inline __m128i _mm_hadd_epi16(__m128i a, __m128i b) {
    __m128i r;
    for (int i = 0; i < 4; i++) { r.i16[i] = (int16_t)(a.i16[2 * i] + a.i16[2 * i + 1]); r.i16[4 + i] = (int16_t)(b.i16[2 * i] + b.i16[2 * i + 1]); }
    return r;
}
static inline __m128i _mm_madd_epi16(__m128i a, __m128i b) {
    __m128i r;
    for (int i = 0; i < 4; i++)
        r.u32[i] = (uint32_t)((int32_t)a.i16[2 * i] * b.i16[2 * i]) + (uint32_t)((int32_t)a.i16[2 * i + 1] * b.i16[2 * i + 1]);
    return r;
}
static inline __m128i _mm_add_epi32(__m128i a, __m128i b) { for (int i = 0; i < 4; i++) a.u32[i] += b.u32[i]; return a; }
static inline int _mm_cvtsi128_si32(__m128i a) { return a.i32[0]; }
static inline __m128i _mm_unpackhi_epi64(__m128i a, __m128i b) { a.i64[0] = a.i64[1]; a.i64[1] = b.i64[1]; return a; }
static inline __m128i _mm_unpacklo_epi8(__m128i a, __m128i b) {
    __m128i r; for (int i = 0; i < 8; i++) { r.u8[2 * i] = a.u8[i]; r.u8[2 * i + 1] = b.u8[i]; } return r;
}
static inline __m128i _mm_unpackhi_epi8(__m128i a, __m128i b) {
    __m128i r; for (int i = 0; i < 8; i++) { r.u8[2 * i] = a.u8[8 + i]; r.u8[2 * i + 1] = b.u8[8 + i]; } return r;
}
static inline __m128i _mm_cvtsi32_si128(int a) { __m128i r; memset(&r, 0, 16); r.i32[0] = a; return r; }
static inline __m128i _mm_loadl_epi64(const void* p) { __m128i r; memset(&r, 0, 16); memcpy(&r, p, 8); return r; }
static inline __m128i _mm_shuffle_epi32(__m128i a, int imm) {
    __m128i r; for (int i = 0; i < 4; i++) r.i32[i] = a.i32[(imm >> (2 * i)) & 3]; return r;
}

/* --- float --- */
LC_F256(_mm256_setzero_ps)(void) { __m256 r; for (int i = 0; i < 8; i++) r.f[i] = 0.0f; return r; }
LC_F256(_mm256_set1_ps)(float v) { __m256 r; for (int i = 0; i < 8; i++) r.f[i] = v; return r; }
LC_F256(_mm256_loadu_ps)(const float* p) { __m256 r; memcpy(&r, p, 32); return r; }
static inline void _mm256_storeu_ps(float* p, __m256 a) { memcpy(p, &a, 32); }
LC_F256(_mm256_add_ps)(__m256 a, __m256 b) { for (int i = 0; i < 8; i++) a.f[i] += b.f[i]; return a; }
LC_F256(_mm256_mul_ps)(__m256 a, __m256 b) { for (int i = 0; i < 8; i++) a.f[i] *= b.f[i]; return a; }
LC_F256(_mm256_sub_ps)(__m256 a, __m256 b) { for (int i = 0; i < 8; i++) a.f[i] -= b.f[i]; return a; }
LC_F256(_mm256_max_ps)(__m256 a, __m256 b) { for (int i = 0; i < 8; i++) a.f[i] = a.f[i] > b.f[i] ? a.f[i] : b.f[i]; return a; }
LC_F256(_mm256_fmadd_ps)(__m256 a, __m256 b, __m256 c) { for (int i = 0; i < 8; i++) a.f[i] = fmaf(a.f[i], b.f[i], c.f[i]); return a; }
LC_F256(_mm256_fnmadd_ps)(__m256 a, __m256 b, __m256 c) { for (int i = 0; i < 8; i++) a.f[i] = fmaf(-a.f[i], b.f[i], c.f[i]); return a; }
LC_F256(_mm256_andnot_ps)(__m256 a, __m256 b) {
    __m256 r; uint32_t x, y;
    for (int i = 0; i < 8; i++) { memcpy(&x, &a.f[i], 4); memcpy(&y, &b.f[i], 4); x = ~x & y; memcpy(&r.f[i], &x, 4); }
    return r;
}
LC_F256(_mm256_cvtepi32_ps)(__m256i a) { __m256 r; for (int i = 0; i < 8; i++) r.f[i] = (float)a.i32[i]; return r; }
/* round to nearest even (the default MXCSR mode, which is what the kernels pass). */
LC_F256(_mm256_round_ps)(__m256 a, int mode) { (void)mode; for (int i = 0; i < 8; i++) a.f[i] = nearbyintf(a.f[i]); return a; }
LC_I256(_mm256_cvtps_epi32)(__m256 a) { __m256i r; for (int i = 0; i < 8; i++) r.i32[i] = (int32_t)lrintf(a.f[i]); return r; }
LC_F256(_mm256_castsi256_ps)(__m256i a) { __m256 r; memcpy(&r, &a, 32); return r; }
LC_F256(_mm256_cvtph_ps)(__m128i a) { __m256 r; for (int i = 0; i < 8; i++) r.f[i] = _cvtsh_ss(a.u16[i]); return r; }
static inline __m128 _mm256_castps256_ps128(__m256 a) { __m128 r; memcpy(&r, &a, 16); return r; }
static inline __m128 _mm256_extractf128_ps(__m256 a, int i) { __m128 r; memcpy(&r, &a.f[4 * (i & 1)], 16); return r; }
static inline __m128 _mm_add_ps(__m128 a, __m128 b) { for (int i = 0; i < 4; i++) a.f[i] += b.f[i]; return a; }
static inline __m128 _mm_mul_ps(__m128 a, __m128 b) { for (int i = 0; i < 4; i++) a.f[i] *= b.f[i]; return a; }
static inline __m128 _mm_setzero_ps(void) { __m128 r; for (int i = 0; i < 4; i++) r.f[i] = 0.0f; return r; }
static inline __m128 _mm_castsi128_ps(__m128i a) { __m128 r; memcpy(&r, &a, 16); return r; }
static inline __m128 _mm_cvtph_ps(__m128i a) { __m128 r; for (int i = 0; i < 4; i++) r.f[i] = _cvtsh_ss(a.u16[i]); return r; }
LC_F256(_mm256_broadcastss_ps)(__m128 a) { __m256 r; for (int i = 0; i < 8; i++) r.f[i] = a.f[0]; return r; }
static inline __m128 _mm_max_ps(__m128 a, __m128 b) { for (int i = 0; i < 4; i++) a.f[i] = a.f[i] > b.f[i] ? a.f[i] : b.f[i]; return a; }
static inline __m128 _mm_movehl_ps(__m128 a, __m128 b) { a.f[0] = b.f[2]; a.f[1] = b.f[3]; return a; }
static inline __m128 _mm_movehdup_ps(__m128 a) { a.f[0] = a.f[1]; a.f[2] = a.f[3]; return a; }
static inline __m128 _mm_add_ss(__m128 a, __m128 b) { a.f[0] += b.f[0]; return a; }
static inline __m128 _mm_max_ss(__m128 a, __m128 b) { a.f[0] = a.f[0] > b.f[0] ? a.f[0] : b.f[0]; return a; }
static inline float _mm_cvtss_f32(__m128 a) { return a.f[0]; }

#endif /* portable */

/* --- helpers shared by both builds (built from the intrinsics above) --- */

/* Prefetch a cache line for reading into all cache levels (never faults, even past the end). */
/* lc_prefetch_l2: into L2 (and L3) only, for data wanted a few microseconds later, more than L1 holds. */
#if defined(__GNUC__)
#define lc_prefetch(p) __builtin_prefetch((const void*)(p), 0, 3)
#define lc_prefetch_l2(p) __builtin_prefetch((const void*)(p), 0, 2)
#else
#define lc_prefetch(p) ((void)(p))
#define lc_prefetch_l2(p) ((void)(p))
#endif

/* Every cache line of the nbytes from p on, requested as lc_prefetch / lc_prefetch_l2 request one: a tile of
 * weights or a run of cached rows that the caller reads next. */
static inline void lc_prefetch_span(const void *p, ptrdiff_t nbytes) {
    for (const char *c = (const char *)p, *end = c + nbytes; c < end; c += 64) lc_prefetch(c);
}

static inline void lc_prefetch_span_l2(const void *p, ptrdiff_t nbytes) {
    for (const char *c = (const char *)p, *end = c + nbytes; c < end; c += 64) lc_prefetch_l2(c);
}

/* Keep the compiler from fusing x into a following add (FMA contraction): dequantization must round the
   product and the sum separately, exactly as the numpy reference does. */
static inline float lc_no_contract(float x) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && defined(__SSE__)
    __asm__("" : "+x"(x));
#else
    volatile float v = x; x = v;
#endif
    return x;
}

#endif /* LLAMACY_SIMD_H */
