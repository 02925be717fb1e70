"""The KV cache: preallocated K and V for every layer, per sequence, plus which tokens they hold.

Layout [layer, seq, kv_head, position, head_dim], so that one head's keys for consecutive positions are
contiguous: attention reads them in order. The memory is an anonymous mapping whose pages are committed
only when first written, so a large context costs memory only as it fills.

Values are IEEE half by default (as llama.cpp's default cache): half the memory of float32, and half the
bytes that decoding reads per cached position, which is what attention costs once the context is long.
Rows are rounded to nearest-even as they are written; everything computed from them stays float32.
"f32" keeps them exact (the numpy oracle tests compare against it).
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from llamacy.model.kv_types import DEFAULT_KV_TYPE, KV_TYPES, kv_dtype

if TYPE_CHECKING:
    from llamacy.model.config import ModelConfig

__all__ = ["DEFAULT_KV_TYPE", "KV_TYPES", "KVCache", "kv_dtype"]


def _lazy_zeros(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Zeroed memory, committed page by page as it is touched.

    np.zeros asks for transparent huge pages on large arrays, so the first token would fault in (and
    zero) a 2 MB page for every layer and head: 0.3 s before the first token on SmolLM2. Small pages
    keep that cost proportional to what is used.
    """
    count = int(np.prod(shape))
    n = count * np.dtype(dtype).itemsize
    buf = mmap.mmap(-1, max(n, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)


class KVCache:
    """K/V memory for n_seq sequences and, per sequence, the token ids whose K/V it holds. Whoever evaluates
    tokens into a sequence records them with append(); nobody else writes `tokens`."""

    def __init__(self, cfg: ModelConfig, n_ctx: int, n_seq: int = 1, kv_type: str = DEFAULT_KV_TYPE) -> None:
        dtype = kv_dtype(kv_type)
        shape = (cfg.n_layer, n_seq, cfg.n_head_kv, n_ctx, cfg.head_dim)
        self.kv_type = kv_type
        self.k = _lazy_zeros(shape, dtype)
        self.v = _lazy_zeros(shape, dtype)
        self.n_ctx = n_ctx
        self.n_seq = n_seq
        # tokens[s] are the ids whose K/V occupy positions 0..len-1 of sequence s.
        self.tokens: list[list[int]] = [[] for _ in range(n_seq)]

    def length(self, seq: int = 0) -> int:
        return len(self.tokens[seq])

    def clear(self, seq: int | None = None) -> None:
        for s in range(self.n_seq) if seq is None else (seq,):
            self.tokens[s] = []

    def truncate(self, seq: int, n: int) -> None:
        """Forget positions n and beyond (their K/V are overwritten when next evaluated)."""
        del self.tokens[seq][n:]

    def append(self, seq: int, tokens: Sequence[int]) -> None:
        """Record that the K/V of `tokens` now fill the next positions of sequence seq."""
        self.tokens[seq].extend(int(t) for t in tokens)

    def reuse_prefix(self, seq: int, ids: Sequence[int]) -> int:
        """Keep the longest cached prefix of ids in sequence seq and forget the rest; return how many
        tokens are kept. At least the last id is left to evaluate, because its logits are not stored."""
        keep = max(0, min(self.common_prefix(seq, ids), len(ids) - 1))
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
        return self.k.nbytes + self.v.nbytes
