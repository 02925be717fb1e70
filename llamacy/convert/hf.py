"""A Hugging Face checkpoint directory as a conversion source.

config.json names the architecture class; each supported class maps to a GGUF architecture with the
tensor names, metadata keys and weight transformations that llama.cpp's convert_hf_to_gguf.py uses:

- LlamaForCausalLM -> "llama": Q and K rows permuted so that RoPE rotates adjacent pairs (GGUF's "normal"
  mode) where Hugging Face rotates halves (rotate_half); rope_type "llama3" scaling becomes a
  rope_freqs.weight tensor, "linear" scaling the rope.scaling.* keys.
- Qwen2ForCausalLM -> "qwen2" (q/k/v biases), Qwen3ForCausalLM -> "qwen3" (per-head q/k norms): NEOX RoPE,
  rows as they are.
- Gemma3ForCausalLM -> "gemma3": every *norm.weight stored as 1 + w (Gemma's RMSNorm multiplies by 1 + w,
  llama.cpp by w); sliding window and the local RoPE base in metadata.

Everything the engine could not run the way Hugging Face does (biases where llamacy has none, other RoPE
scalings, other sliding-window patterns or attention scales) is refused with UnsupportedModelError rather
than converted into a file that would compute something else.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_VERSION, GGUFWriter, RopeScalingType, size_label

from llamacy.convert.hf_moe import MIXTRAL_EXPERTS, QWEN_EXPERTS, ExpertSpec, stacked_tensor
from llamacy.convert.hf_tokenizer import add_tokenizer
from llamacy.convert.mixtures import ModelFacts
from llamacy.convert.safetensors_io import Checkpoint
from llamacy.convert.source import Source, SourceTensor
from llamacy.errors import UnsupportedModelError, UsageError
from llamacy.ggml_types import GGMLType

# Per-layer tensors every architecture has: Hugging Face suffix (after "model.layers.N.") -> GGUF suffix.
_LAYER_COMMON = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_QK_NORMS = {"self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"}
_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
# Buffers some checkpoints carry that are not weights.
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class ArchSpec:
    arch: str
    layer_map: dict[str, str]
    tied_default: bool  # tie_word_embeddings when config.json does not say
    rope_theta_default: float
    norm_plus_one: bool = False  # Gemma
    permute_qk: bool = False  # llama
    check: Callable[[HFConfig], None] = field(default=lambda c: None)
    experts: ExpertSpec | None = None  # mixture-of-experts layers


class HFConfig:
    """config.json, with the hyper-parameters every architecture has checked up front."""

    def __init__(self, path: Path, raw: dict[str, Any]) -> None:
        self.path = path
        self.raw = raw
        self.n_embd = self.positive("hidden_size")
        self.n_layer = self.positive("num_hidden_layers")
        self.n_head = self.positive("num_attention_heads")
        self.n_head_kv = self.positive("num_key_value_heads", self.n_head)
        self.n_ff = self.positive("intermediate_size")
        self.n_vocab = self.positive("vocab_size")
        self.head_dim = self.positive("head_dim", self.n_embd // self.n_head)
        if self.n_head % self.n_head_kv:
            raise UsageError(f"{path}: {self.n_head} heads do not split into {self.n_head_kv} KV groups")

    def get(self, key: str, default: Any = None) -> Any:
        value = self.raw.get(key, default)
        return default if value is None else value

    def positive(self, key: str, default: int | None = None) -> int:
        value = self.get(key, default)
        if value is None:
            raise UsageError(f"{self.path}: {key} is missing")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{self.path}: {key} must be a positive integer, got {value!r}")
        return value

    def rope(self) -> tuple[float | None, dict[str, Any]]:
        """(rope_theta, scaling settings) of the global layers. transformers < 5 writes rope_theta and
        rope_scaling; 5 writes rope_parameters (one entry per layer type for Gemma 3)."""
        params = self.get("rope_parameters", {})
        params = params.get("full_attention", params)
        scaling = self.get("rope_scaling", {}) or params
        return params.get("rope_theta", self.raw.get("rope_theta")), scaling

    @property
    def rope_type(self) -> str:
        scaling = self.rope()[1]
        return str(scaling.get("rope_type", scaling.get("type", "default")) or "default")


def _check_rope(c: HFConfig, allowed: tuple[str, ...]) -> None:
    if c.rope_type not in allowed:
        raise UnsupportedModelError(f"{c.path}: RoPE scaling {c.rope_type!r} is not supported")


def _check_llama(c: HFConfig) -> None:
    if c.get("attention_bias", False) or c.get("mlp_bias", False):
        raise UnsupportedModelError(f"{c.path}: llama with attention/MLP biases is not supported")
    _check_act(c, "hidden_act", "silu")
    _check_rope(c, ("default", "linear", "llama3"))


def _check_qwen(c: HFConfig) -> None:
    if c.get("use_sliding_window", False):
        raise UnsupportedModelError(f"{c.path}: Qwen sliding-window attention is not supported")
    if c.get("attention_bias", False) and c.get("model_type") in ("qwen3", "qwen3_moe"):
        raise UnsupportedModelError(f"{c.path}: qwen3 with attention biases is not supported")
    _check_act(c, "hidden_act", "silu")
    _check_rope(c, ("default", "linear"))


def _check_moe(c: HFConfig, norm_topk: bool) -> None:
    """Every layer a mixture (llama.cpp has no dense layers in these architectures), routed weights
    renormalised over the chosen experts exactly where llama.cpp does (qwen3moe, Mixtral; not qwen2moe)."""
    if int(c.get("decoder_sparse_step", 1)) != 1 or c.get("mlp_only_layers", []):
        raise UnsupportedModelError(
            f"{c.path}: dense layers between mixture-of-experts layers are not supported"
        )
    if "norm_topk_prob" in c.raw and bool(c.get("norm_topk_prob")) != norm_topk:
        raise UnsupportedModelError(
            f"{c.path}: norm_topk_prob={c.get('norm_topk_prob')} (llama.cpp's {c.get('model_type')} uses {norm_topk})"
        )


def _check_qwen3moe(c: HFConfig) -> None:
    _check_qwen(c)
    _check_moe(c, True)


def _check_qwen2moe(c: HFConfig) -> None:
    _check_qwen(c)
    _check_moe(c, False)


def _check_mixtral(c: HFConfig) -> None:
    _check_llama(c)
    _check_moe(c, True)


def _check_gemma3(c: HFConfig) -> None:
    _check_act(c, "hidden_activation", "gelu_pytorch_tanh", fallback_key="hidden_act")
    if c.get("attn_logit_softcapping") is not None:
        raise UnsupportedModelError(f"{c.path}: Gemma 3 attention-logit softcapping is not supported")
    # llama.cpp scales queries by 1/sqrt(head_dim), or 1/sqrt(n_embd / n_head) for the 27B (62 layers).
    expected = c.n_embd / c.n_head if c.n_layer == 62 else c.head_dim
    scalar = c.get("query_pre_attn_scalar", expected)
    if not math.isclose(float(scalar), float(expected)):
        raise UnsupportedModelError(
            f"{c.path}: query_pre_attn_scalar {scalar} (llama.cpp assumes {expected:g})"
        )
    # llama.cpp: every 6th layer global, the others sliding-window.
    layer_types = c.get("layer_types")
    if layer_types is not None:
        sliding = [t == "sliding_attention" for t in layer_types]
    else:
        period = int(c.get("sliding_window_pattern", 6))
        sliding = [(i + 1) % period != 0 for i in range(c.n_layer)]
    if c.get("sliding_window") is not None and sliding != [i % 6 < 5 for i in range(c.n_layer)]:
        raise UnsupportedModelError(
            f"{c.path}: sliding-window layers other than every 6th global are not supported"
        )
    _check_rope(c, ("default", "linear"))


def _check_act(c: HFConfig, key: str, expected: str, fallback_key: str | None = None) -> None:
    act = c.get(key) or (c.get(fallback_key) if fallback_key else None) or expected
    if act != expected:
        raise UnsupportedModelError(f"{c.path}: activation {act!r} is not supported (expected {expected})")


_LLAMA_LAYERS = {**_LAYER_COMMON, "post_attention_layernorm.weight": "ffn_norm.weight"}
_QKV_BIAS = {
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
}
# Mixture-of-experts layers: no dense feed-forward; a router (and, in qwen2moe, a gated shared expert).
_MOE_ATTN = {k: v for k, v in _LLAMA_LAYERS.items() if not k.startswith("mlp.")}
_SHARED_EXPERT = {
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
ARCHITECTURES: dict[str, ArchSpec] = {
    "LlamaForCausalLM": ArchSpec("llama", _LLAMA_LAYERS, False, 10000.0, permute_qk=True, check=_check_llama),
    "Qwen2ForCausalLM": ArchSpec(
        "qwen2",
        {**_LLAMA_LAYERS, **_QKV_BIAS},
        False,
        10000.0,
        check=_check_qwen,
    ),
    "Qwen3ForCausalLM": ArchSpec("qwen3", {**_LLAMA_LAYERS, **_QK_NORMS}, False, 10000.0, check=_check_qwen),
    "Qwen3MoeForCausalLM": ArchSpec(
        "qwen3moe",
        {**_MOE_ATTN, **_QK_NORMS, "mlp.gate.weight": "ffn_gate_inp.weight"},
        False,
        10000.0,
        check=_check_qwen3moe,
        experts=QWEN_EXPERTS,
    ),
    "Qwen2MoeForCausalLM": ArchSpec(
        "qwen2moe",
        {**_MOE_ATTN, **_QKV_BIAS, "mlp.gate.weight": "ffn_gate_inp.weight", **_SHARED_EXPERT},
        False,
        10000.0,
        check=_check_qwen2moe,
        experts=QWEN_EXPERTS,
    ),
    "MixtralForCausalLM": ArchSpec(
        "llama",
        {**_MOE_ATTN, "block_sparse_moe.gate.weight": "ffn_gate_inp.weight"},
        False,
        1_000_000.0,
        permute_qk=True,
        check=_check_mixtral,
        experts=MIXTRAL_EXPERTS,
    ),
    "Gemma3ForCausalLM": ArchSpec(
        "gemma3",
        {
            **_LAYER_COMMON,
            **_QK_NORMS,
            "post_attention_layernorm.weight": "post_attention_norm.weight",
            "pre_feedforward_layernorm.weight": "ffn_norm.weight",
            "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
        },
        True,
        1_000_000.0,
        norm_plus_one=True,
        check=_check_gemma3,
    ),
}


def load_config(directory: Path) -> tuple[HFConfig, ArchSpec]:
    path = directory / "config.json"
    if not path.is_file():
        raise UsageError(f"{directory}: no config.json (not a Hugging Face model directory)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: cannot read ({e})") from None
    classes = raw.get("architectures") or []
    spec = next((ARCHITECTURES[c] for c in classes if c in ARCHITECTURES), None)
    if spec is None:
        raise UnsupportedModelError(
            f"{path}: architecture {', '.join(classes) or '(none)'} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    config = HFConfig(path, raw)
    spec.check(config)
    return config, spec


class HFSource(Source):
    def __init__(self, directory: Path) -> None:
        self.path = directory
        self.config, self.spec = load_config(directory)
        c = self.config
        ex = self.spec.experts
        self.n_expert = c.positive(ex.count_key) if ex else 0
        self.n_ff_exp = c.positive(ex.width_key) if ex else 0
        if ex and not 1 <= c.positive("num_experts_per_tok") <= self.n_expert:
            raise UsageError(f"{c.path}: num_experts_per_tok must be 1..{self.n_expert}")
        self.facts = ModelFacts(self.spec.arch, c.n_layer, c.n_head, c.n_head_kv, self.n_expert)
        self.checkpoint = Checkpoint(directory)
        try:
            self.tied = bool(c.get("tie_word_embeddings", self.spec.tied_default))
            self.tensors = self._tensors()
        except BaseException:
            self.checkpoint.close()
            raise

    # -- tensors ---------------------------------------------------------------------------------------

    def _gguf_name(self, hf_name: str) -> str | None:
        """The GGUF name of a checkpoint tensor; None for tensors that are not written."""
        if _IGNORED.search(hf_name) or (hf_name == "lm_head.weight" and self.tied):
            return None
        if hf_name in _GLOBAL:
            return _GLOBAL[hf_name]
        m = _LAYER_RE.match(hf_name)
        if m and m.group(2) in self.spec.layer_map:
            layer = int(m.group(1))
            if layer >= self.config.n_layer:
                raise UsageError(
                    f"{self.path}: tensor {hf_name} is past num_hidden_layers={self.config.n_layer}"
                )
            return f"blk.{layer}.{self.spec.layer_map[m.group(2)]}"
        raise UnsupportedModelError(
            f"{self.path}: tensor {hf_name!r} has no place in a GGUF {self.spec.arch} model"
        )

    def _hf_name(self, gguf_name: str) -> str:
        """The checkpoint name a GGUF tensor comes from (for messages)."""
        for hf, gguf in _GLOBAL.items():
            if gguf == gguf_name:
                return hf
        layer, _, suffix = gguf_name.removeprefix("blk.").partition(".")
        if self.spec.experts and suffix.endswith("_exps.weight"):
            return self.spec.experts.hf_name(int(layer), suffix.removesuffix(".weight"))
        hf_suffix = next((k for k, v in self.spec.layer_map.items() if v == suffix), suffix)
        return f"model.layers.{layer}.{hf_suffix}"

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.config
        q, kv = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        per_layer = {
            "attn_norm.weight": (c.n_embd,),
            "attn_q.weight": (q, c.n_embd),
            "attn_k.weight": (kv, c.n_embd),
            "attn_v.weight": (kv, c.n_embd),
            "attn_output.weight": (c.n_embd, q),
            "attn_q.bias": (q,),
            "attn_k.bias": (kv,),
            "attn_v.bias": (kv,),
            "attn_q_norm.weight": (c.head_dim,),
            "attn_k_norm.weight": (c.head_dim,),
            "post_attention_norm.weight": (c.n_embd,),
            "ffn_norm.weight": (c.n_embd,),
            "post_ffw_norm.weight": (c.n_embd,),
            "ffn_gate.weight": (c.n_ff, c.n_embd),
            "ffn_up.weight": (c.n_ff, c.n_embd),
            "ffn_down.weight": (c.n_embd, c.n_ff),
            "ffn_gate_inp.weight": (self.n_expert, c.n_embd),
            "ffn_gate_exps.weight": (self.n_expert, self.n_ff_exp, c.n_embd),
            "ffn_up_exps.weight": (self.n_expert, self.n_ff_exp, c.n_embd),
            "ffn_down_exps.weight": (self.n_expert, c.n_embd, self.n_ff_exp),
        }
        if self.spec.experts and "mlp.shared_expert_gate.weight" in self.spec.layer_map:
            fs = c.positive("shared_expert_intermediate_size")
            per_layer.update(
                {
                    "ffn_gate_shexp.weight": (fs, c.n_embd),
                    "ffn_up_shexp.weight": (fs, c.n_embd),
                    "ffn_down_shexp.weight": (c.n_embd, fs),
                    "ffn_gate_inp_shexp.weight": (1, c.n_embd),  # stored [1, n_embd]; written as a vector
                }
            )
        suffixes = list(self.spec.layer_map.values())
        if self.spec.experts:
            suffixes += [f"{stem}.weight" for stem in self.spec.experts.projections.values()]
        # In the order the file gets them: embeddings, layers, head (as llama.cpp's files).
        shapes = {"token_embd.weight": (c.n_vocab, c.n_embd)}
        for i in range(c.n_layer):
            for suffix in suffixes:
                shapes[f"blk.{i}.{suffix}"] = per_layer[suffix]
        shapes["output_norm.weight"] = (c.n_embd,)
        if not self.tied:
            shapes["output.weight"] = (c.n_vocab, c.n_embd)
        return shapes

    def _tensors(self) -> list[SourceTensor]:
        expected = self._expected_shapes()
        found: dict[str, str] = {}  # GGUF name -> checkpoint name
        experts: dict[str, dict[int, str]] = {}  # stacked GGUF name -> expert -> checkpoint name
        for hf_name in self.checkpoint:
            stacked = self._expert_of(hf_name)
            if stacked is not None:
                name, e = stacked
                experts.setdefault(name, {})[e] = hf_name
                continue
            name = self._gguf_name(hf_name)
            if name is None:
                continue
            shape = self.checkpoint.tensors[hf_name].shape
            if shape != expected[name]:
                raise UsageError(
                    f"{self.path}: {hf_name} has shape {list(shape)}, config.json implies {list(expected[name])}"
                )
            found[name] = hf_name
        for name, by_expert in experts.items():
            self._check_experts(name, by_expert, expected[name])
            found[name] = by_expert[0]
        missing = [n for n in expected if n not in found]
        if missing:
            raise UsageError(
                f"{self.path}: the checkpoint lacks {len(missing)} tensors (first: {self._hf_name(missing[0])})"
            )
        tensors = [
            self._stacked(name, experts[name]) if name in experts else self._tensor(name, found[name])
            for name in expected
        ]
        freqs = self._rope_freqs()
        if freqs is not None:
            tensors.insert(1, _array_tensor("rope_freqs.weight", freqs))
        return tensors

    def _expert_of(self, hf_name: str) -> tuple[str, int] | None:
        """(stacked GGUF name, expert index) of one expert's matrix; None for other tensors."""
        m = _LAYER_RE.match(hf_name)
        ex = self.spec.experts
        e = ex.pattern.match(m.group(2)) if m and ex else None
        if m is None or ex is None or e is None:
            return None
        layer, expert = int(m.group(1)), int(e.group(1))
        if layer >= self.config.n_layer or expert >= self.n_expert:
            raise UsageError(f"{self.path}: tensor {hf_name} is past the model's layers or experts")
        return f"blk.{layer}.{ex.projections[e.group(2)]}.weight", expert

    def _check_experts(self, name: str, by_expert: dict[int, str], shape: tuple[int, ...]) -> None:
        layer = int(name.split(".")[1])
        stem = name.split(".")[2]
        for e in range(self.n_expert):
            if e not in by_expert:
                raise UsageError(
                    f"{self.path}: the checkpoint lacks {self.spec.experts.hf_name(layer, stem, e)}"
                )
            got = self.checkpoint.tensors[by_expert[e]].shape
            if got != shape[1:]:
                raise UsageError(
                    f"{self.path}: {by_expert[e]} has shape {list(got)}, config.json implies {list(shape[1:])}"
                )

    def _stacked(self, name: str, by_expert: dict[int, str]) -> SourceTensor:
        first = self._tensor(name, by_expert[0])
        shape = (self.n_expert, *first.shape)
        return stacked_tensor(
            name, shape, first.type, lambda e, rows: self.checkpoint.read(by_expert[e], rows)
        )

    def _tensor(self, name: str, hf_name: str) -> SourceTensor:
        ct = self.checkpoint.tensors[hf_name]
        shape = ct.shape
        src_type = {"F32": GGMLType.F32, "F16": GGMLType.F16, "BF16": GGMLType.BF16}.get(
            ct.dtype, GGMLType.F32
        )
        c = self.config
        transform: Callable[[np.ndarray], np.ndarray] | None = None
        if self.spec.permute_qk and name.endswith(("attn_q.weight", "attn_k.weight")):
            n_head = c.n_head if name.endswith("attn_q.weight") else c.n_head_kv
            transform = lambda w, n_head=n_head: permute_qk(w, n_head)  # noqa: E731
        elif self.spec.norm_plus_one and hf_name.endswith("norm.weight"):
            transform = lambda w: w + np.float32(1.0)  # noqa: E731

        def read_rows(start: int, stop: int) -> np.ndarray:
            if transform is None and len(shape) > 1:
                return self.checkpoint.read(hf_name, slice(start, stop))
            # A 1-D tensor is one row; the Q/K permutation moves rows: read those whole.
            w = self.checkpoint.read(hf_name).reshape(-1, shape[-1])
            return (transform(w) if transform is not None else w)[start:stop]

        if name.endswith("ffn_gate_inp_shexp.weight"):
            shape = shape[1:]  # llama.cpp reads it as an n_embd vector
        return SourceTensor(name, shape, int(src_type), read_rows)

    def _rope_freqs(self) -> np.ndarray | None:
        """Llama 3.1-style RoPE scaling as per-dimension frequency divisors (convert_hf_to_gguf's
        LlamaModel.generate_extra_tensors)."""
        if self.spec.arch != "llama" or self.config.rope_type != "llama3":
            return None
        theta, scaling = self.config.rope()
        base = float(theta or self.spec.rope_theta_default)
        dim = self.config.head_dim
        freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
        factor = float(scaling.get("factor", 8.0))
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        factors = []
        for f in freqs:
            wavelen = 2 * math.pi / f
            if wavelen < high_wavelen:
                factors.append(1.0)
            elif wavelen > low_wavelen:
                factors.append(factor)
            else:
                smooth = (old_ctx / wavelen - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        return np.array(factors, dtype=np.float32)

    @property
    def size_on_disk(self) -> int:
        return sum(f.stat().st_size for f in {t.file for t in self.checkpoint.tensors.values()})

    def keep_type(self, tensor: SourceTensor) -> int:
        return int(GGMLType.F32)  # convert_hf_to_gguf writes 1-D tensors and norms as F32

    # -- metadata --------------------------------------------------------------------------------------

    def add_metadata(self, w: GGUFWriter, file_type: int) -> None:
        c, arch = self.config, self.spec.arch
        n_params = sum(t.n_elements for t in self.tensors)
        w.add_type("model")
        w.add_name(str(c.get("_name_or_path") or self.path.name).rstrip("/").split("/")[-1])
        w.add_size_label(size_label(n_params, 0, 0, 0))
        if arch == "llama":
            w.add_vocab_size(c.n_vocab)
        w.add_context_length(c.positive("max_position_embeddings", 131072 if arch == "gemma3" else None))
        w.add_embedding_length(c.n_embd)
        w.add_block_count(c.n_layer)
        w.add_feed_forward_length(c.n_ff)
        w.add_head_count(c.n_head)
        w.add_head_count_kv(c.n_head_kv)
        theta, scaling = c.rope()
        w.add_rope_freq_base(float(theta or self.spec.rope_theta_default))
        w.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
        if arch == "llama":
            w.add_rope_dimension_count(c.head_dim)
        if "head_dim" in c.raw or arch == "gemma3":
            w.add_key_length(c.head_dim)
            w.add_value_length(c.head_dim)
        if self.n_expert:
            w.add_expert_count(self.n_expert)
            w.add_expert_used_count(c.positive("num_experts_per_tok"))
            if arch != "llama":  # Mixtral's experts are feed_forward_length wide
                w.add_expert_feed_forward_length(self.n_ff_exp)
            if "mlp.shared_expert_gate.weight" in self.spec.layer_map:
                w.add_expert_shared_feed_forward_length(c.positive("shared_expert_intermediate_size"))
        if c.rope_type == "linear":
            w.add_rope_scaling_type(RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(scaling["factor"]))
        if arch == "gemma3":
            self._gemma3_metadata(w)
        w.add_file_type(file_type)
        w.add_quantization_version(GGML_QUANT_VERSION)
        add_tokenizer(w, self.path, arch, c.n_vocab)

    def _gemma3_metadata(self, w: GGUFWriter) -> None:
        c = self.config
        if c.get("sliding_window") is not None:
            w.add_sliding_window(int(c.get("sliding_window")))
        local = c.get("rope_parameters", {}).get("sliding_attention", {}).get("rope_theta")
        local = local or c.get("rope_local_base_freq")
        if local is not None:
            w.add_rope_freq_base_swa(float(local))
        if c.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(float(c.get("final_logit_softcapping")))

    def close(self) -> None:
        self.checkpoint.close()


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: within each head, rows (0..d/2, d/2..d) interleaved so that
    rotating adjacent pairs equals Hugging Face's rotate_half on the original rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _array_tensor(name: str, values: np.ndarray) -> SourceTensor:
    data = np.ascontiguousarray(values, dtype=np.float32)
    return SourceTensor(name, data.shape, int(GGMLType.F32), lambda a, b: data.reshape(1, -1)[a:b])
