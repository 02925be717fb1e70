"""Writing the output GGUF: the `gguf` package's writer, into a temporary file renamed into place at the end.

A conversion that fails or is interrupted (Ctrl-C) leaves no OUT behind, not even a truncated one: the
data goes to a hidden temporary file in OUT's directory (so that the final rename is atomic), removed on
any error.
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType, GGUFWriter

_NUMPY = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "|b1",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}
_U64 = struct.Struct("<Q")


class FastWriter(GGUFWriter):
    """GGUFWriter packing large arrays in one go.

    The base class packs arrays element by element (seconds for a 262k-token vocabulary) and only accepts
    Python sequences; this accepts numpy arrays too (our reader's numeric arrays) and packs numeric and
    string arrays with numpy / one join. Everything else is the base class's.
    """

    def _pack_val(
        self, val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type: GGUFValueType | None = None
    ) -> bytes:
        if vtype != GGUFValueType.ARRAY or len(val) == 0:
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        if sub_type is None:
            sub_type = _element_type(val)
        if sub_type == GGUFValueType.STRING and all(isinstance(s, str) for s in val):
            encoded = [s.encode("utf-8") for s in val]
            body = b"".join(_U64.pack(len(b)) + b for b in encoded)
        elif sub_type in _NUMPY:
            arr = np.asarray(val)
            want = np.dtype(_NUMPY[sub_type])
            if arr.dtype != want and not np.can_cast(arr.dtype, want, casting="same_kind"):
                raise ValueError(f"array of {arr.dtype} cannot be stored as {sub_type.name}")
            if arr.dtype.kind in "iu" and want.kind in "iu" and arr.size:
                info = np.iinfo(want)
                if arr.min() < info.min or arr.max() > info.max:
                    raise ValueError(f"array values out of range for {sub_type.name}")
            body = arr.astype(want, copy=False).tobytes()
        else:  # arrays of arrays: rare, leave them to the base class
            return super()._pack_val(list(val), vtype, add_vtype, sub_type)
        head = struct.pack("<I", vtype) if add_vtype else b""
        return head + struct.pack("<IQ", sub_type, len(val)) + body


def _element_type(val: Sequence[Any] | np.ndarray) -> GGUFValueType:
    if isinstance(val, np.ndarray):
        for vt, dt in _NUMPY.items():
            if np.dtype(dt) == val.dtype.newbyteorder("<"):
                return vt
        raise ValueError(f"no GGUF array type for {val.dtype}")
    return GGUFValueType.get_type(val[0])


class OutputFile:
    """A GGUF file being written to a temporary path next to `path`; commit() renames it into place.

    Used as a context manager: leaving the block without commit() (an exception, Ctrl-C) deletes the
    temporary file.
    """

    def __init__(self, path: Path, arch: str) -> None:
        self.path = path
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
        os.close(fd)
        self.tmp = Path(tmp)
        try:
            self.writer = FastWriter(self.tmp, arch)
        except BaseException:
            self.tmp.unlink(missing_ok=True)
            raise
        self._done = False

    def commit(self) -> None:
        self.writer.close()
        # mkstemp makes the file private (0600); give it the permissions a plain open() would have.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.tmp, 0o666 & ~umask)
        os.replace(self.tmp, self.path)
        self._done = True

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> OutputFile:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._done:
            self.abort()
