/* Intel AMX (Advanced Matrix Extensions) for matmul512's prefill: turning the tile unit on, configuring it,
 * and the 16 x 16 tiles (declared for Cython in simd512.pxd; matmul512_amx.pxi packs the records and drives
 * the tiles).
 *
 * The tile instructions name their registers as immediates and read a 64-byte configuration, so the tiles
 * live here, in C, with the register roles fixed per product call (lc_amx_config, lc_amx_config_k), and so
 * does each tile's float work, whose 16 accumulators of 16 floats this C keeps in registers (GCC kept Cython's
 * array of them on the stack: 10% slower). The legacy types' roles:
 *   tmm0  A, 16 tokens x 32 quants (int8)        tmm2  C, 16 tokens x 16 rows (int32)
 *   tmm1  B, 8 steps x 16 rows x 4 values
 * B is a block of 16 rows as matmul512_amx.pxi packs it (lc_amxrec: step g holds values 4g..4g+3 of the 16
 * rows, row r in bytes 4r..4r+3, signed). TDPBSSD gives each (token, row) the block's exact int32 sum: the very
 * integer the VNNI dpbusd chains make; Q5_K's tile takes it per sub-block of 32 values on the same roles.
 * Q4_K's and Q6_K's tiles (lc_amx_roles_k) take a whole super-block per (token, row), their sub-block scales
 * folded into the quants (lc_k4amxrec, lc_k3amxrec). The float steps after
 * the tile unit are the VNNI kernels' (lanes_tile, klanes_tile), the same operations on the same values in the
 * same order per (row, token), so the bits are theirs (the module is built with -ffp-contract=off: no product
 * is fused behind our back).
 *
 * Only matmul512 includes this. Without compiler support (-mamx-tile -mamx-int8: setup.py adds them where
 * the compiler takes them) or off Linux/x86-64, LC_AMX is 0, lc_amx_enable() says no and the tiles are never
 * called.
 */
#ifndef LLAMACY_AMX_H
#define LLAMACY_AMX_H

#include <stdint.h>
#include <stddef.h>

/* GCC spells the features __AMX_TILE__ and __AMX_INT8__, clang 14 __AMXTILE__ and __AMXINT8__. */
#if (defined(__AMX_TILE__) || defined(__AMXTILE__)) && (defined(__AMX_INT8__) || defined(__AMXINT8__)) \
    && defined(__x86_64__) && defined(__linux__)
#define LC_AMX 1
#include <cpuid.h>
#include <string.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define LC_AMX 0
#endif

/* One 32-value block of 16 rows (the legacy types): q[g] the 64 bytes of step g, signed (the stored quant,
 * less the offset the VNNI kernels' unsigned form adds); d, m: the rows' fp32 scales and mins (Q4_1, Q5_1). */
typedef struct {
    int8_t q[8][64];
    float d[16];
    float m[16];
} lc_amxrec;

/* One super-block of 16 rows (Q4_K, Q5_K, Q6_K), as packed from two klanerecs and then scaled into the records
 * below: u[s] the 64 bytes of step s (values below 64); sc, pr, d, dmin: matmul512_klanes.pxi's klanerec
 * fields, for 16 rows. */
typedef struct {
    int8_t u[64][64];
    int32_t sc[16][16];
    int32_t pr[8][16];
    float d[16];
    float dmin[16];
} lc_kamxrec;

/* One super-block of 16 Q4_K rows for the scaled tiles (lc_amx_k4_tile): step s as in lc_kamxrec, each value
 * multiplied by its sub-block scale split in two (scale = 8 hi + lo, each below 8, so that value x part stays
 * below 128, a signed byte): lo[s] the values times the low part, hi[s] times the high part. The tile unit then
 * sums a whole super-block's scaled products at once (isum = 8 C_hi + C_lo, the same integer as the sum over
 * sub-blocks of scale x the sub-block's sum) with no int32 multiplies after it. pr, d, dmin: lc_kamxrec's. */
