"""`llamacy convert`: a Hugging Face checkpoint or a GGUF file into a GGUF file of another type."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from llamacy.cli import options as opt

# TARGETS of llamacy.convert.mixtures, spelled out so that the CLI starts without importing gguf (a test
# keeps the two in step).
_TYPES = "f32, f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0, q6_k, q5_k_m, q5_k_s, q4_k_m, q4_k_s, q3_k_l, q3_k_m, q3_k_s, q2_k"


def convert(
    src: Path = typer.Argument(..., help="A Hugging Face model directory (safetensors) or a GGUF file."),
    output: Path = typer.Option(
        ..., "--output", "-o", help="The GGUF file to write (replaced if it exists)."
    ),
    qtype: str = typer.Option(
        ...,
        "--type",
        help=f"Output type: {_TYPES} (q4_k, q5_k, q3_k mean their _m mixtures, as in llama-quantize).",
    ),
    pure: bool = typer.Option(
        False, "--pure", help="No per-tensor mixture rules: every quantizable tensor in --type's base type."
    ),
    threads: int = opt.THREADS,
) -> None:
    from llamacy.convert import convert as run_convert

    opt.check_counts(threads, None)
    bar = _ProgressBar() if sys.stderr.isatty() else None
    try:
        summary = run_convert(src, output, qtype, pure=pure, threads=threads, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    mix = ", ".join(f"{k}×{v}" for k, v in summary.types.most_common())
    typer.echo(
        f"wrote {summary.output}: {summary.n_tensors} tensors ({mix}), "
        f"{_mib(summary.bytes_in)} → {_mib(summary.bytes_out)} in {summary.seconds:.1f} s"
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class _ProgressBar:
    """A Rich progress bar over the model's values, labelled with the tensor being written."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.progress.add_task("reading", total=None)
        self.progress.start()

    def __call__(self, name: str, ty: int, done: int, total: int) -> None:
        from llamacy.ggml_types import type_name

        self.progress.update(self.task, description=f"{name} → {type_name(ty)}", completed=done, total=total)

    def close(self) -> None:
        self.progress.stop()
