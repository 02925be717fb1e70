/* The AVX-512 forms of a prompt block's products (attention_block.h), and the widening of float or half rows
 * into the float buffers that feed them.
 *
 * ops.pyx turns them on where the CPU has AVX-512F (and LLAMACY_NO_AVX512 is unset): the functions are
 * compiled for AVX-512F whatever the module's flags and run only then. A 16-float vector holds the 8 lanes
 * of two K rows (scores: the same 8 lanes and fma chains per row as lc_att_scores8's 8-float accumulators,
 * reduced in the same tree, lc_att_reduce8's) or 16 columns of the value sums (the same per-column chains as
 * lc_att_values_acc's). So the bits are the AVX2 kernels', and every path gives the same results with them
 * on or off (tests/test_attention_block.py).
 *
 * Decode's grouped pass (attention.h) stays on 8-float vectors: with its one token's 3 to 6 heads a group
 * the widening into a buffer is not shared enough to pay. Run there (Intel Xeon, 2 threads, one process
 * alternating): SmolLM2 decode at depth 2000 0.92x the 8-float pass's speed, 8 sequences at depth 100
 * 0.95x, qwen2.5-1.5b at depth 4000 1.01x.
 *
 * Included by attention_block.h, into ops.c only.
 */
#ifndef LLAMACY_ATTENTION512_H
#define LLAMACY_ATTENTION512_H

#define LC_ATT_WIDE_HD_MAX 512 /* the widest head the float buffers hold */

#if LC_ATT_SIMD
/* Rows row0..row0+nr of a float or half cache as floats into dst (nr * hd), or the rows themselves when
 * they are floats already. */
LC_ATT_INLINE const float *lc_att_widen_rows(const void *X, ptrdiff_t row0, ptrdiff_t nr, ptrdiff_t hd,
                                             float *dst, int fmt) {
    if (fmt == LC_KV_F32) return (const float *)X + row0 * hd;
    const uint16_t *h = (const uint16_t *)X + row0 * hd;
    for (ptrdiff_t i = 0; i < nr * hd; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    return dst;
}

#endif

#if LC_ATT_SIMD && defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define LC_ATT512 1
static int lc_att_use512 = 0;
#define LC_ATT512_INLINE static inline __attribute__((always_inline, target("avx512f")))

/* 8 rows from row0 as floats in pairs: rows 2c and 2c + 1 at dst + 2c * hd, 8 values of each in turn
 * (dst[2c * hd + 2d + l] = row 2c's value d + l, dst[2c * hd + 2d + 8 + l] row 2c + 1's, d a multiple of 8). */
LC_ATT_INLINE void lc_att_widen_pairs(const void *K, ptrdiff_t row0, ptrdiff_t hd, float *dst, int fmt) {
    for (ptrdiff_t r = 0; r < 8; r++) {
        float *o = dst + (r / 2) * 2 * hd + (r % 2) * 8;
        const float *f = (const float *)K + (row0 + r) * hd;
        const uint16_t *h = (const uint16_t *)K + (row0 + r) * hd;
        for (ptrdiff_t d = 0; d < hd; d += 8)
            _mm256_storeu_ps(o + 2 * d, fmt == LC_KV_F32 ? _mm256_loadu_ps(f + d)
                                                         : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + d))));
    }
}

/* Scores of 8 rows (in pairs, kp) for NQ <= 4 queries: query h at qv[h], its 8 scores to so[h][0..8). Per
 * row the fma chains of lc_att_scores8 (d ascending, lane l: values d + l); the reduction is
 * lc_att_reduce8's tree ((0+1)+(2+3))+((4+5)+(6+7)), then times scale, four rows per 128-bit group. */