typedef struct {
    int8_t lo[64][64];
    int8_t hi[64][64];
    int32_t pr[4][16];
    float d[16];
    float dmin[16];
} lc_k4amxrec;

/* One super-block of 16 Q6_K rows for the scaled tiles (lc_amx_k6_tile): step s as in lc_kamxrec, the values
 * made signed (u - 32, -32..31) and multiplied by the balanced base-7 digits of their group's signed scale
 * (scale = 49 e2 + 7 e1 + e0, digits -3..3, so every product stays within +-96, a signed byte): e[i][s] the
 * values times digit i. The tile unit then sums a whole super-block (isum = 49 C2 + 7 C1 + C0: the same
 * integer as the VNNI chain's sum of scale x group sum less 32 x the scales' pairs . the bsums). d: the rows'
 * super-block scales. */
typedef struct {
    int8_t e[3][64][64];
    float d[16];
} lc_k3amxrec;

#include "qblocks.h" /* the activation blocks: lc_q8a, lc_q8k */

#define LC_ARCH_REQ_XCOMP_PERM 0x1023
#define LC_XFEATURE_XTILEDATA 18

/* 1 if this build has the tile steps, this CPU has AMX-TILE and AMX-INT8, the OS saves the tile state
 * (XCR0 bits 17 and 18) and lets this process use it (arch_prctl: Linux asks each process to request the
 * 8 KB tile state before its first tile instruction, which would otherwise fault). Once, at import. */
static int lc_amx_enable(void) {
#if LC_AMX
    unsigned int a, b, c, d, xlo, xhi;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return 0; /* AMX-TILE, AMX-INT8 */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return 0; /* OSXSAVE: XGETBV works */
    __asm__ __volatile__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & (3u << 17)) != (3u << 17)) return 0;
    return syscall(SYS_arch_prctl, LC_ARCH_REQ_XCOMP_PERM, LC_XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}

#if LC_AMX
typedef struct {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} lc_tilecfg;

/* The register roles above, as ldtilecfg reads them. A constant in memory: GCC 12 drops the stores that
 * would build it on the stack, as it does not see ldtilecfg read them (the tile unit then faults). */
static const lc_tilecfg lc_amx_roles = {
    .palette = 1,
    .colsb = {32, 64, 64},
    .rows = {16, 8, 16},
};

/* Q4_K's and Q6_K's scaled tiles (lc_amx_k4_tile, lc_amx_k6_tile) take 64 quants per tile step; every tile
 * 16 x 64 bytes.
 * Q4_K, two runs of 16 tokens per load of the weights:
 *   tmm0, tmm5  A, 16 tokens x 64 quants (run 0, run 1)    tmm2, tmm4  C lo, C hi of run 0 (int32)
 *   tmm1, tmm3  B lo, B hi, 16 steps x 16 rows x 4 values  tmm6, tmm7  C lo, C hi of run 1
 * Q6_K: tmm0 A; tmm1, tmm3, tmm5 B for digits 0, 1, 2; tmm2, tmm4, tmm6 their C. */
static const lc_tilecfg lc_amx_roles_k = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

/* Load the register roles into this thread's tile unit: once per product call (a thread's tile
 * configuration does not survive lc_amx_release). */
static inline void lc_amx_config(void) { _tile_loadconfig(&lc_amx_roles); }

/* The same for the scaled tiles: the product calls of Q4_K and Q6_K load these instead. */
static inline void lc_amx_config_k(void) { _tile_loadconfig(&lc_amx_roles_k); }

/* Give the tile state back (the OS then has 8 KB less to save on every switch of this thread). */
static inline void lc_amx_release(void) { _tile_release(); }

/* c[16 * t + r] = sum over k < 32 of a[t * astride + k] x value k of row r (the 8 steps of 64 bytes at b),
 * all signed. */
static inline void lc_amx_dot32(const void* a, size_t astride, const void* b, int32_t* c) {
    _tile_loadd(0, a, astride);
    _tile_loadd(1, b, 64);
    _tile_zero(2);
    _tile_dpbssd(2, 0, 1);
    _tile_stored(2, c, 64);
}

