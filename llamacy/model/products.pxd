# The matrix products of the layer loop: activations quantized for the weight's format, then the kernels;
# with --profile, the time each kind of product takes. Shared by the block modules (attention, ffn, moe).
from llamacy.model.layout cimport WeightT
from llamacy.model.rowjobs cimport RowJob

# Where --profile attributes time inside the layer loop (forward.pyx's PROFILE_NAMES, in this order).
cdef enum:
    P_MM_QKV = 0
    P_MM_O = 1
    P_MM_UP = 2
    P_MM_DOWN = 3
    P_MM_OUT = 4
    P_ATTN = 5
    P_QUANT = 6
    P_ELEM = 7
    P_MOE = 8
    N_PROF = 9

ctypedef struct Products:
    RowJob* rj
    bint profiling
    double prof[N_PROF]
    double last_mark


# y[t * ldy + r] = w row r . aq row t (aq: n rows already quantized for w), in w's layout.
cdef void weight_matmul(const WeightT* w, const void* aq, Py_ssize_t n, float* y, Py_ssize_t ldy,
                        int nthreads) noexcept nogil
# Adds the time since the last mark to stage `kind` (when profiling).
cdef void lap(Products* p, int kind) noexcept nogil
cdef double now() noexcept nogil
# y[t, :] = w @ x[t, :] for t < n. last_fmt: the activation format the rows already sit in, quantized
# from the same x by the previous product (-1: none), kept up to date; NULL: always quantize.
cdef void product(Products* p, const WeightT* w, const float* x, Py_ssize_t ldx, Py_ssize_t n, float* y,
                  int* last_fmt, int nthreads, int kind) noexcept nogil
