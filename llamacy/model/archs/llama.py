"""llama: Llama 1/2/3, SmolLM, TinyLlama, Mistral, and Mixtral (llama with experts).

convert_hf_to_gguf permutes Q/K rows so that RoPE rotates adjacent pairs (GGUF's "normal" mode) where
Hugging Face rotates halves. Mixtral routes a token to the top-k of its router logits with a softmax over
those k (= softmax over all, renormalised over the k chosen).
"""

from __future__ import annotations

from typing import Any, ClassVar

from llamacy.convert.hf_moe import MIXTRAL_EXPERTS
from llamacy.convert.hf_spec import LLAMA_LAYERS, MOE_ATTN, ArchSpec, HFConfig, check_llama, check_moe
from llamacy.gguf_names import MODEL_TENSOR as T
from llamacy.model.archs.base import (
    Architecture,
    TensorSpec,
    attention_tensors,
    gated_ffn_tensors,
    moe_tensors,
    vec,
)
from llamacy.model.config import ROPE_NORM, MetadataReader, ModelConfig, common_hparams, expert_hparams


def _check_mixtral(c: HFConfig) -> None:
    check_llama(c)
    check_moe(c, True)


class Llama(Architecture):
    name = "llama"
    hf: ClassVar[dict[str, ArchSpec]] = {
        "LlamaForCausalLM": ArchSpec(
            "llama",
            LLAMA_LAYERS,
            False,
            10000.0,
            permute_qk=True,
            check=check_llama,
            vocab_size_key=True,
            rope_dims=lambda c: c.head_dim,
        ),
        "MixtralForCausalLM": ArchSpec(
            "llama",
            {**MOE_ATTN, "block_sparse_moe.gate.weight": "ffn_gate_inp.weight"},
            False,
            1_000_000.0,
            permute_qk=True,
            check=_check_mixtral,
            experts=MIXTRAL_EXPERTS,
            vocab_size_key=True,
            rope_dims=lambda c: c.head_dim,
        ),
    }

    def config(self, md: dict[str, Any], source: str) -> ModelConfig:
        scale = MetadataReader(md, "llama", source).float("attention.scale", 0.0)
        experts = expert_hparams(md, "llama", source, norm=True)
        return ModelConfig(
            **common_hparams(md, "llama", source), **experts, rope_mode=ROPE_NORM, attn_scale=scale
        )

    def layer_tensors(self, cfg: ModelConfig, il: int) -> list[TensorSpec]:
        E = cfg.n_embd
        ffn = moe_tensors(cfg, il) if cfg.n_expert else gated_ffn_tensors(cfg, il)
        return [
            vec("attn_norm", T.ATTN_NORM, il, E),
            *attention_tensors(cfg, il),
            vec("ffn_norm", T.FFN_NORM, il, E),
            *ffn,
        ]
