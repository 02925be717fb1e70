"""Models from a Hugging Face hub: `OWNER/REPO[:QUANT]` names, pulled into huggingface_hub's cache.

names.py (which file a name means), download.py (one file: resumed, verified), pull.py (a whole model),
store.py (what the cache holds: list, find, remove). Everything after a pull works without the network.
"""

from __future__ import annotations

import sys
from pathlib import Path

from llamacy.errors import UsageError
from llamacy.hub.names import HubRef, parse_ref
from llamacy.hub.store import PulledModel, find_pulled, pulled_models

__all__ = [
    "HubRef",
    "PulledModel",
    "find_pulled",
    "model_path",
    "parse_ref",
    "pull",
    "pulled_models",
    "resolve",
]


def pull(ref: HubRef, *, progress: bool = False) -> PulledModel:
    from llamacy.hub.pull import pull as _pull

    return _pull(ref, progress=progress)


def model_path(model: PulledModel) -> Path:
    """The file to load: the model's file, or a split model's first part (paths are in part order; the
    loader finds the other parts beside it, in the same snapshot, by name)."""
    return model.paths[0]


def resolve(ref: HubRef, allow_pull: bool | None = None) -> Path:
    """The local file for `ref`. A name not pulled yet is pulled on a terminal (allow_pull=None: when
    stdin and stdout are both terminals); in a pipe that is an error, not a surprise download."""
    found = find_pulled(ref)
    if found is None:
        if allow_pull is None:
            allow_pull = sys.stdin.isatty() and sys.stdout.isatty()
        if not allow_pull:
            raise UsageError(f"{ref} is not pulled yet; run `llamacy pull {ref}` first")
        found = pull(ref, progress=sys.stderr.isatty())
    return model_path(found)
