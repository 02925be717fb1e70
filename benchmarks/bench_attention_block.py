"""A prompt's attention: one block of tokens through ops.attend_block (AVX-512 and AVX2 vectors) against
the grouped kernel token by token (ops.attend_group, what prompts ran before), over rows in cache.

    python benchmarks/bench_attention_block.py [--head-dim 64] [--heads 3] [--tokens 8] [--depth 2000]
                                               [--kv-type f16] [--rounds 30]

One call: --tokens tokens at consecutive positions, --heads query heads of one KV group each, token i over
rows 0..depth + i. Single-threaded; best of --rounds per variant, the variants alternating. Prints
nanoseconds per (token, head, position).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from llamacy.kernels import ops, testing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--depth", type=int, default=2000)
    ap.add_argument("--kv-type", choices=["f32", "f16"], default="f16")
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    dt = np.float16 if a.kv_type == "f16" else np.float32
    n = a.depth + a.tokens
    K = (rng.standard_normal((n, a.head_dim)) * 2).astype(dt)
    V = rng.standard_normal((n, a.head_dim)).astype(dt)
    q = rng.standard_normal((a.tokens, a.heads, a.head_dim)).astype(np.float32)
    scale = 1 / np.sqrt(a.head_dim)
    wide_ok = ops.set_attention_wide(True)

    def block() -> None:
        testing.py_attend_block(q, K, V, 0, a.depth, scale)

    def grouped() -> None:
        for i in range(a.tokens):
            testing.py_attend_group(q[i], K, V, 0, a.depth + i, scale)

    variants = {"grouped, token by token": (grouped, None), "block, AVX2": (block, False)}
    if wide_ok:
        variants["block, AVX-512"] = (block, True)
    best = {name: float("inf") for name in variants}
    for _ in range(a.rounds):
        for name, (fn, wide) in variants.items():
            if wide is not None:
                ops.set_attention_wide(wide)
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    ops.set_attention_wide(ops.ATTENTION_WIDE)
    work = a.tokens * a.heads * (a.depth + 1 + (a.tokens - 1) / 2)
    print(
        f"head_dim {a.head_dim}, {a.heads} heads a group, {a.tokens} tokens at depth {a.depth}, {a.kv_type} rows"
    )
    for name, t in best.items():
        print(f"{name:26s} {t * 1e6:9.1f} us  {t * 1e9 / work:6.2f} ns per (token, head, position)")


if __name__ == "__main__":
    main()