/* The legacy types' tile: the 16 rows of rec (nb blocks) x 16 tokens (token t's blocks at y + t * nb);
 * out[t * ldo + r] for r < nvalid. Per (row, token), block by block: acc = fma(float(isum), d_w * d_x, acc);
 * with_min (Q4_1, Q5_1): mins = fma(m_w, s_x, mins) beside it and acc + mins at the end (lanes_tile's). */
static void lc_amx_lanes_tile(const lc_amxrec* rec, const lc_q8a* y, ptrdiff_t nb, float* out, ptrdiff_t ldo,
                              int nvalid, int with_min) {
    int32_t c[2][256] __attribute__((aligned(64))); /* the tile unit fills one while the other is scaled */
    __m512 acc[16];
    __m512 dw, mins;
    const size_t astride = (size_t)nb * sizeof(lc_q8a);
    const __mmask16 keep = (__mmask16)((1u << nvalid) - 1);
    ptrdiff_t b;
    int t;
#pragma GCC unroll 16
    for (t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
    lc_amx_dot32(y[0].qs, astride, rec[0].q, c[0]);
    for (b = 0; b < nb; b++) {
        const int32_t* cb = c[b & 1];
        if (b + 1 < nb) lc_amx_dot32(y[b + 1].qs, astride, rec[b + 1].q, c[(b + 1) & 1]);
        dw = _mm512_loadu_ps(rec[b].d);
#pragma GCC unroll 16
        for (t = 0; t < 16; t++)
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cb + 16 * t)),
                                     _mm512_mul_ps(dw, _mm512_set1_ps(y[t * nb + b].d)), acc[t]);
    }
#pragma GCC unroll 16
    for (t = 0; t < 16; t++) {
        if (with_min) { /* the mins' chain, token by token (32 chains at once would not fit the registers) */
            mins = _mm512_setzero_ps();
            for (b = 0; b < nb; b++)
                mins = _mm512_fmadd_ps(_mm512_loadu_ps(rec[b].m), _mm512_set1_ps(y[t * nb + b].s), mins);
            acc[t] = _mm512_add_ps(acc[t], mins);
        }
        _mm512_mask_storeu_ps(out + t * ldo, keep, acc[t]);
    }
}

/* One token's float steps in the tiles of Q4_K and Q5_K (the VNNI kernels' klanes_tile order), 16 rows:
 * imin = the rows' min pairs (pr, 4 x 16 int32) . the token's pairs pp, a = fma(float(isum), d_w * d_x, a),
 * m = fma(float(imin), dmin_w * d_x, m), with a and m at fa and fm. */
static inline void lc_amx_kmin_step(__m512i isum, const int32_t* pr, const int32_t* pp, __m512 dw, __m512 dm,
                                    float d_x, float* fa, float* fm) {
    __m512i im = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(pr), _mm512_set1_epi32(pp[0]));
    __m512 dx = _mm512_set1_ps(d_x);
    int g;
    for (g = 1; g < 4; g++) im = _mm512_dpwssd_epi32(im, _mm512_loadu_si512(pr + 16 * g), _mm512_set1_epi32(pp[g]));
    _mm512_store_ps(fa, _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), _mm512_load_ps(fa)));
    _mm512_store_ps(fm, _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(dm, dx), _mm512_load_ps(fm)));
}

/* Y = a - m for ntok tokens x the 16 rows (those of keep), token t's row of out at out + t * ldo. */
static inline void lc_amx_kmin_out(const float* fav, const float* fmv, int ntok, float* out, ptrdiff_t ldo,
                                   __mmask16 keep) {
    int t;
    for (t = 0; t < ntok; t++)
        _mm512_mask_storeu_ps(out + t * ldo, keep,
                              _mm512_sub_ps(_mm512_load_ps(fav + 16 * t), _mm512_load_ps(fmv + 16 * t)));
}

