from llamacy.model.layout cimport LayerT, WeightT


cdef class BoundWeights:
    cdef LayerT* layers
    cdef Py_ssize_t n_layer
    cdef WeightT tok_embd
    cdef WeightT output
    cdef const float* output_norm
    cdef const float* output_norm_b  # NULL unless the final norm is a LayerNorm with bias
    cdef const float* rope_freqs     # NULL when the model has none
    # Per-layer embeddings (rows 0 / NULL: none): the table [vocab, n_layer * P], the projection of the
    # embeddings [n_layer * P, n_embd], its norm [P].
    cdef WeightT pl_tok_embd
    cdef WeightT pl_model_proj
    cdef const float* pl_proj_norm
    # A multi-token-prediction block's input (rows 0 / NULL: none; mtp.py): eh_proj [n_embd, 2 n_embd] over
    # [enorm(token embedding); hnorm(the target's hidden state)].
    cdef WeightT nextn_eh_proj
    cdef const float* nextn_enorm
    cdef const float* nextn_hnorm
    cdef list _keep                  # the Python objects whose buffers the pointers above point into

    cdef WeightT _matrix(self, object m) except *
    cdef const float* _vector(self, object v) except? NULL
    cdef void _check_layer(self, Py_ssize_t i, const LayerT* L) except *
