# cython: language_level=3
"""Per-layer embeddings (Gemma 4 E2B/E4B; llama.cpp's gemma4 graph, Hugging Face's Gemma4TextModel).

Each token has, per layer, a small input of P values (embedding_length_per_layer_input):
    inp[l] = (rmsnorm(per_layer_model_proj · x / sqrt(n_embd)) * per_layer_proj_norm
              + per_layer_token_embd[token][l] * sqrt(P)) / sqrt(2)
where x is the token's scaled embedding; and each layer, after its feed-forward residual, adds
    post_norm(proj(gelu(inp_gate · x) * inp[l]))
to the residual stream. The table per_layer_token_embd ([vocab, n_layer * P], the largest tensor of E2B) is
read one row per token where it lies in the file's mapping: n_layer * P values of the token's type a token
(35 * 256 at q8_0 for E2B: 9.5 KB), never copied whole.
"""

from libc.math cimport sqrtf
from libc.stdint cimport int32_t

from llamacy.kernels.ops cimport add_inplace, gelu_mul, rmsnorm, scale_inplace
from llamacy.kernels.quant cimport dequantize_row
from llamacy.model.layout cimport LayerT, Scratch, WeightT
from llamacy.model.products cimport P_MM_DOWN, P_MM_UP, Products, product
from llamacy.model.rowjobs cimport residual_rows

import numpy as np


cdef class PleSpace:
    def __init__(self, cfg, Py_ssize_t ubatch):
        self.P = cfg.n_embd_per_layer
        self.n_layer = cfg.n_layer
        self.n_embd = cfg.n_embd
        self.eps = cfg.rms_eps
        self._arrays = []
        self.inp = self._floats(ubatch * self.n_layer * self.P)
        self.row = self._floats(self.n_layer * self.P)
        self.g = self._floats(ubatch * self.P)

    cdef float* _floats(self, Py_ssize_t n) except NULL:
        arr = np.zeros(max(n, 1), np.float32)
        self._arrays.append(arr)
        cdef float[::1] f = arr
        return &f[0]

    cdef void inputs(self, Products* pr, const WeightT* model_proj, const float* proj_norm,
                     const WeightT* table, const Scratch* s, const int32_t* tokens, Py_ssize_t n,
                     int nthreads) noexcept nogil:
        cdef Py_ssize_t LP = self.n_layer * self.P, t, l
        cdef float* inp
        product(pr, model_proj, s.x, self.n_embd, n, self.inp, NULL, nthreads, P_MM_UP)
        for t in range(n):
            inp = self.inp + t * LP
            scale_inplace(inp, 1.0 / sqrtf(<float>self.n_embd), LP)
            for l in range(self.n_layer):
                rmsnorm(inp + l * self.P, proj_norm, inp + l * self.P, self.P, self.eps)
            dequantize_row(table.type, table.data + tokens[t] * table.row_bytes,
                           self.row, LP)
            scale_inplace(self.row, sqrtf(<float>self.P), LP)
            add_inplace(inp, self.row, LP)
            scale_inplace(inp, 1.0 / sqrtf(2.0), LP)

    cdef void block(self, Products* pr, const LayerT* L, Py_ssize_t l, const Scratch* s, Py_ssize_t n,
                    int nthreads) noexcept nogil:
        cdef Py_ssize_t P = self.P, t
        product(pr, &L.inp_gate, s.x, self.n_embd, n, self.g, NULL, nthreads, P_MM_UP)
        for t in range(n):
            gelu_mul(self.g + t * P, self.inp + t * self.n_layer * P + l * P, P)
        product(pr, &L.proj, self.g, P, n, s.o, NULL, nthreads, P_MM_DOWN)
        residual_rows(pr.rj, s.x, s.o, L.pe_post_norm, NULL, NULL, NULL, self.n_embd, n, nthreads)
