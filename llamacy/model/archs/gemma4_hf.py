"""Hugging Face Gemma 4 checkpoints (Gemma4ForConditionalGeneration, Gemma4ForCausalLM) -> GGUF gemma4, with
the conventions of llama.cpp's convert_hf_to_gguf.py (Gemma4Model):
- the text model's keys come from text_config; its tensors are model.language_model.* (renamed model.*);
  the vision and audio towers and their projections are not converted (said on stderr);
- norms as stored (norm_shift 0: Gemma 4's RMSNorm multiplies by w); layer_scalar -> layer_output_scale;
- key_length / value_length are the full layers' head size (global_head_dim), *_swa the sliding layers';
  head_count_kv is a per-layer array when num_global_key_value_heads is given, feed_forward_length when
  use_double_wide_mlp doubles the shared-KV layers' width; sliding_window_pattern a per-layer array;
- rope.dimension_count is the full head size, with rope_freqs (1 for the rotated pairs, 1e30 for the rest)
  giving the full layers' "proportional" RoPE; rope.dimension_count_swa = head_dim * partial_rotary_factor.
- the mixture-of-experts form (26B-A4B): router.proj -> ffn_gate_inp, router.scale -> ffn_gate_inp.scale,
  router.per_expert_scale -> ffn_down_exps.scale, experts.gate_up_proj / down_proj as stored (3-D);
What the engine would compute differently is refused: other activations, other RoPE types, attention biases,
bidirectional attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from llamacy.convert.hf_spec import LAYER_COMMON, QK_NORMS, ArchSpec, HFConfig, check_act
from llamacy.errors import UnsupportedModelError

if TYPE_CHECKING:  # annotations only: importing gguf whole costs start-up (llamacy.gguf_names)
    from gguf import GGUFWriter

_TEXT = "model.language_model."
_TOWERS = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")


def _config_view(raw: dict[str, Any]) -> dict[str, Any]:
    text = raw.get("text_config")
    view = {**raw, **text} if isinstance(text, dict) else dict(raw)
    view.setdefault("tie_word_embeddings", raw.get("tie_word_embeddings", True))
    return view


def _rename(name: str) -> str:
    return "model." + name[len(_TEXT) :] if name.startswith(_TEXT) else name


def _skip(name: str) -> str | None:
    return "vision/audio tower (not part of the text model)" if name.startswith(_TOWERS) else None


def _sliding(c: HFConfig) -> list[bool]:
    types = c.get("layer_types")
    if types is None or len(types) != c.n_layer:
        raise UnsupportedModelError(f"{c.path}: layer_types must name each of the {c.n_layer} layers")
    return [t == "sliding_attention" for t in types]


def _first_shared(c: HFConfig) -> int:
    return c.n_layer - int(c.get("num_kv_shared_layers", 0))


def _layer(c: HFConfig, il: int) -> dict[str, Any]:
    """What Gemma4TextAttention / Gemma4TextMLP make of layer il."""
    sliding = _sliding(c)[il]
    k_eq_v = bool(c.get("attention_k_eq_v", False)) and not sliding
    shared = il >= _first_shared(c) > 0
    wide = bool(c.get("use_double_wide_mlp", False)) and shared
    return {
        "head_dim": c.head_dim if sliding else int(c.get("global_head_dim", c.head_dim)),
        "n_kv": int(c.get("num_global_key_value_heads", c.n_head_kv)) if k_eq_v else c.n_head_kv,
        "k_eq_v": k_eq_v,
        "shared": shared,
        "n_ff": c.n_ff * (2 if wide else 1),
    }


def _moe(c: HFConfig) -> bool:
    return bool(c.get("enable_moe_block", False))


def _check(c: HFConfig) -> None:
    check_act(c, "hidden_activation", "gelu_pytorch_tanh", fallback_key="hidden_act")
    if _moe(c) and not 1 <= int(c.get("top_k_experts") or 0) <= int(c.get("num_experts") or 0):
        raise UnsupportedModelError(f"{c.path}: top_k_experts must be 1..num_experts")
    if c.get("attention_bias", False):
        raise UnsupportedModelError(f"{c.path}: Gemma 4 attention biases are not supported")
    if c.get("use_bidirectional_attention") == "all":
        raise UnsupportedModelError(f"{c.path}: bidirectional attention is not supported")
    if c.get("attn_logit_softcapping") is not None:
        raise UnsupportedModelError(f"{c.path}: attention-logit softcapping is not supported")
    sliding = _sliding(c)
    first = _first_shared(c)
    if first < c.n_layer and not all(
        any(sliding[j] == sliding[i] for j in range(first)) for i in range(first, c.n_layer)
    ):
        raise UnsupportedModelError(f"{c.path}: a shared-KV layer has no earlier layer of its kind")
    rp = c.get("rope_parameters", {})
    if (rp.get("sliding_attention") or {}).get("rope_type", "default") != "default":
        raise UnsupportedModelError(f"{c.path}: sliding layers' RoPE must be the default one")
    full = rp.get("full_attention") or {}
    if (
        full.get("rope_type", "default") not in ("default", "proportional")
        or float(full.get("factor", 1.0)) != 1.0
    ):
        raise UnsupportedModelError(f"{c.path}: full layers' RoPE {full.get('rope_type')!r} is not supported")
    P = int(c.get("hidden_size_per_layer_input", 0) or 0)
    if P and int(c.get("vocab_size_per_layer_input", c.n_vocab)) != c.n_vocab:
        raise UnsupportedModelError(f"{c.path}: vocab_size_per_layer_input differs from vocab_size")


def _layer_shapes(c: HFConfig, il: int) -> dict[str, tuple[int, ...] | None]:
    s = _layer(c, il)
    E, HD, F, P = c.n_embd, s["head_dim"], s["n_ff"], int(c.get("hidden_size_per_layer_input", 0) or 0)
    QW, KVW = c.n_head * HD, s["n_kv"] * HD
    return {
        "attn_q.weight": (QW, E),
        "attn_k.weight": (KVW, E),
        "attn_v.weight": None if s["k_eq_v"] else (KVW, E),
        "attn_output.weight": (E, QW),
        "attn_q_norm.weight": (HD,),
        "attn_k_norm.weight": (HD,),
        "ffn_gate.weight": (F, E),
        "ffn_up.weight": (F, E),
        "ffn_down.weight": (E, F),
        "layer_output_scale.weight": (1,),
        "inp_gate.weight": (P, E) if P else None,
        "proj.weight": (E, P) if P else None,
        "post_norm.weight": (E,) if P else None,
        **_moe_shapes(c),
    }


def _moe_shapes(c: HFConfig) -> dict[str, tuple[int, ...] | None]:
    """Gemma4TextRouter / Gemma4TextExperts as llama.cpp's converter writes them (3-D experts as stored)."""
    moe = _moe(c)
    E, NE, FE = c.n_embd, int(c.get("num_experts") or 0), int(c.get("moe_intermediate_size") or 0)
    shapes: dict[str, tuple[int, ...]] = {
        "ffn_gate_inp.weight": (NE, E),
        "ffn_gate_inp.scale": (E,),
        "ffn_down_exps.scale": (NE,),
        "ffn_gate_up_exps.weight": (NE, 2 * FE, E),
        "ffn_down_exps.weight": (NE, E, FE),
        "pre_ffw_norm_2.weight": (E,),
        "post_ffw_norm_1.weight": (E,),
        "post_ffw_norm_2.weight": (E,),
    }
    return {k: v if moe else None for k, v in shapes.items()}


