# Row dequantization (the `to_float` column of traits.pyx): stored blocks -> floats, generic C.
#
# Bit-exact with gguf.quants.dequantize (numpy float32: products and sums rounded separately, hence
# lc_no_contract where a product feeds an add). Every function takes (src, dst, n): n values, a whole
# number of blocks.
from libc.stdint cimport int8_t, uint8_t, uint16_t, uint32_t
from libc.string cimport memcpy

from llamacy.kernels.blocks cimport *
from llamacy.kernels.simd cimport fp16, lc_no_contract
from llamacy.kernels.values cimport fvalue, k23value, k45value, lvalue, q3k_scale, scale_min_k4


cdef void deq_float(const fblock* src, float* y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t j
    if fblock is float:
        memcpy(y, src, n * sizeof(float))
    else:
        for j in range(n):
            y[j] = fvalue(src + j)


cdef void deq_legacy(const lblock* b, float* y, Py_ssize_t nvals) noexcept nogil:
    cdef Py_ssize_t i
    cdef int j
    cdef float d, m
    for i in range(nvals // 32):
        d = fp16(b[i].d)
        if lblock is block_q4_1 or lblock is block_q5_1:
            m = fp16(b[i].m)
            for j in range(32):
                y[j] = lc_no_contract(d * <float>lvalue(b + i, j)) + m
        else:
            for j in range(32):
                y[j] = d * <float>lvalue(b + i, j)
        y += 32


cdef void deq_k23(const k23block* b, float* y, Py_ssize_t nvals) noexcept nogil:
    cdef Py_ssize_t i
    cdef int n, k, l, s
    cdef float d, dmin, dl, ml
    for i in range(nvals // QK_K):
        d = fp16(b[i].d)
        if k23block is block_q2_K:
            dmin = fp16(b[i].dmin)
        for n in range(2):  # two halves of 128 values, 32 bytes of qs each
            for k in range(4):  # 2-bit fields at shift 2k: 32 values each, two groups of 16
                for s in range(2):
                    if k23block is block_q2_K:
                        dl = d * <float>(b[i].scales[8 * n + 2 * k + s] & 0xF)
                        ml = dmin * <float>(b[i].scales[8 * n + 2 * k + s] >> 4)
                        for l in range(16 * s, 16 * s + 16):
                            y[l] = lc_no_contract(dl * <float>k23value(b + i, n, k, l)) - ml
                    else:
                        dl = d * <float>q3k_scale(b[i].scales, 8 * n + 2 * k + s)
                        for l in range(16 * s, 16 * s + 16):
                            y[l] = dl * <float>k23value(b + i, n, k, l)
                y += 32


cdef void deq_k45(const k45block* b, float* y, Py_ssize_t nvals) noexcept nogil:
    cdef Py_ssize_t i
    cdef int s, l
    cdef float d, dmin, ds, ms
    cdef uint8_t sc, m
    for i in range(nvals // QK_K):
        d = fp16(b[i].d)
        dmin = fp16(b[i].dmin)
        for s in range(8):
            scale_min_k4(s, b[i].scales, &sc, &m)
            ds = d * <float>sc
            ms = dmin * <float>m
            for l in range(32):
                y[l] = lc_no_contract(ds * <float>k45value(b + i, s, l)) - ms
            y += 32


cdef void deq_q6_K(const void* src, float* y, Py_ssize_t nvals) noexcept nogil:
    cdef const block_q6_K* b = <const block_q6_K*>src
    cdef Py_ssize_t nb = nvals // QK_K
    cdef Py_ssize_t i, n, l, s
    cdef float d
    cdef const uint8_t* ql
    cdef const uint8_t* qh
    cdef const int8_t* sc
    for i in range(nb):
        d = fp16(b[i].d)
        for n in range(2):  # halves of 128 values
            ql = b[i].ql + 64 * n
            qh = b[i].qh + 32 * n
            sc = b[i].scales + 8 * n
            for l in range(32):
                s = l // 16
                y[l] = (d * <float>sc[s]) * <float>(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32)
                y[l + 32] = (d * <float>sc[s + 2]) * <float>(
                    ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32)
                y[l + 64] = (d * <float>sc[s + 4]) * <float>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32)
                y[l + 96] = (d * <float>sc[s + 6]) * <float>(
                    ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32)
            y += 128
