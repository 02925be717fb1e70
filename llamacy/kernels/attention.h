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
 * A cached row (head_dim values of one KV head at one position) is stored in one of four formats
 * (LC_KV_*, ops.pxd's KV_*): float32, IEEE half, or GGML Q8_0 / Q4_0 blocks (head_dim a multiple of 32;
 * a fp16 scale d and 32 int8 values, or 32 nibbles q giving d * (q - 8)). Row i starts at byte
 * i * lc_kv_row_bytes(fmt, hd). Every format is widened to floats as it is loaded (F16C for the halves
 * and the scales), never into a buffer: a smaller format reads fewer bytes, at the price of more work per
 * value loaded (a quantized one: widen, convert, times d). A quantized value d * q is exact in float32
 * (11 + 8 significant bits), so the kernel computes with exactly gguf's dequantized values. The kernel is
 * written once, with `fmt` a constant that the entry point fixes per format.
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
#include <string.h>

#include "simd.h" /* _cvtsh_ss: F16C, or its exact portable twin */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LC_ATT_SIMD 1
#else
#define LC_ATT_SIMD 0
#endif

#define LC_ATT_INLINE static inline __attribute__((always_inline))

/* The row formats (ops.pxd's KV_F32 .. KV_Q4_0 are these numbers). */
#define LC_KV_F32 0
#define LC_KV_F16 1
#define LC_KV_Q8_0 2
#define LC_KV_Q4_0 3
#define LC_KV_QUANT(fmt) ((fmt) >= LC_KV_Q8_0)

/* Bytes of one GGML block of 32 values (ggml-common.h's block_q8_0, block_q4_0). */
LC_ATT_INLINE ptrdiff_t lc_kvq_block_bytes(int fmt) { return fmt == LC_KV_Q8_0 ? 34 : 18; }

/* Bytes of one cached row of hd values (hd a multiple of 32 for the quantized formats). */
LC_ATT_INLINE ptrdiff_t lc_kv_row_bytes(int fmt, ptrdiff_t hd) {
    return fmt == LC_KV_F32 ? hd * 4 : fmt == LC_KV_F16 ? hd * 2 : hd / 32 * lc_kvq_block_bytes(fmt);
}

/* Where element d of a row starts (d a multiple of 32 for the quantized formats: the start of its block). */
LC_ATT_INLINE const char *lc_kv_at(const char *row, ptrdiff_t d, int fmt) {
    return row + (fmt == LC_KV_F32 ? d * 4 : fmt == LC_KV_F16 ? d * 2 : d / 32 * lc_kvq_block_bytes(fmt));
}

/* A quantized block's scale d (unaligned: blocks follow each other at 34 or 18 bytes). */
LC_ATT_INLINE uint16_t lc_kvq_d(const char *blk) {
    uint16_t h;
    memcpy(&h, blk, 2);
    return h;
}

/* Element i of a cached row. */
LC_ATT_INLINE float lc_kv_get(const char *row, ptrdiff_t i, int fmt) {
    if (fmt == LC_KV_F32) return ((const float *)row)[i];
    if (fmt == LC_KV_F16) return _cvtsh_ss(((const uint16_t *)row)[i]);
    const uint8_t *b = (const uint8_t *)lc_kv_at(row, i & ~(ptrdiff_t)31, fmt);
    const float d = _cvtsh_ss(lc_kvq_d((const char *)b));
    if (fmt == LC_KV_Q8_0) return d * (float)(int8_t)b[2 + (i & 31)];
    const int byte = b[2 + (i & 15)];
    return d * (float)(((i & 16) ? byte >> 4 : byte & 15) - 8);
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
/* 8 cached values from element i of p on, as floats, p from lc_kv_at. For the quantized formats i < 32
 * (within p's block) and a multiple of 8; the kernels pass constants, so the offsets and the Q4_0 nibble
 * shift fold away. The scale is widened per call: GCC keeps it in a register across the block's four
 * calls where registers allow. */
LC_ATT_INLINE __m256 lc_kv_load8(const char *p, ptrdiff_t i, int fmt) {
    if (fmt == LC_KV_F32) return _mm256_loadu_ps((const float *)p + i);
    if (fmt == LC_KV_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16((short)lc_kvq_d(p)));
    __m256i v;
    if (fmt == LC_KV_Q8_0) {
        v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 2 + i)));
    } else { /* values 0..15 in the low nibbles of bytes 0..15, values 16..31 in their high nibbles */
        v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 2 + (i & 15))));
        if (i & 16) v = _mm256_srli_epi32(v, 4);
        v = _mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(15)), _mm256_set1_epi32(8));
    }
    return _mm256_mul_ps(_mm256_cvtepi32_ps(v), d);
}

/* How many values the kernels take per step along a row: a whole block for the quantized formats, so that
 * lc_kv_load8 sees constant offsets within it. */
#define LC_KV_STEP(fmt) (LC_KV_QUANT(fmt) ? 32 : 8)

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

