# The C records the layer loop's modules share (forward, binding, scratch, rowjobs, attention).
# Declarations only: there is no layout module at run time.
from libc.stdint cimport int32_t, uint8_t
from libc.string cimport memcpy, memset

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
    MIXER_DELTANET = 2
    MIXER_MAMBA2 = 3

cdef enum:
    FFN_NONE = 0
    FFN_GATED = 1
    FFN_UNGATED = 2
    FFN_MOE = 3
    FFN_DENSE_MOE = 4   # a dense gated FFN plus a mixture of experts, summed (Gemma 4 26B-A4B: dense_moe.pyx)
    FFN_MOE_UNGATED = 5 # sigmoid-routed ungated experts + ungated shared expert (Nemotron-H MoE: moe_ungated.pyx)

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
    float expert_scale
    Py_ssize_t moe_latent_size
    # Recurrent mixers' shapes (ModelConfig.ssm_*; 0 without recurrent layers).
    Py_ssize_t ssm_d_conv, ssm_d_inner, ssm_d_state, ssm_n_group, ssm_dt_rank

# One weight matrix as the kernels see it: `rows` stored rows of `cols` values of GGML type `type`, in the
# file's layout (layout 0) or repacked at load into 8-row tiles (traits.pxd's LAYOUT_*; repack.py).
ctypedef struct WeightT:
    const uint8_t* data
    int type
    int layout
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
    # Gemma 4's mixture (FFN_DENSE_MOE): the router's input scale [n_embd], each expert's output scale
    # [n_expert] (NULL: none), the experts' input norm and the two outputs' norms; gate and up of every
    # expert as one stacked tensor [n_expert * 2 * n_ff_exp, n_embd] (rows 0: separate gate_exps / up_exps).
    const float* gate_inp_scale
    const float* down_exps_scale
    const float* pre_ffn_norm_2
    const float* post_ffn_norm_1
    const float* post_ffn_norm_2
    WeightT gate_up_exps
    Py_ssize_t window        # sliding-window size in positions; 0 = attends to the whole context
    float rope_base
    float rope_freq_scale
    # The layer's own shapes (LayerSpec): KV heads, head size, rotary dimensions.
    Py_ssize_t n_head_kv
    Py_ssize_t head_dim
    Py_ssize_t n_rot
    int kv_shared            # 1: Q only, attending over an earlier layer's K/V rows (Gemma 4)
    int v_norm               # 1: V rows RMS-normed without a weight (Gemma 4); V = K where wv has rows 0
    int rope_freqs           # 1: the model's rope_freqs divide this layer's frequencies
    const float* out_scale   # [1]: the layer's output (the whole residual stream) scaled (NULL: none)
    # Per-layer embeddings (per_layer_embd.pyx; rows 0 = none): gate [n_embd_per_layer, n_embd], projection
    # [n_embd, n_embd_per_layer], its post-norm.
    WeightT inp_gate
    WeightT proj
    const float* pe_post_norm
    # Qwen3-Next / Qwen3.5. attn_gate: wq has 2 * n_head * head_dim rows, q and an output gate interleaved
    # per head; the attention output is multiplied by sigmoid(gate) before wo (attention.pyx).
    int attn_gate
    # The gated delta-net mixer (deltanet.pyx): q/k/v projected together (wqkv) and the output gate z
    # (wqkv_gate), or all four by one legacy ssm_in; beta and alpha fused per key head (ssm_ba, qwen3next)
    # or separate (ssm_beta, ssm_alpha, qwen35); the depthwise causal convolution [channels, d_conv]; the
    # per-head dt bias and decay rate A (-exp(A_log)); the gated norm [head_v_dim]; the output projection.
    WeightT wqkv
    WeightT wqkv_gate
    WeightT ssm_in
    WeightT ssm_ba
    WeightT ssm_beta
    WeightT ssm_alpha
    WeightT ssm_out
    const float* ssm_conv1d
    const float* ssm_dt
    const float* ssm_a
    const float* ssm_norm
    # Nemotron-H. Mamba2 (mamba2.pyx) uses ssm_in [z, xBC, dt], ssm_conv1d [conv channels, d_conv], ssm_dt
    # (the dt bias), ssm_a, ssm_norm [n_group, d_inner / n_group] and ssm_out above, and: the convolution's
    # bias (NULL: none), D per head. MOE_UNGATED (moe_ungated.pyx): the per-expert bias added to the
    # router's sigmoid for the choice only; the latent projections (rows 0: none).
    const float* ssm_conv1d_b
    const float* ssm_d
    const float* exp_probs_b
    WeightT latent_down
    WeightT latent_up

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
    float* qg       # gated attention's Q projection, q and gate per head [n, 2 * q width] (else unused)
    float* scores   # [n_threads_max, ATT_BLOCK_MAX * group, n_ctx]: a row per (token, head) of a job item
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


