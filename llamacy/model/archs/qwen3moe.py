"""qwen3moe: Qwen3 MoE — qwen3's attention, every layer a mixture with the routed weights renormalised
over the chosen experts (norm_topk_prob)."""

from __future__ import annotations

from typing import Any, ClassVar

from llamacy.convert.hf_moe import QWEN_EXPERTS
from llamacy.convert.hf_spec import MOE_ATTN, QK_NORMS, ArchSpec, HFConfig, check_moe, check_qwen
from llamacy.errors import UnsupportedModelError
from llamacy.gguf_names import MODEL_TENSOR as T
from llamacy.model.archs.base import Architecture, TensorSpec, attention_tensors, moe_tensors, vec
from llamacy.model.config import ROPE_NEOX, ModelConfig, common_hparams, expert_hparams


def _check(c: HFConfig) -> None:
    check_qwen(c)
    check_moe(c, True)


class Qwen3Moe(Architecture):
    name = "qwen3moe"
    hf: ClassVar[dict[str, ArchSpec]] = {
        "Qwen3MoeForCausalLM": ArchSpec(
            "qwen3moe",
            {**MOE_ATTN, **QK_NORMS, "mlp.gate.weight": "ffn_gate_inp.weight"},
            False,
            10000.0,
            check=_check,
            experts=QWEN_EXPERTS,
        )
    }

    def config(self, md: dict[str, Any], source: str) -> ModelConfig:
        experts = expert_hparams(md, "qwen3moe", source, norm=True)
        if not experts:
            raise UnsupportedModelError(f"{source}: qwen3moe.expert_count is missing")
        return ModelConfig(**common_hparams(md, "qwen3moe", source), **experts, rope_mode=ROPE_NEOX)

    def layer_tensors(self, cfg: ModelConfig, il: int) -> list[TensorSpec]:
        E = cfg.n_embd
        return [
            vec("attn_norm", T.ATTN_NORM, il, E),
            *attention_tensors(cfg, il, qk_norm=True),
            vec("ffn_norm", T.FFN_NORM, il, E),
            *moe_tensors(cfg, il),
        ]
