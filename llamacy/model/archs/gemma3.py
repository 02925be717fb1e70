"""gemma3: Gemma 3 text models — sandwich norms, GELU-tanh gated FFN, per-head q/k norms, embeddings scaled
by sqrt(n_embd), five sliding-window layers to one global (llama.cpp: set_swa_pattern(6)); local layers use
RoPE base 10000 (or the file's rope.freq_base_swa) unscaled, global ones the file's base and scaling.

Conversion stores every *norm.weight as 1 + w (Gemma's RMSNorm multiplies by 1 + w, llama.cpp by w).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from llamacy.convert.hf_spec import LAYER_COMMON, QK_NORMS, ArchSpec, HFConfig, check_act, check_rope
from llamacy.errors import UnsupportedModelError
from llamacy.gguf_names import MODEL_TENSOR as T
from llamacy.model.archs.base import (
    Architecture,
    TensorSpec,
    attention_tensors,
    gated_ffn_tensors,
    vec,
)
from llamacy.model.config import ROPE_NEOX, MetadataReader, ModelConfig, common_hparams

if TYPE_CHECKING:  # annotations only: importing gguf whole costs start-up (llamacy.gguf_names)
    from gguf import GGUFWriter

PATTERN = 6  # every 6th layer global, the others sliding-window


def _check(c: HFConfig) -> None:
    check_act(c, "hidden_activation", "gelu_pytorch_tanh", fallback_key="hidden_act")
    if c.get("attn_logit_softcapping") is not None:
        raise UnsupportedModelError(f"{c.path}: Gemma 3 attention-logit softcapping is not supported")
    # llama.cpp scales queries by 1/sqrt(head_dim), or 1/sqrt(n_embd / n_head) for the 27B (62 layers).
    expected = c.n_embd / c.n_head if c.n_layer == 62 else c.head_dim
    scalar = c.get("query_pre_attn_scalar", expected)
    if not math.isclose(float(scalar), float(expected)):
        raise UnsupportedModelError(
            f"{c.path}: query_pre_attn_scalar {scalar} (llama.cpp assumes {expected:g})"
        )
    layer_types = c.get("layer_types")
    if layer_types is not None:
        sliding = [t == "sliding_attention" for t in layer_types]
    else:
        period = int(c.get("sliding_window_pattern", PATTERN))
        sliding = [(i + 1) % period != 0 for i in range(c.n_layer)]
    if c.get("sliding_window") is not None and sliding != [
        i % PATTERN < PATTERN - 1 for i in range(c.n_layer)
    ]:
        raise UnsupportedModelError(
            f"{c.path}: sliding-window layers other than every 6th global are not supported"
        )
    check_rope(c, ("default", "linear"))


def _metadata(w: GGUFWriter, c: HFConfig) -> None:
    if c.get("sliding_window") is not None:
        w.add_sliding_window(int(c.get("sliding_window")))
    local = c.get("rope_parameters", {}).get("sliding_attention", {}).get("rope_theta")
    local = local or c.get("rope_local_base_freq")
    if local is not None:
        w.add_rope_freq_base_swa(float(local))
    if c.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(float(c.get("final_logit_softcapping")))


class Gemma3(Architecture):
    name = "gemma3"
    hf: ClassVar[dict[str, ArchSpec]] = {
        "Gemma3ForCausalLM": ArchSpec(
            "gemma3",
            {
                **LAYER_COMMON,
                **QK_NORMS,
                "post_attention_layernorm.weight": "post_attention_norm.weight",
                "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
            },
            True,
            1_000_000.0,
            norm_plus_one=True,
            check=_check,
            metadata=_metadata,
            # as convert_hf_to_gguf's Gemma3Model.set_vocab
            tokenizer=lambda w, c: w.add_add_space_prefix(False),
            context_default=131072,
            key_length=True,
        )
    }

    def config(self, md: dict[str, Any], source: str) -> ModelConfig:
        hp = common_hparams(md, "gemma3", source)
        r = MetadataReader(md, "gemma3", source)
        if "gemma3.attention.sliding_window_pattern" in md:
            raise UnsupportedModelError(
                f"{source}: an explicit gemma3 sliding_window_pattern is not supported"
            )
        window = r.int("attention.sliding_window", 0, minimum=0)
        is_local = [window > 0 and il % PATTERN < PATTERN - 1 for il in range(hp["n_layer"])]
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
            layer_window=[window if loc else 0 for loc in is_local],
            layer_rope_base=[base_local if loc else hp["rope_base"] for loc in is_local],
            layer_rope_freq_scale=[1.0 if loc else hp["rope_freq_scale"] for loc in is_local],
        )

    def layer_tensors(self, cfg: ModelConfig, il: int) -> list[TensorSpec]:
        E = cfg.n_embd
        return [
            vec("attn_norm", T.ATTN_NORM, il, E),
            *attention_tensors(cfg, il, qk_norm=True),
            vec("post_attn_norm", T.ATTN_POST_NORM, il, E),
            vec("ffn_norm", T.FFN_PRE_NORM, il, E),  # the gguf table's name for Gemma's pre-FFN norm
            *gated_ffn_tensors(cfg, il),
            vec("post_ffn_norm", T.FFN_POST_NORM, il, E),
        ]