/* scores[j..j+8) = scale * dot(q, K row j+p) for p < 8; hd a multiple of 8 (of 32 when quantized). */
LC_ATT_INLINE void lc_att_scores8(const float *q, const void *K, ptrdiff_t j, ptrdiff_t hd, float scale,
                                  float *scores, int fmt) {
    const ptrdiff_t rb = lc_kv_row_bytes(fmt, hd), step = LC_KV_STEP(fmt);
    const char *k = (const char *)K + j * rb;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (ptrdiff_t d = 0; d < hd; d += step) {
        const char *r = lc_kv_at(k, d, fmt);
        for (ptrdiff_t u = 0; u < step; u += 8) {
            __m256 qv = _mm256_loadu_ps(q + d + u);
            a0 = _mm256_fmadd_ps(qv, lc_kv_load8(r, u, fmt), a0);
            a1 = _mm256_fmadd_ps(qv, lc_kv_load8(r + rb, u, fmt), a1);
            a2 = _mm256_fmadd_ps(qv, lc_kv_load8(r + 2 * rb, u, fmt), a2);
            a3 = _mm256_fmadd_ps(qv, lc_kv_load8(r + 3 * rb, u, fmt), a3);
            a4 = _mm256_fmadd_ps(qv, lc_kv_load8(r + 4 * rb, u, fmt), a4);
            a5 = _mm256_fmadd_ps(qv, lc_kv_load8(r + 5 * rb, u, fmt), a5);
            a6 = _mm256_fmadd_ps(qv, lc_kv_load8(r + 6 * rb, u, fmt), a6);
            a7 = _mm256_fmadd_ps(qv, lc_kv_load8(r + 7 * rb, u, fmt), a7);
        }
    }
    lc_att_reduce8(a0, a1, a2, a3, a4, a5, a6, a7, scale, scores + j);
}

/* lc_att_scores8 for two query heads at once (qa -> sa, qb -> sb): each converted K vector serves both,
 * in two passes of 4 rows (8 accumulators). Every accumulator takes the very fma chain of lc_att_scores8
 * (d ascending) and the same reduction, so the scores are bit for bit its. */
LC_ATT_INLINE void lc_att_scores8x2(const float *qa, const float *qb, const void *K, ptrdiff_t j,
                                    ptrdiff_t hd, float scale, float *sa, float *sb, int fmt) {
    const ptrdiff_t rb = lc_kv_row_bytes(fmt, hd), step = LC_KV_STEP(fmt);
    __m256 ra[8], rb_[8];
    for (int p = 0; p < 8; p += 4) {
        const char *k = (const char *)K + (j + p) * rb;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (ptrdiff_t d = 0; d < hd; d += step) {
            const char *r = lc_kv_at(k, d, fmt);
            for (ptrdiff_t u = 0; u < step; u += 8) {
                __m256 qva = _mm256_loadu_ps(qa + d + u), qvb = _mm256_loadu_ps(qb + d + u), kv;
                kv = lc_kv_load8(r, u, fmt);
                a0 = _mm256_fmadd_ps(qva, kv, a0);
                b0 = _mm256_fmadd_ps(qvb, kv, b0);
                kv = lc_kv_load8(r + rb, u, fmt);
                a1 = _mm256_fmadd_ps(qva, kv, a1);
                b1 = _mm256_fmadd_ps(qvb, kv, b1);
                kv = lc_kv_load8(r + 2 * rb, u, fmt);
                a2 = _mm256_fmadd_ps(qva, kv, a2);
                b2 = _mm256_fmadd_ps(qvb, kv, b2);
                kv = lc_kv_load8(r + 3 * rb, u, fmt);
                a3 = _mm256_fmadd_ps(qva, kv, a3);
                b3 = _mm256_fmadd_ps(qvb, kv, b3);
            }
        }
        ra[p] = a0, ra[p + 1] = a1, ra[p + 2] = a2, ra[p + 3] = a3;
        rb_[p] = b0, rb_[p + 1] = b1, rb_[p + 2] = b2, rb_[p + 3] = b3;
    }
    lc_att_reduce8(ra[0], ra[1], ra[2], ra[3], ra[4], ra[5], ra[6], ra[7], scale, sa + j);
    lc_att_reduce8(rb_[0], rb_[1], rb_[2], rb_[3], rb_[4], rb_[5], rb_[6], rb_[7], scale, sb + j);
}

/* acc[d0..hd) (+)= sum over rows r < nr of w[r] * V row row0 + r (columns d0.., up to 64 of them): from
 * zero when init, else continuing the sums stored there. Per column the fma chain runs over r ascending,
 * so walking the rows in blocks, with the sums parked in memory between blocks (exact), gives the very
 * sums of one walk over all rows. d0 is a multiple of 64, so a quantized row's 64 columns are two whole
 * blocks, and fewer than 64 left are one (hd a multiple of 32). */
LC_ATT_INLINE void lc_att_values_acc(const float *w, const void *V, ptrdiff_t row0, ptrdiff_t nr,
                                     ptrdiff_t hd, ptrdiff_t d0, float *acc, int init, int fmt) {
    const ptrdiff_t rb = lc_kv_row_bytes(fmt, hd);
    const char *v0 = lc_kv_at((const char *)V + row0 * rb, d0, fmt);
    if (hd - d0 >= 64) {
        /* columns 32.. start a block of their own in a quantized row */
        const ptrdiff_t hi = LC_KV_QUANT(fmt) ? lc_kvq_block_bytes(fmt) : 0, o = LC_KV_QUANT(fmt) ? 0 : 32;
        float *out = acc + d0;
        __m256 a0, a1, a2, a3, a4, a5, a6, a7;
        if (init) {
            a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        } else {
            a0 = _mm256_loadu_ps(out), a1 = _mm256_loadu_ps(out + 8), a2 = _mm256_loadu_ps(out + 16);
            a3 = _mm256_loadu_ps(out + 24), a4 = _mm256_loadu_ps(out + 32), a5 = _mm256_loadu_ps(out + 40);
            a6 = _mm256_loadu_ps(out + 48), a7 = _mm256_loadu_ps(out + 56);
        }
        for (ptrdiff_t r = 0; r < nr; r++) {
            const char *v = v0 + r * rb, *vh = v + hi;
            __m256 wj = _mm256_broadcast_ss(w + r);
            a0 = _mm256_fmadd_ps(wj, lc_kv_load8(v, 0, fmt), a0);
            a1 = _mm256_fmadd_ps(wj, lc_kv_load8(v, 8, fmt), a1);
            a2 = _mm256_fmadd_ps(wj, lc_kv_load8(v, 16, fmt), a2);
            a3 = _mm256_fmadd_ps(wj, lc_kv_load8(v, 24, fmt), a3);
            a4 = _mm256_fmadd_ps(wj, lc_kv_load8(vh, o, fmt), a4);
            a5 = _mm256_fmadd_ps(wj, lc_kv_load8(vh, o + 8, fmt), a5);
            a6 = _mm256_fmadd_ps(wj, lc_kv_load8(vh, o + 16, fmt), a6);
            a7 = _mm256_fmadd_ps(wj, lc_kv_load8(vh, o + 24, fmt), a7);
        }
        _mm256_storeu_ps(out, a0);
        _mm256_storeu_ps(out + 8, a1);
        _mm256_storeu_ps(out + 16, a2);
        _mm256_storeu_ps(out + 24, a3);
        _mm256_storeu_ps(out + 32, a4);
        _mm256_storeu_ps(out + 40, a5);
        _mm256_storeu_ps(out + 48, a6);
        _mm256_storeu_ps(out + 56, a7);
        return;
    }
    for (ptrdiff_t d = d0; d < hd; d += 8) { /* fewer than 64 columns left: one vector at a time */
        const ptrdiff_t u = d - d0;  /* < 32 when quantized: within v0's block */
        __m256 a = init ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + d);
        for (ptrdiff_t r = 0; r < nr; r++)
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(w + r), lc_kv_load8(v0 + r * rb, u, fmt), a);
        _mm256_storeu_ps(acc + d, a);
    }
}

