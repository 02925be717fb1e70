"""Embeddings: one vector per input, pooled from the model's final hidden states.

The hidden states are those after the output norm, where the output head would read them (as llama.cpp
takes them). How positions are pooled comes from the file's `{arch}.pooling_type` (llama.cpp's enum);
a decoder without the key, or with "none", is mean-pooled, which is what llama.cpp's embedding tools do
for a chat model.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from llamacy.errors import ContextOverflowError, UnsupportedModelError, UsageError
from llamacy.model.config import ModelConfig
from llamacy.model.weights import ModelWeights

# llama.cpp's enum llama_pooling_type, as GGUF files store it.
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
POOLINGS = ("mean", "cls", "last")


def pooling_from_metadata(metadata: dict[str, Any], arch: str, source: str) -> str:
    """The pooling an embedding uses: "mean", "cls" or "last"; a one-line error for one we cannot do."""
    key = f"{arch}.pooling_type"
    value = metadata.get(key)
    if value is None:
        return "mean"
    if isinstance(value, bool) or not isinstance(value, int) or value not in POOLING_NAMES:
        raise UnsupportedModelError(f"{source}: {key} = {value!r} is not a known pooling type")
    name = POOLING_NAMES[value]
    if name == "rank":
        raise UnsupportedModelError(f"{source}: a reranking model (pooling rank) cannot make embeddings")
    return "mean" if name == "none" else name


@dataclass
class Embeddings:
    """What Llama.embed returns: one vector per input, and the tokens each input was evaluated as."""

    vectors: list[list[float]]
    input_tokens: list[int]  # tokens per input, in input order

    @property
    def n_tokens(self) -> int:
        """Tokens evaluated over all inputs (what the APIs report as prompt tokens)."""
        return sum(self.input_tokens)


class Embedder:
    """Embeds token sequences with its own layer-loop scratch and a one-sequence KV cache, both made on
    first use. Calls from several threads are served one at a time."""

    def __init__(
        self,
        gguf: Any,
        cfg: ModelConfig,
        n_ctx: int,
        n_threads: int,
        kv_type: str = "f32",
        pooling: str | None = None,
        weights: ModelWeights | None = None,
    ) -> None:
        """pooling: "mean", "cls" or "last"; by default the file's {arch}.pooling_type (see module doc).
        weights: the file's tensors already bound (WeightBinder.bind()), to share them; bound here otherwise."""
        source = str(gguf.path)
        if pooling is None:
            pooling = pooling_from_metadata(gguf.metadata, cfg.arch, source)
        if pooling not in POOLINGS:
            raise UsageError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        if n_ctx < 1 or n_threads < 1:
            raise UsageError(f"an embedder needs n_ctx and n_threads of at least 1, got {n_ctx}, {n_threads}")
        self.gguf = gguf
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.kv_type = kv_type
        self.pooling = pooling
        self.weights = weights
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def n_embd(self) -> int:
        return self.cfg.n_embd

    def _check(self, token_lists: list[list[int]]) -> None:
        if not token_lists:
            raise UsageError("nothing to embed: the input is empty")
        for i, ids in enumerate(token_lists):
            if len(ids) == 0:
                raise UsageError(f"input {i} is empty (no tokens); give some text")
            if len(ids) > self.n_ctx:
                raise ContextOverflowError(
                    f"input {i} has {len(ids)} tokens but the context holds {self.n_ctx}; shorten it"
                )
            bad = [t for t in ids if not 0 <= t < self.cfg.n_vocab]
            if bad:
                raise UsageError(
                    f"input {i}: token id {bad[0]} is outside the vocabulary (0..{self.cfg.n_vocab - 1})"
                )

    def embed(self, token_lists: list[list[int]], normalize: bool = True) -> np.ndarray:
        """One vector per token list, [len(token_lists), n_embd] float32; unit length (L2) if normalize.

        Each input is evaluated alone from an empty cache, so a vector does not depend on its neighbours.
        """
        token_lists = [[int(t) for t in ids] for ids in token_lists]
        self._check(token_lists)
        out = np.empty((len(token_lists), self.cfg.n_embd), dtype=np.float32)
        with self._lock:
            model = self._ensure_model()
            for i, ids in enumerate(token_lists):
                model.kv.clear(0)
                out[i] = self._pool(model.eval(ids, logits="all", hidden=True))
            model.kv.clear(0)
        return l2_normalize(out) if normalize else out

    def _ensure_model(self) -> Any:
        if self._model is None:
            from llamacy.model import Model

            self._model = Model(
                self.gguf,
                self.n_ctx,
                self.n_threads,
                n_seq=1,
                cfg=self.cfg,
                kv_type=self.kv_type,
                weights=self.weights,
            )
        return self._model

    def _pool(self, hidden: np.ndarray) -> np.ndarray:
        """[n, n_embd] hidden states of one input -> its vector."""
        if self.pooling == "cls":
            return hidden[0]
        if self.pooling == "last":
            return hidden[-1]
        return hidden.mean(axis=0, dtype=np.float64).astype(np.float32)


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to unit Euclidean length; an all-zero row stays zero (as llama.cpp does)."""
    norms = np.sqrt(np.square(vectors, dtype=np.float64).sum(axis=1, keepdims=True))
    scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    return (vectors * scale).astype(np.float32)
