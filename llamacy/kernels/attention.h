/* Query heads attending over cached positions first..last of one KV head (ops.pyx's attend_group).
 *
 * The plain loops it replaced made one dot product per position, each ending in its own horizontal sum,
 * and accumulated the output through memory. Here, with AVX2:
 *   - scores 8 positions at a time: 8 accumulators over head_dim, then one transpose-reduce (hadd tree)
 *     gives the 8 sums in one vector;
 *   - the weighted sum of V rows keeps 64 output floats in 8 registers while it walks the positions.
 * With the rows in cache that is about 5.5 ns per position at head_dim 64 (ops.py_attend over 96 and 512
 * positions). Inside the model, decoding reads the rows from memory and that dominates (forward.pyx's
 * _warm_kv). Without AVX2 (the portable build), or for a head_dim that is not a multiple of 8, the same
 * arithmetic runs as plain loops.
 *
 * The cached rows are float32 or IEEE half (the KV cache's type, `f16`): halves are widened as they are
 * loaded (F16C), so a half cache reads half the bytes for the same arithmetic. The kernel is written once,
 * with `f16` a constant that the two entry points fix (lc_attend_group, lc_attend_group_f16).
 *
 * With grouped-query attention the query heads of a KV group read the same rows: lc_attend_group runs
 * them together (one read of each row for the group), with every head's output bit for bit the one-head
 * kernel's, so the model gives the same results whichever way its heads are split among threads.
 *
 * Included into ops.c only, which is built with -ffast-math: the softmax loops call glibc's vector expf.
 */
#ifndef LLAMACY_ATTENTION_H
#define LLAMACY_ATTENTION_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "simd.h" /* _cvtsh_ss: F16C, or its exact portable twin */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LC_ATT_SIMD 1
#else
#define LC_ATT_SIMD 0
#endif

#define LC_ATT_INLINE static inline __attribute__((always_inline))

/* Element i of a cached row block: float32 or half. */
LC_ATT_INLINE float lc_kv_get(const void *p, ptrdiff_t i, int f16) {
    return f16 ? _cvtsh_ss(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* The float dot product of the ops module (ops.pyx's dot_f32 is this): eight partial sums, so it vectorises
 * even without -ffast-math. */
static inline float lc_dot_f32(const float *a, const float *b, ptrdiff_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    float s = 0.0f;
    for (int k = 0; k < 8; k++) s += acc[k];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

#if LC_ATT_SIMD
/* 8 cached values from element i on, as floats. */
LC_ATT_INLINE __m256 lc_kv_load8(const void *p, ptrdiff_t i, int f16) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)))
               : _mm256_loadu_ps((const float *)p + i);
}

/* out[0..8) = scale * the sums of accumulators a0..a7: hadd pairs within 128-bit halves; after two levels,
 * lane i of the low half holds the low-half sum of accumulator i (i < 4) and the high half the high-half
 * sums; t2 the same for accumulators 4..7. */
LC_ATT_INLINE void lc_att_reduce8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                                  __m256 a7, float scale, float *out) {
    __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 t2 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(t0, t2, 0x20), _mm256_permute2f128_ps(t0, t2, 0x31));
    _mm256_storeu_ps(out, _mm256_mul_ps(s, _mm256_set1_ps(scale)));
}

/* scores[j..j+8) = scale * dot(q, K row j+p) for p < 8; hd a multiple of 8. */
LC_ATT_INLINE void lc_att_scores8(const float *q, const void *K, ptrdiff_t j, ptrdiff_t hd, float scale,
                                  float *scores, int f16) {
    const ptrdiff_t k = j * hd;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (ptrdiff_t d = 0; d < hd; d += 8) {
        __m256 qv = _mm256_loadu_ps(q + d);
        a0 = _mm256_fmadd_ps(qv, lc_kv_load8(K, k + d, f16), a0);
        a1 = _mm256_fmadd_ps(qv, lc_kv_load8(K, k + hd + d, f16), a1);
        a2 = _mm256_fmadd_ps(qv, lc_kv_load8(K, k + 2 * hd + d, f16), a2);
        a3 = _mm256_fmadd_ps(qv, lc_kv_load8(K, k + 3 * hd + d, f16), a3);
        a4 = _mm256_fmadd_ps(qv, lc_kv_load8(K, k + 4 * hd + d, f16), a4);
        a5 = _mm256_fmadd_ps(qv, lc_kv_load8(K, k + 5 * hd + d, f16), a5);
        a6 = _mm256_fmadd_ps(qv, lc_kv_load8(K, k + 6 * hd + d, f16), a6);
        a7 = _mm256_fmadd_ps(qv, lc_kv_load8(K, k + 7 * hd + d, f16), a7);
    }
    lc_att_reduce8(a0, a1, a2, a3, a4, a5, a6, a7, scale, scores + j);
}