/* Q5_K's tile (roles lc_amx_roles): the 16 rows of rec (nb super-blocks) x 16 tokens (token t's at y + t * nb;
 * pairs as for lc_amx_k4_tile); out[t * ldo + r] for r < nvalid. One tile step per sub-block of 32 values and
 * the scales applied after it, per (row, token) isum = sum_j sc_j * (sub-block j's int sum); the float steps
 * lc_amx_k4_tile's. Its 5-bit values times any fold of the 6-bit scale that fits a signed byte take three
 * tile steps per sub-block (base-4 digits): measured slower than this (a 2048 x 8192 product of 512 tokens on
 * one core: 41.6 against 32.2 ms). */
static void lc_amx_k5_tile(const lc_kamxrec* rec, const lc_q8k* y, const int32_t* pairs, ptrdiff_t nb, float* out,
                           ptrdiff_t ldo, int nvalid) {
    int32_t c[2][256] __attribute__((aligned(64)));
    float fav[256] __attribute__((aligned(64)));
    float fmv[256] __attribute__((aligned(64)));
    __m512i ia[16];
    __m512i sc;
    __m512 dw, dm;
    const size_t astride = (size_t)nb * sizeof(lc_q8k);
    ptrdiff_t b;
    int t, p;
    for (t = 0; t < 256; t++) fav[t] = fmv[t] = 0.0f;
    for (b = 0; b < nb; b++) {
        const lc_kamxrec* k = rec + b;
#pragma GCC unroll 16
        for (t = 0; t < 16; t++) ia[t] = _mm512_setzero_si512();
        lc_amx_dot32(y[b].qs, astride, k->u[0], c[0]);
        for (p = 0; p < 8; p++) { /* sub-block p: steps 8p..8p+7 */
            const int32_t* cb = c[p & 1];
            if (p + 1 < 8) lc_amx_dot32(y[b].qs + 32 * (p + 1), astride, k->u[8 * (p + 1)], c[(p + 1) & 1]);
            sc = _mm512_loadu_si512(k->sc[p]);
#pragma GCC unroll 16
            for (t = 0; t < 16; t++)
                ia[t] = _mm512_add_epi32(ia[t], _mm512_mullo_epi32(_mm512_load_si512(cb + 16 * t), sc));
        }
        dw = _mm512_loadu_ps(k->d);
        dm = _mm512_loadu_ps(k->dmin);
#pragma GCC unroll 16
        for (t = 0; t < 16; t++)
            lc_amx_kmin_step(ia[t], k->pr[0], pairs + 4 * (t * nb + b), dw, dm, y[t * nb + b].d, fav + 16 * t,
                             fmv + 16 * t);
    }
    lc_amx_kmin_out(fav, fmv, 16, out, ldo, (__mmask16)((1u << nvalid) - 1));
}

/* The 16-row Q4_K records src (lc_kamxrec, nb super-blocks) as lc_k4amxrec: each value times the low and the
 * high part of its row's sub-block scale. The value (below 16) and the part (below 8) make at most 105, and
 * the two bytes of an int16 lane belong to one row, so one int16 multiply by that row's part scales both
 * bytes with no carry between them. */
static void lc_amx_pack_k4(const lc_kamxrec* src, ptrdiff_t nb, lc_k4amxrec* dst) {
    const __m512i seven = _mm512_set1_epi32(7);
    ptrdiff_t b;
    int j, s;
    for (b = 0; b < nb; b++) {
        for (j = 0; j < 8; j++) {
            __m512i sc = _mm512_loadu_si512(src[b].sc[j]);
            __m512i lo = _mm512_and_si512(sc, seven), hi = _mm512_srli_epi32(sc, 3);
            lo = _mm512_or_si512(lo, _mm512_slli_epi32(lo, 16));
            hi = _mm512_or_si512(hi, _mm512_slli_epi32(hi, 16));
            for (s = 8 * j; s < 8 * j + 8; s++) {
                __m512i u = _mm512_loadu_si512(src[b].u[s]);
                _mm512_storeu_si512(dst[b].lo[s], _mm512_mullo_epi16(u, lo));
                _mm512_storeu_si512(dst[b].hi[s], _mm512_mullo_epi16(u, hi));
            }
        }
        memcpy(dst[b].pr, src[b].pr, sizeof(dst[b].pr));
        memcpy(dst[b].d, src[b].d, sizeof(dst[b].d));
        memcpy(dst[b].dmin, src[b].dmin, sizeof(dst[b].dmin));
    }
}

