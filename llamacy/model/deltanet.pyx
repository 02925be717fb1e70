# cython: language_level=3
"""The gated delta-net mixer of Qwen3-Next and Qwen3.5 (llama.cpp's delta-net-base.cpp; Hugging Face's
Qwen3NextGatedDeltaNet with torch_recurrent_gated_delta_rule), in its recurrent per-token form for prompts
and decode alike, so that a token's result never depends on how the tokens were batched.

Per token: q, k, v = the causal depthwise convolution (width d_conv, carried over the sequence's last
d_conv - 1 inputs) of the projected [q | k | v], SiLU; q and k L2-normed per key head (x / sqrt(|x|² +
1e-6), as Hugging Face's l2norm), q scaled by 1/sqrt(dk); beta = sigmoid(b), g = softplus(a + dt_bias)·A
per value head; then for each value head h (reading key head kh: DeltaJob.k_tiled says which):
    S ← S·exp(g);  d = beta·(v - S k);  S ← S + d kᵀ;  o = S q
with S [dv, dk], stored column-major (kernels/scan.h: element (i, kk) at kk·dv + i, so that S k and S q are
sums over kk in lanes of i, not a horizontal sum per i as llama.cpp's row-major S needs); then
o ← rmsnorm(o)·ssm_norm·SiLU(z) per head, and ssm_out.

The state of one sequence in a layer's memory (ModelConfig.layer_state_conv / layer_state_ssm):
    conv: (d_conv - 1) rows of `channels` floats, the convolution's last inputs, oldest first;
    ssm:  n_v heads of dk · dv floats, S above (column-major).
Passes keep a micro-batch's tokens of one sequence in order while the team works in parallel: the
convolution over all tokens in batch order (one block of channels per item), the per-token gates (one
thread), then every head over all tokens (one head per item). Each pass copies its part of the state after
a token into that token's snapshot slot (layout.pxd's snapshot_slot) and zeroes its part at position 0.
"""

from libc.math cimport expf, sqrtf
from libc.stdint cimport int64_t
from libc.string cimport memcpy, memset

from llamacy.kernels.ops cimport mul_silu, silu_inplace, softplus
from llamacy.kernels.parallel cimport parallel_for
from llamacy.model.layout cimport LayerT, StateRows, conv_step, live_state, snapshot_slot
from llamacy.model.products cimport P_ATTN, P_ELEM, P_MM_O, P_MM_QKV, Products, lap, product

import numpy as np


cdef extern from "scan.h" nogil:
    void lc_delta_step(float* S, Py_ssize_t dv, Py_ssize_t dk, const float* q, const float* k, const float* v,
                       float decay, float beta, float* o)

# Hugging Face's l2norm epsilon (added to the squared norm).
cdef float L2_EPS = 1e-6


cdef class DeltaSpace:
    """The mixer's activations for micro-batches of up to ubatch tokens, sized by the config."""

    def __init__(self, cfg, Py_ssize_t ubatch):
        cdef DeltaJob* j = &self.job
        self._arrays = []
        j.n_k = cfg.ssm_n_group
        j.dk = cfg.ssm_d_state
        j.n_v = cfg.ssm_dt_rank
        if j.n_v <= 0 or j.n_k <= 0 or j.n_v % j.n_k or cfg.ssm_d_inner % j.n_v:
            raise ValueError("delta-net heads do not divide")
        j.dv = cfg.ssm_d_inner // j.n_v
        j.d_conv = cfg.ssm_d_conv
        j.channels = 2 * j.n_k * j.dk + j.n_v * j.dv
        j.k_tiled = cfg.ssm_k_tiled
        j.eps = cfg.rms_eps
        cdef Py_ssize_t n = ubatch, VD = j.n_v * j.dv
        j.qkv = self._floats(n * j.channels)
        j.cv = self._floats(n * j.channels)
        j.z = self._floats(n * VD)
        j.beta = self._floats(n * j.n_v)
        j.g = self._floats(n * 2 * j.n_v)
        j.y = self._floats(n * VD)
        j.tmp = self._floats(n * (j.channels + VD))

    cdef float* _floats(self, Py_ssize_t n) except NULL:
        arr = np.zeros(max(n, 1), np.float32)
        self._arrays.append(arr)
        cdef float[::1] f = arr
        return &f[0]