/* lc_att_scores8 for two query heads at once (qa -> sa, qb -> sb): each converted K vector serves both,
 * in two passes of 4 rows (8 accumulators). Every accumulator takes the very fma chain of lc_att_scores8
 * (d ascending) and the same reduction, so the scores are bit for bit its. */
LC_ATT_INLINE void lc_att_scores8x2(const float *qa, const float *qb, const void *K, ptrdiff_t j,
                                    ptrdiff_t hd, float scale, float *sa, float *sb, int f16) {
    __m256 ra[8], rb[8];
    for (int p = 0; p < 8; p += 4) {
        const ptrdiff_t k = (j + p) * hd;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (ptrdiff_t d = 0; d < hd; d += 8) {
            __m256 qva = _mm256_loadu_ps(qa + d), qvb = _mm256_loadu_ps(qb + d), kv;
            kv = lc_kv_load8(K, k + d, f16);
            a0 = _mm256_fmadd_ps(qva, kv, a0);
            b0 = _mm256_fmadd_ps(qvb, kv, b0);
            kv = lc_kv_load8(K, k + hd + d, f16);
            a1 = _mm256_fmadd_ps(qva, kv, a1);
            b1 = _mm256_fmadd_ps(qvb, kv, b1);
            kv = lc_kv_load8(K, k + 2 * hd + d, f16);
            a2 = _mm256_fmadd_ps(qva, kv, a2);
            b2 = _mm256_fmadd_ps(qvb, kv, b2);
            kv = lc_kv_load8(K, k + 3 * hd + d, f16);
            a3 = _mm256_fmadd_ps(qva, kv, a3);
            b3 = _mm256_fmadd_ps(qvb, kv, b3);
        }
        ra[p] = a0, ra[p + 1] = a1, ra[p + 2] = a2, ra[p + 3] = a3;
        rb[p] = b0, rb[p + 1] = b1, rb[p + 2] = b2, rb[p + 3] = b3;
    }
    lc_att_reduce8(ra[0], ra[1], ra[2], ra[3], ra[4], ra[5], ra[6], ra[7], scale, sa + j);
    lc_att_reduce8(rb[0], rb[1], rb[2], rb[3], rb[4], rb[5], rb[6], rb[7], scale, sb + j);
}

/* acc[d0..hd) (+)= sum over rows r < nr of w[r] * V row row0 + r (columns d0.., up to 64 of them): from
 * zero when init, else continuing the sums stored there. Per column the fma chain runs over r ascending,
 * so walking the rows in blocks, with the sums parked in memory between blocks (exact), gives the very
 * sums of one walk over all rows. */
