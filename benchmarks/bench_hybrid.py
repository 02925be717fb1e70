"""Hybrid models (issue #25) beside the native reference engine: prefill, decode, and decode deep into a
context, where a recurrent state should cost what it costs at the start.

    python3 benchmarks/make_models.py --models qwen3.5-0.8b,nemotron-h-1.3b --types q4_k_m
    python3 benchmarks/bench_hybrid.py --ref-bench /path/to/llama-bench [--models qwen3.5-0.8b-Q4_K_M,...]

Each round runs every test on both engines (who goes first alternates), `--reps` timed runs each after a
warm-up, at `--threads`; the table gives per test the median over rounds of our t/s, the reference's, and
the median of the per-round ratios. Depth tests (tgN @ dD) decode after D random tokens already in the
memory, filled untimed (llama-bench's -d; `llamacy bench -d`). The depth ratio at the end is decode at the
deepest depth over decode at the shallowest, per engine (the ratio of the medians, and the median of each
round's own ratio): a recurrent layer reads the same state at any depth, only the attention layers' K/V grows.
-p 0 leaves the prompt test out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from make_models import gguf_path  # noqa: E402
from reference import find_bench, run_bench  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3.5-0.8b-Q4_K_M,nemotron-h-1.3b-Q4_K_M")
    ap.add_argument("--ref-bench", help="llama-bench (default: $LLAMACY_REF_BENCH)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--depths", default="100,4000")
    args = ap.parse_args()

    from llamacy.bench import run_test
    from llamacy.engine import Llama

    ref = find_bench(args.ref_bench)
    if ref is None:
        raise SystemExit("no reference llama-bench: --ref-bench PATH or $LLAMACY_REF_BENCH")
    depths = [int(d) for d in args.depths.split(",") if d]
    # -p 0 leaves the prompt test out (decode and depth only)
    tests = [*([(args.p, 0, 0)] if args.p else []), (0, args.n, 0), *[(0, args.n, d) for d in depths]]
    print(f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, threads {args.threads}, "
          f"rounds {args.rounds}, reps {args.reps}")  # fmt: skip
    for label in [m for m in args.models.split(",") if m]:
        name, qtype = label.rsplit("-", 1)
        path = gguf_path(name, qtype)
        if not path.is_file():
            raise SystemExit(f"{path} is missing: benchmarks/make_models.py --models {name} --types {qtype}")
        # The prompt test runs on an empty memory, the depth tests decode after their depth.
        llm = Llama(path, repack="load", n_ctx=max(max([*depths, 0]) + args.n, args.p) + 8, n_threads=args.threads,
                    n_batch=args.p or 512)  # fmt: skip
        ours: dict[str, list[float]] = {}
        theirs: dict[str, list[float]] = {}
        commit = "?"
        for rnd in range(args.rounds):
            for i, (p, g, d) in enumerate(tests):
                key = (f"pp{p}" if p else f"tg{g}") + (f" @ d{d}" if d else "")
                order = ["ours", "ref"] if (rnd + i) % 2 == 0 else ["ref", "ours"]
                for who in order:
                    if who == "ours":
                        ours.setdefault(key, []).append(run_test(llm, p, g, args.reps, n_depth=d).avg_ts)
                    else:
                        r = run_bench(ref, path, p, g, args.threads, args.reps, n_depth=d)
                        commit = r.commit
                        theirs.setdefault(key, []).append(r.avg_ts)
                print(f"{label} round {rnd} {key}: ours {ours[key][-1]:.2f}, llama.cpp {theirs[key][-1]:.2f} t/s",
                      file=sys.stderr, flush=True)  # fmt: skip
        print(f"\n{label} ({path.stat().st_size / 2**20:.0f} MiB), llama.cpp {commit}:\n")
        print("| test | llamacy t/s | llama.cpp t/s | ratio (median of rounds) |")
        print("| --- | ---: | ---: | ---: |")
        for key in ours:
            ratios = [a / b for a, b in zip(ours[key], theirs[key], strict=True)]
            print(f"| {key} | {statistics.median(ours[key]):.2f} | {statistics.median(theirs[key]):.2f} | "
                  f"{statistics.median(ratios):.2f}× |")  # fmt: skip
        if len(depths) >= 2:
            lo, hi = f"tg{args.n} @ d{min(depths)}", f"tg{args.n} @ d{max(depths)}"
            for who, got in (("llamacy", ours), ("llama.cpp", theirs)):
                ratio = statistics.median(got[hi]) / statistics.median(got[lo])
                # each round's own ratio too: its two tests ran seconds apart, so a machine that drifts
                # between rounds moves both alike
                per_round = [a / b for a, b in zip(got[hi], got[lo], strict=True)]
                print(f"\n{who}: decode at depth {max(depths)} is {ratio:.2f}× decode at depth {min(depths)} "
                      f"(medians); median of the rounds' ratios {statistics.median(per_round):.2f}× "
                      f"({' '.join(f'{r:.2f}' for r in per_round)})")  # fmt: skip


if __name__ == "__main__":
    main()
