# The scalar dot products (vecdot.pyx): (weight row, activation row, n values), traits.pyx's vec_dot.
from llamacy.kernels.blocks cimport fblock, k23block, k45block, lblock

cdef float vd_float(const fblock* w, const void* vx, Py_ssize_t cols) noexcept nogil
cdef float vd_legacy(const lblock* w, const void* vx, Py_ssize_t cols) noexcept nogil
cdef float vd_k45(const k45block* w, const void* vx, Py_ssize_t cols) noexcept nogil
cdef float vd_k23(const k23block* w, const void* vx, Py_ssize_t cols) noexcept nogil
cdef float vd_q6_K(const void* vw, const void* vx, Py_ssize_t cols) noexcept nogil
