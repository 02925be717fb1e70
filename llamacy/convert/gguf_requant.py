"""A GGUF file as a conversion source: requantizing to another type.

Each tensor is dequantized to float32 by our kernels (rows in parallel) and quantized again; a tensor whose
type does not change is copied byte for byte (requantizing a K-quant to itself would refit its scales and
lose precision for nothing). Metadata is carried over with each key's original value type, except the keys
that describe the file rather than the model: general.file_type and general.quantization_version are
rewritten, general.alignment and the split.* keys are dropped (the output is one file, default alignment).
A split model is read through GGUFFile like any other: its first part's metadata, every part's tensors.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_VERSION, GGUFValueType, GGUFWriter

from llamacy.convert.mixtures import ModelFacts
from llamacy.convert.source import Source, SourceTensor
from llamacy.errors import UnsupportedModelError
from llamacy.ggml_types import COMPUTE_TYPES
from llamacy.gguf import GGUFFile, GGUFTensor

_DROPPED_KEYS = (
    "general.architecture",
    "general.alignment",
    "general.file_type",
    "general.quantization_version",
)
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class GGUFSource(Source):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = GGUFFile(path)
        try:
            md = self.file.metadata  # of a split model, the first part's: the others carry only split.*
            arch = str(md.get("general.architecture", ""))
            n_head = _count(md.get(f"{arch}.attention.head_count"), 1)
            self.facts = ModelFacts(
                arch=arch,
                n_layer=_count(md.get(f"{arch}.block_count"), 0),
                n_head=n_head,
                n_head_kv=_count(md.get(f"{arch}.attention.head_count_kv"), n_head),
                n_expert=_count(md.get(f"{arch}.expert_count"), 0),
            )
            self.tensors = [self._tensor(t) for t in self.file.tensors.values()]
            self._types = _kv_types(path)
        except BaseException:
            self.file.close()
            raise

    def _tensor(self, t: GGUFTensor) -> SourceTensor:
        shape = t.shape

        def read_rows(start: int, stop: int, t: GGUFTensor = t) -> np.ndarray:
            if t.type not in COMPUTE_TYPES:
                raise UnsupportedModelError(f"{self.path.name}: cannot dequantize {t.name} ({t.type_name})")
            from llamacy.kernels.quantize import dequantize

            return dequantize(t.type, t.rows()[start:stop], (stop - start, shape[-1]))

        return SourceTensor(t.name, shape, t.type, read_rows, raw=lambda t=t: t.data)

    @property
    def size_on_disk(self) -> int:
        return self.file.file_size

    def keep_type(self, tensor: SourceTensor) -> int:
        return tensor.type

    def add_metadata(self, writer: GGUFWriter, file_type: int) -> None:
        for key, value in self.file.metadata.items():
            if key in _DROPPED_KEYS or key.startswith("split."):
                continue
            vtype, sub_type = self._types[key]
            # Values go back as our reader returns them: numeric arrays as numpy views, strings as str.
            sub = None if sub_type is None else GGUFValueType(sub_type)
            writer.add_key_value(key, value, GGUFValueType(vtype), sub)
        writer.add_file_type(file_type)
        writer.add_quantization_version(GGML_QUANT_VERSION)

    def close(self) -> None:
        self.file.close()


def _count(value: object, default: int) -> int:
    """A count from metadata: an integer, or per-layer counts (some architectures), of which the largest."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, np.ndarray) and value.size and value.dtype.kind in "iu":
        return int(value.max())
    return default


def _kv_types(path: Path) -> dict[str, tuple[int, int | None]]:
    """Each metadata key's value type (and array element type): our reader keeps values, not types, and a
    copy must not turn a u32 into an i32. The file was validated by GGUFFile, so this walk trusts it."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        (n_kv,) = struct.unpack_from("<Q", mm, 16)
        pos = 24
        out: dict[str, tuple[int, int | None]] = {}
        for _ in range(n_kv):
            (n,) = struct.unpack_from("<Q", mm, pos)
            key = mm[pos + 8 : pos + 8 + n].decode("utf-8")
            pos += 8 + n
            (vtype,) = struct.unpack_from("<I", mm, pos)
            pos += 4
            sub = None
            if vtype == GGUFValueType.ARRAY:
                (sub,) = struct.unpack_from("<I", mm, pos)
            pos = _skip_value(mm, pos, vtype)
            out[key] = (vtype, sub)
        return out


def _skip_value(mm: mmap.mmap, pos: int, vtype: int) -> int:
    if vtype in _SCALAR_SIZES:
        return pos + _SCALAR_SIZES[vtype]
    if vtype == GGUFValueType.STRING:
        (n,) = struct.unpack_from("<Q", mm, pos)
        return pos + 8 + n
    if vtype == GGUFValueType.ARRAY:
        sub, count = struct.unpack_from("<IQ", mm, pos)
        pos += 12
        if sub in _SCALAR_SIZES:
            return pos + count * _SCALAR_SIZES[sub]
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if sub == GGUFValueType.STRING:
                pos += 8 + unpack(mm, pos)[0]
            else:
                pos = _skip_value(mm, pos, sub)
        return pos
    raise UnsupportedModelError(f"unknown GGUF value type {vtype}")