/* lc_att_values_acc over all columns for two heads at once (weights wa -> acca, wb -> accb): each
 * converted V vector serves both, 32 columns (8 accumulators, one block when quantized) at a time. Per
 * column the same fma chain (r ascending, from zero or the parked sum), so the sums are bit for bit
 * lc_att_values_acc's. */
LC_ATT_INLINE void lc_att_values_acc2(const float *wa, const float *wb, const void *V, ptrdiff_t row0,
                                      ptrdiff_t nr, ptrdiff_t hd, float *acca, float *accb, int init,
                                      int fmt) {
    const ptrdiff_t rb = lc_kv_row_bytes(fmt, hd);
    const char *vrow0 = (const char *)V + row0 * rb;
    ptrdiff_t d0 = 0;
    for (; d0 + 32 <= hd; d0 += 32) {
        const char *v0 = lc_kv_at(vrow0, d0, fmt);
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
            const char *v = v0 + r * rb;
            const __m256 wja = _mm256_broadcast_ss(wa + r), wjb = _mm256_broadcast_ss(wb + r);
            __m256 x = lc_kv_load8(v, 0, fmt);
            a0 = _mm256_fmadd_ps(wja, x, a0);
            b0 = _mm256_fmadd_ps(wjb, x, b0);
            x = lc_kv_load8(v, 8, fmt);
            a1 = _mm256_fmadd_ps(wja, x, a1);
            b1 = _mm256_fmadd_ps(wjb, x, b1);
            x = lc_kv_load8(v, 16, fmt);
            a2 = _mm256_fmadd_ps(wja, x, a2);
            b2 = _mm256_fmadd_ps(wjb, x, b2);
            x = lc_kv_load8(v, 24, fmt);
            a3 = _mm256_fmadd_ps(wja, x, a3);
            b3 = _mm256_fmadd_ps(wjb, x, b3);
        }
        _mm256_storeu_ps(oa, a0), _mm256_storeu_ps(oa + 8, a1), _mm256_storeu_ps(oa + 16, a2);
        _mm256_storeu_ps(oa + 24, a3), _mm256_storeu_ps(ob, b0), _mm256_storeu_ps(ob + 8, b1);
        _mm256_storeu_ps(ob + 16, b2), _mm256_storeu_ps(ob + 24, b3);
    }
    for (; d0 < hd; d0 += 8) { /* never when quantized (hd a multiple of 32) */
        const char *v0 = lc_kv_at(vrow0, d0, fmt);
        __m256 a = init ? _mm256_setzero_ps() : _mm256_loadu_ps(acca + d0);
        __m256 b = init ? _mm256_setzero_ps() : _mm256_loadu_ps(accb + d0);
        for (ptrdiff_t r = 0; r < nr; r++) {
            const __m256 x = lc_kv_load8(v0 + r * rb, 0, fmt);
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(wa + r), x, a);
            b = _mm256_fmadd_ps(_mm256_broadcast_ss(wb + r), x, b);
        }
        _mm256_storeu_ps(acca + d0, a);
        _mm256_storeu_ps(accb + d0, b);
    }
}

/* lc_att_values_acc2 for four heads (weights and sums of head h at w + h * ws and acc + h * hd; hd a multiple
 * of 32): each widened V vector serves four heads. Widening a quantized value (int8 or nibble to float,
 * times the block's scale) costs about twice a half's, and with the eight query heads of a Llama-style
 * group that work, done once per pair of heads, outweighed the bytes the smaller rows save (q8_0 1.25x
 * f16's time from memory at head_dim 64). Half rows gain too, from memory: decode at depth 4000 over f16 rows
 * (head_dim 256, groups of 4) took 0.87x the time of the pairs (one run of benchmarks/bench_attention.py).
 * Per column the very fma chain of lc_att_values_acc (r ascending, from zero or the parked sum), so the sums
 * are bit for bit its. (The scores stay in pairs for float rows: four heads over two rows at a time took
 * 1.13x the time in the same run.) */
