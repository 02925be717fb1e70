# cython: language_level=3
"""The attention mixer: q/k/v products, RoPE, K/V rows into the layer's memory, attention of a micro-batch
(one job item per (token, KV group)) with the prefetches that keep it from waiting on memory, and the
output product."""

from libc.math cimport expf
from libc.stdint cimport int64_t

from llamacy.kernels.ops cimport ATT_BLOCK_MAX, add_inplace, attend_block, attend_group, rope_table
from llamacy.kernels.parallel cimport parallel_for
from llamacy.kernels.simd cimport lc_prefetch_span, lc_prefetch_span_l2
from llamacy.model.layout cimport KVRows, LayerT, Scratch, first_visible, kv_offset, kv_slot
from llamacy.model.products cimport P_ATTN, P_ELEM, P_MM_O, P_MM_QKV, Products, lap, product
from llamacy.model.rowjobs cimport qkv_rows

# Decoding reads each layer's cached K/V rows once per token, and the weights that stream through memory
# between two tokens evict them from every cache level: without help, attention waits on DRAM for short
# runs of rows (a few KB per head) that the hardware prefetchers barely start on. So at the top of each
# layer, the rows this batch will attend over are requested into L2, while the norm and the q/k/v
# products run. Prompt batches (more than KV_WARM_TOKENS tokens) reuse their rows from cache anyway.
cdef enum:
    KV_WARM_TOKENS = 16
    KV_WARM_BYTES = 786432  # at most this much per layer: L2 is 1 MB on the machines we measure

# The cached rows one KV group reads (its first ATTN_PF_BYTES of K and of V) are requested into L1 while
# the group before it computes: a group's q heads (one item, or its parts back to back) share the rows,
# so a group's compute is about as long as fetching the next group's rows (5 KB each of K and V at 40
# positions, f16). Without it decode attention waited on memory: 8 sequences at 40 positions, 2.1 ms a
# step where the arithmetic takes 0.4. Longer rows stream on with the hardware prefetchers.
cdef enum:
    ATTN_PF_BYTES = 8192


cdef void warm_kv(const KVRows* kv, Py_ssize_t n, Py_ssize_t n_head_kv, Py_ssize_t window) noexcept nogil:
    cdef Py_ssize_t t, h, p, first, nbytes, off
    cdef Py_ssize_t budget = KV_WARM_BYTES
    if n > KV_WARM_TOKENS:
        return
    for t in range(n):
        p = kv.pos[t]
        first = first_visible(p, window)
        nbytes = (p - first) * kv.row_bytes  # the rows before this token's own
        for h in range(n_head_kv):
            budget -= 2 * nbytes
            if budget < 0:
                return
            off = kv_offset(kv, t, h, kv_slot(kv, first))
            lc_prefetch_span_l2(kv.kl + off, nbytes)
            lc_prefetch_span_l2(kv.vl + off, nbytes)


