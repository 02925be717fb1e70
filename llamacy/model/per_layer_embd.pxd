# Per-layer embeddings (Gemma 4 E2B/E4B): see per_layer_embd.pyx.
from libc.stdint cimport int32_t

from llamacy.model.layout cimport LayerT, Scratch, WeightT
from llamacy.model.products cimport Products


cdef class PleSpace:
    cdef float* inp        # [ubatch, n_layer * P]: every layer's input of every token of the micro-batch
    cdef float* row        # [n_layer * P]: one token's row of the table, dequantized
    cdef float* g          # [ubatch, P]
    cdef Py_ssize_t P, n_layer, n_embd
    cdef float eps
    cdef list _arrays

    cdef float* _floats(self, Py_ssize_t n) except NULL

    # The micro-batch's per-layer inputs from its tokens and its scaled embeddings s.x.
    cdef void inputs(self, Products* pr, const WeightT* model_proj, const float* proj_norm,
                     const WeightT* table, const Scratch* s, const int32_t* tokens, Py_ssize_t n,
                     int nthreads) noexcept nogil
    # Layer l's block: s.x += post_norm(proj(gelu(inp_gate · s.x) * inp[l])).
    cdef void block(self, Products* pr, const LayerT* L, Py_ssize_t l, const Scratch* s, Py_ssize_t n,
                    int nthreads) noexcept nogil
