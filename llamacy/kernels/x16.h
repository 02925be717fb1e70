/* A prompt's products over two 8-row tiles at once, in 512-bit vectors: rows of tile A in lanes 0..7, of
 * tile B in lanes 8..15. For the legacy types' load-time tiles (matmul512_x8.pxi's x8rec, x8rec_min,
 * x8rec_q8), their per-product records (matmul512_lanes.pxi's lanerec) and the K-quants' (matmul512_klanes.pxi's
 * klanerec, which Q4_K's load-time tiles expand into).
 *
 * Why. The 8-row tiles take one token's 4 quants as a broadcast from memory for each dpbusd: one load per
 * 32 multiply-adds, and on Zen 4 the loads, not the multipliers, bound a prompt's products (its 512-bit
 * dpbusd is double-pumped: the same multiplier slots per multiply-add as two 256-bit ones). Two tiles in one
 * zmm take each broadcast once for 16 rows, and the float steps (conversion, scale product, FMA) run once
 * per 16 rows. One thread, 2048 x 2048, 256 tokens, in cache (BENCHMARKS.md): Q4_0 206 -> 325 GFLOP/s,
 * Q8_0 203 -> 310, Q4_K 242 -> 312, Q6_K 188 -> 261.
 *
 * Float order: each lane is one row's chain, the very operations of x8_tile, lanes_tile and klanes_tile on
 * the same values in the same order (seed + exact dpbusd sums, one conversion, d_w * d_x, one FMA per block;
 * the mins' chain beside it and added or subtracted at the end), so the bits are theirs
 * (tests/test_repack.py, tests/test_kernels_512.py; the module is built with -ffp-contract=off). Only
 * matmul512 includes this (compiled with the AVX-512 flags).
 */
#ifndef LLAMACY_X16_H
#define LLAMACY_X16_H

#include <immintrin.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "qblocks.h"

/* Q4_0, Q4_1 and Q8_0 load-time tiles (x8rec, x8rec_min, x8rec_q8: fp16 scales, Q4 nibbles packed; Q5_0's
 * x8rec_q5 comes here expanded into lane records, matmul512_x8.pxi's x8_product), and the
 * legacy types' per-product records (matmul512_lanes.pxi's lanerec: 8 groups of unsigned quants, fp32
 * scales and mins; LANE without a min chain, LANE_MIN with one). */
enum { LC_X16_Q4_0 = 0, LC_X16_Q4_1 = 1, LC_X16_Q8_0 = 2, LC_X16_LANE = 3, LC_X16_LANE_MIN = 4 };
/* Tokens per tile: 8 for the legacy types (weights loaded once per 8 tokens; 1.13-1.21x 4 in llama-3.2-1b's
 * pp512), 6 for the K-quants, whose three accumulators per token fill the 32 registers sooner. */
#define LC_X16_MAXT 8
#define LC_X16_TK 6

static inline uint32_t lc_x16_u32(const int8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The two tiles' 8-row halves of a 256-bit field, side by side. */
static inline __m512i lc_x16_pair(const void *a, const void *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

static inline __m512 lc_x16_halfs(const uint8_t *a, const uint8_t *b) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)), _mm_loadu_si128((const __m128i *)b), 1));
}

/* T tokens (1..LC_X16_MAXT) from y (nb blocks apart; sums: their seeds, unused for Q4_1) against the records of tiles
 * A (ra) and B (rb), rsz bytes a record; out[t * ldo + r] for r < 16. */
