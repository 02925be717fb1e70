"""The KV cache: preallocated K and V for every layer, per sequence, plus which tokens they hold.

Layout [layer, seq, kv_head, position, head_dim], float32, so that one head's keys for consecutive
positions are contiguous: attention reads them in order. The memory is an anonymous mapping whose pages
are committed only when first written, so a large context costs memory only as it fills.
"""

from __future__ import annotations

import mmap

import numpy as np

from llamacy.model.config import ModelConfig


def _lazy_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """Zeroed float32 memory, committed page by page as it is touched.

    np.zeros asks for transparent huge pages on large arrays, so the first token would fault in (and
    zero) a 2 MB page for every layer and head: 0.3 s before the first token on SmolLM2. Small pages
    keep that cost proportional to what is used.
    """
    n = int(np.prod(shape)) * 4
    buf = mmap.mmap(-1, max(n, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype=np.float32, count=n // 4).reshape(shape)


class KVCache:
    def __init__(self, cfg: ModelConfig, n_ctx: int, n_seq: int = 1) -> None:
        shape = (cfg.n_layer, n_seq, cfg.n_head_kv, n_ctx, cfg.head_dim)
        self.k = _lazy_zeros(shape)
        self.v = _lazy_zeros(shape)
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

    def common_prefix(self, seq: int, ids: list[int]) -> int:
        cached = self.tokens[seq]
        n = min(len(cached), len(ids))
        i = 0
        while i < n and cached[i] == ids[i]:
            i += 1
        return i

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
