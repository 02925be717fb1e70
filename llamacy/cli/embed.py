"""`llamacy embed`: embedding vectors as JSON on stdout, one array per line, nothing else."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from llamacy.cli import options as opt

HELP = (
    "Embed text: print its embedding vector as a JSON array of floats.\n\n"
    "One input, one line of output. With --file, every non-empty line of the file is an input, and the "
    "output has one JSON array per input line, in order (JSON Lines; '--file -' reads the lines from stdin). "
    "Vectors have unit length (L2) unless --no-normalize; they are pooled as the model file says (mean over "
    "the positions when it says nothing)."
)


def read_inputs(text: str | None, file: Path | None) -> list[str]:
    """The texts to embed: the argument (or all of stdin for '-'), or the non-empty lines of --file."""
    from llamacy.cli.run import read_prompt
    from llamacy.errors import UsageError

    if file is None:
        if text is None:
            raise UsageError("nothing to embed: give text as an argument, '-' for stdin, or --file")
        return [read_prompt(text, None)]
    if text is not None:
        raise UsageError("give the text as an argument or with --file, not both")
    try:
        data = sys.stdin.buffer.read() if str(file) == "-" else file.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read input file {file}: {e.strerror}") from None
    lines = [line for line in data.decode("utf-8", errors="replace").splitlines() if line.strip()]
    if not lines:
        raise UsageError(f"{file} has no non-empty lines to embed")
    return lines


def embed(
    text: str = typer.Argument(None, help="The text to embed; '-' reads it from stdin."),
    file: Path = typer.Option(None, "--file", "-f", help="Embed each non-empty line ('-': stdin's lines)."),
    model: str = opt.MODEL,
    ctx_size: int = opt.CTX,
    threads: int = opt.THREADS,
    normalize: bool = typer.Option(
        True, "--normalize/--no-normalize", help="Scale each vector to unit length (L2)."
    ),
) -> None:
    opt.check_counts(threads, ctx_size)
    inputs = read_inputs(text, file)

    from llamacy.engine import Llama

    llm = Llama(model, n_ctx=ctx_size, n_threads=threads)
    # Line by line, so that a long file's vectors flow into the pipe as they are made.
    for line in inputs:
        sys.stdout.write(json.dumps(llm.embed(line, normalize=normalize).vectors[0]) + "\n")
        sys.stdout.flush()
