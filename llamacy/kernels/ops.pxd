# Element-wise and attention operations of the layer loop: the C-level surface forward.pyx cimports.
from libc.math cimport expf, log1pf

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
cdef void silu_inplace(float* x, Py_ssize_t n) noexcept nogil
cdef void mul_silu(float* y, const float* z, Py_ssize_t n) noexcept nogil
cdef void gelu_mul(float* gate, const float* up, Py_ssize_t n) noexcept nogil
cdef void add_inplace(float* x, const float* y, Py_ssize_t n) noexcept nogil
cdef void scale_inplace(float* x, float s, Py_ssize_t n) noexcept nogil
cdef float dot_f32(const float* a, const float* b, Py_ssize_t n) noexcept nogil

# The KV cache's row formats: one row is head_dim values of one KV head at one position, and row i of a
# head's cache starts at byte i * kv_row_bytes(kv_fmt, head_dim). F32 and F16 are plain arrays (0 and 1,
# what the former `bint kv_f16` arguments meant); Q8_0 and Q4_0 are GGML blocks of 32 values (34 and 18
# bytes: a fp16 scale, then 32 int8 or 32 nibbles), so head_dim must be a multiple of 32 for them: the
# callers check (llamacy.model.kv_types), the kernels do not.
cdef enum:
    KV_F32 = 0
    KV_F16 = 1
    KV_Q8_0 = 2
    KV_Q4_0 = 3
    N_KV_FORMATS = 4

# Bytes of one cached row of n values in kv_fmt (n a multiple of 32 for the quantized formats).
cdef Py_ssize_t kv_row_bytes(int kv_fmt, Py_ssize_t n) noexcept nogil
cdef void attend_group(const float* q, const void* K, const void* V, Py_ssize_t first, Py_ssize_t last,
                       Py_ssize_t head_dim, Py_ssize_t n_heads, float scale, float softcap, float* scores,
                       Py_ssize_t scores_stride, float* out, int kv_fmt, bint stream) noexcept nogil
# A prompt's block of up to ATT_BLOCK_MAX tokens at consecutive positions (see ops.pyx).
cdef enum:
    ATT_BLOCK_MAX = 8
cdef void attend_block(const float* q, Py_ssize_t q_stride, const void* K, const void* V, Py_ssize_t first,
                       Py_ssize_t last0, Py_ssize_t n_tok, Py_ssize_t head_dim, Py_ssize_t n_heads, float scale,
                       float softcap, float* scores, Py_ssize_t scores_stride, float* out, Py_ssize_t out_stride,
                       int kv_fmt) noexcept nogil
cdef void store_kv_row(void* dst, const float* src, Py_ssize_t n, int kv_fmt) noexcept nogil


cdef inline float softplus(float x) noexcept nogil:
    """log(1 + e^x), large inputs passed through as torch (threshold 20) and ggml_compute_softplus_f32 do:
    log1p(exp(x)) would overflow. Inline: compiled into the caller, without ops' -ffast-math."""
    return x if x > 20.0 else log1pf(expf(x))
