"""How a Hugging Face checkpoint maps onto a GGUF architecture: config.json read and checked (HFConfig), and
the conversion spec (ArchSpec) that each architecture file (llamacy/model/archs/) declares for the classes
it converts from, with the shared tensor-name maps and checks those specs compose.

Names and metadata keys follow llama.cpp's convert_hf_to_gguf.py. Everything the engine could not run the
way Hugging Face does is refused (UnsupportedModelError) rather than converted into a file that would
compute something else: that is what the `check` of a spec is for.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamacy.convert.hf_moe import ExpertSpec
from llamacy.errors import UnsupportedModelError, UsageError

if TYPE_CHECKING:  # annotations only: importing gguf whole costs start-up (llamacy.gguf_names)
    from gguf import GGUFWriter

# Per-layer tensors most architectures have: Hugging Face suffix (after "model.layers.N.") -> GGUF suffix.
LAYER_COMMON = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
QK_NORMS = {"self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"}
LLAMA_LAYERS = {**LAYER_COMMON, "post_attention_layernorm.weight": "ffn_norm.weight"}
QKV_BIAS = {
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
}
# Mixture-of-experts layers: no dense feed-forward; a router (and, in qwen2moe, a gated shared expert).
MOE_ATTN = {k: v for k, v in LLAMA_LAYERS.items() if not k.startswith("mlp.")}
SHARED_EXPERT = {
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


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


def _no_check(c: HFConfig) -> None:
    pass


def _no_metadata(w: GGUFWriter, c: HFConfig) -> None:
    pass


def _no_shapes(c: HFConfig) -> dict[str, tuple[int, ...]]:
    return {}


def _no_layers(c: HFConfig) -> dict[str, str]:
    return {}


def _same_config(raw: dict[str, Any]) -> dict[str, Any]:
    return raw


def _same_name(name: str) -> str:
    return name


def _not_skipped(name: str) -> str | None:
    return None


def _no_layer_shapes(c: HFConfig, il: int) -> dict[str, tuple[int, ...] | None]:
    return {}


def _no_optional(c: HFConfig, il: int) -> frozenset[str]:
    return frozenset()


def _no_extra(c: HFConfig) -> list[tuple[str, Any]]:
    return []


def _no_overrides(c: HFConfig) -> dict[str, Any]:
    return {}


def _no_rewrite(c: HFConfig, name: str, shape: tuple[int, ...]) -> None:
    return None


def _no_nextn(c: HFConfig, names: Collection[str]) -> int:
    return 0


def _same_name_in(c: HFConfig, name: str) -> str:
    return name


@dataclass(frozen=True)
class ArchSpec:
    """How one Hugging Face class converts: the GGUF architecture, the per-layer tensor names, the
    transforms (Q/K permutation, norm + 1), the checks, and the metadata beyond the common keys."""

    arch: str
    layer_map: dict[str, str]
    tied_default: bool  # tie_word_embeddings when config.json does not say
    rope_theta_default: float
    norm_plus_one: bool = False  # Gemma's x * (1 + w), Nemotron's LayerNorm1p: stored as 1 + w
    permute_qk: bool = False  # llama
    check: Callable[[HFConfig], None] = _no_check
    experts: ExpertSpec | None = None  # mixture-of-experts layers
    global_map: dict[str, str] = field(default_factory=lambda: dict(GLOBAL))
    # Per-layer names a checkpoint has only when its config says so (e.g. attention_bias).
    optional_layers: Callable[[HFConfig], dict[str, str]] = _no_layers
    # GGUF suffix -> shape of the tensors this architecture has beyond the common table (hf.py).
    shapes: Callable[[HFConfig], dict[str, tuple[int, ...]]] = _no_shapes
    metadata: Callable[[GGUFWriter, HFConfig], None] = _no_metadata
    # Tokenizer keys the architecture's converter sets after the vocabulary (add_space_prefix, pad ids).
    tokenizer: Callable[[GGUFWriter, HFConfig], None] = _no_metadata
    context_default: int | None = None  # max_position_embeddings when config.json does not say
    vocab_size_key: bool = False  # llama writes {arch}.vocab_size
    rope_dims: Callable[[HFConfig], int] | None = None  # writes rope.dimension_count
    key_length: bool = False  # always write attention.key_length / value_length
    # Multimodal checkpoints (Gemma 4): the text model's config.json keys (e.g. those of text_config), the
    # checkpoint names mapped onto the text model's ("model.language_model.x" -> "model.x"), and the
    # tensors that are not converted (a vision tower: the reason, said once on stderr; None: converted).
    config_view: Callable[[dict[str, Any]], dict[str, Any]] = _same_config
    rename: Callable[[str], str] = _same_name
    skip: Callable[[str], str | None] = _not_skipped
    # Per-layer shapes that differ from the common table's (GGUF suffix -> shape; None: the layer has no
    # such tensor), and the suffixes a layer may lack (Gemma 4's shared-KV layers).
    layer_shapes: Callable[[HFConfig, int], dict[str, tuple[int, ...] | None]] = _no_layer_shapes
    layer_optional: Callable[[HFConfig, int], frozenset[str]] = _no_optional
    # Model-level tensors beyond token_embd / output_norm / output, written after token_embd: their GGUF
    # name -> shape; and tensors the converter generates ((GGUF name, float32 array): rope_freqs).
    global_shapes: Callable[[HFConfig], dict[str, tuple[int, ...]]] = _no_shapes
    extra_tensors: Callable[[HFConfig], list[tuple[str, Any]]] = _no_extra
    # Values for the common keys where they are per-layer arrays or differ from config.json's top level:
    # feed_forward_length, head_count_kv, key_length (written with value_length).
    overrides: Callable[[HFConfig], dict[str, Any]] = _no_overrides
    # Tensors written other than as read (Qwen3-Next: split, reordered, -exp(A_log), norms + 1): for the
    # GGUF name a checkpoint tensor of `shape` maps to, the tensors it becomes, each (GGUF name, shape,
    # function of the whole checkpoint tensor as float32); None: written as read.
    rewrite: Callable[[HFConfig, str, tuple[int, ...]], list[tuple[str, tuple[int, ...], Any]] | None] = (
        _no_rewrite
    )
    # Multi-token-prediction blocks (Qwen's mtp.*), which llama.cpp's converter writes as layers after the
    # last one, counted in block_count, with {arch}.nextn_predict_layers saying how many: the number of them
    # a checkpoint holds (from config.json and its tensor names, after `rename`; 0: none), and the name a
    # tensor is converted as, given its name after `rename` (the blocks' as "model.layers.{n_layer + i}.*",
    # their own tensors keyed in layer_map like any other per-layer one; other names unchanged).
    nextn_blocks: Callable[[HFConfig, Collection[str]], int] = _no_nextn
    nextn_rename: Callable[[HFConfig, str], str] = _same_name_in
    # The spec to use for a given config.json, where one Hugging Face class converts to two GGUF
    # architectures (Nemotron-H and its MoE form); None: this one.
    variant: Callable[[dict[str, Any]], ArchSpec] | None = None


def has_key(w: GGUFWriter, key: str) -> bool:
    """Whether the writer holds `key` already (writing a key twice is an error)."""
    return any(key in kv for kv in w.kv_data)


def check_rope(c: HFConfig, allowed: tuple[str, ...]) -> None:
    if c.rope_type not in allowed:
        raise UnsupportedModelError(f"{c.path}: RoPE scaling {c.rope_type!r} is not supported")


def check_act(c: HFConfig, key: str, expected: str, fallback_key: str | None = None) -> None:
    act = c.get(key) or (c.get(fallback_key) if fallback_key else None) or expected
    if act != expected:
        raise UnsupportedModelError(f"{c.path}: activation {act!r} is not supported (expected {expected})")


def check_llama(c: HFConfig) -> None:
    if c.get("attention_bias", False) or c.get("mlp_bias", False):
        raise UnsupportedModelError(f"{c.path}: llama with attention/MLP biases is not supported")
    check_act(c, "hidden_act", "silu")
    check_rope(c, ("default", "linear", "llama3"))


def check_qwen(c: HFConfig) -> None:
    if c.get("use_sliding_window", False):
        raise UnsupportedModelError(f"{c.path}: Qwen sliding-window attention is not supported")
    if c.get("attention_bias", False) and c.get("model_type") in ("qwen3", "qwen3_moe"):
        raise UnsupportedModelError(f"{c.path}: qwen3 with attention biases is not supported")
    check_act(c, "hidden_act", "silu")
    check_rope(c, ("default", "linear"))


def check_moe(c: HFConfig, norm_topk: bool) -> None:
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
