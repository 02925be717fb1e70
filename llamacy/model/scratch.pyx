# cython: language_level=3
"""The activations of one micro-batch: allocated once per model, sized by the widest layer."""

from libc.stdint cimport uint8_t

from llamacy.kernels.ops cimport ATT_BLOCK_MAX
from llamacy.kernels.quant cimport act_row_bytes

import numpy as np


cdef class ScratchSpace:
    def __init__(self, Py_ssize_t n_embd, Py_ssize_t qw, Py_ssize_t kvw, Py_ssize_t group, Py_ssize_t n_ff,
                 Py_ssize_t n_rot, Py_ssize_t ubatch, Py_ssize_t n_ctx_max, int threads_max, bint qgate=False):
        """The widest layer's widths (ModelConfig.widest): q row qw, K/V row kvw, query heads per KV head
        group, feed-forward n_ff, rotary dimensions n_rot; qgate: attention layers project q and an
        output gate together (ModelConfig.attn_gate), into s.qg."""
        cdef Py_ssize_t n = ubatch
        cdef Py_ssize_t widest = max(n_embd, qw, n_ff)
        # The float32 activation format is the widest (4 bytes a value); quantized ones are smaller.
        cdef Py_ssize_t aq_row = max(act_row_bytes(0, widest), 4 * widest)
        self.ubatch = ubatch
        self.n_ctx_max = n_ctx_max
        self.threads_max = max(1, threads_max)
        self._arrays = []
        self.s.x = self._floats(n * n_embd)
        self.s.xn = self._floats(n * max(n_embd, qw))
        self.s.q = self._floats(n * qw)
        self.s.k = self._floats(n * kvw)
        self.s.v = self._floats(n * kvw)
        self.s.att = self._floats(n * qw)
        self.s.o = self._floats(n * n_embd)
        self.s.g = self._floats(n * n_ff)
        self.s.u = self._floats(n * n_ff)
        self.s.cs = self._floats(n * max(n_rot, 2))
        self.s.qg = self._floats(n * 2 * qw if qgate else 1)
        # Per thread, a row of n_ctx scores for each query head of a KV group, for each token of a prompt's
        # block (attention.pyx's job items). Pages never written cost nothing (np.zeros maps them lazily).
        self.s.scores = self._floats(self.threads_max * ATT_BLOCK_MAX * max(1, group) * n_ctx_max)
        aq = np.zeros(n * aq_row + 64, np.uint8)
        self._arrays.append(aq)
        cdef uint8_t[::1] b = aq
        self.s.aq = &b[0]

    cdef float* _floats(self, Py_ssize_t n) except NULL:
        arr = np.zeros(n, np.float32)
        self._arrays.append(arr)
        cdef float[::1] f = arr
        return &f[0]
