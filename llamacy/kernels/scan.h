/* The recurrent mixers' per-token step for one head: Mamba2's selective scan (model/mamba2.pyx) and the gated
 * delta rule (model/deltanet.pyx). Prompts and decode both run it token by token, so a token's result never
 * depends on how its sequence was batched or cut.
 *
 * The state is held column-major for the output: S[k * w + i] is output channel i's state along key (or
 * state) dimension k, so every product of the state with a vector over k runs as w independent lanes, each
 * a sum over k in order, and the update and the readout share one sweep over the state. (Rows along k,
 * llama.cpp's order, need a horizontal sum per channel per token; their latency bound the prompts.)
 *
 * Plain C: GCC vectorises the fixed-width sweeps (LC_SCAN_W channels, their sums kept in registers) in the
 * AVX2 build and the portable build alike. Each channel's arithmetic is the same whatever the width, so the
 * tail sweep of a head whose width is not a multiple of LC_SCAN_W gives what a full sweep would.
 */
#ifndef LLAMACY_SCAN_H
#define LLAMACY_SCAN_H

#include <stddef.h>

/* Channels per sweep: 4 AVX2 vectors of sums, with their operands, fit the 16 registers. */
#define LC_SCAN_W 32

/* The sweep both recurrences share, over rows r < nr of a column-major state and its channels i0..i0+n-1:
 * S[r] <- S[r] * decay + a[r] u (outer product: the update), acc += S[r] b[r] (the read-out, of the state
 * just written). acc: n sums, accumulated. */
static inline __attribute__((always_inline)) void lc_scan_sweep(float* S, ptrdiff_t w, ptrdiff_t nr, ptrdiff_t i0,
                                                                ptrdiff_t n, float decay, const float* a,
                                                                const float* u, const float* b, float* acc) {
    for (ptrdiff_t r = 0; r < nr; r++) {
        float* row = S + r * w + i0;
        const float ar = a[r], br = b[r];
        for (ptrdiff_t i = 0; i < n; i++) {
            const float s = row[i] * decay + ar * u[i];
            row[i] = s;
            acc[i] += s * br;
        }
    }
}

/* Mamba2 over channels i0..i0+n-1 of one head: S <- S * dA + B (x * dt)^T, y = S^T C + x * D. */
static inline __attribute__((always_inline)) void lc_mamba2_cols(float* S, ptrdiff_t w, ptrdiff_t ds,
                                                                 const float* x, const float* B,
                                                                 const float* C, float dt, float dA, float D,
                                                                 float* y, ptrdiff_t i0, ptrdiff_t n) {
    float xdt[LC_SCAN_W], acc[LC_SCAN_W];
    ptrdiff_t i;
    for (i = 0; i < n; i++) {
        xdt[i] = x[i0 + i] * dt;
        acc[i] = 0.0f;
    }
    lc_scan_sweep(S, w, ds, i0, n, dA, B, xdt, C, acc);
    for (i = 0; i < n; i++) y[i0 + i] = acc[i] + x[i0 + i] * D;
}

/* Mamba2, one head, one token. S: [ds][hd] (the head's state, column-major as above); x: the head's hd
 * inputs; B, C: its group's ds values; dt the softplus'd step, dA = exp(dt * A); y: hd outputs. */
static void lc_mamba2_step(float* S, ptrdiff_t hd, ptrdiff_t ds, const float* x, const float* B,
                           const float* C, float dt, float dA, float D, float* y) {
    ptrdiff_t i0 = 0;
    for (; i0 + LC_SCAN_W <= hd; i0 += LC_SCAN_W) lc_mamba2_cols(S, hd, ds, x, B, C, dt, dA, D, y, i0, LC_SCAN_W);
    if (i0 < hd) lc_mamba2_cols(S, hd, ds, x, B, C, dt, dA, D, y, i0, hd - i0);
}

/* The delta rule over value channels i0..i0+n-1 of one head: d = beta (v - decay (S^T k)); S <- S * decay
 * + k d^T; o = S^T q. (decay scales the read S^T k rather than S before it: one sweep fewer.) */
static inline __attribute__((always_inline)) void lc_delta_cols(float* S, ptrdiff_t dv, ptrdiff_t dk,
                                                                const float* q, const float* k,
                                                                const float* v, float decay, float beta,
                                                                float* o, ptrdiff_t i0, ptrdiff_t n) {
    float d[LC_SCAN_W], acc[LC_SCAN_W];
    ptrdiff_t i, j;
    for (i = 0; i < n; i++) acc[i] = 0.0f;
    for (j = 0; j < dk; j++) {
        const float* row = S + j * dv + i0;
        const float kj = k[j];
        for (i = 0; i < n; i++) acc[i] += row[i] * kj;
    }
    for (i = 0; i < n; i++) {
        d[i] = beta * (v[i0 + i] - decay * acc[i]);
        acc[i] = 0.0f;
    }
    lc_scan_sweep(S, dv, dk, i0, n, decay, k, d, q, acc);
    for (i = 0; i < n; i++) o[i0 + i] = acc[i];
}

/* The gated delta rule, one value head, one token. S: [dk][dv] (column-major as above); q, k: the key
 * head's dk values (normed; q scaled); v: the head's dv values; decay = exp(g); o: dv outputs. */
static void lc_delta_step(float* S, ptrdiff_t dv, ptrdiff_t dk, const float* q, const float* k, const float* v,
                          float decay, float beta, float* o) {
    ptrdiff_t i0 = 0;
    for (; i0 + LC_SCAN_W <= dv; i0 += LC_SCAN_W) lc_delta_cols(S, dv, dk, q, k, v, decay, beta, o, i0, LC_SCAN_W);
    if (i0 < dv) lc_delta_cols(S, dv, dk, q, k, v, decay, beta, o, i0, dv - i0);
}

#endif /* LLAMACY_SCAN_H */
