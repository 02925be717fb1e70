# cython: language_level=3
"""LayerNorm with bias (ggml_norm followed by the weight and bias): Nemotron's norm, and the norm of any
architecture whose recipe says "layer". RMSNorm lives with the kernels (kernels/ops.pyx)."""

from libc.math cimport sqrt


cdef void layernorm(const float* x, const float* w, const float* b, float* out, Py_ssize_t n,
                    float eps) noexcept nogil:
    # Mean and variance accumulated in double, as ggml_compute_forward_norm_f32 does (ggml_float): a
    # float sum over a few thousand values would lose digits the reference keeps.
    cdef double mean = 0.0, var = 0.0, d
    cdef Py_ssize_t i
    for i in range(n):
        mean += x[i]
    mean /= n
    for i in range(n):
        d = x[i] - mean
        var += d * d
    cdef float inv = <float>(1.0 / sqrt(var / n + eps))
    cdef float m = <float>mean
    for i in range(n):
        out[i] = (x[i] - m) * inv * (w[i] if w != NULL else 1.0) + (b[i] if b != NULL else 0.0)
