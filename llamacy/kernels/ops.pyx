# cython: language_level=3
"""Element-wise operations and attention (one query head, or a KV group's heads) for the layer loop.

Plain loops that GCC vectorises: this module alone is built with -ffast-math (setup.py), which lets it
reassociate the reductions and call glibc's vector expf/tanhf. The reductions also keep eight
independent partial sums, so they vectorise even without it (the portable build).
"""

from libc.math cimport cosf, expf, powf, sinf, sqrtf, tanhf
from libc.stdint cimport uint8_t, uint16_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from llamacy.kernels.blocks cimport block_q4_0
from llamacy.kernels.quantize_rows cimport q_legacy, q_q8_0
from llamacy.kernels.simd cimport _cvtss_sh


cdef extern from "attention.h" nogil:
    float lc_dot_f32(const float* a, const float* b, Py_ssize_t n)
    Py_ssize_t lc_kv_row_bytes(int fmt, Py_ssize_t hd)
    void lc_attend_group(const float* q, const char* qq, const void* K, const void* V, Py_ssize_t first,
                         Py_ssize_t last,
                         Py_ssize_t hd, Py_ssize_t G, float scale, float softcap, float* scores,
                         Py_ssize_t ss, float* out, int stream, int fmt)


# Declared from the header that defines it (attention_block.h includes it), so that a change there rebuilds
# ops.
cdef extern from "attention512.h" nogil:
    int lc_attend_wide(int on)


cdef extern from "attention_block.h" nogil:
    bint lc_attend_block_ok(Py_ssize_t hd, Py_ssize_t G, Py_ssize_t B, int fmt)
    void lc_attend_block(const float* q, Py_ssize_t qs, const void* K, const void* V, Py_ssize_t first,
                         Py_ssize_t last0, Py_ssize_t B, Py_ssize_t hd, Py_ssize_t G, float scale, float softcap,
                         float* scores, Py_ssize_t ss, float* out, Py_ssize_t ostride, int fmt)


def set_attention_wide(bint on):
    """Run a prompt's attention blocks on AVX-512 vectors (on: the CPU must have AVX-512F) or on AVX2's; the
    same bits either way (attention512.h). Returns whether they now run on AVX-512 (False in a build without
    it)."""
    return bool(lc_attend_wide(on))


def _attention_wide_default():
    from llamacy.kernels import cpu

    return cpu.avx512_features()["avx512f"] and cpu.avx512_allowed()


ATTENTION_WIDE = set_attention_wide(_attention_wide_default())
ATT_BLOCK_TOKENS = ATT_BLOCK_MAX  # tokens of a prompt's attention block (engine.py sizes the scratch with it)


cdef float dot_f32(const float* a, const float* b, Py_ssize_t n) noexcept nogil:
    return lc_dot_f32(a, b, n)


cdef void rmsnorm(const float* x, const float* w, float* out, Py_ssize_t n, float eps) noexcept nogil:
    cdef float inv = 1.0 / sqrtf(dot_f32(x, x, n) / n + eps)
    cdef Py_ssize_t i
    if w == NULL:
        for i in range(n):
            out[i] = x[i] * inv
    else:
        for i in range(n):
            out[i] = x[i] * inv * w[i]


cdef void rmsnorm_heads(float* x, const float* w, Py_ssize_t n_heads, Py_ssize_t head_dim,
                        float eps) noexcept nogil:
    # Per-head norm with one shared weight vector (qwen3 / gemma3 q- and k-norms).
    cdef Py_ssize_t h
    for h in range(n_heads):
        rmsnorm(x + h * head_dim, w, x + h * head_dim, head_dim, eps)


