# Attention over the KV cache for a micro-batch, and the prefetch that readies the cache for it.
from llamacy.model.layout cimport HParams, KVRows, LayerT, Scratch
from llamacy.model.products cimport Products

ctypedef struct AttnJob:
    # Set once per batch.
    const HParams* hp
    const Scratch* s      # reads s.q, writes s.att; s.scores: [threads, ATT_BLOCK_MAX * group, n_ctx]
    const KVRows* kv
    Py_ssize_t n_ctx      # the scores' row stride (at least the highest slot + 1)
    float rope_base       # what s.cs was last built for (reset per micro-batch)
    float rope_freq_scale
    Py_ssize_t rope_n_rot
    const float* rope_freqs
    # Set by attend_rows.
    Py_ssize_t window     # this layer's sliding window (0 = none)
    Py_ssize_t group      # query heads per KV head
    Py_ssize_t parts      # job items per KV group of a token (1: the whole group)
    Py_ssize_t n_tok      # the micro-batch's tokens
    Py_ssize_t n_items    # n * n_head_kv * parts (a prompt: blocks of ATT_BLOCK_MAX tokens * n_head_kv)
    bint stream           # a decode-sized batch: the cached rows come from memory (ops.attend_group)


# Every (token, query head) pair of the micro-batch attends, a KV group at a time, on up to nthreads threads.
cdef void attend_rows(AttnJob* job, Py_ssize_t window, Py_ssize_t n, int nthreads) noexcept nogil
# For a decode-sized batch, request the cached rows it will attend over into L2 (see attention.pyx).
cdef void warm_kv(const KVRows* kv, Py_ssize_t n, Py_ssize_t n_head_kv, Py_ssize_t window) noexcept nogil
# s.o[t] = the attention mixer of s.xn[t] for the micro-batch's n tokens (q/k/v, RoPE, memory, attention,
# output product). The caller points job.kv at this layer's memory first.
cdef void attention_mixer(Products* pr, AttnJob* aj, const LayerT* L, const float* rope_freqs, Py_ssize_t n,
                          int nthreads) noexcept nogil
