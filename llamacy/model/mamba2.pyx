# cython: language_level=3
"""The Mamba2 mixer (Nemotron-H), as llama.cpp's build_mamba2_layer computes it, token by token.

    zxBCdt = ssm_in · x                      z [d_inner], xBC [d_inner + 2·n_group·d_state], dt [n_head]
    xBC    = SiLU(causal depthwise conv1d(xBC) + conv bias)   over the last d_conv inputs of the sequence
    per head h (head_dim channels, group g = h / (n_head / n_group) of B and C):
        dt   = softplus(dt[h] + dt_bias[h]);  dA = exp(dt · A[h])        (A = -exp(A_log), stored so)
        S    = S · dA + (x · dt) ⊗ B          S: [head_dim, d_state] per head and sequence
        y    = S · C + x · D[h]
    y      = grouped RMSNorm(y · SiLU(z)) · ssm_norm   (n_group groups of d_inner / n_group: the gate
             first, then the norm, as llama.cpp and Hugging Face's norm_before_gate=False do)
    out    = ssm_out · y

A sequence's state (memory.py: one float32 row per sequence; layout.pxd's StateRows) is its convolution's
last d_conv - 1 inputs, oldest first, each a row of the conv channels ((d_conv - 1) · channels values), then
the scan's state, head-major and within a head column-major for the output (kernels/scan.h): S[h][i][k]
at (h · d_state + k) · head_dim + i (n_head · head_dim · d_state values; llama.cpp keeps each channel's
d_state values together instead).

Prompts use the same per-token recurrence as decoding (no chunked scan): a token's result does not depend
on how its sequence was cut into micro-batches, batched with others or split over threads. The convolution
runs over the micro-batch's tokens in order; the scan runs one job item per head, each over every
token in order, so threads split heads and never the arithmetic of one; the convolution likewise runs one
item per block of channels, the gate and norm one per token.
"""

from libc.math cimport expf
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy, memset

from llamacy.kernels.ops cimport mul_silu, rmsnorm, silu_inplace, softplus
from llamacy.kernels.parallel cimport parallel_for
from llamacy.model.layout cimport HParams, LayerT, StateRows, conv_step, live_state, snapshot_slot
from llamacy.model.products cimport P_ELEM, P_MM_O, P_MM_QKV, Products, lap, product

import numpy as np


cdef extern from "scan.h" nogil:
    void lc_mamba2_step(float* S, Py_ssize_t hd, Py_ssize_t ds, const float* x, const float* B, const float* C,
                        float dt, float dA, float D, float* y)


# Channels per job item of the convolution: each item runs its channels over every token in batch order.
cdef enum:
    CONV_BLOCK = 256


cdef void _conv_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    """Channel blocks begin..end-1: xbc[t] = SiLU(conv1d over the state's last inputs and token t's xBC +
    bias), token by token in batch order; each sequence's carried inputs of these channels shift by one
    (and are kept in t's snapshot slot if it has one). A channel's sum is the same whatever the blocking."""
    cdef Mamba2Job* J = <Mamba2Job*> ctx
    cdef const HParams* hp = J.hp
    cdef Py_ssize_t DI = hp.ssm_d_inner, C = DI + 2 * hp.ssm_n_group * hp.ssm_d_state, P = C + DI + hp.ssm_dt_rank
    cdef Py_ssize_t t, c0, c1, blk
    for blk in range(begin, end):
        c0 = blk * CONV_BLOCK
        c1 = min(C, c0 + CONV_BLOCK)
        for t in range(J.n):
            conv_step(J.sr, t, J.zxbcdt + t * P + DI, J.L.ssm_conv1d, J.L.ssm_conv1d_b, J.xbc + t * C, C,
                      hp.ssm_d_conv, c0, c1)
            silu_inplace(J.xbc + t * C + c0, c1 - c0)