LC_ATT_INLINE void lc_att_values_acc(const float *w, const void *V, ptrdiff_t row0, ptrdiff_t nr,
                                     ptrdiff_t hd, ptrdiff_t d0, float *acc, int init, int f16) {
    if (hd - d0 >= 64) {
        float *o = acc + d0;
        __m256 a0, a1, a2, a3, a4, a5, a6, a7;
        if (init) {
            a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        } else {
            a0 = _mm256_loadu_ps(o), a1 = _mm256_loadu_ps(o + 8), a2 = _mm256_loadu_ps(o + 16);
            a3 = _mm256_loadu_ps(o + 24), a4 = _mm256_loadu_ps(o + 32), a5 = _mm256_loadu_ps(o + 40);
            a6 = _mm256_loadu_ps(o + 48), a7 = _mm256_loadu_ps(o + 56);
        }
        for (ptrdiff_t r = 0; r < nr; r++) {
            const ptrdiff_t v = (row0 + r) * hd + d0;
            __m256 wj = _mm256_broadcast_ss(w + r);
            a0 = _mm256_fmadd_ps(wj, lc_kv_load8(V, v, f16), a0);
            a1 = _mm256_fmadd_ps(wj, lc_kv_load8(V, v + 8, f16), a1);
            a2 = _mm256_fmadd_ps(wj, lc_kv_load8(V, v + 16, f16), a2);
            a3 = _mm256_fmadd_ps(wj, lc_kv_load8(V, v + 24, f16), a3);
            a4 = _mm256_fmadd_ps(wj, lc_kv_load8(V, v + 32, f16), a4);
            a5 = _mm256_fmadd_ps(wj, lc_kv_load8(V, v + 40, f16), a5);
            a6 = _mm256_fmadd_ps(wj, lc_kv_load8(V, v + 48, f16), a6);
            a7 = _mm256_fmadd_ps(wj, lc_kv_load8(V, v + 56, f16), a7);
        }
        _mm256_storeu_ps(o, a0);
        _mm256_storeu_ps(o + 8, a1);
        _mm256_storeu_ps(o + 16, a2);
        _mm256_storeu_ps(o + 24, a3);
        _mm256_storeu_ps(o + 32, a4);
        _mm256_storeu_ps(o + 40, a5);
        _mm256_storeu_ps(o + 48, a6);
        _mm256_storeu_ps(o + 56, a7);
        return;
    }
    for (ptrdiff_t d = d0; d < hd; d += 8) { /* fewer than 64 columns left: one vector at a time */
        __m256 a = init ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + d);
        for (ptrdiff_t r = 0; r < nr; r++)
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(w + r), lc_kv_load8(V, (row0 + r) * hd + d, f16), a);
        _mm256_storeu_ps(acc + d, a);
    }
}

/* lc_att_values_acc over all columns for two heads at once (weights wa -> acca, wb -> accb): each
 * converted V vector serves both, 32 columns (8 accumulators) at a time. Per column the same fma chain
 * (r ascending, from zero or the parked sum), so the sums are bit for bit lc_att_values_acc's. */
LC_ATT_INLINE void lc_att_values_acc2(const float *wa, const float *wb, const void *V, ptrdiff_t row0,
                                      ptrdiff_t nr, ptrdiff_t hd, float *acca, float *accb, int init,
                                      int f16) {
    ptrdiff_t d0 = 0;
    for (; d0 + 32 <= hd; d0 += 32) {
        float *oa = acca + d0, *ob = accb + d0;
        __m256 a0, a1, a2, a3, b0, b1, b2, b3;
        if (init) {
            a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        } else {
            a0 = _mm256_loadu_ps(oa), a1 = _mm256_loadu_ps(oa + 8), a2 = _mm256_loadu_ps(oa + 16);
            a3 = _mm256_loadu_ps(oa + 24), b0 = _mm256_loadu_ps(ob), b1 = _mm256_loadu_ps(ob + 8);
            b2 = _mm256_loadu_ps(ob + 16), b3 = _mm256_loadu_ps(ob + 24);
        }
        for (ptrdiff_t r = 0; r < nr; r++) {
            const ptrdiff_t v = (row0 + r) * hd + d0;
            const __m256 wja = _mm256_broadcast_ss(wa + r), wjb = _mm256_broadcast_ss(wb + r);
            __m256 x = lc_kv_load8(V, v, f16);
            a0 = _mm256_fmadd_ps(wja, x, a0);
            b0 = _mm256_fmadd_ps(wjb, x, b0);
            x = lc_kv_load8(V, v + 8, f16);
            a1 = _mm256_fmadd_ps(wja, x, a1);
            b1 = _mm256_fmadd_ps(wjb, x, b1);
            x = lc_kv_load8(V, v + 16, f16);
            a2 = _mm256_fmadd_ps(wja, x, a2);
            b2 = _mm256_fmadd_ps(wjb, x, b2);
            x = lc_kv_load8(V, v + 24, f16);
            a3 = _mm256_fmadd_ps(wja, x, a3);
            b3 = _mm256_fmadd_ps(wjb, x, b3);
        }
        _mm256_storeu_ps(oa, a0), _mm256_storeu_ps(oa + 8, a1), _mm256_storeu_ps(oa + 16, a2);
        _mm256_storeu_ps(oa + 24, a3), _mm256_storeu_ps(ob, b0), _mm256_storeu_ps(ob + 8, b1);
        _mm256_storeu_ps(ob + 16, b2), _mm256_storeu_ps(ob + 24, b3);
    }
    for (; d0 < hd; d0 += 8) {
        __m256 a = init ? _mm256_setzero_ps() : _mm256_loadu_ps(acca + d0);
        __m256 b = init ? _mm256_setzero_ps() : _mm256_loadu_ps(accb + d0);
        for (ptrdiff_t r = 0; r < nr; r++) {
            const __m256 x = lc_kv_load8(V, (row0 + r) * hd + d0, f16);
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(wa + r), x, a);
            b = _mm256_fmadd_ps(_mm256_broadcast_ss(wb + r), x, b);
        }
        _mm256_storeu_ps(acca + d0, a);
        _mm256_storeu_ps(accb + d0, b);
    }
}

