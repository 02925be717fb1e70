/* A prompt's attention, several tokens at a time (ops.pyx's attend_block).
 *
 * Over a prompt, token t attends over the rows 0..t, token t + 1 over the same rows and one more: the
 * tokens of a block of consecutive positions read the same cached rows. attention.h's grouped kernel
 * widens each half-precision row for the heads of one token's KV group, so over a 512-token prompt of
 * SmolLM2 (3 heads a group, head_dim 64) the widening (vcvtph2ps, on an FMA port) took about as many
 * issue slots as the products it fed, and attention was a third of the prompt's time. Here a block of up
 * to LC_ATT_BLOCK_MAX tokens takes turns on each block of rows, widened once into a float buffer in L1 for
 * the block's tokens and heads, and the products run over the buffer.
 *
 * Each (token, head) gets bit for bit what lc_attend_group gives for it alone: the rows every token of the
 * block sees run through the very kernels of the grouped pass (lc_att_scores8's chains in blocks of 8
 * from first, the value sums' per-column chains, which may stop and continue anywhere), over floats equal
 * to the half-precision values (widening is exact); each token's own rows beyond those go through the
 * grouped pass's code on the cached rows, in the order it takes them (blocks of 8 while whole, then
 * lc_att_dot); the softmax is lc_att_softmax over the same positions. So a prompt gives the same logits
 * whether its tokens come in one batch, in several, or one at a time, and decoding continues the same
 * cache. Quantized rows (their scores are integer dot products per token) take the grouped kernel token
 * by token.
 *
 * Included into ops.c after attention.h.
 */
#ifndef LLAMACY_ATTENTION_BLOCK_H
#define LLAMACY_ATTENTION_BLOCK_H

#include "attention.h"
#include "attention512.h"

#define LC_ATT_BLOCK_MAX 8      /* tokens per block */

/* B <= LC_ATT_BLOCK_MAX tokens at consecutive positions, G <= LC_ATT_GROUP_MAX query heads each, over one
 * KV head: token i attends over rows first..last0 + i. Its heads read q + i * qs + g * hd and write
 * out + i * os + g * hd; head g of token i uses the row of scores at scores + (i * G + g) * ss, indexed from
 * first (ss >= last0 + B - first). fmt: LC_KV_F32 or LC_KV_F16; hd a multiple of 8, at most
 * LC_ATT_WIDE_HD_MAX. */
LC_ATT_INLINE void lc_attend_block_impl(const float *q, ptrdiff_t qs, const void *K, const void *V, ptrdiff_t first,
                                        ptrdiff_t last0, ptrdiff_t B, ptrdiff_t hd, ptrdiff_t G, float scale,
                                        float softcap, float *scores, ptrdiff_t ss, float *out, ptrdiff_t os,
                                        int fmt) {
#if LC_ATT_SIMD
    const ptrdiff_t n0 = last0 + 1, rb = lc_kv_row_bytes(fmt, hd), QN = B * G;
    const ptrdiff_t fit = LC_ATT_VBLOCK_BYTES / (hd * 4), vrows = fit > 8 ? fit : 8;
    float buf[LC_ATT_VBLOCK_BYTES / 4 > 8 * LC_ATT_WIDE_HD_MAX ? LC_ATT_VBLOCK_BYTES / 4 : 8 * LC_ATT_WIDE_HD_MAX];
    float inv[LC_ATT_BLOCK_MAX * LC_ATT_GROUP_MAX];
    ptrdiff_t j, k, i, g;
    /* Scores over the blocks of 8 rows whole for every token: each block widened once. */
    const ptrdiff_t jc = first + (n0 - first) / 8 * 8;
#if LC_ATT512
    if (lc_att_use512)
        lc_att512_block_scores(q, qs, K, first, jc, hd, G, QN, scale, scores, ss, buf, fmt);
    else
#endif
    for (j = first; j < jc; j += 8) {
        const float *kf = lc_att_widen_rows(K, j, 8, hd, buf, fmt);
        for (k = 0; k + 2 <= QN; k += 2)
            lc_att_scores8x2_f32(q + k / G * qs + k % G * hd, q + (k + 1) / G * qs + (k + 1) % G * hd, kf, 0, hd,
                                 scale, scores + k * ss + (j - first), scores + (k + 1) * ss + (j - first));
        if (k < QN) lc_att_scores8_f32(q + k / G * qs + k % G * hd, kf, 0, hd, scale, scores + k * ss + (j - first));
    }
    /* Each token's rows beyond: blocks of 8 while whole, then one by one, from the cached rows. */
    for (i = 0; i < B; i++) {
        const ptrdiff_t n = n0 + i;
        lc_att_scores_rows(q + i * qs, G, (const char *)K + jc * rb, n - jc, hd, scale,
                           scores + i * G * ss + (jc - first), ss, 0, fmt);
        for (g = 0; g < G; g++) inv[i * G + g] = lc_att_softmax(scores + (i * G + g) * ss, 0, n - first, softcap);
    }
    /* The value sums: the rows every token sees in blocks widened once, then each token's own. */
    for (j = first; j < n0; j += vrows) {
        const ptrdiff_t nr = n0 - j < vrows ? n0 - j : vrows;
        const float *vf = lc_att_widen_rows(V, j, nr, hd, buf, fmt);
#if LC_ATT512
        if (lc_att_use512) {
            lc_att512_block_values(vf, j, nr, first, hd, G, QN, scores, ss, out, os, j == first);
            continue;
        }
#endif
        for (i = 0; i < B; i++)
            lc_att_values_heads(scores + i * G * ss + (j - first), ss, vf, 0, nr, hd, G, out + i * os, j == first,
                                LC_KV_F32);
    }
    for (i = 1; i < B; i++)
        lc_att_values_heads(scores + i * G * ss + (n0 - first), ss, V, n0, i, hd, G, out + i * os, 0, fmt);
    for (k = 0; k < QN; k++) lc_att_scale(out + k / G * os + k % G * hd, hd, inv[k]);
#else
    (void)q, (void)qs, (void)K, (void)V, (void)first, (void)last0, (void)B, (void)hd, (void)G, (void)scale;
    (void)softcap, (void)scores, (void)ss, (void)out, (void)os, (void)fmt;
#endif
}

/* Whether lc_attend_block takes these rows (else the caller runs lc_attend_group token by token). */
static int lc_attend_block_ok(ptrdiff_t hd, ptrdiff_t G, ptrdiff_t B, int fmt) {
    return LC_ATT_SIMD && (fmt == LC_KV_F32 || fmt == LC_KV_F16) && hd % 8 == 0 && hd <= LC_ATT_WIDE_HD_MAX &&
           G >= 1 && G <= LC_ATT_GROUP_MAX && B >= 1 && B <= LC_ATT_BLOCK_MAX;
}

/* The entry point, one instance per format (see lc_attend_block_ok). */
static void lc_attend_block(const float *q, ptrdiff_t qs, const void *K, const void *V, ptrdiff_t first,
                            ptrdiff_t last0, ptrdiff_t B, ptrdiff_t hd, ptrdiff_t G, float scale, float softcap,
                            float *scores, ptrdiff_t ss, float *out, ptrdiff_t os, int fmt) {
    if (fmt == LC_KV_F32)
        lc_attend_block_impl(q, qs, K, V, first, last0, B, hd, G, scale, softcap, scores, ss, out, os, LC_KV_F32);
    else if (fmt == LC_KV_F16)
        lc_attend_block_impl(q, qs, K, V, first, last0, B, hd, G, scale, softcap, scores, ss, out, os, LC_KV_F16);
}

#endif
