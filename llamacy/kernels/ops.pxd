# Element-wise and attention operations of the layer loop: the C-level surface forward.pyx cimports.

cdef enum:
    ROPE_NORM = 0   # rotate adjacent pairs (x[2i], x[2i+1]): llama as GGUF stores it (Q/K permuted)
    ROPE_NEOX = 2   # rotate halves (x[i], x[i + n_rot/2]): qwen2/3, gemma3

cdef void rmsnorm(const float* x, const float* w, float* out, Py_ssize_t n, float eps) noexcept nogil
cdef void rmsnorm_heads(float* x, const float* w, Py_ssize_t n_heads, Py_ssize_t head_dim,
                        float eps) noexcept nogil
cdef void rope_table(float* cs, Py_ssize_t n_rot, float pos, float base, float freq_scale,
                     const float* freq_factors) noexcept nogil
cdef void rope(float* x, Py_ssize_t n_heads, Py_ssize_t head_dim, Py_ssize_t n_rot,
               const float* cs, int mode) noexcept nogil
cdef void silu_mul(float* gate, const float* up, Py_ssize_t n) noexcept nogil
cdef void gelu_mul(float* gate, const float* up, Py_ssize_t n) noexcept nogil
cdef void add_inplace(float* x, const float* y, Py_ssize_t n) noexcept nogil
cdef void scale_inplace(float* x, float s, Py_ssize_t n) noexcept nogil
cdef float dot_f32(const float* a, const float* b, Py_ssize_t n) noexcept nogil
cdef void attend_group(const float* q, const void* K, const void* V, Py_ssize_t first, Py_ssize_t last,
                       Py_ssize_t head_dim, Py_ssize_t n_heads, float scale, float softcap, float* scores,
                       Py_ssize_t scores_stride, float* out, bint kv_f16) noexcept nogil
cdef void store_kv_row(void* dst, const float* src, Py_ssize_t n, bint kv_f16) noexcept nogil
