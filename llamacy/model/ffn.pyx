# cython: language_level=3
"""The dense feed-forward blocks: gated (down(act(gate·x) * up·x): SwiGLU, GeGLU) and ungated
(down(act(up·x)): Nemotron's ReLU²). The mixture of experts is moe.pyx."""

from llamacy.kernels.ops cimport add_inplace
from llamacy.model.layout cimport FFN_GATED, LayerT, Scratch
from llamacy.model.products cimport P_MM_DOWN, P_MM_UP, Products, product
from llamacy.model.rowjobs cimport act_rows


cdef void dense_ffn(Products* p, const LayerT* L, const Scratch* s, Py_ssize_t n_embd, Py_ssize_t n,
                    int nthreads) noexcept nogil:
    cdef int fmt = -1  # gate and up read the same quantized rows
    cdef Py_ssize_t F = L.up.rows
    if L.ffn == FFN_GATED:
        product(p, &L.gate, s.xn, n_embd, n, s.g, &fmt, nthreads, P_MM_UP)
        product(p, &L.up, s.xn, n_embd, n, s.u, &fmt, nthreads, P_MM_UP)
        act_rows(p.rj, s.g, s.u, F, n, nthreads)
    else:
        product(p, &L.up, s.xn, n_embd, n, s.g, &fmt, nthreads, P_MM_UP)
        _add_bias(s.g, L.up_b, F, n)
        act_rows(p.rj, s.g, NULL, F, n, nthreads)
    product(p, &L.down, s.g, F, n, s.o, NULL, nthreads, P_MM_DOWN)
    _add_bias(s.o, L.down_b, n_embd, n)


cdef inline void _add_bias(float* y, const float* b, Py_ssize_t width, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t t
    if b != NULL:
        for t in range(n):
            add_inplace(y + t * width, b, width)
