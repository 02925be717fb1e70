"""Hugging Face Qwen3-Next (Qwen3NextForCausalLM) and Qwen3.5 text (Qwen3_5ForCausalLM,
Qwen3_5MoeForCausalLM) checkpoints -> qwen3next / qwen35 / qwen35moe GGUF, as llama.cpp's
conversion/qwen.py writes them (Qwen3NextModel, _LinearAttentionVReorderBase):
- every RMSNorm weight but the delta-net's gated norm is stored as 1 + w (Hugging Face's zero-centred
  norms compute x·(1 + w));
- A_log is stored as A = -exp(A_log) (ssm_a), dt_bias as ssm_dt.bias, conv1d [channels, 1, K] as
  [channels, K];
- Qwen3-Next's in_proj_qkvz ([q, k, v, z] per key head) becomes attn_qkv ([q…, k…, v…]) and attn_gate (z);
  in_proj_ba is written as is (ssm_ba, [b, a] per key head);
- Qwen3.5's value heads are reordered from grouped by key head to tiled order (v, z, b, a, dt_bias,
  A_log, the v channels of conv1d, out_proj's columns), so that key head h % n_k serves value head h.
The multi-token-prediction (MTP) block is converted as llama.cpp's converter does by default
(_QwenMtpMixin): its decoder layers mtp.layers.i.* (or model.mtp.layers.i.*) become layers
num_hidden_layers + i, full-attention layers with the model's feed-forward, converted as any other; its own
tensors (fc, pre_fc_norm_embedding, pre_fc_norm_hidden, norm) become blk.{num_hidden_layers}.nextn.eh_proj,
enorm, hnorm, shared_head_norm, the norms stored as 1 + w as well. block_count counts the MTP layers and
nextn_predict_layers says how many there are: mtp_num_hidden_layers, or where config.json does not say
(Qwen3-Next) 1 + the last mtp.layers.N of the checkpoint.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import numpy as np

from llamacy.convert.hf_moe import QWEN_EXPERTS
from llamacy.convert.hf_spec import (
    LAYER_COMMON,
    QK_NORMS,
    SHARED_EXPERT,
    ArchSpec,
    HFConfig,
    check_act,
    check_moe,
    check_rope,
)
from llamacy.errors import UnsupportedModelError, UsageError
from llamacy.gguf_names import MODEL_TENSOR as T
from llamacy.gguf_names import TENSOR_NAMES

if TYPE_CHECKING:  # annotations only: importing gguf whole costs start-up (llamacy.gguf_names)
    from gguf import GGUFWriter

Rewrite = list[tuple[str, tuple[int, ...], Callable[[np.ndarray], np.ndarray]]]

_ATTN = {k: v for k, v in LAYER_COMMON.items() if k.startswith(("input_", "self_attn."))}
_COMMON = {**_ATTN, **QK_NORMS, "post_attention_layernorm.weight": "post_attention_norm.weight"}
_DELTANET = {
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
}
_NEXT = {
    "linear_attn.in_proj_qkvz.weight": "attn_qkv.weight",
    "linear_attn.in_proj_ba.weight": "ssm_ba.weight",
}
_35 = {
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
}
_MOE = {"mlp.gate.weight": "ffn_gate_inp.weight", **SHARED_EXPERT}
_DENSE = {k: v for k, v in LAYER_COMMON.items() if k.startswith("mlp.")}


def _nextn(tensor: T) -> str:
    return TENSOR_NAMES[tensor].removeprefix("blk.{bid}.") + ".weight"


# The MTP block's own tensors, under the names llama.cpp's converter gives them on the way (mtp.fc.weight ->
# model.layers.{n_layer}.eh_proj.weight), then as written (blk.{n_layer}.nextn.eh_proj.weight).
_MTP_OWN = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm",
            "norm": "shared_head.norm"}  # fmt: skip
_NEXTN = {
    "eh_proj.weight": _nextn(T.NEXTN_EH_PROJ),
    "enorm.weight": _nextn(T.NEXTN_ENORM),
    "hnorm.weight": _nextn(T.NEXTN_HNORM),
    "shared_head.norm.weight": _nextn(T.NEXTN_SHARED_HEAD_NORM),
}
_MTP_LAYER = re.compile(r"^mtp\.layers\.(\d+)\.")
_ATTN_SUFFIXES = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                  "attn_q_norm.weight", "attn_k_norm.weight")  # fmt: skip
_SSM_SUFFIXES = ("attn_qkv.weight", "attn_gate.weight", "ssm_ba.weight", "ssm_beta.weight", "ssm_alpha.weight",
                 *_DELTANET.values())  # fmt: skip


class _Dims:
    def __init__(self, c: HFConfig) -> None:
        self.nk, self.nv = c.positive("linear_num_key_heads"), c.positive("linear_num_value_heads")
        self.dk, self.dv = c.positive("linear_key_head_dim"), c.positive("linear_value_head_dim")
        self.K = c.positive("linear_conv_kernel_dim")
        if self.nv % self.nk:
            raise UnsupportedModelError(
                f"{c.path}: {self.nv} value heads do not group into {self.nk} key heads"
            )
        self.r = self.nv // self.nk
        self.qk = 2 * self.nk * self.dk
        self.channels = self.qk + self.nv * self.dv


def is_attention(c: HFConfig, il: int) -> bool:
    if il >= c.n_layer:  # an MTP layer: full attention (vLLM's Qwen3NextMultiTokenPredictor)
        return True
    types = c.get("layer_types")
    if types is not None:
        return types[il] == "full_attention"
    return (il + 1) % int(c.get("full_attention_interval", 4)) == 0


def _partial(c: HFConfig) -> float:
    return float(
        c.get("partial_rotary_factor", c.get("rope_parameters", {}).get("partial_rotary_factor", 0.25))
    )


def _check(c: HFConfig) -> None:
    check_act(c, "hidden_act", "silu")
    check_rope(c, ("default",))
    d = _Dims(c)
    if d.dk != d.dv:  # llama.cpp sizes the delta-net state by one head size (ssm.state_size)
        raise UnsupportedModelError(f"{c.path}: delta-net key and value heads of different sizes")
    types = c.get("layer_types")
    if types is not None and (len(types) != c.n_layer or set(types) - {"full_attention", "linear_attention"}):
        raise UnsupportedModelError(f"{c.path}: layer_types is not one of full/linear attention per layer")
    if types is not None:  # llama.cpp's files say full_attention_interval: the pattern must be one
        interval = int(c.get("full_attention_interval", 4))
        if any((t == "full_attention") != ((i + 1) % interval == 0) for i, t in enumerate(types)):
            raise UnsupportedModelError(f"{c.path}: layer_types is not every {interval}th layer attending")
    if c.get("num_experts") is not None:
        check_moe(c, True)


def _shapes(c: HFConfig, fused: bool) -> dict[str, tuple[int, ...]]:
    d, E = _Dims(c), c.n_embd
    q = c.n_head * c.head_dim
    shapes = {
        "attn_q.weight": (2 * q, E),  # q and its gate, interleaved per head
        "post_attention_norm.weight": (E,),
        "ssm_conv1d.weight": (d.channels, 1, d.K),
        "ssm_dt.bias": (d.nv,),
        "ssm_a": (d.nv,),
        "ssm_norm.weight": (d.dv,),
        "ssm_out.weight": (E, d.nv * d.dv),
        "attn_qkv.weight": (d.channels + d.nv * d.dv, E),  # Qwen3-Next's in_proj_qkvz
        "ssm_ba.weight": (2 * d.nv, E),
        _NEXTN["eh_proj.weight"]: (E, 2 * E),  # [embedding, hidden] -> hidden
        **{_NEXTN[k]: (E,) for k in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight")},
    }
    if c.get("num_experts") is not None:
        fs = c.positive("shared_expert_intermediate_size")
        shapes.update({
            "ffn_gate_shexp.weight": (fs, E), "ffn_up_shexp.weight": (fs, E), "ffn_down_shexp.weight": (E, fs),
            "ffn_gate_inp_shexp.weight": (1, E),
        })  # fmt: skip
    if not fused:  # Qwen3.5's projections, each apart
        shapes.update({
            "attn_qkv.weight": (d.channels, E), "attn_gate.weight": (d.nv * d.dv, E),
            "ssm_beta.weight": (d.nv, E), "ssm_alpha.weight": (d.nv, E),
        })  # fmt: skip
    return shapes


def _layer_shapes(c: HFConfig, il: int) -> dict[str, tuple[int, ...] | None]:
    absent = _SSM_SUFFIXES if is_attention(c, il) else _ATTN_SUFFIXES
    if il != c.n_layer:  # the MTP block's own tensors sit in its first layer only
        absent = (*absent, *_NEXTN.values())
    return dict.fromkeys(absent)


def _reorder_v(t: np.ndarray, axis: int, d: _Dims, hd: int) -> np.ndarray:
    """Value heads grouped by key head -> tiled order along axis (conversion/qwen.py's _reorder_v_heads)."""
    t = np.moveaxis(t, axis, 0)
    rest = t.shape[1:]
    t = t.reshape(d.nk, d.r, hd, *rest).swapaxes(0, 1).reshape(-1, *rest)
    return np.moveaxis(t, 0, axis)


def _rewrite(tiled: bool) -> Callable[[HFConfig, str, tuple[int, ...]], Rewrite | None]:
    def rewrite(c: HFConfig, name: str, shape: tuple[int, ...]) -> Rewrite | None:
        suffix = name.split(".", 2)[2] if name.startswith("blk.") else name
        if name == "output_norm.weight" or (suffix.endswith("norm.weight") and suffix != "ssm_norm.weight"):
            return [(name, shape, lambda w: w + np.float32(1.0))]
        if not suffix.startswith(("ssm_", "attn_qkv", "attn_gate")):
            return None
        d = _Dims(c)
        v = tiled and d.r > 1

        def rv(w: np.ndarray, axis: int = 0, hd: int = d.dv, start: int = 0) -> np.ndarray:
            if not v:
                return w
            w = np.moveaxis(w, axis, 0)
            w = np.concatenate([w[:start], _reorder_v(w[start:], 0, d, hd)])
            return np.moveaxis(w, 0, axis)

        if suffix == "ssm_a":
            return [(name, shape, lambda w: -np.exp(rv(w, hd=1)))]
        if suffix == "ssm_dt.bias" or suffix in ("ssm_beta.weight", "ssm_alpha.weight"):
            return [(name, shape, lambda w: rv(w, hd=1))]
        if suffix == "ssm_conv1d.weight":
            return [(name, (shape[0], shape[2]), lambda w: rv(w.reshape(shape)[:, 0, :], start=d.qk))]
        if suffix == "ssm_out.weight":
            return [(name, shape, lambda w: rv(w, axis=1))]
        if suffix == "attn_gate.weight":
            return [(name, shape, lambda w: rv(w))]
        if suffix == "attn_qkv.weight" and shape[0] == d.channels:  # Qwen3.5's in_proj_qkv
            return [(name, shape, lambda w: rv(w, start=d.qk))]
        if suffix == "attn_qkv.weight":  # Qwen3-Next's in_proj_qkvz: [q, k, v, z] per key head
            E, G = shape[1], 2 * d.dk + 2 * d.r * d.dv
            gate = name.replace("attn_qkv", "attn_gate")

            def part(w: np.ndarray, a: int, b: int) -> np.ndarray:
                return w.reshape(d.nk, G, E)[:, a:b].reshape(-1, E)

            def qkv(w: np.ndarray) -> np.ndarray:
                dk, vz = d.dk, 2 * d.dk + d.r * d.dv
                return np.concatenate([part(w, 0, dk), part(w, dk, 2 * dk), part(w, 2 * dk, vz)])

            return [
                (name, (d.channels, E), qkv),
                (gate, (d.nv * d.dv, E), lambda w: part(w, 2 * d.dk + d.r * d.dv, G)),
            ]
        return None

    return rewrite


def _metadata(w: GGUFWriter, c: HFConfig) -> None:
    d = _Dims(c)
    if c.get("num_experts") is not None:
        w.add_expert_shared_feed_forward_length(c.positive("shared_expert_intermediate_size"))
    w.add_ssm_conv_kernel(d.K)
    w.add_ssm_state_size(d.dk)
    w.add_ssm_group_count(d.nk)
    w.add_ssm_time_step_rank(d.nv)
    w.add_ssm_inner_size(d.dv * d.nv)
    w.add_full_attention_interval(int(c.get("full_attention_interval", 4)))


def _metadata_35(w: GGUFWriter, c: HFConfig) -> None:
    _metadata(w, c)
    sections = list(c.get("rope_parameters", {}).get("mrope_section", [11, 11, 10]))
    w.add_rope_dimension_sections([*sections, 0, 0, 0, 0][:4])


def _skip(name: str) -> str | None:
    if name.startswith(("model.visual.", "visual.")):
        return "the vision tower (not part of the text model)"
    return None


# The released Qwen3.5 checkpoints are image-text models (Qwen3_5ForConditionalGeneration): the text model's
# settings sit under text_config and its tensors under model.language_model.*; llama.cpp's converter lifts
# text_config to the top level and drops the "language_model." part of the names, and so do we.
_TEXT = "model.language_model."


def _config_view(raw: dict[str, Any]) -> dict[str, Any]:
    text = raw.get("text_config")
    return {**raw, **text} if isinstance(text, dict) else dict(raw)


def _rename_mtp(name: str) -> str:
    """Some checkpoints keep the MTP block under model.mtp.*: llama.cpp's converter reads it as mtp.*."""
    return name.removeprefix("model.") if name.startswith("model.mtp.") else name


def _rename(name: str) -> str:
    return _rename_mtp("model." + name[len(_TEXT) :] if name.startswith(_TEXT) else name)


def _nextn_blocks(c: HFConfig, names: Collection[str]) -> int:
    """How many MTP layers the checkpoint holds: config.json's mtp_num_hidden_layers (Qwen3.5), or where
    it does not say (Qwen3-Next) 1 + the last mtp.layers.N, as llama.cpp's converter counts them. 0 where
    the checkpoint has no mtp.* tensor at all, whatever config.json says (transformers drops the block
    when it saves a model): llama.cpp's converter would then count a block the file does not hold."""
    if not any(n.startswith("mtp.") for n in names):
        return 0
    said = c.get("mtp_num_hidden_layers", 0)
    if isinstance(said, bool) or not isinstance(said, int) or said < 0:
        raise UsageError(f"{c.path}: mtp_num_hidden_layers must be a non-negative integer, got {said!r}")
    return said or 1 + max((int(m.group(1)) for n in names if (m := _MTP_LAYER.match(n))), default=-1)


def _nextn_rename(c: HFConfig, name: str) -> str:
    """llama.cpp's _QwenMtpMixin.filter_tensors: mtp.layers.i.* is decoder layer num_hidden_layers + i;
    the block's own tensors go to its first layer (mtp.fc.weight -> model.layers.{n_layer}.eh_proj.weight)."""
    m = _MTP_LAYER.match(name)
    if m:
        return f"model.layers.{c.n_layer + int(m.group(1))}.{name[m.end() :]}"
    parts = name.split(".")
    if len(parts) == 3 and parts[0] == "mtp" and parts[1] in _MTP_OWN:
        return f"model.layers.{c.n_layer}.{_MTP_OWN[parts[1]]}.{parts[2]}"
    return name


def _spec(arch: str, layers: dict[str, str], moe: bool, tiled: bool, multimodal: bool = False) -> ArchSpec:
    metadata = _metadata_35 if arch.startswith("qwen35") else _metadata
    extra: dict[str, Any] = dict(experts=QWEN_EXPERTS) if moe else {}
    return ArchSpec(
        arch,
        {**_COMMON, **_DELTANET, **layers, **(_MOE if moe else _DENSE), **_NEXTN},
        False,
        10000.0,
        check=_check,
        shapes=lambda c: _shapes(c, not tiled),
        layer_shapes=_layer_shapes,
        metadata=metadata,
        rope_dims=lambda c: int(c.head_dim * _partial(c)),
        key_length=True,
        skip=_skip,
        rewrite=_rewrite(tiled),
        rename=_rename if multimodal else _rename_mtp,
        nextn_blocks=_nextn_blocks,
        nextn_rename=_nextn_rename,
        **(dict(config_view=_config_view) if multimodal else {}),
        **extra,
    )


QWEN3NEXT_HF: dict[str, ArchSpec] = {"Qwen3NextForCausalLM": _spec("qwen3next", _NEXT, True, False)}
QWEN35_HF: dict[str, ArchSpec] = {
    "Qwen3_5ForCausalLM": _spec("qwen35", _35, False, True),
    "Qwen3_5ForConditionalGeneration": _spec("qwen35", _35, False, True, multimodal=True),
}
QWEN35MOE_HF: dict[str, ArchSpec] = {
    "Qwen3_5MoeForCausalLM": _spec("qwen35moe", _35, True, True),
    "Qwen3_5MoeForConditionalGeneration": _spec("qwen35moe", _35, True, True, multimodal=True),
}
