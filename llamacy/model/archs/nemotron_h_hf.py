"""Hugging Face NemotronHForCausalLM (and its MoE form) -> nemotron_h / nemotron_h_moe, as llama.cpp's
NemotronHModel converter writes them (conversion/nemotron.py, with its GraniteHybrid and Mamba2 parents):

- the layer pattern (hybrid_override_pattern "M*-E" or layers_block_type) becomes the per-layer arrays
  attention.head_count_kv (KV heads on "*" layers, else 0) and feed_forward_length (the MLP's or experts'
  width on "-" / "E" layers, else 0); Mamba2 layers have 0 in both;
- Mamba2 tensors: A stored as -exp(A_log) with shape [n_head, 1], D as [n_head, 1], the conv1d weight
  squeezed to [channels, d_conv], the gated norm reshaped to [n_group, d_inner / n_group], dt_bias as
  ssm_dt.bias; the ssm.* keys (conv_kernel, state_size, group_count, inner_size, time_step_rank = heads);
- experts stacked per layer ([n_expert, rows, cols]), the router's e_score_correction_bias as
  exp_probs_b.bias, the expert keys (shared width and count, weights_norm, weights_scale, group count,
  moe_latent_size).
Refused: checkpoints llama.cpp would run differently (biases, other activations, grouped routing that
excludes groups, dense MLP layers in the MoE form).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from llamacy.convert.hf_moe import ExpertSpec
from llamacy.convert.hf_spec import ArchSpec, HFConfig
from llamacy.errors import UnsupportedModelError

if TYPE_CHECKING:  # annotations only: importing gguf whole costs start-up (llamacy.gguf_names)
    from gguf import GGUFWriter

_KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYERS = {
    "norm.weight": "attn_norm.weight",
    "mixer.in_proj.weight": "ssm_in.weight",
    "mixer.conv1d.weight": "ssm_conv1d.weight",
    "mixer.conv1d.bias": "ssm_conv1d.bias",
    "mixer.dt_bias": "ssm_dt.bias",
    "mixer.A_log": "ssm_a",
    "mixer.D": "ssm_d",
    "mixer.norm.weight": "ssm_norm.weight",
    "mixer.out_proj.weight": "ssm_out.weight",
    "mixer.q_proj.weight": "attn_q.weight",
    "mixer.k_proj.weight": "attn_k.weight",
    "mixer.v_proj.weight": "attn_v.weight",
    "mixer.o_proj.weight": "attn_output.weight",
    "mixer.up_proj.weight": "ffn_up.weight",
    "mixer.down_proj.weight": "ffn_down.weight",
}
_MOE_LAYERS = {
    "mixer.gate.weight": "ffn_gate_inp.weight",
    "mixer.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mixer.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mixer.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}
_LATENT = {
    "mixer.fc1_latent_proj.weight": "ffn_latent_down.weight",
    "mixer.fc2_latent_proj.weight": "ffn_latent_up.weight",
}
EXPERTS = ExpertSpec(
    "mixer.experts",
    {"up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"},
    "n_routed_experts",
    "moe_intermediate_size",
)


def _kinds(raw: dict[str, Any]) -> list[str]:
    pattern = raw.get("hybrid_override_pattern") or raw.get("layers_block_type")
    if isinstance(pattern, str) and all(ch in _KINDS for ch in pattern):
        return [_KINDS[ch] for ch in pattern]
    if isinstance(pattern, list) and all(k in _KINDS.values() for k in pattern):
        return list(pattern)
    raise UnsupportedModelError(f"layer pattern {pattern!r} is not one of M/*/-/E per layer")


def _view(raw: dict[str, Any]) -> dict[str, Any]:
    """config.json with the keys the common converter reads: layer count from the pattern, the norm epsilon
    under its llama name, a feed-forward width for MoE configs that lack one."""
    v = dict(raw)
    kinds = _kinds(raw)
    v["_kinds"] = kinds
    v["num_hidden_layers"] = len(kinds)
    v["rms_norm_eps"] = raw.get("layer_norm_epsilon", raw.get("rms_norm_eps", 1e-5))
    if not raw.get("intermediate_size"):
        v["intermediate_size"] = raw.get("moe_intermediate_size")
    return v


def _ssm(c: HFConfig) -> tuple[int, int, int, int, int]:
    """(d_conv, n_head, head_dim, d_state, n_group) of the Mamba2 layers."""
    return (
        c.positive("conv_kernel", c.get("mamba_d_conv", 4)),
        c.positive("mamba_num_heads"),
        c.positive("mamba_head_dim"),
        c.positive("ssm_state_size"),
        c.positive("n_groups", c.get("mamba_n_groups", 1)),
    )


def _check(c: HFConfig) -> None:
    moe = "n_routed_experts" in c.raw
    for key, want in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        if c.get(key, want) != want:
            raise UnsupportedModelError(f"{c.path}: {key} {c.get(key)!r} is not supported (expected {want})")
    for key in ("attention_bias", "mlp_bias", "use_bias"):
        if c.get(key, False):
            raise UnsupportedModelError(f"{c.path}: {key} is not supported")
    kinds = c.raw["_kinds"]
    if moe and "mlp" in kinds:
        raise UnsupportedModelError(f"{c.path}: dense MLP layers beside experts are not supported")
    if not moe and "moe" in kinds:
        raise UnsupportedModelError(f"{c.path}: MoE layers without n_routed_experts")
    _, nh, _, _, ng = _ssm(c)
    if nh % ng:
        raise UnsupportedModelError(f"{c.path}: {nh} Mamba2 heads do not split into {ng} groups")
    if moe and c.get("n_group", 1) > 1 and c.get("topk_group", 1) < c.get("n_group", 1):
        # llama.cpp's nemotron_h_moe routes over all experts; HF would mask out whole groups.
        raise UnsupportedModelError(
            f"{c.path}: grouped expert routing (topk_group < n_group) is not supported"
        )


def _layer_shapes(c: HFConfig, il: int) -> dict[str, tuple[int, ...] | None]:
    """Every suffix's checkpoint shape in layer il, None where its kind has no such tensor."""
    E, kind = c.n_embd, c.raw["_kinds"][il]
    dc, nh, hd, ds, ng = _ssm(c)
    di, q, kv = nh * hd, c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    conv = di + 2 * ng * ds
    shapes: dict[str, tuple[int, ...] | None] = {
        s: None for s in (*_LAYERS.values(), *_MOE_LAYERS.values(), *_LATENT.values())
    }
    shapes["ffn_up_exps.weight"] = shapes["ffn_down_exps.weight"] = None
    shapes["attn_norm.weight"] = (E,)
    if kind == "mamba":
        shapes.update({
            "ssm_in.weight": (2 * di + 2 * ng * ds + nh, E), "ssm_conv1d.weight": (conv, 1, dc),
            "ssm_conv1d.bias": (conv,) if c.get("use_conv_bias", True) else None, "ssm_dt.bias": (nh,),
            "ssm_a": (nh,), "ssm_d": (nh,), "ssm_norm.weight": (di,), "ssm_out.weight": (E, di),
        })  # fmt: skip
    elif kind == "attention":
        shapes.update(
            {
                "attn_q.weight": (q, E),
                "attn_k.weight": (kv, E),
                "attn_v.weight": (kv, E),
                "attn_output.weight": (E, q),
            }
        )
    elif kind == "mlp":
        shapes.update({"ffn_up.weight": (c.n_ff, E), "ffn_down.weight": (E, c.n_ff)})
    else:
        ne, fe, fs = (
            c.positive("n_routed_experts"),
            c.positive("moe_intermediate_size"),
            c.positive("moe_shared_expert_intermediate_size"),
        )
        lat = c.get("moe_latent_size") or 0
        w = lat or E
        shapes.update({
            "ffn_gate_inp.weight": (ne, E), "exp_probs_b.bias": (ne,), "ffn_up_exps.weight": (ne, fe, w),
            "ffn_down_exps.weight": (ne, w, fe), "ffn_up_shexp.weight": (fs, E), "ffn_down_shexp.weight": (E, fs),
        })  # fmt: skip
        if lat:
            shapes.update({"ffn_latent_down.weight": (lat, E), "ffn_latent_up.weight": (E, lat)})
    return shapes


