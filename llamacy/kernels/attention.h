/* One query head attending over cached positions first..last of one KV head (ops.pyx's attend).
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
 * Included into ops.c only, which is built with -ffast-math: the softmax loops call glibc's vector expf.
 */
#ifndef LLAMACY_ATTENTION_H
#define LLAMACY_ATTENTION_H

#include <math.h>
#include <stddef.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LC_ATT_SIMD 1
#else
#define LC_ATT_SIMD 0
#endif

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
/* scores[j..j+8) = scale * dot(q, K row j+p) for p < 8; hd a multiple of 8. */
static inline void lc_att_scores8(const float *q, const float *K, ptrdiff_t j, ptrdiff_t hd, float scale,
                                  float *scores) {
    const float *k = K + j * hd;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (ptrdiff_t d = 0; d < hd; d += 8) {
        __m256 qv = _mm256_loadu_ps(q + d);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + d), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + hd + d), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 2 * hd + d), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 3 * hd + d), a3);
        a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 4 * hd + d), a4);
        a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 5 * hd + d), a5);
        a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 6 * hd + d), a6);
        a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 7 * hd + d), a7);
    }
    /* hadd pairs within 128-bit halves: after two levels, lane i of the low half holds the low-half sum
     * of accumulator i (i < 4) and the high half the high-half sums; t2 the same for accumulators 4..7. */
    __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 t2 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    __m256 s = _mm256_add_ps(_mm256_permute2f128_ps(t0, t2, 0x20), _mm256_permute2f128_ps(t0, t2, 0x31));
    _mm256_storeu_ps(scores + j, _mm256_mul_ps(s, _mm256_set1_ps(scale)));
}

/* out[0..nv*8) = inv * sum_j w[j] * V row j (columns d0..), nv <= 8 vectors kept in registers. */
static inline void lc_att_values(const float *w, const float *V, ptrdiff_t first, ptrdiff_t n, ptrdiff_t hd,
                                 ptrdiff_t d0, float inv, float *out) {
    if (hd - d0 >= 64) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        for (ptrdiff_t j = first; j < n; j++) {
            const float *v = V + j * hd + d0;
            __m256 wj = _mm256_broadcast_ss(w + j);
            a0 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v), a0);
            a1 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v + 8), a1);
            a2 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v + 16), a2);
            a3 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v + 24), a3);
            a4 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v + 32), a4);
            a5 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v + 40), a5);
            a6 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v + 48), a6);
            a7 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(v + 56), a7);
        }
        __m256 iv = _mm256_set1_ps(inv);
        _mm256_storeu_ps(out + d0, _mm256_mul_ps(a0, iv));
        _mm256_storeu_ps(out + d0 + 8, _mm256_mul_ps(a1, iv));
        _mm256_storeu_ps(out + d0 + 16, _mm256_mul_ps(a2, iv));
        _mm256_storeu_ps(out + d0 + 24, _mm256_mul_ps(a3, iv));
        _mm256_storeu_ps(out + d0 + 32, _mm256_mul_ps(a4, iv));
        _mm256_storeu_ps(out + d0 + 40, _mm256_mul_ps(a5, iv));
        _mm256_storeu_ps(out + d0 + 48, _mm256_mul_ps(a6, iv));
        _mm256_storeu_ps(out + d0 + 56, _mm256_mul_ps(a7, iv));
        return;
    }
    for (ptrdiff_t d = d0; d < hd; d += 8) { /* fewer than 64 columns left: one vector at a time */
        __m256 a = _mm256_setzero_ps();
        for (ptrdiff_t j = first; j < n; j++)
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(w + j), _mm256_loadu_ps(V + j * hd + d), a);
        _mm256_storeu_ps(out + d, _mm256_mul_ps(a, _mm256_set1_ps(inv)));
    }
}
#endif

/* K and V point at position 0 of the head's cache (rows of hd floats); scores needs last + 1 floats. */
static void lc_attend(const float *q, const float *K, const float *V, ptrdiff_t first, ptrdiff_t last,
                      ptrdiff_t hd, float scale, float softcap, float *scores, float *out) {
    const ptrdiff_t n = last + 1;
    const int simd = LC_ATT_SIMD && hd % 8 == 0;
    ptrdiff_t j = first;
#if LC_ATT_SIMD
    if (simd)
        for (; j + 8 <= n; j += 8) lc_att_scores8(q, K, j, hd, scale, scores);
#endif
    for (; j < n; j++) scores[j] = lc_dot_f32(q, K + j * hd, hd) * scale;
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
    const float inv = 1.0f / total;
#if LC_ATT_SIMD
    if (simd) {
        for (ptrdiff_t d0 = 0; d0 < hd; d0 += 64) lc_att_values(scores, V, first, n, hd, d0, inv, out);
        return;
    }
#endif
    for (ptrdiff_t d = 0; d < hd; d++) out[d] = 0.0f;
    for (j = first; j < n; j++) {
        const float w = scores[j] * inv;
        const float *vj = V + j * hd;
        for (ptrdiff_t d = 0; d < hd; d++) out[d] += w * vj[d];
    }
}

#endif
