"""The reference forward pass: plain numpy, float64, every position from an empty cache.

It reads the file with the `gguf` package's own reader and dequantizes with `gguf.quants.dequantize`, so
it shares no code with llamacy: when the fast path and this disagree, one of them has a bug, and this one
is short enough to check by eye. It is slow on purpose (every weight dequantized on every call, attention
as a full score matrix) and refuses, with NotImplementedError, what it does not implement rather than
guessing.

Architectures and the rules followed, with where they come from (llama.cpp = ggml-org/llama.cpp src/,
"convert" = its convert_hf_to_gguf.py):

all      RMSNorm(x) = x / sqrt(mean(x²) + eps) * w (ggml_rms_norm then ggml_mul). Pre-norm residual blocks.
         Causal attention with grouped-query heads: query head h reads KV head h // (n_head / n_head_kv).
         Output head: output.weight, or token_embd.weight when the file has no output.weight (tied).
llama    RoPE "normal" mode (ggml GGML_ROPE_TYPE_NORM, llama_model_rope_type): rotates adjacent pairs
         (x[2i], x[2i+1]) with θ_i = pos · base^(-2i/n_rot), because convert permutes the HF Q/K rows so
         that this layout equals HF's rotate-half. n_rot = rope.dimension_count (default head_dim); dims
         past n_rot pass through. Optional rope_freqs.weight divides θ_i (Llama 3.1 style). FFN: SwiGLU,
         down(silu(gate·x) * up·x). Scale 1/sqrt(head_dim) unless llama.attention.scale is set.
qwen2    As llama, plus q/k/v biases; RoPE NEOX mode (rotate halves: x[i] with x[i + n_rot/2]).
qwen3    As llama with NEOX RoPE and per-head RMSNorm of q and k over head_dim (attn_q_norm / attn_k_norm,
         one weight vector shared by the heads) before RoPE; head_dim = attention.key_length.
gemma3   From llama.cpp src/models/gemma3.cpp (llm_build_gemma3<iswa>), llama-model.cpp (load_hparams,
         case LLM_ARCH_GEMMA3), llama-hparams.cpp (set_swa_pattern, is_masked_swa), and convert's
         Gemma3Model; cross-checked against HF modeling_gemma3 (Gemma3RMSNorm, layer_types):
         - the looked-up embedding is multiplied by sqrt(n_embd) (ggml_scale(inpL, sqrtf(n_embd))).
         - every norm is the plain RMSNorm above with the weight AS STORED: HF's Gemma3RMSNorm computes
           x_normed * (1 + w), and convert writes w + 1 for every tensor named *norm.weight (norm_shift),
           q/k norms included. Adding 1 again would be wrong.
         - attention block: attn_norm → q, k, v (no biases) → q = RMSNorm_head(q, attn_q_norm), k likewise
           (V is not normed) → RoPE NEOX on q and k → q *= f_attention_scale → softmax(q·k) with no
           further scale (build_attn kq_scale = 1.0) → attn_output → post_attention_norm → residual add.
         - f_attention_scale = 1/sqrt(attention.key_length), except for the 27B (62 layers) where it is
           1/sqrt(n_embd / n_head) (HF query_pre_attn_scalar; llama-model.cpp, ref gemma_pytorch).
         - FFN block: ffn_norm → down(gelu(gate·x) * up·x) with GELU's tanh approximation (LLM_FFN_GELU,
           LLM_FFN_PAR; HF hidden_activation gelu_pytorch_tanh) → post_ffw_norm → residual add.
         - sliding-window layers: when attention.sliding_window (n_swa) is present and > 0, layer il is
           local iff il % 6 < 5 (set_swa_pattern(6): every 6th layer, il = 5, 11, 17, ..., is global).
           A local query at position p sees keys at positions p' with p - p' < n_swa (is_masked_swa,
           LLAMA_SWA_TYPE_STANDARD: masked when p - p' >= n_swa), i.e. itself and n_swa - 1 before it.
         - RoPE base: 10000 on local layers (rope_freq_base_train_swa, hard-coded; newer llama.cpp reads
           an optional rope.freq_base_swa, honoured here), rope.freq_base (1e6 in the released models) on
           global ones. Linear rope scaling (rope.scaling.factor, the 4B+ models) applies to global
           layers only (rope_freq_scale_train_swa = 1).
         - no attention-logit softcapping (convert asserts attn_logit_softcapping is None). A final logit
           softcap cap·tanh(logits/cap) is applied only if final_logit_softcapping is in the file and
           > 0; convert writes it only when the HF config has one, which no released Gemma 3 has
           (llama.cpp's iswa graph never applies it; its non-SWA graph does).
         - output head tied to token_embd in every released model.
nemotron From llama.cpp src/models/nemotron.cpp (llama_model_nemotron: load_arch_hparams, load_arch_tensors,
         graph), llama-model.cpp (llama_model_rope_type: LLM_ARCH_NEMOTRON → LLAMA_ROPE_TYPE_NEOX),
         llm_graph_context::build_norm / build_ffn, and convert's NemotronModel; cross-checked against HF
         modeling_nemotron (NemotronLayerNorm1P, partial_rotary_factor, NemotronMLP):
         - every norm is LLM_NORM, a LayerNorm: ggml_norm(x, eps) = (x - mean) / sqrt(var + eps) with the
           biased variance, then ggml_mul by the weight and ggml_add of the bias (attn_norm, ffn_norm and
           output_norm each have .weight and .bias, all required). The weight is used AS STORED: HF's
           LayerNorm1P computes with w + 1 and convert writes w + 1 for every *norm.weight. eps is
           nemotron.attention.layer_norm_epsilon (LLM_KV_ATTENTION_LAYERNORM_EPS, the only eps read).
         - attention: q, k, v (optional biases), no permutation (NemotronModel is a plain TextModel), RoPE
           NEOX over the first n_rot = rope.dimension_count dims of each head, the rest passed through;
           kq scale 1/sqrt(head_dim); attn_output with an optional bias.
         - FFN: LLM_FFN_RELU_SQR, LLM_FFN_SEQ: down(relu(up·x + b_up)²) + b_down, no gate; biases
           optional.
         - output.weight is required (no tied fallback in load_arch_tensors): a file without it is refused.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "nemotron")
NORM_RMS, NORM_LAYER = "rms", "layer"
ROPE_NORMAL, ROPE_NEOX = "normal", "neox"
GEMMA3_SWA_PERIOD = 6
GEMMA3_ROPE_BASE_SWA = 10000.0
# Rows of the output head dequantized at a time: keeps Gemma's 262k × 640 head to ~40 MB per chunk.
HEAD_CHUNK_ROWS = 16384


@dataclass(frozen=True)
class Config:
    arch: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_rot: int
    norm: str  # NORM_RMS (ggml_rms_norm) or NORM_LAYER (ggml_norm, with a bias)
    norm_eps: float
    rope_type: str
    rope_base: float
    rope_freq_scale: float  # 1 / linear scaling factor
    kq_scale: float  # applied to q·k
    n_swa: int  # gemma3 sliding window (0 = none)
    rope_base_swa: float
    final_logit_softcap: float  # 0 = none
    tied: bool

    def is_swa(self, il: int) -> bool:
        return self.n_swa > 0 and il % GEMMA3_SWA_PERIOD < GEMMA3_SWA_PERIOD - 1


class RefModel:
    """A GGUF file seen through the gguf package: metadata, a config, dequantized tensors on demand."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.reader = GGUFReader(self.path)
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.config = self._config()

    def meta(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def weight(self, name: str) -> np.ndarray:
        """The whole tensor in numpy order ([out, in] for matrices), float64."""
        t = self.tensors[name]
        return dequantize(t.data, t.tensor_type).astype(np.float64)

    def rows(self, name: str, ids: list[int]) -> np.ndarray:
        """Selected rows of a matrix (embedding lookup), float64."""
        t = self.tensors[name]
        return dequantize(t.data[np.asarray(ids, dtype=np.int64)], t.tensor_type).astype(np.float64)

    def tokens(self) -> list[str]:
        return self.meta("tokenizer.ggml.tokens")

    def _config(self) -> Config:
        arch = self.meta("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise NotImplementedError(f"reference forward pass: architecture {arch!r} not implemented")

        def key(name: str, default: Any = None) -> Any:
            value = self.meta(f"{arch}.{name}", default)
            if value is None:
                raise ValueError(f"{self.path.name}: missing {arch}.{name}")
            return value

        n_embd, n_head = int(key("embedding_length")), int(key("attention.head_count"))
        n_head_kv = int(key("attention.head_count_kv", n_head))
        head_dim_k = int(key("attention.key_length", n_embd // n_head))
        head_dim_v = int(key("attention.value_length", n_embd // n_head))
        n_rot = int(key("rope.dimension_count", head_dim_k))

        scaling = self.meta(f"{arch}.rope.scaling.type", "none")
        if scaling == "linear":
            rope_freq_scale = 1.0 / float(key("rope.scaling.factor"))
        elif scaling == "none":
            rope_freq_scale = 1.0 / float(self.meta(f"{arch}.rope.scale_linear", 1.0))
        else:
            raise NotImplementedError(f"reference forward pass: rope scaling {scaling!r} not implemented")

        n_swa = 0
        kq_scale = 1.0 / math.sqrt(head_dim_k)
        if arch == "llama":
            kq_scale = float(self.meta("llama.attention.scale", 0.0)) or kq_scale
        if arch == "gemma3":
            if self.meta("gemma3.attention.sliding_window_pattern") is not None:
                raise NotImplementedError("reference forward pass: explicit sliding_window_pattern")
            n_swa = int(self.meta("gemma3.attention.sliding_window", 0))
            n_layer = int(key("block_count"))
            kq_scale = 1.0 / math.sqrt(n_embd / n_head if n_layer == 62 else head_dim_k)

        if arch == "nemotron" and "output.weight" not in self.tensors:
            raise ValueError(
                f"{self.path.name}: nemotron needs output.weight (llama.cpp has no tied fallback)"
            )
        if "token_embd.weight" not in self.tensors:
            raise ValueError(f"{self.path.name}: no token_embd.weight")
        return Config(
            arch=arch,
            n_vocab=int(self.tensors["token_embd.weight"].shape[1]),  # GGUF shape: [n_embd, n_vocab]
            n_embd=n_embd,
            n_layer=int(key("block_count")),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim_k=head_dim_k,
            head_dim_v=head_dim_v,
            n_rot=n_rot,
            norm=NORM_LAYER if arch == "nemotron" else NORM_RMS,
            norm_eps=float(
                key(
                    "attention.layer_norm_epsilon"
                    if arch == "nemotron"
                    else "attention.layer_norm_rms_epsilon"
                )
            ),
            rope_type=ROPE_NORMAL if arch == "llama" else ROPE_NEOX,
            rope_base=float(self.meta(f"{arch}.rope.freq_base", 10000.0)),
            rope_freq_scale=rope_freq_scale,
            kq_scale=kq_scale,
            n_swa=n_swa,
            rope_base_swa=float(self.meta(f"{arch}.rope.freq_base_swa", GEMMA3_ROPE_BASE_SWA)),
            final_logit_softcap=float(self.meta(f"{arch}.final_logit_softcapping", 0.0) or 0.0),
            tied="output.weight" not in self.tensors,
        )


@functools.lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int, size: int) -> RefModel:
    del mtime_ns, size  # part of the cache key only: a rewritten file is read again
    return RefModel(path)


def load(path: str | Path) -> RefModel:
    """The parsed file, cached: gguf's reader takes seconds on a large vocabulary (19 s for Gemma's 262k)."""
    st = os.stat(path)
    return _load(str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


# -- the pieces ----------------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Over the last axis; w broadcasts (one vector for all heads in the q/k norms)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """ggml_norm (mean subtracted, biased variance) then ggml_mul by w and ggml_add of b."""
    xc = x - x.mean(axis=-1, keepdims=True)
    return xc / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + eps) * w + b


def rope(
    x: np.ndarray,
    pos: np.ndarray,
    n_rot: int,
    base: float,
    freq_scale: float,
    mode: str,
    freq_factors: np.ndarray | None = None,
) -> np.ndarray:
    """Rotary embedding of x [n_tokens, n_heads, head_dim] at positions pos [n_tokens] (ggml_rope_ext with
    ext_factor 0, attn_factor 1: θ_i = freq_scale · pos · base^(-2i/n_rot) / freq_factors[i])."""
    half = n_rot // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors[:half]
    theta = freq_scale * pos[:, None].astype(np.float64) * inv_freq[None, :]  # [n_tokens, half]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.copy()
    if mode == ROPE_NORMAL:  # pairs (2i, 2i+1)
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    else:  # NEOX: pairs (i, i + n_rot/2)
        x0, x1 = x[..., :half], x[..., half:n_rot]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:n_rot] = x0 * sin + x1 * cos
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, kq_scale: float, n_swa: int = 0) -> np.ndarray:
    """Causal softmax attention. q [n, n_head, d], k [n, n_head_kv, d], v [n, n_head_kv, dv] →
    [n, n_head * dv]. n_swa > 0: a query at p sees keys at p' with p - p' < n_swa only."""
    n, n_head, _ = q.shape
    group = n_head // k.shape[1]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    visible = j <= i
    if n_swa > 0:
        visible &= (i - j) < n_swa
    out = np.empty((n, n_head, v.shape[2]))
    for h in range(n_head):
        kv = h // group
        scores = (q[:, h, :] @ k[:, kv, :].T) * kq_scale
        scores = np.where(visible, scores, -np.inf)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, h, :] = p @ v[:, kv, :]
    return out.reshape(n, -1)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (ggml_gelu; on CPU ggml reads it from an f16 table, this is exact)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


# -- the forward pass ----------------------------------------------------------------------------------


def reference_logits(
    path: str | Path, tokens: list[int], kv_type: str = "f32", dtype: Any = np.float32
) -> np.ndarray:
    """Logits [len(tokens), n_vocab] (float32, or `dtype`) for every position of `tokens`, from an empty
    cache.

    kv_type "f16": K and V (after RoPE) are rounded to IEEE half, as a half-precision KV cache stores
    them; everything else stays float64. dtype=np.float64 keeps the oracle's own precision (for comparing
    it with another float64 oracle)."""
    m = load(path)
    logits = _head(m, _final_hidden(m, tokens, kv_type))
    c = m.config
    if c.final_logit_softcap > 0:
        logits = c.final_logit_softcap * np.tanh(logits / c.final_logit_softcap)
    return logits.astype(dtype)


def reference_hidden(path: str | Path, tokens: list[int], kv_type: str = "f32") -> np.ndarray:
    """The final hidden states [len(tokens), n_embd] (after output_norm, before the output head), float64:
    what an embedding is pooled from."""
    return _final_hidden(load(path), tokens, kv_type)


def _final_hidden(m: RefModel, tokens: list[int], kv_type: str) -> np.ndarray:
    c = m.config
    if not tokens:
        raise ValueError("no tokens")
    if min(tokens) < 0 or max(tokens) >= c.n_vocab:
        raise ValueError(f"token ids must be in [0, {c.n_vocab})")
    n = len(tokens)
    pos = np.arange(n)
    gemma = c.arch == "gemma3"
    nemotron = c.arch == "nemotron"
    freq_factors = m.weight("rope_freqs.weight") if "rope_freqs.weight" in m.tensors else None

    x = m.rows("token_embd.weight", tokens)  # [n, n_embd]
    if gemma:
        x = x * math.sqrt(c.n_embd)

    for il in range(c.n_layer):
        b = f"blk.{il}."

        def w(name: str, b: str = b) -> np.ndarray:
            return m.weight(b + name)

        def linear(h: np.ndarray, name: str, b: str = b) -> np.ndarray:
            y = h @ m.weight(b + name + ".weight").T
            if b + name + ".bias" in m.tensors:  # qwen2's q/k/v; nemotron's optional biases
                y = y + m.weight(b + name + ".bias")
            return y

        def norm(h: np.ndarray, name: str, b: str = b) -> np.ndarray:
            return _norm(m, h, b + name)

        # attention
        h = norm(x, "attn_norm")
        q = linear(h, "attn_q").reshape(n, c.n_head, c.head_dim_k)
        k = linear(h, "attn_k").reshape(n, c.n_head_kv, c.head_dim_k)
        v = linear(h, "attn_v").reshape(n, c.n_head_kv, c.head_dim_v)
        if b + "attn_q_norm.weight" in m.tensors:  # qwen3, gemma3
            q = rms_norm(q, w("attn_q_norm.weight"), c.norm_eps)
            k = rms_norm(k, w("attn_k_norm.weight"), c.norm_eps)
        local = c.is_swa(il)
        base = c.rope_base_swa if local else c.rope_base
        freq_scale = 1.0 if local else c.rope_freq_scale
        q = rope(q, pos, c.n_rot, base, freq_scale, c.rope_type, freq_factors)
        k = rope(k, pos, c.n_rot, base, freq_scale, c.rope_type, freq_factors)
        if kv_type == "f16":
            k = k.astype(np.float16).astype(np.float64)
            v = v.astype(np.float16).astype(np.float64)
        a = attention(q, k, v, c.kq_scale, c.n_swa if local else 0)
        a = linear(a, "attn_output")
        if gemma:
            a = rms_norm(a, w("post_attention_norm.weight"), c.norm_eps)
        x = x + a

        # feed-forward
        h = norm(x, "ffn_norm")
        if nemotron:  # LLM_FFN_RELU_SQR, LLM_FFN_SEQ: no gate
            f = linear(np.maximum(linear(h, "ffn_up"), 0.0) ** 2, "ffn_down")
        else:
            act = gelu_tanh if gemma else silu
            f = linear(act(linear(h, "ffn_gate")) * linear(h, "ffn_up"), "ffn_down")
        if gemma:
            f = rms_norm(f, w("post_ffw_norm.weight"), c.norm_eps)
        x = x + f

    return _norm(m, x, "output_norm")


def _norm(m: RefModel, x: np.ndarray, name: str) -> np.ndarray:
    """The architecture's block norm: RMSNorm, or (nemotron) LayerNorm with its bias."""
    c = m.config
    if c.norm == NORM_LAYER:
        return layer_norm(x, m.weight(name + ".weight"), m.weight(name + ".bias"), c.norm_eps)
    return rms_norm(x, m.weight(name + ".weight"), c.norm_eps)


def _head(m: RefModel, x: np.ndarray) -> np.ndarray:
    """x @ W.T for the output head, dequantizing W a chunk of rows at a time."""
    t = m.tensors["token_embd.weight" if m.config.tied else "output.weight"]
    n_vocab = m.config.n_vocab
    out = np.empty((x.shape[0], n_vocab))
    for start in range(0, n_vocab, HEAD_CHUNK_ROWS):
        stop = min(start + HEAD_CHUNK_ROWS, n_vocab)
        out[:, start:stop] = x @ dequantize(t.data[start:stop], t.tensor_type).astype(np.float64).T
    return out