LC_ATT_INLINE void lc_att_values_acc4(const float *w, ptrdiff_t ws, const void *V, ptrdiff_t row0, ptrdiff_t nr,
                                      ptrdiff_t hd, float *acc, int init, int fmt) {
    const ptrdiff_t rb = lc_kv_row_bytes(fmt, hd);
    const char *vrow0 = (const char *)V + row0 * rb;
    for (ptrdiff_t d0 = 0; d0 < hd; d0 += 32) {
        const char *v0 = lc_kv_at(vrow0, d0, fmt);
        for (ptrdiff_t o = 0; o < 32; o += 16) { /* 16 columns x 4 heads: 8 accumulators */
            __m256 a[4][2];
            for (int h = 0; h < 4; h++) {
                float *out = acc + h * hd + d0 + o;
                a[h][0] = init ? _mm256_setzero_ps() : _mm256_loadu_ps(out);
                a[h][1] = init ? _mm256_setzero_ps() : _mm256_loadu_ps(out + 8);
            }
            for (ptrdiff_t r = 0; r < nr; r++) {
                const char *v = v0 + r * rb;
                const __m256 x0 = lc_kv_load8(v, o, fmt), x1 = lc_kv_load8(v, o + 8, fmt);
                for (int h = 0; h < 4; h++) {
                    const __m256 wj = _mm256_broadcast_ss(w + h * ws + r);
                    a[h][0] = _mm256_fmadd_ps(wj, x0, a[h][0]);
                    a[h][1] = _mm256_fmadd_ps(wj, x1, a[h][1]);
                }
            }
            for (int h = 0; h < 4; h++) {
                float *out = acc + h * hd + d0 + o;
                _mm256_storeu_ps(out, a[h][0]);
                _mm256_storeu_ps(out + 8, a[h][1]);
            }
        }
    }
}

/* out[0..hd) *= inv: the weighted sums become the softmax average. */
LC_ATT_INLINE void lc_att_scale(float *out, ptrdiff_t hd, float inv) {
    const __m256 iv = _mm256_set1_ps(inv);
    for (ptrdiff_t d = 0; d < hd; d += 8)
        _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(out + d), iv));
}
#endif

/* Scores over quantized K rows use integer dot products, as llama.cpp does for a quantized K cache: the
 * caller (ops.pyx's attend_group) quantizes each query head once per call to Q8_0 blocks (qq, ggml's
 * quantize_row_q8_0 reference, LC_QQ_BYTES per 32 values), and a row's score is the sum over blocks b of
 * d_q[b] * d_k[b] * sum(q_i * k_i), the scores of the quantized query. As ggml's vec_dot_q8_0_q8_0, each
 * block's 32 products are summed in integers into 8 lanes (lane l: values 4l..4l+3, exact), and each lane
 * accumulates in float, blocks ascending: lane = fma(d_q * d_k, (float)lane_sum, lane) (d_q * d_k, a product
 * of two halves, is exact in float32); the 8 lanes are summed ((0+1)+(2+3))+((4+5)+(6+7)), the order of
 * lc_att_reduce8, then times scale. The 8-row, grouped and leftover-position paths all run that very
 * arithmetic, so their scores agree bit for bit. */
#define LC_QQ_BYTES 34

/* Value i (< 32) of a quantized K block, as an integer. */
LC_ATT_INLINE int lc_kvq_int(const char *blk, int i, int fmt) {
    const uint8_t *b = (const uint8_t *)blk + 2;
    if (fmt == LC_KV_Q8_0) return (int8_t)b[i];
    return ((i & 16) ? b[i & 15] >> 4 : b[i & 15] & 15) - 8;
}

#if LC_ATT_SIMD
/* A quantized K block's 32 values as signed bytes. */
LC_ATT_INLINE __m256i lc_kvq_i8(const char *blk, int fmt) {
    if (fmt == LC_KV_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    const __m128i x = _mm_loadu_si128((const __m128i *)(blk + 2)), m = _mm_set1_epi8(15);
    const __m256i v = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
}

/* The 8 lane sums of q_i * k_i (lane l: i = 4l..4l+3) as floats: |k| times q with k's sign (maddubs takes
 * unsigned times signed bytes; |values| <= 127, so its pair sums do not saturate), pairs of pairs summed by
 * madd. */
LC_ATT_INLINE __m256 lc_attq_dot32(__m256i q, __m256i k) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(k, k), _mm256_sign_epi8(q, k));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* Scores of rows j..j+8 for H (1, 2 or 4) query heads: head h's quantized query at qq + h * qs, its scores
 * at s + h * ss. Rows in passes of 8 / H, so 8 accumulators; each K block is loaded once for the H heads. */
LC_ATT_INLINE void lc_attq_scores8xh(const char *qq, ptrdiff_t qs, const float *dq, const void *K, ptrdiff_t j,
                                     ptrdiff_t hd, float scale, float *s, ptrdiff_t ss, int H, int fmt) {
    const ptrdiff_t rb = lc_kv_row_bytes(fmt, hd), kbb = lc_kvq_block_bytes(fmt), nb = hd / 32;
    const int R = 8 / H;
    __m256 r[4][8];
    for (int p = 0; p < 8; p += R) {
        const char *k = (const char *)K + (j + p) * rb;
        __m256 a[4][8];
        for (int h = 0; h < H; h++)
            for (int i = 0; i < R; i++) a[h][i] = _mm256_setzero_ps();
        for (ptrdiff_t b = 0; b < nb; b++) {
            __m256i qv[4];
            for (int h = 0; h < H; h++)
                qv[h] = _mm256_loadu_si256((const __m256i *)(qq + h * qs + b * LC_QQ_BYTES + 2));
            for (int i = 0; i < R; i++) {
                const char *kb = k + i * rb + b * kbb;
                const __m256i kv = lc_kvq_i8(kb, fmt);
                const __m256 dk = _mm256_set1_ps(_cvtsh_ss(lc_kvq_d(kb)));
                for (int h = 0; h < H; h++)
                    a[h][i] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_broadcast_ss(dq + h * nb + b), dk),
                                              lc_attq_dot32(qv[h], kv), a[h][i]);
            }
        }
        for (int h = 0; h < H; h++)
            for (int i = 0; i < R; i++) r[h][p + i] = a[h][i];
    }
    for (int h = 0; h < H; h++)
        lc_att_reduce8(r[h][0], r[h][1], r[h][2], r[h][3], r[h][4], r[h][5], r[h][6], r[h][7], scale,
                       s + h * ss + j);
}

