"""A fast, strict GGUF v2/v3 reader: header, metadata, tensor table, zero-copy views of read-only mmaps.

Everything is parsed and validated when the file is opened (a few tens of milliseconds even for a
262k-token vocabulary), so that later code can trust every offset and size. Any problem with the file is
a GGUFError with a one-line message naming the file; nothing reads past the end of the mapping, and no
count read from the file is trusted before it has been checked against the bytes that are left.

Layout (little-endian): magic b"GGUF", u32 version, u64 tensor_count, u64 kv_count; kv_count pairs of
(string key, u32 value type, value); tensor_count infos of (string name, u32 n_dims, n_dims x u64 ne,
u32 ggml type, u64 offset relative to the data section); padding to `alignment`; the data section.
A string is a u64 byte length followed by UTF-8 bytes, without a terminator.

A model split by llama-gguf-split (NAME-00001-of-0000N.gguf, ...) opens from its first part: every part
is mapped and checked the same way, and the tensors of all parts form one table (gguf_split.py).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from llamacy.errors import GGUFError
from llamacy.ggml_types import BLOCK_LAYOUT, type_name
from llamacy.gguf_split import SPLIT_COUNT, GGUFPart, read_other_parts

__all__ = ["GGUFError", "GGUFFile", "GGUFPart", "GGUFTensor", "GGUFValueType"]

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 8  # arrays of arrays: deeper nesting is hostile, not a model
_MAX_ELEMENTS = 2**63 - 1  # ggml counts elements in int64


class GGUFValueType:
    """Metadata value type ids as stored in the file."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_V = GGUFValueType
