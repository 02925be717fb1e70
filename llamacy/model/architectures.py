"""Where the supported architectures differ, one small function each, and the registry of them.

Everything else (the layer loop, the weights' layout) is shared: an architecture is a ModelConfig plus
the optional tensors it brings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from llamacy.errors import UnsupportedModelError
from llamacy.model.config import (
    ROPE_NEOX,
    ROPE_NORM,
    MetadataReader,
    ModelConfig,
    common_hparams,
    expert_hparams,
)


def llama(md: dict[str, Any], source: str) -> ModelConfig:
    # Llama 1/2/3, SmolLM, TinyLlama, Mistral: convert_hf_to_gguf permutes Q/K so RoPE rotates pairs.
    # Mixtral is llama with experts: top-k of the router logits, softmax over those k (= softmax over all,
    # renormalised over the k chosen).
    scale = MetadataReader(md, "llama", source).float("attention.scale", 0.0)
    experts = expert_hparams(md, "llama", source, norm=True)
    return ModelConfig(
        **common_hparams(md, "llama", source), **experts, rope_mode=ROPE_NORM, attn_scale=scale
    )


def qwen2(md: dict[str, Any], source: str) -> ModelConfig:
    return ModelConfig(**common_hparams(md, "qwen2", source), rope_mode=ROPE_NEOX, qkv_bias=True)


def qwen3(md: dict[str, Any], source: str) -> ModelConfig:
    return ModelConfig(**common_hparams(md, "qwen3", source), rope_mode=ROPE_NEOX, qk_norm=True)


def qwen2moe(md: dict[str, Any], source: str) -> ModelConfig:
    # Qwen1.5-MoE / Qwen2-MoE: routed weights not renormalised (llama.cpp's build_moe_ffn, norm_w false),
    # plus a shared expert scaled by sigmoid(ffn_gate_inp_shexp . x).
    experts = expert_hparams(md, "qwen2moe", source, norm=False)
    if not experts:
        raise UnsupportedModelError(f"{source}: qwen2moe.expert_count is missing")
    return ModelConfig(
        **common_hparams(md, "qwen2moe", source), **experts, rope_mode=ROPE_NEOX, qkv_bias=True
    )


def qwen3moe(md: dict[str, Any], source: str) -> ModelConfig:
    # Qwen3 MoE: routed weights renormalised over the chosen experts (norm_topk_prob).
    experts = expert_hparams(md, "qwen3moe", source, norm=True)
    if not experts:
        raise UnsupportedModelError(f"{source}: qwen3moe.expert_count is missing")
    return ModelConfig(**common_hparams(md, "qwen3moe", source), **experts, rope_mode=ROPE_NEOX, qk_norm=True)


def gemma3(md: dict[str, Any], source: str) -> ModelConfig:
    hp = common_hparams(md, "gemma3", source)
    r = MetadataReader(md, "gemma3", source)
    if "gemma3.attention.sliding_window_pattern" in md:
        raise UnsupportedModelError(f"{source}: an explicit gemma3 sliding_window_pattern is not supported")
    window = r.int("attention.sliding_window", 0, minimum=0)
    # Five local (sliding-window) layers, then one global; local layers use RoPE base 10000 (or the file's
    # rope.freq_base_swa) unscaled, global ones the file's base and scaling (llama.cpp: set_swa_pattern(6)).
    pattern = 6
    is_local = [window > 0 and il % pattern < pattern - 1 for il in range(hp["n_layer"])]
    base_local = r.float("rope.freq_base_swa", 10000.0)
    # Query scale 1/sqrt(key_length), except the 27B (62 layers): 1/sqrt(n_embd / n_head).
    scale_dim = hp["n_embd"] / hp["n_head"] if hp["n_layer"] == 62 else hp["head_dim"]
    return ModelConfig(
        **hp,
        rope_mode=ROPE_NEOX,
        activation="gelu",
        embd_scale=math.sqrt(hp["n_embd"]),
        attn_scale=1.0 / math.sqrt(scale_dim),
        final_softcap=r.float("final_logit_softcapping", 0.0),
        qk_norm=True,
        post_norms=True,
        layer_window=[window if loc else 0 for loc in is_local],
        layer_rope_base=[base_local if loc else hp["rope_base"] for loc in is_local],
        layer_rope_freq_scale=[1.0 if loc else hp["rope_freq_scale"] for loc in is_local],
    )


ARCHITECTURES: dict[str, Callable[[dict[str, Any], str], ModelConfig]] = {
    "llama": llama,
    "qwen2": qwen2,
    "qwen3": qwen3,
    "qwen2moe": qwen2moe,
    "qwen3moe": qwen3moe,
    "gemma3": gemma3,
}


def config_from_metadata(md: dict[str, Any], source: str) -> ModelConfig:
    arch = md.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{source}: architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    return ARCHITECTURES[arch](md, source)
