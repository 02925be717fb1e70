"""Split GGUF models, as llama-gguf-split writes them: NAME-00001-of-0000N.gguf … NAME-0000N-of-0000N.gguf.

Every part is a GGUF file of its own with three keys: split.no (u16, 0-based), split.count (u16) and
split.tensors.count (i32, the tensors of all parts together). The first part also carries all of the
model's metadata; the others carry only those keys and their own tensors. A merged file keeps the keys
with split.count 0, and a split into one part has split.count 1: both are single files.

As in llama.cpp (src/llama-model-loader.cpp), a split model is opened by its first part and the others are
found beside it by name (llama_split_prefix / llama_split_path); naming another part is a one-line error
that names the first. Each further part must be there and must belong: its split.no is its place in the
name, its split.count and split.tensors.count are the first part's, none of its tensor names is in another
part, and the parts together hold split.tensors.count tensors.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llamacy.errors import GGUFError

__all__ = [
    "SPLIT_COUNT",
    "SPLIT_NO",
    "SPLIT_TENSORS",
    "GGUFPart",
    "read_other_parts",
    "split_path",
    "split_prefix",
]

# llama.cpp's LLM_KV_SPLIT_* (gguf.constants.Keys.Split), spelled here so that opening a model does not
# import the gguf package.
SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS = "split.tensors.count"
_U16_MAX = 0xFFFF
_I32_MAX = 0x7FFFFFFF


@dataclass(frozen=True, slots=True)
class GGUFPart:
    """One file of a model (a single-file model has one part): what its own header says."""

    path: str
    file_size: int
    data_offset: int  # where its data section starts: the bytes before it are its header
    n_tensors: int


# Tensors are llamacy.gguf.GGUFTensor, by name: this module sits below llamacy.gguf, so it does not import
# it. GGUFFile._read_part: (path, part index) -> (part, version, alignment, metadata, tensors).
Tensors = dict[str, Any]
ReadPart = Callable[[str, int], tuple[GGUFPart, int, int, dict[str, Any], Tensors]]


def split_path(prefix: str, no: int, count: int) -> str:
    """llama_split_path: the path of part `no` (0-based) of `count`."""
    return f"{prefix}-{no + 1:05d}-of-{count:05d}.gguf"


def split_prefix(path: str, no: int, count: int) -> str | None:
    """llama_split_prefix: `path` without the -NNNNN-of-NNNNN.gguf ending that part `no` of `count` has,
    or None when its name does not end so."""
    ending = split_path("", no, count)
    if len(path) > len(ending) and path.endswith(ending):
        return path[: -len(ending)]
    return None


def _int_key(metadata: dict[str, Any], key: str, path: str, top: int) -> int:
    value = metadata.get(key)
    if value is None:
        raise GGUFError(f"{path}: {key} is missing (every part of a split model has it)")
    # A bool is an int to Python but not a count; a float or string here is a broken file.
    if type(value) is not int or not 0 <= value <= top:
        raise GGUFError(f"{path}: {key} must be an integer from 0 to {top}, got {value!r}")
    return value


def _first_part_error(path: str, no: int, count: int) -> GGUFError:
    prefix = split_prefix(path, no, count)
    first = (
        split_path(prefix, 0, count) if prefix is not None else f"the file named …{split_path('', 0, count)}"
    )
    return GGUFError(
        f"{path} is part {no + 1} of a model split into {count} files: load it by its first part, {first}"
    )


def read_other_parts(
    first: GGUFPart, metadata: dict[str, Any], tensors: Tensors, read_part: ReadPart
) -> tuple[tuple[GGUFPart, ...], Tensors]:
    """All parts of the model whose first file `first` was read (its metadata and tensors given), and the
    tensors of all of them; a file that is not split comes back as it is."""
    path = first.path
    count = _int_key(metadata, SPLIT_COUNT, path, _U16_MAX)
    if count <= 1:
        return (first,), tensors
    no = _int_key(metadata, SPLIT_NO, path, _U16_MAX)
    if no >= count:
        raise GGUFError(f"{path}: {SPLIT_NO} is {no}, not below {SPLIT_COUNT} {count}")
    if no != 0:
        raise _first_part_error(path, no, count)
    total = _int_key(metadata, SPLIT_TENSORS, path, _I32_MAX)
    prefix = split_prefix(path, 0, count)
    if prefix is None:
        raise GGUFError(
            f"{path}: part 1 of a model split into {count} files, but its name does not end in "
            f"{split_path('', 0, count)}, so the other parts cannot be found"
        )
    parts = [first]
    joined = dict(tensors)
    for i in range(1, count):
        part_path = split_path(prefix, i, count)
        if not os.path.exists(part_path):  # a dangling link (a cache blob deleted by hand) is missing too
            raise GGUFError(f"{path}: part {i + 1} of {count} is missing: {part_path}")
        part, _version, _alignment, part_metadata, part_tensors = read_part(part_path, i)
        _check_belongs(part_path, part_metadata, i, count, total)
        for name, t in part_tensors.items():
            if name in joined:
                raise GGUFError(
                    f"{part_path}: tensor {name!r} is also in {parts[joined[name].part].path} "
                    "(a part of another model?)"
                )
            joined[name] = t
        parts.append(part)
    if len(joined) != total:
        raise GGUFError(
            f"{path}: {SPLIT_TENSORS} is {total} but the {count} parts hold {len(joined)} tensors "
            "(a part of another model?)"
        )
    return tuple(parts), joined


def _check_belongs(path: str, metadata: dict[str, Any], no: int, count: int, total: int) -> None:
    """Part `no` of `count` must say so, and count the same tensors as the first part."""
    part_count = _int_key(metadata, SPLIT_COUNT, path, _U16_MAX)
    if part_count != count:
        raise GGUFError(
            f"{path}: {SPLIT_COUNT} is {part_count} but the first part's is {count} (a part of another model?)"
        )
    part_no = _int_key(metadata, SPLIT_NO, path, _U16_MAX)
    if part_no != no:
        raise GGUFError(
            f"{path}: {SPLIT_NO} is {part_no} but its name makes it part {no + 1} ({SPLIT_NO} {no})"
        )
    part_total = _int_key(metadata, SPLIT_TENSORS, path, _I32_MAX)
    if part_total != total:
        raise GGUFError(
            f"{path}: {SPLIT_TENSORS} is {part_total} but the first part's is {total} (a part of another model?)"
        )
