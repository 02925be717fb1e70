# The C records the layer loop's modules share (forward, binding, scratch, rowjobs, attention).
# Declarations only: there is no layout module at run time.
from libc.stdint cimport int32_t, uint8_t

cdef enum:
    ACT_SILU = 0
    ACT_GELU = 1

# The hyper-parameters the loop reads. Fields are named as ModelConfig's: Forward converts the config's
# fields to this struct by name, so a missing one fails at load.
ctypedef struct HParams:
    Py_ssize_t n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_rot
    int rope_mode
    int act                   # ACT_SILU or ACT_GELU, from ModelConfig.activation
    float rms_eps, embd_scale, attn_scale, final_softcap
    # Mixture of experts (n_expert 0: dense): see ModelConfig.
    Py_ssize_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp
    bint expert_norm

# One weight matrix as the kernels see it: `rows` stored rows of `cols` values of GGML type `type`.
ctypedef struct WeightT:
    const uint8_t* data
    int type
    Py_ssize_t rows
    Py_ssize_t cols
    Py_ssize_t row_bytes

# One block, bound from a weights.LayerWeights record of the same field names. A matrix the layer does not
# have (the dense feed-forward of a mixture-of-experts layer, the experts of a dense one) has rows 0.
ctypedef struct LayerT:
    const float* attn_norm
    WeightT wq
    WeightT wk
    WeightT wv
    WeightT wo
    const float* bq          # NULL when the architecture has no q/k/v biases
    const float* bk
    const float* bv
    const float* q_norm      # NULL unless per-head q/k RMSNorm (qwen3, gemma3)
    const float* k_norm
    const float* post_attn_norm   # NULL unless normed after attention (gemma3)
    const float* ffn_norm
    WeightT gate
    WeightT up
    WeightT down
    const float* post_ffn_norm
    # Mixture of experts: the router and the stacked experts (rows 0 = none: a dense layer); the shared
    # expert and its gate vector (rows 0 / NULL = none).
    WeightT gate_inp
    WeightT gate_exps
    WeightT up_exps
    WeightT down_exps
    WeightT gate_shexp
    WeightT up_shexp
    WeightT down_shexp
    const float* gate_inp_shexp
    Py_ssize_t window        # sliding-window size in positions; 0 = attends to the whole context
    float rope_base
    float rope_freq_scale

# Activations of one micro-batch, row-major [n, width].
ctypedef struct Scratch:
    float* x        # residual stream [n, n_embd]
    float* xn       # normed input of the current matmul group [n, max(n_embd, q width)]
    float* q        # [n, n_head * head_dim]
    float* k        # [n, n_head_kv * head_dim]
    float* v        # [n, n_head_kv * head_dim]
    float* att      # [n, n_head * head_dim]
    float* o        # [n, n_embd]
    float* g        # [n, n_ff]
    float* u        # [n, n_ff]
    float* cs       # RoPE cos/sin per token [n, n_rot]
    float* scores   # per thread [n_threads_max, group, n_ctx]: one row per query head of a KV group
    uint8_t* aq     # quantized activations [n, max act row bytes]

# Where a micro-batch's tokens read and write one layer's KV cache: the K/V rows job writes through it and
# the attention job reads through it. Cache layout [seq, kv_head, position, head_dim] per layer.
ctypedef struct KVRows:
    const int32_t* pos        # per token of the micro-batch
    const int32_t* seq
    char* kl                  # this layer's K and V caches, es bytes a value
    char* vl
    Py_ssize_t seq_stride     # in values
    Py_ssize_t head_stride
    Py_ssize_t head_dim
    Py_ssize_t es             # 2 (IEEE half) or 4 (float32)
    bint f16


cdef inline Py_ssize_t kv_offset(const KVRows* kv, Py_ssize_t t, Py_ssize_t kv_head, Py_ssize_t p) noexcept nogil:
    """Byte offset, in a layer's cache, of position p of KV head kv_head in token t's sequence."""
    return (kv.seq[t] * kv.seq_stride + kv_head * kv.head_stride + p * kv.head_dim) * kv.es


cdef inline Py_ssize_t first_visible(Py_ssize_t p, Py_ssize_t window) noexcept nogil:
    """The first position a token at p attends to: 0, or the start of its sliding window."""
    if window > 0 and p - window + 1 > 0:
        return p - window + 1
    return 0
