"""gemma4: Gemma 4 text models, dense form (E2B, E4B, 31B), as llama.cpp's gemma4 graph runs them.

- Per layer: sliding or full attention (attention.sliding_window_pattern, an array of booleans); sliding
  layers have their own head size (attention.key_length_swa), rotary dimensions (rope.dimension_count_swa)
  and RoPE base (rope.freq_base_swa); head_count_kv and feed_forward_length may be per-layer arrays.
- Attention: q and k weighted RMSNorm per head, v a plain RMSNorm; scale 1.0; no V projection -> V = K;
  NEOX RoPE, with rope_freqs dividing the frequencies of full layers only ("proportional" RoPE: factors of
  1e30 leave the unrotated dimensions as they are).
- The last attention.shared_kv_layers layers compute only Q and attend over the K/V rows of the last
  earlier layer of their kind (sliding or full); they keep no memory of their own (memory.py).
- Sandwich norms, GELU-tanh gated FFN, optional per-layer layer_output_scale (scales the whole residual
  stream), embeddings scaled by sqrt(n_embd), final logit soft-capping.
- Per-layer embeddings (embedding_length_per_layer_input > 0: E2B, E4B): per_layer_embd.pyx.
Norm weights are used as stored (Gemma 4's RMSNorm multiplies by w, not 1 + w: no offset at conversion).

The mixture-of-experts form (26B-A4B): each layer's dense FFN and its experts summed (dense_moe.pyx).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from llamacy.errors import UnsupportedModelError
from llamacy.gguf_names import MODEL_TENSOR as T
from llamacy.model.archs.base import (
    EXPERTS,
    Architecture,
    TensorSpec,
    experts,
    mat,
    output_tensors,
    tensor_name,
    vec,
)
from llamacy.model.archs.gemma4_hf import HF_SPECS
from llamacy.model.config import ROPE_NEOX, MetadataReader, ModelConfig, file_hparams

ARCH = "gemma4"


def _array(value: Any) -> list[Any] | None:
    """A metadata value as a list when it is an array (the GGUF reader gives numeric arrays as numpy)."""
    if isinstance(value, (list, tuple)):
        return list(value)
    return value.tolist() if isinstance(value, np.ndarray) else None


def _per_layer(
    md: dict[str, Any], r: MetadataReader, key: str, n_layer: int, default: int | None = None
) -> list[int]:
    """A key that is one number, or an array of one number per layer."""
    values = _array(md.get(f"{ARCH}.{key}"))
    if values is None:
        return [r.int(key, default)] * n_layer
    if len(values) != n_layer or not all(isinstance(v, int) and 1 <= v <= 1 << 24 for v in values):
        raise UnsupportedModelError(f"{r.source}: {ARCH}.{key} is not {n_layer} positive numbers")
    return values


def _pattern(md: dict[str, Any], source: str, n_layer: int) -> list[bool]:
    """attention.sliding_window_pattern: per layer, whether it is a sliding-window layer."""
    key = f"{ARCH}.attention.sliding_window_pattern"
    values = _array(md.get(key))
    if values is None or len(values) != n_layer:
        raise UnsupportedModelError(f"{source}: {key} is not an array of {n_layer} booleans")
    return [bool(v) for v in values]


class Gemma4(Architecture):
    name = ARCH
    hf: ClassVar[dict[str, Any]] = HF_SPECS

    def config(self, md: dict[str, Any], source: str) -> ModelConfig:
        r = MetadataReader(md, ARCH, source)
        # 26B-A4B: every layer a dense FFN plus the experts (llama.cpp: a layer with ffn_gate_inp), routed
        # weights renormalised over the chosen k.
        n_expert = r.int("expert_count", 0, minimum=0, maximum=4096)
        moe: dict[str, Any] = {}
        if n_expert:
            moe = dict(
                n_expert=n_expert,
                n_expert_used=r.int("expert_used_count", maximum=n_expert),
                n_ff_exp=r.int("expert_feed_forward_length"),
                expert_norm=True,
            )
        n_layer = r.int("block_count", maximum=4096)
        n_embd = r.int("embedding_length")
        n_head = r.int("attention.head_count")
        swa = _pattern(md, source, n_layer)
        head_full = r.int("attention.key_length")
        head_swa = r.int("attention.key_length_swa")
        if (
            r.int("attention.value_length", head_full) != head_full
            or r.int("attention.value_length_swa", head_swa) != head_swa
        ):
            raise UnsupportedModelError(f"{source}: Gemma 4 requires key and value head sizes to be equal")
        rot_full = r.int("rope.dimension_count", head_full)
        rot_swa = r.int("rope.dimension_count_swa", head_swa)
        if rot_full > head_full or rot_swa > head_swa or rot_full % 2 or rot_swa % 2:
            raise UnsupportedModelError(f"{source}: rope dimensions do not fit the head sizes")
        n_head_kv = _per_layer(md, r, "attention.head_count_kv", n_layer, n_head)
        if any(n_head % h for h in n_head_kv):
            raise UnsupportedModelError(
                f"{source}: {n_head} heads do not split into the KV groups {n_head_kv}"
            )
        n_ff = _per_layer(md, r, "feed_forward_length", n_layer)
        window = r.int("attention.sliding_window", minimum=1)
        n_shared = r.int("attention.shared_kv_layers", 0, minimum=0, maximum=n_layer)
        first_shared = n_layer - n_shared
        kv_from = []
        for il in range(n_layer):
            if il < first_shared:
                kv_from.append(-1)
                continue
            # The last layer before the shared ones of the same kind (llama.cpp's KV reuse, HF's
            # store_full_length_kv).
            src = [j for j in range(first_shared) if swa[j] == swa[il]]
            if not src:
                raise UnsupportedModelError(
                    f"{source}: shared-KV layer {il} has no earlier layer of its kind"
                )
            kv_from.append(src[-1])
        base_full = r.float("rope.freq_base", 10000.0)
        base_swa = r.float("rope.freq_base_swa", base_full)
        freq_scale = 1.0 / r.float("rope.scale_linear", 1.0)
        scaling = md.get(f"{ARCH}.rope.scaling.type")
        if scaling not in (None, "none"):
            raise UnsupportedModelError(f"{source}: RoPE scaling {scaling!r} is not supported for Gemma 4")
        i_full = next((i for i in range(n_layer) if not swa[i]), 0)
        return ModelConfig(
            **file_hparams(md, ARCH, source),
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=n_head_kv[i_full],
            head_dim=head_full,
            n_ff=max(n_ff),
            n_rot=rot_full,
            rms_eps=r.float("attention.layer_norm_rms_epsilon", 1e-6),
            rope_base=base_full,
            rope_freq_scale=freq_scale,
            rope_mode=ROPE_NEOX,
            activation="gelu",
            embd_scale=math.sqrt(n_embd),
            attn_scale=1.0,
            final_softcap=r.float("final_logit_softcapping", 0.0),
            layer_window=[window if s else 0 for s in swa],
            layer_rope_base=[base_swa if s else base_full for s in swa],
            layer_rope_freq_scale=[1.0 if s else freq_scale for s in swa],
            layer_n_head_kv=n_head_kv,
            layer_head_dim=[head_swa if s else head_full for s in swa],
            layer_n_rot=[rot_swa if s else rot_full for s in swa],
            layer_n_ff=n_ff,
            layer_kv_from=kv_from,
            layer_rope_freqs=[not s for s in swa],
            v_norm=True,
            n_embd_per_layer=r.int("embedding_length_per_layer_input", 0, minimum=0),
            layer_ffn=["dense_moe" if moe else "gated"] * n_layer,
            **moe,
        )

    def model_tensors(self, cfg: ModelConfig) -> list[TensorSpec]:
        E, P, NL = cfg.n_embd, cfg.n_embd_per_layer, cfg.n_layer
        specs = []
        for s in output_tensors(cfg):
            if s.tensor == T.ROPE_FREQS:
                # Proportional RoPE of the full layers; llama.cpp requires it where there is a full layer.
                full = [sp for sp in cfg.layers if sp.rope_freqs]
                if not full:
                    continue
                s = vec("rope_freqs", T.ROPE_FREQS, None, full[0].head_dim // 2)
            specs.append(s)
        if P:
            specs += [
                mat("per_layer_token_embd", T.PER_LAYER_TOKEN_EMBD, None, cfg.n_vocab, NL * P),
                mat("per_layer_model_proj", T.PER_LAYER_MODEL_PROJ, None, NL * P, E),
                vec("per_layer_proj_norm", T.PER_LAYER_PROJ_NORM, None, P),
            ]
        return specs

    def layer_tensors(self, cfg: ModelConfig, il: int) -> list[TensorSpec]:
        spec = cfg.layers[il]
        E, HD, F, P = cfg.n_embd, spec.head_dim, spec.n_ff, cfg.n_embd_per_layer
        QW, KVW = cfg.n_head * HD, spec.n_head_kv * HD
        shared = spec.kv_from >= 0  # llama.cpp reads K (and its norm) of a shared layer where present
        specs = [
            vec("attn_norm", T.ATTN_NORM, il, E),
            mat("wq", T.ATTN_Q, il, QW, E),
            mat("wk", T.ATTN_K, il, KVW, E, optional=shared),
            mat("wv", T.ATTN_V, il, KVW, E, optional=True),  # absent: V = K
            mat("wo", T.ATTN_OUT, il, E, QW),
            vec("q_norm", T.ATTN_Q_NORM, il, HD),
            vec("k_norm", T.ATTN_K_NORM, il, HD, optional=shared),
            vec("post_attn_norm", T.ATTN_POST_NORM, il, E),
            vec("out_scale", T.LAYER_OUT_SCALE, il, 1, optional=True),
            vec("ffn_norm", T.FFN_PRE_NORM, il, E),  # the gguf table's name for the pre-FFN norm
            mat("gate", T.FFN_GATE, il, F, E),
            mat("up", T.FFN_UP, il, F, E),
            mat("down", T.FFN_DOWN, il, E, F),
            vec("post_ffn_norm", T.FFN_POST_NORM, il, E),
        ]
        if spec.ffn == "dense_moe":
            NE, FE = cfg.n_expert, cfg.n_ff_exp
            fused = tensor_name(T.FFN_GATE_UP_EXP, il)
            specs += [
                mat("gate_inp", T.FFN_GATE_INP, il, NE, E),
                vec("gate_inp_scale", T.FFN_GATE_INP, il, E, suffix="scale"),
                vec("pre_ffn_norm_2", T.FFN_PRE_NORM_2, il, E),
                vec("post_ffn_norm_1", T.FFN_POST_NORM_1, il, E),
                vec("post_ffn_norm_2", T.FFN_POST_NORM_2, il, E),
                # gate and up as one stacked tensor, or (older files) as two
                TensorSpec("gate_up_exps", fused, EXPERTS, (NE, 2 * FE, E), True, T.FFN_GATE_UP_EXP),
                TensorSpec(
                    "gate_exps", tensor_name(T.FFN_GATE_EXP, il), EXPERTS, (NE, FE, E), True, T.FFN_GATE_EXP
                ),
                TensorSpec(
                    "up_exps", tensor_name(T.FFN_UP_EXP, il), EXPERTS, (NE, FE, E), True, T.FFN_UP_EXP
                ),
                experts("down_exps", T.FFN_DOWN_EXP, il, NE, E, FE),
                vec("down_exps_scale", T.FFN_DOWN_EXP, il, NE, optional=True, suffix="scale"),
            ]
        if P:
            specs += [
                mat("inp_gate", T.PER_LAYER_INP_GATE, il, P, E),
                mat("proj", T.PER_LAYER_PROJ, il, E, P),
                vec("pe_post_norm", T.PER_LAYER_POST_NORM, il, E),
            ]
        return specs
