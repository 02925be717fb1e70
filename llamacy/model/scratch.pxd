from llamacy.model.layout cimport Scratch


cdef class ScratchSpace:
    cdef Scratch s
    cdef readonly Py_ssize_t ubatch        # tokens a micro-batch may hold
    cdef readonly Py_ssize_t n_ctx_max     # the longest KV cache the attention scores fit
    cdef readonly int threads_max          # threads the per-thread score rows are sized for
    cdef list _arrays                      # the numpy arrays behind s

    cdef float* _floats(self, Py_ssize_t n) except NULL
