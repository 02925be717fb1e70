"""The conversion itself: open the source, choose each tensor's type, write metadata then tensors.

Tensors are processed one at a time and, for large ones, in row chunks, so memory stays at about one
tensor's output plus one chunk of float32 rows, whatever the model's size.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from llamacy.convert.mixtures import Target, TensorSpec, choose_types, target
from llamacy.convert.source import Source, SourceTensor
from llamacy.convert.writer import OutputFile
from llamacy.errors import UnsupportedModelError, UsageError
from llamacy.ggml_types import COMPUTE_TYPES, type_name

CHUNK_VALUES = 1 << 23  # float32 values per chunk: 32 MB

# progress(tensor name, its output type, values done so far in the whole model, total values)
Progress = Callable[[str, int, int, int], None]


@dataclass
class Summary:
    source: Path
    output: Path
    target: str
    n_tensors: int
    bytes_in: int  # the source's files (GGUF file, or safetensors shards)
    bytes_out: int  # the output file
    seconds: float
    types: Counter[str] = field(default_factory=Counter)  # output type name -> tensor count


def open_source(path: Path) -> Source:
    """A Hugging Face directory or a GGUF file."""
    if not path.exists():
        raise UsageError(f"no such file or directory: {path}")
    if path.is_dir():
        from llamacy.convert.hf import HFSource

        return HFSource(path)
    from llamacy.convert.gguf_requant import GGUFSource

    return GGUFSource(path)


def convert(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    qtype: str,
    *,
    pure: bool = False,
    threads: int | None = None,
    progress: Progress | None = None,
) -> Summary:
    """Convert `src` (Hugging Face directory or GGUF file) to a GGUF file `out` of type `qtype`."""
    t0 = time.perf_counter()
    try:
        tgt = target(qtype)
    except KeyError as e:
        raise UsageError(str(e.args[0])) from None
    src_path, out_path = Path(src), Path(out)
    _check_output(src_path, out_path)
    with open_source(src_path) as source:
        types = _plan(source, tgt, pure)
        _write(source, types, int(tgt.file_type), out_path, threads or 0, progress)
        bytes_in = source.size_on_disk
    return Summary(
        source=src_path,
        output=out_path,
        target=tgt.name,
        n_tensors=len(types),
        bytes_in=bytes_in,
        bytes_out=out_path.stat().st_size,
        seconds=time.perf_counter() - t0,
        types=Counter(type_name(ty) for ty in types),
    )


def _plan(source: Source, tgt: Target, pure: bool) -> list[int]:
    """Each tensor's output type, checked against what we can read and write before anything is written."""
    from llamacy.kernels.quantize import QUANTIZE_TYPES

    specs = [TensorSpec(t.name, t.shape, source.keep_type(t)) for t in source.tensors]
    types = choose_types(specs, tgt, source.facts, pure)
    for t, ty in zip(source.tensors, types, strict=True):
        if ty == t.type and t.raw is not None:
            continue  # copied as stored
        if ty not in QUANTIZE_TYPES:
            raise UnsupportedModelError(f"{t.name}: cannot write type {type_name(ty)}")
        if t.type not in COMPUTE_TYPES:
            raise UnsupportedModelError(f"{t.name}: cannot read type {type_name(t.type)} to requantize it")
    return types


def _write(
    source: Source, types: list[int], file_type: int, out: Path, threads: int, progress: Progress | None
) -> None:
    """Metadata, tensor table, then the tensors one by one, into a temporary file renamed to `out`."""
    total = sum(t.n_elements for t in source.tensors)
    done = 0
    with OutputFile(out, source.facts.arch) as f:
        w = f.writer
        source.add_metadata(w, file_type)
        for t, ty in zip(source.tensors, types, strict=True):
            shape, n_bytes = _byte_shape(t, ty), t.n_rows * _row_bytes(t, ty)
            w.add_tensor_info(t.name, shape, np.dtype(np.uint8), n_bytes, raw_dtype=GGMLQuantizationType(ty))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t, ty in zip(source.tensors, types, strict=True):
            w.write_tensor_data(_convert_tensor(t, ty, threads, progress, done, total))
            done += t.n_elements
            if progress is not None:
                progress(t.name, ty, done, total)
        f.commit()


def _check_output(src: Path, out: Path) -> None:
    if out.is_dir():
        raise UsageError(f"{out} is a directory; give the output file's name")
    if not out.parent.is_dir():
        raise UsageError(f"output directory {out.parent} does not exist")
    if out.exists() and src.exists() and out.resolve() == src.resolve():
        raise UsageError("the output file is the source file; choose another name")
    # A split model's other parts are sources too (gguf_split.py names them after the first).
    m = re.search(r"-00001-of-(\d{5})\.gguf$", src.name)
    if m and out.exists():
        from llamacy.gguf_split import split_path, split_prefix

        count = int(m.group(1))
        prefix = split_prefix(str(src), 0, count)
        parts = {Path(split_path(prefix, i, count)).resolve() for i in range(count)} if prefix else set()
        if out.resolve() in parts:
            raise UsageError("the output file is a part of the split source model; choose another name")


def _row_bytes(t: SourceTensor, ty: int) -> int:
    from llamacy.kernels.quantize import row_bytes

    try:
        return row_bytes(ty, t.shape[-1])
    except ValueError:
        raise UsageError(
            f"{t.name}: rows of {t.shape[-1]} values do not fit {type_name(ty)} blocks"
        ) from None


def _byte_shape(t: SourceTensor, ty: int) -> tuple[int, ...]:
    return (*t.shape[:-1], _row_bytes(t, ty))


def _convert_tensor(
    t: SourceTensor, ty: int, threads: int, progress: Progress | None, done: int, total: int
) -> np.ndarray:
    """The output bytes of one tensor: its stored bytes if the type is kept, else quantized rows."""
    if ty == t.type and t.raw is not None:
        return t.raw()
    from llamacy.kernels.quantize import quantize

    rb = _row_bytes(t, ty)
    out = np.empty((t.n_rows, rb), dtype=np.uint8)
    step = max(1, CHUNK_VALUES // t.shape[-1])
    for start in range(0, t.n_rows, step):
        stop = min(t.n_rows, start + step)
        rows = t.read_rows(start, stop)
        if rows.shape != (stop - start, t.shape[-1]):
            raise UsageError(f"{t.name}: read {rows.shape} values, expected {(stop - start, t.shape[-1])}")
        quantize(ty, rows, out=out[start:stop], n_threads=threads)
        if progress is not None and stop < t.n_rows:
            progress(t.name, ty, done + stop * t.shape[-1], total)
    return out
