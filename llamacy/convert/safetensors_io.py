"""Reading Hugging Face safetensors checkpoints (one file or sharded) as float32, without torch.

F32/F16 tensors are read with the `safetensors` package (its numpy backend, a slice at a time). That
backend cannot represent bfloat16, the dtype of most checkpoints: those are read from the file's own header
offsets, as raw uint16 from a memory map, and widened to float32 by a shift (bf16 is the top half of an IEEE
single). The header is parsed here for every file anyway, to check the dtypes and sizes up front and to
say which file is broken.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llamacy.errors import UnsupportedModelError, UsageError

INDEX_FILE = "model.safetensors.index.json"
_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F64": np.dtype("<f8")}


@dataclass(frozen=True)
class CheckpointTensor:
    name: str
    dtype: str  # safetensors dtype name: F32, F16, BF16, F64
    shape: tuple[int, ...]
    file: Path
    offset: int  # absolute byte offset of the data in `file`

    @property
    def n_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _DTYPES[self.dtype].itemsize


class Checkpoint:
    """The tensors of a checkpoint directory, by their Hugging Face names."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.tensors: dict[str, CheckpointTensor] = {}
        self._maps: dict[Path, tuple[mmap.mmap, np.ndarray]] = {}
        self._handles: dict[Path, Any] = {}
        for shard in _shard_files(directory):
            for t in _read_header(shard):
                if t.name in self.tensors:
                    raise UsageError(f"{directory}: tensor {t.name!r} appears in two shards")
                self.tensors[t.name] = t
        index = directory / INDEX_FILE
        if index.is_file():
            listed = set(_weight_map(index))
            missing = sorted(listed - set(self.tensors))
            if missing:
                raise UsageError(
                    f"{index}: {len(missing)} listed tensors are in no shard (first: {missing[0]!r})"
                )

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def read(self, name: str, rows: slice | None = None) -> np.ndarray:
        """Tensor `name` (or a range of its first axis) as float32; a view where no conversion is needed."""
        t = self.tensors[name]
        if t.dtype != "BF16":
            part = self._handle(t.file).get_slice(name)
            data = part[rows] if rows is not None else part[:]
            return np.asarray(data).astype(np.float32, copy=False).reshape(_sliced(t.shape, rows))
        raw = self._bf16_view(t)
        if rows is not None:
            raw = raw[rows]
        return (raw.astype(np.uint32) << 16).view(np.float32)

    def _handle(self, file: Path) -> Any:
        if file not in self._handles:
            from safetensors import safe_open

            self._handles[file] = safe_open(file, framework="numpy")
        return self._handles[file]

    def _bf16_view(self, t: CheckpointTensor) -> np.ndarray:
        if t.file not in self._maps:
            with open(t.file, "rb") as fh:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[t.file] = (mm, np.frombuffer(mm, dtype=np.uint8))
        u8 = self._maps[t.file][1]
        dtype = _DTYPES[t.dtype]
        return u8[t.offset : t.offset + t.n_bytes].view(dtype).reshape(t.shape)

    def close(self) -> None:
        self._handles.clear()
        maps, self._maps = self._maps, {}
        for mm, _ in maps.values():
            with contextlib.suppress(BufferError):  # a view handed out is alive; the mapping goes with it
                mm.close()


def _sliced(shape: tuple[int, ...], rows: slice | None) -> tuple[int, ...]:
    if rows is None or not shape:
        return shape
    return (len(range(*rows.indices(shape[0]))), *shape[1:])


def _shard_files(directory: Path) -> list[Path]:
    index = directory / INDEX_FILE
    if index.is_file():
        names = sorted(set(_weight_map(index).values()))
        files = [directory / n for n in names]
        for f in files:
            if not f.is_file():
                raise UsageError(f"{directory}: shard {f.name} listed in {INDEX_FILE} is missing")
        return files
    files = sorted(directory.glob("model*.safetensors"))
    if not files:
        others = sorted(p.name for p in directory.glob("*.bin"))
        hint = f" (found {others[0]}: PyTorch pickles are not supported)" if others else ""
        raise UsageError(f"{directory}: no model*.safetensors weights{hint}")
    return files


def _weight_map(index: Path) -> dict[str, str]:
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{index}: not a valid safetensors index ({e})") from None
    return {str(k): str(v) for k, v in weight_map.items()}


def _read_header(path: Path) -> list[CheckpointTensor]:
    """The tensor table of one .safetensors file: u64 header length, JSON header, then the data."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise UsageError(f"{path}: not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100_000_000:
            raise UsageError(f"{path}: not a safetensors file (header length {n})")
        try:
            header = json.loads(fh.read(n))
        except ValueError as e:
            raise UsageError(f"{path}: not a safetensors file ({e})") from None
    data_start = 8 + n
    out = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info.get("dtype")
        shape = tuple(int(d) for d in info.get("shape", ()))
        start, stop = (int(v) for v in info.get("data_offsets", (0, 0)))
        if dtype not in _DTYPES:
            raise UnsupportedModelError(
                f"{path.name}: tensor {name!r} is {dtype}; only F32, F16 and BF16 checkpoints can be converted"
            )
        t = CheckpointTensor(name, dtype, shape, path, data_start + start)
        if stop - start != t.n_bytes or data_start + stop > size:
            raise UsageError(f"{path}: tensor {name!r} has a bad size or offset (truncated file?)")
        out.append(t)
    return out
