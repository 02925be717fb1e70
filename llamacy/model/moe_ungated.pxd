# Nemotron-H's mixture of experts (see moe_ungated.pyx).
from libc.stdint cimport uint8_t

from llamacy.model.layout cimport LayerT
from llamacy.model.moe cimport MoeJob
from llamacy.model.rowjobs cimport RowJob


# out[t] = the mixture (and its shared expert) of token t's normed input xn[t] (n tokens, stride n_embd);
# aq_tok: scratch for n quantized rows of n_embd values.
cdef void moe_ungated_ffn(MoeJob* M, RowJob* rj, const LayerT* L, const float* xn, uint8_t* aq_tok,
                          float* out, Py_ssize_t n, int nthreads) noexcept nogil