static inline __attribute__((always_inline)) void
lc_x16_tile(const int kind, const int T, const uint8_t *ra, const uint8_t *rb, const ptrdiff_t rsz,
            const lc_q8a *y, const int32_t *sums, const ptrdiff_t nb, float *out, const ptrdiff_t ldo) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const int lane = kind == LC_X16_LANE || kind == LC_X16_LANE_MIN;
    const int with_min = kind == LC_X16_Q4_1 || kind == LC_X16_LANE_MIN;
    const ptrdiff_t qoff = lane ? 0 : kind == LC_X16_Q4_1 ? 32 : 16;
    __m512 acc[LC_X16_MAXT], mins[LC_X16_MAXT], dw, mw = _mm512_setzero_ps();
    __m512i wq[8];
    for (int t = 0; t < T; t++) {
        acc[t] = _mm512_setzero_ps();
        mins[t] = _mm512_setzero_ps();
    }
    for (ptrdiff_t b = 0; b < nb; b++) {
        const uint8_t *a = ra + b * rsz, *c = rb + b * rsz;
        if (kind == LC_X16_Q8_0 || lane) {
            for (int g = 0; g < 8; g++)
                wq[g] = lc_x16_pair(a + qoff + 32 * g, c + qoff + 32 * g);
        } else {
            for (int g = 0; g < 4; g++) {
                __m512i p = lc_x16_pair(a + qoff + 32 * g, c + qoff + 32 * g);
                wq[g] = _mm512_and_si512(p, m4);
                wq[g + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), m4);
            }
        }
        if (lane) {
            dw = _mm512_castsi512_ps(lc_x16_pair(a + 256, c + 256));
            if (with_min)
                mw = _mm512_castsi512_ps(lc_x16_pair(a + 288, c + 288));
        } else {
            dw = lc_x16_halfs(a, c);
            if (with_min)
                mw = lc_x16_halfs(a + 16, c + 16);
        }
        for (int t = 0; t < T; t++) {
            const lc_q8a *yb = y + t * nb + b;
            __m512i lo = _mm512_set1_epi32(with_min ? 0 : sums[t * nb + b]);
            __m512i hi = _mm512_setzero_si512();
            for (int g = 0; g < 4; g++) {
                lo = _mm512_dpbusd_epi32(lo, wq[g], _mm512_set1_epi32((int)lc_x16_u32(yb->qs + 4 * g)));
                hi = _mm512_dpbusd_epi32(hi, wq[g + 4], _mm512_set1_epi32((int)lc_x16_u32(yb->qs + 16 + 4 * g)));
            }
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)),
                                     _mm512_mul_ps(dw, _mm512_set1_ps(yb->d)), acc[t]);
            if (with_min)
                mins[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(yb->s), mins[t]);
        }
    }
    for (int t = 0; t < T; t++) {
        if (with_min)
            acc[t] = _mm512_add_ps(acc[t], mins[t]);
        _mm512_storeu_ps(out + t * ldo, acc[t]);
    }
}

#define LC_X16_CASE(KIND, N)                                                                                   \
    case N:                                                                                                    \
        lc_x16_tile(KIND, N, a, b, rsz, x + t * nb, sums ? sums + t * nb : sums, nb, Y + t * ldy, ldy);        \
        break;

#define LC_X16_TOKENS(NAME, KIND)                                                                              \
    static void NAME(const void *ra, const void *rb, ptrdiff_t rsz, const void *X, const int32_t *sums,        \
                     ptrdiff_t t0, ptrdiff_t t1, ptrdiff_t nb, float *Y, ptrdiff_t ldy) {                      \
        const lc_q8a *x = (const lc_q8a *)X;                                                                   \
        const uint8_t *a = (const uint8_t *)ra, *b = (const uint8_t *)rb;                                      \
        for (ptrdiff_t t = t0; t < t1; t += LC_X16_MAXT) {                                                     \
            switch (t1 - t < LC_X16_MAXT ? t1 - t : LC_X16_MAXT) {                                             \
                LC_X16_CASE(KIND, 1)                                                                           \
                LC_X16_CASE(KIND, 2)                                                                           \
                LC_X16_CASE(KIND, 3)                                                                           \
                LC_X16_CASE(KIND, 4)                                                                           \
                LC_X16_CASE(KIND, 5)                                                                           \
                LC_X16_CASE(KIND, 6)                                                                           \
                LC_X16_CASE(KIND, 7)                                                                           \
                LC_X16_CASE(KIND, 8)                                                                           \
            }                                                                                                  \
        }                                                                                                      \
    }

