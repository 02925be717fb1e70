"""The Typer application: one module per command registers itself here."""

from __future__ import annotations

import typer

from llamacy.cli import batch as batch_cmd
from llamacy.cli import bench as bench_cmd
from llamacy.cli import chat as chat_cmd
from llamacy.cli import convert as convert_cmd
from llamacy.cli import embed as embed_cmd
from llamacy.cli import info as info_cmd
from llamacy.cli import list_models as list_cmd
from llamacy.cli import perplexity as perplexity_cmd
from llamacy.cli import pull as pull_cmd
from llamacy.cli import rm as rm_cmd
from llamacy.cli import run as run_cmd
from llamacy.cli import serve as serve_cmd
from llamacy.cli import show as show_cmd
from llamacy.cli.coercion import FastCommand, FastGroup

app = typer.Typer(
    name="llamacy",
    cls=FastGroup,
    help="Fast CPU inference for GGUF language models.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from llamacy import __version__

        typer.echo(f"llamacy {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version."
    ),
) -> None:
    """Fast CPU inference for GGUF language models."""


# (name, help, function): every command parses its parameters with FastCommand (see llamacy.cli.coercion).
_COMMANDS = [
    ("run", "Complete a prompt and print the completion.", run_cmd.run),
    ("chat", "Chat with a model in the terminal (or answer input lines in a pipe).", chat_cmd.chat),
    ("info", "Describe a model file: architecture, size, quant mix, memory needs.", info_cmd.info),
    ("bench", "Measure prompt processing (pp) and generation (tg) speed.", bench_cmd.bench),
    (
        "perplexity",
        "Perplexity of a model on a text file (the reference tool's method).",
        perplexity_cmd.perplexity,
    ),
    ("serve", "Serve the model over HTTP: OpenAI-compatible API and job API.", serve_cmd.serve),
    (
        "convert",
        "Convert a Hugging Face checkpoint or a GGUF file to a GGUF file of another type.",
        convert_cmd.convert,
    ),
    ("embed", embed_cmd.HELP, embed_cmd.embed),
    ("batch", "Run prompts from a file into a JSONL file; rerun to resume after a crash.", batch_cmd.batch),
    ("pull", "Download a GGUF model from a Hugging Face hub: OWNER/REPO[:QUANT].", pull_cmd.pull),
    ("list", "The models at hand: pulled ones and installed packages.", list_cmd.list_models),
    ("rm", "Delete a pulled model.", rm_cmd.rm),
    ("show", "Where a model came from and what it is (what info prints).", show_cmd.show),
]
for _name, _help, _function in _COMMANDS:
    app.command(_name, cls=FastCommand, help=_help)(_function)
