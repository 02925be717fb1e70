"""A model's memory of its sequences, described per layer, and its rollback contract.

Each layer keeps what its mixer needs (config.LayerSpec.memory):
- full attention: K and V rows of every position, [seq, kv_head, position, row];
- sliding-window attention: only its window, as a ring of `window + ubatch - 1` positions (a micro-batch's
  tokens all write before any attends, so the ring must not wrap under it), each row stored twice (slots
  p % ring and p % ring + ring) so that every window is one contiguous run of rows and the attention kernel
  reads a ring exactly as it reads a full cache (the same rows in the same order: the same bits);
- nothing, for a layer without attention;
- nothing of its own for a shared-KV layer (Gemma 4): it points at the rows of the earlier layer it reads
  (LayerSpec.kv_from), which has the same kind, window and shapes;
- a recurrent layer (delta-net, Mamba2): a fixed-size float32 state per sequence, whatever its length, and
  `n_snap` snapshot slots beside it (layout.pxd's StateRows).
Rows are in the KV type's format (kv_types: float32, IEEE half, …), `row_bytes` each: each layer's own, as
its head size may differ from the others' (Gemma 4's sliding and full layers). The arrays are
anonymous mappings committed page by page as they are written, so a long context costs memory as it fills.

Rollback contract: a sequence's memory can be cut back to n tokens (`truncate`) where every layer still
holds what position n needs. Full layers always can. A ring can drop up to `max_rollback` (= ubatch) of its
newest positions, or go back to any n whose window it still holds; below that the rows are overwritten and
the sequence must be evaluated again from the start (`reuse_prefix` does so; `truncate` refuses).
Speculative decoding keeps its drafts within `max_rollback`; prefix reuse asks `lowest_cut`.

A recurrent state holds one position only: the last. Going back to n < length restores a copy of the
state after n tokens, from one of two places. Snapshots: the layer loop copies the state after each of the
last n_snap tokens of a sequence that evaluates more than one at once (a verification step: pending token
plus drafts; a prompt's end) into slot position % n_snap, and records the position in `snap_pos`; so a
sequence can drop up to n_snap - 1 rejected drafts. Checkpoints: `checkpoint(seq)` copies the states at the
sequence's current length (the generators take one at the end of every prompt), so that a chat's next
turn whose history the template renders differently resumes from the previous prompt's end rather than
from nothing. `truncate` restores the copy for n, or refuses; `reuse_prefix` keeps the longest prefix it
can restore (`best_cut`).
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from llamacy.model.config import MEMORY_NONE, MEMORY_RECURRENT, MEMORY_SHARED, kv_slots, ring_size
from llamacy.model.kv_types import DEFAULT_KV_TYPE, KV_TYPE_NAMES, kv_format, kv_row_bytes

if TYPE_CHECKING:
    from llamacy.model.config import ModelConfig

__all__ = ["DEFAULT_KV_TYPE", "KV_TYPE_NAMES", "LayerMemory", "Memory", "RollbackError"]


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
    k: np.ndarray | None  # uint8 [n_seq, n_head_kv, slots, row_bytes]; a shared layer's are its source's
    v: np.ndarray | None
    n_head_kv: int = 0
    row_bytes: int = 0
    shared_from: int = -1  # a shared-KV layer: the layer whose arrays k and v are
    # A recurrent layer: float32 [n_seq, 1 + n_snap, conv + ssm], the live state then its snapshots.
    state: np.ndarray | None = None
    conv: int = 0


# Snapshots may cost at most this much per sequence (they are committed only when written: only
# sequences that speculate fill more than the slots of their prompt's end), and there are at most
# DEFAULT_DRAFT_MAX + 1 of them: enough for a full draft.
SNAPSHOT_BUDGET = 256 << 20
MAX_SNAPSHOTS = 17
MAX_CHECKPOINTS = 2  # per sequence: the last two prompts' ends


class Memory:
    """K/V memory of every layer for n_seq sequences and, per sequence, the token ids it holds. Whoever
    evaluates tokens into a sequence records them with append(); nobody else writes `tokens`."""

    def __init__(
        self,
        cfg: ModelConfig,
        n_ctx: int,
        n_seq: int = 1,
        kv_type: str = DEFAULT_KV_TYPE,
        ubatch: int = 256,
        snapshots: int | None = None,
    ) -> None:
        """snapshots: a recurrent layer's snapshot slots per sequence (default: as many as fit
        SNAPSHOT_BUDGET, 2 to MAX_SNAPSHOTS); ignored without recurrent layers."""
        self.kv_type = kv_type
        self.fmt = kv_format(kv_type)
        self.row_bytes = kv_row_bytes(kv_type, cfg.head_dim)
        self.n_ctx = n_ctx
        self.n_seq = n_seq
        self.ubatch = ubatch
        self.layers: list[LayerMemory] = []
        state_floats = sum(spec.state_conv + spec.state_ssm for spec in cfg.layers)
        if not state_floats:
            self.n_snap = 0
        elif snapshots is None:
            self.n_snap = max(2, min(MAX_SNAPSHOTS, SNAPSHOT_BUDGET // (4 * state_floats)))
        else:
            self.n_snap = max(1, snapshots)
        for il, spec in enumerate(cfg.layers):
            if spec.memory == MEMORY_SHARED:
                src = self.layers[spec.kv_from] if 0 <= spec.kv_from < il else None
                if (
                    src is None
                    or src.k is None
                    or src.window != spec.window
                    or src.n_head_kv != spec.n_head_kv
                ):
                    raise ValueError(
                        f"layer {il} reads the K/V of layer {spec.kv_from}, which keeps no such rows"
                    )
                self.layers.append(
                    LayerMemory(spec.memory, src.slots, src.ring, src.window, src.k, src.v,
                                src.n_head_kv, src.row_bytes, spec.kv_from)
                )  # fmt: skip
                continue
            if spec.memory == MEMORY_RECURRENT:
                floats = spec.state_conv + spec.state_ssm
                shape = (n_seq, 1 + self.n_snap, floats)
                state = _lazy_zeros(4 * int(np.prod(shape))).view(np.float32).reshape(shape)
                self.layers.append(
                    LayerMemory(spec.memory, 0, 0, 0, None, None, state=state, conv=spec.state_conv)
                )
                continue
            row_bytes = kv_row_bytes(kv_type, spec.head_dim)
            slots = kv_slots(spec, n_ctx, ubatch)
            shape = (n_seq, spec.n_head_kv, slots, row_bytes)
            n = int(np.prod(shape))
            k, v = (
                (None, None)
                if spec.memory == MEMORY_NONE
                else (_lazy_zeros(n).reshape(shape), _lazy_zeros(n).reshape(shape))
            )
            self.layers.append(
                LayerMemory(spec.memory, slots, ring_size(spec, n_ctx, ubatch), spec.window, k, v,
                            spec.n_head_kv, row_bytes)
            )  # fmt: skip
        # tokens[s] are the ids whose rows occupy positions 0..len-1 of sequence s; high[s] is the most
        # positions ever written since the sequence was last cleared (rings are overwritten up to there).
        self.tokens: list[list[int]] = [[] for _ in range(n_seq)]
        self.high = [0] * n_seq
        # snap_pos[s, j]: the position whose state snapshot slot j holds (-1: none); the layer loop writes it.
        self.snap_pos = np.full((n_seq, max(self.n_snap, 1)), -1, dtype=np.int32)
        # checkpoints[s]: (length, the state of every recurrent layer at that length), oldest first.
        self.checkpoints: list[list[tuple[int, list[np.ndarray]]]] = [[] for _ in range(n_seq)]
        self.recurrent = [lm for lm in self.layers if lm.state is not None]

    # -- the contract ------------------------------------------------------------------------------------

    @property
    def max_rollback(self) -> int | None:
        """How many of its newest tokens a sequence can always drop; None: any number."""
        rings = [lm.ring - lm.window + 1 for lm in self.layers if lm.ring]
        if self.recurrent:
            rings.append(self.n_snap - 1)
        return min(rings) if rings else None

    def lowest_cut(self, seq: int) -> int:
        """The smallest n > 0 from which the sliding windows accept every cut up to the length (0 is always
        accepted). A recurrent layer accepts only some n: `can_cut` says which."""
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
            self.snap_pos[s] = -1
            self.checkpoints[s] = []

    def can_cut(self, seq: int, n: int) -> bool:
        """Whether `truncate(seq, n)` accepts n."""
        length = len(self.tokens[seq])
        if n <= 0 or n >= length:
            return True
        if n < self.lowest_cut(seq):
            return False
        return not self.recurrent or self.state_at(seq, n) is not None

    def best_cut(self, seq: int, n: int) -> int:
        """The largest m <= n that `truncate(seq, m)` accepts."""
        n = max(0, min(n, len(self.tokens[seq])))
        if not self.recurrent:
            return n if n >= self.lowest_cut(seq) or n == len(self.tokens[seq]) else 0
        cuts = {0, len(self.tokens[seq])}
        cuts.update(int(p) + 1 for p in self.snap_pos[seq] if p >= 0)
        cuts.update(c for c, _ in self.checkpoints[seq])
        return max(c for c in cuts if c <= n and self.can_cut(seq, c))

    def state_at(self, seq: int, n: int) -> list[np.ndarray] | None:
        """Every recurrent layer's state after the first n tokens of seq (views; not copies), or None when
        neither the live state, a snapshot nor a checkpoint holds it."""
        if n == len(self.tokens[seq]):
            return [lm.state[seq, 0] for lm in self.recurrent]
        if n <= 0 or n > len(self.tokens[seq]):
            return None
        j = (n - 1) % self.n_snap
        if self.snap_pos[seq, j] == n - 1:
            return [lm.state[seq, 1 + j] for lm in self.recurrent]
        for c, states in self.checkpoints[seq]:
            if c == n:
                return states
        return None

    def copy_lengths(self, seq: int) -> list[int]:
        """The lengths below the current one that seq's recurrent states can go back to, ascending."""
        length = len(self.tokens[seq])
        found = {int(p) + 1 for p in self.snap_pos[seq] if p >= 0} | {c for c, _ in self.checkpoints[seq]}
        return sorted(m for m in found if 0 < m < length and self.state_at(seq, m) is not None)

    def restore_states(self, seq: int, copies: list[int], states: list[np.ndarray]) -> None:
        """Set seq's recurrent states (its tokens already recorded): per layer, states[i] holds the live
        state, then one per length in `copies`. The newest copies become snapshots, older ones checkpoints."""
        self.snap_pos[seq] = -1
        self.checkpoints[seq] = []
        length = len(self.tokens[seq])
        for lm, st in zip(self.recurrent, states, strict=True):
            lm.state[seq, 0] = st[0]
        older = []
        for i, m in enumerate(copies):
            if m >= length - self.n_snap + 1 and self.n_snap:
                j = (m - 1) % self.n_snap
                for lm, st in zip(self.recurrent, states, strict=True):
                    lm.state[seq, 1 + j] = st[1 + i]
                self.snap_pos[seq, j] = m - 1
            else:
                older.append((m, [st[1 + i].copy() for st in states]))
        self.checkpoints[seq] = older[-MAX_CHECKPOINTS:]

    def checkpoint(self, seq: int) -> None:
        """Keep a copy of seq's recurrent states at its current length (no-op without recurrent layers)."""
        n = len(self.tokens[seq])
        if not self.recurrent or n == 0:
            return
        kept = [cp for cp in self.checkpoints[seq] if cp[0] != n]
        kept.append((n, [lm.state[seq, 0].copy() for lm in self.recurrent]))
        self.checkpoints[seq] = kept[-MAX_CHECKPOINTS:]

    def truncate(self, seq: int, n: int) -> None:
        """Forget positions n and beyond (their rows are overwritten when next evaluated; a recurrent
        state goes back to its copy for n)."""
        if n == 0:
            self.clear(seq)
            return
        length = len(self.tokens[seq])
        if n < length and n < self.lowest_cut(seq):
            raise RollbackError(
                f"a sliding-window layer no longer holds the rows to go back to {n} tokens "
                f"(it can go back to {self.lowest_cut(seq)})"
            )
        if self.recurrent and n < length:
            states = self.state_at(seq, n)
            if states is None:
                raise RollbackError(f"no copy of the recurrent state after {n} tokens to go back to")
            for lm, st in zip(self.recurrent, states, strict=True):
                lm.state[seq, 0] = st
            # Snapshots and checkpoints past n belong to the forgotten tokens.
            self.snap_pos[seq][self.snap_pos[seq] >= n] = -1
            self.checkpoints[seq] = [cp for cp in self.checkpoints[seq] if cp[0] <= n]
        del self.tokens[seq][n:]

    def append(self, seq: int, tokens: Sequence[int]) -> None:
        """Record that the rows of `tokens` now fill the next positions of sequence seq."""
        self.tokens[seq].extend(int(t) for t in tokens)
        self.high[seq] = max(self.high[seq], len(self.tokens[seq]))

    def reuse_prefix(self, seq: int, ids: Sequence[int]) -> int:
        """Keep the longest cached prefix of ids in sequence seq that the memory can go back to, forget the
        rest; return how many tokens are kept. At least the last id is left to evaluate, because its
        logits are not stored."""
        keep = self.best_cut(seq, min(self.common_prefix(seq, ids), len(ids) - 1))
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
        rows = sum(lm.k.nbytes + lm.v.nbytes for lm in self.layers if lm.k is not None and lm.shared_from < 0)
        return rows + sum(lm.state.nbytes for lm in self.recurrent)
