# The gated delta-net mixer (Qwen3-Next, Qwen3.5): see deltanet.pyx.
from llamacy.model.layout cimport LayerT, StateRows
from llamacy.model.products cimport Products

ctypedef struct DeltaJob:
    # Shapes (ModelConfig.ssm_*): key heads and their size, value heads and theirs, the convolution.
    Py_ssize_t n_k, dk, n_v, dv, d_conv, channels  # channels = 2 * n_k * dk + n_v * dv (q, k, v)
    bint k_tiled          # value head h reads key head h % n_k (else h // (n_v / n_k))
    float eps             # the gated norm's epsilon (rms_eps)
    # The layer and micro-batch in flight (set per call).
    const LayerT* L
    const StateRows* sr
    Py_ssize_t n
    # Activations [ubatch, width].
    float* qkv            # projected q, k, v: the convolution's inputs [channels]
    float* cv             # the convolution's outputs after SiLU, q and k L2-normed [channels]
    float* z              # the output gate [n_v * dv]
    float* beta           # sigmoid(b) [n_v]
    float* g              # the log decay softplus(a + dt) * A [n_v]; raw b/a first [2 * n_v]
    float* y              # the heads' gated-normed outputs [n_v * dv], ssm_out's input
    float* tmp            # a legacy ssm_in's fused [q, k, v, z] per key head [channels + n_v * dv]


cdef class DeltaSpace:
    cdef DeltaJob job
    cdef list _arrays

    cdef float* _floats(self, Py_ssize_t n) except NULL


# out[t] = the delta-net mixer of token t's normed input xn[t] (row stride n_embd) for the micro-batch's n
# tokens, reading and advancing each token's sequence state through sr (layout.pxd's StateRows).
cdef void deltanet_mixer(Products* pr, DeltaJob* j, const LayerT* L, const StateRows* sr, const float* xn,
                         Py_ssize_t n_embd, float* out, Py_ssize_t n, int nthreads) noexcept nogil
