# cython: language_level=3
"""Typed weight records (llamacy.model.weights) -> the C structs the layer loop reads.

Each LayerT field is read from the LayerWeights field of the same name, so a name that does not exist
fails at load (AttributeError) instead of leaving a NULL pointer behind.
"""

from libc.stdint cimport uint8_t
from libc.stdlib cimport calloc, free

from llamacy.kernels.quant cimport act_format


cdef class BoundWeights:
    """Pointers into a ModelWeights' buffers, valid while this object lives (it keeps the buffers)."""

    def __cinit__(self):
        self.layers = NULL

    def __dealloc__(self):
        if self.layers != NULL:
            free(self.layers)

    def __init__(self, weights):
        """weights: a llamacy.model.weights.ModelWeights, shapes already checked against the config."""
        self._keep = []
        self.tok_embd = self._matrix(weights.token_embd)
        self.output = self._matrix(weights.output)
        self.output_norm = self._vector(weights.output_norm)
        self.rope_freqs = self._vector(weights.rope_freqs)
        self.n_layer = len(weights.layers)
        self.layers = <LayerT*> calloc(max(self.n_layer, 1), sizeof(LayerT))
        if self.layers == NULL:
            raise MemoryError()
        cdef LayerT* L
        for i, d in enumerate(weights.layers):
            L = &self.layers[i]
            L.attn_norm = self._vector(d.attn_norm)
            L.wq = self._matrix(d.wq)
            L.wk = self._matrix(d.wk)
            L.wv = self._matrix(d.wv)
            L.wo = self._matrix(d.wo)
            L.bq = self._vector(d.bq)
            L.bk = self._vector(d.bk)
            L.bv = self._vector(d.bv)
            L.q_norm = self._vector(d.q_norm)
            L.k_norm = self._vector(d.k_norm)
            L.post_attn_norm = self._vector(d.post_attn_norm)
            L.ffn_norm = self._vector(d.ffn_norm)
            L.gate = self._matrix(d.gate)
            L.up = self._matrix(d.up)
            L.down = self._matrix(d.down)
            L.post_ffn_norm = self._vector(d.post_ffn_norm)
            L.gate_inp = self._matrix(d.gate_inp)
            L.gate_exps = self._matrix(d.gate_exps)
            L.up_exps = self._matrix(d.up_exps)
            L.down_exps = self._matrix(d.down_exps)
            L.gate_shexp = self._matrix(d.gate_shexp)
            L.up_shexp = self._matrix(d.up_shexp)
            L.down_shexp = self._matrix(d.down_shexp)
            L.gate_inp_shexp = self._vector(d.gate_inp_shexp)
            L.window = d.window
            L.rope_base = d.rope_base
            L.rope_freq_scale = d.rope_freq_scale

    cdef WeightT _matrix(self, object m) except *:
        cdef WeightT w
        if m is None:  # a matrix this layer does not have: rows 0
            w.data = NULL
            w.type = 0
            w.rows = 0
            w.cols = 0
            w.row_bytes = 0
            return w
        cdef const uint8_t[::1] mv = m.data
        if mv.shape[0] < m.rows * m.row_bytes:
            raise ValueError("weight buffer smaller than its rows")
        if act_format(m.type) < 0:
            raise ValueError(f"no kernel for GGML type {m.type}")
        self._keep.append(m.data)
        w.data = &mv[0]
        w.type = m.type
        w.rows = m.rows
        w.cols = m.cols
        w.row_bytes = m.row_bytes
        return w

    cdef const float* _vector(self, object v) except? NULL:
        if v is None:
            return NULL
        cdef const float[::1] mv = v
        self._keep.append(v)
        return &mv[0]
