# cython: language_level=3
"""The mixture-of-experts feed-forward block, without the GIL, on the thread team.

Each token's router logits give its k experts and their weights (softmax over all experts, the k largest,
renormalised over those k where the architecture does: Mixtral's softmax of the top-k logits is the same
thing). The batch's tokens are then grouped by expert, so that an expert's rows are read once per step for
every token routed to it, and decode reads only the k chosen experts. The products run as one job per
phase over (expert, row range) items: the threads split the work across experts and rows at once, each
item an ordinary matmul of a row range of the expert's slice of the stacked tensor (a contiguous run of
rows), so every row is computed by the same kernels, bit for bit, as a dense matrix's. Where the VNNI
kernels are on, the stacks go into 8-row tiles like the dense matrices (repack.experts_repackable: an
expert's rows are whole tiles; at load, or in idle time after a deferred load), and an item then reads its
expert's tiles.
"""

from libc.math cimport expf
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.string cimport memcpy

from llamacy.kernels.matmul cimport matmul_rows, matmul_tiled
from llamacy.kernels.ops cimport dot_f32
from llamacy.kernels.parallel cimport parallel_for
from llamacy.kernels.quant cimport act_format, act_row_bytes
from llamacy.kernels.traits cimport LAYOUT_STORED, layout_row_bytes
from llamacy.model.layout cimport HParams, LayerT, WeightT
from llamacy.model.products cimport weight_matmul
from llamacy.model.rowjobs cimport RowJob, act_rows, quant_rows

import numpy as np

# Rows per work item: a multiple of every kernel's row tile (matmul.pyx's SPLIT_ROWS), so that a row range
# computes each row exactly as the whole matrix would.
cdef enum:
    SPLIT_ROWS = 16


cdef void _route(MoeJob* M, Py_ssize_t n) noexcept nogil:
    """Softmax of each token's router logits, its k best experts (ties: the lower index) and their
    weights; then the grouped order: experts ascending, each expert's tokens in batch order."""
    cdef const HParams* hp = M.hp
    cdef Py_ssize_t NE = hp.n_expert, K = hp.n_expert_used, t, j, e, i
    cdef float* p
    cdef float mx, total, v
    cdef int32_t* sel
    cdef float* ws
    for t in range(n):
        p = M.logits + t * NE
        mx = p[0]
        for e in range(1, NE):
            if p[e] > mx:
                mx = p[e]
        total = 0.0
        for e in range(NE):
            p[e] = expf(p[e] - mx)
            total += p[e]
        for e in range(NE):
            p[e] /= total
        sel = M.sel + t * K
        ws = M.wsel + t * K
        # Insertion into the sorted best-k (strictly greater moves ahead: ties keep the lower index first).
        for j in range(K):
            sel[j] = -1
            ws[j] = -1.0
        for e in range(NE):
            v = p[e]
            if v <= ws[K - 1]:
                continue
            i = K - 1
            while i > 0 and ws[i - 1] < v:
                ws[i] = ws[i - 1]
                sel[i] = sel[i - 1]
                i -= 1
            ws[i] = v
            sel[i] = <int32_t>e
        if hp.expert_norm:
            total = 0.0
            for j in range(K):
                total += ws[j]
            for j in range(K):
                ws[j] /= total
    group_by_expert(M, n)


cdef void group_by_expert(MoeJob* M, Py_ssize_t n) noexcept nogil:
    """The grouped order of the n tokens' chosen experts (M.sel): experts ascending, each expert's tokens in
    batch order (M.start, M.row_of, M.tok_of)."""
    cdef Py_ssize_t NE = M.hp.n_expert, K = M.hp.n_expert_used, t, j, e, i
    for e in range(NE):
        M.count[e] = 0
    for i in range(n * K):
        M.count[M.sel[i]] += 1
    M.start[0] = 0
    for e in range(NE):
        M.start[e + 1] = M.start[e] + M.count[e]
        M.count[e] = 0  # refilled below as a cursor
    for t in range(n):
        for j in range(K):
            e = M.sel[t * K + j]
            i = M.start[e] + M.count[e]
            M.count[e] += 1
            M.row_of[t * K + j] = <int32_t>i
            M.tok_of[i] = <int32_t>t


cdef void _expert_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    cdef MoeJob* M = <MoeJob*> ctx
    cdef const ExpertItem* it
    cdef const WeightT* w
    cdef Py_ssize_t i, e, r_exp, first, r
    for i in range(begin, end):
        it = &M.items[i]
        w = M.w[it.mat]
        e = it.expert
        r_exp = w.rows // M.hp.n_expert
        first = M.start[e]
        r = e * r_exp + it.r0  # the stack's row: a multiple of 8 when tiled (repack.experts_repackable)
        if w.layout != LAYOUT_STORED:
            matmul_tiled(w.data + r * layout_row_bytes(w.layout, w.cols), w.type, w.layout, it.r1 - it.r0,
                         w.cols, M.aq + first * M.arb, M.start[e + 1] - first,
                         M.y[it.mat] + first * M.ldy[it.mat] + it.r0, M.ldy[it.mat], 1)
        else:
            matmul_rows(w.data + r * w.row_bytes, w.type, it.r1 - it.r0, w.cols, M.aq + first * M.arb,
                        M.start[e + 1] - first, M.y[it.mat] + first * M.ldy[it.mat] + it.r0, M.ldy[it.mat], 1)


