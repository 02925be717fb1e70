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

Each cache's rows start --offsets bytes past a page boundary (default 0: as the model's do, one run per
(layer, KV head) of n_ctx rows, a multiple of 4 KB for the usual n_ctx); several offsets alternate in each
round. (Until December 2026 the caches followed each other unpadded, so all but the first started inside
a page, which hid how the kernel's prefetches fared at page boundaries: see attention.h.)
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


PAGE = 4096


def pool(kv_type: str, hd: int, depth: int, pool_mb: int, rng: np.random.Generator):
    """K and V pools: [caches, bytes] uint8, pool_mb MB of rows together. Each cache's (depth + 1) rows fill
    its first bytes, and every cache is a whole number of pages with one page to spare, so that
    `place` can start the rows anywhere in a page."""
    fmt, rb = kv_format(kv_type), kv_row_bytes(kv_type, hd)
    nbytes = (depth + 1) * rb
    width = -(-nbytes // PAGE) * PAGE + PAGE
    rows = DISTINCT * (depth + 1)
    distinct = []
    for scale in (2.0, 1.0):  # K, V
        x = (rng.standard_normal((rows, hd)) * scale).astype(np.float32)
        d = np.zeros((DISTINCT, width), dtype=np.uint8)
        d[:, :nbytes] = testing.py_store_kv_rows(x, fmt).reshape(DISTINCT, nbytes)
        distinct.append(d)
    n = max(DISTINCT, -(-pool_mb * 2**20 // (2 * width)))
    reps = -(-n // DISTINCT)
    return tuple(np.ascontiguousarray(np.tile(d, (reps, 1))[:n]) for d in distinct)


def place(a: np.ndarray, pages: str, offset: int) -> np.ndarray:
    """A copy of pool a on huge pages (numpy's allocation) or on 4 KB pages (an anonymous mapping that asks
    for no huge pages), each cache's rows starting `offset` bytes into its first page: a view of the copy."""
    if pages == "huge":
        b = np.empty_like(a)
    else:
        buf = mmap.mmap(-1, a.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            buf.madvise(mmap.MADV_NOHUGEPAGE)
        b = np.frombuffer(buf, dtype=np.uint8, count=a.nbytes).reshape(a.shape)
    b[:, :offset] = 0
    b[:, offset:] = a[:, : a.shape[1] - offset]
    return b[:, offset:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depth", type=int, default=2000, help="cached positions attended (0..depth)")
    ap.add_argument("--head-dims", default="64,256")
    ap.add_argument("--kv-heads", default="1,2", help="KV heads the 8 query heads share")
    ap.add_argument("--types", default="f16,q8_0,q4_0", help="KV row types (llamacy.model.kv_types)")
    ap.add_argument("--pool-mb", type=int, default=128, help="MB of cached rows per type (>> the L3 cache)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--pages", default="huge", help="huge, small or both (huge,small): where the pools live")
    ap.add_argument("--offsets", default="0", help="where each cache's rows start in a page (bytes < 4096)")
    args = ap.parse_args()
    pages = args.pages.split(",")
    if not set(pages) <= {"huge", "small"}:
        ap.error("--pages takes huge, small or huge,small")
    offsets = [int(x) for x in args.offsets.split(",")]
    if not all(0 <= o < PAGE for o in offsets):
        ap.error(f"--offsets are bytes in [0, {PAGE})")
    types = args.types.split(",")
    cases = [(t, pg, o) for t in types for pg in pages for o in offsets]
    rng = np.random.default_rng(0)
    print(
        f"depth {args.depth}, {N_HEADS} query heads, pools of {args.pool_mb} MB per type, median of "
        f"{args.rounds} rounds (each the median of its steps)"
    )
    print(
        f"{'head_dim':>8} {'kv heads':>8} {'type':>6} {'pages':>6} {'offset':>6} {'KB/step':>8} {'us/step':>8} "
        f"{'GB/s':>6} {'vs f16':>7}"
    )
    for hd in (int(x) for x in args.head_dims.split(",")):
        pools = {}
        for t in types:
            K, V = pool(t, hd, args.depth, args.pool_mb, rng)
            for pg in pages:
                for o in offsets:
                    pools[t, pg, o] = (place(K, pg, o), place(V, pg, o))
            del K, V
        q = rng.standard_normal((N_HEADS, hd)).astype(np.float32)
        for n_kv in (int(x) for x in args.kv_heads.split(",")):
            rounds: dict[tuple[str, str, int], list[float]] = {c: [] for c in cases}
            for _ in range(args.rounds):
                for c in cases:
                    K, V = pools[c]
                    steps = max(32, K.shape[0] // n_kv)  # one sweep of the pool at least
                    times = testing.time_attend_decode(q, K, V, n_kv, args.depth, kv_format(c[0]), steps)
                    rounds[c].append(float(np.median(times)))
            for t, pg, o in cases:
                sec = statistics.median(rounds[t, pg, o])
                base = statistics.median(rounds["f16", pg, o]) if ("f16", pg, o) in rounds else None
                nbytes = 2 * n_kv * (args.depth + 1) * kv_row_bytes(t, hd)
                rel = f"{sec / base:7.2f}" if base else ""
                print(
                    f"{hd:8d} {n_kv:8d} {t:>6} {pg:>6} {o:6d} {nbytes / 1024:8.0f} {sec * 1e6:8.1f} "
                    f"{nbytes / sec / 1e9:6.1f} {rel}"
                )
        del pools


if __name__ == "__main__":
    main()
