"""A model's memory of its sequences, described per layer, and its rollback contract.

Each layer keeps what its mixer needs (config.LayerSpec.memory):
- full attention: K and V rows of every position, [seq, kv_head, position, row];
- sliding-window attention: only its window, as a ring of `window + ubatch - 1` positions (a micro-batch's
  tokens all write before any attends, so the ring must not wrap under it), each row stored twice (slots
  p % ring and p % ring + ring) so that every window is one contiguous run of rows and the attention kernel
  reads a ring exactly as it reads a full cache (the same rows in the same order: the same bits);
- nothing, for a layer without attention.
Rows are in the KV type's format (kv_types: float32, IEEE half, …), `row_bytes` each. The arrays are
anonymous mappings committed page by page as they are written, so a long context costs memory as it fills.

Rollback contract: a sequence's memory can be cut back to n tokens (`truncate`) where every layer still
holds what position n needs. Full layers always can. A ring can drop up to `max_rollback` (= ubatch) of its
newest positions, or go back to any n whose window it still holds; below that the rows are overwritten and
the sequence must be evaluated again from the start (`reuse_prefix` does so; `truncate` refuses).
Speculative decoding keeps its drafts within `max_rollback`; prefix reuse asks `lowest_cut`.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from llamacy.model.config import MEMORY_NONE, kv_slots, ring_size
from llamacy.model.kv_types import DEFAULT_KV_TYPE, KV_TYPES, kv_format, kv_row_bytes

if TYPE_CHECKING:
    from llamacy.model.config import ModelConfig

__all__ = ["DEFAULT_KV_TYPE", "KV_TYPES", "LayerMemory", "Memory", "RollbackError"]


class RollbackError(ValueError):
    """A sequence's memory cannot be cut back that far (a sliding window has overwritten the rows)."""


def _lazy_zeros(n: int) -> np.ndarray:
    """n zeroed bytes, committed page by page as they are touched.

    np.zeros asks for transparent huge pages on large arrays, so the first token would fault in (and
    zero) a 2 MB page for every layer and head: 0.3 s before the first token on SmolLM2. Small pages
    keep that cost proportional to what is used.
    """
    buf = mmap.mmap(-1, max(n, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype=np.uint8, count=n)


@dataclass
class LayerMemory:
    kind: str  # config.MEMORY_*
    slots: int  # rows per (sequence, KV head); 0: none
    ring: int  # the ring's period; 0: slot = position
    window: int
    k: np.ndarray | None  # uint8 [n_seq, n_head_kv, slots, row_bytes]
    v: np.ndarray | None


class Memory:
    """K/V memory of every layer for n_seq sequences and, per sequence, the token ids it holds. Whoever
    evaluates tokens into a sequence records them with append(); nobody else writes `tokens`."""

    def __init__(
        self, cfg: ModelConfig, n_ctx: int, n_seq: int = 1, kv_type: str = DEFAULT_KV_TYPE, ubatch: int = 256
    ) -> None:
        self.kv_type = kv_type
        self.fmt = kv_format(kv_type)
        self.row_bytes = kv_row_bytes(kv_type, cfg.head_dim)
        self.n_ctx = n_ctx
        self.n_seq = n_seq
        self.ubatch = ubatch
        self.layers: list[LayerMemory] = []
        for spec in cfg.layers:
            slots = kv_slots(spec, n_ctx, ubatch)
            shape = (n_seq, cfg.n_head_kv, slots, self.row_bytes)
            n = int(np.prod(shape))
            k, v = (
                (None, None)
                if spec.memory == MEMORY_NONE
                else (_lazy_zeros(n).reshape(shape), _lazy_zeros(n).reshape(shape))
            )
            self.layers.append(
                LayerMemory(spec.memory, slots, ring_size(spec, n_ctx, ubatch), spec.window, k, v)
            )
        # tokens[s] are the ids whose rows occupy positions 0..len-1 of sequence s; high[s] is the most
        # positions ever written since the sequence was last cleared (rings are overwritten up to there).
        self.tokens: list[list[int]] = [[] for _ in range(n_seq)]
        self.high = [0] * n_seq

    # -- the contract ------------------------------------------------------------------------------------

    @property
    def max_rollback(self) -> int | None:
        """How many of its newest tokens a sequence can always drop; None: any number."""
        rings = [lm.ring - lm.window + 1 for lm in self.layers if lm.ring]
        return min(rings) if rings else None

    def lowest_cut(self, seq: int) -> int:
        """The smallest n > 0 that `truncate(seq, n)` accepts (0 is always accepted)."""
        high = self.high[seq]
        cut = 0
        for lm in self.layers:
            # Position n needs positions n - window + 1 .. n - 1; the ring holds high - ring .. high - 1.
            if lm.ring and high > lm.ring:
                cut = max(cut, high - lm.ring + lm.window - 1)
        return cut

    def length(self, seq: int = 0) -> int:
        return len(self.tokens[seq])

    def clear(self, seq: int | None = None) -> None:
        for s in range(self.n_seq) if seq is None else (seq,):
            self.tokens[s] = []
            self.high[s] = 0

    def truncate(self, seq: int, n: int) -> None:
        """Forget positions n and beyond (their rows are overwritten when next evaluated)."""
        if n == 0:
            self.clear(seq)
            return
        if n < len(self.tokens[seq]) and n < self.lowest_cut(seq):
            raise RollbackError(
                f"a sliding-window layer no longer holds the rows to go back to {n} tokens "
                f"(it can go back to {self.lowest_cut(seq)})"
            )
        del self.tokens[seq][n:]

    def append(self, seq: int, tokens: Sequence[int]) -> None:
        """Record that the rows of `tokens` now fill the next positions of sequence seq."""
        self.tokens[seq].extend(int(t) for t in tokens)
        self.high[seq] = max(self.high[seq], len(self.tokens[seq]))

    def reuse_prefix(self, seq: int, ids: Sequence[int]) -> int:
        """Keep the longest cached prefix of ids in sequence seq that the memory can go back to, forget the
        rest; return how many tokens are kept. At least the last id is left to evaluate, because its
        logits are not stored."""
        keep = max(0, min(self.common_prefix(seq, ids), len(ids) - 1))
        if keep < min(len(self.tokens[seq]), self.lowest_cut(seq)):
            keep = 0  # a window's rows are gone: evaluate again from the start
        self.truncate(seq, keep)
        return keep

    def common_prefix(self, seq: int, ids: Sequence[int]) -> int:
        cached = self.tokens[seq]
        n = min(len(cached), len(ids))
        i = 0
        while i < n and cached[i] == ids[i]:
            i += 1
        return i

    @property
    def nbytes(self) -> int:
        return sum(lm.k.nbytes + lm.v.nbytes for lm in self.layers if lm.k is not None)