LC_ATT512_INLINE void lc_att512_scores8(const float *const *qv, int NQ, const float *kp, ptrdiff_t hd, float scale,
                                        float *const *so) {
    __m512 a[4][4];
    for (int h = 0; h < NQ; h++)
        for (int c = 0; c < 4; c++) a[h][c] = _mm512_setzero_ps();
    for (ptrdiff_t d = 0; d < hd; d += 8) {
        const __m512 k0 = _mm512_loadu_ps(kp + 2 * d), k1 = _mm512_loadu_ps(kp + 2 * hd + 2 * d);
        const __m512 k2 = _mm512_loadu_ps(kp + 4 * hd + 2 * d), k3 = _mm512_loadu_ps(kp + 6 * hd + 2 * d);
        for (int h = 0; h < NQ; h++) {
            const __m512 q = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(qv[h] + d))));
            a[h][0] = _mm512_fmadd_ps(q, k0, a[h][0]);
            a[h][1] = _mm512_fmadd_ps(q, k1, a[h][1]);
            a[h][2] = _mm512_fmadd_ps(q, k2, a[h][2]);
            a[h][3] = _mm512_fmadd_ps(q, k3, a[h][3]);
        }
    }
    for (int h = 0; h < NQ; h++) {
        /* per 128-bit group: adjacent pairs summed (hadd), twice: group 0 then holds rows 0, 2, 4, 6's sums
         * of lanes 0..3, group 1 their lanes 4..7, groups 2 and 3 the same for rows 1, 3, 5, 7 */
        const __m512 h01 =
            _mm512_add_ps(_mm512_shuffle_ps(a[h][0], a[h][1], 0x88), _mm512_shuffle_ps(a[h][0], a[h][1], 0xDD));
        const __m512 h23 =
            _mm512_add_ps(_mm512_shuffle_ps(a[h][2], a[h][3], 0x88), _mm512_shuffle_ps(a[h][2], a[h][3], 0xDD));
        const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(h01, h23, 0x88), _mm512_shuffle_ps(h01, h23, 0xDD));
        const __m512 s = _mm512_mul_ps(_mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, 0xB1)), _mm512_set1_ps(scale));
        const __m128 e = _mm512_castps512_ps128(s), o = _mm512_extractf32x4_ps(s, 2); /* rows 0 2 4 6, 1 3 5 7 */
        _mm_storeu_ps(so[h], _mm_unpacklo_ps(e, o));
        _mm_storeu_ps(so[h] + 4, _mm_unpackhi_ps(e, o));
    }
}

/* Scores over rows [first, jc) in blocks of 8 for the QN queries (query k: token k / G, head k % G; its scores
 * from position first at scores + k * ss); buf holds a block of 8 rows as floats. */
static __attribute__((noinline, target("avx512f"))) void
lc_att512_block_scores(const float *q, ptrdiff_t qs, const void *K, ptrdiff_t first, ptrdiff_t jc, ptrdiff_t hd,
                       ptrdiff_t G, ptrdiff_t QN, float scale, float *scores, ptrdiff_t ss, float *buf, int fmt) {
    for (ptrdiff_t j = first; j < jc; j += 8) {
        lc_att_widen_pairs(K, j, hd, buf, fmt);
        for (ptrdiff_t k = 0; k < QN; k += 4) {
            const int NQ = QN - k < 4 ? (int)(QN - k) : 4;
            const float *qv[4];
            float *so[4];
            for (int h = 0; h < NQ; h++) {
                qv[h] = q + (k + h) / G * qs + (k + h) % G * hd;
                so[h] = scores + (k + h) * ss + (j - first);
            }
            switch (NQ) { /* constant query counts: the accumulators stay in registers */
            case 4: lc_att512_scores8(qv, 4, buf, hd, scale, so); break;
            case 3: lc_att512_scores8(qv, 3, buf, hd, scale, so); break;
            case 2: lc_att512_scores8(qv, 2, buf, hd, scale, so); break;
            default: lc_att512_scores8(qv, 1, buf, hd, scale, so); break;
            }
        }
    }
}

/* acc[h] (+)= sum over rows r < nr of w[h][r] * row r of vf (floats, hd a row) for NQ <= 4 queries, columns
 * d0.. in C16 vectors of 16 (then one of 8 when C16 = 0): per column lc_att_values_acc's chain. */
