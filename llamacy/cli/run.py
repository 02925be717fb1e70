"""`llamacy run`: complete one prompt. In a pipe, stdout carries the completion and nothing else."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from llamacy.cli import options as opt


def read_prompt(prompt: str | None, file: Path | None) -> str:
    from llamacy.errors import UsageError

    if file is not None and prompt not in (None, "-"):
        raise UsageError("give the prompt as an argument or with --file, not both")
    if file is not None:
        try:
            data = file.read_bytes()
        except OSError as e:
            raise UsageError(f"cannot read prompt file {file}: {e.strerror}") from None
    elif prompt == "-":
        data = sys.stdin.buffer.read()
    elif prompt is None:
        raise UsageError("no prompt: give one as an argument, '-' for stdin, or --file")
    else:
        return prompt
    # Invalid UTF-8 becomes U+FFFD rather than an error: the model still sees the rest of the text.
    text = data.decode("utf-8", errors="replace")
    # `echo ... |` and editors end input with one newline that the user did not mean as part of the prompt.
    return text[:-1] if text.endswith("\n") else text


@opt.sampling_options
@opt.speculation_options
def run(
    prompt: str = typer.Argument(None, help="The prompt; '-' reads it from stdin."),
    file: Path = typer.Option(None, "--file", "-f", help="Read the prompt from a file."),
    model: str = opt.MODEL,
    predict: int = typer.Option(
        256, "--predict", "-n", help="Tokens to generate; -1 = until the model stops."
    ),
    ctx_size: int = opt.CTX,
    kv_type: str = opt.KV_TYPE,
    threads: int = opt.THREADS,
    sampling: dict[str, Any] = opt.SAMPLING,
    stop: list[str] = typer.Option(None, "--stop", help="Stop at this text (not printed); repeatable."),
    echo: bool = typer.Option(
        None, "--echo/--no-echo", help="Print the prompt before the completion (default: on a terminal only)."
    ),
    spec: dict[str, Any] = opt.SPECULATION,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Load time and tokens/s on stderr."),
    profile: bool = typer.Option(False, "--profile", help="Where the time went, per stage, on stderr."),
    json_object: bool = typer.Option(False, "--json", help="Output one JSON object (any)."),
    json_schema: str = typer.Option(
        None, "--json-schema", help="Output JSON valid against this schema: a file, or the schema itself."
    ),
    grammar: str = typer.Option(
        None, "--grammar", help="Output that a GBNF grammar file (root rule `root`) accepts."
    ),
    context_shift: bool = typer.Option(
        False,
        "--context-shift",
        help="When the context is full, drop the older half after the first --keep tokens and go on.",
    ),
    keep: int = typer.Option(0, "--keep", help="With --context-shift: the prompt's first tokens to keep."),
    prompt_cache: Path = typer.Option(
        None,
        "--prompt-cache",
        help="Keep the evaluated prompt's memory in this file: a later run whose prompt starts the same way "
        "evaluates only the rest.",
    ),
) -> None:
    opt.check_counts(threads, ctx_size, predict)
    from llamacy.structured.grammar import cli_grammar

    constraint = cli_grammar(json_object, json_schema, grammar)  # a bad schema fails before the model loads
    text = read_prompt(prompt, file)

    from llamacy.cli.output import CompletionWriter, print_profile, print_stats
    from llamacy.engine import Llama

    llm = Llama(model, n_ctx=ctx_size, n_threads=threads, profile=profile, kv_type=kv_type)
    on_prompt = _prompt_cache(llm, prompt_cache) if prompt_cache is not None else None
    out = CompletionWriter(echo=echo)
    out.prompt(text)
    try:
        for piece in llm.generate(
            text,
            max_tokens=predict,
            stop=stop or (),
            grammar=constraint,
            on_prompt=on_prompt,
            context_shift=context_shift,
            keep=keep,
            **spec,
            **sampling,
        ):
            out.write(piece)
    except KeyboardInterrupt:
        out.end()
        raise
    out.end()
    if verbose:
        print_stats(llm)
    if profile and llm.last is not None:
        print_profile(llm.last.stats)


def _prompt_cache(llm: Any, path: Path) -> Any:
    """Load the prompt cache if there is one (a mismatched or damaged file fails in one line); return the
    callback that saves the evaluated prompt when it differs from what the file held."""
    saved: list[int] = llm.load_memory(path).tokens if path.exists() else []

    def save(ids: list[int]) -> None:
        if ids != saved:
            llm.save_memory(path)

    return save
