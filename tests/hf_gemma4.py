"""Tiny random Gemma4ForConditionalGeneration checkpoints, a float64 forward pass written from Hugging Face's
modeling_gemma4.py, and llama.cpp's conversion of one done by hand (a GGUF "gemma4" file).

The checkpoint is in Hugging Face's layout: text weights under model.language_model., a (tiny) vision tower
the converter skips, config.json with text_config (layer_types, head_dim / global_head_dim,
num_key_value_heads / num_global_key_value_heads with attention_k_eq_v, num_kv_shared_layers with
use_double_wide_mlp, hidden_size_per_layer_input, rope_parameters per layer type with proportional RoPE on
full layers, final_logit_softcapping). Its shape exercises every per-layer difference of Gemma 4:

    model = write_gemma4_hf_model(tmp_path / "g4")        # HFModel: .path, .config, .weights, .logits()
    path = write_llama_cpp_gguf(model, tmp_path / "g4.gguf")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter

TEXT = "model.language_model."
# Layers 0..5: sliding, sliding, full, sliding, sliding, full; the last two share the K/V of layers 3 and 2.
# The 26B-A4B form, tiny: every layer a dense FFN plus 4 experts (2 per token); no shared KV, no per-layer
# embeddings (as the 26B's config).
MOE = {
    "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32,
    "num_kv_shared_layers": 0, "use_double_wide_mlp": False, "hidden_size_per_layer_input": 0,
}  # fmt: skip
LAYER_TYPES = ["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"]


def gemma4_text_config(n_vocab: int, **overrides: Any) -> dict[str, Any]:
    """A Gemma4TextConfig's keys (configuration_gemma4.py), tiny."""
    cfg: dict[str, Any] = {
        "model_type": "gemma4_text", "vocab_size": n_vocab, "vocab_size_per_layer_input": n_vocab,
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": len(LAYER_TYPES),
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_global_key_value_heads": 1,
        "head_dim": 16, "global_head_dim": 32, "attention_k_eq_v": True, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "sliding_window": 6, "layer_types": list(LAYER_TYPES), "final_logit_softcapping": 30.0,
        "hidden_size_per_layer_input": 8, "num_kv_shared_layers": 2, "use_double_wide_mlp": True,
        "enable_moe_block": False, "attention_bias": False,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        },
        "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
    }  # fmt: skip
    cfg.update(overrides)
    return cfg


def layer_shape(c: dict[str, Any], il: int) -> dict[str, Any]:
    """What Gemma4TextAttention / Gemma4TextMLP make of layer il."""
    sliding = c["layer_types"][il] == "sliding_attention"
    first_shared = c["num_hidden_layers"] - c["num_kv_shared_layers"]
    shared = il >= first_shared > 0
    k_eq_v = c["attention_k_eq_v"] and not sliding
    prev = c["layer_types"][:first_shared]
    return {
        "sliding": sliding,
        "head_dim": c["head_dim"] if sliding else c["global_head_dim"],
        "n_kv": c["num_global_key_value_heads"] if k_eq_v else c["num_key_value_heads"],
        "k_eq_v": k_eq_v,
        "shared": shared,
        "store": not shared and il == len(prev) - 1 - prev[::-1].index(c["layer_types"][il]),
        "n_ff": c["intermediate_size"] * (2 if c["use_double_wide_mlp"] and shared else 1),
    }


