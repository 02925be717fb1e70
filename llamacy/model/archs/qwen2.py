"""qwen2: Qwen2 / Qwen2.5 — llama with q/k/v biases and NEOX RoPE (rows as Hugging Face stores them)."""

from __future__ import annotations

from typing import Any, ClassVar

from llamacy.convert.hf_spec import LLAMA_LAYERS, QKV_BIAS, ArchSpec, check_qwen
from llamacy.gguf_names import MODEL_TENSOR as T
from llamacy.model.archs.base import Architecture, TensorSpec, attention_tensors, gated_ffn_tensors, vec
from llamacy.model.config import ROPE_NEOX, ModelConfig, common_hparams


class Qwen2(Architecture):
    name = "qwen2"
    hf: ClassVar[dict[str, ArchSpec]] = {
        "Qwen2ForCausalLM": ArchSpec("qwen2", {**LLAMA_LAYERS, **QKV_BIAS}, False, 10000.0, check=check_qwen)
    }

    def config(self, md: dict[str, Any], source: str) -> ModelConfig:
        return ModelConfig(**common_hparams(md, "qwen2", source), rope_mode=ROPE_NEOX)

    def layer_tensors(self, cfg: ModelConfig, il: int) -> list[TensorSpec]:
        E = cfg.n_embd
        return [
            vec("attn_norm", T.ATTN_NORM, il, E),
            *attention_tensors(cfg, il, bias=True),
            vec("ffn_norm", T.FFN_NORM, il, E),
            *gated_ffn_tensors(cfg, il),
        ]
