# cython: language_level=3
"""The k largest entries of a float32 row in the sampler's canonical order (see topk.h)."""

from libc.stdint cimport int64_t

import numpy as np

cdef extern from "topk.h" nogil:
    Py_ssize_t lc_topk(const float* x, Py_ssize_t n, Py_ssize_t k, int64_t* ids, float* vals)

# Above this k the buffer's insertion sort costs more than numpy's partition; the sampler uses numpy there.
MAX_K = 256


def top_k(const float[::1] x, Py_ssize_t k):
    """(ids int64, values float32) of the min(k, len(x)) largest entries of x: value descending, then id
    ascending (so among entries equal to the k-th value the lowest ids are kept). None if x holds a NaN.
    1 <= k <= MAX_K."""
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k must be in [1, {MAX_K}], got {k}")
    ids = np.empty(k, dtype=np.int64)
    vals = np.empty(k, dtype=np.float32)
    cdef int64_t[::1] iv = ids
    cdef float[::1] vv = vals
    cdef Py_ssize_t n = x.shape[0], got
    if n == 0:
        return ids[:0], vals[:0]
    with nogil:
        got = lc_topk(&x[0], n, k, &iv[0], &vv[0])
    if got < 0:
        return None
    return ids[:got], vals[:got]