/* One super-block's scaled sums for nrun runs of 16 tokens (1 or 2; token t's blocks at y + t * nb, astride
 * bytes apart) x the 16 rows of k: c[4 * run + 0] C lo, c[4 * run + 1] C hi, 256 int32 each (token by token). */
static inline void lc_amx_k4_sums(const lc_q8k* y, size_t astride, const lc_k4amxrec* k, int nrun, int32_t* c) {
    const int8_t* y1 = (const int8_t*)y->qs + 16 * astride;
    int s;
    _tile_zero(2);
    _tile_zero(4);
    if (nrun == 2) {
        _tile_zero(6);
        _tile_zero(7);
    }
    for (s = 0; s < 4; s++) {
        _tile_loadd(1, k->lo[16 * s], 64);
        _tile_loadd(3, k->hi[16 * s], 64);
        _tile_loadd(0, y->qs + 64 * s, astride);
        if (nrun == 2) _tile_loadd(5, y1 + 64 * s, astride);
        _tile_dpbssd(2, 0, 1);
        _tile_dpbssd(4, 0, 3);
        if (nrun == 2) {
            _tile_dpbssd(6, 5, 1);
            _tile_dpbssd(7, 5, 3);
        }
    }
    _tile_stored(2, c, 64);
    _tile_stored(4, c + 256, 64);
    if (nrun == 2) {
        _tile_stored(6, c + 512, 64);
        _tile_stored(7, c + 768, 64);
    }
}

/* Q4_K's tile from the scaled records (roles lc_amx_roles_k): the 16 rows of rec (nb super-blocks) x 16 * nrun
 * tokens (nrun 1 or 2; token t's at y + t * nb; pairs: its sums of quants per pair of sub-blocks, 4 per
 * super-block, as ktoken_pairs makes them); out[t * ldo + r] for r < nvalid. Per (row, token) and super-block,
 * the VNNI kernels' (klanes_tile's) float steps: isum = sum_j sc_j * (sub-block j's int sum) = 8 C_hi + C_lo,
 * imin = the min pairs . the token's pairs, a = fma(float(isum), d_w * d_x, a), m = fma(float(imin),
 * dmin_w * d_x, m); Y = a - m. */
static void lc_amx_k4_tile(const lc_k4amxrec* rec, const lc_q8k* y, const int32_t* pairs, ptrdiff_t nb,
                           float* out, ptrdiff_t ldo, int nvalid, int nrun) {
    int32_t c[2][1024] __attribute__((aligned(64))); /* one fills while the other is used */
    float fav[512] __attribute__((aligned(64)));
    float fmv[512] __attribute__((aligned(64)));
    __m512 dw, dm;
    const size_t astride = (size_t)nb * sizeof(lc_q8k);
    const int ntok = 16 * nrun;
    ptrdiff_t b;
    int t;
    for (t = 0; t < 16 * ntok; t++) fav[t] = fmv[t] = 0.0f;
    lc_amx_k4_sums(y, astride, rec, nrun, c[0]);
    for (b = 0; b < nb; b++) {
        const lc_k4amxrec* k = rec + b;
        const int32_t* cb = c[b & 1];
        if (b + 1 < nb) lc_amx_k4_sums(y + b + 1, astride, k + 1, nrun, c[(b + 1) & 1]);
        dw = _mm512_loadu_ps(k->d);
        dm = _mm512_loadu_ps(k->dmin);
        for (t = 0; t < ntok; t++) {
            const int32_t* ct = cb + 512 * (t >> 4) + 16 * (t & 15);
            lc_amx_kmin_step(_mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(ct + 256), 3), _mm512_load_si512(ct)),
                             k->pr[0], pairs + 4 * (t * nb + b), dw, dm, y[t * nb + b].d, fav + 16 * t, fmv + 16 * t);
        }
    }
    lc_amx_kmin_out(fav, fmv, ntok, out, ldo, (__mmask16)((1u << nvalid) - 1));
}