/* One per format and head count, as calls of their own (see lc_att_scores8_call). */
#define LC_ATTQ_FNS(name, fmt, H)                                                                              \
    static __attribute__((noinline)) void lc_attq_scores8x##H##_##name(                                     \
        const char *qq, ptrdiff_t qs, const float *dq, const void *K, ptrdiff_t j, ptrdiff_t hd, float scale, \
        float *s, ptrdiff_t ss) {                                                                             \
        lc_attq_scores8xh(qq, qs, dq, K, j, hd, scale, s, ss, H, fmt);                                       \
    }
LC_ATTQ_FNS(q8_0, LC_KV_Q8_0, 1)
LC_ATTQ_FNS(q8_0, LC_KV_Q8_0, 2)
LC_ATTQ_FNS(q8_0, LC_KV_Q8_0, 4)
LC_ATTQ_FNS(q4_0, LC_KV_Q4_0, 1)
LC_ATTQ_FNS(q4_0, LC_KV_Q4_0, 2)
LC_ATTQ_FNS(q4_0, LC_KV_Q4_0, 4)
#define LC_ATTQ_CALL(H, fmt) (fmt == LC_KV_Q8_0 ? lc_attq_scores8x##H##_q8_0 : lc_attq_scores8x##H##_q4_0)
#endif

/* The score of one row (the positions left over from the blocks of 8, and no-SIMD), without scale: the
 * arithmetic of lc_attq_scores8xh's lanes and reduction. The plain loops' lane sums are summed in that
 * order only without -ffast-math's reassociation, hence a function of their own built without it (then
 * the portable build's scores are bit for bit the AVX2 build's; fmaf is exact either way). */
#if !LC_ATT_SIMD
static __attribute__((noinline, optimize("no-associative-math"))) float
lc_attq_dot_plain(const char *qq, const float *dq, const char *row, ptrdiff_t hd, int fmt) {
    const ptrdiff_t kbb = lc_kvq_block_bytes(fmt), nb = hd / 32;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (ptrdiff_t b = 0; b < nb; b++) {
        const char *qb = qq + b * LC_QQ_BYTES, *kb = row + b * kbb;
        const float dd = dq[b] * _cvtsh_ss(lc_kvq_d(kb));
        for (int l = 0; l < 8; l++) {
            int t = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++) t += (int8_t)qb[2 + i] * lc_kvq_int(kb, i, fmt);
            acc[l] = fmaf(dd, (float)t, acc[l]);
        }
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
#endif

LC_ATT_INLINE float lc_attq_dot(const char *qq, const float *dq, const char *row, ptrdiff_t hd, int fmt) {
#if LC_ATT_SIMD
    const ptrdiff_t kbb = lc_kvq_block_bytes(fmt), nb = hd / 32;
    __m256 a = _mm256_setzero_ps();
    for (ptrdiff_t b = 0; b < nb; b++) {
        const char *qb = qq + b * LC_QQ_BYTES, *kb = row + b * kbb;
        const float dd = dq[b] * _cvtsh_ss(lc_kvq_d(kb));
        a = _mm256_fmadd_ps(_mm256_set1_ps(dd),
                            lc_attq_dot32(_mm256_loadu_si256((const __m256i *)(qb + 2)), lc_kvq_i8(kb, fmt)), a);
    }
    a = _mm256_hadd_ps(a, a);
    a = _mm256_hadd_ps(a, a); /* lane 0: (0+1)+(2+3); lane 4: (4+5)+(6+7) */
    return _mm_cvtss_f32(_mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)));
#else
    return lc_attq_dot_plain(qq, dq, row, hd, fmt);
#endif
}

/* The dot product of q with a cached row (the positions left over from the blocks of 8, and no-SIMD). */
LC_ATT_INLINE float lc_att_dot(const float *q, const char *row, ptrdiff_t hd, int fmt) {
    if (fmt == LC_KV_F32) return lc_dot_f32(q, (const float *)row, hd);
#if LC_ATT_SIMD
    if (hd % 8 == 0) { /* widened 8 at a time: the scalar loop converts one by one */
        const ptrdiff_t step = LC_KV_STEP(fmt);
        __m256 a = _mm256_setzero_ps();
        for (ptrdiff_t d = 0; d < hd; d += step) {
            const char *r = lc_kv_at(row, d, fmt);
            for (ptrdiff_t u = 0; u < step; u += 8)
                a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + u), lc_kv_load8(r, u, fmt), a);
        }
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
    }
