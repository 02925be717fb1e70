# cython: language_level=3
"""The layer loop's matrix products (see products.pxd)."""

from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from llamacy.kernels.matmul cimport matmul, matmul_tiled
from llamacy.kernels.quant cimport act_format
from llamacy.kernels.traits cimport LAYOUT_STORED
from llamacy.model.rowjobs cimport quant_rows


cdef double now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef void weight_matmul(const WeightT* w, const void* aq, Py_ssize_t n, float* y, Py_ssize_t ldy,
                        int nthreads) noexcept nogil:
    if w.layout != LAYOUT_STORED:
        matmul_tiled(w.data, w.type, w.layout, w.rows, w.cols, aq, n, y, ldy, nthreads)
    else:
        matmul(w.data, w.type, w.rows, w.cols, aq, n, y, ldy, nthreads)


cdef void lap(Products* p, int kind) noexcept nogil:
    cdef double t
    if p.profiling:
        t = now()
        p.prof[kind] += t - p.last_mark
        p.last_mark = t


cdef void product(Products* p, const WeightT* w, const float* x, Py_ssize_t ldx, Py_ssize_t n, float* y,
                  int* last_fmt, int nthreads, int kind) noexcept nogil:
    cdef int fmt = act_format(w.type)
    lap(p, P_ELEM)
    if last_fmt == NULL or fmt != last_fmt[0]:
        quant_rows(p.rj, w, x, ldx, p.rj.s.aq, n, nthreads)
        if last_fmt != NULL:
            last_fmt[0] = fmt
        lap(p, P_QUANT)
    weight_matmul(w, p.rj.s.aq, n, y, w.rows, nthreads)
    lap(p, kind)