/* Tokens [t0, t1) of X against the tile pair, rows of the output from Y (Y + t * ldy + r, r < 16): the
 * caller passes Y at the pair's first row. sums: the tokens' seeds from token 0 (NULL for Q4_1). */
LC_X16_TOKENS(lc_x16_q4_0, LC_X16_Q4_0)
LC_X16_TOKENS(lc_x16_q4_1, LC_X16_Q4_1)
LC_X16_TOKENS(lc_x16_q8_0, LC_X16_Q8_0)
LC_X16_TOKENS(lc_x16_lane, LC_X16_LANE)
LC_X16_TOKENS(lc_x16_lane_min, LC_X16_LANE_MIN)

/* ---- K-quants: matmul512_klanes.pxi's klanerec (Q4_K, Q5_K, Q6_K; Q4_K's load-time tiles expand into it) */

typedef struct {
    uint8_t u[64][32];
    int32_t sc[16][8];
    int32_t pr[8][8];
    float d[8];
    float dmin[8];
} lc_x16_krec;

enum { LC_X16_K4 = 0, LC_X16_K6 = 1 };

/* klanes_tile's steps for two tiles: T tokens (1..LC_X16_TK) from y (nb super-blocks apart; pairs: Q4_K's
 * ktoken_pairs, unused for Q6_K, which takes the token's bsums) against records ra, rb; out[t * ldo + r]. */
static inline __attribute__((always_inline)) void
lc_kx16_tile(const int kind, const int T, const lc_x16_krec *ra, const lc_x16_krec *rb, const lc_q8k *y,
             const int32_t *pairs, const ptrdiff_t nb, float *out, const ptrdiff_t ldo) {
    const int npr = kind == LC_X16_K6 ? 8 : 4;
    const __m512i zero = _mm512_setzero_si512();
    __m512 fa[LC_X16_TK], fm[LC_X16_TK], dw, dm = _mm512_setzero_ps();
    __m512i ia[LC_X16_TK], wq[8];
    for (int t = 0; t < T; t++) {
        fa[t] = _mm512_setzero_ps();
        fm[t] = _mm512_setzero_ps();
    }
    for (ptrdiff_t b = 0; b < nb; b++) {
        const lc_x16_krec *ka = ra + b, *kb = rb + b;
        for (int t = 0; t < T; t++)
            ia[t] = zero;
        for (int p = 0; p < 8; p++) {
            for (int g = 0; g < 8; g++)
                wq[g] = lc_x16_pair(ka->u[8 * p + g], kb->u[8 * p + g]);
            __m512i s0, s1 = zero;
            if (kind == LC_X16_K6) {
                s0 = lc_x16_pair(ka->sc[2 * p], kb->sc[2 * p]);
                s1 = lc_x16_pair(ka->sc[2 * p + 1], kb->sc[2 * p + 1]);
            } else {
                s0 = lc_x16_pair(ka->sc[p], kb->sc[p]);
            }
            for (int t = 0; t < T; t++) {
                const int8_t *xq = (y + t * nb + b)->qs + 32 * p;
                __m512i lo = _mm512_dpbusd_epi32(zero, wq[0], _mm512_set1_epi32((int)lc_x16_u32(xq)));
                __m512i hi = _mm512_dpbusd_epi32(zero, wq[4], _mm512_set1_epi32((int)lc_x16_u32(xq + 16)));
                for (int g = 1; g < 4; g++) {
                    lo = _mm512_dpbusd_epi32(lo, wq[g], _mm512_set1_epi32((int)lc_x16_u32(xq + 4 * g)));
                    hi = _mm512_dpbusd_epi32(hi, wq[g + 4], _mm512_set1_epi32((int)lc_x16_u32(xq + 16 + 4 * g)));
                }
                if (kind == LC_X16_K6)
                    ia[t] = _mm512_add_epi32(ia[t], _mm512_add_epi32(_mm512_mullo_epi32(lo, s0),
                                                                     _mm512_mullo_epi32(hi, s1)));
                else
                    ia[t] = _mm512_add_epi32(ia[t], _mm512_mullo_epi32(_mm512_add_epi32(lo, hi), s0));
            }
        }
        dw = _mm512_castsi512_ps(lc_x16_pair(ka->d, kb->d));
        if (kind == LC_X16_K4)
            dm = _mm512_castsi512_ps(lc_x16_pair(ka->dmin, kb->dmin));
        __m512i pr[8];
        for (int g = 0; g < npr; g++)
            pr[g] = lc_x16_pair(ka->pr[g], kb->pr[g]);
        for (int t = 0; t < T; t++) {
            const lc_q8k *yb = y + t * nb + b;
            int32_t pp[8];
            if (kind == LC_X16_K6)
                memcpy(pp, yb->bsums, sizeof(pp));
            else
                memcpy(pp, pairs + 4 * (t * nb + b), 4 * sizeof(int32_t));
            __m512i im = _mm512_dpwssd_epi32(zero, pr[0], _mm512_set1_epi32(pp[0]));
            for (int g = 1; g < npr; g++)
                im = _mm512_dpwssd_epi32(im, pr[g], _mm512_set1_epi32(pp[g]));
            const __m512 dx = _mm512_set1_ps(yb->d);
            if (kind == LC_X16_K4) {
                fa[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t]), _mm512_mul_ps(dw, dx), fa[t]);
                fm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(dm, dx), fm[t]);
            } else {
                fa[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(ia[t], _mm512_slli_epi32(im, 5))),
                                        _mm512_mul_ps(dw, dx), fa[t]);
            }
        }
    }
    for (int t = 0; t < T; t++)
        _mm512_storeu_ps(out + t * ldo, kind == LC_X16_K4 ? _mm512_sub_ps(fa[t], fm[t]) : fa[t]);
}