#endif
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    ptrdiff_t i = 0;
    for (; i + 8 <= hd; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += q[i + k] * lc_kv_get(row, i + k, fmt);
    float s = 0.0f;
    for (int k = 0; k < 8; k++) s += acc[k];
    for (; i < hd; i++) s += q[i] * lc_kv_get(row, i, fmt);
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

/* One head in plain loops: the kernel of the portable build, and of a head_dim that is not a multiple of 8
 * (the SIMD kernel is lc_attend_group_pass, for one head as for several). K and V point at position 0 of
 * the head's cache (rows of lc_kv_row_bytes(fmt, hd) bytes); scores needs last + 1 floats. */
LC_ATT_INLINE void lc_attend_impl(const float *q, const char *qq, const float *dq, const void *K, const void *V,
                                  ptrdiff_t first, ptrdiff_t last, ptrdiff_t hd, float scale, float softcap,
                                  float *scores, float *out, int fmt) {
    const ptrdiff_t n = last + 1, rb = lc_kv_row_bytes(fmt, hd);
    ptrdiff_t j;
    for (j = first; j < n; j++)
        scores[j] = (LC_KV_QUANT(fmt) ? lc_attq_dot(qq, dq, (const char *)K + j * rb, hd, fmt)
                                      : lc_att_dot(q, (const char *)K + j * rb, hd, fmt)) * scale;
    const float inv = lc_att_softmax(scores, first, n, softcap);
    for (ptrdiff_t d = 0; d < hd; d++) out[d] = 0.0f;
    for (j = first; j < n; j++) {
        const float w = scores[j] * inv;
        const char *v = (const char *)V + j * rb;
        for (ptrdiff_t d = 0; d < hd; d++) out[d] += w * lc_kv_get(v, d, fmt);
    }
}

/* lc_att_scores8 as a call of its own, for the grouped kernel: inlined into the loops over heads and blocks,
 * its 8 row pointers no longer fit the registers beside theirs, and reloading them from the stack every
 * step cost more than the call (Gemma 3 prefill attention was 6% slower than head by head). One pair of
 * functions per format; lc_att_scores8_call picks it (fmt a constant there). */
#if LC_ATT_SIMD
#define LC_ATT_SCORES8_FNS(name, fmt)                                                                         \
    static __attribute__((noinline)) void lc_att_scores8_##name(const float *q, const void *K, ptrdiff_t j,  \
                                                                ptrdiff_t hd, float scale, float *scores) {  \
        lc_att_scores8(q, K, j, hd, scale, scores, fmt);                                                     \
    }                                                                                                         \
    static __attribute__((noinline)) void lc_att_scores8x2_##name(const float *qa, const float *qb,          \
                                                                  const void *K, ptrdiff_t j, ptrdiff_t hd,  \
                                                                  float scale, float *sa, float *sb) {       \
        lc_att_scores8x2(qa, qb, K, j, hd, scale, sa, sb, fmt);                                              \
    }
LC_ATT_SCORES8_FNS(f32, LC_KV_F32)
LC_ATT_SCORES8_FNS(f16, LC_KV_F16)

LC_ATT_INLINE void lc_att_scores8_call(const float *q, const void *K, ptrdiff_t j, ptrdiff_t hd, float scale,
                                       float *scores, int fmt) {
    (fmt == LC_KV_F32 ? lc_att_scores8_f32 : lc_att_scores8_f16)(q, K, j, hd, scale, scores);
}

LC_ATT_INLINE void lc_att_scores8x2_call(const float *qa, const float *qb, const void *K, ptrdiff_t j,
                                         ptrdiff_t hd, float scale, float *sa, float *sb, int fmt) {
    (fmt == LC_KV_F32 ? lc_att_scores8x2_f32 : lc_att_scores8x2_f16)(qa, qb, K, j, hd, scale, sa, sb);
}
#endif

/* Rows [row0, row1) of K or V (clipped to n) requested into L2, when stream. Decoding deep into a context
 * reads the rows from memory, and the hardware prefetchers, which follow the grouped kernel's reads (8 K
 * rows a step; V a line of every row of a block per 32 columns), left it at a third of the read
 * bandwidth; asked for a few steps ahead, the rows arrive while the step before them computes. Into L2,
 * not L1: on the AMD EPYC (Zen 4) one thread's decode attention over f16 rows at depth 4000 (head_dim 256,
 * groups of 4) took half the time that way (with V in blocks of LC_ATT_VBLOCK_STREAM_BYTES), 0.8-0.9x at
 * head_dim 64 (benchmarks/bench_attention.py); requests into L1, a few dozen lines at a time, held the
 * kernel's own loads up. A prompt's tokens find the rows in cache (each reads the rows the token before
 * it read), and there the requests only cost: Gemma 3's prompt attention took 1.12x the time with them.
 * Each request also asks for one line a page (LC_ATT_PF_PAGE) beyond the rows, which the requests of a later
 * step will cover. Without it, rows whose run starts on a page boundary, as every (layer, KV head) run of the
 * model's does when n_ctx * row bytes is a multiple of 4 KB, were read at half the rate of the same rows
 * starting 64 bytes into a page: a step's requests were then the first into their page, and requests that
 * open a page mostly came to nothing (on 2 MB pages as on 4 KB ones, so not only for want of a TLB entry).
 * benchmarks/bench_attention.py --offsets 0,64 (f16 rows at depth 4000, groups of 4, one thread, Zen 4):
 * head_dim 256 on 4 KB pages 1044 against 535 us a step, on huge pages 958 against 474; with the line a page
 * ahead 524 and 491, 480 and 468. head_dim 128: 401 against 337 us, then 252 and 251. Results do not depend
 * on any of this. */
#define LC_ATT_PF_PAGE 4096
LC_ATT_INLINE void lc_att_prefetch_rows(int stream, const void *base, ptrdiff_t row0, ptrdiff_t row1,
                                        ptrdiff_t n, ptrdiff_t rb) {
    if (stream && row1 > n) row1 = n;
    if (stream && row1 > row0) {
        lc_prefetch_span_l2((const char *)base + row0 * rb, (row1 - row0) * rb);
        if (row1 * rb + LC_ATT_PF_PAGE < n * rb) lc_prefetch_l2((const char *)base + row1 * rb + LC_ATT_PF_PAGE);
    }
}

/* K rows ahead of the scores step that reads them (four steps of 8; two measured slower at head_dim 64
 * and 256, six no faster) */
