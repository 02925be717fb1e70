"""A numpy forward pass of Hugging Face checkpoints, in Hugging Face's own conventions.

The oracle for `llamacy convert`: it reads the checkpoint's weights as transformers stores them (Q/K rows
not permuted, Gemma norms as w with the model computing x * (1 + w)) and follows transformers' modeling
code (modeling_llama / qwen2 / qwen3 / gemma3 / nemotron): rotate_half RoPE, repeat_kv for grouped-query
attention, the sliding-window mask of Gemma 3's local layers. Nothing here comes from llama.cpp's
conventions, so a converted model that matches it was converted right. Float64 throughout.

NemotronForCausalLM (Nemotron-4, Minitron), from transformers' models/nemotron/modeling_nemotron.py and
configuration_nemotron.py:
- every norm is NemotronLayerNorm1P: F.layer_norm(x, shape, weight + 1, bias, norm_eps), i.e. a LayerNorm
  (mean subtracted, biased variance) whose stored weight is the offset from 1, with a bias. input_layernorm,
  post_attention_layernorm and the final model.norm.
- head_dim = config.head_dim or hidden_size // num_attention_heads; RoPE over the first
  int(head_dim * partial_rotary_factor) dims of each head only (_compute_default_rope_parameters;
  apply_rotary_pos_emb splits q[..., :rot_dim] from the pass-through q[..., rot_dim:]), rotate_half within
  the rotated part, inv_freq = 1 / theta^(2i / rot_dim).
- q/k/v/o projections carry biases iff attention_bias; o_proj maps n_head * head_dim to hidden_size.
  Scores scaled by 1/sqrt(head_dim); repeat_kv for GQA.
- NemotronMLP: down_proj(act(up_proj(x))), no gate; hidden_act "relu2" = ReLUSquaredActivation,
  relu(x)^2; up/down biases iff mlp_bias.
- lm_head has no bias; untied unless tie_word_embeddings (default False).

    logits = hf_logits(config_dict, {hf_name: array}, token_ids)   # [n_tokens, vocab_size]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma3ForCausalLM",
    "NemotronForCausalLM",
)


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def default_inv_freq(base: float, dim: int) -> np.ndarray:
    return 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def llama3_inv_freq(base: float, dim: int, scaling: dict[str, Any]) -> np.ndarray:
    """transformers' _compute_llama3_parameters."""
    inv_freq = default_inv_freq(base, dim)
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_ctx = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled)


def inv_freq_for(config: dict[str, Any], head_dim: int, local: bool) -> np.ndarray:
    gemma = config["architectures"][0] == "Gemma3ForCausalLM"
    if gemma and local:
        return default_inv_freq(config.get("rope_local_base_freq", 10000.0), head_dim)
    base = config.get("rope_theta", 1_000_000.0 if gemma else 10000.0)
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return default_inv_freq(base, head_dim)
    if kind == "linear":
        return default_inv_freq(base, head_dim) / scaling["factor"]
    if kind == "llama3":
        return llama3_inv_freq(base, head_dim, scaling)
    raise NotImplementedError(f"rope scaling {kind!r}")


def apply_rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """x [n, heads, head_dim] rotated as transformers' apply_rotary_pos_emb (cos/sin over both halves)."""
    freqs = positions[:, None].astype(np.float64) * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    return x * cos + rotate_half(x) * sin