LC_ATT512_INLINE void lc_att512_values(const float *const *w, int NQ, const float *vf, ptrdiff_t nr, ptrdiff_t hd,
                                       ptrdiff_t d0, int C16, float *const *acc, int init) {
    if (C16 == 0) {
        __m256 a[4];
        for (int h = 0; h < NQ; h++) a[h] = init ? _mm256_setzero_ps() : _mm256_loadu_ps(acc[h] + d0);
        for (ptrdiff_t r = 0; r < nr; r++) {
            const __m256 x = _mm256_loadu_ps(vf + r * hd + d0);
            for (int h = 0; h < NQ; h++) a[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(w[h] + r), x, a[h]);
        }
        for (int h = 0; h < NQ; h++) _mm256_storeu_ps(acc[h] + d0, a[h]);
        return;
    }
    __m512 a[4][4];
    for (int h = 0; h < NQ; h++)
        for (int c = 0; c < C16; c++) a[h][c] = init ? _mm512_setzero_ps() : _mm512_loadu_ps(acc[h] + d0 + 16 * c);
    for (ptrdiff_t r = 0; r < nr; r++) {
        __m512 x[4];
        for (int c = 0; c < C16; c++) x[c] = _mm512_loadu_ps(vf + r * hd + d0 + 16 * c);
        for (int h = 0; h < NQ; h++) {
            const __m512 wj = _mm512_set1_ps(w[h][r]);
            for (int c = 0; c < C16; c++) a[h][c] = _mm512_fmadd_ps(wj, x[c], a[h][c]);
        }
    }
    for (int h = 0; h < NQ; h++)
        for (int c = 0; c < C16; c++) _mm512_storeu_ps(acc[h] + d0 + 16 * c, a[h][c]);
}

#define LC_ATT512_VALUES_NQ(NQ)                                                                              \
    do {                                                                                                     \
        for (d0 = 0; d0 + 64 <= hd; d0 += 64) lc_att512_values(w, NQ, vf, nr, hd, d0, 4, acc, init);        \
        for (; d0 + 16 <= hd; d0 += 16) lc_att512_values(w, NQ, vf, nr, hd, d0, 1, acc, init);              \
        if (d0 < hd) lc_att512_values(w, NQ, vf, nr, hd, d0, 0, acc, init);                                  \
    } while (0)

/* The value sums of the QN queries (as lc_att512_block_scores) over nr rows of vf from row j (their weights
 * at position j of their scores rows). */
static __attribute__((noinline, target("avx512f"))) void
lc_att512_block_values(const float *vf, ptrdiff_t j, ptrdiff_t nr, ptrdiff_t first, ptrdiff_t hd, ptrdiff_t G,
                       ptrdiff_t QN, const float *scores, ptrdiff_t ss, float *out, ptrdiff_t os, int init) {
    for (ptrdiff_t k = 0; k < QN; k += 4) {
        const int NQ = QN - k < 4 ? (int)(QN - k) : 4;
        const float *w[4];
        float *acc[4];
        ptrdiff_t d0;
        for (int h = 0; h < NQ; h++) {
            w[h] = scores + (k + h) * ss + (j - first);
            acc[h] = out + (k + h) / G * os + (k + h) % G * hd;
        }
        switch (NQ) {
        case 4: LC_ATT512_VALUES_NQ(4); break;
        case 3: LC_ATT512_VALUES_NQ(3); break;
        case 2: LC_ATT512_VALUES_NQ(2); break;
        default: LC_ATT512_VALUES_NQ(1); break;
        }
    }
}
#else
#define LC_ATT512 0
#endif

/* Whether the attention kernels run on 16-float vectors (on: wanted, and compiled in); returns what they now
 * do. */
static int lc_attend_wide(int on) {
#if LC_ATT512
    lc_att_use512 = on;
    return lc_att_use512;
#else
    (void)on;
    return 0;
#endif
}

#endif
