"""One sequence's memory in a file: save it, load it back (prompt caches, chat sessions, server slots).

Layout (all integers little-endian):

    magic     8 bytes  b"LLMCYMEM"
    version   u32      FORMAT_VERSION
    head_len  u32      length of the header
    header    JSON     {"model", "arch", "kv_type", "n_tokens", "high", "layers": [...], "extra"}
    payload            the token ids (int32 × n_tokens), then per layer that keeps rows of its own, its K rows
                       then its V rows, each [n_head_kv, count, row_bytes] in position order
    checksum  32 bytes SHA-256 of everything before it

"model" is the model's identity (model_identity: a hash of the GGUF header, that is its metadata and its tensor
table: names, types, shapes and offsets, never the weights; of a split model, every part's header). Each layer's
entry is {"kind", "first", "count", "n_head_kv", "row_bytes"}: it holds positions first .. first + count - 1 (a
full layer 0 .. n_tokens - 1; a sliding-window ring the positions still in its ring, each row once; a shared or
attention-free layer none). A recurrent layer's entry adds "floats" and "order" (STATE_ORDER: how the mixer lays
out its state; files from before it took this order have none and are refused): its payload is its state after the
n_tokens, then its state after each length in the header's "copies" (float32 × floats each): the snapshots
and checkpoints the memory kept, so that a prompt parting from the saved one near its end can go back.

A file is written to a temporary name in its directory and renamed, so a reader sees the old file or the new
one. Loading reads and checks the whole file (magic, version, checksum, model, architecture, KV type, layer
shapes, and that every position the destination's layers will claim to hold is in the file) before it writes
a row: a refused file leaves the sequence as it was. Any refusal is a MemoryFileError with one line.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from llamacy.errors import LlamacyError

if TYPE_CHECKING:
    from llamacy.model.memory import Memory

MAGIC = b"LLMCYMEM"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")
_SUM = 32
MAX_HEADER = 16 << 20
# The recurrent mixers' state order (kernels/scan.h): each head's state column-major for its outputs. Files
# written before it (2026-12-06) held the rows along the key dimension, which this llamacy would misread.
STATE_ORDER = "columns"


class MemoryFileError(LlamacyError):
    """A memory file that cannot be loaded (another model, KV type or version; truncated; corrupt)."""


@dataclass
class MemoryFile:
    """What a loaded (or inspected) file holds besides the rows."""

    tokens: list[int]
    high: int
    extra: dict[str, Any] = field(default_factory=dict)


_identities: dict[tuple[tuple[str, int, int], ...], str] = {}


def model_identity(gguf: Any) -> str:
    """A hash of a GGUF model's header (magic, metadata, tensor table), not of its weights: cheap, and two
    files that differ in any metadata item or tensor name, type, shape or offset differ in it. A split model
    hashes every part's header, in order (one part: the same hash as before splits were read)."""
    stats = [(p, os.stat(p.path)) for p in gguf.parts]
    key = tuple((os.path.realpath(p.path), st.st_size, st.st_mtime_ns) for p, st in stats)
    if key not in _identities:
        h = hashlib.sha256()
        for p, _ in stats:
            with open(p.path, "rb") as f:
                h.update(f.read(p.data_offset))
        _identities[key] = h.hexdigest()
    return _identities[key]


def _held(lm: Any, n: int, high: int) -> tuple[int, int]:
    """Positions [first, n) that a layer of rows holds for a sequence of n tokens whose high mark is high."""
    first = max(0, high - lm.ring) if lm.ring else 0
    return min(first, n), n


def _slots(lm: Any, first: int, n: int) -> np.ndarray:
    pos = np.arange(first, n)
    return pos % lm.ring if lm.ring else pos