/* The 16-row Q6_K records src (lc_kamxrec, nb super-blocks) as lc_k3amxrec. A scale's balanced base-7 digits:
 * q = round(v / 7) (v / 7 is never within 1/14 of a half, so the float quotient rounds to the exact nearest
 * integer), digit = v - 7 q, from -3 to 3. Per 32 bytes (8 rows x 4 values): widened to int16, multiplied by
 * the rows' digit (each row's int32 digit spread over its 4 int16 lanes), narrowed back (the products fit). */
static void lc_amx_pack_k6(const lc_kamxrec* src, ptrdiff_t nb, lc_k3amxrec* dst) {
    const __m512i off = _mm512_set1_epi16(32);
    const __m512 inv7 = _mm512_set1_ps(1.0f / 7.0f);
    const __m512i seven = _mm512_set1_epi32(7);
    __m512i spread[2], dig[3][2];
    ptrdiff_t b;
    int16_t idx[32];
    int g, i, j, s, h;
    for (h = 0; h < 2; h++) { /* int16 lane j of half h <- the low half of int32 lane 8h + j / 4 */
        for (j = 0; j < 32; j++) idx[j] = (int16_t)(2 * (8 * h + j / 4));
        spread[h] = _mm512_loadu_si512(idx);
    }
    for (b = 0; b < nb; b++) {
        for (g = 0; g < 16; g++) {
            __m512i v = _mm512_loadu_si512(src[b].sc[g]), e[3], q;
            for (i = 0; i < 2; i++) {
                q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_cvtepi32_ps(v), inv7));
                e[i] = _mm512_sub_epi32(v, _mm512_mullo_epi32(q, seven));
                v = q;
            }
            e[2] = v;
            for (i = 0; i < 3; i++)
                for (h = 0; h < 2; h++) dig[i][h] = _mm512_permutexvar_epi16(spread[h], e[i]);
            for (s = 4 * g; s < 4 * g + 4; s++)
                for (h = 0; h < 2; h++) {
                    __m512i u = _mm512_sub_epi16(
                        _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)&src[b].u[s][32 * h])), off);
                    for (i = 0; i < 3; i++)
                        _mm256_storeu_si256((__m256i*)&dst[b].e[i][s][32 * h],
                                            _mm512_cvtepi16_epi8(_mm512_mullo_epi16(u, dig[i][h])));
                }
        }
        memcpy(dst[b].d, src[b].d, sizeof(dst[b].d));
    }
}

/* One Q6_K super-block's scaled sums for 16 tokens x the 16 rows of k: c + 256 i the C of digit i. */
static inline void lc_amx_k3_sums(const lc_q8k* y, size_t astride, const lc_k3amxrec* k, int32_t* c) {
    int s;
    _tile_zero(2);
    _tile_zero(4);
    _tile_zero(6);
    for (s = 0; s < 4; s++) {
        _tile_loadd(0, y->qs + 64 * s, astride);
        _tile_loadd(1, k->e[0][16 * s], 64);
        _tile_loadd(3, k->e[1][16 * s], 64);
        _tile_loadd(5, k->e[2][16 * s], 64);
        _tile_dpbssd(2, 0, 1);
        _tile_dpbssd(4, 0, 3);
        _tile_dpbssd(6, 0, 5);
    }
    _tile_stored(2, c, 64);
    _tile_stored(4, c + 256, 64);
    _tile_stored(6, c + 512, 64);
}

