"""`llamacy perplexity`: how well a model predicts a text, printed as the reference tool prints it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from llamacy.cli import options as opt


def perplexity(
    file: Path = typer.Option(..., "--file", "-f", help="The text to score."),
    model: str = opt.MODEL,
    ctx_size: int = typer.Option(512, "--ctx-size", "-c", help="Tokens per chunk."),
    kv_type: str = opt.KV_TYPE,
    chunks: int = typer.Option(None, "--chunks", help="Score at most this many chunks."),
    threads: int = opt.THREADS,
) -> None:
    from llamacy.engine import Llama
    from llamacy.errors import UsageError, require_range
    from llamacy.perplexity import perplexity as compute

    opt.check_counts(threads, ctx_size)
    if chunks is not None:
        require_range("--chunks", chunks, 1)
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"cannot read {file}: {e.strerror}") from None
    llm = Llama(model, n_ctx=ctx_size, n_threads=threads, n_batch=ctx_size, kv_type=kv_type)
    t0 = time.perf_counter()

    def progress(i: int, ppl: float) -> None:
        sys.stdout.write(f"[{i + 1}]{ppl:.4f},")
        sys.stdout.flush()

    r = compute(llm, text, ctx_size, max_chunks=chunks, on_chunk=progress)
    sys.stdout.write("\n")
    sys.stdout.write(f"Final estimate: PPL = {r.ppl:.4f} +/- {r.uncertainty:.5f}\n")
    sys.stderr.write(
        f"perplexity: {r.n_chunks} chunks of {r.n_ctx} tokens, {r.n_scored} scored, "
        f"{time.perf_counter() - t0:.1f} s\n"
    )