def write_gemma4_hf_model(directory: Path, *, dtype: str = "f32", seed: int = 0, **overrides: Any) -> Any:
    """A random Gemma4ForConditionalGeneration checkpoint; returns test_convert's HFModel whose config is
    the text config (its .logits() is gemma4_logits)."""
    from tests.test_convert import HFModel, n_tokens, save_safetensors, stored_values, write_spm_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    write_spm_tokenizer(directory)
    n_vocab = -(-n_tokens(directory) // 32) * 32 + 32
    c = gemma4_text_config(n_vocab, **overrides)
    top = {
        "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": c,
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 16}, "audio_config": None,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    }  # fmt: skip
    (directory / "config.json").write_text(json.dumps(top))
    rng = np.random.default_rng(seed)
    E, NH, P, L = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["hidden_size_per_layer_input"],
        c["num_hidden_layers"],
    )

    def linear(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n: int) -> np.ndarray:  # Gemma 4 multiplies by w: around 1
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w: dict[str, np.ndarray] = {
        TEXT + "embed_tokens.weight": (0.5 * rng.standard_normal((n_vocab, E))).astype(np.float32)
    }
    if P:
        w[TEXT + "embed_tokens_per_layer.weight"] = (0.5 * rng.standard_normal((n_vocab, L * P))).astype(
            np.float32
        )
        w[TEXT + "per_layer_model_projection.weight"] = linear(L * P, E)
        w[TEXT + "per_layer_projection_norm.weight"] = norm(P)
    for il in range(L):
        s, p = layer_shape(c, il), f"{TEXT}layers.{il}."
        HD, KV = s["head_dim"], s["n_kv"] * s["head_dim"]
        w[p + "input_layernorm.weight"] = norm(E)
        w[p + "self_attn.q_proj.weight"] = linear(NH * HD, E)
        w[p + "self_attn.q_norm.weight"] = norm(HD)
        if not s["shared"]:  # shared layers have no K/V weights (Gemma4TextAttention)
            w[p + "self_attn.k_proj.weight"] = linear(KV, E)
            w[p + "self_attn.k_norm.weight"] = norm(HD)
            if not s["k_eq_v"]:
                w[p + "self_attn.v_proj.weight"] = linear(KV, E)
        w[p + "self_attn.o_proj.weight"] = linear(E, NH * HD)
        w[p + "post_attention_layernorm.weight"] = norm(E)
        w[p + "pre_feedforward_layernorm.weight"] = norm(E)
        w[p + "mlp.gate_proj.weight"] = linear(s["n_ff"], E)
        w[p + "mlp.up_proj.weight"] = linear(s["n_ff"], E)
        w[p + "mlp.down_proj.weight"] = linear(E, s["n_ff"])
        w[p + "post_feedforward_layernorm.weight"] = norm(E)
        if c["enable_moe_block"]:  # Gemma4TextRouter, Gemma4TextExperts and the extra norms
            NE, FE = c["num_experts"], c["moe_intermediate_size"]
            w[p + "router.proj.weight"] = linear(NE, E) * np.float32(4.0)  # routing well away from ties
            w[p + "router.scale"] = norm(E)
            w[p + "router.per_expert_scale"] = rng.uniform(0.5, 1.5, NE).astype(np.float32)
            w[p + "experts.gate_up_proj"] = np.stack([linear(2 * FE, E) for _ in range(NE)])
            w[p + "experts.down_proj"] = np.stack([linear(E, FE) for _ in range(NE)])
            for n in (
                "pre_feedforward_layernorm_2",
                "post_feedforward_layernorm_1",
                "post_feedforward_layernorm_2",
            ):
                w[p + n + ".weight"] = norm(E)
        w[p + "layer_scalar"] = rng.uniform(0.5, 1.5, 1).astype(np.float32)
        if P:
            w[p + "per_layer_input_gate.weight"] = linear(P, E)
            w[p + "per_layer_projection.weight"] = linear(E, P)
            w[p + "post_per_layer_input_norm.weight"] = norm(E)
    w[TEXT + "norm.weight"] = norm(E)
    # A vision tower and its projection: not part of the text model (the converter skips them).
    vision = {
        "model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight": linear(32, 16),
        "model.embed_vision.embedding_projection.weight": linear(E, 16),
    }
    save_safetensors({**w, **vision}, directory / "model.safetensors", dtype)

    class Gemma4HFModel(HFModel):
        def logits(self, ids: list[int]) -> np.ndarray:
            return gemma4_logits(self.config, self.weights, ids)

    return Gemma4HFModel(directory, c, {k: stored_values(v, dtype) for k, v in w.items()})


# -- the float64 forward, from modeling_gemma4.py -----------------------------------------------------


