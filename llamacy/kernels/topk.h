/* The k largest logits of a row (topk.pyx), for the sampler's top-k step.
 *
 * numpy needs several passes over the vocabulary for this (a NaN check, a max, a partition, a filter) and
 * ~120 us per token for a 49k vocabulary, on the thread that also runs the server's event loop between
 * steps. Here it is one pass: a sorted buffer of the best k so far, and a vector compare of 8 logits at a
 * time against the buffer's smallest value, so that almost every logit costs one compare. The buffer order
 * is the sampler's canonical one (value descending, then id ascending): the scan goes by ascending id, a
 * value equal to the k-th does not displace it, and a new entry goes after the entries equal to it.
 */
#ifndef LLAMACY_TOPK_H
#define LLAMACY_TOPK_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#if defined(__AVX2__)
#include <immintrin.h>
#define LC_TOPK_SIMD 1
#else
#define LC_TOPK_SIMD 0
#endif

/* Insert (id, v) into the sorted buffer of *count entries (at most k), keeping the best k. */
static inline void lc_topk_insert(int64_t *ids, float *vals, ptrdiff_t *count, ptrdiff_t k, int64_t id,
                                  float v) {
    ptrdiff_t i = *count < k ? *count : k - 1; /* the slot that opens up (the last one when full) */
    while (i > 0 && vals[i - 1] < v) {
        vals[i] = vals[i - 1];
        ids[i] = ids[i - 1];
        i--;
    }
    vals[i] = v;
    ids[i] = id;
    if (*count < k) (*count)++;
}

/* Entry j of x against the buffer: NaN -> return 1; better than the k-th (or buffer not full) -> insert. */
static inline int lc_topk_offer(const float *x, ptrdiff_t j, int64_t *ids, float *vals, ptrdiff_t *count,
                                ptrdiff_t k) {
    float v = x[j];
    if (isnan(v)) return 1;
    if (*count < k || v > vals[k - 1]) lc_topk_insert(ids, vals, count, k, (int64_t)j, v);
    return 0;
}

/* ids/vals (room for k) get the min(k, n) best entries of x in canonical order. Returns how many, or -1 if
 * x holds a NaN. */
static ptrdiff_t lc_topk(const float *x, ptrdiff_t n, ptrdiff_t k, int64_t *ids, float *vals) {
    ptrdiff_t count = 0, j = 0;
    if (k <= 0 || n <= 0) return 0;
    for (; j < n && count < k; j++)
        if (lc_topk_offer(x, j, ids, vals, &count, k)) return -1;
#if LC_TOPK_SIMD
    for (; j + 8 <= n; j += 8) {
        /* "not <=" is true for a greater value and for NaN (unordered): both need the slow path */
        __m256 thr = _mm256_set1_ps(vals[k - 1]);
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), thr, _CMP_NLE_UQ));
        while (mask) {
            int lane = __builtin_ctz(mask);
            mask &= mask - 1;
            if (lc_topk_offer(x, j + lane, ids, vals, &count, k)) return -1;
        }
    }
#endif
    for (; j < n; j++)
        if (lc_topk_offer(x, j, ids, vals, &count, k)) return -1;
    return count;
}

#endif
