"""qwen3next, qwen35, qwen35moe: Qwen3-Next and Qwen3.5, hybrids of gated delta-net layers (deltanet.pyx)
and gated full attention (llama.cpp's src/models/qwen3next.cpp, qwen35.cpp, qwen35moe.cpp).

Layer i is a delta-net layer unless it is a full-attention one: `attention.recurrent_layers` says per
layer where the file has it, else every full_attention_interval-th layer (default 4) attends. Either way
the layer is: RMSNorm -> mixer -> residual, then post_attention_norm -> feed-forward -> residual.
- Attention: wq yields q and an output gate per head ([q_h, gate_h] interleaved); per-head q/k RMSNorm;
  NEOX RoPE over rope.dimension_count (< head_dim) dimensions; the output times sigmoid(gate) before wo.
  qwen35's interleaved multi-section RoPE (ggml's IMROPE) gives text positions t = h = w = pos and the
  fourth section 0: a pair whose section is covered by t, h or w rotates exactly as NEOX does, so the
  files whose sections cover every pair (the released ones: [11, 11, 10, 0] over 32 pairs) run as NEOX;
  others are refused (their uncovered pairs would not rotate in llama.cpp, yet would in Hugging Face).
- Feed-forward: qwen3next and qwen35moe a softmax-routed mixture (top-k renormalised) plus a shared
  expert scaled by sigmoid(ffn_gate_inp_shexp . x) (moe.pyx, as qwen2moe); qwen35 a dense SwiGLU.
- Norm weights are used as stored: llama.cpp's converter stores Hugging Face's zero-centred (1 + w)
  RMSNorm weights as 1 + w, all but the delta-net's gated norm (convert/hf_qwen3next.py).
- Files from llama.cpp's converter carry nextn_predict_layers multi-token-prediction blocks after the
  last layer, counted in block_count. The model runs without them (base.py leaves them unbound); the first
  is bound on its own as a drafter (mtp_config, mtp_tensors; model/mtp.py), as llama.cpp's qwen35.cpp
  graph_mtp runs it: a full-attention layer of the model's kind fed eh_proj [enorm(embedding);
  hnorm(hidden)], then shared_head_norm (else output_norm) and the model's output head.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from llamacy.convert.hf_qwen3next import QWEN3NEXT_HF, QWEN35_HF, QWEN35MOE_HF
from llamacy.convert.hf_spec import ArchSpec
from llamacy.errors import UnsupportedModelError
from llamacy.gguf_names import MODEL_TENSOR as T
from llamacy.model.archs.base import (
    MATRIX,
    VECTOR,
    Architecture,
    TensorSpec,
    attention_tensors,
    gated_ffn_tensors,
    mat,
    moe_tensors,
    tensor_name,
    vec,
    vec2d,
)
from llamacy.model.config import (
    ROPE_NEOX,
    MetadataReader,
    ModelConfig,
    common_hparams,
    expert_hparams,
)


def recurrent_layers(
    md: dict[str, Any], arch: str, n_layer_all: int, n_layer: int, source: str
) -> list[bool]:
    """Per layer of the file (MTP blocks included), whether it is a delta-net layer: llama.cpp's
    load_arch_hparams (the attention.recurrent_layers array, else full_attention_interval)."""
    arr = md.get(f"{arch}.attention.recurrent_layers")
    if arr is not None:
        if not isinstance(arr, (list, tuple)) or len(arr) != n_layer_all:
            raise UnsupportedModelError(
                f"{source}: {arch}.attention.recurrent_layers is not one flag a layer"
            )
        return [bool(x) for x in arr]
    interval = MetadataReader(md, arch, source).int("full_attention_interval", 4)
    return [i < n_layer and (i + 1) % interval != 0 for i in range(n_layer_all)]


def _check_sections(md: dict[str, Any], arch: str, n_rot: int, source: str) -> None:
    """IMROPE for text positions equals NEOX exactly when every rotated pair's sector is one of t, h, w
    (ggml's ggml_mrope_cache_init with is_imrope)."""
    sections = md.get(f"{arch}.rope.dimension_sections")
    if sections is None:
        raise UnsupportedModelError(f"{source}: metadata key {arch}.rope.dimension_sections is missing")
    s = [int(x) for x in list(sections)[:4]] + [0] * max(0, 4 - len(list(sections)))
    total = sum(s)
    if total <= 0:
        raise UnsupportedModelError(f"{source}: {arch}.rope.dimension_sections is empty")
    for i in range(n_rot // 2):
        sector = i % total
        covered = (
            (sector % 3 == 0 and sector < 3 * s[0])
            or (sector % 3 == 1 and sector < 3 * s[1])
            or (sector % 3 == 2 and sector < 3 * s[2])
        )
        if not covered:
            raise UnsupportedModelError(
                f"{source}: rope.dimension_sections {s} leave rotary pair {i} to the fourth section "
                "(not supported)"
            )


class Qwen3Next(Architecture):
    name = "qwen3next"
    hf: ClassVar[dict[str, ArchSpec]] = QWEN3NEXT_HF
    moe: ClassVar[bool] = True
    imrope: ClassVar[bool] = False
    k_tiled: ClassVar[bool] = False  # llama.cpp repeats key heads interleaved for qwen3next
    legacy_ssm_in: ClassVar[bool] = True  # older qwen3next files fuse q, k, v, z into ssm_in

    def config(self, md: dict[str, Any], source: str) -> ModelConfig:
        arch = self.name
        r = MetadataReader(md, arch, source)
        common = common_hparams(md, arch, source)
        n_all = common["n_layer"]
        n_nextn = r.int("nextn_predict_layers", 0, minimum=0)
        if n_nextn >= n_all:
            raise UnsupportedModelError(f"{source}: {arch}.nextn_predict_layers >= block_count")
        n_layer = n_all - n_nextn
        recr = recurrent_layers(md, arch, n_all, n_layer, source)[:n_layer]
        d_conv = r.int("ssm.conv_kernel")
        d_inner = r.int("ssm.inner_size")
        dk = r.int("ssm.state_size")
        n_k = r.int("ssm.group_count")
        n_v = r.int("ssm.time_step_rank")
        if n_v % n_k or d_inner % n_v:
            raise UnsupportedModelError(
                f"{source}: {n_v} delta-net value heads of {d_inner} values do not fit {n_k} key heads"
            )
        dv = d_inner // n_v
        channels = 2 * n_k * dk + d_inner
        if self.imrope:
            _check_sections(md, arch, common["n_rot"], source)
        experts = {}
        if self.moe:
            experts = expert_hparams(md, arch, source, norm=True)
            if not experts:
                raise UnsupportedModelError(f"{source}: {arch}.expert_count is missing")
            # llama.cpp: the shared expert is feed_forward_length wide where the file does not say.
            experts["n_ff_shexp"] = experts["n_ff_shexp"] or common["n_ff"]
        common["n_layer"] = n_layer
        return ModelConfig(
            **common,
            **experts,
            rope_mode=ROPE_NEOX,
            attn_gate=True,
            ssm_k_tiled=self.k_tiled,
            n_nextn=n_nextn,
            layer_mixer=["deltanet" if x else "attention" for x in recr],
            layer_state_conv=[(d_conv - 1) * channels if x else 0 for x in recr],
            layer_state_ssm=[n_v * dv * dk if x else 0 for x in recr],
            ssm_d_conv=d_conv,
            ssm_d_inner=d_inner,
            ssm_d_state=dk,
            ssm_n_group=n_k,
            ssm_dt_rank=n_v,
        )

    def layer_tensors(self, cfg: ModelConfig, il: int) -> list[TensorSpec]:
        E = cfg.n_embd
        specs = [vec("attn_norm", T.ATTN_NORM, il, E), vec("ffn_norm", T.ATTN_POST_NORM, il, E)]
        if cfg.layer_mixer[il] == "deltanet":
            specs += self._deltanet_tensors(cfg, il)
        else:
            attn = attention_tensors(cfg, il, qk_norm=True)
            assert attn[0].field == "wq"
            specs += [mat("wq", T.ATTN_Q, il, 2 * cfg.n_head * cfg.head_dim, E), *attn[1:]]
        specs += moe_tensors(cfg, il) if self.moe else gated_ffn_tensors(cfg, il)
        return specs

    def mtp_config(self, cfg: ModelConfig, extra: int = 0) -> ModelConfig:
        """The first multi-token-prediction block as a model of one layer (extra = 0), or the model with
        that block as one more layer (extra = 1: its tensors are named after layer n_layer). The block is a
        full-attention layer with the model's feed-forward, shaped as the model's attention layers are."""
        a = cfg.layer_mixer.index("attention")
        lists = {
            name: [getattr(cfg, name)[a]]
            for name in vars(cfg)
            if name.startswith("layer_") and isinstance(getattr(cfg, name), list)
        }
        if extra:
            lists = {name: getattr(cfg, name) + one for name, one in lists.items()}
        return replace(cfg, n_layer=cfg.n_layer + 1 if extra else 1, n_nextn=0, **lists)

    def mtp_tensors(self, cfg: ModelConfig) -> tuple[list[TensorSpec], list[TensorSpec]]:
        """The first multi-token-prediction block's tensors: (model-level fields, its layer's fields). Its
        own embedding table and head are optional (Qwen's blocks share the model's)."""
        il, E, V = cfg.n_layer, cfg.n_embd, cfg.n_vocab

        def nextn(
            field: str, tensor: T, shape: tuple[int, ...], kind: str, optional: bool = False
        ) -> TensorSpec:
            return TensorSpec(field, tensor_name(tensor, il), kind, shape, optional, tensor)

        model = [
            nextn("nextn_eh_proj", T.NEXTN_EH_PROJ, (E, 2 * E), MATRIX),
            nextn("nextn_enorm", T.NEXTN_ENORM, (E,), VECTOR),
            nextn("nextn_hnorm", T.NEXTN_HNORM, (E,), VECTOR),
            nextn("output_norm", T.NEXTN_SHARED_HEAD_NORM, (E,), VECTOR, optional=True),
            nextn("token_embd", T.NEXTN_EMBED_TOKENS, (V, E), MATRIX, optional=True),
            nextn("output", T.NEXTN_SHARED_HEAD_HEAD, (V, E), MATRIX, optional=True),
        ]
        return model, self.layer_tensors(self.mtp_config(cfg, extra=1), il)

    def _deltanet_tensors(self, cfg: ModelConfig, il: int) -> list[TensorSpec]:
        E, n_v, n_k, dk = cfg.n_embd, cfg.ssm_dt_rank, cfg.ssm_n_group, cfg.ssm_d_state
        VD = cfg.ssm_d_inner
        C = 2 * n_k * dk + VD
        # q/k/v and z as two products, or (older qwen3next files) one ssm_in: binding.pyx checks that a
        # layer has one form or the other.
        specs = [
            mat("wqkv", T.ATTN_QKV, il, C, E, optional=self.legacy_ssm_in),
            mat("wqkv_gate", T.ATTN_GATE, il, VD, E, optional=self.legacy_ssm_in),
            vec2d("ssm_conv1d", T.SSM_CONV1D, il, C, cfg.ssm_d_conv),
            vec("ssm_dt", T.SSM_DT, il, n_v, suffix="bias"),
            vec("ssm_a", T.SSM_A, il, n_v, suffix=""),
            vec("ssm_norm", T.SSM_NORM, il, VD // n_v),
            mat("ssm_out", T.SSM_OUT, il, E, VD),
        ]
        if self.legacy_ssm_in:
            specs.append(mat("ssm_in", T.SSM_IN, il, C + VD, E, optional=True))
        if self.name == "qwen3next":
            specs.append(mat("ssm_ba", T.SSM_BETA_ALPHA, il, 2 * n_v, E))
        else:
            specs += [mat("ssm_beta", T.SSM_BETA, il, n_v, E), mat("ssm_alpha", T.SSM_ALPHA, il, n_v, E)]
        return specs


class Qwen35(Qwen3Next):
    name = "qwen35"
    hf: ClassVar[dict[str, ArchSpec]] = QWEN35_HF
    moe = False
    imrope = True
    k_tiled = True  # qwen35.cpp's ggml_repeat_4d tiles key heads; the converter reorders value heads
    legacy_ssm_in = False


class Qwen35Moe(Qwen35):
    name = "qwen35moe"
    hf: ClassVar[dict[str, ArchSpec]] = QWEN35MOE_HF
    moe = True
