/* Intel AMX (Advanced Matrix Extensions) for matmul512's prefill: turning the tile unit on, configuring it,
 * and the 16 x 16 tiles (declared for Cython in simd512.pxd; matmul512_amx.pxi packs the records and drives
 * the tiles).
 *
 * The tile instructions name their registers as immediates and read a 64-byte configuration, so the tiles
 * live here, in C, with the register roles fixed once (lc_amx_config), and so does each tile's float work,
 * whose 16 accumulators of 16 floats this C keeps in registers (GCC kept Cython's array of them on the
 * stack: 10% slower). The register roles:
 *   tmm0  A, 16 tokens x 32 quants (int8)        tmm3  A, 16 tokens x 16 quants
 *   tmm1  B, 8 steps x 16 rows x 4 values        tmm4  B, 4 steps x 16 rows x 4 values
 *   tmm2  C, 16 tokens x 16 rows (int32)
 * B is a block of 16 rows as matmul512_amx.pxi packs it (lc_amxrec, lc_kamxrec: step g holds values
 * 4g..4g+3 of the 16 rows, row r in bytes 4r..4r+3, signed). TDPBSSD gives each (token, row) the block's exact
 * int32 sum: the very integer the VNNI dpbusd chains make. The float steps after it are the VNNI kernels'
 * (lanes_tile, klanes_tile), the same operations on the same values in the same order per (row, token), so
 * the bits are theirs (the module is built with -ffp-contract=off: no product is fused behind our back).
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

/* One super-block of 16 rows (Q4_K, Q5_K, Q6_K): u[s] the 64 bytes of step s (values below 64: the same
 * bytes signed or not); sc, pr, d, dmin: matmul512_klanes.pxi's klanerec fields, for 16 rows. */
typedef struct {
    int8_t u[64][64];
    int32_t sc[16][16];
    int32_t pr[8][16];
    float d[16];
    float dmin[16];
} lc_kamxrec;

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
    .colsb = {32, 64, 64, 16, 64},
    .rows = {16, 8, 16, 16, 4},
};

/* Load the register roles into this thread's tile unit: once per product call (a thread's tile
 * configuration does not survive lc_amx_release). */
static inline void lc_amx_config(void) { _tile_loadconfig(&lc_amx_roles); }

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

