"""ModelConfig: the hyper-parameters of a model, read from GGUF metadata, and LayerSpec, the recipe of
one layer (which blocks it runs, which memory it keeps).

Each architecture file fills in what differs (llamacy/model/archs/); this file holds the fields and the
reading of the keys every architecture shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from llamacy.errors import UnsupportedModelError
from llamacy.model.kv_types import kv_row_bytes

ROPE_NORM = 0  # rotate adjacent pairs: llama as GGUF stores it
ROPE_NEOX = 2  # rotate halves: qwen2/3, gemma3, nemotron

# Block kinds (the layer loop dispatches on them; layout.pxd has their C twins, in the same order).
NORMS = ("rms", "layer")  # RMSNorm; LayerNorm with bias
# attention: full, or sliding-window when the layer's window > 0; deltanet: gated delta-net linear attention
# (Qwen3-Next, Qwen3.5); mamba2: a Mamba2 selective scan (Nemotron-H). The last two keep a recurrent state.
MIXERS = ("none", "attention", "deltanet", "mamba2")
RECURRENT_MIXERS = ("deltanet", "mamba2")
# moe: plus a shared expert when n_ff_shexp > 0; dense_moe: a gated FFN and a mixture summed (Gemma 4);
# moe_ungated: sigmoid routing with a per-expert choice bias, ungated experts of the model's activation, an
# ungated shared expert and an optional latent projection around the experts (Nemotron-H MoE: moe_ungated.pyx)
FFNS = ("none", "gated", "ungated", "moe", "dense_moe", "moe_ungated")
ACTIVATIONS = ("silu", "gelu", "relu2")  # gelu: the tanh approximation; relu2: relu(x)^2
# What a layer remembers of a sequence: nothing, K/V of every position, K/V of its window only, nothing
# of its own because it reads an earlier layer's K/V (Gemma 4's shared-KV layers), or a fixed-size
# recurrent state (a delta-net's or Mamba2's: its convolution's last inputs and the scan's state).
MEMORY_NONE, MEMORY_KV, MEMORY_WINDOW, MEMORY_SHARED = "none", "kv", "window", "shared"
MEMORY_RECURRENT = "recurrent"


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """The recipe of one layer: norm -> mixer -> residual, norm -> feed-forward -> residual."""

    mixer: str = "attention"
    ffn: str = "gated"
    window: int = 0  # sliding-window size in positions; 0 = the whole context
    rope_base: float = 10000.0
    rope_freq_scale: float = 1.0
    # The layer's own shapes (Gemma 4 varies them per layer): KV heads, head size, rotary dimensions,
    # feed-forward width. 0 = the model's (ModelConfig.layers always fills them in).
    n_head_kv: int = 0
    head_dim: int = 0
    n_rot: int = 0
    n_ff: int = 0
    kv_from: int = -1  # >= 0: computes only Q and attends over that earlier layer's K/V rows
    rope_freqs: bool = True  # divides its RoPE frequencies by the model's rope_freqs (where the file has it)
    # A recurrent mixer's state per sequence, in float32 values: its convolution's carried inputs, then
    # the scan's state (the mixer's module documents the layout). 0 for other mixers.
    state_conv: int = 0
    state_ssm: int = 0
    attn_gate: bool = False  # the Q projection also yields a per-head output gate (Qwen3-Next, Qwen3.5)

    def __post_init__(self) -> None:
        if self.mixer not in MIXERS or self.ffn not in FFNS:
            raise ValueError(f"unknown block kind in {self}")
        if (self.mixer in RECURRENT_MIXERS) != (self.state_conv + self.state_ssm > 0):
            raise ValueError(f"a recurrent mixer needs a state, and only it: {self}")

    @property
    def memory(self) -> str:
        if self.mixer in RECURRENT_MIXERS:
            return MEMORY_RECURRENT
        if self.mixer != "attention":
            return MEMORY_NONE
        if self.kv_from >= 0:
            return MEMORY_SHARED
        return MEMORY_WINDOW if self.window > 0 else MEMORY_KV


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
    norm: str = "rms"
    # Per layer: sliding-window size (0 = global) and RoPE base / frequency scale.
    layer_window: list[int] = field(default_factory=list)
    layer_rope_base: list[float] = field(default_factory=list)
    layer_rope_freq_scale: list[float] = field(default_factory=list)
    layer_ffn: list[str] = field(default_factory=list)  # per layer; default "gated", or "moe" with experts
    # Per layer (default: the model-wide value): KV heads, head size, rotary dims, feed-forward width, the
    # earlier layer whose K/V a shared-KV layer reads (-1: its own), whether rope_freqs applies.
    layer_n_head_kv: list[int] = field(default_factory=list)
    layer_head_dim: list[int] = field(default_factory=list)
    layer_n_rot: list[int] = field(default_factory=list)
    layer_n_ff: list[int] = field(default_factory=list)
    layer_kv_from: list[int] = field(default_factory=list)
    layer_rope_freqs: list[bool] = field(default_factory=list)
    # Per layer: the mixer (config.MIXERS; default attention) and a recurrent mixer's state sizes.
    layer_mixer: list[str] = field(default_factory=list)
    layer_state_conv: list[int] = field(default_factory=list)
    layer_state_ssm: list[int] = field(default_factory=list)
    # State-space / linear-attention shapes (GGUF {arch}.ssm.*), as llama.cpp maps both recurrent families
    # onto them: conv_kernel (the causal convolution's width), inner_size (Mamba2's d_inner; the delta-net's
    # value width, value heads x head size), state_size (Mamba2's d_state; the delta-net's key head size),
    # group_count (Mamba2's B/C groups; the delta-net's key heads), time_step_rank (Mamba2's heads; the
    # delta-net's value heads). 0: the model has no recurrent layers.
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_n_group: int = 0
    ssm_dt_rank: int = 0
    # Attention layers' Q projection carries q and an output gate per head, interleaved per head
    # ([q_0, gate_0, q_1, ...]); the attention output is multiplied by sigmoid(gate) (Qwen3-Next, Qwen3.5).
    attn_gate: bool = False
    # The delta-net's key heads as its value heads see them: False, value head h reads key head
    # h // (n_v / n_k) (Qwen3-Next, as Hugging Face's repeat_interleave); True, key head h % n_k (Qwen3.5:
    # llama.cpp's converter reorders the value heads to tiled order so that ggml_repeat broadcasts).
    ssm_k_tiled: bool = False
    # Multi-token-prediction blocks the file holds after the n_layer layers (not run: archs/base.py).
    n_nextn: int = 0
    v_norm: bool = False  # V rows RMS-normed without a weight (Gemma 4)
    n_embd_per_layer: int = 0  # per-layer embeddings' width (Gemma 4 E2B/E4B); 0: none
    # Mixture of experts (0 experts: a dense model). Each layer routes a token to n_expert_used of
    # n_expert feed-forward blocks of width n_ff_exp; n_ff_shexp > 0 adds a shared expert (qwen2moe).
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    expert_norm: bool = False  # renormalise the chosen experts' weights to sum to 1
    expert_scale: float = 1.0  # the chosen experts' weights multiplied by this (expert_weights_scale)
    moe_latent_size: int = 0  # > 0: the experts work in a latent space of this width (ffn_latent_down/up)

    def __post_init__(self) -> None:
        if not self.attn_scale:
            self.attn_scale = 1.0 / math.sqrt(self.head_dim)
        if not self.layer_window:
            self.layer_window = [0] * self.n_layer
        if not self.layer_rope_base:
            self.layer_rope_base = [self.rope_base] * self.n_layer
        if not self.layer_rope_freq_scale:
            self.layer_rope_freq_scale = [self.rope_freq_scale] * self.n_layer
        if not self.layer_ffn:
            self.layer_ffn = ["moe" if self.n_expert else "gated"] * self.n_layer
        for name, value in (
            ("layer_n_head_kv", self.n_head_kv),
            ("layer_head_dim", self.head_dim),
            ("layer_n_rot", self.n_rot),
            ("layer_n_ff", self.n_ff),
            ("layer_kv_from", -1),
            ("layer_rope_freqs", True),
            ("layer_mixer", "attention"),
            ("layer_state_conv", 0),
            ("layer_state_ssm", 0),
        ):
            if not getattr(self, name):
                setattr(self, name, [value] * self.n_layer)
        if self.norm not in NORMS or self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown norm {self.norm!r} or activation {self.activation!r}")
        if any(m not in MIXERS for m in self.layer_mixer):
            raise ValueError(f"unknown mixer in {self.layer_mixer}")
        # The loop's activations: act(gate) * up for a gated FFN, relu(up)^2 for an ungated one.
        for ffn in set(self.layer_ffn):
            if ffn not in FFNS or (
                (ffn == "ungated") != (self.activation == "relu2") and ffn in ("gated", "ungated")
            ):
                raise ValueError(f"a {ffn} feed-forward with {self.activation} is not supported")

    @property
    def layers(self) -> list[LayerSpec]:
        """Each layer's recipe."""
        return [
            LayerSpec(
                self.layer_mixer[i],
                self.layer_ffn[i],
                self.layer_window[i],
                self.layer_rope_base[i],
                self.layer_rope_freq_scale[i],
                self.layer_n_head_kv[i],
                self.layer_head_dim[i],
                self.layer_n_rot[i],
                self.layer_n_ff[i],
                self.layer_kv_from[i],
                self.layer_rope_freqs[i],
                self.layer_state_conv[i],
                self.layer_state_ssm[i],
                self.attn_gate and self.layer_mixer[i] == "attention",
            )
            for i in range(self.n_layer)
        ]

    @property
    def kv_width(self) -> int:
        return self.n_head_kv * self.head_dim

    def widest(self) -> dict[str, int]:
        """The widest layer's activations (the scratch is sized by them): q and KV row widths, query heads
        per KV head, feed-forward width, rotary dimensions."""
        specs = [s for s in self.layers if s.mixer == "attention"] or self.layers[:1]
        return dict(
            q=max(self.n_head * s.head_dim for s in specs),
            kv=max(s.n_head_kv * s.head_dim for s in specs),
            group=max(self.n_head // max(1, s.n_head_kv) for s in specs),  # 0: a model without attention
            n_ff=max(s.n_ff for s in self.layers),
            n_rot=max(s.n_rot for s in specs),
        )

    @property
    def ffn_params(self) -> tuple[int, int]:
        """Feed-forward weights per layer: (stored, read for one token). Equal for a dense model; a mixture
        stores every expert but a token reads the router, its n_expert_used experts and the shared one."""
        if not self.n_expert:
            dense = (2 if "ungated" in self.layer_ffn else 3) * self.n_embd * self.n_ff
            return dense, dense
        expert, shared = 3 * self.n_embd * self.n_ff_exp, 3 * self.n_embd * self.n_ff_shexp
        fixed = self.n_expert * self.n_embd + shared + (self.n_embd if self.n_ff_shexp else 0)
        if "moe_ungated" in self.layer_ffn:  # Nemotron-H: up and down only, around the latent projection
            width = self.moe_latent_size or self.n_embd
            expert = 2 * width * self.n_ff_exp
            fixed = self.n_expert * self.n_embd + 2 * self.n_embd * self.n_ff_shexp
            fixed += 2 * self.n_embd * self.moe_latent_size
        if "dense_moe" in self.layer_ffn:  # Gemma 4: a dense gated FFN beside the experts
            fixed += 3 * self.n_embd * self.n_ff
        return fixed + self.n_expert * expert, fixed + self.n_expert_used * expert

    def layer_mix(self, n_ctx: int, ubatch: int = 256) -> list[dict[str, Any]]:
        """The layers grouped by recipe, in order of first appearance: what each runs and how many
        positions of a sequence it keeps (`llamacy info`)."""
        groups: dict[tuple[str, str, int, str], dict[str, Any]] = {}
        for spec in self.layers:
            key = (spec.mixer, spec.ffn, spec.window, spec.memory)
            state = 4 * (spec.state_conv + spec.state_ssm)
            if key not in groups:
                groups[key] = {
                    "mixer": spec.mixer,
                    "ffn": spec.ffn,
                    "window": spec.window,
                    "memory": spec.memory,
                    "positions": kv_slots(spec, n_ctx, ubatch),
                    "state_bytes": state,
                    "count": 0,
                }
            groups[key]["count"] += 1
        return list(groups.values())

    @property
    def state_bytes(self) -> int:
        """One sequence's recurrent state in every layer that keeps one (bytes; 0 for attention-only)."""
        return 4 * sum(s.state_conv + s.state_ssm for s in self.layers)

    @property
    def recurrent(self) -> bool:
        return any(m in RECURRENT_MIXERS for m in self.layer_mixer)

    def kv_bytes(self, n_ctx: int, n_seq: int = 1, kv_type: str = "f16", ubatch: int = 256) -> int:
        """Memory of the K/V rows of kv_type (kv_types.KV_TYPE_NAMES) for n_ctx positions of n_seq sequences:
        a sliding-window layer holds only its window (memory.py's ring), a layer without attention none."""
        return (
            2
            * n_seq
            * sum(
                kv_slots(spec, n_ctx, ubatch) * spec.n_head_kv * kv_row_bytes(kv_type, spec.head_dim)
                for spec in self.layers
            )
        )


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


def file_hparams(metadata: dict[str, Any], arch: str, source: str) -> dict[str, Any]:
    """What every architecture reads alike, whatever its layers: name, vocabulary size (the key, else the
    tokenizer's length) and trained context, as ModelConfig keyword arguments."""
    r = MetadataReader(metadata, arch, source)
    tokens = metadata.get("tokenizer.ggml.tokens")
    return dict(
        arch=arch,
        name=str(metadata.get("general.name", "")),
        n_vocab=r.int("vocab_size", len(tokens) if tokens is not None else None),
        n_ctx_train=r.int("context_length", maximum=1 << 26),
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
        **file_hparams(metadata, arch, source),
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


def kv_slots(spec: LayerSpec, n_ctx: int, ubatch: int) -> int:
    """Cached positions a layer keeps per sequence (and KV head): none without attention, n_ctx for full
    attention; a sliding-window layer keeps a ring of window + ubatch - 1 positions (a micro-batch's
    tokens all write before any attends, so the ring must not wrap under the batch), stored twice over so
    that every window is one contiguous run of rows (memory.py). Where that is no smaller than n_ctx, the
    layer keeps the whole context like a full one."""
    if spec.memory not in (MEMORY_KV, MEMORY_WINDOW):
        return 0
    ring = ring_size(spec, n_ctx, ubatch)
    return 2 * ring if ring else n_ctx


def ring_size(spec: LayerSpec, n_ctx: int, ubatch: int) -> int:
    """The ring's period for a sliding-window layer, or 0 when the layer keeps every position."""
    if spec.memory != MEMORY_WINDOW:
        return 0
    ring = spec.window + max(1, ubatch) - 1
    return ring if 2 * ring < n_ctx else 0
