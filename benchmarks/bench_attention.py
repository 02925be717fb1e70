"""Decode-style attention over KV cache rows read from memory: f16 vs q8_0 vs q4_0 (vs f32) rows.

    python benchmarks/bench_attention.py [--depth 2000] [--head-dims 64,256] [--kv-heads 1,2]
                                         [--types f16,q8_0,q4_0] [--pool-mb 128] [--rounds 7]
                                         [--pages huge|small|huge,small]

One step is one token of one layer: 8 query heads over 1 or 2 KV heads (groups of 8 or 4), each group
attending over positions 0..depth of its KV head's cache through ops.attend_group (the grouped kernel, as
the model calls it), single-threaded. Successive steps take successive KV heads from a pool of caches of
--pool-mb MB per type (several times the last-level cache), so every step reads its rows from memory, as
decode does deep into a context. Rounds alternate between the types; each round's figure is the median of
its steps, and the median of the rounds is reported, with the bytes of K and V rows a step reads.

--pages huge,small puts each pool on both page sizes, alternating in every round: "huge" is numpy's
allocation (it asks for transparent huge pages on large arrays), "small" a copy on 4 KB pages
(MADV_NOHUGEPAGE), as the model's K/V memory is allocated (llamacy/model/memory.py's _lazy_zeros).
"""

from __future__ import annotations

import argparse
import mmap
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from llamacy.kernels import testing
from llamacy.model.kv_types import kv_format, kv_row_bytes

N_HEADS = 8  # query heads of the layer
DISTINCT = 8  # caches with their own random rows; the pool repeats them (the reads are what matters)


def pool(kv_type: str, hd: int, depth: int, pool_mb: int, rng: np.random.Generator):
    """K and V pools: [caches, (depth + 1) * row bytes] uint8, pool_mb MB of rows together."""
    fmt, rb = kv_format(kv_type), kv_row_bytes(kv_type, hd)
    rows = DISTINCT * (depth + 1)
    distinct = []
    for scale in (2.0, 1.0):  # K, V
        x = (rng.standard_normal((rows, hd)) * scale).astype(np.float32)
        distinct.append(testing.py_store_kv_rows(x, fmt).reshape(DISTINCT, (depth + 1) * rb))
    n = max(DISTINCT, -(-pool_mb * 2**20 // (2 * (depth + 1) * rb)))
    reps = -(-n // DISTINCT)
    return tuple(np.ascontiguousarray(np.tile(d, (reps, 1))[:n]) for d in distinct)


def on_small_pages(a: np.ndarray) -> np.ndarray:
    """A copy of a on 4 KB pages: an anonymous mapping that asks for no huge pages."""
    buf = mmap.mmap(-1, a.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    b = np.frombuffer(buf, dtype=np.uint8, count=a.nbytes).reshape(a.shape)
    b[...] = a
    return b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depth", type=int, default=2000, help="cached positions attended (0..depth)")
    ap.add_argument("--head-dims", default="64,256")
    ap.add_argument("--kv-heads", default="1,2", help="KV heads the 8 query heads share")
    ap.add_argument("--types", default="f16,q8_0,q4_0", help="KV row types (llamacy.model.kv_types)")
    ap.add_argument("--pool-mb", type=int, default=128, help="MB of cached rows per type (>> the L3 cache)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--pages", default="huge", help="huge, small or both (huge,small): where the pools live")
    args = ap.parse_args()
    pages = args.pages.split(",")
    if not set(pages) <= {"huge", "small"}:
        ap.error("--pages takes huge, small or huge,small")
    types = args.types.split(",")
    cases = [(t, pg) for t in types for pg in pages]
    rng = np.random.default_rng(0)
    print(
        f"depth {args.depth}, {N_HEADS} query heads, pools of {args.pool_mb} MB per type, median of "
        f"{args.rounds} rounds (each the median of its steps)"
    )
    print(
        f"{'head_dim':>8} {'kv heads':>8} {'type':>6} {'pages':>6} {'KB/step':>8} {'us/step':>8} {'GB/s':>6} "
        f"{'vs f16':>7}"
    )
    for hd in (int(x) for x in args.head_dims.split(",")):
        pools = {}
        for t in types:
            K, V = pool(t, hd, args.depth, args.pool_mb, rng)
            for pg in pages:
                pools[t, pg] = (K, V) if pg == "huge" else (on_small_pages(K), on_small_pages(V))
        q = rng.standard_normal((N_HEADS, hd)).astype(np.float32)
        for n_kv in (int(x) for x in args.kv_heads.split(",")):
            rounds: dict[tuple[str, str], list[float]] = {c: [] for c in cases}
            for _ in range(args.rounds):
                for t, pg in cases:
                    K, V = pools[t, pg]
                    steps = max(32, K.shape[0] // n_kv)  # one sweep of the pool at least
                    times = testing.time_attend_decode(q, K, V, n_kv, args.depth, kv_format(t), steps)
                    rounds[t, pg].append(float(np.median(times)))
            for t, pg in cases:
                sec = statistics.median(rounds[t, pg])
                base = statistics.median(rounds["f16", pg]) if ("f16", pg) in rounds else None
                nbytes = 2 * n_kv * (args.depth + 1) * kv_row_bytes(t, hd)
                rel = f"{sec / base:7.2f}" if base else ""
                print(
                    f"{hd:8d} {n_kv:8d} {t:>6} {pg:>6} {nbytes / 1024:8.0f} {sec * 1e6:8.1f} "
                    f"{nbytes / sec / 1e9:6.1f} {rel}"
                )
        del pools


if __name__ == "__main__":
    main()
