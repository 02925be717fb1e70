"""nemotron: Nemotron-4 and Minitron (Hugging Face NemotronForCausalLM).

Following llama.cpp's build for LLM_ARCH_NEMOTRON and its converter's NemotronModel:
- LayerNorm with bias (ggml_norm, then weight and bias) before attention, before the FFN, and at the end.
  Hugging Face's LayerNorm1p multiplies by 1 + w: the converter stores w + 1 for every *norm.weight.
- Attention (biases on q/k/v/o where the file has them: attention_bias), NEOX RoPE over the first rope.dimension_count dimensions of each head
  (partial_rotary_factor · n_embd / n_head), scale 1/sqrt(head_dim).
- An ungated MLP: down(relu(up · x + b_up)²) + b_down (biases where the file has them: mlp_bias).
- An untied output head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from llamacy.convert.hf_spec import ArchSpec, HFConfig, check_act, check_rope, has_key
from llamacy.errors import UnsupportedModelError
from llamacy.gguf_names import MODEL_TENSOR as T
from llamacy.model.archs.base import (
    Architecture,
    TensorSpec,
    attention_tensors,
    norm_tensors,
    ungated_ffn_tensors,
)
from llamacy.model.config import ROPE_NEOX, MetadataReader, ModelConfig, common_hparams

if TYPE_CHECKING:  # annotations only: importing gguf whole costs start-up (llamacy.gguf_names)
    from gguf import GGUFWriter

_EPS_KEYS = ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "norm_eps")
_ROT_KEYS = ("partial_rotary_factor", "rope_pct", "rope_percent")


def _find(c: HFConfig, keys: tuple[str, ...], default: Any = None) -> Any:
    return next((c.get(k) for k in keys if c.get(k) is not None), default)


def _rope_dims(c: HFConfig) -> int:
    return int(float(_find(c, _ROT_KEYS, 1.0)) * c.n_embd) // c.n_head


def _check(c: HFConfig) -> None:
    check_act(c, "hidden_act", "relu2")
    check_rope(c, ("default", "linear"))
    # The converter counts rotary dimensions from n_embd / n_head, Hugging Face from head_dim: where the
    # two differ the file would rotate other dimensions than the model was trained with.
    if int(c.head_dim * float(_find(c, _ROT_KEYS, 1.0))) != _rope_dims(c):
        raise UnsupportedModelError(f"{c.path}: head_dim {c.head_dim} differs from hidden_size / heads")
    if _rope_dims(c) > c.head_dim or _rope_dims(c) % 2:
        raise UnsupportedModelError(
            f"{c.path}: {_rope_dims(c)} rotary dimensions do not fit head size {c.head_dim}"
        )


def _metadata(w: GGUFWriter, c: HFConfig) -> None:
    w.add_layer_norm_eps(float(_find(c, _EPS_KEYS, 1e-5)))


def _tokenizer(w: GGUFWriter, c: HFConfig) -> None:
    # NemotronModel.set_vocab: padding and unknown are ids 0 and 1 whatever the special-tokens map says.
    if not has_key(w, "tokenizer.ggml.padding_token_id"):
        w.add_pad_token_id(0)
    if not has_key(w, "tokenizer.ggml.unknown_token_id"):
        w.add_unk_token_id(1)


_LAYERS = {
    "input_layernorm.weight": "attn_norm.weight",
    "input_layernorm.bias": "attn_norm.bias",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "post_attention_layernorm.bias": "ffn_norm.bias",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _biases(c: HFConfig) -> dict[str, str]:
    names = {}
    if c.get("attention_bias", False):
        names.update(
            {
                f"self_attn.{p}_proj.bias": f"attn_{g}.bias"
                for p, g in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output"))
            }
        )
    if c.get("mlp_bias", False):
        names.update({"mlp.up_proj.bias": "ffn_up.bias", "mlp.down_proj.bias": "ffn_down.bias"})
    return names


def _shapes(c: HFConfig) -> dict[str, tuple[int, ...]]:
    q, kv = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    return {
        "attn_norm.bias": (c.n_embd,),
        "ffn_norm.bias": (c.n_embd,),
        "output_norm.bias": (c.n_embd,),
        "attn_output.bias": (c.n_embd,),
        "ffn_up.bias": (c.n_ff,),
        "ffn_down.bias": (c.n_embd,),
        "attn_q.bias": (q,),
        "attn_k.bias": (kv,),
        "attn_v.bias": (kv,),
    }


class Nemotron(Architecture):
    name = "nemotron"
    output_norm_bias = True
    hf: ClassVar[dict[str, ArchSpec]] = {
        "NemotronForCausalLM": ArchSpec(
            "nemotron",
            _LAYERS,
            False,
            10000.0,
            norm_plus_one=True,
            check=_check,
            global_map={
                "model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight",
                "model.norm.bias": "output_norm.bias",
                "lm_head.weight": "output.weight",
            },
            shapes=_shapes,
            optional_layers=_biases,
            metadata=_metadata,
            tokenizer=_tokenizer,
            vocab_size_key=True,
            rope_dims=_rope_dims,
        )
    }

    def config(self, md: dict[str, Any], source: str) -> ModelConfig:
        hp = common_hparams(md, "nemotron", source)
        hp["rms_eps"] = MetadataReader(md, "nemotron", source).float("attention.layer_norm_epsilon", 1e-5)
        return ModelConfig(
            **hp, rope_mode=ROPE_NEOX, norm="layer", activation="relu2", layer_ffn=["ungated"] * hp["n_layer"]
        )

    def layer_tensors(self, cfg: ModelConfig, il: int) -> list[TensorSpec]:
        E = cfg.n_embd
        return [
            *norm_tensors("attn_norm", T.ATTN_NORM, il, E, with_bias=True),
            *attention_tensors(cfg, il, bias=True, out_bias=True, optional_bias=True),
            *norm_tensors("ffn_norm", T.FFN_NORM, il, E, with_bias=True),
            *ungated_ffn_tensors(cfg, il, optional_bias=True),
        ]