#define LC_KX16_CASE(KIND, N)                                                                                  \
    case N:                                                                                                    \
        lc_kx16_tile(KIND, N, a, b, x + t * nb, pairs ? pairs + 4 * t * nb : pairs, nb, Y + t * ldy, ldy);     \
        break;

#define LC_KX16_TOKENS(NAME, KIND)                                                                             \
    static void NAME(const void *ra, const void *rb, const void *X, const int32_t *pairs, ptrdiff_t t0,        \
                     ptrdiff_t t1, ptrdiff_t nb, float *Y, ptrdiff_t ldy) {                                    \
        const lc_q8k *x = (const lc_q8k *)X;                                                                   \
        const lc_x16_krec *a = (const lc_x16_krec *)ra, *b = (const lc_x16_krec *)rb;                          \
        for (ptrdiff_t t = t0; t < t1; t += LC_X16_TK) {                                                       \
            switch (t1 - t < LC_X16_TK ? t1 - t : LC_X16_TK) {                                                 \
                LC_KX16_CASE(KIND, 1)                                                                          \
                LC_KX16_CASE(KIND, 2)                                                                          \
                LC_KX16_CASE(KIND, 3)                                                                          \
                LC_KX16_CASE(KIND, 4)                                                                          \
                LC_KX16_CASE(KIND, 5)                                                                          \
                LC_KX16_CASE(KIND, 6)                                                                          \
            }                                                                                                  \
        }                                                                                                      \
    }

/* Tokens [t0, t1) of X against the klanerec records of two tiles (16 rows; Y at the pair's first row).
 * pairs: Q4_K/Q5_K's ktoken_pairs from token 0 (NULL for Q6_K). */
LC_KX16_TOKENS(lc_kx16_q4_k, LC_X16_K4)
LC_KX16_TOKENS(lc_kx16_q6_k, LC_X16_K6)

#endif /* LLAMACY_X16_H */
