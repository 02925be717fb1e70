"""Bind a GGUF file's tensors to the layer loop: find each tensor, check its shape and type.

Weights stay in the memory-mapped file; only the small norm and bias vectors are copied (to float32).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llamacy.errors import UnsupportedModelError
from llamacy.ggml_types import COMPUTE_TYPES, GGMLType, type_name
from llamacy.model.config import ModelConfig


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

    def matrix(self, name: str, rows: int, cols: int, optional: bool = False) -> tuple | None:
        """(buffer, type, rows, cols, row_bytes) for the layer loop."""
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
        return (t.data, int(t.type), rows, cols, t.n_bytes // rows)

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

    def bind(self) -> tuple[dict, list[dict]]:
        c = self.cfg
        E, V, F = c.n_embd, c.n_vocab, c.n_ff
        QW, KVW = c.n_head * c.head_dim, c.kv_width
        embd = self.matrix("token_embd.weight", V, E)
        output = self.matrix("output.weight", V, E, optional=True) or embd  # tied embeddings
        glob = {
            "token_embd": embd,
            "output": output,
            "output_norm": self.vector("output_norm.weight", E),
            "rope_freqs": self.vector("rope_freqs.weight", c.n_rot // 2, optional=True),
        }
        layers = []
        for i in range(c.n_layer):
            p = f"blk.{i}."
            d = {
                "attn_norm": self.vector(p + "attn_norm.weight", E),
                "attn_q": self.matrix(p + "attn_q.weight", QW, E),
                "attn_k": self.matrix(p + "attn_k.weight", KVW, E),
                "attn_v": self.matrix(p + "attn_v.weight", KVW, E),
                "attn_output": self.matrix(p + "attn_output.weight", E, QW),
                "ffn_norm": self.vector(p + "ffn_norm.weight", E),
                "ffn_gate": self.matrix(p + "ffn_gate.weight", F, E),
                "ffn_up": self.matrix(p + "ffn_up.weight", F, E),
                "ffn_down": self.matrix(p + "ffn_down.weight", E, F),
                "window": c.layer_window[i],
                "rope_base": c.layer_rope_base[i],
                "rope_freq_scale": c.layer_rope_freq_scale[i],
            }
            if c.qkv_bias:
                d["attn_q_bias"] = self.vector(p + "attn_q.bias", QW)
                d["attn_k_bias"] = self.vector(p + "attn_k.bias", KVW)
                d["attn_v_bias"] = self.vector(p + "attn_v.bias", KVW)
            if c.qk_norm:
                d["attn_q_norm"] = self.vector(p + "attn_q_norm.weight", c.head_dim)
                d["attn_k_norm"] = self.vector(p + "attn_k_norm.weight", c.head_dim)
            if c.post_norms:
                d["post_attention_norm"] = self.vector(p + "post_attention_norm.weight", E)
                d["post_ffw_norm"] = self.vector(p + "post_ffw_norm.weight", E)
            layers.append(d)
        return glob, layers


def hparams_for_forward(c: ModelConfig) -> dict[str, Any]:
    return {
        "n_embd": c.n_embd,
        "n_head": c.n_head,
        "n_head_kv": c.n_head_kv,
        "head_dim": c.head_dim,
        "n_ff": c.n_ff,
        "n_vocab": c.n_vocab,
        "n_rot": c.n_rot,
        "rope_mode": c.rope_mode,
        "activation": c.activation,
        "rms_eps": c.rms_eps,
        "embd_scale": c.embd_scale,
        "attn_scale": c.attn_scale,
        "attn_softcap": c.attn_softcap,
        "final_softcap": c.final_softcap,
    }
