"""Throughput of the quantized matrix products (llamacy.kernels.matmul).

For each weight type and matrix shape: seconds per product (activations pre-quantized; the best of many
repeated C loops), the weight bytes read per second (GB/s) and the arithmetic rate (GFLOP/s, 2 per
multiply-add). n_tok=1 is decode (a matvec: bandwidth-bound when the matrix is not in cache), n_tok=64
prompt processing (tiles of rows x tokens: compute-bound).

The shapes (rows x cols) are SmolLM2-135M's: 1536x576 (ffn gate/up), 576x1536 (ffn down), 49152x576 (the
tied embedding / lm_head, 17-30 MB: streamed from L3/DRAM), and Gemma-3-270M's ffn down 640x2048; a shape
whose row length is not a whole number of the type's blocks (576 for the 256-value K-quants) is skipped. Single-threaded timings use thread CPU time, so a
busy shared machine slows them less than wall time would; two-thread timings are wall time.

    python benchmarks/bench_kernels.py                   # Q4_1 and Q8_0, threads 1 and 2, n_tok 1 and 64
    python benchmarks/bench_kernels.py --types Q4_K,Q6_K --threads 1 --impl scalar
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing
from llamacy.kernels import matmul, quant, testing

SHAPES = [(1536, 576), (576, 1536), (49152, 576), (640, 2048)]


def make_weights(t: GGMLQuantizationType, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    if t.name.endswith("_K"):  # no numpy K quantizer in gguf: random bytes, sane fp16 scales
        n = rows * cols // 256
        raw = rng.integers(0, 256, size=(n, GGML_QUANT_SIZES[t][1]), dtype=np.uint8)
        half = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)  # no inf/nan/subnormal scales
        offsets = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
        for off in offsets[t.name]:
            raw[:, off : off + 2] = half
        return raw.reshape(rows, -1)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    return np.ascontiguousarray(quants.quantize(w, t)).view(np.uint8).reshape(rows, -1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="Q4_1,Q8_0", help="comma-separated weight types")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--ntok", default="1,64", help="comma-separated token counts")
    ap.add_argument("--shapes", default=",".join(f"{r}x{c}" for r, c in SHAPES), help="ROWSxCOLS,...")
    ap.add_argument(
        "--impl",
        default="auto",
        choices=["auto", "simd", "scalar", "vnni"],
        help="auto: what matmul() runs; simd: AVX2 alone; vnni: AVX-512 VNNI (bench_kernels_512.py)",
    )
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds of measurement per case")
    args = ap.parse_args(argv)

    types = [GGMLQuantizationType[t.strip()] for t in args.types.split(",")]
    threads = [int(v) for v in args.threads.split(",")]
    ntoks = [int(v) for v in args.ntok.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rng = np.random.default_rng(0)
    print(
        f"# llamacy kernels, simd build: {quant.simd_build()}, impl: {args.impl} ({matmul.kernel_path()}), "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
    )
    print(
        f"{'type':6} {'rows x cols':>12} {'n_tok':>5} {'thr':>3} {'us/call':>10} {'GB/s':>7} {'GFLOP/s':>8}"
    )
    for t in types:
        for rows, cols in shapes:
            if cols % GGML_QUANT_SIZES[t][0]:
                continue
            W = make_weights(t, rows, cols, rng)
            for n in ntoks:
                x = rng.standard_normal((n, cols)).astype(np.float32)
                for th in threads:
                    s = testing.bench_matmul(
                        W, int(t), x, nthreads=th, impl=args.impl, min_time=args.min_time
                    )
                    print(
                        f"{t.name:6} {rows:>5} x {cols:<5} {n:>5} {th:>3} {s * 1e6:>10.1f} "
                        f"{W.nbytes / s / 1e9:>7.2f} {2 * rows * cols * n / s / 1e9:>8.1f}",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
