"""What a served model is, in the terms Ollama's /api/tags, /api/show and /api/ps use: its file, family,
size, quantization, metadata and default parameters. Functions of the model file and the server's
settings; a model's card is computed once and cached (its digest reads the whole file)."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamacy.bench import FILE_TYPES
from llamacy.catalog import resolve_model
from llamacy.ggml_types import type_name
from llamacy.gguf import GGUFFile
from llamacy.sampling import SamplingParams
from llamacy.server.models import ModelSpec, ServedModel

_SHORT_LIST = 5  # Ollama blanks metadata arrays longer than this unless the request says verbose
_DEFAULT_TAG = "latest"


def rfc3339(ts: float | None = None) -> str:
    """A UTC timestamp as Ollama writes them: 2026-12-01T18:40:00.123456Z."""
    when = (
        dt.datetime.fromtimestamp(ts, dt.timezone.utc) if ts is not None else dt.datetime.now(dt.timezone.utc)
    )
    return when.isoformat().replace("+00:00", "Z")


def tagged(name: str) -> str:
    """Ollama's model names carry a tag; a name without one means `:latest`."""
    return name if ":" in name else f"{name}:{_DEFAULT_TAG}"


def untagged(name: str) -> str:
    """The registry's name for an Ollama model name: `x:latest` is `x` (other tags are kept)."""
    return name.removesuffix(f":{_DEFAULT_TAG}")


def human_number(n: int) -> str:
    """Parameter counts the way Ollama prints them: 8.0B, 134.52M, 22K."""
    for scale, unit, digits in ((1e9, "B", 1), (1e6, "M", 2), (1e3, "K", 0)):
        if n >= scale:
            x = n / scale
            return f"{x:.0f}{unit}" if x == int(x) else f"{x:.{digits}f}{unit}"
    return str(n)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays and scalars from the GGUF reader
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


@dataclass(frozen=True)
class ModelCard:
    """What Ollama lists of a model file (kept small: cards of unloaded models stay cached)."""

    name: str  # with its tag
    path: Path
    file_size: int  # a split model's: all parts together
    modified_at: str
    digest: str  # sha256 of the file (a split model's parts one after another), hex
    arch: str
    n_params: int
    weights_bytes: int
    quantization: str

    def details(self) -> dict[str, Any]:
        return {
            "parent_model": "",
            "format": "gguf",
            "family": self.arch,
            "families": [self.arch],
            "parameter_size": human_number(self.n_params),
            "quantization_level": self.quantization,
        }


def model_info(gguf: Any, verbose: bool = False) -> dict[str, Any]:
    """The file's metadata, as Ollama's /api/show gives it: long arrays (the vocabulary) only if verbose."""
    info: dict[str, Any] = {}
    for key, value in gguf.metadata.items():
        v = _jsonable(value)
        info[key] = [] if isinstance(v, list) and len(v) > _SHORT_LIST and not verbose else v
    info.setdefault("general.parameter_count", int(sum(t.n_elements for t in gguf.tensors.values())))
    return info


def _quantization(gguf: Any) -> str:
    ftype = gguf.metadata.get("general.file_type")
    if ftype in FILE_TYPES:
        return FILE_TYPES[ftype]
    # No file type recorded: name the type holding most of the weights.
    by_bytes: Counter[str] = Counter()
    for t in gguf.tensors.values():
        by_bytes[type_name(t.type)] += t.n_bytes
    return by_bytes.most_common(1)[0][0] if by_bytes else "unknown"


def _sha256(paths: list[Path]) -> str:
    """Of a single file, its sha256; of a split model, that of its parts' bytes one after another."""
    h = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


_cards: dict[tuple[str, str], ModelCard] = {}
_cards_lock = threading.Lock()