#define LC_ATT_PF_KROWS 32

/* Up to LC_ATT_GROUP_MAX heads per pass of the grouped kernel (their 1 / sum kept in an array); larger groups
 * take several passes. Its V rows go in blocks of about LC_ATT_VBLOCK_BYTES, re-read from L1 by each head;
 * when they stream from memory, in smaller blocks, so that each block's requests (the next block's rows)
 * come in smaller bursts: 16 KB bursts took 1.4-1.7x the time of 4 KB ones at head_dim 128-256. The blocks
 * do not change the sums (see lc_att_values_acc). */
#define LC_ATT_GROUP_MAX 16
#define LC_ATT_VBLOCK_BYTES 16384
#define LC_ATT_VBLOCK_STREAM_BYTES 4096

#if LC_ATT_SIMD
/* The scores of G heads (head g's query at q + g * hd, its score of row r at s + g * ss + r) over rows 0..nr
 * of float or half K rows from K: blocks of 8 while whole, two heads at a time then one, then row by row
 * (lc_att_dot). stream: each block requests the rows LC_ATT_PF_KROWS ahead of it. The grouped pass and a
 * prompt block's own rows (attention_block.h) run this. */
LC_ATT_INLINE void lc_att_scores_rows(const float *q, ptrdiff_t G, const void *K, ptrdiff_t nr, ptrdiff_t hd,
                                      float scale, float *s, ptrdiff_t ss, int stream, int fmt) {
    const ptrdiff_t rb = lc_kv_row_bytes(fmt, hd);
    ptrdiff_t j = 0, g;
    for (; j + 8 <= nr; j += 8) {
        lc_att_prefetch_rows(stream, K, j + LC_ATT_PF_KROWS, j + LC_ATT_PF_KROWS + 8, nr, rb);
        for (g = 0; g + 2 <= G; g += 2)
            lc_att_scores8x2_call(q + g * hd, q + (g + 1) * hd, K, j, hd, scale, s + g * ss, s + (g + 1) * ss, fmt);
        if (g < G) lc_att_scores8_call(q + g * hd, K, j, hd, scale, s + g * ss, fmt);
    }
    for (; j < nr; j++)
        for (g = 0; g < G; g++) s[g * ss + j] = lc_att_dot(q + g * hd, (const char *)K + j * rb, hd, fmt) * scale;
}

/* The value sums of G heads over nr rows from row0 (head g's weights at w + g * ws, its sums at
 * out + g * hd), four, two, one at a time (any grouping gives the same per-column chains). The grouped pass
 * and a prompt block (attention_block.h) run this. */
LC_ATT_INLINE void lc_att_values_heads(const float *w, ptrdiff_t ws, const void *V, ptrdiff_t row0, ptrdiff_t nr,
                                       ptrdiff_t hd, ptrdiff_t G, float *out, int init, int fmt) {
    const ptrdiff_t G4 = hd % 32 == 0 ? G / 4 * 4 : 0;
    ptrdiff_t g = 0;
    for (; g < G4; g += 4) lc_att_values_acc4(w + g * ws, ws, V, row0, nr, hd, out + g * hd, init, fmt);
    for (; g + 2 <= G; g += 2)
        lc_att_values_acc2(w + g * ws, w + (g + 1) * ws, V, row0, nr, hd, out + g * hd, out + (g + 1) * hd,
                           init, fmt);
    if (g < G)
        for (ptrdiff_t d0 = 0; d0 < hd; d0 += 64)
            lc_att_values_acc(w + g * ws, V, row0, nr, hd, d0, out + g * hd, init, fmt);
}
#endif

/* G <= LC_ATT_GROUP_MAX query heads over one KV head (G = 1 included): head g reads q + g * hd, writes
 * out + g * hd and uses scores + g * ss (ss >= last + 1), scores[first..last] its softmax weights. The heads
 * take turns on each block of cached rows (8 K rows for the scores, a block of V rows for the sums), so
 * each row comes from memory once for the G heads and from L1 for the others: the scores two heads at a
 * time (quantized rows: four, then pairs, then one), the sums four at a time, then pairs, then one, each
 * vector loaded (and widened) serving every head of the step.
 * Each head's output is bit for bit what this pass gives for that head alone: whatever the step, a head's
 * scores run through lc_att_scores8's chains and reduction (quantized: lc_attq_scores8xh's lanes) in the same
 * blocks of 8 from first, the positions left over through lc_att_dot (lc_attq_dot), the softmax is
 * lc_att_softmax and the sums lc_att_values_acc's per-column chains, continued from block to block. So the
 * model gives the same results whichever way its heads are split among threads.
 * Widening each half-precision block once into a float buffer for all heads, instead of per head as it
 * is loaded, measured slower on the AMD EPYC (AVX-512, 2 cores) this was written on: the K blocks 1.15x,
 * K and V 1.35x the per-head kernel's time over one Gemma 3 layer's 512-token prompt; the stores and
 * reloads cost more than the conversions saved. */
