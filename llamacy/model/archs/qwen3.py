"""qwen3: Qwen3 dense — llama with per-head q/k RMSNorm before NEOX RoPE and an explicit head size."""

from __future__ import annotations

from typing import Any, ClassVar

from llamacy.convert.hf_spec import LLAMA_LAYERS, QK_NORMS, ArchSpec, check_qwen
from llamacy.gguf_names import MODEL_TENSOR as T
from llamacy.model.archs.base import Architecture, TensorSpec, attention_tensors, gated_ffn_tensors, vec
from llamacy.model.config import ROPE_NEOX, ModelConfig, common_hparams


class Qwen3(Architecture):
    name = "qwen3"
    hf: ClassVar[dict[str, ArchSpec]] = {
        "Qwen3ForCausalLM": ArchSpec("qwen3", {**LLAMA_LAYERS, **QK_NORMS}, False, 10000.0, check=check_qwen)
    }

    def config(self, md: dict[str, Any], source: str) -> ModelConfig:
        return ModelConfig(**common_hparams(md, "qwen3", source), rope_mode=ROPE_NEOX)

    def layer_tensors(self, cfg: ModelConfig, il: int) -> list[TensorSpec]:
        E = cfg.n_embd
        return [
            vec("attn_norm", T.ATTN_NORM, il, E),
            *attention_tensors(cfg, il, qk_norm=True),
            vec("ffn_norm", T.FFN_NORM, il, E),
            *gated_ffn_tensors(cfg, il),
        ]
