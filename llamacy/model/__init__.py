"""A model ready to evaluate: config, weights bound to the layer loop, and its per-layer memory."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from llamacy.errors import UnsupportedModelError
from llamacy.model.archs import ARCHITECTURES, config_from_metadata
from llamacy.model.config import ModelConfig
from llamacy.model.memory import DEFAULT_KV_TYPE, KV_TYPE_NAMES, Memory
from llamacy.model.weights import ModelWeights

__all__ = [
    "ARCHITECTURES",
    "DEFAULT_KV_TYPE",
    "KV_TYPE_NAMES",
    "Memory",
    "Model",
    "ModelConfig",
    "default_threads",
]


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class Model:
    """Evaluates batches of (token, position, sequence) and keeps the K/V they produce."""

    # A deferred repacking (repack.py's DeferredRepack) spends this share of the last evaluation's time
    # before the next one, at least one matrix: the decode runs at no less than half its speed meanwhile.
    REPACK_SHARE = 1.0

    def __init__(
        self,
        gguf: Any,
        n_ctx: int,
        n_threads: int,
        n_seq: int = 1,
        ubatch: int = 256,
        cfg: ModelConfig | None = None,
        kv_type: str = DEFAULT_KV_TYPE,
        weights: ModelWeights | None = None,
    ) -> None:
        """weights: the file's tensors as WeightBinder.bind() returns them, when the caller has bound them
        already (one binding serves every Model over the same file); bound here otherwise."""
        from llamacy.kernels import ensure_cpu

        ensure_cpu()
        from llamacy.kernels.parallel import ensure_threads
        from llamacy.model.forward import Forward
        from llamacy.model.weights import WeightBinder

        self.cfg = cfg or config_from_metadata(gguf.metadata, str(gguf.path))
        n_threads = min(n_threads, ensure_threads(n_threads))
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        if weights is None:
            weights = WeightBinder(gguf, self.cfg).bind()
        # Where the binding left repacking for later (repack.py's DeferredRepack): the swaps this Model's
        # C records hold, and how long its last evaluation took (the time the next may spend packing).
        self._bound_generation = weights.deferred.generation if weights.deferred is not None else 0
        self._last_eval_s = 0.0
        self.weights = (
            weights  # bound once: other Models over this file can share them (the server's Embedder)
        )
        self.forward = Forward(self.cfg, weights, ubatch, n_ctx, n_threads)
        # The per-layer memory (memory.py); `kv` for the callers that predate it.
        self.memory = self.kv = Memory(self.cfg, n_ctx, n_seq, kv_type, self.forward.ubatch_size)
        self.forward.bind_memory(self.memory)
        self._gguf = gguf  # the weights point into its mapping

    @property
    def gguf(self) -> Any:
        """The GGUF file the weights are read from (metadata, tensors, path, size)."""
        return self._gguf

    def eval(self, tokens: list[int], seq: int = 0, logits: str = "last", hidden: bool = False) -> np.ndarray:
        """Append tokens to sequence `seq`; return logits of the last token ([n_vocab]) or of all ([n, n_vocab]).

        hidden: the final hidden states (after output_norm, before the output head) instead of logits,
        [n_embd] or [n, n_embd]; the output head is skipped.
        """
        n = len(tokens)
        start = self.kv.length(seq)
        if start + n > self.n_ctx:
            raise ValueError(f"{start + n} tokens do not fit a context of {self.n_ctx}")
        tok = np.asarray(tokens, dtype=np.int32)
        if n and (tok.min() < 0 or tok.max() >= self.cfg.n_vocab):
            raise UnsupportedModelError(f"token id outside the vocabulary of {self.cfg.n_vocab}")
        pos = np.arange(start, start + n, dtype=np.int32)
        seqs = np.full(n, seq, dtype=np.int32)
        rows = np.arange(n, dtype=np.int32) if logits == "all" else np.array([n - 1] if n else [], np.int32)
        out = self.eval_batch(tok, pos, seqs, rows, hidden)
        self.kv.append(seq, tokens)
        return out if logits == "all" else out[0]

    def eval_batch(
        self,
        tokens: np.ndarray,
        pos: np.ndarray,
        seq: np.ndarray,
        rows: np.ndarray,
        hidden: bool = False,
        hidden_rows: np.ndarray | None = None,
    ) -> Any:
        """Raw batched evaluation (many sequences at once); the caller records what it evaluated with
        kv.append.

        Returns logits [len(rows), n_vocab], or with hidden=True the final hidden states [len(rows), n_embd].
        hidden_rows (ascending batch indices): (logits, their final hidden states [len, n_embd]) instead.
        """
        out = np.empty((len(rows), self.cfg.n_embd if hidden else self.cfg.n_vocab), dtype=np.float32)
        extra = {}
        if hidden_rows is not None:
            hidden_rows = np.asarray(hidden_rows, np.int32)
            extra = dict(
                hidden_rows=hidden_rows, hidden_out=np.empty((len(hidden_rows), self.cfg.n_embd), np.float32)
            )
        deferred = self.weights.deferred
        if deferred is not None:
            self._advance_repack(deferred)
        t0 = time.perf_counter()
        self.forward.eval(
            tokens.astype(np.int32, copy=False),
            pos.astype(np.int32, copy=False),
            seq.astype(np.int32, copy=False),
            rows.astype(np.int32, copy=False),
            out,
            self.n_threads,
            hidden,
            **extra,
        )
        self._last_eval_s = time.perf_counter() - t0
        return (out, extra["hidden_out"]) if extra else out

    def _advance_repack(self, deferred: Any) -> None:
        """Before an evaluation: pack for as long as the last one took (the first evaluation after the
        load packs nothing: the first token comes first), then bind what was swapped in."""
        if self._last_eval_s and not deferred.done:
            deferred.advance(self.REPACK_SHARE * self._last_eval_s)
        generation = deferred.generation
        if generation != self._bound_generation:
            self.forward.rebind(self.weights)
            self._bound_generation = generation
