"""The Typer application: one module per command, registered here.

A process runs one command, so `app_for(argv)` builds an application holding only the command that argv
names (its module imported, its Click command built); anything else (no command, an option first, an
unknown name) gets the whole application. The other twelve commands' imports and Click commands cost
14-27 ms of `llamacy run`'s start-up. `app` is the whole application.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import typer

from llamacy.cli.coercion import FastCommand, FastGroup

# name: (module in llamacy.cli, function, help; None = the module's HELP)
COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "run": ("run", "run", "Complete a prompt and print the completion."),
    "chat": ("chat", "chat", "Chat with a model in the terminal (or answer input lines in a pipe)."),
    "info": ("info", "info", "Describe a model file: architecture, size, quant mix, memory needs."),
    "bench": ("bench", "bench", "Measure prompt processing (pp) and generation (tg) speed."),
    "perplexity": (
        "perplexity",
        "perplexity",
        "Perplexity of a model on a text file (the reference tool's method).",
    ),
    "serve": ("serve", "serve", "Serve the model over HTTP: OpenAI-compatible API and job API."),
    "convert": (
        "convert",
        "convert",
        "Convert a Hugging Face checkpoint or a GGUF file to a GGUF file of another type.",
    ),
    "embed": ("embed", "embed", None),
    "batch": ("batch", "batch", "Run prompts from a file into a JSONL file; rerun to resume after a crash."),
    "pull": ("pull", "pull", "Download a GGUF model from a Hugging Face hub: OWNER/REPO[:QUANT]."),
    "list": ("list_models", "list_models", "The models at hand: pulled ones and installed packages."),
    "rm": ("rm", "rm", "Delete a pulled model."),
    "show": ("show", "show", "Where a model came from and what it is (what info prints)."),
}


def _version(value: bool) -> None:
    if value:
        from llamacy import __version__

        typer.echo(f"llamacy {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version."
    ),
) -> None:
    """Fast CPU inference for GGUF language models."""


def build_app(only: str | None = None) -> typer.Typer:
    """The application with every command, or with the command `only` alone."""
    application = typer.Typer(
        name="llamacy",
        cls=FastGroup,
        help="Fast CPU inference for GGUF language models.",
        add_completion=False,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    application.callback()(_root)
    for name, (module_name, function, help_text) in COMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(f"llamacy.cli.{module_name}")
        application.command(name, cls=FastCommand, help=help_text or module.HELP)(getattr(module, function))
    return application


def app_for(argv: Sequence[str]) -> typer.Typer:
    """The application to parse `argv` (the arguments after the program name) with."""
    return build_app(argv[0] if argv and argv[0] in COMMANDS else None)


def __getattr__(name: str) -> Any:
    if name == "app":
        globals()["app"] = application = build_app()
        return application
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
