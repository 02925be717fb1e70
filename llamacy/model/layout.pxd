# The C records the layer loop's modules share (forward, binding, scratch, rowjobs, attention).
# Declarations only: there is no layout module at run time.
from libc.stdint cimport int32_t, uint8_t

# Block kinds, in config.py's order (NORMS, MIXERS, FFNS, ACTIVATIONS).
cdef enum:
    ACT_SILU = 0
    ACT_GELU = 1
    ACT_RELU2 = 2

cdef enum:
    NORM_RMS = 0
    NORM_LAYER = 1

cdef enum:
    MIXER_NONE = 0
    MIXER_ATTENTION = 1

cdef enum:
    FFN_NONE = 0
    FFN_GATED = 1
    FFN_UNGATED = 2
    FFN_MOE = 3

# The hyper-parameters the loop reads. Fields are named as ModelConfig's: Forward converts the config's
# fields to this struct by name, so a missing one fails at load.
ctypedef struct HParams:
    Py_ssize_t n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_rot
    int rope_mode
    int act                   # ACT_*, from ModelConfig.activation
    int norm                  # NORM_*, from ModelConfig.norm (every norm of the model but the per-head q/k ones)
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

# One layer, bound from the fields its architecture declares (weights.ModelWeights.layers[i], by name:
# binding.pyx). A matrix the layer does not have has rows 0, a vector NULL; its recipe says which blocks
# run, so a missing tensor never stands in for "this block is absent".
ctypedef struct LayerT:
    int mixer                # MIXER_*
    int ffn                  # FFN_*
    const float* attn_norm
    const float* attn_norm_b # LayerNorm bias (NULL for RMSNorm)
    WeightT wq
    WeightT wk
    WeightT wv
    WeightT wo
    const float* bo          # output-projection bias (NULL: none)
    const float* bq          # NULL when the architecture has no q/k/v biases
    const float* bk
    const float* bv
    const float* q_norm      # NULL unless per-head q/k RMSNorm (qwen3, gemma3)
    const float* k_norm
    const float* post_attn_norm   # NULL unless normed after attention (gemma3)
    const float* ffn_norm
    const float* ffn_norm_b
    WeightT gate
    WeightT up
    WeightT down
    const float* up_b        # feed-forward biases (NULL: none)
    const float* down_b
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

# Where a micro-batch's tokens read and write one layer's K/V rows: the K/V rows job writes through it and
# the attention job reads through it. A layer's memory is [seq, kv_head, slot, row_bytes] (memory.py).
# A full-attention layer keeps position p in slot p. A sliding-window layer keeps a ring: position p in
# slot p % ring and again in slot p % ring + ring, so that the rows of any window (at most ring positions)
# are one contiguous run of slots, which the attention kernel reads exactly as it reads a full cache.
ctypedef struct KVRows:
    const int32_t* pos        # per token of the micro-batch
    const int32_t* seq
    char* kl                  # this layer's K and V rows
    char* vl
    Py_ssize_t n_head_kv
    Py_ssize_t slots          # rows per (sequence, KV head)
    Py_ssize_t ring           # the ring's period; 0: slot = position
    Py_ssize_t row_bytes
    Py_ssize_t head_dim
    int fmt                   # the rows' format for the kernels (ops.pxd: 0 float32, 1 IEEE half, …)


cdef inline Py_ssize_t kv_slot(const KVRows* kv, Py_ssize_t p) noexcept nogil:
    """The slot position p is kept in (its first copy, for a ring)."""
    return p % kv.ring if kv.ring else p


cdef inline Py_ssize_t kv_offset(const KVRows* kv, Py_ssize_t t, Py_ssize_t kv_head, Py_ssize_t slot) noexcept nogil:
    """Byte offset, in a layer's rows, of a slot of KV head kv_head in token t's sequence."""
    return ((kv.seq[t] * kv.n_head_kv + kv_head) * kv.slots + slot) * kv.row_bytes


cdef inline Py_ssize_t first_visible(Py_ssize_t p, Py_ssize_t window) noexcept nogil:
    """The first position a token at p attends to: 0, or the start of its sliding window."""
    if window > 0 and p - window + 1 > 0:
        return p - window + 1
    return 0