cdef inline void _item_heads(const AttnJob* c, Py_ssize_t item, Py_ssize_t* t, Py_ssize_t* h0,
                             Py_ssize_t* h1) noexcept nogil:
    """Item -> token t and query heads h0..h1-1: part k of one KV group (G // parts heads, or one more)."""
    cdef Py_ssize_t per_token = c.kv.n_head_kv * c.parts, r = item % per_token
    cdef Py_ssize_t g0 = (r // c.parts) * c.group, k = r % c.parts
    t[0] = item // per_token
    h0[0] = g0 + k * c.group // c.parts
    h1[0] = g0 + (k + 1) * c.group // c.parts


cdef inline void _prefetch_group(const AttnJob* c, Py_ssize_t item) noexcept nogil:
    cdef const KVRows* kv = c.kv
    cdef Py_ssize_t t, h, h1, p
    _item_heads(c, item, &t, &h, &h1)
    p = kv.pos[t]
    cdef Py_ssize_t first = first_visible(p, c.window)
    cdef Py_ssize_t off = kv_offset(kv, t, h // c.group, kv_slot(kv, first))
    cdef Py_ssize_t nbytes = min(<Py_ssize_t>ATTN_PF_BYTES, (p - first + 1) * kv.row_bytes)
    lc_prefetch_span(kv.kl + off, nbytes)
    lc_prefetch_span(kv.vl + off, nbytes)


cdef inline bint _continues(const AttnJob* c, Py_ssize_t t, Py_ssize_t first) noexcept nogil:
    """Whether token t takes the next position of token t - 1's sequence with the same first visible one."""
    cdef const KVRows* kv = c.kv
    return (kv.seq[t] == kv.seq[t - 1] and kv.pos[t] == kv.pos[t - 1] + 1
            and first_visible(kv.pos[t], c.window) == first)


cdef void _attend_blocks_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    """A prompt's attention: items begin..end-1, each the heads of one KV group over a block of up to
    ATT_BLOCK_MAX tokens, in runs of consecutive positions of one sequence (ops.attend_block: each cached
    row widened once for the run)."""
    cdef AttnJob* c = <AttnJob*> ctx
    cdef const KVRows* kv = c.kv
    cdef Py_ssize_t NH = c.hp.n_head, HD = kv.head_dim, G = c.group, item, t, t1, r, h, p, first, slot, off
    cdef float* scores = c.s.scores + tid * ATT_BLOCK_MAX * G * c.n_ctx
    for item in range(begin, end):
        h = item % kv.n_head_kv
        t = item // kv.n_head_kv * ATT_BLOCK_MAX
        t1 = min(t + ATT_BLOCK_MAX, c.n_tok)
        while t < t1:
            p = kv.pos[t]
            first = first_visible(p, c.window)
            r = t + 1
            while r < t1 and _continues(c, r, first):
                r += 1
            slot = kv_slot(kv, first)
            off = kv_offset(kv, t, h, 0)
            attend_block(c.s.q + (t * NH + h * G) * HD, NH * HD, kv.kl + off, kv.vl + off, slot,
                         slot + p - first, r - t, HD, G, c.hp.attn_scale, 0.0, scores, c.n_ctx,
                         c.s.att + (t * NH + h * G) * HD, NH * HD, kv.fmt)
            t = r


cdef void _attend_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    """Attention for items begin..end-1 of a micro-batch: each some query heads of one KV group of a token."""
    cdef AttnJob* c = <AttnJob*> ctx
    cdef const KVRows* kv = c.kv
    cdef Py_ssize_t NH = c.hp.n_head, HD = kv.head_dim, item, t, h, h1, p, off, first, slot
    # Each thread's rows: one of n_ctx floats per head of an item (scratch.pyx sizes them for a whole group).
    cdef float* scores = c.s.scores + tid * c.group * c.n_ctx
    for item in range(begin, end):
        _item_heads(c, item, &t, &h, &h1)
        # Starting the last part of a KV group: request the next group's rows (the next item's).
        if h1 % c.group == 0 and item + 1 < c.n_items:
            _prefetch_group(c, item + 1)
        p = kv.pos[t]
        off = kv_offset(kv, t, h // c.group, 0)
        # The visible positions first..p as slots: the same run, shifted into the ring (a ring holds every
        # window as one contiguous run of slots), so the kernel computes exactly what it would over a
        # full cache. Softcap 0: no supported architecture caps attention logits.
        first = first_visible(p, c.window)
        slot = kv_slot(kv, first)
        attend_group(c.s.q + (t * NH + h) * HD, kv.kl + off, kv.vl + off, slot, slot + p - first, HD,
                     h1 - h, c.hp.attn_scale, 0.0, scores, c.n_ctx, c.s.att + (t * NH + h) * HD, kv.fmt,
                     c.stream)


cdef void attend_rows(AttnJob* job, Py_ssize_t window, Py_ssize_t n, int nthreads) noexcept nogil:
    job.window = window
    job.group = job.hp.n_head // job.kv.n_head_kv
    # A prompt's tokens read the rows the token before them read, from cache; a decode step's come from
    # memory (each sequence's own rows, read once).
    job.stream = n <= KV_WARM_TOKENS
    job.n_tok = n
    if not job.stream:
        # A prompt: items of ATT_BLOCK_MAX tokens, each row read once for a block's tokens and heads.
        job.n_items = (n + ATT_BLOCK_MAX - 1) // ATT_BLOCK_MAX * job.kv.n_head_kv
        parallel_for(_attend_blocks_task, job, job.n_items, max(1, job.n_items // (8 * nthreads)), nthreads)
        return
    # One item per (token, KV group): the group's heads read each cached row once. When that makes too few
    # items to keep the team busy (decoding one token: Gemma 3 270M has one group, SmolLM2 three), each
    # group splits into parts, as few as give every thread a share: items for all (a multiple of the
    # team, parts of equal size) or twice the team.
    cdef Py_ssize_t groups = n * job.kv.n_head_kv
    job.parts = 1
    while job.parts < job.group and groups * job.parts < 2 * nthreads and not (
            groups * job.parts % nthreads == 0 and job.group % job.parts == 0):
        job.parts += 1
    job.n_items = groups * job.parts
    # Chunks of several items: one claim per item would bounce the counter's cache line.
    parallel_for(_attend_task, job, job.n_items, max(1, job.n_items // (8 * nthreads)), nthreads)


cdef void _gate_rows(const Scratch* s, Py_ssize_t n_head, Py_ssize_t HD, Py_ssize_t n) noexcept nogil:
    """att[t, h] *= sigmoid(gate_h of token t's Q projection) (Qwen3-Next's gated attention)."""
    cdef Py_ssize_t t, h, i, QW = n_head * HD
    cdef float* a
    cdef const float* g
    for t in range(n):
        for h in range(n_head):
            a = s.att + t * QW + h * HD
            g = s.qg + t * 2 * QW + (2 * h + 1) * HD
            for i in range(HD):
                a[i] = a[i] / (1.0 + expf(-g[i]))


cdef void attention_mixer(Products* pr, AttnJob* aj, const LayerT* L, const float* rope_freqs, Py_ssize_t n,
                          int nthreads) noexcept nogil:
    """s.o[t] = the attention block of s.xn[t] for the micro-batch's n tokens; K/V rows into memory."""
    cdef const Scratch* s = aj.s
    cdef Py_ssize_t E = aj.hp.n_embd, R = L.n_rot, t
    cdef int fmt = -1  # q, k and v read the same quantized rows
    if not L.rope_freqs:
        rope_freqs = NULL
    # A gated layer's Q projection is [q_h, gate_h] per head: into s.qg, q split out per token (rowjobs).
    product(pr, &L.wq, s.xn, E, n, s.qg if L.attn_gate else s.q, &fmt, nthreads, P_MM_QKV)
    if not L.kv_shared:  # a shared-KV layer reads an earlier layer's rows
        product(pr, &L.wk, s.xn, E, n, s.k, &fmt, nthreads, P_MM_QKV)
        if L.wv.rows:  # else V = K (rowjobs.pyx)
            product(pr, &L.wv, s.xn, E, n, s.v, &fmt, nthreads, P_MM_QKV)
    # RoPE's cos/sin per token, rebuilt only when this layer's base, scale, dimensions or frequency factors
    # differ from the last built.
    if (L.rope_base != aj.rope_base or L.rope_freq_scale != aj.rope_freq_scale or R != aj.rope_n_rot
            or rope_freqs != aj.rope_freqs):
        aj.rope_base = L.rope_base
        aj.rope_freq_scale = L.rope_freq_scale
        aj.rope_n_rot = R
        aj.rope_freqs = rope_freqs
        for t in range(n):
            rope_table(s.cs + t * R, R, aj.kv.pos[t], L.rope_base, L.rope_freq_scale, rope_freqs)
    # Biases, q/k norms, RoPE; K/V rows into memory. Then every (token, head) pair attends.
    qkv_rows(pr.rj, L, n, nthreads)
    lap(pr, P_ELEM)
    attend_rows(aj, L.window, n, nthreads)
    lap(pr, P_ATTN)
    if L.attn_gate:
        _gate_rows(s, aj.hp.n_head, L.head_dim, n)
    product(pr, &L.wo, s.att, aj.hp.n_head * L.head_dim, n, s.o, NULL, nthreads, P_MM_O)
    if L.bo != NULL:
        for t in range(n):
            add_inplace(s.o + t * E, L.bo, E)
