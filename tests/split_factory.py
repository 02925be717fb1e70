"""Split a GGUF model into parts as llama-gguf-split does, with the gguf package's own writer.

GGUFWriter's split mode (what convert_hf_to_gguf.py --split-max-tensors uses) writes the layout that
llama.cpp's tools/gguf-split/gguf-split.cpp writes: NAME-00001-of-0000N.gguf …; the first part carries all
of the model's metadata, then split.no (u16), split.count (u16) and split.tensors.count (i32); every
other part only those three keys; each part's tensor data aligned to 32 bytes. The source is read with
gguf.GGUFReader, not with llamacy's reader, so the parts do not depend on the code under test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFReader, GGUFValueType, GGUFWriter, Keys

# Fields GGUFReader reports that are the header, not metadata, and the one key GGUFWriter adds itself.
_NOT_COPIED = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", Keys.General.ARCHITECTURE)


def split_model(src: Path, stem: Path, max_tensors: int, *, empty_first: bool = False) -> list[Path]:
    """Write `src` as parts of at most `max_tensors` tensors each, named STEM-0000i-of-0000N.gguf (the
    first with no tensors at all when empty_first: llama-gguf-split --no-tensor-first-split); return the
    paths in part order."""
    reader = GGUFReader(src)
    w = GGUFWriter(
        stem.with_name(stem.name + ".gguf"),
        _arch(reader),
        split_max_tensors=max_tensors,
        small_first_shard=empty_first,
    )
    _copy(reader, w)
    paths = w.format_shard_names(w.path)
    _write(w)
    return paths


def with_keys(src: Path, dst: Path, keys: dict[str, tuple[Any, GGUFValueType]]) -> Path:
    """A one-file copy of `src` with these metadata keys added at the end (value, type), as a split part's
    keys come: for files that carry split.* keys without being split, or carry them wrong."""
    reader = GGUFReader(src)
    w = GGUFWriter(dst, _arch(reader))
    _copy(reader, w)
    for key, (value, vtype) in keys.items():
        w.add_key_value(key, value, vtype)
    _write(w)
    return dst


def _arch(reader: GGUFReader) -> str:
    assert Keys.General.ALIGNMENT not in reader.fields, "the copies are written with the default alignment"
    return reader.fields[Keys.General.ARCHITECTURE].contents()


def _copy(reader: GGUFReader, w: GGUFWriter) -> None:
    for key, field in reader.fields.items():
        if key in _NOT_COPIED:
            continue
        vtype = GGUFValueType(field.types[0])
        sub = GGUFValueType(field.types[-1]) if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub)
    for t in reader.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)


def _write(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
