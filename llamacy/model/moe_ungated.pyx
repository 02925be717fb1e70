# cython: language_level=3
"""Nemotron-H's mixture of experts (FFN_MOE_UNGATED), as llama.cpp's nemotron_h graph builds it:

    p      = sigmoid(ffn_gate_inp · x)                 router on the normed input, per expert
    chosen = the k largest p + exp_probs_b             the bias steers the choice only
    w_j    = p[chosen_j] (/ their sum, expert_weights_norm) · expert_weights_scale
    h      = ffn_latent_down · x  (where the layer has it; else x)
    m      = Σ_j w_j · down_j(relu(up_j · h)²)         ungated experts, best first
    out    = ffn_latent_up · m (where it has it) + down_shexp(relu(up_shexp · x)²)

The expert products are moe.pyx's (tokens grouped by expert, one job over (expert, row range) items).
"""

from libc.math cimport expf
from libc.stdint cimport int32_t, uint8_t
from libc.string cimport memcpy

from llamacy.kernels.quant cimport act_row_bytes
from llamacy.model.layout cimport HParams, LayerT
from llamacy.model.moe cimport MoeJob, _dense, _experts, group_by_expert
from llamacy.model.rowjobs cimport RowJob, act_rows, quant_rows


cdef void _route_sigmoid(MoeJob* M, const float* bias, Py_ssize_t n) noexcept nogil:
    """Each token's k experts by sigmoid(logit) + bias (ties: the lower index), weighted by the sigmoid
    alone; then the grouped order (experts ascending, each expert's tokens in batch order)."""
    cdef const HParams* hp = M.hp
    cdef Py_ssize_t NE = hp.n_expert, K = hp.n_expert_used, t, j, e, i
    cdef float* p
    cdef float total, v
    cdef int32_t* sel
    cdef float* ws
    cdef float best[256]  # the choice scores of the current best k (k <= 256: config checks)
    for t in range(n):
        p = M.logits + t * NE
        for e in range(NE):
            p[e] = 1.0 / (1.0 + expf(-p[e]))
        sel = M.sel + t * K
        ws = M.wsel + t * K
        for j in range(K):
            sel[j] = -1
            best[j] = -1e30
        for e in range(NE):
            v = p[e] + bias[e]
            if v <= best[K - 1]:
                continue
            i = K - 1
            while i > 0 and best[i - 1] < v:
                best[i] = best[i - 1]
                sel[i] = sel[i - 1]
                i -= 1
            best[i] = v
            sel[i] = <int32_t>e
        for j in range(K):
            ws[j] = p[sel[j]]
        if hp.expert_norm:
            total = 0.0
            for j in range(K):
                total += ws[j]
            if total < 6.103515625e-5:  # llama.cpp clamps the sum (the smallest normal half)
                total = 6.103515625e-5
            for j in range(K):
                ws[j] /= total
        if hp.expert_scale != 1.0:
            for j in range(K):
                ws[j] *= hp.expert_scale
    group_by_expert(M, n)


cdef void moe_ungated_ffn(MoeJob* M, RowJob* rj, const LayerT* L, const float* xn, uint8_t* aq_tok,
                          float* out, Py_ssize_t n, int nthreads) noexcept nogil:
    cdef const HParams* hp = M.hp
    cdef Py_ssize_t E = hp.n_embd, K = hp.n_expert_used, FE = hp.n_ff_exp, t, j, i, r
    cdef Py_ssize_t W = L.latent_down.rows if L.latent_down.rows else E  # the experts' width
    cdef Py_ssize_t FS = L.up_shexp.rows
    cdef const float* h = xn
    cdef float* m = M.b2 if L.latent_up.rows else out
    cdef const float* o
    cdef float wj
    _dense(rj, &L.gate_inp, xn, E, aq_tok, n, M.logits, nthreads)
    _route_sigmoid(M, L.exp_probs_b, n)
    if L.latent_down.rows:
        _dense(rj, &L.latent_down, xn, E, aq_tok, n, M.b1, nthreads)
        h = M.b1
    # up of every chosen expert over its tokens' rows (in the grouped order), relu², down.
    quant_rows(rj, &L.up_exps, h, W, aq_tok, n, nthreads)
    M.arb = act_row_bytes(L.up_exps.type, W)
    for r in range(n * K):
        memcpy(M.aq + r * M.arb, aq_tok + M.tok_of[r] * M.arb, M.arb)
    _experts(M, &L.up_exps, M.g, NULL, NULL, n * K, nthreads)
    act_rows(rj, M.g, NULL, FE, n * K, nthreads)  # the model's activation, ungated: relu(x)²
    quant_rows(rj, &L.down_exps, M.g, FE, M.aq, n * K, nthreads)
    M.arb = act_row_bytes(L.down_exps.type, FE)
    _experts(M, &L.down_exps, M.o, NULL, NULL, n * K, nthreads)
    for t in range(n):
        for j in range(K):
            wj = M.wsel[t * K + j]
            o = M.o + M.row_of[t * K + j] * W
            if j == 0:
                for i in range(W):
                    m[t * W + i] = wj * o[i]
            else:
                for i in range(W):
                    m[t * W + i] += wj * o[i]
    if L.latent_up.rows:
        _dense(rj, &L.latent_up, m, W, aq_tok, n, out, nthreads)
    # The shared expert, on the normed input itself.
    _dense(rj, &L.up_shexp, xn, E, M.aq, n, M.g, nthreads)
    act_rows(rj, M.g, NULL, FS, n, nthreads)
    _dense(rj, &L.down_shexp, M.g, FS, M.aq, n, M.o, nthreads)
    for t in range(n):
        for i in range(E):
            out[t * E + i] += M.o[t * E + i]
