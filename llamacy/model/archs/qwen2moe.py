"""qwen2moe: Qwen1.5-MoE / Qwen2-MoE — qwen2's attention, every layer a mixture whose routed weights are
not renormalised (llama.cpp's build_moe_ffn, norm_w false), plus a shared expert scaled by
sigmoid(ffn_gate_inp_shexp . x)."""

from __future__ import annotations

from typing import Any, ClassVar

from llamacy.convert.hf_moe import QWEN_EXPERTS
from llamacy.convert.hf_spec import (
    MOE_ATTN,
    QKV_BIAS,
    SHARED_EXPERT,
    ArchSpec,
    HFConfig,
    check_moe,
    check_qwen,
)
from llamacy.errors import UnsupportedModelError
from llamacy.gguf_names import MODEL_TENSOR as T
from llamacy.model.archs.base import Architecture, TensorSpec, attention_tensors, moe_tensors, vec
from llamacy.model.config import ROPE_NEOX, ModelConfig, common_hparams, expert_hparams


def _check(c: HFConfig) -> None:
    check_qwen(c)
    check_moe(c, False)


def _shapes(c: HFConfig) -> dict[str, tuple[int, ...]]:
    fs = c.positive("shared_expert_intermediate_size")
    return {
        "ffn_gate_shexp.weight": (fs, c.n_embd),
        "ffn_up_shexp.weight": (fs, c.n_embd),
        "ffn_down_shexp.weight": (c.n_embd, fs),
        "ffn_gate_inp_shexp.weight": (1, c.n_embd),  # stored [1, n_embd]; written as a vector
    }


class Qwen2Moe(Architecture):
    name = "qwen2moe"
    hf: ClassVar[dict[str, ArchSpec]] = {
        "Qwen2MoeForCausalLM": ArchSpec(
            "qwen2moe",
            {**MOE_ATTN, **QKV_BIAS, "mlp.gate.weight": "ffn_gate_inp.weight", **SHARED_EXPERT},
            False,
            10000.0,
            check=_check,
            experts=QWEN_EXPERTS,
            shapes=_shapes,
            metadata=lambda w, c: w.add_expert_shared_feed_forward_length(
                c.positive("shared_expert_intermediate_size")
            ),
        )
    }

    def config(self, md: dict[str, Any], source: str) -> ModelConfig:
        experts = expert_hparams(md, "qwen2moe", source, norm=False)
        if not experts:
            raise UnsupportedModelError(f"{source}: qwen2moe.expert_count is missing")
        return ModelConfig(**common_hparams(md, "qwen2moe", source), **experts, rope_mode=ROPE_NEOX)

    def layer_tensors(self, cfg: ModelConfig, il: int) -> list[TensorSpec]:
        E = cfg.n_embd
        return [
            vec("attn_norm", T.ATTN_NORM, il, E),
            *attention_tensors(cfg, il, bias=True),
            vec("ffn_norm", T.FFN_NORM, il, E),
            *moe_tensors(cfg, il),
        ]
