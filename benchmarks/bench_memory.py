"""How far decode can scale with threads here: memory read bandwidth at 1 and 2 threads, beside decode.

    python benchmarks/bench_memory.py [--model PATH] [--rounds 5] [--tokens 64]

Decoding one token reads every weight once (98 MB for SmolLM2 Q4_1), so once a single thread streams
near the bandwidth the machine gives it, more threads can only add what the memory system has left.
This measures, interleaved round by round, medians reported:
  1. read bandwidth: the thread team streams a 512 MiB buffer once with 1 or 2 threads, one contiguous
     range each, OR-ing 64-byte lines into registers (llamacy.kernels.testing.read_seconds): next to no
     arithmetic per byte. (Until December 2026 this was numpy's bitwise_or.reduce split over Python threads;
     that loop is compute-bound at ~23 GB/s a thread here, so it understated the 2-thread bandwidth and
     overstated decode's share of it.)
  2. llamacy decode (tg) at 1 and 2 threads, and the bytes of weights it streams per second (bytes read
     per token: every tensor, but one row of an untied token embedding), and that as a share of (1).
The ratio 2-thread / 1-thread of (1) bounds the ratio of (2) for a model that does not fit in cache.

Each decode run is paired with read figures taken just before and just after it, and the share is computed
per round from that pair. On the shared 2-vCPU machine the 2-thread read figure is bimodal, 32-36 GB/s in
some minutes and 52-64 GB/s in others (where the two vCPUs happen to run, presumably), while the 1-thread
figure stays near 31: a median decode rate over a median read figure can pair the two states. A round whose
probes before and after differ by more than --settle (default 10%) changed state under the decode and
is left out of the share (the table counts them).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing


def read_bandwidth(buf: np.ndarray, n_threads: int, reps: int = 4) -> float:
    """Best of reps: GB/s to read buf once with n_threads threads."""
    from llamacy.kernels import testing

    return buf.nbytes / testing.read_seconds(buf, n_threads, reps) / 1e9


def bytes_per_token(tensors: dict) -> int:
    """Weight bytes one decode step reads (llamacy.model.weights.decode_weight_bytes)."""
    from llamacy.model.weights import decode_weight_bytes

    return decode_weight_bytes(tensors)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF path or known name (default: the default model)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per measurement")
    ap.add_argument("--settle", type=float, default=0.10, help="most the probes around a decode may differ")
    args = ap.parse_args(argv)

    from llamacy.bench import _run_once
    from llamacy.engine import Llama

    buf = np.ones(512 * 2**20 // 8, dtype=np.uint64)
    llms = {t: Llama(args.model, repack="load", n_ctx=max(256, args.tokens), n_threads=t) for t in (1, 2)}
    weight_bytes = bytes_per_token(llms[1].gguf.tensors)
    rng = np.random.default_rng(0)
    for llm in llms.values():
        _run_once(llm, 0, args.tokens, rng)  # warm-up: page the weights in
    gb = weight_bytes / 1e9
    bw: dict[int, list[float]] = {1: [], 2: []}
    tg: dict[int, list[float]] = {1: [], 2: []}
    share: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.rounds):
        for t in (1, 2):
            before = read_bandwidth(buf, t)
            rate = args.tokens / (_run_once(llms[t], 0, args.tokens, rng) / 1e9)
            after = read_bandwidth(buf, t)
            bw[t] += [before, after]
            tg[t].append(rate)
            if abs(after - before) <= args.settle * max(before, after):
                share[t].append(rate * gb / ((before + after) / 2))
    print(f"model: {llms[1].model_path.name} ({weight_bytes / 2**20:.1f} MiB of weights read per token)")
    print(f"rounds: {args.rounds}, medians; decode tg{args.tokens}; read probes before and after each decode")
    print("| threads | read GB/s (range) | decode t/s | decode weight GB/s | share of read (paired rounds) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for t in (1, 2):
        g = statistics.median(tg[t])
        sh = share[t]
        paired = (
            f"{statistics.median(sh):.0%} ({min(sh):.0%}-{max(sh):.0%}, {len(sh)} of {args.rounds})"
            if sh
            else f"none of {args.rounds} rounds held still"
        )
        print(
            f"| {t} | {statistics.median(bw[t]):.1f} ({min(bw[t]):.1f}-{max(bw[t]):.1f}) | {g:.1f} | {g * gb:.1f} "
            f"| {paired} |"
        )
    b1, b2 = statistics.median(bw[1]), statistics.median(bw[2])
    print(f"| 2 / 1 | {b2 / b1:.2f}x | {statistics.median(tg[2]) / statistics.median(tg[1]):.2f}x | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