/* out[0..hd) *= inv: the weighted sums become the softmax average. */
LC_ATT_INLINE void lc_att_scale(float *out, ptrdiff_t hd, float inv) {
    const __m256 iv = _mm256_set1_ps(inv);
    for (ptrdiff_t d = 0; d < hd; d += 8)
        _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(out + d), iv));
}
#endif

/* The dot product of q with a cached row (the positions left over from the blocks of 8, and no-SIMD). */
LC_ATT_INLINE float lc_att_dot(const float *q, const void *K, ptrdiff_t row, ptrdiff_t hd, int f16) {
    if (!f16) return lc_dot_f32(q, (const float *)K + row, hd);
#if LC_ATT_SIMD
    if (hd % 8 == 0) { /* halves widened 8 at a time: the scalar loop converts one by one */
        __m256 a = _mm256_setzero_ps();
        for (ptrdiff_t d = 0; d < hd; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), lc_kv_load8(K, row + d, 1), a);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
    }
#endif
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    ptrdiff_t i = 0;
    for (; i + 8 <= hd; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += q[i + k] * lc_kv_get(K, row + i + k, 1);
    float s = 0.0f;
    for (int k = 0; k < 8; k++) s += acc[k];
    for (; i < hd; i++) s += q[i] * lc_kv_get(K, row + i, 1);
    return s;
}

/* scores[first..n) become exp(score - max) (softcapped first when softcap > 0); returns 1 / their sum. */
LC_ATT_INLINE float lc_att_softmax(float *scores, ptrdiff_t first, ptrdiff_t n, float softcap) {
    ptrdiff_t j;
    if (softcap > 0.0f)
        for (j = first; j < n; j++) scores[j] = softcap * tanhf(scores[j] / softcap);
    float m = -3.0e38f;
    for (j = first; j < n; j++) m = scores[j] > m ? scores[j] : m;
    float total = 0.0f;
    for (j = first; j < n; j++) {
        float w = expf(scores[j] - m);
        scores[j] = w;
        total += w;
    }
    return 1.0f / total;
}

