"""`llamacy show NAME`: where a model came from, then what `llamacy info` says about it."""

from __future__ import annotations

import json
from typing import Any

import typer

from llamacy.cli import info as info_cmd
from llamacy.cli import options as opt


def _source(name: str) -> dict[str, Any] | None:
    """Hub provenance for a pulled name; None for catalog names and paths."""
    from llamacy import hub

    ref = hub.parse_ref(name)
    model = hub.find_pulled(ref) if ref is not None else None
    if model is None:
        return None
    return {
        "name": model.name,
        "repository": model.repo_id,
        "commit": model.commit,
        "files": list(model.variant.files),
    }


def show(
    name: str = typer.Argument(
        ..., help="A known or pulled model name (see `llamacy list`), or a GGUF file."
    ),
    ctx_size: int = opt.CTX,
    kv_type: str = opt.KV_TYPE,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    from llamacy.catalog import resolve_model

    opt.check_counts(None, ctx_size)
    # Showing a model never downloads it: a name not pulled yet is an error that says to pull it.
    path = resolve_model(name, allow_pull=False)
    source = _source(name)
    if as_json:
        d = info_cmd.describe(str(path), ctx_size, kv_type)
        typer.echo(json.dumps({"source": source, **d}, indent=2))
        return
    if source is not None:
        from rich.console import Console
        from rich.table import Table

        t = Table(show_header=False, box=None, pad_edge=False)
        t.add_column(style="bold", min_width=len("context length"))  # lined up with info's rows below
        t.add_column()
        t.add_row("pulled as", source["name"])
        t.add_row("from", f"{source['repository']} @ {source['commit']}")
        t.add_row("files", ", ".join(source["files"]))
        Console(highlight=False).print(t)
    info_cmd.info(str(path), model=None, ctx_size=ctx_size, kv_type=kv_type, as_json=False)