# Where a micro-batch's tokens meet one recurrent layer's state (memory.py): per sequence, the live state
# (`floats` values: the convolution's carried inputs, `conv` of them, then the scan's state) followed by
# n_snap snapshot slots. A recurrent mixer runs each sequence's tokens in batch order (their positions are
# consecutive: Forward.eval checks), through these two calls per token:
#   st = state_begin(sr, t)   the live state of token t's sequence, zeroed first when t is at position 0
#   ... update st with token t ...
#   state_end(sr, t, st)      keep a copy in the snapshot slot of t's position when sr.snap[t] says so
# The snapshots let a sequence go back up to n_snap - 1 tokens (a rejected speculative draft): the
# forward loop marks the last n_snap tokens of every sequence that has more than one in the micro-batch.
# A mixer that updates parts of the state in separate passes (the convolution for every token, then each
# head's scan over the tokens, in parallel) copies each part after token t into the same part of
# snapshot_slot(sr, t) instead of calling state_end.
ctypedef struct StateRows:
    const int32_t* pos        # per token of the micro-batch (KVRows' arrays)
    const int32_t* seq
    const uint8_t* snap       # per token: 1 = copy its state into a snapshot slot after it
    float* state              # this layer's [n_seq, 1 + n_snap, floats]
    Py_ssize_t floats
    Py_ssize_t conv
    Py_ssize_t n_snap


cdef inline float* live_state(const StateRows* sr, Py_ssize_t t) noexcept nogil:
    """The live state of token t's sequence, as it is (mixers that zero it part by part use this)."""
    return sr.state + sr.seq[t] * (1 + sr.n_snap) * sr.floats


cdef inline float* state_begin(const StateRows* sr, Py_ssize_t t) noexcept nogil:
    cdef float* st = live_state(sr, t)
    if sr.pos[t] == 0:
        memset(st, 0, sr.floats * sizeof(float))
    return st


cdef inline float* snapshot_slot(const StateRows* sr, Py_ssize_t t) noexcept nogil:
    """Token t's snapshot slot (the same layout as the live state), or NULL when t keeps none."""
    if not sr.snap[t] or sr.n_snap == 0:
        return NULL
    return sr.state + (sr.seq[t] * (1 + sr.n_snap) + 1 + sr.pos[t] % sr.n_snap) * sr.floats


cdef inline void state_end(const StateRows* sr, Py_ssize_t t, const float* st) noexcept nogil:
    cdef float* slot = snapshot_slot(sr, t)
    if slot != NULL:
        memcpy(slot, st, sr.floats * sizeof(float))


cdef inline void conv_step(const StateRows* sr, Py_ssize_t t, const float* x, const float* w, const float* bias,
                           float* out, Py_ssize_t C, Py_ssize_t K, Py_ssize_t c0, Py_ssize_t c1) noexcept nogil:
    """Channels c0..c1-1 of token t's causal depthwise convolution (both recurrent mixers'): out[c] = the
    taps w[c * K + k] over the sequence's carried inputs, oldest first, then over x[c], then bias[c] where
    bias is not NULL (ggml_ssm_conv's order). The carried inputs are the live state's first (K - 1) rows of
    C floats: zeroed at position 0, then moved on by one input (and copied into t's snapshot slot)."""
    cdef float* st = live_state(sr, t)
    cdef float* slot = snapshot_slot(sr, t)
    cdef Py_ssize_t k, c, P = K - 1, m = c1 - c0
    if sr.pos[t] == 0:
        for k in range(P):
            memset(st + k * C + c0, 0, m * sizeof(float))
    for c in range(c0, c1):
        out[c] = 0.0
    for k in range(P):
        for c in range(c0, c1):
            out[c] += w[c * K + k] * st[k * C + c]
    for c in range(c0, c1):
        out[c] += w[c * K + P] * x[c]
    if bias != NULL:
        for c in range(c0, c1):
            out[c] += bias[c]
    for k in range(P):
        memcpy(st + k * C + c0, (st + (k + 1) * C if k + 1 < P else x) + c0, m * sizeof(float))
        if slot != NULL:
            memcpy(slot + k * C + c0, st + k * C + c0, m * sizeof(float))