/* K and V point at position 0 of the head's cache (rows of hd values); scores needs last + 1 floats. */
LC_ATT_INLINE void lc_attend_impl(const float *q, const void *K, const void *V, ptrdiff_t first, ptrdiff_t last,
                                  ptrdiff_t hd, float scale, float softcap, float *scores, float *out, int f16) {
    const ptrdiff_t n = last + 1;
    const int simd = LC_ATT_SIMD && hd % 8 == 0;
    ptrdiff_t j = first;
#if LC_ATT_SIMD
    if (simd)
        for (; j + 8 <= n; j += 8) lc_att_scores8(q, K, j, hd, scale, scores, f16);
#endif
    for (; j < n; j++) scores[j] = lc_att_dot(q, K, j * hd, hd, f16) * scale;
    const float inv = lc_att_softmax(scores, first, n, softcap);
#if LC_ATT_SIMD
    if (simd) {
        for (ptrdiff_t d0 = 0; d0 < hd; d0 += 64)
            lc_att_values_acc(scores + first, V, first, n - first, hd, d0, out, 1, f16);
        lc_att_scale(out, hd, inv);
        return;
    }
#endif
    for (ptrdiff_t d = 0; d < hd; d++) out[d] = 0.0f;
    for (j = first; j < n; j++) {
        const float w = scores[j] * inv;
        for (ptrdiff_t d = 0; d < hd; d++) out[d] += w * lc_kv_get(V, j * hd + d, f16);
    }
}

/* lc_att_scores8 as a call of its own, for the grouped kernel: inlined into the loops over heads and blocks,
 * its 8 row pointers no longer fit the registers beside theirs, and reloading them from the stack every
 * step cost more than the call (Gemma 3 prefill attention was 6% slower than head by head). */
#if LC_ATT_SIMD
static __attribute__((noinline)) void lc_att_scores8_f32(const float *q, const void *K, ptrdiff_t j,
                                                         ptrdiff_t hd, float scale, float *scores) {
    lc_att_scores8(q, K, j, hd, scale, scores, 0);
}
static __attribute__((noinline)) void lc_att_scores8_f16(const float *q, const void *K, ptrdiff_t j,
                                                         ptrdiff_t hd, float scale, float *scores) {
    lc_att_scores8(q, K, j, hd, scale, scores, 1);
}
static __attribute__((noinline)) void lc_att_scores8x2_f32(const float *qa, const float *qb, const void *K,
                                                           ptrdiff_t j, ptrdiff_t hd, float scale, float *sa,
                                                           float *sb) {
    lc_att_scores8x2(qa, qb, K, j, hd, scale, sa, sb, 0);
}
static __attribute__((noinline)) void lc_att_scores8x2_f16(const float *qa, const float *qb, const void *K,
                                                           ptrdiff_t j, ptrdiff_t hd, float scale, float *sa,
                                                           float *sb) {
    lc_att_scores8x2(qa, qb, K, j, hd, scale, sa, sb, 1);
}
#endif

/* Up to LC_ATT_GROUP_MAX heads per pass of the grouped kernel (their 1 / sum kept in an array); larger groups
 * take several passes. Its V rows go in blocks of about LC_ATT_VBLOCK_BYTES, re-read from L1 by each head. */
#define LC_ATT_GROUP_MAX 16
#define LC_ATT_VBLOCK_BYTES 16384

/* G <= LC_ATT_GROUP_MAX query heads over one KV head: head g reads q + g * hd, writes out + g * hd and uses
 * scores + g * ss (ss >= last + 1) as lc_attend_impl's scores. The heads take turns on each block of cached
 * rows (8 K rows for the scores, a block of V rows for the sums), two heads at a time, so each row comes
 * from memory once for the G heads and from L1 for the others, and each vector loaded (and widened) serves
 * two heads, where lc_attend_impl walks all rows once per head.
 * Each head's output is bit for bit lc_attend_impl's: the scores run through lc_att_scores8's chains and
 * reduction in the same blocks of 8 from first, the positions left over through lc_att_dot, the softmax
 * is lc_att_softmax and the sums lc_att_values_acc's per-column chains, continued from block to block.
 * Widening each half-precision block once into a float buffer for all heads, instead of per head as it
 * is loaded, measured slower on the AMD EPYC (AVX-512, 2 cores) this was written on: the K blocks 1.15x,
 * K and V 1.35x the per-head kernel's time over one Gemma 3 layer's 512-token prompt; the stores and
 * reloads cost more than the conversions saved. */
