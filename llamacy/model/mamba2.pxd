# The Mamba2 mixer of Nemotron-H (see mamba2.pyx).

from llamacy.model.layout cimport HParams, LayerT, StateRows
from llamacy.model.products cimport Products


ctypedef struct Mamba2Job:
    const HParams* hp
    const LayerT* L
    const StateRows* sr
    Py_ssize_t n          # tokens of the micro-batch in flight
    float* zxbcdt         # [ubatch, d_in_proj]: the in-projection (z, xBC, dt), z later gated in place
    float* xbc            # [ubatch, conv channels]: xBC after the convolution and SiLU
    float* y              # [ubatch, d_inner]: the scan's output


# out[t] = the Mamba2 mixer of the normed rows xn[t] (n tokens, row stride n_embd), each token continuing
# its sequence's state (sr: the layer's states, bound by the loop).
cdef void mamba2_mixer(Products* pr, Mamba2Job* job, const LayerT* L, const StateRows* sr, const float* xn,
                       float* out, Py_ssize_t n, int nthreads) noexcept nogil


cdef class Mamba2Space:
    cdef Mamba2Job job
    cdef list _arrays

    cdef void* _buf(self, Py_ssize_t n, dtype) except NULL
