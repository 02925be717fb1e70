"""ModelConfig: the hyper-parameters of a model, read from GGUF metadata.

Each architecture module fills in what differs (see llamacy/model/architectures.py); this file holds the
fields and the reading of the keys every architecture shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from llamacy.errors import UnsupportedModelError
from llamacy.model.kv_types import kv_itemsize

ROPE_NORM = 0  # rotate adjacent pairs: llama as GGUF stores it
ROPE_NEOX = 2  # rotate halves: qwen2/3, gemma3


@dataclass
class ModelConfig:
    arch: str
    name: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_rot: int
    rms_eps: float
    rope_base: float
    rope_freq_scale: float = 1.0
    rope_mode: int = ROPE_NORM
    activation: str = "silu"
    embd_scale: float = 1.0
    attn_scale: float = 0.0  # 0 means 1/sqrt(head_dim)
    final_softcap: float = 0.0  # logits = c * tanh(logits / c) when > 0 (Gemma-2-style files)
    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    # Per layer: sliding-window size (0 = global) and RoPE base / frequency scale.
    layer_window: list[int] = field(default_factory=list)
    layer_rope_base: list[float] = field(default_factory=list)
    layer_rope_freq_scale: list[float] = field(default_factory=list)
    # Mixture of experts (0 experts: a dense model). Each layer routes a token to n_expert_used of
    # n_expert feed-forward blocks of width n_ff_exp; n_ff_shexp > 0 adds a shared expert (qwen2moe).
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    expert_norm: bool = False  # renormalise the chosen experts' weights to sum to 1

    def __post_init__(self) -> None:
        if not self.attn_scale:
            self.attn_scale = 1.0 / math.sqrt(self.head_dim)
        if not self.layer_window:
            self.layer_window = [0] * self.n_layer
        if not self.layer_rope_base:
            self.layer_rope_base = [self.rope_base] * self.n_layer
        if not self.layer_rope_freq_scale:
            self.layer_rope_freq_scale = [self.rope_freq_scale] * self.n_layer

    @property
    def kv_width(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def ffn_params(self) -> tuple[int, int]:
        """Feed-forward weights per layer: (stored, read for one token). Equal for a dense model; a mixture
        stores every expert but a token reads the router, its n_expert_used experts and the shared one."""
        if not self.n_expert:
            return 3 * self.n_embd * self.n_ff, 3 * self.n_embd * self.n_ff
        expert, shared = 3 * self.n_embd * self.n_ff_exp, 3 * self.n_embd * self.n_ff_shexp
        fixed = self.n_expert * self.n_embd + shared + (self.n_embd if self.n_ff_shexp else 0)
        return fixed + self.n_expert * expert, fixed + self.n_expert_used * expert

    def kv_bytes(self, n_ctx: int, n_seq: int = 1, kv_type: str = "f16") -> int:
        """Memory of a KV cache of kv_type (kv_types.KV_TYPES) for n_ctx positions of n_seq sequences."""
        return 2 * self.n_layer * n_seq * n_ctx * self.kv_width * kv_itemsize(kv_type)


class MetadataReader:
    """Typed access to `{arch}.*` keys with one-line errors for missing or malformed values."""

    def __init__(self, metadata: dict[str, Any], arch: str, source: str) -> None:
        self.md = metadata
        self.arch = arch
        self.source = source

    def _get(self, key: str, default: Any, kind: type) -> Any:
        full = f"{self.arch}.{key}"
        value = self.md.get(full, default)
        if value is None:
            raise UnsupportedModelError(f"{self.source}: metadata key {full} is missing")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UnsupportedModelError(f"{self.source}: metadata key {full} is not a number: {value!r}")
        return kind(value)

    def int(self, key: str, default: int | None = None, minimum: int = 1, maximum: int = 1 << 24) -> int:
        # The upper bound keeps a hostile file from sizing lists and caches by absurd numbers; real
        # models are far below it (the largest vocabularies are ~256k, contexts ~1M, widths ~16k).
        value = self._get(key, default, int)
        if not minimum <= value <= maximum:
            raise UnsupportedModelError(f"{self.source}: {self.arch}.{key} = {value} is out of range")
        return value

    def float(self, key: str, default: float | None = None) -> float:
        value = self._get(key, default, float)
        if not math.isfinite(value):
            raise UnsupportedModelError(f"{self.source}: {self.arch}.{key} is not finite")
        return value


def expert_hparams(metadata: dict[str, Any], arch: str, source: str, norm: bool) -> dict[str, Any]:
    """The mixture-of-experts keys ({arch}.expert_*), as ModelConfig keyword arguments; none for a file
    without experts. norm: whether the architecture renormalises the chosen experts' weights."""
    r = MetadataReader(metadata, arch, source)
    n_expert = r.int("expert_count", 0, minimum=0, maximum=4096)
    if not n_expert:
        return {}
    used = r.int("expert_used_count", maximum=n_expert)
    return dict(
        n_expert=n_expert,
        n_expert_used=used,
        n_ff_exp=r.int("expert_feed_forward_length", r.int("feed_forward_length")),
        n_ff_shexp=r.int("expert_shared_feed_forward_length", 0, minimum=0),
        expert_norm=norm,
    )


def common_hparams(metadata: dict[str, Any], arch: str, source: str) -> dict[str, Any]:
    """The keys every llama-like architecture shares, as ModelConfig keyword arguments."""
    r = MetadataReader(metadata, arch, source)
    n_embd = r.int("embedding_length")
    n_head = r.int("attention.head_count")
    n_head_kv = r.int("attention.head_count_kv", n_head)
    head_dim = r.int("attention.key_length", n_embd // n_head)
    value_dim = r.int("attention.value_length", head_dim)
    if value_dim != head_dim:
        raise UnsupportedModelError(f"{source}: key and value head sizes differ ({head_dim} vs {value_dim})")
    if n_head % n_head_kv:
        raise UnsupportedModelError(f"{source}: {n_head} heads do not split into {n_head_kv} KV groups")
    tokens = metadata.get("tokenizer.ggml.tokens")
    n_vocab = r.int("vocab_size", len(tokens) if tokens is not None else None)
    n_rot = r.int("rope.dimension_count", head_dim)
    if n_rot > head_dim or n_rot % 2:
        raise UnsupportedModelError(f"{source}: rope dimension {n_rot} does not fit head size {head_dim}")
    # Older files say rope.scale_linear; newer ones rope.scaling.type + factor.
    freq_scale = 1.0 / r.float("rope.scale_linear", 1.0)
    scaling = metadata.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise UnsupportedModelError(f"{source}: RoPE scaling {scaling!r} is not supported (only linear)")
        freq_scale = 1.0 / r.float("rope.scaling.factor", 1.0)
    return dict(
        arch=arch,
        name=str(metadata.get("general.name", "")),
        n_vocab=n_vocab,
        n_ctx_train=r.int("context_length", maximum=1 << 26),
        n_embd=n_embd,
        n_layer=r.int("block_count", maximum=4096),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=r.int("feed_forward_length"),
        n_rot=n_rot,
        rms_eps=r.float("attention.layer_norm_rms_epsilon", 1e-5),
        rope_base=r.float("rope.freq_base", 10000.0),
        rope_freq_scale=freq_scale,
    )
