"""Bind a GGUF file's tensors to the layer loop: find each tensor, check its shape and type, and hand the
layer loop typed records (Matrix, LayerWeights, ModelWeights), field for field what it reads.

Weights stay in the memory-mapped file; only the small norm and bias vectors are copied (to float32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llamacy.errors import UnsupportedModelError
from llamacy.ggml_types import BLOCK_LAYOUT, COMPUTE_TYPES, GGMLType, type_name
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
    gate: Matrix | None  # the dense feed-forward block; None in a mixture-of-experts layer
    up: Matrix | None
    down: Matrix | None
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
    # Mixture of experts: the router [n_expert, n_embd] and the experts stacked along the rows (expert e's
    # matrix is rows [e * r, (e + 1) * r) of r = rows / n_expert); a shared expert and its gate (qwen2moe).
    gate_inp: Matrix | None = None
    gate_exps: Matrix | None = None
    up_exps: Matrix | None = None
    down_exps: Matrix | None = None
    gate_shexp: Matrix | None = None
    up_shexp: Matrix | None = None
    down_shexp: Matrix | None = None
    gate_inp_shexp: Vector | None = None


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
        return self._as_matrix(name, t, rows, cols)

    def _as_matrix(self, name: str, t: Any, rows: int, cols: int) -> Matrix:
        if t.type not in COMPUTE_TYPES:
            raise UnsupportedModelError(
                f"{self.source}: tensor {name} has type {type_name(t.type)}, which llamacy cannot compute with yet"
            )
        return Matrix(t.data, int(t.type), rows, cols, t.n_bytes // rows)

    def experts(self, name: str, rows: int, cols: int) -> Matrix:
        """A 3-D [n_expert, rows, cols] tensor as one matrix of n_expert * rows rows."""
        n = self.cfg.n_expert
        t = self._tensor(name)
        if tuple(t.shape) != (n, rows, cols):
            raise UnsupportedModelError(
                f"{self.source}: tensor {name} has shape {t.shape}, expected {(n, rows, cols)}"
            )
        flat = _Flat(t.data, t.type, (n * rows, cols), t.n_bytes)
        return self._as_matrix(name, flat, n * rows, cols)

    def vector(self, name: str, n: int, optional: bool = False) -> np.ndarray | None:
        t = self._tensor(name, optional)
        if t is None:
            return None
        if tuple(t.shape) == (1, n):  # a [1, n] matrix is a vector (qwen2moe's shared-expert gate)
            t = _Flat(t.data, t.type, (n,), t.n_bytes)
        if tuple(t.shape) != (n,):
            raise UnsupportedModelError(f"{self.source}: tensor {name} has shape {t.shape}, expected {(n,)}")
        if t.type == GGMLType.F32:
            return np.frombuffer(t.data, dtype=np.float32).copy()
        if t.type == GGMLType.F16:
            return np.frombuffer(t.data, dtype=np.float16).astype(np.float32)
        if t.type == GGMLType.BF16:
            raw = np.frombuffer(t.data, dtype=np.uint16).astype(np.uint32) << 16
            return raw.view(np.float32).copy()
        if t.type in COMPUTE_TYPES and n % BLOCK_LAYOUT[t.type][0] == 0:
            # A quantized vector: llama-quantize quantizes a [1, n] tensor such as ffn_gate_inp_shexp.
            from llamacy.kernels.quantize import dequantize

            return dequantize(int(t.type), t.data, (n,), 1).reshape(n)
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

        moe, shared = c.n_expert > 0, c.n_ff_shexp > 0
        FE, FS = c.n_ff_exp, c.n_ff_shexp
        return LayerWeights(
            attn_norm=vec(p + "attn_norm.weight", E),
            wq=self.matrix(p + "attn_q.weight", QW, E),
            wk=self.matrix(p + "attn_k.weight", KVW, E),
            wv=self.matrix(p + "attn_v.weight", KVW, E),
            wo=self.matrix(p + "attn_output.weight", E, QW),
            ffn_norm=vec(p + "ffn_norm.weight", E),
            gate=None if moe else self.matrix(p + "ffn_gate.weight", F, E),
            up=None if moe else self.matrix(p + "ffn_up.weight", F, E),
            down=None if moe else self.matrix(p + "ffn_down.weight", E, F),
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
            gate_inp=self.matrix(p + "ffn_gate_inp.weight", c.n_expert, E) if moe else None,
            gate_exps=self.experts(p + "ffn_gate_exps.weight", FE, E) if moe else None,
            up_exps=self.experts(p + "ffn_up_exps.weight", FE, E) if moe else None,
            down_exps=self.experts(p + "ffn_down_exps.weight", E, FE) if moe else None,
            gate_shexp=self.matrix(p + "ffn_gate_shexp.weight", FS, E) if shared else None,
            up_shexp=self.matrix(p + "ffn_up_shexp.weight", FS, E) if shared else None,
            down_shexp=self.matrix(p + "ffn_down_shexp.weight", E, FS) if shared else None,
            gate_inp_shexp=optional(shared, "ffn_gate_inp_shexp.weight", E),
        )


@dataclass(frozen=True, slots=True)
class _Flat:
    """A tensor seen with another shape of the same rows (3-D experts as 2-D, [1, n] as [n])."""

    data: Any
    type: int
    shape: tuple[int, ...]
    n_bytes: int