cdef void _gate_norm_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    """Tokens begin..end-1: y · SiLU(z), then the grouped RMSNorm."""
    cdef Mamba2Job* J = <Mamba2Job*> ctx
    cdef const HParams* hp = J.hp
    cdef Py_ssize_t DI = hp.ssm_d_inner, NG = hp.ssm_n_group, GS = DI // NG
    cdef Py_ssize_t P = 2 * DI + 2 * NG * hp.ssm_d_state + hp.ssm_dt_rank, t, i, g
    cdef const float* z
    cdef float* y
    for t in range(begin, end):
        z = J.zxbcdt + t * P
        y = J.y + t * DI
        mul_silu(y, z, DI)
        for g in range(NG):
            rmsnorm(y + g * GS, J.L.ssm_norm + g * GS, y + g * GS, GS, hp.rms_eps)


cdef void _scan_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    """Heads begin..end-1: each over the micro-batch's tokens in order, continuing its sequence's state."""
    cdef Mamba2Job* J = <Mamba2Job*> ctx
    cdef const HParams* hp = J.hp
    cdef const LayerT* L = J.L
    cdef const StateRows* sr = J.sr
    cdef Py_ssize_t DI = hp.ssm_d_inner, NG = hp.ssm_n_group, DS = hp.ssm_d_state, NH = hp.ssm_dt_rank
    cdef Py_ssize_t HD = DI // NH, C = DI + 2 * NG * DS, P = 2 * DI + 2 * NG * DS + NH
    cdef Py_ssize_t h, t, g
    cdef float dt
    cdef float* S
    cdef float* slot
    cdef const float* xbc
    for h in range(begin, end):
        g = h // (NH // NG)
        for t in range(J.n):
            # Head h's part of t's sequence state, zeroed here at position 0 (the convolution zeroes its own).
            S = live_state(sr, t) + sr.conv + h * HD * DS
            if sr.pos[t] == 0:
                memset(S, 0, HD * DS * sizeof(float))
            dt = softplus(J.zxbcdt[t * P + 2 * DI + 2 * NG * DS + h] + L.ssm_dt[h])
            xbc = J.xbc + t * C
            lc_mamba2_step(S, HD, DS, xbc + h * HD, xbc + DI + g * DS, xbc + DI + NG * DS + g * DS, dt,
                           expf(dt * L.ssm_a[h]), L.ssm_d[h], J.y + t * DI + h * HD)
            slot = snapshot_slot(sr, t)
            if slot != NULL:
                memcpy(slot + sr.conv + h * HD * DS, S, HD * DS * sizeof(float))


cdef void mamba2_mixer(Products* pr, Mamba2Job* J, const LayerT* L, const StateRows* sr, const float* xn,
                       float* out, Py_ssize_t n, int nthreads) noexcept nogil:
    cdef const HParams* hp = J.hp
    cdef Py_ssize_t E = hp.n_embd, DI = hp.ssm_d_inner, NG = hp.ssm_n_group, DS = hp.ssm_d_state
    J.L = L
    J.sr = sr
    J.n = n
    product(pr, &L.ssm_in, xn, E, n, J.zxbcdt, NULL, nthreads, P_MM_QKV)
    parallel_for(_conv_task, J, (DI + 2 * NG * DS + CONV_BLOCK - 1) // CONV_BLOCK, 1, nthreads)
    parallel_for(_scan_task, J, hp.ssm_dt_rank, 1, nthreads)
    parallel_for(_gate_norm_task, J, n, 1, nthreads)
    lap(pr, P_ELEM)
    product(pr, &L.ssm_out, J.y, DI, n, out, NULL, nthreads, P_MM_O)


cdef class Mamba2Space:
    """The buffers of mamba2_mixer for micro-batches of up to ubatch tokens."""

    def __init__(self, cfg, Py_ssize_t ubatch):
        cdef Py_ssize_t DI = cfg.ssm_d_inner, C = DI + 2 * cfg.ssm_n_group * cfg.ssm_d_state
        self._arrays = []
        self.job.zxbcdt = <float*> self._buf(ubatch * (DI + C + cfg.ssm_dt_rank), np.float32)
        self.job.xbc = <float*> self._buf(ubatch * C, np.float32)
        self.job.y = <float*> self._buf(ubatch * DI, np.float32)

    cdef void* _buf(self, Py_ssize_t n, dtype) except NULL:
        arr = np.zeros(max(n, 1), dtype)
        self._arrays.append(arr)
        cdef uint8_t[::1] b = arr.view(np.uint8)
        return &b[0]