def _rms(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    y = x * (np.mean(x * x, axis=-1, keepdims=True) + eps) ** -0.5  # Gemma4RMSNorm: x * w, no offset
    return y if w is None else y * w


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _inv_freq(c: dict[str, Any], sliding: bool) -> np.ndarray:
    params = c["rope_parameters"]["sliding_attention" if sliding else "full_attention"]
    base = float(params["rope_theta"])
    if params.get("rope_type", "default") == "proportional":  # _compute_proportional_rope_parameters
        hd = c["global_head_dim"]
        angles = int(params.get("partial_rotary_factor", 1.0) * hd // 2)
        rotated = 1.0 / base ** (np.arange(0, 2 * angles, 2, dtype=np.float64) / hd)
        return np.concatenate([rotated, np.zeros(hd // 2 - angles)])
    hd = c["head_dim"]  # Gemma4TextRotaryEmbedding.compute_default_rope_parameters: config.head_dim
    return 1.0 / base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)


def _rope(x: np.ndarray, pos: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """apply_rotary_pos_emb with rotate_half; x [T, heads, hd]."""
    freqs = pos[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def gemma4_logits(c: dict[str, Any], weights: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """Gemma4ForConditionalGeneration's text logits for ids at positions 0..n-1, in float64."""
    W = {k.removeprefix(TEXT): v.astype(np.float64) for k, v in weights.items()}
    eps, E, NH, L = c["rms_norm_eps"], c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    P = c["hidden_size_per_layer_input"]
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    x = W["embed_tokens.weight"][ids] * np.float64(E) ** 0.5
    if P:  # get_per_layer_inputs + project_per_layer_inputs
        tok = (W["embed_tokens_per_layer.weight"][ids] * np.float64(P) ** 0.5).reshape(T, L, P)
        proj = (x @ W["per_layer_model_projection.weight"].T * np.float64(E) ** -0.5).reshape(T, L, P)
        proj = _rms(proj, W["per_layer_projection_norm.weight"], eps)
        ple = (proj + tok) * 2.0**-0.5
    shared: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    causal = np.tril(np.ones((T, T), dtype=bool))
    for il in range(L):
        s, p = layer_shape(c, il), f"layers.{il}."
        HD, kind = s["head_dim"], c["layer_types"][il]
        inv = _inv_freq(c, s["sliding"])
        h = _rms(x, W[p + "input_layernorm.weight"], eps)
        q = _rope(
            _rms(
                (h @ W[p + "self_attn.q_proj.weight"].T).reshape(T, NH, HD),
                W[p + "self_attn.q_norm.weight"],
                eps,
            ),
            pos,
            inv,
        )
        if s["shared"]:
            k, v = shared[kind]
        else:
            k = (h @ W[p + "self_attn.k_proj.weight"].T).reshape(T, s["n_kv"], HD)
            v = k if s["k_eq_v"] else (h @ W[p + "self_attn.v_proj.weight"].T).reshape(T, s["n_kv"], HD)
            k = _rope(_rms(k, W[p + "self_attn.k_norm.weight"], eps), pos, inv)
            v = _rms(v, None, eps)
            if s["store"]:
                shared[kind] = k, v
        mask = causal.copy()
        if s["sliding"]:  # sliding_window_mask_function: kv_idx > q_idx - sliding_window
            mask &= np.arange(T)[None, :] > np.arange(T)[:, None] - c["sliding_window"]
        group = NH // k.shape[1]
        out = np.empty((T, NH, HD))
        for hh in range(NH):
            sc = q[:, hh] @ k[:, hh // group].T  # scaling 1.0
            sc = np.where(mask, sc, -np.inf)
            pr = np.exp(sc - sc.max(axis=1, keepdims=True))
            out[:, hh] = (pr / pr.sum(axis=1, keepdims=True)) @ v[:, hh // group]
        o = out.reshape(T, NH * HD) @ W[p + "self_attn.o_proj.weight"].T
        x = x + _rms(o, W[p + "post_attention_layernorm.weight"], eps)
        h = _rms(x, W[p + "pre_feedforward_layernorm.weight"], eps)
        m = (_gelu(h @ W[p + "mlp.gate_proj.weight"].T) * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[
            p + "mlp.down_proj.weight"
        ].T
        if c.get("enable_moe_block"):
            m = _rms(m, W[p + "post_feedforward_layernorm_1.weight"], eps) + _moe(c, W, p, x, eps)
        x = x + _rms(m, W[p + "post_feedforward_layernorm.weight"], eps)
        if P:
            g = _gelu(x @ W[p + "per_layer_input_gate.weight"].T) * ple[:, il]
            x = x + _rms(
                g @ W[p + "per_layer_projection.weight"].T, W[p + "post_per_layer_input_norm.weight"], eps
            )
        x = x * W[p + "layer_scalar"]
    x = _rms(x, W["norm.weight"], eps)
    logits = x @ W["embed_tokens.weight"].T
    cap = c.get("final_logit_softcapping")
    return cap * np.tanh(logits / cap) if cap else logits


def _moe(c: dict[str, Any], W: dict[str, np.ndarray], p: str, x: np.ndarray, eps: float) -> np.ndarray:
    """Gemma4TextRouter + Gemma4TextExperts on the residual x, post-normed (post_feedforward_layernorm_2)."""
    E, K, FE = c["hidden_size"], c["top_k_experts"], c["moe_intermediate_size"]
    r = _rms(x, None, eps) * W[p + "router.scale"] * np.float64(E) ** -0.5
    logits = r @ W[p + "router.proj.weight"].T
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    h = _rms(x, W[p + "pre_feedforward_layernorm_2.weight"], eps)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        top = np.argsort(-probs[t], kind="stable")[:K]
        wts = probs[t, top] / probs[t, top].sum() * W[p + "router.per_expert_scale"][top]
        for e, wt in zip(top, wts, strict=True):
            gu = W[p + "experts.gate_up_proj"][e] @ h[t]
            out[t] += wt * (W[p + "experts.down_proj"][e] @ (_gelu(gu[:FE]) * gu[FE:]))
    return _rms(out, W[p + "post_feedforward_layernorm_2.weight"], eps)


# -- llama.cpp's conversion, by hand ------------------------------------------------------------------

GLOBAL_NAMES = {
    "embed_tokens.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "layer_scalar": "layer_output_scale.weight",
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
}


def llama_cpp_tensors(c: dict[str, Any], weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """As convert_hf_to_gguf.py's Gemma4Model writes them: renamed (gguf-py's tensor map), norms as
    stored (norm_shift 0), and rope_freqs for the full layers' proportional RoPE (generate_extra_tensors)."""
    full = c["rope_parameters"]["full_attention"]
    n_rot = int(c["global_head_dim"] * full["partial_rotary_factor"] / 2)
    out = {
        "rope_freqs.weight": np.array(
            [1.0] * n_rot + [1e30] * (c["global_head_dim"] // 2 - n_rot), np.float32
        )
    }
    for name, value in weights.items():
        name = name.removeprefix(TEXT)
        if name in GLOBAL_NAMES:
            out[GLOBAL_NAMES[name]] = value
        else:
            _, layer, part = name.split(".", 2)
            out[f"blk.{layer}.{LAYER_NAMES[part]}"] = value
    return out


def write_llama_cpp_gguf(
    model: Any,
    path: Path,
    wtype: QT = QT.F32,
    tensors: dict[str, np.ndarray] | None = None,
    gemma4_vocab: dict[str, Any] | None = None,
) -> Path:
    """The GGUF file llama.cpp's converter writes for this checkpoint (Gemma4Model.set_gguf_parameters).
    With `gemma4_vocab` (tests/test_gemma4_tokenizer.py) the tokenizer is a "gemma4" one, as
    Gemma4Model.set_vocab writes it; without, the Gemma-3-style SentencePiece vocabulary of the checkpoint."""
    from tests.model_factory import _add_tensor, _pad_vocab, _spm_vocab, _write_tokenizer

    c = model.config
    L = c["num_hidden_layers"]
    swa = [t == "sliding_attention" for t in c["layer_types"]]
    shapes = [layer_shape(c, il) for il in range(L)]
    w = GGUFWriter(str(path), "gemma4")
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(L)
    w.add_feed_forward_length([s["n_ff"] for s in shapes])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv([c["num_key_value_heads"] if s else c["num_global_key_value_heads"] for s in swa])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_key_length(c["global_head_dim"])
    w.add_value_length(c["global_head_dim"])
    w.add_key_length_swa(c["head_dim"])
    w.add_value_length_swa(c["head_dim"])
    w.add_rope_freq_base(c["rope_parameters"]["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(c["rope_parameters"]["sliding_attention"]["rope_theta"])
    w.add_rope_dimension_count(c["global_head_dim"])
    w.add_rope_dimension_count_swa(c["head_dim"])
    w.add_sliding_window(c["sliding_window"])
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(c["num_kv_shared_layers"])
    w.add_embedding_length_per_layer_input(c["hidden_size_per_layer_input"])
    w.add_final_logit_softcapping(c["final_logit_softcapping"])
    if c.get("enable_moe_block"):
        w.add_expert_count(c["num_experts"])
        w.add_expert_used_count(c["top_k_experts"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_file_type(int(wtype))
    if gemma4_vocab is not None:
        from tests.test_gemma4_tokenizer import write_gemma4_tokenizer

        write_gemma4_tokenizer(w, gemma4_vocab, n_vocab=c["vocab_size"])
    else:
        vocab = _spm_vocab("gemma3")
        _pad_vocab(vocab, c["vocab_size"])
        _write_tokenizer(w, vocab)
    for name, array in (tensors or llama_cpp_tensors(c, model.weights)).items():
        _add_tensor(w, name, np.asarray(array, np.float32), wtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
