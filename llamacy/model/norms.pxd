# The norms a layer applies to a row: RMSNorm (kernels/ops) or LayerNorm with bias (norms.pyx).
from llamacy.kernels.ops cimport rmsnorm
from llamacy.model.layout cimport NORM_LAYER

cdef void layernorm(const float* x, const float* w, const float* b, float* out, Py_ssize_t n,
                    float eps) noexcept nogil


cdef inline void norm_row(int kind, const float* x, const float* w, const float* b, float* out, Py_ssize_t n,
                          float eps) noexcept nogil:
    """out = norm(x) * w (+ b): the model's norm kind. out may be x."""
    if kind == NORM_LAYER:
        layernorm(x, w, b, out, n, eps)
    else:
        rmsnorm(x, w, out, n, eps)