def save_memory(
    path: str | os.PathLike,
    memory: Memory,
    seq: int,
    model: str,
    arch: str,
    n_tokens: int | None = None,
    extra: dict[str, Any] | None = None,
) -> int:
    """Write sequence seq's first n_tokens (default: all) with their rows; return the file's size. `extra`:
    JSON that the caller wants back (a chat's messages)."""
    tokens = memory.tokens[seq]
    n = len(tokens) if n_tokens is None else n_tokens
    if not 0 <= n <= len(tokens):
        raise MemoryFileError(f"cannot save {n} tokens of a sequence of {len(tokens)}")
    if n < len(tokens) and n < memory.lowest_cut(seq):
        raise MemoryFileError(
            f"a sliding-window layer no longer holds the rows of the first {n} tokens; nothing saved"
        )
    states = memory.state_at(seq, n) if memory.recurrent else []
    if states is None:
        raise MemoryFileError(f"no copy of the recurrent state after {n} tokens is kept; nothing saved")
    # The earlier copies too (snapshots, checkpoints), so that a prompt that parts from the saved one a
    # few tokens before its end can still go back instead of starting over.
    copies = [m for m in memory.copy_lengths(seq) if m < n] if memory.recurrent else []
    by_layer = [[st, *cs] for st, *cs in zip(states, *(memory.state_at(seq, m) for m in copies), strict=True)]
    states = iter(by_layer)
    high = memory.high[seq]
    layers = []
    blocks: list[np.ndarray] = [np.asarray(tokens[:n], dtype="<i4")]
    for lm in memory.layers:
        if lm.state is not None:
            layers.append({"kind": lm.kind, "first": 0, "count": 0, "n_head_kv": 0, "row_bytes": 0,
                           "floats": lm.state.shape[2], "order": STATE_ORDER})  # fmt: skip
            blocks.extend(np.asarray(st, dtype="<f4") for st in next(states))
            continue
        if lm.k is None or lm.shared_from >= 0:
            layers.append({"kind": lm.kind, "first": 0, "count": 0, "n_head_kv": 0, "row_bytes": 0})
            continue
        first, end = _held(lm, n, high)
        idx = _slots(lm, first, end)
        layers.append(
            {"kind": lm.kind, "first": first, "count": end - first, "n_head_kv": lm.n_head_kv,
             "row_bytes": lm.row_bytes}
        )  # fmt: skip
        blocks.append(lm.k[seq][:, idx, :])
        blocks.append(lm.v[seq][:, idx, :])
    header = {
        "model": model,
        "arch": arch,
        "kv_type": memory.kv_type,
        "n_tokens": n,
        "high": high,
        "layers": layers,
        "copies": copies,
        "extra": extra or {},
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    path = Path(path)
    try:
        return _write(path, head, blocks)
    except OSError as e:
        raise MemoryFileError(f"cannot write memory file {path}: {e.strerror}") from None


def _write(path: Path, head: bytes, blocks: list[np.ndarray]) -> int:
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            for part in (_PREFIX.pack(MAGIC, FORMAT_VERSION, len(head)), head, *blocks):
                data = (
                    memoryview(np.ascontiguousarray(part)).cast("B") if isinstance(part, np.ndarray) else part
                )
                digest.update(data)
                f.write(data)
            f.write(digest.digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path.stat().st_size


def _read(path: str | os.PathLike) -> tuple[dict[str, Any], memoryview]:
    """The header and the payload of a whole, checked file."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            data = f.read()
    except OSError as e:
        raise MemoryFileError(f"cannot read memory file {name}: {e.strerror}") from None
    if len(data) < _PREFIX.size + _SUM:
        raise MemoryFileError(f"{name}: not a llamacy memory file (too short)")
    magic, version, head_len = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise MemoryFileError(f"{name}: not a llamacy memory file")
    if version != FORMAT_VERSION:
        raise MemoryFileError(
            f"{name}: memory file format version {version}; this llamacy reads {FORMAT_VERSION}"
        )
    if head_len > MAX_HEADER or _PREFIX.size + head_len + _SUM > len(data):
        raise MemoryFileError(f"{name}: truncated memory file")
    body = memoryview(data)[: len(data) - _SUM]
    if hashlib.sha256(body).digest() != data[-_SUM:]:
        raise MemoryFileError(f"{name}: corrupt or truncated memory file (checksum mismatch)")
    try:
        header = json.loads(bytes(body[_PREFIX.size : _PREFIX.size + head_len]))
        if not isinstance(header, dict):
            raise ValueError
    except ValueError:
        raise MemoryFileError(f"{name}: corrupt memory file header") from None
    return header, body[_PREFIX.size + head_len :]


def load_memory(path: str | os.PathLike, memory: Memory, seq: int, model: str, arch: str) -> MemoryFile:
    """Replace sequence seq's memory with a file's; refuse (MemoryFileError, nothing changed) a file of
    another model, architecture, KV type or layer layout, or one that does not fit."""
    name = os.fspath(path)
    header, payload = _read(path)
    try:
        return _apply(name, header, payload, memory, seq, model, arch)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise MemoryFileError(f"{name}: corrupt memory file header ({type(e).__name__})") from None


def _apply(
    name: str, header: dict, payload: memoryview, memory: Memory, seq: int, model: str, arch: str
) -> MemoryFile:
    if header["model"] != model or header["arch"] != arch:
        raise MemoryFileError(f"{name}: saved from another model ({header['arch']}, {header['model'][:12]})")
    if header["kv_type"] != memory.kv_type:
        raise MemoryFileError(f"{name}: saved with --kv-type {header['kv_type']}, not {memory.kv_type}")
    n, high = int(header["n_tokens"]), int(header["high"])
    if n < 0:
        raise MemoryFileError(f"{name}: corrupt memory file header (n_tokens)")
    if n > memory.n_ctx:
        raise MemoryFileError(f"{name}: holds {n} tokens, more than the context of {memory.n_ctx}")
    entries = header["layers"]
    if len(entries) != len(memory.layers) or not n <= high:
        raise MemoryFileError(f"{name}: its layers do not match this model's memory")
    off = 4 * n
    if off > len(payload):
        raise MemoryFileError(f"{name}: truncated memory file")
    tokens = np.frombuffer(payload[:off], dtype="<i4")
    if n and (tokens.min() < 0 or tokens.max() >= 1 << 31):
        raise MemoryFileError(f"{name}: corrupt token ids")
    plan = []
    states = []
    copies = [int(m) for m in header.get("copies", [])]
    if any(not 0 < m < n for m in copies) or len(set(copies)) != len(copies):
        raise MemoryFileError(f"{name}: corrupt memory file header (copies)")
    for il, (lm, e) in enumerate(zip(memory.layers, entries, strict=True)):
        if (e["kind"] == "recurrent") != (lm.state is not None):
            raise MemoryFileError(f"{name}: layer {il} does not match this model's memory")
        if lm.state is not None:
            if e.get("order") != STATE_ORDER:
                raise MemoryFileError(
                    f"{name}: layer {il}'s recurrent state was saved by an earlier llamacy in another order; "
                    "delete the file to have it rebuilt"
                )
            floats = int(e["floats"])
            if floats != lm.state.shape[2]:
                raise MemoryFileError(f"{name}: layer {il}'s state does not match this model's")
            size = 4 * floats * (1 + len(copies))
            if off + size > len(payload):
                raise MemoryFileError(f"{name}: truncated memory file")
            states.append((lm, np.frombuffer(payload[off : off + size], dtype="<f4").reshape(-1, floats)))
            off += size
            continue
        own = lm.k is not None and lm.shared_from < 0
        if not own:
            if e["count"]:
                raise MemoryFileError(f"{name}: layer {il} holds rows where this model's keeps none")
            continue
        first, count = int(e["first"]), int(e["count"])
        if count < 0:
            raise MemoryFileError(f"{name}: corrupt memory file header (layer {il})")
        if (
            (e["n_head_kv"], e["row_bytes"]) != (lm.n_head_kv, lm.row_bytes)
            or first < 0
            or first + count != n
        ):
            raise MemoryFileError(f"{name}: layer {il} does not match this model's memory")
        want, _ = _held(lm, n, high)  # what this layer will claim to hold (memory.lowest_cut)
        if want < first:
            raise MemoryFileError(
                f"{name}: layer {il} holds positions {first}..{n - 1}, this memory needs {want}..{n - 1} "
                "(load with the --ctx-size and batch size it was saved with)"
            )
        size = lm.n_head_kv * count * lm.row_bytes
        if off + 2 * size > len(payload):
            raise MemoryFileError(f"{name}: truncated memory file")
        rows = [
            np.frombuffer(payload[o : o + size], dtype=np.uint8).reshape(lm.n_head_kv, count, lm.row_bytes)
            for o in (off, off + size)
        ]
        off += 2 * size
        plan.append((lm, rows, want - first, _slots(lm, want, n)))
    if off != len(payload):
        raise MemoryFileError(f"{name}: memory file longer than its header says")
    # Everything is checked: now write.
    memory.clear(seq)
    for lm, (k, v), skip, idx in plan:
        for dst, src in ((lm.k, k), (lm.v, v)):
            dst[seq][:, idx, :] = src[:, skip:, :]
            if lm.ring:  # every row is stored twice (memory.py)
                dst[seq][:, idx + lm.ring, :] = src[:, skip:, :]
    memory.tokens[seq] = [int(t) for t in tokens]
    if states:
        memory.restore_states(seq, copies, [st for _, st in states])
    memory.high[seq] = high if any(lm.ring for lm in memory.layers) else n
    return MemoryFile(memory.tokens[seq][:], memory.high[seq], dict(header.get("extra") or {}))


def read_memory_header(path: str | os.PathLike) -> dict[str, Any]:
    """A checked file's header (for listings)."""
    return _read(path)[0]