cdef void _experts(MoeJob* M, const WeightT* w0, float* y0, const WeightT* w1, float* y1, Py_ssize_t n_tok,
                   int nthreads) noexcept nogil:
    """y_m[grouped row] = expert's w_m @ aq[grouped row] for the one or two stacked matrices given (w1 NULL:
    one), every expert with tokens, as one job over (matrix, expert, row range) items."""
    cdef Py_ssize_t NE = M.hp.n_expert, e, m, r, rows, chunk, n_mats = 1 if w1 == NULL else 2
    cdef Py_ssize_t active = 0, per_thread
    M.w[0] = w0
    M.w[1] = w1
    M.y[0] = y0
    M.y[1] = y1
    M.ldy[0] = w0.rows // NE
    M.ldy[1] = w1.rows // NE if w1 != NULL else 0
    for e in range(NE):
        if M.start[e + 1] > M.start[e]:
            active += 1
    rows = w0.rows // NE
    # As matmul splits a matrix: about one range per thread when few tokens stream the weights (decode),
    # eight when many make it compute-bound.
    per_thread = 1 if n_tok <= 8 * active else 8
    chunk = SPLIT_ROWS * max(1, (active * n_mats * rows) // (SPLIT_ROWS * per_thread * nthreads))
    M.n_items = 0
    for e in range(NE):
        if M.start[e + 1] == M.start[e]:
            continue
        for m in range(n_mats):
            r = 0
            while r < rows:
                M.items[M.n_items].mat = <int32_t>m
                M.items[M.n_items].expert = <int32_t>e
                M.items[M.n_items].r0 = <int32_t>r
                M.items[M.n_items].r1 = <int32_t>min(rows, r + chunk)
                M.n_items += 1
                r += chunk
    parallel_for(_expert_task, M, M.n_items, 1, nthreads)


cdef void _gather(MoeJob* M, RowJob* rj, const WeightT* w, const float* xn, uint8_t* aq_tok,
                  Py_ssize_t n, int nthreads) noexcept nogil:
    """aq = the tokens' rows of xn quantized for w, in the grouped order (each token once per expert)."""
    cdef Py_ssize_t E = M.hp.n_embd, r, rows = n * M.hp.n_expert_used
    quant_rows(rj, w, xn, E, aq_tok, n, nthreads)
    M.arb = act_row_bytes(w.type, w.cols)
    for r in range(rows):
        memcpy(M.aq + r * M.arb, aq_tok + M.tok_of[r] * M.arb, M.arb)


cdef void _dense(RowJob* rj, const WeightT* w, const float* x, Py_ssize_t ldx, uint8_t* aq, Py_ssize_t n,
                 float* y, int nthreads) noexcept nogil:
    quant_rows(rj, w, x, ldx, aq, n, nthreads)
    weight_matmul(w, aq, n, y, w.rows, nthreads)


cdef void _shared(MoeJob* M, RowJob* rj, const LayerT* L, const float* xn, float* out, Py_ssize_t n,
                  int nthreads) noexcept nogil:
    """out[t] += sigmoid(gate_inp_shexp . xn[t]) * shared_expert(xn[t]) (qwen2moe)."""
    cdef Py_ssize_t E = M.hp.n_embd, FS = L.gate_shexp.rows, t, i
    cdef float s
    _dense(rj, &L.gate_shexp, xn, E, M.aq, n, M.g, nthreads)
    _dense(rj, &L.up_shexp, xn, E, M.aq, n, M.u, nthreads)
    act_rows(rj, M.g, M.u, FS, n, nthreads)
    _dense(rj, &L.down_shexp, M.g, FS, M.aq, n, M.o, nthreads)
    for t in range(n):
        s = 1.0 / (1.0 + expf(-dot_f32(xn + t * E, L.gate_inp_shexp, E)))
        for i in range(E):
            out[t * E + i] += s * M.o[t * E + i]


cdef void moe_experts(MoeJob* M, RowJob* rj, const LayerT* L, const float* rin, const float* xn,
                      uint8_t* aq_tok, float* out, Py_ssize_t n, int nthreads) noexcept nogil:
    cdef const HParams* hp = M.hp
    cdef Py_ssize_t E = hp.n_embd, K = hp.n_expert_used, FE = hp.n_ff_exp, t, j, i
    cdef float wj
    cdef const float* o
    # The router, then each token's experts and the grouped order.
    _dense(rj, &L.gate_inp, rin, E, aq_tok, n, M.logits, nthreads)
    _route(M, n)
    if L.down_exps_scale != NULL:  # each expert's output scaled (Gemma 4's per_expert_scale)
        for j in range(n * K):
            M.wsel[j] *= L.down_exps_scale[M.sel[j]]
    if L.gate_up_exps.rows:
        # gate and up stacked per expert ([2 * FE] rows each): one product, then split.
        _gather(M, rj, &L.gate_up_exps, xn, aq_tok, n, nthreads)
        _experts(M, &L.gate_up_exps, M.gu, NULL, NULL, n * K, nthreads)
        for i in range(n * K):
            memcpy(M.g + i * FE, M.gu + i * 2 * FE, FE * sizeof(float))
            memcpy(M.u + i * FE, M.gu + i * 2 * FE + FE, FE * sizeof(float))
    else:
        # gate and up of every chosen expert (one job when both take the same activation format).
        _gather(M, rj, &L.gate_exps, xn, aq_tok, n, nthreads)
        if act_format(L.up_exps.type) == act_format(L.gate_exps.type):
            _experts(M, &L.gate_exps, M.g, &L.up_exps, M.u, n * K, nthreads)
        else:
            _experts(M, &L.gate_exps, M.g, NULL, NULL, n * K, nthreads)
            _gather(M, rj, &L.up_exps, xn, aq_tok, n, nthreads)
            _experts(M, &L.up_exps, M.u, NULL, NULL, n * K, nthreads)
    act_rows(rj, M.g, M.u, FE, n * K, nthreads)
    # down, from the activated rows in the grouped order.
    quant_rows(rj, &L.down_exps, M.g, FE, M.aq, n * K, nthreads)
    M.arb = act_row_bytes(L.down_exps.type, FE)
    _experts(M, &L.down_exps, M.o, NULL, NULL, n * K, nthreads)
    # Each token's experts, weighted, summed best first.
    for t in range(n):
        for j in range(K):
            wj = M.wsel[t * K + j]
            o = M.o + M.row_of[t * K + j] * E
            if j == 0:
                for i in range(E):
                    out[t * E + i] = wj * o[i]
            else:
                for i in range(E):
                    out[t * E + i] += wj * o[i]


cdef void moe_ffn(MoeJob* M, RowJob* rj, const LayerT* L, const float* xn, uint8_t* aq_tok, float* out,
                  Py_ssize_t n, int nthreads) noexcept nogil:
    moe_experts(M, rj, L, xn, xn, aq_tok, out, n, nthreads)
    if L.gate_shexp.rows:
        _shared(M, rj, L, xn, out, n, nthreads)


cdef class MoeSpace:
    """The buffers of moe_ffn for micro-batches of up to ubatch tokens."""

    def __init__(self, cfg, Py_ssize_t ubatch):
        cdef Py_ssize_t NE = cfg.n_expert, K = cfg.n_expert_used, E = cfg.n_embd
        cdef Py_ssize_t FE = cfg.n_ff_exp, FS = cfg.n_ff_shexp
        cdef Py_ssize_t rows = ubatch * K, widest = max(E, FE, FS)
        self._arrays = []
        self.job.logits = <float*> self._buf(ubatch * NE, np.float32)
        self.job.sel = <int32_t*> self._buf(rows, np.int32)
        self.job.wsel = <float*> self._buf(rows, np.float32)
        self.job.count = <int32_t*> self._buf(NE + 1, np.int32)
        self.job.start = <int32_t*> self._buf(NE + 1, np.int32)
        self.job.row_of = <int32_t*> self._buf(rows, np.int32)
        self.job.tok_of = <int32_t*> self._buf(rows, np.int32)
        # The float32 activation format is the widest (4 bytes a value).
        self.job.aq = <uint8_t*> self._buf(rows * max(act_row_bytes(0, widest), 4 * widest) + 64, np.uint8)
        self.job.g = <float*> self._buf(max(rows * FE, ubatch * FS), np.float32)
        self.job.u = <float*> self._buf(max(rows * FE, ubatch * FS), np.float32)
        self.job.o = <float*> self._buf(rows * E, np.float32)
        # Gemma 4 (dense_moe.pyx): gate and up stacked, and three rows of n_embd per token.
        dense_moe = "dense_moe" in cfg.layer_ffn
        # moe_ungated.pyx: b1 and b2 hold the latent rows (moe_latent_size <= n_embd, as config checks).
        latent = getattr(cfg, "moe_latent_size", 0) > 0
        self.job.gu = <float*> self._buf(2 * rows * FE if dense_moe else 1, np.float32)
        self.job.b1 = <float*> self._buf(ubatch * E if dense_moe or latent else 1, np.float32)
        self.job.b2 = <float*> self._buf(ubatch * E if dense_moe or latent else 1, np.float32)
        self.job.b3 = <float*> self._buf(ubatch * E if dense_moe else 1, np.float32)
        cdef Py_ssize_t per_expert = 2 * ((max(E, 2 * FE) + SPLIT_ROWS - 1) // SPLIT_ROWS)
        self.job.items = <ExpertItem*> self._buf(NE * per_expert * sizeof(ExpertItem), np.uint8)

    cdef void* _buf(self, Py_ssize_t n, dtype) except NULL:
        arr = np.zeros(max(n, 1), dtype)
        self._arrays.append(arr)
        cdef uint8_t[::1] b = arr.view(np.uint8)
        return &b[0]
