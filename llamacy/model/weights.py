"""Bind a GGUF file's tensors to the layer loop: find each tensor, check its shape and type, and hand the
layer loop typed records (Matrix, LayerWeights, ModelWeights), field for field what it reads.

Weights stay in the memory-mapped file; only the small norm and bias vectors are copied (to float32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llamacy.errors import UnsupportedModelError
from llamacy.ggml_types import COMPUTE_TYPES, GGMLType, type_name
from llamacy.model.config import ModelConfig

Vector = np.ndarray  # float32, contiguous


@dataclass(frozen=True, slots=True)
class Matrix:
    """`rows` stored rows of `cols` values of GGML type `type`, in place in the file's mapping."""

    data: Any  # a uint8 buffer of at least rows * row_bytes bytes
    type: int
    rows: int
    cols: int
    row_bytes: int


@dataclass(frozen=True, slots=True)
class LayerWeights:
    """One block's weights and per-layer settings. Optional vectors are None where the architecture has
    none (the layer loop skips that step)."""

    attn_norm: Vector
    wq: Matrix
    wk: Matrix
    wv: Matrix
    wo: Matrix
    ffn_norm: Vector
    gate: Matrix
    up: Matrix
    down: Matrix
    window: int  # sliding-window size in positions; 0 = the whole context
    rope_base: float
    rope_freq_scale: float
    bq: Vector | None = None  # q/k/v biases (qwen2)
    bk: Vector | None = None
    bv: Vector | None = None
    q_norm: Vector | None = None  # per-head q/k RMSNorm (qwen3, gemma3)
    k_norm: Vector | None = None
    post_attn_norm: Vector | None = None  # norms after attention and after the FFN (gemma3)
    post_ffn_norm: Vector | None = None


@dataclass(frozen=True, slots=True)
class ModelWeights:
    token_embd: Matrix
    output: Matrix  # token_embd itself when the head is tied to the embeddings
    output_norm: Vector
    rope_freqs: Vector | None  # per-frequency divisors (Llama 3.1 style), or None
    layers: list[LayerWeights]


class WeightBinder:
    def __init__(self, gguf: Any, cfg: ModelConfig) -> None:
        self.tensors = gguf.tensors
        self.cfg = cfg
        self.source = str(gguf.path)

    def _tensor(self, name: str, optional: bool = False) -> Any:
        t = self.tensors.get(name)
        if t is None and not optional:
            raise UnsupportedModelError(f"{self.source}: tensor {name} is missing")
        return t

    def matrix(self, name: str, rows: int, cols: int, optional: bool = False) -> Matrix | None:
        t = self._tensor(name, optional)
        if t is None:
            return None
        if tuple(t.shape) != (rows, cols):
            raise UnsupportedModelError(
                f"{self.source}: tensor {name} has shape {t.shape}, expected {(rows, cols)}"
            )
        if t.type not in COMPUTE_TYPES:
            raise UnsupportedModelError(
                f"{self.source}: tensor {name} has type {type_name(t.type)}, which llamacy cannot compute with yet"
            )
        return Matrix(t.data, int(t.type), rows, cols, t.n_bytes // rows)

    def vector(self, name: str, n: int, optional: bool = False) -> np.ndarray | None:
        t = self._tensor(name, optional)
        if t is None:
            return None
        if tuple(t.shape) != (n,):
            raise UnsupportedModelError(f"{self.source}: tensor {name} has shape {t.shape}, expected {(n,)}")
        if t.type == GGMLType.F32:
            return np.frombuffer(t.data, dtype=np.float32).copy()
        if t.type == GGMLType.F16:
            return np.frombuffer(t.data, dtype=np.float16).astype(np.float32)
        if t.type == GGMLType.BF16:
            raw = np.frombuffer(t.data, dtype=np.uint16).astype(np.uint32) << 16
            return raw.view(np.float32).copy()
        raise UnsupportedModelError(f"{self.source}: vector {name} has unsupported type {type_name(t.type)}")

    def bind(self) -> ModelWeights:
        c = self.cfg
        E, V = c.n_embd, c.n_vocab
        embd = self.matrix("token_embd.weight", V, E)
        return ModelWeights(
            token_embd=embd,
            output=self.matrix("output.weight", V, E, optional=True) or embd,  # tied embeddings
            output_norm=self.vector("output_norm.weight", E),
            rope_freqs=self.vector("rope_freqs.weight", c.n_rot // 2, optional=True),
            layers=[self._layer(i) for i in range(c.n_layer)],
        )

    def _layer(self, i: int) -> LayerWeights:
        c = self.cfg
        E, F, HD = c.n_embd, c.n_ff, c.head_dim
        QW, KVW = c.n_head * HD, c.kv_width
        p = f"blk.{i}."
        vec = self.vector

        def optional(present: bool, name: str, n: int) -> Vector | None:
            return vec(p + name, n) if present else None

        return LayerWeights(
            attn_norm=vec(p + "attn_norm.weight", E),
            wq=self.matrix(p + "attn_q.weight", QW, E),
            wk=self.matrix(p + "attn_k.weight", KVW, E),
            wv=self.matrix(p + "attn_v.weight", KVW, E),
            wo=self.matrix(p + "attn_output.weight", E, QW),
            ffn_norm=vec(p + "ffn_norm.weight", E),
            gate=self.matrix(p + "ffn_gate.weight", F, E),
            up=self.matrix(p + "ffn_up.weight", F, E),
            down=self.matrix(p + "ffn_down.weight", E, F),
            window=c.layer_window[i],
            rope_base=c.layer_rope_base[i],
            rope_freq_scale=c.layer_rope_freq_scale[i],
            bq=optional(c.qkv_bias, "attn_q.bias", QW),
            bk=optional(c.qkv_bias, "attn_k.bias", KVW),
            bv=optional(c.qkv_bias, "attn_v.bias", KVW),
            q_norm=optional(c.qk_norm, "attn_q_norm.weight", HD),
            k_norm=optional(c.qk_norm, "attn_k_norm.weight", HD),
            post_attn_norm=optional(c.post_norms, "post_attention_norm.weight", E),
            post_ffn_norm=optional(c.post_norms, "post_ffw_norm.weight", E),
        )
