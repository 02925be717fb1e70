"""`llamacy list`: the models this machine can run by name (pulled from the hub, or installed packages)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer


def _architecture(path: Path) -> str | None:
    from llamacy.errors import LlamacyError
    from llamacy.gguf import GGUFFile

    try:
        f = GGUFFile(path)
    except (LlamacyError, OSError, ValueError):
        return None  # listed anyway: `llamacy show` says what is wrong with it
    try:
        return f.metadata.get("general.architecture")
    finally:
        f.close()


def installed_models() -> list[dict[str, Any]]:
    from llamacy import hub
    from llamacy.catalog import KNOWN_MODELS
    from llamacy.hub.names import quant_label

    rows = []
    for known in KNOWN_MODELS.values():
        path = known.locate()
        if path is not None:
            rows.append(
                dict(name=known.name, quant=quant_label(path.name), size=path.stat().st_size, path=path)
            )
    for m in hub.pulled_models():
        rows.append(dict(name=m.name, quant=m.variant.label, size=m.variant.size, path=m.paths[0]))
    for row in rows:
        row["architecture"] = _architecture(row["path"])
        row["path"] = str(row["path"])
    return rows


def list_models(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    import sys

    rows = installed_models()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not sys.stdout.isatty():
        # A pipe gets whole fields, tab-separated, for cut and awk; sizes in bytes.
        for r in rows:
            fields = (r["name"], r["quant"] or "?", str(r["size"]), r["architecture"] or "?", r["path"])
            typer.echo("\t".join(fields))
        return
    from rich.console import Console
    from rich.table import Table

    from llamacy.memory import human_size

    t = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("name", "quant", "size", "architecture"):
        t.add_column(col, justify="right" if col == "size" else "left", no_wrap=True)
    t.add_column("where", overflow="fold")  # a path is only useful whole
    for r in rows:
        t.add_row(r["name"], r["quant"] or "?", human_size(r["size"]), r["architecture"] or "?", r["path"])
    Console(highlight=False, soft_wrap=True).print(t)
