# Gemma 4's feed-forward block: a dense gated FFN and a mixture of experts, summed (see dense_moe.pyx).
from llamacy.model.layout cimport LayerT, Scratch
from llamacy.model.moe cimport MoeJob
from llamacy.model.products cimport Products

# s.o[t] = the block of token t (s.x: the residual stream after attention; s.xn: its ffn_norm).
cdef void dense_moe_ffn(Products* pr, MoeJob* M, const LayerT* L, const Scratch* s, Py_ssize_t n_embd,
                        Py_ssize_t n, int nthreads) noexcept nogil