def _rewrite(c: HFConfig, name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...], Any]] | None:
    """The Mamba2 tensors llama.cpp's converter reshapes or transforms: [(name, GGUF shape, transform)]."""
    plan = _reshape(c, name)
    return None if plan is None else [(name, *plan)]


def _reshape(c: HFConfig, name: str) -> tuple[tuple[int, ...], Callable[[np.ndarray], np.ndarray]] | None:
    dc, nh, hd, ds, ng = _ssm(c)
    suffix = name.split(".", 2)[-1]
    if suffix == "ssm_a":
        return (nh, 1), lambda a: -np.exp(a.astype(np.float32)).reshape(nh, 1)
    if suffix == "ssm_d":
        return (nh, 1), lambda d: d.reshape(nh, 1)
    if suffix == "ssm_conv1d.weight":
        conv = nh * hd + 2 * ng * ds
        return (conv, dc), lambda w: w.reshape(conv, dc)
    if suffix == "ssm_norm.weight":
        return (ng, nh * hd // ng), lambda w: w.reshape(ng, -1)
    return None


def _overrides(c: HFConfig) -> dict[str, Any]:
    kinds = c.raw["_kinds"]
    moe = "n_routed_experts" in c.raw
    n_ff = c.positive("moe_intermediate_size") if moe else c.n_ff
    return {
        "head_count_kv": [c.n_head_kv if k == "attention" else 0 for k in kinds],
        "feed_forward_length": [n_ff if k in ("mlp", "moe") else 0 for k in kinds],
        "key_length": c.head_dim,
    }


def _metadata(w: GGUFWriter, c: HFConfig) -> None:
    dc, nh, hd, ds, ng = _ssm(c)
    # TextModel writes layer_norm_epsilon under its LayerNorm key too; llama.cpp's loader requires it (the
    # MTP head's final norm).
    w.add_layer_norm_eps(float(c.get("layer_norm_epsilon", 1e-5)))
    w.add_ssm_conv_kernel(dc)
    w.add_ssm_state_size(ds)
    w.add_ssm_group_count(ng)
    w.add_ssm_inner_size(nh * hd)
    w.add_ssm_time_step_rank(nh)
    if "n_routed_experts" in c.raw:
        w.add_expert_shared_feed_forward_length(c.positive("moe_shared_expert_intermediate_size"))
        w.add_expert_shared_count(c.positive("n_shared_experts", 1))
        w.add_expert_weights_norm(bool(c.get("norm_topk_prob", False)))
        w.add_expert_weights_scale(float(c.get("routed_scaling_factor", 1.0)))
        w.add_expert_group_count(c.positive("n_group", 1))
        if c.get("moe_latent_size"):
            w.add_moe_latent_size(c.positive("moe_latent_size"))


def _rename(name: str) -> str:
    """The checkpoint's backbone.* names as the common converter's model.* ones."""
    if name == "backbone.embeddings.weight":
        return "model.embed_tokens.weight"
    if name == "backbone.norm_f.weight":
        return "model.norm.weight"
    return "model." + name.removeprefix("backbone.") if name.startswith("backbone.layers.") else name


def _skip(name: str) -> str | None:
    return "multi-token-prediction head (not run)" if name.startswith("mtp.") else None


def _spec(arch: str, moe: bool, variant: Callable[[dict[str, Any]], ArchSpec] | None = None) -> ArchSpec:
    layers = {**_LAYERS, **(_MOE_LAYERS if moe else {})}
    return ArchSpec(
        arch,
        layers,
        False,
        10000.0,
        check=_check,
        experts=EXPERTS if moe else None,
        global_map=dict(_GLOBAL),
        optional_layers=lambda c: dict(_LATENT) if moe and c.get("moe_latent_size") else {},
        layer_shapes=_layer_shapes,
        layer_optional=lambda c, il: frozenset({"ssm_conv1d.bias"}),
        metadata=_metadata,
        context_default=8192,
        vocab_size_key=True,
        config_view=_view,
        rename=_rename,
        skip=_skip,
        overrides=_overrides,
        rewrite=_rewrite,
        variant=variant,
    )


_DENSE, _MOE = _spec("nemotron_h", False), _spec("nemotron_h_moe", True)
# One Hugging Face class for both forms: the MoE one is chosen by its config, as llama.cpp's converter does
# (num_experts_per_tok present).
HF_DENSE = {
    "NemotronHForCausalLM": _spec(
        "nemotron_h", False, lambda raw: _MOE if "num_experts_per_tok" in raw else _DENSE
    )
}
HF_MOE: dict[str, ArchSpec] = {}
