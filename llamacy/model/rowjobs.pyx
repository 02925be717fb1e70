# cython: language_level=3
"""The per-token work between the matrix products (norms, RoPE, residuals, activation quantization) as one
job type on the thread team: rows are independent, so a prompt's tokens split over the threads like the
matmul rows do. (A single decoded token runs inline: parallel_for does not split one item.)
"""

from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy

from llamacy.kernels.ops cimport add_inplace, gelu_mul, rmsnorm_heads, rope, silu_mul, store_kv_row
from llamacy.kernels.parallel cimport parallel_for
from llamacy.kernels.quant cimport act_row_bytes, quantize_act_row
from llamacy.model.layout cimport (ACT_GELU, ACT_RELU2, HParams, KVRows, LayerT, Scratch, WeightT, kv_offset,
                                   kv_slot)
from llamacy.model.norms cimport norm_row

# Tokens per claim: about four claims per thread, at least ROW_MIN_TOKENS tokens each, so that a few
# decoded tokens (a server step) stay on one thread unless splitting them pays for the hand-off.
cdef enum:
    ROW_MIN_TOKENS = 4


cdef void _qkv_row(const RowJob* j, Py_ssize_t t) noexcept nogil:
    cdef const HParams* hp = j.hp
    cdef const LayerT* L = j.L
    cdef const KVRows* kv = j.kv
    # The layer's own shapes (Gemma 4's sliding and full layers differ).
    cdef Py_ssize_t HD = L.head_dim, NKV = L.n_head_kv, QW = hp.n_head * HD, KVW = NKV * HD, h, off
    cdef float* q = j.s.q + t * QW
    cdef float* k = j.s.k + t * KVW
    cdef float* v = j.s.v + t * KVW
    cdef const float* cs = j.s.cs + t * L.n_rot
    cdef const float* qg
    if L.attn_gate:  # q of each head out of the projection's [q_h, gate_h] pairs; the gates stay in s.qg
        qg = j.s.qg + t * 2 * QW
        for h in range(hp.n_head):
            memcpy(q + h * HD, qg + 2 * h * HD, HD * sizeof(float))
    if L.kv_shared:  # K/V rows are an earlier layer's: only the query
        if L.q_norm != NULL:
            rmsnorm_heads(q, L.q_norm, hp.n_head, HD, hp.rms_eps)
        rope(q, hp.n_head, HD, L.n_rot, cs, hp.rope_mode)
        return
    if L.wv.rows == 0:  # no V projection: V is K as projected (before its norm and RoPE)
        memcpy(v, k, KVW * sizeof(float))
    if L.bq != NULL:
        add_inplace(q, L.bq, QW)
        add_inplace(k, L.bk, KVW)
        add_inplace(v, L.bv, KVW)
    if L.q_norm != NULL:
        rmsnorm_heads(q, L.q_norm, hp.n_head, HD, hp.rms_eps)
        rmsnorm_heads(k, L.k_norm, NKV, HD, hp.rms_eps)
    if L.v_norm:
        rmsnorm_heads(v, NULL, NKV, HD, hp.rms_eps)
    rope(q, hp.n_head, HD, L.n_rot, cs, hp.rope_mode)
    rope(k, NKV, HD, L.n_rot, cs, hp.rope_mode)
    # Tokens of a batch write distinct rows (their own position of their own sequence); a ring keeps
    # each row twice (layout.pxd's KVRows).
    cdef Py_ssize_t slot = kv_slot(kv, kv.pos[t])
    for h in range(NKV):
        off = kv_offset(kv, t, h, slot)
        store_kv_row(kv.kl + off, k + h * HD, HD, kv.fmt)
        store_kv_row(kv.vl + off, v + h * HD, HD, kv.fmt)
        if kv.ring:
            off = kv_offset(kv, t, h, slot + kv.ring)
            store_kv_row(kv.kl + off, k + h * HD, HD, kv.fmt)
            store_kv_row(kv.vl + off, v + h * HD, HD, kv.fmt)


cdef inline void _relu2(float* x, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        x[i] = x[i] * x[i] if x[i] > 0.0 else 0.0


cdef void _rows_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    cdef RowJob* j = <RowJob*> ctx
    cdef Py_ssize_t t, D = j.dim
    cdef float eps = j.hp.rms_eps
    for t in range(begin, end):
        if j.kind == ROW_NORM:
            norm_row(j.hp.norm, j.src + t * D, j.w, j.b, j.dst + t * D, D, eps)
        elif j.kind == ROW_QUANT:
            quantize_act_row(j.wtype, j.src + t * j.ld_src, j.aq + t * j.rb, D)
        elif j.kind == ROW_ACT:
            if j.hp.act == ACT_RELU2:  # ungated: up only
                _relu2(j.dst + t * D, D)
            elif j.hp.act == ACT_GELU:
                gelu_mul(j.dst + t * D, j.src + t * D, D)
            else:
                silu_mul(j.dst + t * D, j.src + t * D, D)
        elif j.kind == ROW_RESID:
            if j.w != NULL:
                norm_row(j.hp.norm, j.src + t * D, j.w, NULL, <float*>(j.src + t * D), D, eps)
            add_inplace(j.dst + t * D, j.src + t * D, D)
            if j.w2 != NULL:
                norm_row(j.hp.norm, j.dst + t * D, j.w2, j.b2, j.xn + t * D, D, eps)
        else:
            _qkv_row(j, t)


cdef inline void _run(RowJob* job, int kind, const float* src, float* dst, const float* w, Py_ssize_t dim,
                      Py_ssize_t n, int nthreads) noexcept nogil:
    job.kind = kind
    job.src = src
    job.dst = dst
    job.w = w
    if kind != ROW_NORM:
        job.b = NULL
    job.dim = dim
    parallel_for(_rows_task, job, n, max(<Py_ssize_t>ROW_MIN_TOKENS, n // (4 * nthreads)), nthreads)


cdef void norm_rows(RowJob* job, const float* x, const float* w, const float* b, float* out, Py_ssize_t dim,
                    Py_ssize_t n, int nthreads) noexcept nogil:
    job.b = b
    _run(job, ROW_NORM, x, out, w, dim, n, nthreads)


cdef void quant_rows(RowJob* job, const WeightT* w, const float* x, Py_ssize_t ldx, uint8_t* aq,
                     Py_ssize_t n, int nthreads) noexcept nogil:
    job.wtype = w.type
    job.ld_src = ldx
    job.aq = aq
    job.rb = act_row_bytes(w.type, w.cols)
    _run(job, ROW_QUANT, x, NULL, NULL, w.cols, n, nthreads)


cdef void act_rows(RowJob* job, float* gate, const float* up, Py_ssize_t dim, Py_ssize_t n,
                   int nthreads) noexcept nogil:
    _run(job, ROW_ACT, up, gate, NULL, dim, n, nthreads)


cdef void residual_rows(RowJob* job, float* x, float* o, const float* post_norm, const float* next_norm,
                        const float* next_norm_b, float* xn, Py_ssize_t dim, Py_ssize_t n,
                        int nthreads) noexcept nogil:
    job.w2 = next_norm
    job.b2 = next_norm_b
    job.xn = xn
    _run(job, ROW_RESID, o, x, post_norm, dim, n, nthreads)


cdef void qkv_rows(RowJob* job, const LayerT* L, Py_ssize_t n, int nthreads) noexcept nogil:
    job.L = L
    _run(job, ROW_QKV, NULL, NULL, NULL, 0, n, nthreads)
