"""A numpy forward pass of Hugging Face mixture-of-experts checkpoints, in Hugging Face's own conventions.

The oracle of the MoE conversions and of the engine's expert routing, written from transformers' modeling
code (modeling_qwen3_moe, modeling_qwen2_moe, modeling_mixtral), independent of llama.cpp's conventions:
one matrix per expert as the checkpoint stores them, Q/K rows unpermuted (rotate_half RoPE), and the sparse
block as the modules compute it:

    router_logits = gate(x); p = softmax(router_logits); w, sel = topk(p, k)
    if norm_topk_prob: w /= w.sum()              # Qwen3-MoE, Mixtral (softmax of the top-k logits)
    y = sum_j w_j * down(silu(gate_proj(x)) * up_proj(x)) of expert sel_j
    Qwen2-MoE: y += sigmoid(shared_expert_gate(x)) * shared_expert(x)

Float64 throughout. The attention part is tests/reference/hf_numpy.py's (RoPE and inverse frequencies are
reused from there; grouped-query attention written out again as transformers has it per model).

    logits = hf_moe_logits(config_dict, {hf_name: array}, token_ids)   # [n_tokens, vocab_size]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.reference.hf_numpy import apply_rope, inv_freq_for

ARCHITECTURES = ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM")


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def route(logits: np.ndarray, k: int, norm: bool) -> tuple[np.ndarray, np.ndarray]:
    """(experts [n, k], weights [n, k]) as torch.topk(softmax(logits), k) (largest first; ties: lower
    index), renormalised if norm."""
    p = _softmax(logits)
    sel = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, sel, axis=-1)
    if norm:
        w = w / w.sum(axis=-1, keepdims=True)
    return sel, w


def sparse_block(config: dict[str, Any], W: dict[str, np.ndarray], p: str, h: np.ndarray) -> np.ndarray:
    """The sparse MoE block of layer prefix p on normed input h [n, hidden]."""
    arch = config["architectures"][0]
    if arch == "MixtralForCausalLM":
        mod, proj = p + "block_sparse_moe.", {"gate": "w1", "up": "w3", "down": "w2"}
        norm = True
    else:
        mod, proj = p + "mlp.", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
        norm = bool(config.get("norm_topk_prob", arch == "Qwen3MoeForCausalLM"))
    logits = h @ W[mod + "gate.weight"].T
    for record in _RECORDER:
        record(logits)
    sel, w = route(logits, config["num_experts_per_tok"], norm)
    out = np.zeros_like(h)
    n_expert = config.get("num_local_experts", config.get("num_experts"))
    for e in range(n_expert):
        rows, slot = np.nonzero(sel == e)
        if len(rows) == 0:
            continue
        x = h[rows]
        ex = f"{mod}experts.{e}."
        g = x @ W[ex + proj["gate"] + ".weight"].T
        u = x @ W[ex + proj["up"] + ".weight"].T
        y = (silu(g) * u) @ W[ex + proj["down"] + ".weight"].T
        out[rows] += y * w[rows, slot][:, None]
    if arch == "Qwen2MoeForCausalLM":
        sh = mod + "shared_expert."
        y = (silu(h @ W[sh + "gate_proj.weight"].T) * (h @ W[sh + "up_proj.weight"].T)) @ W[
            sh + "down_proj.weight"
        ].T
        gate = 1.0 / (1.0 + np.exp(-(h @ W[mod + "shared_expert_gate.weight"].T)))  # [n, 1]
        out = out + gate * y
    return out


def hf_moe_logits(config: dict[str, Any], weights: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    arch = config["architectures"][0]
    if arch not in ARCHITECTURES:
        raise NotImplementedError(arch)
    W = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    n_layer = config["num_hidden_layers"]
    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads", n_head)
    head_dim = config.get("head_dim") or config["hidden_size"] // n_head
    eps = config.get("rms_norm_eps", 1e-6)
    n = len(ids)
    pos = np.arange(n)

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * W[name]

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        y = x @ W[name + ".weight"].T
        return y + W[name + ".bias"] if name + ".bias" in W else y

    inv_freq = inv_freq_for(config, head_dim, local=False)
    x = W["model.embed_tokens.weight"][ids]
    for i in range(n_layer):
        p = f"model.layers.{i}."
        h = norm(x, p + "input_layernorm.weight")
        q = linear(h, p + "self_attn.q_proj").reshape(n, n_head, head_dim)
        k = linear(h, p + "self_attn.k_proj").reshape(n, n_kv, head_dim)
        v = linear(h, p + "self_attn.v_proj").reshape(n, n_kv, head_dim)
        if p + "self_attn.q_norm.weight" in W:  # Qwen3-MoE: RMSNorm over each head
            q = norm(q, p + "self_attn.q_norm.weight")
            k = norm(k, p + "self_attn.k_norm.weight")
        q, k = apply_rope(q, pos, inv_freq), apply_rope(k, pos, inv_freq)
        k = np.repeat(k, n_head // n_kv, axis=1)  # repeat_kv
        v = np.repeat(v, n_head // n_kv, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) * head_dim**-0.5
        causal = np.arange(n)[None, :] <= np.arange(n)[:, None]
        probs = _softmax(np.where(causal[None], scores, -np.inf))
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, n_head * head_dim)
        x = x + linear(attn, p + "self_attn.o_proj")
        x = x + sparse_block(config, W, p, norm(x, p + "post_attention_layernorm.weight"))
    x = norm(x, "model.norm.weight")
    head = W["model.embed_tokens.weight"] if config.get("tie_word_embeddings") else W["lm_head.weight"]
    return x @ head.T


def routing_margins(config: dict[str, Any], weights: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """[n_layer, n_tokens]: how clear each routing choice is, as the gap between the k-th and the
    (k+1)-th router logit over the logits' spread. MoE routing is discontinuous: rounding (8-bit weights
    and activations) moves a near tie's choice and that token's output by O(1), so the quantized tests
    use checkpoints whose margins are clear."""
    margins: list[np.ndarray] = []
    k = config["num_experts_per_tok"]

    def record(logits: np.ndarray) -> None:
        top = -np.sort(-logits, axis=-1)
        margins.append((top[:, k - 1] - top[:, k]) / logits.std(axis=-1))

    _RECORDER.append(record)
    try:
        hf_moe_logits(config, weights, ids)
    finally:
        _RECORDER.pop()
    return np.array(margins)


_RECORDER: list[Any] = []  # routing_margins' hook into sparse_block
