# The mixture-of-experts feed-forward block (see moe.pyx).
from libc.stdint cimport int32_t, uint8_t

from llamacy.model.layout cimport HParams, LayerT, WeightT
from llamacy.model.rowjobs cimport RowJob


# One (expert, row range) of one stacked matrix: a work item of the expert products.
ctypedef struct ExpertItem:
    int32_t mat          # index into MoeJob.w / y
    int32_t expert
    int32_t r0, r1       # rows of the expert's matrix


ctypedef struct MoeJob:
    const HParams* hp
    # The batch's routing, rebuilt each layer.
    float* logits        # [ubatch, n_expert] router logits, then probabilities
    int32_t* sel         # [ubatch, k] chosen experts of each token, best first
    float* wsel          # [ubatch, k] their weights
    int32_t* count       # [n_expert] tokens routed to each expert
    int32_t* start       # [n_expert + 1] first row of each expert's tokens in the grouped order
    int32_t* row_of      # [ubatch * k] token slot t * k + j -> its row in the grouped order
    int32_t* tok_of      # [ubatch * k] grouped row -> token
    # Activations in the grouped order.
    uint8_t* aq          # quantized rows [ubatch * k, widest act row]
    float* g             # [max(ubatch * k * n_ff_exp, ubatch * n_ff_shexp)]
    float* u
    float* o             # [ubatch * k, n_embd]
    float* gu            # [ubatch * k, 2 * n_ff_exp]: gate and up from one stacked tensor (gate_up_exps)
    float* b1            # [ubatch, n_embd] each: dense_moe.pyx's rows
    float* b2
    float* b3
    # The expert products in flight: up to two matrices (gate and up) read the same activation rows.
    ExpertItem* items
    Py_ssize_t n_items
    const WeightT* w[2]
    float* y[2]
    Py_ssize_t ldy[2]
    Py_ssize_t arb       # bytes of one activation row in aq


# out[t] = the mixture-of-experts block of token t's normed input xn[t] (n tokens, row stride n_embd):
# the router, top-k, the chosen experts weighted (and the shared expert, if the layer has one).
# aq_tok: scratch for n quantized rows of n_embd values.
cdef void moe_ffn(MoeJob* M, RowJob* rj, const LayerT* L, const float* xn, uint8_t* aq_tok, float* out,
                  Py_ssize_t n, int nthreads) noexcept nogil
# The routed experts alone: the router reads rin[t], the experts xn[t] (Gemma 4 feeds them different rows).
cdef void moe_experts(MoeJob* M, RowJob* rj, const LayerT* L, const float* rin, const float* xn,
                      uint8_t* aq_tok, float* out, Py_ssize_t n, int nthreads) noexcept nogil
# The pieces moe_ungated.pyx shares: y_m = the stacked matrices' experts over the grouped rows in aq (arb bytes
# each; w1 NULL: one matrix), and a dense product of n rows quantized into aq.
cdef void _experts(MoeJob* M, const WeightT* w0, float* y0, const WeightT* w1, float* y1, Py_ssize_t n_tok,
                   int nthreads) noexcept nogil
# Tokens grouped by their chosen experts (M.sel, n tokens): M.start / row_of / tok_of.
cdef void group_by_expert(MoeJob* M, Py_ssize_t n) noexcept nogil
cdef void _dense(RowJob* rj, const WeightT* w, const float* x, Py_ssize_t ldx, uint8_t* aq, Py_ssize_t n,
                 float* y, int nthreads) noexcept nogil


cdef class MoeSpace:
    cdef MoeJob job
    cdef list _arrays

    cdef void* _buf(self, Py_ssize_t n, dtype) except NULL