cdef void _split_legacy(DeltaJob* j, Py_ssize_t n) noexcept nogil:
    """A legacy ssm_in's rows, [q, k, v, z] per key head, into qkv ([q…, k…, v…]) and z."""
    cdef Py_ssize_t t, h, KD = j.n_k * j.dk, r = j.n_v // j.n_k, VG = r * j.dv, G = 2 * j.dk + 2 * VG
    cdef const float* src
    for t in range(n):
        for h in range(j.n_k):
            src = j.tmp + t * (j.channels + j.n_v * j.dv) + h * G
            memcpy(j.qkv + t * j.channels + h * j.dk, src, j.dk * sizeof(float))
            memcpy(j.qkv + t * j.channels + KD + h * j.dk, src + j.dk, j.dk * sizeof(float))
            memcpy(j.qkv + t * j.channels + 2 * KD + h * VG, src + 2 * j.dk, VG * sizeof(float))
            memcpy(j.z + t * j.n_v * j.dv + h * VG, src + 2 * j.dk + VG, VG * sizeof(float))


cdef void _l2norm(float* x, Py_ssize_t n, float scale) noexcept nogil:
    cdef Py_ssize_t i
    cdef float ss = 0.0
    for i in range(n):
        ss += x[i] * x[i]
    cdef float inv = scale / sqrtf(ss + L2_EPS)
    for i in range(n):
        x[i] *= inv


# Channels per job item of the convolution: each item runs its channels over every token in batch order.
cdef enum:
    CONV_BLOCK = 256


cdef void _conv_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    """Channel blocks begin..end-1 over every token in batch order: the causal convolution (carrying each
    sequence's last inputs of these channels), SiLU. A channel's sum runs over its taps oldest first, as
    ggml_ssm_conv sums, whatever the blocking."""
    cdef DeltaJob* j = <DeltaJob*> ctx
    cdef Py_ssize_t C = j.channels, t, c0, c1, blk
    for blk in range(begin, end):
        c0 = blk * CONV_BLOCK
        c1 = min(C, c0 + CONV_BLOCK)
        for t in range(j.n):
            conv_step(j.sr, t, j.qkv + t * C, j.L.ssm_conv1d, NULL, j.cv + t * C, C, j.d_conv, c0, c1)
            silu_inplace(j.cv + t * C + c0, c1 - c0)