LC_ATT_INLINE void lc_attend_group_pass(const float *q, const char *qq, const float *dq, const void *K, const void *V, ptrdiff_t first,
                                        ptrdiff_t last, ptrdiff_t hd, ptrdiff_t G, float scale, float softcap,
                                        float *scores, ptrdiff_t ss, float *out, int stream, int fmt) {
#if LC_ATT_SIMD
    const ptrdiff_t n = last + 1, rb = lc_kv_row_bytes(fmt, hd);
    const ptrdiff_t vbytes = stream ? LC_ATT_VBLOCK_STREAM_BYTES : LC_ATT_VBLOCK_BYTES;
    const ptrdiff_t fit = vbytes / rb, vrows = fit > 8 ? fit : 8;
    float inv[LC_ATT_GROUP_MAX];
    ptrdiff_t j = first, g;
    if (LC_KV_QUANT(fmt)) { /* integer dot products with the quantized query, heads four, two, one at a time */
        const ptrdiff_t qs = hd / 32 * LC_QQ_BYTES, nb = hd / 32, G4 = hd % 32 == 0 ? G / 4 * 4 : 0;
        for (; j + 8 <= n; j += 8) {
            lc_att_prefetch_rows(stream, K, j + LC_ATT_PF_KROWS, j + LC_ATT_PF_KROWS + 8, n, rb);
            for (g = 0; g < G4; g += 4)
                LC_ATTQ_CALL(4, fmt)(qq + g * qs, qs, dq + g * nb, K, j, hd, scale, scores + g * ss, ss);
            for (; g + 2 <= G; g += 2)
                LC_ATTQ_CALL(2, fmt)(qq + g * qs, qs, dq + g * nb, K, j, hd, scale, scores + g * ss, ss);
            if (g < G) LC_ATTQ_CALL(1, fmt)(qq + g * qs, qs, dq + g * nb, K, j, hd, scale, scores + g * ss, ss);
        }
        for (; j < n; j++)
            for (g = 0; g < G; g++)
                scores[g * ss + j] = lc_attq_dot(qq + g * qs, dq + g * nb, (const char *)K + j * rb, hd, fmt) * scale;
    } else {
        lc_att_scores_rows(q, G, (const char *)K + first * rb, n - first, hd, scale, scores + first, ss, stream, fmt);
    }
    lc_att_prefetch_rows(stream, V, first, first + vrows, n, rb);
    for (g = 0; g < G; g++) inv[g] = lc_att_softmax(scores + g * ss, first, n, softcap);
    for (j = first; j < n; j += vrows) {
        const ptrdiff_t nr = n - j < vrows ? n - j : vrows;
        lc_att_prefetch_rows(stream, V, j + vrows, j + 2 * vrows, n, rb);
        lc_att_values_heads(scores + j, ss, V, j, nr, hd, G, out, j == first, fmt);
    }
    for (g = 0; g < G; g++) lc_att_scale(out + g * hd, hd, inv[g]);
#else
    (void)q, (void)qq, (void)dq, (void)K, (void)V, (void)first, (void)last, (void)hd, (void)G, (void)scale, (void)softcap;
    (void)scores, (void)ss, (void)out, (void)stream, (void)fmt;
#endif
}

/* G query heads sharing one KV head (the layout of lc_attend_group_pass, any G >= 1): grouped where the
 * SIMD kernel runs, else lc_attend_impl head by head. Deep into a context even one head (G = 1) reads its
 * rows in the grouped kernel's blocks, with its prefetches. */
LC_ATT_INLINE void lc_attend_group_impl(const float *q, const char *qq, const void *K, const void *V,
                                        ptrdiff_t first, ptrdiff_t last, ptrdiff_t hd, ptrdiff_t G, float scale,
                                        float softcap, float *scores, ptrdiff_t ss, float *out, int stream,
                                        int fmt) {
    const ptrdiff_t qs = LC_KV_QUANT(fmt) ? hd / 32 * LC_QQ_BYTES : 0, nb = LC_KV_QUANT(fmt) ? hd / 32 : 0;
    /* the query blocks' scales as floats, head g's at dq + g * nb */
    float dq[LC_KV_QUANT(fmt) ? G * nb : 1];
    for (ptrdiff_t b = 0; b < G * nb; b++) dq[b] = _cvtsh_ss(lc_kvq_d(qq + b * LC_QQ_BYTES));
    if (LC_ATT_SIMD && hd % 8 == 0) {
        for (ptrdiff_t g0 = 0; g0 < G; g0 += LC_ATT_GROUP_MAX)
            lc_attend_group_pass(q + g0 * hd, qq + g0 * qs, dq + g0 * nb, K, V, first, last, hd,
                                 G - g0 < LC_ATT_GROUP_MAX ? G - g0 : LC_ATT_GROUP_MAX, scale, softcap,
                                 scores + g0 * ss, ss, out + g0 * hd, stream, fmt);
        return;
    }
    for (ptrdiff_t g = 0; g < G; g++)
        lc_attend_impl(q + g * hd, qq + g * qs, dq + g * nb, K, V, first, last, hd, scale, softcap, scores + g * ss,
                       out + g * hd, fmt);
}

/* The entry point: one instance of the kernel per row format (an unknown fmt does nothing; ops.pxd's
 * callers pass KV_*). stream: the rows are not in cache (see lc_att_prefetch_rows); results do not
 * depend on it. */
static void lc_attend_group(const float *q, const char *qq, const void *K, const void *V, ptrdiff_t first,
                            ptrdiff_t last, ptrdiff_t hd, ptrdiff_t G, float scale, float softcap, float *scores,
                            ptrdiff_t ss, float *out, int stream, int fmt) {
    switch (fmt) {
    case LC_KV_F32:
        lc_attend_group_impl(q, qq, K, V, first, last, hd, G, scale, softcap, scores, ss, out, stream, LC_KV_F32);
        break;
    case LC_KV_F16:
        lc_attend_group_impl(q, qq, K, V, first, last, hd, G, scale, softcap, scores, ss, out, stream, LC_KV_F16);
        break;
    case LC_KV_Q8_0:
        lc_attend_group_impl(q, qq, K, V, first, last, hd, G, scale, softcap, scores, ss, out, stream, LC_KV_Q8_0);
        break;
    case LC_KV_Q4_0:
        lc_attend_group_impl(q, qq, K, V, first, last, hd, G, scale, softcap, scores, ss, out, stream, LC_KV_Q4_0);
        break;
    }
}

#endif
