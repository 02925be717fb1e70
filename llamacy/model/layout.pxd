from libc.stdint cimport uint8_t

# One weight matrix as the kernels see it: `rows` stored rows of `cols` values of GGML type `type`.
ctypedef struct WeightT:
    const uint8_t* data
    int type
    Py_ssize_t rows
    Py_ssize_t cols
    Py_ssize_t row_bytes

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
    Py_ssize_t window        # sliding-window size in positions; 0 = attends to the whole context
    float rope_base
    float rope_freq_scale
