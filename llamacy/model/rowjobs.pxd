# The per-token work between the matrix products, as jobs on the thread team (see rowjobs.pyx).
from libc.stdint cimport uint8_t

from llamacy.model.layout cimport HParams, KVRows, LayerT, Scratch, WeightT

cdef enum:
    ROW_NORM = 0    # dst[t] = norm(src[t]) * w (+ b): the model's norm kind
    ROW_QUANT = 1   # aq[t] = src[t] quantized for weight type wtype
    ROW_ACT = 2     # dst[t] = act(dst[t]) * src[t]   (gate, up); ungated (relu2): dst[t] = act(dst[t])
    ROW_RESID = 3   # src[t] = post-norm(src[t]) with w (if any); dst[t] += src[t]; then, if w2, xn[t] = norm(dst[t]) * w2 (+ b2)
    ROW_QKV = 4     # q/k/v biases, q/k norms, RoPE, K/V rows into the cache


ctypedef struct RowJob:
    # Set once per batch.
    const HParams* hp
    const Scratch* s
    const KVRows* kv
    # Set by each call below.
    int kind
    const float* src
    float* dst
    const float* w
    const float* b        # ROW_NORM: LayerNorm bias (NULL: none)
    Py_ssize_t dim
    const float* w2       # ROW_RESID
    const float* b2
    float* xn
    int wtype             # ROW_QUANT
    Py_ssize_t ld_src
    uint8_t* aq
    Py_ssize_t rb
    const LayerT* L       # ROW_QKV


# Each runs its job over the n tokens of a micro-batch, on up to nthreads threads.
cdef void norm_rows(RowJob* job, const float* x, const float* w, const float* b, float* out, Py_ssize_t dim,
                    Py_ssize_t n, int nthreads) noexcept nogil
cdef void quant_rows(RowJob* job, const WeightT* w, const float* x, Py_ssize_t ldx, uint8_t* aq,
                     Py_ssize_t n, int nthreads) noexcept nogil
cdef void act_rows(RowJob* job, float* gate, const float* up, Py_ssize_t dim, Py_ssize_t n,
                   int nthreads) noexcept nogil
cdef void residual_rows(RowJob* job, float* x, float* o, const float* post_norm, const float* next_norm,
                        const float* next_norm_b, float* xn, Py_ssize_t dim, Py_ssize_t n,
                        int nthreads) noexcept nogil
cdef void qkv_rows(RowJob* job, const LayerT* L, Py_ssize_t n, int nthreads) noexcept nogil
