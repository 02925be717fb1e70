from llamacy.model.layout cimport LayerT, Scratch
from llamacy.model.products cimport Products

# s.o[t] = the layer's dense feed-forward block of s.xn[t] (gated or ungated, per L.ffn), n tokens.
cdef void dense_ffn(Products* p, const LayerT* L, const Scratch* s, Py_ssize_t n_embd, Py_ssize_t n,
                    int nthreads) noexcept nogil
