"""`llamacy bench`: prompt-processing and generation speed, in the reference bench tool's format."""

from __future__ import annotations

import json

import typer

from llamacy.cli import options as opt


def _ints(text: str, name: str, minimum: int) -> list[int]:
    from llamacy.errors import UsageError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{name} takes a comma-separated list of integers, got {text!r}") from None
    if any(v < minimum for v in values):
        raise UsageError(f"{name} values must be at least {minimum}, got {text!r}")
    return values


def bench(
    model: list[str] = typer.Option(
        None, "--model", "-m", help="Model path or name; repeat or comma-separate."
    ),
    n_prompt: str = typer.Option("512", "--n-prompt", "-p", help="Prompt sizes for pp tests (comma list)."),
    n_gen: str = typer.Option("128", "--n-gen", "-n", help="Generation lengths for tg tests (comma list)."),
    threads: str = typer.Option(
        None, "--threads", "-t", help="Thread counts (comma list; default: all cores)."
    ),
    n_depth: str = typer.Option(
        "0", "--n-depth", "-d", help="Tokens already in the cache when each test starts (comma list)."
    ),
    repetitions: int = typer.Option(5, "--repetitions", "-r", help="Runs per test after one warm-up."),
    output: str = typer.Option("md", "--output", "-o", help="md, json or csv."),
    profile: bool = typer.Option(False, "--profile", help="Per-stage time of each test on stderr."),
    kv_type: str = opt.KV_TYPE,
) -> None:
    from llamacy.errors import UsageError, require_range

    if output not in ("md", "json", "csv"):
        raise UsageError(f"--output must be md, json or csv, got {output!r}")
    require_range("--repetitions", repetitions, 1)
    prompts = [p for p in _ints(n_prompt, "--n-prompt", 0) if p]
    gens = [g for g in _ints(n_gen, "--n-gen", 0) if g]
    depths = _ints(n_depth, "--n-depth", 0) or [0]
    models = [m for spec in (model or [None]) for m in (spec.split(",") if spec else [None])]

    from llamacy.bench import csv, markdown, run_test
    from llamacy.engine import Llama
    from llamacy.model import default_threads

    thread_counts = _ints(threads, "--threads", 1) if threads else [default_threads()]
    results = []
    for m in models:
        need = max([*prompts, *gens, 1]) + max(depths)
        llm = Llama(
            m,
            n_ctx=need,
            n_threads=max(thread_counts),
            n_batch=max([*prompts, 512 if max(depths) else 1]),  # the depth fills in batches
            profile=profile,
            kv_type=kv_type,
            repack="load",  # steady kernels from the first test, as llama-bench repacks at load
        )
        # Build the model before lowering the thread count: it sizes its scratch and the thread team for
        # the threads it is built with, and never uses more (`llm.n_threads = llm.model.n_threads = 1`
        # would build it for one, and every later test would run on one thread whatever it says).
        model = llm.model
        for t in thread_counts:
            llm.n_threads = model.n_threads = t
            for d, p, g in [
                (d, p, g) for d in depths for p, g in [(p, 0) for p in prompts] + [(0, g) for g in gens]
            ]:
                llm.model.forward.profile_reset()
                results.append(run_test(llm, p, g, repetitions, n_depth=d))
                if output == "md":
                    # The header once, then one row per test as it finishes.
                    typer.echo(
                        markdown(results[-1:])
                        if len(results) == 1
                        else markdown(results[-1:]).splitlines()[-1]
                    )
                if profile:
                    _print_profile(
                        llm.model.forward.profile(), (p or g) * (repetitions + 1), results[-1].test, t
                    )
    if output == "json":
        typer.echo(json.dumps([r.to_dict() for r in results], indent=2))
    elif output == "csv":
        typer.echo(csv(results), nl=False)


def _print_profile(prof: dict[str, float], n_tokens: int, test: str, threads: int) -> None:
    from rich.console import Console
    from rich.table import Table

    total = sum(prof.values()) or 1e-12
    t = Table(title=f"profile {test}, {threads} threads (warm-up included), per token")
    t.add_column("stage")
    t.add_column("µs / token", justify="right")
    t.add_column("share", justify="right")
    for name, sec in sorted(prof.items(), key=lambda kv: -kv[1]):
        t.add_row(name, f"{sec * 1e6 / n_tokens:.1f}", f"{100 * sec / total:.1f}%")
    Console(stderr=True, highlight=False).print(t)