/* Q6_K's tile from the scaled records (roles lc_amx_roles_k), 16 rows x 16 tokens: per (row, token) and
 * super-block the VNNI kernels' float step, a = fma(float(isum), d_w * d_x, a) with isum = 49 C2 + 7 C1 + C0;
 * Y = a. */
static void lc_amx_k6_tile(const lc_k3amxrec* rec, const lc_q8k* y, ptrdiff_t nb, float* out, ptrdiff_t ldo,
                           int nvalid) {
    int32_t c[2][768] __attribute__((aligned(64))); /* one fills while the other is used */
    __m512 acc[16];
    __m512 dw;
    const __m512i k49 = _mm512_set1_epi32(49), k7 = _mm512_set1_epi32(7);
    const size_t astride = (size_t)nb * sizeof(lc_q8k);
    const __mmask16 keep = (__mmask16)((1u << nvalid) - 1);
    ptrdiff_t b;
    int t;
#pragma GCC unroll 16
    for (t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
    lc_amx_k3_sums(y, astride, rec, c[0]);
    for (b = 0; b < nb; b++) {
        const int32_t* cb = c[b & 1];
        if (b + 1 < nb) lc_amx_k3_sums(y + b + 1, astride, rec + b + 1, c[(b + 1) & 1]);
        dw = _mm512_loadu_ps(rec[b].d);
#pragma GCC unroll 16
        for (t = 0; t < 16; t++) {
            __m512i is = _mm512_add_epi32(
                _mm512_add_epi32(_mm512_mullo_epi32(_mm512_load_si512(cb + 512 + 16 * t), k49),
                                 _mm512_mullo_epi32(_mm512_load_si512(cb + 256 + 16 * t), k7)),
                _mm512_load_si512(cb + 16 * t));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(y[t * nb + b].d)),
                                     acc[t]);
        }
    }
#pragma GCC unroll 16
    for (t = 0; t < 16; t++) _mm512_mask_storeu_ps(out + t * ldo, keep, acc[t]);
}
#else
static inline void lc_amx_config(void) {}
static void lc_amx_k5_tile(const lc_kamxrec* rec, const lc_q8k* y, const int32_t* pairs, ptrdiff_t nb, float* out,
                           ptrdiff_t ldo, int nvalid) {
    (void)rec; (void)y; (void)pairs; (void)nb; (void)out; (void)ldo; (void)nvalid;
}
static inline void lc_amx_pack_k6(const lc_kamxrec* src, ptrdiff_t nb, lc_k3amxrec* dst) {
    (void)src; (void)nb; (void)dst;
}
static void lc_amx_k6_tile(const lc_k3amxrec* rec, const lc_q8k* y, ptrdiff_t nb, float* out, ptrdiff_t ldo,
                           int nvalid) {
    (void)rec; (void)y; (void)nb; (void)out; (void)ldo; (void)nvalid;
}
static inline void lc_amx_config_k(void) {}
static inline void lc_amx_pack_k4(const lc_kamxrec* src, ptrdiff_t nb, lc_k4amxrec* dst) {
    (void)src; (void)nb; (void)dst;
}
static void lc_amx_k4_tile(const lc_k4amxrec* rec, const lc_q8k* y, const int32_t* pairs, ptrdiff_t nb,
                           float* out, ptrdiff_t ldo, int nvalid, int nrun) {
    (void)rec; (void)y; (void)pairs; (void)nb; (void)out; (void)ldo; (void)nvalid; (void)nrun;
}
static inline void lc_amx_release(void) {}
static inline void lc_amx_dot32(const void* a, size_t s, const void* b, int32_t* c) {
    (void)a; (void)s; (void)b; (void)c;
}
static void lc_amx_lanes_tile(const lc_amxrec* rec, const lc_q8a* y, ptrdiff_t nb, float* out, ptrdiff_t ldo,
                              int nvalid, int with_min) {
    (void)rec; (void)y; (void)nb; (void)out; (void)ldo; (void)nvalid; (void)with_min;
}
#endif

#endif /* LLAMACY_AMX_H */