cdef void _gates(DeltaJob* j, const LayerT* L, Py_ssize_t n) noexcept nogil:
    """q and k L2-normed per key head (q scaled by 1/sqrt(dk)); beta and g per value head."""
    cdef Py_ssize_t t, h, r = j.n_v // j.n_k, KD = j.n_k * j.dk, C = j.channels
    cdef float a, b
    cdef float qscale = 1.0 / sqrtf(<float>j.dk)
    cdef float* y
    for t in range(n):
        y = j.cv + t * C
        for h in range(j.n_k):
            _l2norm(y + h * j.dk, j.dk, qscale)
            _l2norm(y + KD + h * j.dk, j.dk, 1.0)
        # beta and alpha: fused per key head [b × r, a × r] (qwen3next's ssm_ba) or two products.
        for h in range(j.n_v):
            if L.ssm_ba.rows:
                b = j.g[t * 2 * j.n_v + (h // r) * 2 * r + h % r]
                a = j.g[t * 2 * j.n_v + (h // r) * 2 * r + r + h % r]
            else:
                b = j.beta[t * j.n_v + h]
                a = j.g[t * j.n_v + h]
            j.beta[t * j.n_v + h] = 1.0 / (1.0 + expf(-b))
            j.y[t * j.n_v * j.dv + h] = softplus(a + L.ssm_dt[h]) * L.ssm_a[h]  # g, parked in y
    # g out of y (y is written by the head pass; g's raw b/a rows were read above).
    for t in range(n):
        memcpy(j.g + t * j.n_v, j.y + t * j.n_v * j.dv, j.n_v * sizeof(float))


cdef void _heads_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    """Value heads begin..end-1 over every token of the micro-batch, in batch order."""
    cdef DeltaJob* j = <DeltaJob*> ctx
    cdef const StateRows* sr = j.sr
    cdef const LayerT* L = j.L
    cdef Py_ssize_t h, t, i, kh, C = j.channels, DK = j.dk, DV = j.dv, KD = j.n_k * j.dk
    cdef Py_ssize_t conv = sr.conv, HS = j.dv * j.dk, r = j.n_v // j.n_k
    cdef float* S
    cdef float* slot
    cdef float* o
    cdef const float* z
    cdef float ss, inv
    for h in range(begin, end):
        kh = h % j.n_k if j.k_tiled else h // r
        for t in range(j.n):
            S = live_state(sr, t) + conv + h * HS
            if sr.pos[t] == 0:
                memset(S, 0, HS * sizeof(float))
            o = j.y + t * j.n_v * DV + h * DV
            lc_delta_step(S, DV, DK, j.cv + t * C + kh * DK, j.cv + t * C + KD + kh * DK,
                          j.cv + t * C + 2 * KD + h * DV, expf(j.g[t * j.n_v + h]), j.beta[t * j.n_v + h], o)
            # The gated norm: rmsnorm(o) · ssm_norm · SiLU(z).
            z = j.z + t * j.n_v * DV + h * DV
            ss = 0.0
            for i in range(DV):
                ss = ss + o[i] * o[i]
            inv = 1.0 / sqrtf(ss / DV + j.eps)
            for i in range(DV):
                o[i] = o[i] * inv * L.ssm_norm[i]
            mul_silu(o, z, DV)
            slot = snapshot_slot(sr, t)
            if slot != NULL:
                memcpy(slot + conv + h * HS, S, HS * sizeof(float))


cdef void deltanet_mixer(Products* pr, DeltaJob* j, const LayerT* L, const StateRows* sr, const float* xn,
                         Py_ssize_t n_embd, float* out, Py_ssize_t n, int nthreads) noexcept nogil:
    cdef int fmt = -1  # every input projection reads the same quantized rows of xn
    cdef Py_ssize_t E = n_embd
    if L.ssm_in.rows:
        product(pr, &L.ssm_in, xn, E, n, j.tmp, &fmt, nthreads, P_MM_QKV)
        _split_legacy(j, n)
    else:
        product(pr, &L.wqkv, xn, E, n, j.qkv, &fmt, nthreads, P_MM_QKV)
        product(pr, &L.wqkv_gate, xn, E, n, j.z, &fmt, nthreads, P_MM_QKV)
    if L.ssm_ba.rows:
        product(pr, &L.ssm_ba, xn, E, n, j.g, &fmt, nthreads, P_MM_QKV)
    else:
        product(pr, &L.ssm_beta, xn, E, n, j.beta, &fmt, nthreads, P_MM_QKV)
        product(pr, &L.ssm_alpha, xn, E, n, j.g, &fmt, nthreads, P_MM_QKV)
    j.L = L
    j.sr = sr
    j.n = n
    parallel_for(_conv_task, j, (j.channels + CONV_BLOCK - 1) // CONV_BLOCK, 1, nthreads)
    _gates(j, L, n)
    lap(pr, P_ELEM)
    parallel_for(_heads_task, j, j.n_v, 1, nthreads)
    lap(pr, P_ATTN)
    product(pr, &L.ssm_out, j.y, j.n_v * j.dv, n, out, NULL, nthreads, P_MM_O)
