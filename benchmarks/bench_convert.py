"""`llamacy convert` speed: the weight-quantization kernels alone, and whole conversions of SmolLM2.

    python3 benchmarks/bench_convert.py [--threads N] [--types q8_0,q4_k_m] [--runs 3] [--json]

Kernels: ns per value to quantize a 2048 x 4096 float32 matrix to each type (best of --runs), with one
thread and with --threads. Conversions: `convert(SmolLM2 Q4_1 file, ..., type)` wall time (best of
--runs), which includes dequantizing the source, metadata and writing the file.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KERNEL_TYPES = ("F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "Q6_K", "Q5_K", "Q4_K", "Q3_K", "Q2_K")


def best(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench_kernels(threads: int, runs: int) -> dict[str, dict[str, float]]:
    from llamacy.kernels.quantize import quantize

    from llamacy.ggml_types import GGMLType

    x = np.random.default_rng(0).standard_normal((2048, 4096)).astype(np.float32)
    out = {}
    for name in KERNEL_TYPES:
        t = int(GGMLType[name])
        one = best(lambda t=t: quantize(t, x, n_threads=1), runs)
        many = best(lambda t=t: quantize(t, x, n_threads=threads), runs)
        out[name] = {"ns_per_value_1t": one * 1e9 / x.size, f"ns_per_value_{threads}t": many * 1e9 / x.size}
    return out


def bench_conversions(types: list[str], threads: int, runs: int) -> dict[str, float]:
    from llamacy.catalog import resolve_model
    from llamacy.convert import convert

    src = resolve_model("smollm2-135m")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for qtype in types:
            dst = Path(tmp) / f"{qtype}.gguf"
            out[qtype] = best(lambda q=qtype, d=dst: convert(src, d, q, threads=threads), runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=0, help="threads (default: all cores)")
    ap.add_argument("--types", default="q8_0,f16,q4_k_m", help="conversion targets for SmolLM2")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from llamacy.model import default_threads

    threads = args.threads or default_threads()
    kernels = bench_kernels(threads, args.runs)
    conversions = bench_conversions(args.types.split(","), threads, args.runs)
    if args.json:
        print(
            json.dumps(
                {"threads": threads, "kernels": kernels, "smollm2_135m_q4_1_to": conversions}, indent=2
            )
        )
        return
    print(f"quantize 2048x4096 float32 (ns/value), 1 thread / {threads} threads")
    for name, r in kernels.items():
        print(f"  {name:5s} {r['ns_per_value_1t']:7.2f} / {r[f'ns_per_value_{threads}t']:7.2f}")
    print(f"convert SmolLM2-135M Q4_1 (seconds, {threads} threads)")
    for qtype, s in conversions.items():
        print(f"  {qtype:7s} {s:6.2f}")


if __name__ == "__main__":
    main()
