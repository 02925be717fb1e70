"""A model's own multi-token-prediction block, run as a drafter (Qwen3.5, Qwen3.5-MoE, Qwen3-Next).

The block (llama.cpp's qwen35.cpp graph_mtp; vLLM's Qwen3NextMultiTokenPredictor) is one more decoder layer
after the last. Entry j reads the model's final hidden state at position j (after output_norm) and the
token at j + 1, and predicts the token at j + 2:
    x = eh_proj [enorm(embed(token j+1)); hnorm(hidden j)] -> full-attention layer -> shared_head_norm -> head
It attends over its own earlier entries, so every position the model evaluates is fed to it once the token
after it is known (`observe`). A draft chains: the block's own normed output stands in for the model's
hidden state of the drafted position (`chain`); those entries are dropped again after drafting.

Entries are kept per sequence in compact order: entry e sits at rotary position e, and `src` records the
model position it stands for. A position whose hidden state is gone (a turn that reuses a cached prefix
resumes after it) is left out, not recomputed: attention reads relative positions, and a missing entry
makes drafts a little worse, never the output (drafts are verified).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

import numpy as np

from llamacy.errors import UsageError
from llamacy.model.weights import ModelWeights, WeightBinder, decode_weight_bytes


def mtp_support(model: Any) -> str | None:
    """Why `model` (a llamacy.model.Model) cannot draft with its own block, in one line; None if it can."""
    from llamacy.model.archs import ARCHITECTURES

    cfg = model.cfg
    if cfg.n_nextn < 1:
        return f"{model.gguf.path}: the file has no multi-token-prediction block (speculate mtp needs one)"
    if not hasattr(ARCHITECTURES[cfg.arch], "mtp_tensors"):
        return f"llamacy does not run the multi-token-prediction block of {cfg.arch} models"
    return None


def draft_cost(model: Any) -> float:
    """What one drafted token costs, in plain decoding steps, counted in bytes read (decode streams its
    bytes): the block's layer and the output head to make it, and, to verify it, one more row through the
    model, which on a recurrent layer reads and writes its state and copies it for rollback. A plain step
    reads every weight once (an untied embedding one row) and each recurrent state twice. Computed from
    the file, not timed, so that whether a request drafts never depends on the machine's load (a seeded
    sampled answer stays reproducible)."""
    cfg, tensors = model.cfg, model.gguf.tensors
    block = f"blk.{cfg.n_layer}."
    head = tensors.get("output.weight", tensors["token_embd.weight"])
    blocks = tuple(f"blk.{il}." for il in range(cfg.n_layer, cfg.n_layer + cfg.n_nextn))
    step = decode_weight_bytes(tensors, skip=blocks)
    state = sum(lm.state[0, 0].nbytes for lm in model.memory.recurrent)
    drafting = head.n_bytes + sum(t.n_bytes for name, t in tensors.items() if name.startswith(block))
    return (drafting + 3 * state) / (step + 2 * state)


class MtpHead:
    """The first multi-token-prediction block of `model`, with a memory of its own for each of the model's
    sequences (a `draft` sits in sequence `slot`)."""

    def __init__(self, model: Any) -> None:
        from llamacy.model.archs import ARCHITECTURES
        from llamacy.model.forward import Forward
        from llamacy.model.memory import Memory

        why = mtp_support(model)
        if why is not None:
            raise UsageError(why)
        arch = ARCHITECTURES[model.cfg.arch]
        self.model = model
        self.cfg = arch.mtp_config(model.cfg)
        model_specs, layer_specs = arch.mtp_tensors(model.cfg)
        binder = WeightBinder(model.gguf, model.cfg, threads=model.n_threads)
        self._own, layer = binder.bind_block(model_specs, layer_specs)
        self._layer = layer
        self._generation = -1
        self.forward = Forward(self.cfg, self._weights(), 64, model.n_ctx, model.n_threads)
        self.memory = Memory(
            self.cfg, model.n_ctx, model.kv.n_seq, model.kv.kv_type, self.forward.ubatch_size
        )
        self.forward.bind_memory(self.memory)
        self.src: list[list[int]] = [[] for _ in range(model.kv.n_seq)]  # per entry, the model position
        self.n_vocab = model.cfg.n_vocab
        self.n_embd = model.cfg.n_embd
        self.draft_cost = draft_cost(model)

    def _weights(self) -> ModelWeights:
        """The block's weights; the embeddings, head and (without shared_head_norm) final norm are the
        model's as bound now (its deferred repacking swaps them: `_rebind`)."""
        shared = self.model.weights.fields
        fields = {name: value for name, value in self._own.items() if value is not None}
        for name in ("token_embd", "output", "output_norm"):
            fields.setdefault(name, shared[name])
        deferred = self.model.weights.deferred
        self._generation = deferred.generation if deferred is not None else 0
        return ModelWeights(fields, [self._layer], self.cfg.layers)

    def _rebind(self) -> None:
        deferred = self.model.weights.deferred
        if deferred is not None and deferred.generation != self._generation:
            self.forward.rebind(self._weights())

    def _eval(self, slot: int, tokens: Sequence[int], hidden: np.ndarray, logits: bool) -> tuple:
        """Append entries (tokens[i], hidden[i]) to slot; return the last entry's (logits or None, normed
        output)."""
        self._rebind()
        n = len(tokens)
        start = self.memory.length(slot)
        tok = np.asarray(tokens, np.int32)
        pos = np.arange(start, start + n, dtype=np.int32)
        seq = np.full(n, slot, np.int32)
        last = np.array([n - 1], np.int32)
        out = np.empty((1 if logits else 0, self.n_vocab), np.float32)
        h = np.empty((1, self.n_embd), np.float32)
        rows = last if logits else np.zeros(0, np.int32)
        self.forward.eval(
            tok,
            pos,
            seq,
            rows,
            out,
            self.model.n_threads,
            False,
            hidden_in=np.ascontiguousarray(hidden, np.float32),
            hidden_rows=last,
            hidden_out=h,
        )
        self.memory.append(slot, tokens)
        return (out[0] if logits else None), h[0]

    def observe(
        self, slot: int, tokens: Sequence[int], nxt: int, p0: int, rows: np.ndarray
    ) -> np.ndarray | None:
        """The model evaluated positions p0 .. p0 + len(rows) - 1 of `slot` and kept them: rows are their
        final hidden states, tokens the tokens its memory holds (nxt the one it evaluates next). Entries
        that no longer match are dropped, those positions fed in. Returns the last entry's normed output
        (a draft starts from it), None without rows."""
        src = self.src[slot]
        used = self.memory.tokens[slot]

        def token_after(j: int) -> int:
            return tokens[j + 1] if j + 1 < len(tokens) else nxt

        # Entries for positions before p0 - 1 read tokens the model still holds; the one for p0 - 1 read
        # the token at p0, which may have changed since (a new turn).
        keep = bisect_left(src, p0 - 1)
        if keep < len(src) and src[keep] == p0 - 1 and used[keep] == token_after(p0 - 1):
            keep += 1
        if keep < len(src):
            self.memory.truncate(slot, keep)
            del src[keep:]
        n = len(rows)
        if n == 0:
            return None
        if self.memory.length(slot) + n > self.memory.n_ctx:  # entries never outnumber positions; be safe
            self.memory.clear(slot)
            src.clear()
        _, h = self._eval(slot, [token_after(p0 + i) for i in range(n)], rows, logits=False)
        src.extend(range(p0, p0 + n))
        return h

    def head(self, hidden: np.ndarray) -> np.ndarray:
        """The logits of a normed output row (the model's head)."""
        self._rebind()
        out = np.empty((1, self.n_vocab), np.float32)
        self.forward.head(np.ascontiguousarray(hidden.reshape(1, -1), np.float32), out, self.model.n_threads)
        return out[0]

    def chain(self, slot: int, token: int, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One drafted entry (a drafted token, the block's own output before it): its logits and output.
        Dropped again by `drop_chain`."""
        if self.memory.length(slot) + 1 > self.memory.n_ctx:
            raise UsageError("the multi-token-prediction block's memory is full")
        logits, h = self._eval(slot, [token], hidden.reshape(1, -1), logits=True)
        return logits, h

    def drop_chain(self, slot: int) -> None:
        """Forget the drafted entries: the entries are those `observe` fed in."""
        n = len(self.src[slot])
        if self.memory.length(slot) > n:
            self.memory.truncate(slot, n)
