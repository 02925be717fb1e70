"""`make bench`: llamacy's pp/tg figures on the installed models, beside the reference engine's when present.

Runs `llamacy bench` on the default model (and Gemma 3 270M when installed); when `llama_cpp`
(llama-cpp-python, `make bench-peer`) is importable, runs the same tests through it in the same process
run, alternating engines per test so that machine noise hits both alike, and prints our/its ratio.
Writes the tables between the markers in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def machine() -> str:
    from llamacy.bench import cpu_name

    return f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def peer_run(path: str, n_prompt: int, n_gen: int, threads: int, reps: int) -> list[float]:
    """The same test through llama-cpp-python: random tokens, warm-up excluded, tokens/s per run."""
    import numpy as np
    from llama_cpp import Llama as PeerLlama

    n_ctx = max(n_prompt, n_gen) + 8
    llm = PeerLlama(
        path,
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=max(n_prompt, 1),
        n_ubatch=max(n_prompt, 1),
        verbose=False,
    )
    rng = np.random.default_rng(0)
    vocab = llm.n_vocab()

    def once() -> float:
        llm.reset()  # n_tokens = 0: its next eval drops the whole KV cache
        t0 = time.perf_counter()
        if n_prompt:
            llm.eval(rng.integers(0, vocab, n_prompt).tolist())
        for _ in range(n_gen):
            llm.eval([int(rng.integers(0, vocab))])
        return (n_prompt or n_gen) / (time.perf_counter() - t0)

    once()
    return [once() for _ in range(reps)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-p", default="128,512")
    ap.add_argument("-n", default="64,128")
    ap.add_argument("-t", default="1,2")
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = ap.parse_args()

    from llamacy.bench import markdown, run_test
    from llamacy.catalog import KNOWN_MODELS
    from llamacy.engine import Llama

    try:
        import llama_cpp  # noqa: F401

        have_peer = True
    except ImportError:
        have_peer = False

    prompts = [int(x) for x in args.p.split(",") if x]
    gens = [int(x) for x in args.n.split(",") if x]
    threads = [int(x) for x in args.t.split(",") if x]
    lines = [f"Machine: {machine()}. Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", ""]
    lines.append(
        f"Command: `make bench` (= `python benchmarks/run_all.py -p {args.p} -n {args.n} -t {args.t} "
        f"-r {args.r}`); t/s is mean ± stddev of {args.r} runs after a warm-up."
    )
    lines.append("")
    for name, known in KNOWN_MODELS.items():
        path = known.locate()
        if path is None:
            print(f"skipping {name}: not installed", file=sys.stderr)
            continue
        llm = Llama(path, n_ctx=max(prompts + gens) + 8, n_threads=max(threads), n_batch=max(prompts))
        ours, rows = [], []
        for t in threads:
            llm.n_threads = llm.model.n_threads = t
            tests = [(p, 0) for p in prompts] + [(0, g) for g in gens]
            for p, g in tests:
                r = run_test(llm, p, g, args.r)
                ours.append(r)
                label = f"pp{p}" if p else f"tg{g}"
                if have_peer:
                    peer = peer_run(str(path), p, g, t, args.r)
                    ratio = r.avg_ts / statistics.mean(peer)
                    rows.append((name, t, label, r.avg_ts, statistics.mean(peer), ratio))
                    print(
                        f"{name} t={t} {label}: llamacy {r.avg_ts:.1f} t/s, llama.cpp {statistics.mean(peer):.1f}"
                        f" t/s, ratio {ratio:.2f}",
                        file=sys.stderr,
                    )
                else:
                    print(f"{name} t={t} {label}: llamacy {r.avg_ts:.1f} t/s", file=sys.stderr)
        lines.append(f"### {name}")
        lines.append("")
        lines.append(markdown(ours))
        lines.append("")
        if rows:
            lines.append("Side by side with llama-cpp-python in the same run (our t/s ÷ its t/s):")
            lines.append("")
            lines.append("| model | threads | test | llamacy t/s | llama.cpp t/s | ratio |")
            lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
            for m, t, label, a, b, ratio in rows:
                lines.append(f"| {m} | {t} | {label} | {a:.2f} | {b:.2f} | {ratio:.2f} |")
            lines.append("")
        del llm
    if not have_peer:
        lines.append("(llama-cpp-python not installed: `make bench-peer` adds the side-by-side ratios.)")
    text = "\n".join(lines)
    print(text)
    if args.no_write:
        return
    bench = ROOT / "BENCHMARKS.md"
    doc = bench.read_text() if bench.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN not in doc:
        doc += f"\n{BEGIN}\n{END}\n"
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    bench.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    print(f"wrote {bench}", file=sys.stderr)


if __name__ == "__main__":
    main()
