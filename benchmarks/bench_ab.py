"""Two builds of llamacy side by side: the same `llamacy bench` tests, alternating A and B, medians.

    python3 benchmarks/bench_ab.py --a /path/to/old/checkout --b . --rounds 5
    python3 benchmarks/bench_ab.py --ref-bench /path/to/llama-bench --b . --rounds 5   # A = native reference
    python3 benchmarks/bench_ab.py --a . --a-env LLAMACY_REPACK=0 --b . -m FILE      # one tree, two settings
    python3 benchmarks/bench_ab.py --a OLD --b . -m FILE -p 0 -n 32 -d 4096          # decode at depth 4096

Each tree must hold built extensions (`make build` there, or copied .so files). Every round runs A then B
(B then A on odd rounds, so that a machine warming up or slowing down hits both alike), each in a fresh
process with PYTHONPATH pointing at its tree. On a small, noisy machine only a ratio measured this way means
anything: a refactor that claims "speed unchanged" shows B/A near 1.00 across rounds.

With --ref-bench (or $LLAMACY_REF_BENCH and no --a), A is the native reference engine instead: its
llama-bench (benchmarks/build_reference.sh) on the same model file, tests and threads, labelled with its commit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference import find_bench, run_bench


def run_tree(
    tree: Path, model: str, p: str, n: str, threads: str, reps: int, extra_env: dict[str, str], depth: int = 0
) -> dict[tuple, float]:
    env = dict(os.environ, PYTHONPATH=str(tree), **extra_env)
    cmd = [sys.executable, "-m", "llamacy", "bench", "-m", model, "-p", p, "-n", n, "-t", threads]
    cmd += ["-r", str(reps), "-o", "json", "-d", str(depth)]
    out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=True).stdout
    return {(r["n_threads"], r["n_prompt"], r["n_gen"]): r["avg_ts"] for r in json.loads(out)}


def model_path(model: str) -> Path:
    from llamacy.catalog import resolve_model

    return resolve_model(model)


def run_native(
    binary: Path, model: str, p: str, n: str, threads: str, reps: int, depth: int = 0
) -> dict[tuple, float]:
    """The reference's llama-bench on the same tests, one llama-bench process per test."""
    path = model_path(model)
    out = {}
    for t in [int(x) for x in threads.split(",") if x]:
        for pp in [int(x) for x in p.split(",") if x and int(x)]:
            out[(t, pp, 0)] = run_bench(binary, path, pp, 0, t, reps, depth).avg_ts
        for g in [int(x) for x in n.split(",") if x and int(x)]:
            out[(t, 0, g)] = run_bench(binary, path, 0, g, t, reps, depth).avg_ts
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", type=Path, help="baseline tree (the 'before')")
    ap.add_argument(
        "--ref-bench", help="A = the native reference's llama-bench (default: $LLAMACY_REF_BENCH)"
    )
    ap.add_argument("--b", type=Path, default=Path("."), help="tree under test (the 'after')")
    ap.add_argument("-m", "--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("-p", default="512")
    ap.add_argument("-n", default="128")
    ap.add_argument("-t", default="1,2")
    ap.add_argument("-d", type=int, default=0, help="tokens already in the cache (both sides)")
    ap.add_argument("-r", type=int, default=2, help="repetitions inside each bench process")
    ap.add_argument("--rounds", type=int, default=3)
    for side in ("a", "b"):
        ap.add_argument(
            f"--{side}-env",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"environment variable for {side.upper()}'s runs (repeatable)",
        )
    args = ap.parse_args()
    envs = {}
    for side in ("a", "b"):
        pairs = getattr(args, f"{side}_env")
        if any("=" not in kv for kv in pairs):
            ap.error(f"--{side}-env takes KEY=VALUE")
        envs[side] = dict(kv.split("=", 1) for kv in pairs)
    native = find_bench(args.ref_bench) if args.a is None else None
    if args.a is None and native is None:
        ap.error("give --a TREE, or --ref-bench (or $LLAMACY_REF_BENCH) for the native reference")
    sys.path.insert(0, str(args.b.resolve()))  # resolve_model of the tree under test
    a = args.a.resolve() if args.a is not None else None
    b = args.b.resolve()

    if native is not None:
        commit = run_bench(native, model_path(args.models.split(",")[0]), 1, 0, 1, 1).commit
        print(f"A = native reference {native} (llama.cpp {commit})\nB = {b}\n")
    else:
        print(f"A = {a} {envs['a'] or ''}\nB = {b} {envs['b'] or ''}\n")
    print("| model | threads | test | A t/s (median) | B t/s (median) | B/A per round | B/A median |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for model in [m for m in args.models.split(",") if m]:
        samples: dict[str, dict[tuple, list[float]]] = {"a": {}, "b": {}}
        for rnd in range(args.rounds):
            order = ("a", "b") if rnd % 2 == 0 else ("b", "a")
            for side in order:
                if side == "a" and native is not None:
                    got = run_native(native, model, args.p, args.n, args.t, args.r, args.d)
                else:
                    tree = a if side == "a" else b
                    got = run_tree(tree, model, args.p, args.n, args.t, args.r, envs[side], args.d)
                for key, ts in got.items():
                    samples[side].setdefault(key, []).append(ts)
        for key in sorted(samples["a"]):
            t, p, n = key
            sa, sb = samples["a"][key], samples["b"][key]
            ratios = [y / x for x, y in zip(sa, sb, strict=True)]
            label = (f"pp{p}" if p else f"tg{n}") + (f" @ d{args.d}" if args.d else "")
            print(
                f"| {model} | {t} | {label} | {statistics.median(sa):.1f} | {statistics.median(sb):.1f} | "
                f"{' '.join(f'{r:.2f}' for r in ratios)} | {statistics.median(ratios):.2f} |"
            )


if __name__ == "__main__":
    main()