# Scalar and numeric-array element types: value type -> (struct format, numpy dtype).
_NUMERIC: dict[int, tuple[struct.Struct, np.dtype]] = {
    vt: (struct.Struct("<" + fmt), np.dtype("<" + dt))
    for vt, fmt, dt in (
        (_V.UINT8, "B", "u1"),
        (_V.INT8, "b", "i1"),
        (_V.UINT16, "H", "u2"),
        (_V.INT16, "h", "i2"),
        (_V.UINT32, "I", "u4"),
        (_V.INT32, "i", "i4"),
        (_V.FLOAT32, "f", "f4"),
        (_V.BOOL, "B", "?"),
        (_V.UINT64, "Q", "u8"),
        (_V.INT64, "q", "i8"),
        (_V.FLOAT64, "d", "f8"),
    )
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")

# Smallest encodings, used to reject hostile counts before allocating anything for them:
# a kv pair is at least key length + value type + one byte; a tensor info at least name length + n_dims
# + one dim + type + offset; an array element at least one byte, a string 8, a nested array 12.
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8
_STRING_ARRAY_FAST_MIN = 64  # below this the plain loop is as fast as the vectorized parse


@dataclass(frozen=True, eq=False, slots=True)
class GGUFTensor:
    """One tensor of the file: where its bytes are and how to read them (validated at open)."""

    name: str
    type: int  # GGML type id (llamacy.ggml_types.GGMLType)
    shape: tuple[int, ...]  # numpy order: the last dimension is the row (GGUF's ne[0])
    n_elements: int
    n_bytes: int
    offset: int  # absolute offset in the file of its part
    data: np.ndarray  # read-only np.uint8 view of the n_bytes raw bytes, into its part's mmap
    part: int = 0  # which file of a split model holds it (GGUFFile.parts); 0 for a single file

    @property
    def type_name(self) -> str:
        return type_name(self.type)

    def rows(self) -> np.ndarray:
        """The raw bytes as a read-only (n_rows, row_bytes) uint8 view; a 1-D tensor is one row."""
        n_rows = self.n_elements // self.shape[-1]
        return self.data.reshape(n_rows, self.n_bytes // n_rows)

    def __repr__(self) -> str:
        return f"GGUFTensor({self.name!r}, {self.type_name}, shape={self.shape}, offset={self.offset})"


class GGUFFile:
    """An open, validated GGUF model: one file, or every part of a split one (opened by its first part).

    Usable as a context manager. Tensor data and numeric metadata arrays are zero-copy views of read-only
    mmaps, one per part; a mapping is released by close() once no such view is alive any more. Of a split
    model, metadata, version, alignment and data_offset are the first part's (which carries the model's
    metadata), file_size is the parts' total, and tensors holds every part's tensors, each knowing its part.
    """

    # Tensor data are views of these read-only file mappings: a reader that copied a tensor (repack.py) may
    # give its pages back to the kernel (madvise DONTNEED): they leave the resident set, stay in the page
    # cache, and reading them again would only fault them back in.
    releasable = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path: str = os.fspath(path)
        self._maps: list[mmap.mmap] = []
        self._u8: np.ndarray | None = None  # the first part's bytes, one uint8 view that tensors slice
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, GGUFTensor] = {}
        try:
            first, self.version, self.alignment, self.metadata, self.tensors = self._read_part(self.path, 0)
            self.data_offset: int = first.data_offset
            self.parts: tuple[GGUFPart, ...] = (first,)
            if SPLIT_COUNT in self.metadata:  # written by llama-gguf-split: maybe part 1 of several
                self.parts, self.tensors = read_other_parts(
                    first, self.metadata, self.tensors, self._read_part
                )
            self.file_size: int = sum(p.file_size for p in self.parts)
        except BaseException:
            self.close()
            raise

    def _read_part(
        self, path: str, index: int
    ) -> tuple[GGUFPart, int, int, dict[str, Any], dict[str, GGUFTensor]]:
        """Map and parse one file (part `index` of the model): its part record, version, alignment,
        metadata and tensors. The mapping is this object's from now on, closed by close()."""
        mm = _open_mmap(path)
        self._maps.append(mm)
        u8 = np.frombuffer(mm, dtype=np.uint8)
        if index == 0:
            self._u8 = u8
        try:
            version, alignment, data_offset, metadata, tensors = _Parser(path, mm, u8, index).parse()
        except (struct.error, IndexError, ValueError, OverflowError, MemoryError) as e:
            # A safety net only: _Parser checks everything explicitly; the tests assert this never fires.
            raise GGUFError(f"{path}: malformed GGUF file ({type(e).__name__}: {e})") from e
        return GGUFPart(path, len(mm), data_offset, len(tensors)), version, alignment, metadata, tensors

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def close(self) -> None:
        """Drop this object's hold on the mappings (its metadata and tensors become empty).

        Views handed out earlier stay valid: they keep their mapping alive until they are gone.
        """
        self.metadata = {}
        self.tensors = {}
        self._u8 = None
        for mm in self._maps:
            _try_close(mm)
        self._maps = []

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        parts = f", {len(self.parts)} parts" if len(self.parts) > 1 else ""
        return (
            f"GGUFFile({self.path!r}, v{self.version}, {len(self.metadata)} keys, "
            f"{len(self.tensors)} tensors, data at {self.data_offset}{parts})"
        )


def _try_close(mm: mmap.mmap) -> None:
    # While numpy views still export the buffer it cannot close; the mapping goes with the last of them.
    with contextlib.suppress(BufferError):
        mm.close()


def _open_mmap(path: str) -> mmap.mmap:
    def fail(problem: str) -> NoReturn:
        raise GGUFError(f"{path}: {problem}") from None

    try:
        st = os.stat(path)
        # Check before open(): opening a FIFO would block, a directory cannot be mapped.
        if stat.S_ISDIR(st.st_mode):
            fail("is a directory, not a GGUF file")
        if not stat.S_ISREG(st.st_mode):
            fail("not a regular file")
        if st.st_size == 0:
            fail("empty file, not a GGUF file")
        with open(path, "rb") as fh:
            # The mapping holds its own reference to the file; the descriptor can go right away.
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        fail("no such file")
    except PermissionError:
        fail("permission denied")
    except IsADirectoryError:
        fail("is a directory, not a GGUF file")
    except (OSError, ValueError) as e:
        fail(f"cannot open: {getattr(e, 'strerror', None) or e}")


class _Parser:
    """Reads the header, metadata and tensor table with a bounds-checked cursor."""

    def __init__(self, path: str, mm: mmap.mmap, u8: np.ndarray, part: int = 0) -> None:
        self.path = path
        self.mm = mm
        self.u8 = u8
        self.part = part  # stamped on each tensor: which file of a split model holds it
        self.size = len(mm)
        self.pos = 0

    def fail(self, problem: str) -> NoReturn:
        raise GGUFError(f"{self.path}: {problem}")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            self.fail(
                f"truncated file: {what} at offset {self.pos} needs {n} bytes, "
                f"{self.size - self.pos} left (file is {self.size} bytes)"
            )

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.mm, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.mm, self.pos)
        self.pos += 8
        return v

    def string(self, what: str) -> str:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        raw = self.mm[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(f"{what} is not valid UTF-8 (byte {e.start})")

    # --- the file -------------------------------------------------------------------------------

    def parse(self) -> tuple[int, int, int, dict[str, Any], dict[str, GGUFTensor]]:
        if self.mm[:4] != MAGIC:
            self.fail(f"not a GGUF file (magic {self.mm[:4]!r}, expected {MAGIC!r})")
        self.need(_HEADER.size, "header")
        _, version, n_tensors, n_kv = _HEADER.unpack_from(self.mm, 0)
        if version not in SUPPORTED_VERSIONS:
            if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
                self.fail(f"big-endian GGUF (version {version >> 24}) is not supported")
            self.fail(f"unsupported GGUF version {version} (supported: 2 and 3)")
        self.pos = _HEADER.size
        left = self.size - self.pos
        if n_kv * _MIN_KV_BYTES > left:
            self.fail(
                f"metadata count {n_kv} cannot fit in the {left} bytes left (truncated or corrupt file)"
            )
        if n_tensors * _MIN_TENSOR_INFO_BYTES > left:
            self.fail(
                f"tensor count {n_tensors} cannot fit in the {left} bytes left (truncated or corrupt file)"
            )

        metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = self.string(f"metadata key #{i}")
            if key in metadata:
                self.fail(f"duplicate metadata key {key!r}")
            vtype = self.u32(f"value type of {key!r}")
            metadata[key] = self.value(vtype, key, 0)

        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if (
            type(alignment) is not int  # a bool or float here is a broken file
            or alignment <= 0
            or alignment & (alignment - 1)
        ):
            self.fail(f"general.alignment must be a positive power of two, got {alignment!r}")

        infos = [self.tensor_info(i) for i in range(n_tensors)]
        data_offset = -(-self.pos // alignment) * alignment
        tensors: dict[str, GGUFTensor] = {}
        for name, shape, ggml_type, rel_offset in infos:
            if name in tensors:
                self.fail(f"duplicate tensor name {name!r}")
            tensors[name] = self.tensor(name, shape, ggml_type, rel_offset, data_offset, alignment)
        return version, alignment, data_offset, metadata, tensors

    # --- metadata -------------------------------------------------------------------------------

    def value(self, vtype: int, key: str, depth: int) -> Any:
        numeric = _NUMERIC.get(vtype)
        if numeric is not None:
            fmt = numeric[0]
            self.need(fmt.size, f"value of {key!r}")
            (v,) = fmt.unpack_from(self.mm, self.pos)
            self.pos += fmt.size
            if vtype == _V.BOOL:
                if v > 1:
                    self.fail(f"value of {key!r} is not a valid bool ({v})")
                return bool(v)
            return v
        if vtype == _V.STRING:
            return self.string(f"value of {key!r}")
        if vtype == _V.ARRAY:
            return self.array(key, depth + 1)
        self.fail(f"unknown metadata value type {vtype} for {key!r}")

    def array(self, key: str, depth: int) -> Any:
        if depth > MAX_ARRAY_DEPTH:
            self.fail(f"{key!r}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
        etype = self.u32(f"array element type of {key!r}")
        count = self.u64(f"array length of {key!r}")
        left = self.size - self.pos
        numeric = _NUMERIC.get(etype)
        if numeric is not None:
            dtype = numeric[1]
            n_bytes = count * dtype.itemsize
            if n_bytes > left:
                self.fail(f"array {key!r} of {count} elements runs past the end of the file")
            arr = self.u8[self.pos : self.pos + n_bytes].view(dtype)  # zero-copy, read-only
            if etype == _V.BOOL and (arr.view(np.uint8) > 1).any():
                self.fail(f"array {key!r} holds an invalid bool")
            self.pos += n_bytes
            return arr
        if etype == _V.STRING:
            if count * 8 > left:
                self.fail(f"array {key!r} of {count} strings runs past the end of the file")
            return self.string_array(key, count)
        if etype == _V.ARRAY:
            if count * 12 > left:
                self.fail(f"array {key!r} of {count} arrays runs past the end of the file")
            return [self.array(key, depth + 1) for _ in range(count)]
        self.fail(f"unknown array element type {etype} for {key!r}")

    def string_array(self, key: str, count: int) -> list[str]:
        if count >= _STRING_ARRAY_FAST_MIN:
            fast = self.string_array_fast(count)
            if fast is not None:
                return fast
        # The plain loop: exact for any input, and the one that explains what is wrong.
        mm, size, pos = self.mm, self.size, self.pos
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for i in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, f"length of {key!r}[{i}]")
            (n,) = unpack(mm, pos)
            pos += 8
            if n > size - pos:
                self.pos = pos
                self.need(n, f"{key!r}[{i}]")
            try:
                append(mm[pos : pos + n].decode("utf-8"))
            except UnicodeDecodeError as e:
                self.fail(f"{key!r}[{i}] is not valid UTF-8 (byte {e.start})")
            pos += n
        self.pos = pos
        return out

    def string_array_fast(self, count: int) -> list[str] | None:
        """Parse `count` strings without a Python loop over them, or return None to fall back.

        A length prefix shorter than 256 is the 8 bytes [n, 0, 0, 0, 0, 0, 0, 0], so every prefix
        start is a position followed by 7 zero bytes. Such candidates are found with numpy; if the
        first `count` of them chain exactly (each one's end is the next one's start, starting here),
        they *are* the prefixes, by induction. Otherwise (a string of 256+ bytes, an empty string, a
        run of NULs inside a string) return None and let the plain loop do it. The strings are then
        decoded at once: dropping bytes 0..6 of every prefix leaves its zero byte 7 as a NUL
        separator before each string, so one decode and one split give the list; a NUL inside a
        string shows up as an extra piece, and invalid UTF-8 as a decode error: both fall back.
        """
        u8, size, start = self.u8, self.size, self.pos
        starts_parts: list[np.ndarray] = []
        n_found = 0
        expect = start  # where the next prefix must start for the chain to hold
        a = start
        chunk = 24 * count  # a guess at the bytes the array takes, corrected from what is found
        while n_found < count:
            # Bounded chunks keep the temporaries small whatever the file claims.
            b = min(size, a + min(max(chunk, 1 << 16), 1 << 23))
            z = u8[a : min(size, b + 7)] == 0
            m = min(b - a, len(z) - 7)  # positions with a whole prefix inside the file
            if m <= 0:
                return None
            c = z[1 : m + 1].copy()
            for j in range(2, 8):
                c &= z[j : m + j]
            hits = np.flatnonzero(c)[: count - n_found] + a
            if len(hits):
                ends = hits + 8 + u8[hits]
                if hits[0] != expect or not np.array_equal(ends[:-1], hits[1:]):
                    return None
                expect = int(ends[-1])
                starts_parts.append(hits)
                n_found += len(hits)
            if expect < b and n_found < count:
                return None  # the next prefix should have been in this chunk
            a = b
            chunk = (count - n_found) * (b - start) // max(n_found, 1)
        if expect > size:
            return None
        end = expect
        starts = np.concatenate(starts_parts)
        keep = np.ones(end - start, dtype=bool)
        rel = starts - start
        for j in range(7):
            keep[rel + j] = False
        joined = u8[start:end][keep]  # "\0s0\0s1\0s2..."
        try:
            text = str(joined[1:].data, "utf-8")
        except UnicodeDecodeError:
            return None
        parts = text.split("\x00")
        if len(parts) != count:
            return None
        self.pos = end
        return parts

    # --- tensors --------------------------------------------------------------------------------

    def tensor_info(self, i: int) -> tuple[str, tuple[int, ...], int, int]:
        name = self.string(f"name of tensor #{i}")
        n_dims = self.u32(f"n_dims of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            self.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        self.need(8 * n_dims, f"shape of tensor {name!r}")
        ne = struct.unpack_from(f"<{n_dims}Q", self.mm, self.pos)
        self.pos += 8 * n_dims
        ggml_type = self.u32(f"type of tensor {name!r}")
        rel_offset = self.u64(f"offset of tensor {name!r}")
        return name, ne, ggml_type, rel_offset

    def tensor(
        self,
        name: str,
        ne: tuple[int, ...],
        ggml_type: int,
        rel_offset: int,
        data_offset: int,
        alignment: int,
    ) -> GGUFTensor:
        if ggml_type not in BLOCK_LAYOUT:
            self.fail(f"tensor {name!r} has unknown type {ggml_type}")
        block, block_bytes = BLOCK_LAYOUT[ggml_type]
        n_elements = 1
        for d in ne:
            if d == 0:
                self.fail(f"tensor {name!r} has a zero dimension (ne={list(ne)})")
            n_elements *= d
            if n_elements > _MAX_ELEMENTS:
                self.fail(f"tensor {name!r} has too many elements (ne={list(ne)})")
        if ne[0] % block:
            self.fail(
                f"tensor {name!r}: rows of {ne[0]} values are not a whole number of "
                f"{type_name(ggml_type)} blocks of {block}"
            )
        n_bytes = n_elements // block * block_bytes
        if rel_offset % alignment:
            self.fail(f"tensor {name!r}: offset {rel_offset} is not a multiple of the alignment {alignment}")
        offset = data_offset + rel_offset
        if offset > self.size or n_bytes > self.size - offset:
            self.fail(
                f"tensor {name!r}: {n_bytes} bytes at offset {offset} run past the end of the file "
                f"({self.size} bytes)"
            )
        data = self.u8[offset : offset + n_bytes]
        return GGUFTensor(name, ggml_type, tuple(reversed(ne)), n_elements, n_bytes, offset, data, self.part)
