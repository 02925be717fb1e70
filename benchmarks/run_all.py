"""`make bench`: llamacy's pp/tg figures on the installed models, beside the reference engine's when present.

Runs `llamacy bench` on the default model (and Gemma 3 270M when installed), then on the realistic
random-weight models that benchmarks/make_models.py has built (1B-3B shapes in Q4_K_M, Q4_0, Q8_0; skipped
when none is built, --no-big to skip them): those run only --big-p/--big-n at --big-t threads, plus
tg<--big-n> at depth --big-d (llama-bench's -d: the cache already holds that many tokens). Two peers, each
optional:
  - the native reference engine: a llama-bench binary (--ref-bench PATH or $LLAMACY_REF_BENCH; built by
    benchmarks/build_reference.sh from a pinned commit, -DGGML_NATIVE=ON), labelled with its commit;
  - llama-cpp-python (`make bench-peer`), the reference engine through its Python binding: every token
    costs Python calls there, so it is labelled as the binding and is not the reference's speed.
Each test runs on every engine in turn, the order alternating from test to test so that machine noise
hits all alike, and the tables give our/its ratio. Writes the tables between the markers in BENCHMARKS.md.
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
sys.path.insert(0, str(ROOT / "benchmarks"))
from reference import find_bench, run_bench  # noqa: E402

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def machine() -> str:
    from llamacy.bench import cpu_name

    return f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def fitting_depths(name: str, path: Path, depths: list[int], n_gen: int) -> list[int]:
    """The depth tests a model's trained context holds: a depth whose cache would outgrow it is cut to the
    deepest that fits (nemotron-h-1.3b's 4096 positions hold tg128 at depth 3960, not 4096), and said."""
    if not depths:
        return depths
    from llamacy.gguf import GGUFFile

    with GGUFFile(path) as f:
        n_ctx_train = f.get(f"{f.get('general.architecture')}.context_length")
    if not isinstance(n_ctx_train, int):
        return depths
    room = n_ctx_train - n_gen - 8
    fit = sorted({min(d, room) for d in depths if room > 0})
    for d in depths:
        if d > room:
            print(
                f"{name}: depth {d} + {n_gen} tokens exceeds the trained context of {n_ctx_train}: "
                f"{'depth ' + str(room) if room > 0 else 'no depth test'} instead",
                file=sys.stderr,
            )
    return fit


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


def ratio_table(title: str, peer: str, rows: list[tuple]) -> list[str]:
    out = [title, "", f"| model | threads | test | llamacy t/s | {peer} t/s | ratio |"]
    out.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    out += [f"| {m} | {t} | {label} | {a:.2f} | {b:.2f} | {a / b:.2f} |" for m, t, label, a, b in rows]
    return [*out, ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-p", default="128,512")
    ap.add_argument("-n", default="64,128")
    ap.add_argument("-t", default="1,2")
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("--big-p", default="512", help="prompt sizes for the realistic models")
    ap.add_argument("--big-n", default="128", help="generation lengths for the realistic models")
    ap.add_argument("--big-d", default="4096", help="depths for their tg tests (0 or empty: none)")
    ap.add_argument("--big-t", default="2", help="thread counts for the realistic models")
    ap.add_argument("--big-r", type=int, default=3, help="runs per test for the realistic models")
    ap.add_argument(
        "--big-only", default="", help="only realistic models whose label contains one of these (comma list)"
    )
    ap.add_argument("--no-big", action="store_true", help="skip the realistic models")
    ap.add_argument("--no-small", action="store_true", help="skip the known (small, real) models")
    ap.add_argument("--ref-bench", help="the native reference's llama-bench (default: $LLAMACY_REF_BENCH)")
    ap.add_argument("--no-binding", action="store_true", help="skip llama-cpp-python even if installed")
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = ap.parse_args()

    from llamacy.bench import markdown, run_test
    from llamacy.catalog import KNOWN_MODELS
    from llamacy.engine import Llama
    from llamacy.errors import UsageError

    ref_bench = find_bench(args.ref_bench)
    have_binding = False
    if not args.no_binding:
        try:
            import llama_cpp  # noqa: F401

            have_binding = True
        except ImportError:
            pass

    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x]

    # (label, path, prompts, gens, depths, threads, reps)
    runs: list[tuple[str, Path, list[int], list[int], list[int], list[int], int]] = []
    if not args.no_small:
        for name, known in KNOWN_MODELS.items():
            path = known.locate()
            if path is None:
                print(f"skipping {name}: not installed", file=sys.stderr)
                continue
            runs.append((name, path, ints(args.p), ints(args.n), [], ints(args.t), args.r))
    if not args.no_big:
        from make_models import built_models

        pick = [x for x in args.big_only.split(",") if x] or [""]
        big = [(label, p) for label, p in built_models() if any(x in label for x in pick)]
        if not big:
            print("no realistic models: benchmarks/make_models.py builds them", file=sys.stderr)
        for label, path in big:
            depths = [d for d in ints(args.big_d) if d]
            runs.append(
                (label, path, ints(args.big_p), ints(args.big_n), depths, ints(args.big_t), args.big_r)
            )
    lines = [f"Machine: {machine()}. Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", ""]
    ref_opt = " --ref-bench LLAMA_BENCH" if ref_bench else ""
    lines.append(
        f"Command: `make bench` (= `python benchmarks/run_all.py -p {args.p} -n {args.n} -t {args.t} "
        f"-r {args.r} --big-p {args.big_p} --big-n {args.big_n} --big-d {args.big_d} --big-t {args.big_t} "
        f"--big-r {args.big_r}{ref_opt}`); t/s is mean ± stddev of the runs after a warm-up. The machine may "
        "be shared with other work: compare the ratios, measured test by test in the same run."
    )
    lines.append("")
    commit = None
    n_test = 0
    for name, path, prompts, gens, depths, threads, reps in runs:
        depths = fitting_depths(name, path, depths, max(gens or [0]))
        tests = (
            [(p, 0, 0) for p in prompts]
            + [(0, g, 0) for g in gens]
            + [(0, g, d) for d in depths for g in gens]
        )
        try:
            llm = Llama(
                path,
                n_ctx=max([*prompts, *gens, *(d + g for d in depths for g in gens)]) + 8,
                n_threads=max(threads),
                n_batch=max(prompts or [512]),
                repack="load",
            )
        except UsageError as e:  # one model that cannot run does not cost the others' figures
            print(f"skipping {name}: {e}", file=sys.stderr)
            lines += [f"### {name}", "", f"Skipped: {e}", ""]
            continue
        ours, native_rows, binding_rows = [], [], []
        model = llm.model  # built for max(threads) before the count drops (see llamacy/cli/bench.py)
        for t in threads:
            llm.n_threads = model.n_threads = t
            for p, g, d in tests:
                label = (f"pp{p}" if p else f"tg{g}") + (f" @ d{d}" if d else "")
                engines = (
                    ["llamacy"] + (["native"] if ref_bench else []) + (["binding"] if have_binding else [])
                )
                if n_test % 2:
                    engines.reverse()  # alternate who goes first
                n_test += 1
                got: dict[str, float] = {}
                for engine in engines:
                    if engine == "llamacy":
                        r = run_test(llm, p, g, reps, n_depth=d)
                        ours.append(r)
                        got[engine] = r.avg_ts
                    elif engine == "native":
                        ref = run_bench(ref_bench, path, p, g, t, reps, n_depth=d)
                        commit = ref.commit
                        got[engine] = ref.avg_ts
                    else:
                        if d:
                            continue  # the binding has no depth test
                        got[engine] = statistics.mean(peer_run(str(path), p, g, t, reps))
                if "native" in got:
                    native_rows.append((name, t, label, got["llamacy"], got["native"]))
                if "binding" in got:
                    binding_rows.append((name, t, label, got["llamacy"], got["binding"]))
                print(
                    f"{name} t={t} {label}: " + ", ".join(f"{k} {v:.1f} t/s" for k, v in got.items()),
                    file=sys.stderr,
                )
        lines += [f"### {name}", "", markdown(ours), ""]
        if native_rows:
            lines += ratio_table(
                f"Side by side with the native reference engine (llama.cpp {commit}, llama-bench, "
                "-DGGML_NATIVE=ON) in the same run (our t/s ÷ its t/s):",
                f"llama.cpp {commit}",
                native_rows,
            )
        if binding_rows:
            lines += ratio_table(
                "Side by side with llama-cpp-python (the reference through its Python binding, a slower "
                "thing than the native engine) in the same run:",
                "llama-cpp-python",
                binding_rows,
            )
        del llm
    if not ref_bench:
        lines.append(
            "(No native reference: benchmarks/build_reference.sh builds one; then "
            "`LLAMACY_REF_BENCH=.../llama-bench make bench`.)"
        )
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