def _layer_optional(c: HFConfig, il: int) -> frozenset[str]:
    # HF's shared-KV layers have no K/V weights (llama.cpp loads them where a checkpoint has them).
    if _layer(c, il)["shared"]:
        return frozenset({"attn_k.weight", "attn_v.weight", "attn_k_norm.weight"})
    return frozenset()


def _global_shapes(c: HFConfig) -> dict[str, tuple[int, ...]]:
    P = int(c.get("hidden_size_per_layer_input", 0) or 0)
    if not P:
        return {}
    LP = c.n_layer * P
    return {
        "per_layer_token_embd.weight": (c.n_vocab, LP),
        "per_layer_model_proj.weight": (LP, c.n_embd),
        "per_layer_proj_norm.weight": (P,),
    }


def _extra_tensors(c: HFConfig) -> list[tuple[str, Any]]:
    """Gemma4Model.generate_extra_tensors: proportional RoPE of the full layers as frequency factors."""
    full = c.get("rope_parameters", {}).get("full_attention") or {}
    hd = int(c.get("global_head_dim", c.head_dim))
    factor = float(full.get("partial_rotary_factor", 1.0)) if full.get("rope_type") == "proportional" else 1.0
    n_rot = int(hd * factor / 2)
    return [("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (hd // 2 - n_rot), np.float32))]


def _overrides(c: HFConfig) -> dict[str, Any]:
    sliding = _sliding(c)
    out: dict[str, Any] = {"key_length": int(c.get("global_head_dim", c.head_dim))}
    if c.get("use_double_wide_mlp", False):
        out["feed_forward_length"] = [_layer(c, il)["n_ff"] for il in range(c.n_layer)]
    if c.get("num_global_key_value_heads") is not None:
        g = int(c.get("num_global_key_value_heads"))
        out["head_count_kv"] = [c.n_head_kv if s else g for s in sliding]
    return out


def _metadata(w: GGUFWriter, c: HFConfig) -> None:
    sliding = _sliding(c)
    if _moe(c):
        w.add_expert_count(int(c.get("num_experts")))
        w.add_expert_used_count(int(c.get("top_k_experts")))
        w.add_expert_feed_forward_length(int(c.get("moe_intermediate_size")))
    w.add_shared_kv_layers(int(c.get("num_kv_shared_layers", 0)))
    w.add_embedding_length_per_layer_input(int(c.get("hidden_size_per_layer_input", 0) or 0))
    w.add_sliding_window_pattern(sliding)
    w.add_key_length_swa(c.head_dim)
    w.add_value_length_swa(c.head_dim)
    w.add_rope_dimension_count(int(c.get("global_head_dim", c.head_dim)))
    w.add_rope_dimension_count_swa(int(c.head_dim * float(c.get("partial_rotary_factor", 1.0))))
    w.add_sliding_window(int(c.get("sliding_window", 512)))
    local = (c.get("rope_parameters", {}).get("sliding_attention") or {}).get("rope_theta")
    if local is not None:
        w.add_rope_freq_base_swa(float(local))
    if c.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(float(c.get("final_logit_softcapping")))


_LAYERS = {
    **LAYER_COMMON,
    **QK_NORMS,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
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
_GLOBALS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}


def _spec() -> ArchSpec:
    return ArchSpec(
        "gemma4",
        _LAYERS,
        True,
        1_000_000.0,
        check=_check,
        global_map=dict(_GLOBALS),
        metadata=_metadata,
        tokenizer=lambda w, c: w.add_add_space_prefix(False),  # as Gemma4Model.set_vocab
        context_default=131072,
        config_view=_config_view,
        rename=_rename,
        skip=_skip,
        layer_shapes=_layer_shapes,
        layer_optional=_layer_optional,
        global_shapes=_global_shapes,
        extra_tensors=_extra_tensors,
        overrides=_overrides,
    )


HF_SPECS: dict[str, ArchSpec] = {"Gemma4ForConditionalGeneration": _spec(), "Gemma4ForCausalLM": _spec()}
