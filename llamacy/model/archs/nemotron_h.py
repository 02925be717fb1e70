"""nemotron_h and nemotron_h_moe: Nemotron-H (4B, 8B, Nano 9B/12B v2) and Nemotron 3 Nano (30B-A3B), as
llama.cpp's nemotron_h graph runs them.

Each layer is one block: RMSNorm (the file's blk.i.attn_norm), one mixer or feed-forward, a residual. Which
one, llama.cpp decides from the per-layer arrays attention.head_count_kv and feed_forward_length:
- head_count_kv 0 and feed_forward_length 0: a Mamba2 mixer (mamba2.pyx), with a recurrent state;
- head_count_kv > 0, feed_forward_length 0: attention without positional encoding (n_rot 0) and no FFN;
- feed_forward_length > 0: an MLP, up -> relu² -> down (mixer "none", the layer's norm bound as the FFN's),
  or in a file with experts a mixture (moe_ungated.pyx): sigmoid routing with a choice bias, weights
  normalised and scaled (expert_weights_norm / _scale), ungated relu² experts, a relu² shared expert, and
  the latent projections ffn_latent_down / ffn_latent_up where moe_latent_size says so.
Mamba2's shapes are the ssm.* keys: conv_kernel, inner_size (d_inner), state_size, group_count, and
time_step_rank (the number of heads; head size d_inner / heads).
A multi-token-prediction block (nextn_predict_layers; llama.cpp's converter appends one to Nemotron 3 files by
default) is loaded past: the model runs without it (using it as a drafter is not done).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from llamacy.errors import UnsupportedModelError
from llamacy.gguf_names import MODEL_TENSOR as T
from llamacy.gguf_names import TENSOR_NAMES
from llamacy.model.archs.base import VECTOR, Architecture, TensorSpec, attention_tensors, experts, mat, vec
from llamacy.model.archs.nemotron_h_hf import HF_DENSE, HF_MOE
from llamacy.model.config import MetadataReader, ModelConfig, file_hparams


def _per_layer(md: dict[str, Any], r: MetadataReader, key: str, n_layer: int) -> list[int]:
    """A key that is an array of one count per layer (0 allowed), or one number for all."""
    value = md.get(f"{r.arch}.{key}")
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        return [r.int(key, minimum=0)] * n_layer
    if len(value) != n_layer or not all(isinstance(v, int) and 0 <= v <= 1 << 24 for v in value):
        raise UnsupportedModelError(f"{r.source}: {r.arch}.{key} is not {n_layer} counts")
    return list(value)


class NemotronH(Architecture):
    name = "nemotron_h"
    hf: ClassVar[dict[str, Any]] = HF_DENSE

    def config(self, md: dict[str, Any], source: str) -> ModelConfig:
        arch = self.name
        r = MetadataReader(md, arch, source)
        # The multi-token-prediction block llama.cpp's converter appends by default: counted in block_count
        # and in the per-layer arrays, not run (its tensors are left unread).
        n_all = r.int("block_count", maximum=4096)
        nextn = r.int("nextn_predict_layers", 0, minimum=0, maximum=n_all - 1)
        n_layer = n_all - nextn
        n_embd = r.int("embedding_length")
        n_head = r.int("attention.head_count")
        head_dim = r.int("attention.key_length", n_embd // n_head)
        if r.int("attention.value_length", head_dim) != head_dim:
            raise UnsupportedModelError(f"{source}: key and value head sizes differ")
        kv = _per_layer(md, r, "attention.head_count_kv", n_all)[:n_layer]
        ff = _per_layer(md, r, "feed_forward_length", n_all)[:n_layer]
        d_conv, d_inner = r.int("ssm.conv_kernel"), r.int("ssm.inner_size")
        d_state, n_group, n_ssm_head = (
            r.int("ssm.state_size"),
            r.int("ssm.group_count"),
            r.int("ssm.time_step_rank"),
        )
        if d_inner % n_ssm_head or d_inner % n_group or n_ssm_head % n_group:
            raise UnsupportedModelError(
                f"{source}: ssm sizes do not split (inner {d_inner}, {n_ssm_head} heads, {n_group} groups)"
            )
        moe: dict[str, Any] = {}
        n_expert = r.int("expert_count", 0, minimum=0, maximum=4096)
        if n_expert:
            used = r.int("expert_used_count", maximum=min(n_expert, 256))
            latent = r.int("moe_latent_size", 0, minimum=0)
            if latent > n_embd:
                raise UnsupportedModelError(f"{source}: moe_latent_size {latent} is wider than the model")
            moe = dict(
                n_expert=n_expert,
                n_expert_used=used,
                n_ff_exp=r.int("expert_feed_forward_length", max(ff) // used),
                n_ff_shexp=r.int("expert_shared_feed_forward_length"),
                expert_norm=bool(md.get(f"{arch}.expert_weights_norm", False)),
                # llama.cpp's default 0 means "not scaled"
                expert_scale=r.float("expert_weights_scale", 0.0) or 1.0,
                moe_latent_size=latent,
            )
        mixers, ffns = [], []
        for il in range(n_layer):
            if kv[il] == 0 and ff[il] == 0:
                mixers.append("mamba2")
                ffns.append("none")
            elif ff[il] == 0:
                if n_head % kv[il]:
                    raise UnsupportedModelError(
                        f"{source}: {n_head} heads do not split into {kv[il]} KV groups"
                    )
                mixers.append("attention")
                ffns.append("none")
            else:
                mixers.append("none")
                ffns.append("moe_ungated" if n_expert else "ungated")
        conv = (d_conv - 1) * (d_inner + 2 * n_group * d_state)
        return ModelConfig(
            **file_hparams(md, arch, source),
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=max(kv) or n_head,
            head_dim=head_dim,
            n_ff=max(ff) or 1,
            n_rot=0,  # no positional encoding
            rms_eps=r.float("attention.layer_norm_rms_epsilon", 1e-5),
            rope_base=10000.0,
            activation="relu2",
            layer_mixer=mixers,
            layer_ffn=ffns,
            layer_n_head_kv=[k if m == "attention" else 0 for k, m in zip(kv, mixers, strict=True)],
            layer_n_ff=[f or 1 for f in ff],
            layer_state_conv=[conv if m == "mamba2" else 0 for m in mixers],
            layer_state_ssm=[d_inner * d_state if m == "mamba2" else 0 for m in mixers],
            ssm_d_conv=d_conv,
            ssm_d_inner=d_inner,
            ssm_d_state=d_state,
            ssm_n_group=n_group,
            ssm_dt_rank=n_ssm_head,
            n_nextn=nextn,
            **moe,
        )

    def layer_tensors(self, cfg: ModelConfig, il: int) -> list[TensorSpec]:
        spec = cfg.layers[il]
        E = cfg.n_embd
        if spec.mixer == "mamba2":
            DI, NG, DS, NH = cfg.ssm_d_inner, cfg.ssm_n_group, cfg.ssm_d_state, cfg.ssm_dt_rank
            C = DI + 2 * NG * DS

            def small(field: str, tensor: T, shape: tuple[int, ...], suffix: str = ".weight") -> TensorSpec:
                # F32 tensors of more than one dimension, read whole by the mixer (weights.py flattens them);
                # ssm_a and ssm_d have no suffix in llama.cpp's files.
                return TensorSpec(
                    field, TENSOR_NAMES[tensor].format(bid=il) + suffix, VECTOR, shape, tensor=tensor
                )

            return [
                vec("attn_norm", T.ATTN_NORM, il, E),
                mat("ssm_in", T.SSM_IN, il, 2 * DI + 2 * NG * DS + NH, E),
                small("ssm_conv1d", T.SSM_CONV1D, (C, cfg.ssm_d_conv)),
                vec("ssm_conv1d_b", T.SSM_CONV1D, il, C, optional=True, suffix="bias"),
                vec("ssm_dt", T.SSM_DT, il, NH, suffix="bias"),
                small("ssm_a", T.SSM_A, (NH, 1), suffix=""),
                small("ssm_d", T.SSM_D, (NH, 1), suffix=""),
                small("ssm_norm", T.SSM_NORM, (NG, DI // NG)),
                mat("ssm_out", T.SSM_OUT, il, E, DI),
            ]
        if spec.mixer == "attention":
            return [
                vec("attn_norm", T.ATTN_NORM, il, E),
                *attention_tensors(cfg, il, bias=True, out_bias=True, optional_bias=True),
            ]
        # A feed-forward layer: its one norm is the file's attn_norm, run as the FFN block's input norm.
        specs = [vec("ffn_norm", T.ATTN_NORM, il, E)]
        if spec.ffn == "ungated":
            F = spec.n_ff
            return [
                *specs,
                mat("up", T.FFN_UP, il, F, E),
                mat("down", T.FFN_DOWN, il, E, F),
                vec("up_b", T.FFN_UP, il, F, True, suffix="bias"),
                vec("down_b", T.FFN_DOWN, il, E, True, suffix="bias"),
            ]
        NE, FE, FS, LAT = cfg.n_expert, cfg.n_ff_exp, cfg.n_ff_shexp, cfg.moe_latent_size
        W = LAT or E
        specs += [
            mat("gate_inp", T.FFN_GATE_INP, il, NE, E),
            vec("exp_probs_b", T.FFN_EXP_PROBS_B, il, NE, suffix="bias"),
            experts("up_exps", T.FFN_UP_EXP, il, NE, FE, W),
            experts("down_exps", T.FFN_DOWN_EXP, il, NE, W, FE),
            mat("up_shexp", T.FFN_UP_SHEXP, il, FS, E),
            mat("down_shexp", T.FFN_DOWN_SHEXP, il, E, FS),
        ]
        if LAT:
            specs += [
                mat("latent_down", T.MOE_LATENT_DOWN, il, LAT, E),
                mat("latent_up", T.MOE_LATENT_UP, il, E, LAT),
            ]
        return specs


class NemotronHMoe(NemotronH):
    name = "nemotron_h_moe"
    hf: ClassVar[dict[str, Any]] = HF_MOE
