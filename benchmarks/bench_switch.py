"""Decode with a speed switch of the kernels on and off, alternating in one process: the ratio per round.

    python3 benchmarks/bench_switch.py -m FILE --switch steal [--rounds 24] [--tokens 8] [-t 2]
    python3 benchmarks/bench_switch.py -m FILE --switch prefetch --values tile,stream
    python3 benchmarks/bench_switch.py -m FILE --switch attention --prompt 64 --depth 2000

A switch changes how the kernels go about the same arithmetic, never the bits they give (the tests hold each
to that), so the only question is speed, and on a shared machine whose memory bandwidth changes from one
minute to the next (BENCHMARKS.md, session 26) only settings measured a fraction of a second apart can be
compared. Each round decodes --tokens tokens at each setting from the same prefix of --depth tokens (the order
reversing every round); reported: t/s per setting (median) and each setting's per-round ratio to the first
(median and quartiles). Name the first setting twice (--values off,on,off) to get a control: a ratio the
noise alone gives.

Switches (llamacy.kernels.matmul): steal (decode rows stolen at the end of a product: on, off), prefetch
(decode's weight prefetch mode: tile, stream), pairs (prompt products over two tiles at a time: on, off;
it only acts on prompts, so pair it with --prompt); llamacy.kernels.ops: attention (a prompt's attention blocks over
f32/f16 K/V rows on AVX-512 vectors or AVX2's: wide, narrow; with --prompt, deeper with --depth).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

SWITCHES = {
    "steal": ("on", "off"),
    "prefetch": ("tile", "stream"),
    "pairs": ("on", "off"),
    "attention": ("wide", "narrow"),
}


def setter(name: str):
    from llamacy.kernels import matmul, ops

    if name == "attention":
        return lambda value: ops.set_attention_wide(value == "wide")
    if name == "prefetch":
        return matmul.prefetch_set
    fn = {"steal": matmul.steal_set, "pairs": matmul.pairs_set}[name]
    return lambda value: fn(value == "on")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--switch", required=True, choices=sorted(SWITCHES))
    ap.add_argument("--values", default=None, help="settings, comma-separated, the first the baseline")
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=8, help="tokens decoded per setting per round")
    ap.add_argument("--prompt", type=int, default=0, help="time a prompt of this many tokens instead")
    ap.add_argument("--depth", type=int, default=64, help="tokens of the prefix each round decodes after")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    values = args.values.split(",") if args.values else list(SWITCHES[args.switch])
    bad = [v for v in values if v not in SWITCHES[args.switch]]
    if bad or len(values) < 2:
        ap.error(f"--values: two or more of {', '.join(SWITCHES[args.switch])}")

    from llamacy.engine import Llama

    depth = args.depth
    n_ctx = depth + max(args.tokens, args.prompt) + 8
    llm = Llama(args.model, n_ctx=n_ctx, n_threads=args.threads, n_batch=512, repack="load")
    model = llm.new_model(n_ctx, args.threads, n_seq=1)
    rng = np.random.default_rng(0)
    vocab = llm.config.n_vocab
    prefix = rng.integers(0, vocab, depth).tolist()
    for i in range(0, depth, 512):  # in prompt batches
        model.eval(prefix[i : i + 512], seq=0, logits="last")
    model.kv.checkpoint(0)  # a hybrid's recurrent state at the depth, for the cuts back to it
    put = setter(args.switch)

    def rate(value: str) -> float:
        put(value)
        model.kv.truncate(0, depth)
        t0 = time.perf_counter()
        if args.prompt:
            model.eval(rng.integers(0, vocab, args.prompt).tolist(), seq=0, logits="last")
            n = args.prompt
        else:
            for _ in range(args.tokens):
                model.eval([int(rng.integers(0, vocab))], seq=0, logits="last")
            n = args.tokens
        return n / (time.perf_counter() - t0)

    for v in values:  # warm-up: page the weights in, size the scratch
        rate(v)
    rates: list[list[float]] = [[] for _ in values]
    for r in range(args.rounds):
        order = range(len(values)) if r % 2 == 0 else reversed(range(len(values)))
        for i in order:
            rates[i].append(rate(values[i]))
    what = f"prompt {args.prompt}" if args.prompt else f"decode {args.tokens} tokens"
    print(
        f"{Path(args.model).name}, {args.threads} threads, {what} a setting at depth {depth}, {args.rounds} rounds"
    )
    for i, v in enumerate(values):
        ratios = sorted(b / a for a, b in zip(rates[0], rates[i], strict=True))
        q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
        print(
            f"  #{i} {args.switch}={v}: {statistics.median(rates[i]):.2f} t/s; / #0 median "
            f"{statistics.median(ratios):.3f} (quartiles {q1:.3f}-{q3:.3f})"
        )


if __name__ == "__main__":
    main()
