"""Decode's products over tiles on huge pages against tiles on small pages, kernel alone.

    python benchmarks/bench_pages.py [--layers 8] [--rounds 7] [--threads 2]

A decode step streams every weight once, so how the tiles sit in memory matters as much as the kernel: on
4 KB pages a 1 GB model crosses 250,000 pages a token. This builds the matrices of `--layers` layers of
Qwen2.5-1.5B's shape (q, k, v, o, gate, up in Q4_K; down in Q6_K; or all in one `--type`; random values:
speed depends on shapes and types), repacks them three ways, and times one decode token's products (n = 1, every matrix once, in
layer order) over each, the ways alternating round by round; medians of GB/s of tiles read:
  arena  one allocation on a 2 MiB boundary advised MADV_HUGEPAGE (kernels/repack.pyx's arena: the model's)
  numpy  one numpy array per matrix (before December 2026): numpy advises huge pages for arrays of 4 MiB or
         more, but only the 2 MiB-aligned inside of each gets them
  small  one allocation advised MADV_NOHUGEPAGE: 4 KB pages only
The working set (~48 MB a layer) must exceed the last-level cache for the figures to mean memory.

With --ahead 128,192,384 (bytes), the ways are instead distances of the tile records' in-stream prefetch
(matmul512.prefetch_set; 0 = walk the next tile), all over the arena, the first the base of the ratios. With
--page-ahead 0,4096 they are distances of the one further line each record also requests (prefetch_set's
page_ahead; 0 = none), the records' own distance the CPU's default.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

# (rows, cols, type) per layer: Qwen2.5-1.5B (n_embd 1536, 2 KV heads of 128, FFN 8960).
E, KV, F = 1536, 256, 8960


def layer_shapes(wtype: str) -> list[tuple[int, int, str]]:
    """One layer's matrices; wtype "Q4_K_M": Q4_K with FFN down in Q6_K, else every matrix in wtype."""
    shapes = [(E, E), (KV, E), (KV, E), (E, E), (F, E), (F, E), (E, F)]
    types = ["Q4_K"] * 6 + ["Q6_K"] if wtype == "Q4_K_M" else [wtype] * 7
    return [(r, c, t) for (r, c), t in zip(shapes, types, strict=True)]


def small_pages(sizes: list[int]) -> list[np.ndarray]:
    """Views laid out as the arena's (64-byte aligned, in order) over an anonymous mapping advised
    MADV_NOHUGEPAGE: the model memory's own _lazy_zeros."""
    from llamacy.model.memory import _lazy_zeros

    starts = np.cumsum([0] + [(s + 63) // 64 * 64 for s in sizes])
    arr = _lazy_zeros(int(starts[-1]))
    return [arr[a : a + s] for a, s in zip(starts[:-1], sizes, strict=True)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=8, help="decode tokens timed per round and way")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument(
        "--type", default="Q4_K_M", help="Q4_K_M (Q4_K, down Q6_K), or one of Q4_0 Q4_1 Q8_0 Q4_K Q6_K"
    )
    ap.add_argument("--ahead", default="", help="compare these tile prefetch distances (bytes) instead")
    ap.add_argument(
        "--page-ahead", default="", help="compare these distances of the further line (bytes) instead"
    )
    args = ap.parse_args(argv)

    from gguf import GGMLQuantizationType as QT

    from llamacy.kernels import matmul as mm
    from llamacy.kernels import matmul512
    from llamacy.kernels import quantize as qz
    from llamacy.kernels import repack as rp

    if not mm.tiles_available():
        sys.exit("the tile kernels need AVX-512 VNNI; this CPU has none")
    rng = np.random.default_rng(0)
    shapes = layer_shapes(args.type) * args.layers
    raws = {}
    for rows, cols, t in set(layer_shapes(args.type)):  # one random matrix per shape: values do not matter
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        raws[rows, cols, t] = qz.quantize(int(QT[t]), w)
    items = [(int(QT[t]), raws[r, c, t], r, c, False) for r, c, t in shapes]
    sizes = [rp.tiled_bytes(w, r, c) for w, _, r, c, _ in items]
    row_ahead, rec_ahead, page_ahead = mm.PREFETCH_MODES[mm.PREFETCH]
    if args.ahead and args.page_ahead:
        ap.error("--ahead and --page-ahead: one at a time")
    aheads: dict[str, tuple[int, int]] = {}  # way -> (records' distance, the further line's)
    if args.ahead:
        aheads = {f"{int(a)} B" if int(a) else "walk": (int(a), page_ahead) for a in args.ahead.split(",")}
    elif args.page_ahead:
        aheads = {
            f"page {int(a)} B" if int(a) else "no page": (rec_ahead, int(a))
            for a in args.page_ahead.split(",")
        }
    if aheads:
        arena = rp.arena(sizes)
        ways = dict.fromkeys(aheads, arena)
    else:
        ways = {
            "arena": rp.arena(sizes),
            "numpy": [np.empty(s, dtype=np.uint8) for s in sizes],
            "small": small_pages(sizes),
        }
    for dst in {id(d): d for d in ways.values()}.values():
        rp.repack_many(items, args.threads, dst)
    total = sum(sizes)
    print(
        f"{args.type}, {args.layers} layers, {total / 1e6:.0f} MB of tiles, {args.threads} threads, "
        f"{args.tokens} tokens a round"
    )
    xs = {c: rng.standard_normal((1, c)).astype(np.float32) for c in (E, F)}

    layouts = [rp.tile_layout(w, r, c) for w, _, r, c, _ in items]  # not looked up inside the timing

    def token(dst: list[np.ndarray]) -> None:
        for (_, _, r, c, _), layout, tiles in zip(items, layouts, dst, strict=True):
            mm.matmul_tiled_py(tiles, layout, r, xs[c], args.threads)

    for dst in ways.values():  # fault everything in, warm the code
        token(dst)
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for rnd in range(args.rounds):
        order = list(ways) if rnd % 2 == 0 else list(reversed(ways))
        for name in order:
            if aheads:
                matmul512.prefetch_set(row_ahead, *aheads[name])
            t0 = time.perf_counter()
            for _ in range(args.tokens):
                token(ways[name])
            rates[name].append(total * args.tokens / (time.perf_counter() - t0) / 1e9)
    if aheads:
        mm.prefetch_set(mm.PREFETCH)
    first = next(iter(rates)) if aheads else "numpy"
    for name, r in rates.items():
        ratio = statistics.median(a / b for a, b in zip(r, rates[first], strict=True))
        print(
            f"{name:6s} {statistics.median(r):6.1f} GB/s (median; range {min(r):.1f}-{max(r):.1f}); "
            f"per round / {first}: median {ratio:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
