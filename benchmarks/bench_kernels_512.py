"""AVX2 vs AVX-512 VNNI matrix products, side by side in one process (llamacy.kernels.matmul512).

Kernels: for each type, shape and token count, both kernel families on the same weights and activations
(matmul.bench_matmul with impl="simd" = the AVX2 kernels alone, impl="vnni" = the AVX-512 VNNI ones), one
after the other, for --rounds rounds; each GFLOP/s figure is the median over the rounds of the best of
repeated C loops (thread CPU time when single-threaded), and VNNI/AVX2 the median over the rounds of the
ratio of the two back-to-back figures, so that a busy shared machine hits both alike.
GFLOP/s counts 2 per multiply-add.

Whole model (--model): `llamacy bench -p 128 -n 32 -t 1 -r 5` in subprocesses, alternately with and
without LLAMACY_NO_AVX512=1, --model-rounds times; the median tokens/s of each.

    python benchmarks/bench_kernels_512.py                  # Q4_1 576x1536 and Q4_K 640x2048, n_tok 1,8,64
    python benchmarks/bench_kernels_512.py --types Q4_1,Q4_0,Q8_0,Q5_0,Q4_K,Q6_K --ntok 1,4,8,16,64
    python benchmarks/bench_kernels_512.py --model           # plus the whole model, pp128/tg32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_kernels import make_weights  # noqa: E402

from llamacy.kernels import cpu, matmul, testing  # noqa: E402

# (type, rows, cols): SmolLM2-135M's ffn down (Q4_1) and Gemma-3-270M's ffn down (Q4_K).
DEFAULT_CASES = [("Q4_1", 576, 1536), ("Q4_K", 640, 2048)]


def kernels(cases, ntoks, threads: int, rounds: int, min_time: float) -> None:
    rng = np.random.default_rng(0)
    print(
        f"{'type':6} {'rows x cols':>12} {'n_tok':>5} {'AVX2 GFLOP/s':>13} {'VNNI GFLOP/s':>13} {'VNNI/AVX2':>9}"
    )
    for name, rows, cols in cases:
        t = GGMLQuantizationType[name]
        if cols % GGML_QUANT_SIZES[t][0]:
            continue
        W = make_weights(t, rows, cols, rng)
        for n in ntoks:
            x = rng.standard_normal((n, cols)).astype(np.float32)
            times: dict[str, list[float]] = {"simd": [], "vnni": []}
            for _ in range(rounds):
                for impl in times:
                    times[impl].append(
                        testing.bench_matmul(W, int(t), x, nthreads=threads, impl=impl, min_time=min_time)
                    )
            a, v = (statistics.median(times[k]) for k in ("simd", "vnni"))
            # the ratio of each round's back-to-back pair, then the median: what noise leaves alone best
            ratio = statistics.median(sa / sv for sa, sv in zip(times["simd"], times["vnni"], strict=True))
            flop = 2 * rows * cols * n
            print(
                f"{name:6} {rows:>5} x {cols:<5} {n:>5} {flop / a / 1e9:>13.1f} {flop / v / 1e9:>13.1f} "
                f"{ratio:>9.2f}",
                flush=True,
            )


def whole_model(rounds: int, args: list[str]) -> None:
    cmd = [sys.executable, "-m", "llamacy", "bench", *args, "-o", "json"]
    results: dict[str, dict[str, list[float]]] = {"AVX2": {}, "VNNI": {}}
    for _ in range(rounds):
        for label, flag in (("AVX2", "1"), ("VNNI", "0")):
            env = {**os.environ, "LLAMACY_NO_AVX512": flag}
            out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
            for rec in json.loads(out.stdout):
                test = f"pp{rec['n_prompt']}" if rec["n_prompt"] else f"tg{rec['n_gen']}"
                results[label].setdefault(test, []).extend(rec["samples_ts"])
    print(f"\n# whole model: llamacy bench {' '.join(args)}, {rounds} rounds alternating; median t/s")
    print(f"{'test':6} {'AVX2':>9} {'VNNI':>9} {'VNNI/AVX2':>9}")
    for test, samples in results["VNNI"].items():
        a, v = statistics.median(results["AVX2"][test]), statistics.median(samples)
        print(f"{test:6} {a:>9.1f} {v:>9.1f} {v / a:>9.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", help="comma-separated weight types (default: the two default cases)")
    ap.add_argument("--shapes", default="576x1536,640x2048", help="ROWSxCOLS,... (with --types)")
    ap.add_argument("--ntok", default="1,8,64", help="comma-separated token counts")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7, help="AVX2/VNNI alternations per case")
    ap.add_argument("--min-time", type=float, default=0.05, help="seconds of measurement per figure")
    ap.add_argument("--model", action="store_true", help="also the whole model, with and without AVX-512")
    ap.add_argument("--model-rounds", type=int, default=3)
    ap.add_argument("--model-args", default="-p 128 -n 32 -t 1 -r 5", help="arguments of `llamacy bench`")
    args = ap.parse_args(argv)

    print(
        f"# llamacy AVX2 vs AVX-512 VNNI kernels, {time.strftime('%Y-%m-%d %H:%M')}; "
        f"CPU AVX-512: {cpu.avx512_features()}; VNNI kernels: {matmul.AVX512_STATUS}"
    )
    if not matmul.vnni_available():
        print("nothing to compare here")
        return 1
    if args.types:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        cases = [(t.strip(), r, c) for t in args.types.split(",") for r, c in shapes]
    else:
        cases = DEFAULT_CASES
    kernels(cases, [int(v) for v in args.ntok.split(",")], args.threads, args.rounds, args.min_time)
    if args.model:
        whole_model(args.model_rounds, args.model_args.split())
    return 0


if __name__ == "__main__":
    sys.exit(main())