def card(name: str, gguf: Any) -> ModelCard:
    """The card of model `name` read from its GGUF file (blocking the first time: it hashes the file;
    call it off the event loop)."""
    key = (name, str(gguf.path))
    with _cards_lock:
        found = _cards.get(key)
    if found is not None:
        return found
    path = Path(gguf.path)
    made = ModelCard(
        name=tagged(name),
        path=path,
        file_size=gguf.file_size,
        modified_at=rfc3339(max(os.stat(p.path).st_mtime for p in gguf.parts)),
        digest=_sha256([Path(p.path) for p in gguf.parts]),
        arch=str(gguf.metadata.get("general.architecture", "unknown")),
        n_params=int(sum(t.n_elements for t in gguf.tensors.values())),
        weights_bytes=int(sum(t.n_bytes for t in gguf.tensors.values())),
        quantization=_quantization(gguf),
    )
    with _cards_lock:
        _cards[key] = made
    return made


def card_of(spec: ModelSpec, served: ServedModel | None) -> ModelCard:
    """A served model's card from its loaded file; an unloaded one's from its file, without loading it."""
    if served is not None:
        return card(spec.name, served.scheduler.model.gguf)
    path = resolve_model(spec.source)
    with _cards_lock:
        found = _cards.get((spec.name, str(path)))
    return found if found is not None else card(spec.name, GGUFFile(path))


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def parameters(served: ServedModel) -> list[tuple[str, str]]:
    """The model's effective defaults as Modelfile PARAMETER lines: the engine's sampling defaults, the
    server's context size, and the chat template's stop strings."""
    d = SamplingParams()
    out = [
        ("num_ctx", str(served.scheduler.n_ctx)),
        ("temperature", f"{d.temperature:g}"),
        ("top_k", str(d.top_k)),
        ("top_p", f"{d.top_p:g}"),
        ("min_p", f"{d.min_p:g}"),
        ("repeat_penalty", f"{d.repeat_penalty:g}"),
        ("repeat_last_n", str(d.repeat_last_n)),
    ]
    if served.template is not None:
        out += [("stop", _quote(s)) for s in served.template.stop_strings]
    return out


def show(served: ServedModel, verbose: bool = False) -> dict[str, Any]:
    """Ollama's /api/show answer."""
    gguf = served.scheduler.model.gguf
    c = card(served.name, gguf)
    params = parameters(served)
    template = served.template.source if served.template is not None else ""
    modelfile = "\n".join(
        [
            f"# Modelfile of {c.name}, as served by llamacy (its TEMPLATE is Jinja, as stored in the model)",
            f"FROM {c.path}",
            f'TEMPLATE """{template}"""',
            *(f"PARAMETER {k} {v}" for k, v in params),
        ]
    )
    license_ = gguf.metadata.get("general.license")
    return {
        **({"license": str(license_)} if license_ else {}),
        "modelfile": modelfile,
        "parameters": "\n".join(f"{k:<30} {v}" for k, v in params),
        "template": template,
        "details": c.details(),
        "model_info": model_info(gguf, verbose),
        "capabilities": ["completion"],
        "modified_at": c.modified_at,
    }


def tag_entry(c: ModelCard) -> dict[str, Any]:
    """One model of Ollama's /api/tags."""
    return {
        "name": c.name,
        "model": c.name,
        "modified_at": c.modified_at,
        "size": c.file_size,
        "digest": c.digest,
        "details": c.details(),
    }


# A model kept loaded for good: Ollama's keep_alive=-1 shows as now + the largest Go duration.
_FOREVER = dt.timedelta(microseconds=(2**63 - 1) // 1000)


def ps_entry(served: ServedModel, idle_unload_s: float | None) -> dict[str, Any]:
    """One model of Ollama's /api/ps, in CPU memory. It expires when the server unloads idle models
    (--idle-unload): that long after its last use; never otherwise."""
    c = card(served.name, served.scheduler.model.gguf)
    sched = served.scheduler
    if idle_unload_s:
        idle = 0.0 if served.busy else time.monotonic() - served.last_active
        left = dt.timedelta(seconds=max(0.0, idle_unload_s - idle))
    else:
        left = _FOREVER
    return {
        "name": c.name,
        "model": c.name,
        "size": c.weights_bytes + sched.model.kv.nbytes,
        "digest": c.digest,
        "details": c.details(),
        "expires_at": (dt.datetime.now(dt.timezone.utc) + left).isoformat().replace("+00:00", "Z"),
        "size_vram": 0,
        "context_length": sched.n_ctx,
    }
