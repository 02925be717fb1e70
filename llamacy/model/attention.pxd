# Attention over the KV cache for a micro-batch, and the prefetch that readies the cache for it.
from llamacy.model.layout cimport HParams, KVRows, Scratch

ctypedef struct AttnJob:
    # Set once per batch.
    const HParams* hp
    const Scratch* s      # reads s.q, writes s.att; s.scores: per thread [threads, group, n_ctx]
    const KVRows* kv
    Py_ssize_t n_ctx
    # Set by attend_rows.
    Py_ssize_t window     # this layer's sliding window (0 = none)
    Py_ssize_t group      # query heads per KV head
    Py_ssize_t parts      # job items per KV group of a token (1: the whole group)
    Py_ssize_t n_items    # n * n_head_kv * parts


# Every (token, query head) pair of the micro-batch attends, a KV group at a time, on up to nthreads threads.
cdef void attend_rows(AttnJob* job, Py_ssize_t window, Py_ssize_t n, int nthreads) noexcept nogil
# For a decode-sized batch, request the cached rows it will attend over into L2 (see attention.pyx).
cdef void warm_kv(const KVRows* kv, Py_ssize_t n, Py_ssize_t n_head_kv, Py_ssize_t window) noexcept nogil