/* The same over 16 values (Q6_K's groups): the 4 steps at b. */
static inline void lc_amx_dot16(const void* a, size_t astride, const void* b, int32_t* c) {
    _tile_loadd(3, a, astride);
    _tile_loadd(4, b, 64);
    _tile_zero(2);
    _tile_dpbssd(2, 3, 4);
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

/* The K-quants' tile: the 16 rows of rec (nb super-blocks) x 16 tokens (token t's at y + t * nb; Q4_K/Q5_K's
 * pairs: their sums of quants per pair of sub-blocks, 4 per super-block, as ktoken_pairs makes them);
 * out[t * ldo + r] for r < nvalid. Per (row, token) and super-block (klanes_tile's):
 *   Q4_K, Q5_K: isum = sum_j sc_j * (sub-block j's int sum), imin = the min pairs . the token's pairs,
 *               a = fma(float(isum), d_w * d_x, a), m = fma(float(imin), dmin_w * d_x, m); Y = a - m.
 *   Q6_K (q6):  isum = sum_g sc_g * (group g's int sum) - 32 * (the scale pairs . the token's bsums),
 *               a = fma(float(isum), d_w * d_x, a); Y = a. */
static void lc_amx_klanes_tile(const lc_kamxrec* rec, const lc_q8k* y, const int32_t* pairs, ptrdiff_t nb,
                               float* out, ptrdiff_t ldo, int nvalid, int q6) {
    int32_t c[2][256] __attribute__((aligned(64)));
    float fav[256] __attribute__((aligned(64)));
    float fmv[256] __attribute__((aligned(64)));
    __m512i ia[16];
    __m512i sc, im;
    __m512 dw, dm, dx, fa;
    const size_t astride = (size_t)nb * sizeof(lc_q8k);
    const __mmask16 keep = (__mmask16)((1u << nvalid) - 1);
    const int nsub = q6 ? 16 : 8, npr = q6 ? 8 : 4;
    ptrdiff_t b;
    int t, p, g;
    for (t = 0; t < 256; t++) fav[t] = fmv[t] = 0.0f;
    for (b = 0; b < nb; b++) {
        const lc_kamxrec* k = rec + b;
#pragma GCC unroll 16
        for (t = 0; t < 16; t++) ia[t] = _mm512_setzero_si512();
        if (q6) lc_amx_dot16(y[b].qs, astride, k->u[0], c[0]);
        else lc_amx_dot32(y[b].qs, astride, k->u[0], c[0]);
        for (p = 0; p < nsub; p++) { /* Q4_K sub-block p: steps 8p..8p+7; Q6_K group p: steps 4p..4p+3 */
            const int32_t* cb = c[p & 1];
            if (p + 1 < nsub) {
                if (q6) lc_amx_dot16(y[b].qs + 16 * (p + 1), astride, k->u[4 * (p + 1)], c[(p + 1) & 1]);
                else lc_amx_dot32(y[b].qs + 32 * (p + 1), astride, k->u[8 * (p + 1)], c[(p + 1) & 1]);
            }
            sc = _mm512_loadu_si512(k->sc[p]);
#pragma GCC unroll 16
            for (t = 0; t < 16; t++)
                ia[t] = _mm512_add_epi32(ia[t], _mm512_mullo_epi32(_mm512_load_si512(cb + 16 * t), sc));
        }
        dw = _mm512_loadu_ps(k->d);
        dm = q6 ? dw : _mm512_loadu_ps(k->dmin);
#pragma GCC unroll 16
        for (t = 0; t < 16; t++) {
            const lc_q8k* yb = y + t * nb + b;
            const int32_t* pp = q6 ? (const int32_t*)yb->bsums : pairs + 4 * (t * nb + b);
            im = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(k->pr[0]), _mm512_set1_epi32(pp[0]));
            for (g = 1; g < npr; g++)
                im = _mm512_dpwssd_epi32(im, _mm512_loadu_si512(k->pr[g]), _mm512_set1_epi32(pp[g]));
            dx = _mm512_set1_ps(yb->d);
            fa = _mm512_load_ps(fav + 16 * t);
            if (q6) {
                fa = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(ia[t], _mm512_slli_epi32(im, 5))),
                                     _mm512_mul_ps(dw, dx), fa);
            } else {
                fa = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t]), _mm512_mul_ps(dw, dx), fa);
                _mm512_store_ps(fmv + 16 * t, _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(dm, dx),
                                                              _mm512_load_ps(fmv + 16 * t)));
            }
            _mm512_store_ps(fav + 16 * t, fa);
        }
    }
    for (t = 0; t < 16; t++) {
        __m512 r = _mm512_load_ps(fav + 16 * t);
        if (!q6) r = _mm512_sub_ps(r, _mm512_load_ps(fmv + 16 * t));
        _mm512_mask_storeu_ps(out + t * ldo, keep, r);
    }
}
#else
static inline void lc_amx_config(void) {}
static inline void lc_amx_release(void) {}
static inline void lc_amx_dot32(const void* a, size_t s, const void* b, int32_t* c) {
    (void)a; (void)s; (void)b; (void)c;
}
static inline void lc_amx_dot16(const void* a, size_t s, const void* b, int32_t* c) {
    (void)a; (void)s; (void)b; (void)c;
}
static void lc_amx_lanes_tile(const lc_amxrec* rec, const lc_q8a* y, ptrdiff_t nb, float* out, ptrdiff_t ldo,
                              int nvalid, int with_min) {
    (void)rec; (void)y; (void)nb; (void)out; (void)ldo; (void)nvalid; (void)with_min;
}
static void lc_amx_klanes_tile(const lc_kamxrec* rec, const lc_q8k* y, const int32_t* pairs, ptrdiff_t nb,
                               float* out, ptrdiff_t ldo, int nvalid, int q6) {
    (void)rec; (void)y; (void)pairs; (void)nb; (void)out; (void)ldo; (void)nvalid; (void)q6;
}
#endif

#endif /* LLAMACY_AMX_H */
