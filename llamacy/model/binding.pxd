from llamacy.model.layout cimport LayerT, WeightT


cdef class BoundWeights:
    cdef LayerT* layers
    cdef Py_ssize_t n_layer
    cdef WeightT tok_embd
    cdef WeightT output
    cdef const float* output_norm
    cdef const float* output_norm_b  # NULL unless the final norm is a LayerNorm with bias
    cdef const float* rope_freqs     # NULL when the model has none
    cdef list _keep                  # the Python objects whose buffers the pointers above point into

    cdef WeightT _matrix(self, object m) except *
    cdef const float* _vector(self, object v) except? NULL
    cdef void _check_layer(self, Py_ssize_t i, const LayerT* L) except *
