"""Two builds of llamacy side by side: the same `llamacy bench` tests, alternating A and B, medians.

    python3 benchmarks/bench_ab.py --a /path/to/old/checkout --b . --rounds 5

Each tree must hold built extensions (`make build` there, or copied .so files). Every round runs A then B
(B then A on odd rounds, so that a machine warming up or slowing down hits both alike), each in a fresh
process with PYTHONPATH pointing at its tree. On a small, noisy machine only a ratio measured this way means
anything: a refactor that claims "speed unchanged" shows B/A near 1.00 across rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def run_bench(tree: Path, model: str, p: str, n: str, threads: str, reps: int) -> dict[tuple, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "llamacy", "bench", "-m", model, "-p", p, "-n", n, "-t", threads]
    cmd += ["-r", str(reps), "-o", "json"]
    out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=True).stdout
    return {(r["n_threads"], r["n_prompt"], r["n_gen"]): r["avg_ts"] for r in json.loads(out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", type=Path, required=True, help="baseline tree (the 'before')")
    ap.add_argument("--b", type=Path, default=Path("."), help="tree under test (the 'after')")
    ap.add_argument("-m", "--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("-p", default="512")
    ap.add_argument("-n", default="128")
    ap.add_argument("-t", default="1,2")
    ap.add_argument("-r", type=int, default=2, help="repetitions inside each bench process")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    a, b = args.a.resolve(), args.b.resolve()

    print(f"A = {a}\nB = {b}\n")
    print("| model | threads | test | A t/s (median) | B t/s (median) | B/A per round | B/A median |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for model in [m for m in args.models.split(",") if m]:
        samples: dict[str, dict[tuple, list[float]]] = {"a": {}, "b": {}}
        for rnd in range(args.rounds):
            order = ("a", "b") if rnd % 2 == 0 else ("b", "a")
            for side in order:
                tree = a if side == "a" else b
                for key, ts in run_bench(tree, model, args.p, args.n, args.t, args.r).items():
                    samples[side].setdefault(key, []).append(ts)
        for key in sorted(samples["a"]):
            t, p, n = key
            sa, sb = samples["a"][key], samples["b"][key]
            ratios = [y / x for x, y in zip(sa, sb, strict=True)]
            label = f"pp{p}" if p else f"tg{n}"
            print(
                f"| {model} | {t} | {label} | {statistics.median(sa):.1f} | {statistics.median(sb):.1f} | "
                f"{' '.join(f'{r:.2f}' for r in ratios)} | {statistics.median(ratios):.2f} |"
            )


if __name__ == "__main__":
    main()