cdef void rope_table(float* cs, Py_ssize_t n_rot, float pos, float base, float freq_scale,
                     const float* freq_factors) noexcept nogil:
    # cs[2i], cs[2i+1] = cos, sin of pos * base^(-2i/n_rot), built the way ggml does (theta *= scale),
    # so positions far into the context round like the reference engine's. Llama 3.1-style files
    # divide each frequency by a stored factor (rope_freqs.weight).
    cdef float theta_scale = powf(base, -2.0 / n_rot)
    cdef float theta = pos * freq_scale, t
    cdef Py_ssize_t i
    for i in range(n_rot // 2):
        t = theta / freq_factors[i] if freq_factors != NULL else theta
        cs[2 * i] = cosf(t)
        cs[2 * i + 1] = sinf(t)
        theta *= theta_scale


cdef void rope(float* x, Py_ssize_t n_heads, Py_ssize_t head_dim, Py_ssize_t n_rot,
               const float* cs, int mode) noexcept nogil:
    cdef Py_ssize_t h, i, half = n_rot // 2
    cdef float c, s, a, b
    cdef float* xh
    for h in range(n_heads):
        xh = x + h * head_dim
        if mode == ROPE_NEOX:
            for i in range(half):
                c = cs[2 * i]
                s = cs[2 * i + 1]
                a = xh[i]
                b = xh[i + half]
                xh[i] = a * c - b * s
                xh[i + half] = a * s + b * c
        else:
            for i in range(half):
                c = cs[2 * i]
                s = cs[2 * i + 1]
                a = xh[2 * i]
                b = xh[2 * i + 1]
                xh[2 * i] = a * c - b * s
                xh[2 * i + 1] = a * s + b * c


cdef void silu_mul(float* gate, const float* up, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef float g
    for i in range(n):
        g = gate[i]
        gate[i] = g / (1.0 + expf(-g)) * up[i]


cdef void silu_inplace(float* x, Py_ssize_t n) noexcept nogil:
    """x = SiLU(x) (the recurrent mixers' convolution outputs), with glibc's vector expf."""
    cdef Py_ssize_t i
    cdef float g
    for i in range(n):
        g = x[i]
        x[i] = g / (1.0 + expf(-g))


cdef void mul_silu(float* y, const float* z, Py_ssize_t n) noexcept nogil:
    """y = y · SiLU(z) (the recurrent mixers' output gates)."""
    cdef Py_ssize_t i
    cdef float g
    for i in range(n):
        g = z[i]
        y[i] = y[i] * (g / (1.0 + expf(-g)))


cdef void gelu_mul(float* gate, const float* up, Py_ssize_t n) noexcept nogil:
    # The tanh approximation, as ggml_gelu and Gemma's gelu_pytorch_tanh compute it.
    cdef Py_ssize_t i
    cdef float g
    for i in range(n):
        g = gate[i]
        gate[i] = 0.5 * g * (1.0 + tanhf(0.7978845608028654 * (g + 0.044715 * g * g * g))) * up[i]


cdef void add_inplace(float* x, const float* y, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        x[i] += y[i]


cdef void scale_inplace(float* x, float s, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        x[i] *= s


DEF QBUF_BYTES = 8704  # 16 query heads of 512 values as Q8_0 blocks


cdef Py_ssize_t kv_row_bytes(int kv_fmt, Py_ssize_t n) noexcept nogil:
    return lc_kv_row_bytes(kv_fmt, n)


cdef void attend_group(const float* q, const void* K, const void* V, Py_ssize_t first, Py_ssize_t last,
                       Py_ssize_t head_dim, Py_ssize_t n_heads, float scale, float softcap, float* scores,
                       Py_ssize_t scores_stride, float* out, int kv_fmt, bint stream) noexcept nogil:
    """n_heads query heads over cached positions first..last (inclusive) of the one KV head they share, each
    cached row read once for all of them (see attention.h).

    K and V point at position 0 of that head's cache: rows of kv_row_bytes(kv_fmt, head_dim) bytes (ops.pxd's
    KV_* formats; head_dim a multiple of 32 for the quantized ones). q and out: n_heads rows of head_dim
    floats; head h's output is bit for bit what the one-head kernel (n_heads == 1) gives for
    q + h * head_dim. scores: n_heads rows of scores_stride >= last+1 floats. stream: the rows are not in
    cache (decoding), so the kernel requests them ahead of its reads; the result does not depend on it.
    """
    # Over quantized rows the scores are integer dot products with each query head quantized to Q8_0 blocks
    # (ggml's quantize_row_q8_0 reference: quantize_rows.pyx, built without -ffast-math), heads in chunks
    # that fit qbuf; a head's output does not depend on the heads beside it in a call.
    cdef char qbuf[QBUF_BYTES]
    cdef char* qq = qbuf
    cdef Py_ssize_t qs, chunk, g0, G
    if kv_fmt != KV_Q8_0 and kv_fmt != KV_Q4_0:
        lc_attend_group(q, NULL, K, V, first, last, head_dim, n_heads, scale, softcap, scores, scores_stride, out,
                        stream, kv_fmt)
        return
    qs = head_dim // 32 * 34
    chunk = QBUF_BYTES // qs
    if chunk == 0:
        qq = <char*>malloc(qs)
        if qq == NULL:
            return
        chunk = 1
    g0 = 0
    while g0 < n_heads:
        G = n_heads - g0 if n_heads - g0 < chunk else chunk
        q_q8_0(q + g0 * head_dim, qq, G * head_dim, False)
        lc_attend_group(q + g0 * head_dim, qq, K, V, first, last, head_dim, G, scale, softcap,
                        scores + g0 * scores_stride, scores_stride, out + g0 * head_dim, stream, kv_fmt)
        g0 += G
    if qq != qbuf:
        free(qq)


cdef void attend_block(const float* q, Py_ssize_t q_stride, const void* K, const void* V, Py_ssize_t first,
                       Py_ssize_t last0, Py_ssize_t n_tok, Py_ssize_t head_dim, Py_ssize_t n_heads, float scale,
                       float softcap, float* scores, Py_ssize_t scores_stride, float* out, Py_ssize_t out_stride,
                       int kv_fmt) noexcept nogil:
    """n_tok <= ATT_BLOCK_MAX tokens at consecutive positions, the n_heads query heads of one KV group each:
    token i attends over first..last0 + i, its heads at q + i * q_stride (out + i * out_stride), laid out as
    attend_group's. Each (token, head) gets bit for bit what attend_group gives for it alone; the rows are
    read (and widened) once for the block (attention_block.h). scores: n_tok * n_heads rows of scores_stride
    >= last0 + n_tok floats. Not for decoding: the rows are expected in cache (no stream). A run of one token
    (a decoded token batched beside a prompt, a windowed layer past its window's start) takes attend_group:
    one token's heads do not share the widening enough (attention512.h)."""
    cdef Py_ssize_t i
    if n_tok > 1 and lc_attend_block_ok(head_dim, n_heads, n_tok, kv_fmt):
        lc_attend_block(q, q_stride, K, V, first, last0, n_tok, head_dim, n_heads, scale, softcap, scores,
                        scores_stride, out, out_stride, kv_fmt)
        return
    for i in range(n_tok):
        attend_group(q + i * q_stride, K, V, first, last0 + i, head_dim, n_heads, scale, softcap, scores,
                     scores_stride, out + i * out_stride, kv_fmt, False)


cdef void store_kv_row(void* dst, const float* src, Py_ssize_t n, int kv_fmt) noexcept nogil:
    """A K or V row into the cache: copied, rounded to IEEE half (to nearest even, as F16C and numpy), or
    quantized to Q8_0 / Q4_0 blocks as ggml's quantize_row_*_ref (quantize_rows.pyx's weight quantizers,
    byte for byte gguf.quants.quantize; they live in a module built without -ffast-math, which would change
    their rounding)."""
    cdef Py_ssize_t i
    cdef uint16_t* h
    if kv_fmt == KV_F16:
        h = <uint16_t*>dst
        for i in range(n):
            h[i] = _cvtss_sh(src[i], 0)
    elif kv_fmt == KV_Q8_0:
        q_q8_0(src, dst, n, False)
    elif kv_fmt == KV_Q4_0:
        q_legacy(src, <block_q4_0*>dst, n, False)
    else:
        memcpy(dst, src, n * sizeof(float))
