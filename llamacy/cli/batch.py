"""`llamacy batch`: prompts from a file, results to JSONL, resumable after a crash or Ctrl-C."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from llamacy.cli import options as opt


@opt.sampling_options
def batch(
    prompts: Path = typer.Argument(
        ..., help="A text file (one prompt per line) or JSONL ({id, prompt, ...})."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="Results, one JSON line per prompt (appended)."),
    model: str = opt.MODEL,
    fmt: str = typer.Option("auto", "--format", help="auto (by extension: .jsonl/.json), text or jsonl."),
    parallel: int = typer.Option(4, "--parallel", "-np", help="Prompts decoded together."),
    predict: int = typer.Option(
        256, "--predict", "-n", help="Tokens per prompt; -1 = until the model stops."
    ),
    ctx_size: int = opt.CTX,
    kv_type: str = opt.KV_TYPE,
    threads: int = opt.THREADS,
    speculate: str = opt.SPECULATE,
    draft_max: int = opt.DRAFT_MAX,
    ngram: int = opt.NGRAM,
    draft_model: str = opt.DRAFT_MODEL,
    sampling: dict[str, Any] = opt.SAMPLING,
    stop: list[str] = typer.Option(None, "--stop", help="Stop at this text (not included); repeatable."),
    chat: bool = typer.Option(
        False, "--chat", help="Send each prompt as a user turn through the chat template."
    ),
    system: str = typer.Option(None, "--system", help="With --chat: a system prompt for every item."),
    ray_address: str = typer.Option(
        None,
        "--ray",
        help="Run on the Ray cluster at this address (host:port of its head, or 'auto'), with Ray Data: "
        "--replicas workers of -t threads (CPUs) each, --parallel prompts each. Needs llamacy[ray].",
    ),
    replicas: int = typer.Option(1, "--replicas", help="With --ray: how many workers (model copies)."),
) -> None:
    from llamacy.errors import UsageError, require_range

    opt.check_counts(threads, ctx_size, predict)
    require_range("--parallel", parallel, 1, 256)
    if system is not None and not chat:
        raise UsageError("--system needs --chat")
    if replicas < 1 or (replicas != 1 and ray_address is None):
        raise UsageError("--replicas is a number of Ray workers (1 or more), with --ray")
    defaults = {k: v for k, v in sampling.items() if v is not None}
    if speculate == "draft" and ray_address is not None:
        raise UsageError("on Ray, batch speculates by prompt lookup only (--speculate ngram)")
    speculating = opt.speculation(speculate, draft_max, ngram, draft_model)
    defaults.update({k: v for k, v in speculating.items() if v is not None})
    defaults["max_tokens"] = predict
    if stop:
        defaults["stop"] = list(stop)

    from llamacy.batch import BatchModel, done_ids, read_items, run_batch

    if ray_address is not None:
        from llamacy.distributed.cluster import require_ray

        require_ray("data")  # before any work: without Ray, one line saying how to get it
    items = read_items(prompts, fmt)
    already = done_ids(output, repair=False)
    if len(already) >= len(items) and all(_k(it.id) in already for it in items):
        _say(f"all {len(items)} prompts already have results in {output}")
        return
    spec = BatchModel(model, ctx_size, threads, kv_type, chat, system)
    progress = _Progress(len(items) - len(already & {_k(it.id) for it in items}))
    try:
        if ray_address is not None:
            from llamacy.distributed.ray_batch import run_batch_on_ray

            summary = run_batch_on_ray(
                ray_address, items, output, defaults, spec, replicas, parallel, on_result=progress.advance
            )
        else:
            llm, encode, stops = spec.load()
            if stops:
                defaults["stop"] = [*defaults.get("stop", []), *stops]
            draft = None
            if draft_model is not None:
                from llamacy.engine import Llama

                draft = Llama(draft_model, n_ctx=llm.n_ctx, n_threads=threads, kv_type=kv_type)
            summary = run_batch(
                llm,
                items,
                output,
                defaults,
                n_parallel=parallel,
                n_ctx=llm.n_ctx,
                encode=encode,
                on_result=progress.advance,
                draft=draft,
            )
    finally:
        progress.stop()
    _say(
        f"{summary.done} done, {summary.errors} failed, {summary.skipped} already in {output} "
        f"({summary.total} prompts)"
    )


def _k(item_id: object) -> str:
    import json

    return json.dumps(item_id)


def _say(text: str) -> None:
    # A pipe gets silence; a terminal gets one dim line.
    if sys.stderr.isatty():
        from rich.console import Console

        Console(stderr=True, highlight=False).print(f"[dim]{text}[/dim]")


class _Progress:
    """A Rich progress bar with items/s and ETA on a terminal; nothing in a pipe."""

    def __init__(self, total: int) -> None:
        self.bar = None
        if not sys.stderr.isatty():
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("batch"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} items/s"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self.task = self.bar.add_task("batch", total=total, rate="–")
        self.bar.start()
        import time

        self.t0 = time.monotonic()
        self.n = 0

    def advance(self, _result: dict) -> None:
        if self.bar is None:
            return
        import time

        self.n += 1
        rate = self.n / max(time.monotonic() - self.t0, 1e-9)
        self.bar.update(self.task, advance=1, rate=f"{rate:.2f}")

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
