"""Decode speed with each KV row type (f32, f16, q8_0 …), at several context depths.

    python benchmarks/bench_kv_cache.py [--model PATH] [--threads 1,2] [--depths 32,1000,2000] [--seqs 1,8]
                                        [--types f32,f16]

Decoding a token reads every cached K/V row of its sequence once per layer, so deep into a context the
cache, not the weights, is what decode reads most: SmolLM2 caches 46 KB per position in float32 (30
layers x 3 KV heads x 64 x K and V), so at 2000 positions that is 92 MB a token, as much as its weights.
For each (sequences, depth): `seqs` sequences are filled once with `depth` random tokens per cache type;
then for each thread count, rounds alternate between the types, each decoding `--steps` tokens of every
sequence together (one batched step each, as the server does) and dropping them again. Medians of the
rounds' ms per step are reported, and each type's speed relative to f16 (> 1: faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def fill(model, n_seq: int, depth: int, rng: np.random.Generator) -> None:
    for s in range(n_seq):
        model.kv.clear(s)
        model.eval(rng.integers(0, model.cfg.n_vocab, depth).tolist(), seq=s)


def step_ms(model, n_seq: int, depth: int, steps: int, rng: np.random.Generator) -> float:
    """Mean ms of one decode step of n_seq sequences, each `depth` tokens deep (the steps' tokens are
    dropped again afterwards, so every round starts from the same cache)."""
    n_vocab = model.cfg.n_vocab
    seqs = np.arange(n_seq, dtype=np.int32)
    total = 0.0
    for _ in range(steps):
        pos = np.array([model.kv.length(s) for s in range(n_seq)], np.int32)
        tok = rng.integers(0, n_vocab, n_seq).astype(np.int32)
        t0 = time.perf_counter()
        model.eval_batch(tok, pos, seqs, seqs)
        total += time.perf_counter() - t0
        for s in range(n_seq):
            model.kv.append(s, [int(tok[s])])
    for s in range(n_seq):
        model.kv.truncate(s, depth)
    return total / steps * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", "-m", default=None, help="GGUF file or known name (default: the default model)"
    )
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--depths", default="32,1000,2000")
    ap.add_argument("--seqs", default="1,8", help="sequences decoded together")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--types", default="f32,f16", help="KV row types, compared with f16")
    args = ap.parse_args()

    from llamacy.catalog import resolve_model
    from llamacy.gguf import GGUFFile
    from llamacy.model import Model

    gguf = GGUFFile(resolve_model(args.model))
    rng = np.random.default_rng(0)
    print(f"model: {Path(gguf.path).name}  steps: {args.steps}  rounds: {args.rounds}")
    types = [t for t in args.types.split(",") if t]
    if "f16" not in types:
        types.insert(0, "f16")
    others = [t for t in types if t != "f16"]
    print(
        "| seqs | threads | depth | "
        + " | ".join(f"{t} ms/step" for t in types)
        + " | "
        + " | ".join(f"{t} vs f16" for t in others)
        + " |"
    )
    print("| ---: " * (3 + len(types) + len(others)) + "|")
    for n_seq in ints(args.seqs):
        for depth in ints(args.depths):
            n_ctx = depth + args.steps + 1
            models = {}
            for kt in types:
                models[kt] = Model(gguf, n_ctx, max(ints(args.threads)), n_seq=n_seq, kv_type=kt)
                fill(models[kt], n_seq, depth, rng)
            for threads in ints(args.threads):
                times: dict[str, list[float]] = {kt: [] for kt in models}
                for _ in range(args.rounds):
                    for kt, m in models.items():
                        m.n_threads = threads
                        times[kt].append(step_ms(m, n_seq, depth, args.steps, rng))
                med = {kt: statistics.median(times[kt]) for kt in types}
                cells = [f"{med[kt]:.2f}" for kt in types] + [f"{med['f16'] / med[kt]:.2f}x" for kt in others]
                print(f"| {n_seq} | {threads} | {depth} | " + " | ".join(cells) + " |", flush=True)
            del models


if __name__ == "__main__":
    main()