def hf_logits(config: dict[str, Any], weights: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    arch = config["architectures"][0]
    if arch not in ARCHITECTURES:
        raise NotImplementedError(arch)
    if arch == "NemotronForCausalLM":
        return nemotron_logits(config, weights, ids)
    gemma = arch == "Gemma3ForCausalLM"
    W = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    n_embd, n_layer = config["hidden_size"], config["num_hidden_layers"]
    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads", n_head)
    head_dim = config.get("head_dim") or n_embd // n_head
    eps = config.get("rms_norm_eps", 1e-6)
    n = len(ids)
    pos = np.arange(n)

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        w = W[name]
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        return y * (1.0 + w) if gemma else y * w  # Gemma3RMSNorm: x * (1 + weight)

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        y = x @ W[name + ".weight"].T
        return y + W[name + ".bias"] if name + ".bias" in W else y

    if gemma:
        layer_types = config.get("layer_types") or [
            "full_attention"
            if (i + 1) % config.get("sliding_window_pattern", 6) == 0
            else "sliding_attention"
            for i in range(n_layer)
        ]
        scale = config.get("query_pre_attn_scalar", head_dim) ** -0.5
    else:
        layer_types = ["full_attention"] * n_layer
        scale = head_dim**-0.5

    x = W["model.embed_tokens.weight"][ids]
    if gemma:
        x = x * np.sqrt(n_embd)  # Gemma3TextScaledWordEmbedding
    for i in range(n_layer):
        p = f"model.layers.{i}."
        local = layer_types[i] == "sliding_attention"
        h = norm(x, p + "input_layernorm.weight")
        q = linear(h, p + "self_attn.q_proj").reshape(n, n_head, head_dim)
        k = linear(h, p + "self_attn.k_proj").reshape(n, n_kv, head_dim)
        v = linear(h, p + "self_attn.v_proj").reshape(n, n_kv, head_dim)
        if p + "self_attn.q_norm.weight" in W:
            q = norm(q, p + "self_attn.q_norm.weight")
            k = norm(k, p + "self_attn.k_norm.weight")
        inv_freq = inv_freq_for(config, head_dim, local)
        q, k = apply_rope(q, pos, inv_freq), apply_rope(k, pos, inv_freq)
        k = np.repeat(k, n_head // n_kv, axis=1)  # repeat_kv
        v = np.repeat(v, n_head // n_kv, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) * scale
        qi, ki = np.arange(n)[:, None], np.arange(n)[None, :]
        visible = ki <= qi
        if gemma and local and config.get("sliding_window"):
            visible &= ki > qi - config["sliding_window"]
        scores = np.where(visible[None], scores, -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, n_head * head_dim)
        attn = linear(attn, p + "self_attn.o_proj")
        if gemma:
            attn = norm(attn, p + "post_attention_layernorm.weight")
            x = x + attn
            h = norm(x, p + "pre_feedforward_layernorm.weight")
            gate = linear(h, p + "mlp.gate_proj")
            act = 0.5 * gate * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (gate + 0.044715 * gate**3)))
            f = linear(act * linear(h, p + "mlp.up_proj"), p + "mlp.down_proj")
            x = x + norm(f, p + "post_feedforward_layernorm.weight")
        else:
            x = x + attn
            h = norm(x, p + "post_attention_layernorm.weight")
            gate = linear(h, p + "mlp.gate_proj")
            f = linear(gate / (1.0 + np.exp(-gate)) * linear(h, p + "mlp.up_proj"), p + "mlp.down_proj")
            x = x + f
    x = norm(x, "model.norm.weight")
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    if config.get("tie_word_embeddings", gemma):
        head = W["model.embed_tokens.weight"]
    logits = x @ head.T
    cap = config.get("final_logit_softcapping")
    if cap:
        logits = cap * np.tanh(logits / cap)
    return logits


def nemotron_logits(config: dict[str, Any], weights: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """NemotronForCausalLM's forward pass (see the module docstring for the rules and their sources)."""
    if config.get("rope_scaling"):
        raise NotImplementedError("nemotron rope scaling")
    if config.get("hidden_act", "relu2") != "relu2":
        raise NotImplementedError(f"nemotron hidden_act {config['hidden_act']!r}")
    W = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    n_embd, n_layer = config["hidden_size"], config["num_hidden_layers"]
    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_head
    head_dim = config.get("head_dim") or n_embd // n_head
    rot_dim = int(head_dim * config.get("partial_rotary_factor", 0.5))
    eps = config.get("norm_eps", 1e-5)
    n = len(ids)
    inv_freq = default_inv_freq(config.get("rope_theta", 10000.0), rot_dim)
    pos = np.arange(n)

    def layer_norm_1p(x: np.ndarray, name: str) -> np.ndarray:
        # F.layer_norm with weight + 1: the checkpoint stores the offset from 1, the bias as is.
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * (W[name + ".weight"] + 1.0) + W[name + ".bias"]

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        y = x @ W[name + ".weight"].T
        return y + W[name + ".bias"] if name + ".bias" in W else y

    def partial_rope(x: np.ndarray) -> np.ndarray:
        # apply_rotary_pos_emb: rotate the first rot_dim dims of each head, pass the rest through.
        return np.concatenate([apply_rope(x[..., :rot_dim], pos, inv_freq), x[..., rot_dim:]], axis=-1)

    x = W["model.embed_tokens.weight"][ids]
    qi, ki = np.arange(n)[:, None], np.arange(n)[None, :]
    for i in range(n_layer):
        p = f"model.layers.{i}."
        h = layer_norm_1p(x, p + "input_layernorm")
        q = partial_rope(linear(h, p + "self_attn.q_proj").reshape(n, n_head, head_dim))
        k = partial_rope(linear(h, p + "self_attn.k_proj").reshape(n, n_kv, head_dim))
        v = linear(h, p + "self_attn.v_proj").reshape(n, n_kv, head_dim)
        k = np.repeat(k, n_head // n_kv, axis=1)  # repeat_kv
        v = np.repeat(v, n_head // n_kv, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)
        scores = np.where((ki <= qi)[None], scores, -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, n_head * head_dim)
        x = x + linear(attn, p + "self_attn.o_proj")
        h = layer_norm_1p(x, p + "post_attention_layernorm")
        x = x + linear(np.maximum(linear(h, p + "mlp.up_proj"), 0.0) ** 2, p + "mlp.down_proj")
    x = layer_norm_1p(x, "model.norm")
    tied = config.get("tie_word_embeddings", False)
    head = W["model.embed_tokens.weight"] if tied else W["lm_head.weight"]
    return x @ head.T