LC_ATT_INLINE void lc_attend_group_pass(const float *q, const void *K, const void *V, ptrdiff_t first,
                                        ptrdiff_t last, ptrdiff_t hd, ptrdiff_t G, float scale, float softcap,
                                        float *scores, ptrdiff_t ss, float *out, int f16) {
#if LC_ATT_SIMD
    const ptrdiff_t n = last + 1;
    const ptrdiff_t fit = LC_ATT_VBLOCK_BYTES / (hd * (f16 ? 2 : 4)), vrows = fit > 8 ? fit : 8;
    float inv[LC_ATT_GROUP_MAX];
    ptrdiff_t j = first, g;
    for (; j + 8 <= n; j += 8) {
        for (g = 0; g + 2 <= G; g += 2)
            (f16 ? lc_att_scores8x2_f16 : lc_att_scores8x2_f32)(q + g * hd, q + (g + 1) * hd, K, j, hd, scale,
                                                               scores + g * ss, scores + (g + 1) * ss);
        if (g < G)
            (f16 ? lc_att_scores8_f16 : lc_att_scores8_f32)(q + g * hd, K, j, hd, scale, scores + g * ss);
    }
    for (; j < n; j++)
        for (g = 0; g < G; g++) scores[g * ss + j] = lc_att_dot(q + g * hd, K, j * hd, hd, f16) * scale;
    for (g = 0; g < G; g++) inv[g] = lc_att_softmax(scores + g * ss, first, n, softcap);
    for (j = first; j < n; j += vrows) {
        const ptrdiff_t nr = n - j < vrows ? n - j : vrows;
        for (g = 0; g + 2 <= G; g += 2)
            lc_att_values_acc2(scores + g * ss + j, scores + (g + 1) * ss + j, V, j, nr, hd, out + g * hd,
                               out + (g + 1) * hd, j == first, f16);
        if (g < G)
            for (ptrdiff_t d0 = 0; d0 < hd; d0 += 64)
                lc_att_values_acc(scores + g * ss + j, V, j, nr, hd, d0, out + g * hd, j == first, f16);
    }
    for (g = 0; g < G; g++) lc_att_scale(out + g * hd, hd, inv[g]);
#else
    (void)q, (void)K, (void)V, (void)first, (void)last, (void)hd, (void)G, (void)scale, (void)softcap;
    (void)scores, (void)ss, (void)out, (void)f16;
#endif
}

/* G query heads sharing one KV head (the layout of lc_attend_group_pass, any G >= 1): grouped where the
 * SIMD kernel runs, else lc_attend_impl head by head. */
LC_ATT_INLINE void lc_attend_group_impl(const float *q, const void *K, const void *V, ptrdiff_t first,
                                        ptrdiff_t last, ptrdiff_t hd, ptrdiff_t G, float scale, float softcap,
                                        float *scores, ptrdiff_t ss, float *out, int f16) {
    if (LC_ATT_SIMD && G > 1 && hd % 8 == 0) {
        for (ptrdiff_t g0 = 0; g0 < G; g0 += LC_ATT_GROUP_MAX)
            lc_attend_group_pass(q + g0 * hd, K, V, first, last, hd,
                                 G - g0 < LC_ATT_GROUP_MAX ? G - g0 : LC_ATT_GROUP_MAX, scale, softcap,
                                 scores + g0 * ss, ss, out + g0 * hd, f16);
        return;
    }
    for (ptrdiff_t g = 0; g < G; g++)
        lc_attend_impl(q + g * hd, K, V, first, last, hd, scale, softcap, scores + g * ss, out + g * hd, f16);
}

static void lc_attend_group(const float *q, const float *K, const float *V, ptrdiff_t first, ptrdiff_t last,
                            ptrdiff_t hd, ptrdiff_t G, float scale, float softcap, float *scores,
                            ptrdiff_t ss, float *out) {
    lc_attend_group_impl(q, K, V, first, last, hd, G, scale, softcap, scores, ss, out, 0);
}

static void lc_attend_group_f16(const float *q, const uint16_t *K, const uint16_t *V, ptrdiff_t first,
                                ptrdiff_t last, ptrdiff_t hd, ptrdiff_t G, float scale, float softcap,
                                float *scores, ptrdiff_t ss, float *out) {
    lc_attend_group_impl(q, K, V, first, last, hd, G, scale, softcap, scores, ss, out, 1);
}

#endif
