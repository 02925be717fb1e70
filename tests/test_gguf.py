"""The GGUF reader: round trips through gguf.GGUFWriter, hand-made v2 files, the real models against
gguf.GGUFReader, one test per validation rule, and a mutation fuzz test."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llamacy.gguf as gguf_module
from llamacy.errors import LlamacyError
from llamacy.ggml_types import BLOCK_LAYOUT, GGMLType
from llamacy.gguf import GGUFError, GGUFFile, GGUFTensor

VT = gguf.GGUFValueType

# --- a byte-level builder, for files GGUFWriter will not write (v2, broken ones) ---------------------

_SCALAR_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def gstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gval(vtype: int, value: Any, sub: int | None = None) -> bytes:
    """The encoding of a value of `vtype` (without its type id). Arrays: value is a list, sub its type."""
    if vtype in _SCALAR_FMT:
        return struct.pack("<" + _SCALAR_FMT[vtype], value)
    if vtype == 8:
        return gstr(value)
    assert vtype == 9 and sub is not None
    out = struct.pack("<IQ", sub, len(value))
    for v in value:
        if sub == 9:
            inner_sub, inner = v
            out += gval(9, inner, inner_sub)
        else:
            out += gval(sub, v)
    return out


def gkv(key: str | bytes, vtype: int, value: Any, sub: int | None = None) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + gval(vtype, value, sub)


def ginfo(name: str | bytes, ne: list[int], ggml_type: int, offset: int) -> bytes:
    return gstr(name) + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, ggml_type, offset)


def build(
    kvs: list[bytes],
    infos: list[bytes],
    data: bytes = b"",
    *,
    version: int = 3,
    alignment: int = 32,
    n_kv: int | None = None,
    n_tensors: int | None = None,
) -> bytes:
    head = b"GGUF" + struct.pack(
        "<IQQ", version, len(infos) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv
    )
    body = head + b"".join(kvs) + b"".join(infos)
    pad = -len(body) % alignment
    return body + b"\0" * pad + data


def tiny_file_bytes(version: int = 3) -> bytes:
    """A small valid file with every kind of value and three tensors (used by the fuzz tests)."""
    kvs = [
        gkv("general.architecture", 8, "llama"),
        gkv("a.u32", 4, 7),
        gkv("a.f32", 6, 0.5),
        gkv("a.bool", 7, True),
        gkv("a.i64", 11, -3),
        gkv("a.f32s", 9, [1.0, 2.0, 3.0], 6),
        gkv("a.strs", 9, ["x", "yé", ""], 8),
        gkv("a.nested", 9, [(5, [1, 2]), (8, ["q"])], 9),
    ]
    f32 = np.arange(8, dtype=np.float32).tobytes()  # (2, 4) F32
    q8 = bytes(range(34))  # one Q8_0 block: (1, 32)
    infos = [ginfo("t.f32", [4, 2], 0, 0), ginfo("t.q8", [32], 8, 32), ginfo("t.alias", [4], 0, 0)]
    return build(kvs, infos, f32 + q8 + b"\0" * 30, version=version)


def write(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def expect_error(path: Path, *fragments: str) -> str:
    with pytest.raises(GGUFError) as info:
        GGUFFile(path)
    msg = str(info.value)
    assert str(path) in msg, msg
    assert "\n" not in msg, msg
    assert "malformed GGUF file (" not in msg, f"the safety net fired, an explicit check is missing: {msg}"
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    return msg


# --- round trips through GGUFWriter ---------------------------------------------------------------

SCALARS: list[tuple[str, int, Any]] = [
    ("s.u8", VT.UINT8, 255),
    ("s.i8", VT.INT8, -128),
    ("s.u16", VT.UINT16, 65535),
    ("s.i16", VT.INT16, -32768),
    ("s.u32", VT.UINT32, 2**32 - 1),
    ("s.i32", VT.INT32, -(2**31)),
    ("s.f32", VT.FLOAT32, 1.5),
    ("s.bool_t", VT.BOOL, True),
    ("s.bool_f", VT.BOOL, False),
    ("s.str", VT.STRING, "héllo ✓ 😀"),
    ("s.u64", VT.UINT64, 2**64 - 1),
    ("s.i64", VT.INT64, -(2**63)),
    ("s.f64", VT.FLOAT64, -2.25e300),
]
ARRAYS: list[tuple[str, int, list[Any], str]] = [
    ("a.u8", VT.UINT8, [0, 1, 255], "u1"),
    ("a.i8", VT.INT8, [-128, 0, 127], "i1"),
    ("a.u16", VT.UINT16, [0, 65535], "<u2"),
    ("a.i16", VT.INT16, [-32768, 5], "<i2"),
    ("a.u32", VT.UINT32, [1, 2**32 - 1, 3], "<u4"),
    ("a.i32", VT.INT32, [-1, 0, 2**31 - 1], "<i4"),
    ("a.f32", VT.FLOAT32, [0.25, -1.0, 3.5], "<f4"),
    ("a.bool", VT.BOOL, [True, False, True], "?"),
    ("a.u64", VT.UINT64, [2**64 - 1, 0], "<u8"),
    ("a.i64", VT.INT64, [-(2**63), 2**63 - 1], "<i8"),
    ("a.f64", VT.FLOAT64, [1e-300, -0.5], "<f8"),
]
# Long enough for the vectorized string-array path, with the cases that must make it fall back.
TOKENS = [f"tok{i}·é" for i in range(200)]
TOKENS_LONG = [*TOKENS[:100], "x" * 300, "ü" * 200, *TOKENS[100:]]  # lengths >= 256 bytes
TOKENS_EMPTY = [*TOKENS[:50], "", "", *TOKENS[50:]]
TOKENS_NUL = [*TOKENS[:10], "a\x00b", "\x00" * 9, *TOKENS[10:]]
TOKENS_FIRST_EMPTY = ["", *TOKENS]


def write_model(path: Path, alignment: int | None = None) -> dict[str, Any]:
    """Write a file with every metadata type and several tensor types; return what was written."""
    w = gguf.GGUFWriter(path, "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, vt, v in SCALARS:
        w.add_key_value(key, v, vt)
    for key, vt, v, _ in ARRAYS:
        w.add_key_value(key, v, VT.ARRAY, sub_type=vt)
    w.add_array("a.str", ["", "b", "ünï"])
    w.add_array("tok.plain", TOKENS)
    w.add_array("tok.long", TOKENS_LONG)
    w.add_array("tok.empty", TOKENS_EMPTY)
    w.add_array("tok.nul", TOKENS_NUL)
    w.add_array("tok.first_empty", TOKENS_FIRST_EMPTY)
    w.add_array("n.ints", [[1, 2], [3, 4, 5]])
    w.add_array("n.strs", [["a"], ["b", "c"]])
    w.add_array("n.deep", [[[1.5]], [[2.5, 3.5]]])

    rng = np.random.default_rng(0)
    tensors: dict[str, tuple[int, tuple[int, ...], bytes]] = {}

    def add(name: str, arr: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> None:
        raw = None if arr.dtype != np.uint8 else gguf.GGMLQuantizationType(ggml_type)
        w.add_tensor(name, arr, raw_dtype=raw)
        tensors[name] = (ggml_type, shape, arr.tobytes())

    add("f32.2d", rng.standard_normal((3, 8)).astype(np.float32), GGMLType.F32, (3, 8))
    add("f16.1d", rng.standard_normal(5).astype(np.float16), GGMLType.F16, (5,))
    add("i8.3d", rng.integers(-100, 100, (2, 3, 4)).astype(np.int8), GGMLType.I8, (2, 3, 4))
    add("f32.4d", rng.standard_normal((2, 1, 3, 4)).astype(np.float32), GGMLType.F32, (2, 1, 3, 4))
    q8 = rng.integers(0, 256, (4, 2 * 34)).astype(np.uint8)  # 4 rows of 64 values
    add("q8_0", q8, GGMLType.Q8_0, (4, 64))
    q4k = rng.integers(0, 256, (2, 144)).astype(np.uint8)  # 2 rows of 256 values
    add("q4_k", q4k, GGMLType.Q4_K, (2, 256))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def assert_same(ours: Any, expected: Any, where: str) -> None:
    if isinstance(expected, list) and expected and isinstance(expected[0], list):
        assert isinstance(ours, list) and len(ours) == len(expected), where
        for i, (o, e) in enumerate(zip(ours, expected, strict=True)):
            assert_same(o, e, f"{where}[{i}]")
    elif isinstance(expected, list) and expected and isinstance(expected[0], str):
        assert ours == expected, where
    elif isinstance(expected, list):
        assert isinstance(ours, np.ndarray), where
        np.testing.assert_array_equal(ours, np.array(expected, dtype=ours.dtype), err_msg=where)
    else:
        assert type(ours) is type(expected) and ours == expected, (where, ours, expected)


def test_round_trip_every_value_type_and_tensor(tmp_path: Path) -> None:
    path = tmp_path / "all.gguf"
    tensors = write_model(path)
    with GGUFFile(path) as f:
        assert f.version == 3
        assert f.alignment == 32
        assert f.path == str(path)
        assert f.file_size == path.stat().st_size
        assert f.data_offset % 32 == 0
        assert f.get("general.architecture") == "llama"
        assert f.get("missing", 42) == 42
        for key, vt, v in SCALARS:
            got = f.metadata[key]
            if vt == VT.FLOAT32:
                assert got == np.float32(v)
            assert_same(got, v, key)
        for key, _, v, dtype in ARRAYS:
            got = f.metadata[key]
            assert isinstance(got, np.ndarray) and got.dtype == np.dtype(dtype), key
            assert not got.flags.writeable
            assert got.tolist() == v, key
        assert f.metadata["a.str"] == ["", "b", "ünï"]
        assert f.metadata["tok.plain"] == TOKENS
        assert f.metadata["tok.long"] == TOKENS_LONG
        assert f.metadata["tok.empty"] == TOKENS_EMPTY
        assert f.metadata["tok.nul"] == TOKENS_NUL
        assert f.metadata["tok.first_empty"] == TOKENS_FIRST_EMPTY
        assert_same(f.metadata["n.ints"], [[1, 2], [3, 4, 5]], "n.ints")
        assert f.metadata["n.ints"][1].dtype == np.int32
        assert f.metadata["n.strs"] == [["a"], ["b", "c"]]
        deep = f.metadata["n.deep"]
        assert [[a.tolist() for a in inner] for inner in deep] == [[[1.5]], [[2.5, 3.5]]]

        assert list(f.tensors) == list(tensors)  # file order
        file_bytes = path.read_bytes()
        for name, (ggml_type, shape, raw) in tensors.items():
            t = f.tensors[name]
            assert isinstance(t, GGUFTensor)
            assert (t.name, t.type, t.shape) == (name, ggml_type, shape)
            assert t.n_elements == int(np.prod(shape))
            assert t.n_bytes == len(raw)
            assert t.offset % 32 == 0 and t.offset >= f.data_offset
            assert t.data.dtype == np.uint8 and not t.data.flags.writeable
            assert t.data.tobytes() == raw
            assert file_bytes[t.offset : t.offset + t.n_bytes] == raw
            rows = t.rows()
            n_rows = int(np.prod(shape[:-1]))
            assert rows.shape == (n_rows, len(raw) // n_rows)
            assert rows.tobytes() == raw
        # The views are one mapping: a tensor's data shares memory with the file's byte view.
        assert np.shares_memory(f.tensors["f32.2d"].data, f._u8)
        f32 = f.tensors["f32.2d"].data.view(np.float32).reshape(3, 8)
        np.testing.assert_array_equal(f32, np.frombuffer(tensors["f32.2d"][2], np.float32).reshape(3, 8))


def test_matches_gguf_reader_on_written_file(tmp_path: Path) -> None:
    path = tmp_path / "all.gguf"
    write_model(path)
    with GGUFFile(path) as f:
        compare_with_gguf_reader(f, gguf.GGUFReader(path))


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
def test_custom_alignment(tmp_path: Path, alignment: int) -> None:
    path = tmp_path / "aligned.gguf"
    tensors = write_model(path, alignment=alignment)
    with GGUFFile(path) as f:
        assert f.alignment == alignment
        assert f.metadata["general.alignment"] == alignment
        assert f.data_offset % alignment == 0
        for name, (_, _, raw) in tensors.items():
            t = f.tensors[name]
            assert (t.offset - f.data_offset) % alignment == 0
            assert t.data.tobytes() == raw
        reader = gguf.GGUFReader(path)
        assert [t.data_offset for t in reader.tensors] == [t.offset for t in f.tensors.values()]


@pytest.mark.parametrize("version", [2, 3])
def test_hand_written_v2_and_v3(tmp_path: Path, version: int) -> None:
    path = write(tmp_path, tiny_file_bytes(version))
    with GGUFFile(path) as f:
        assert f.version == version
        assert f.metadata["general.architecture"] == "llama"
        assert f.metadata["a.u32"] == 7 and f.metadata["a.f32"] == 0.5 and f.metadata["a.bool"] is True
        assert f.metadata["a.i64"] == -3
        assert f.metadata["a.f32s"].tolist() == [1.0, 2.0, 3.0]
        assert f.metadata["a.strs"] == ["x", "yé", ""]
        nested = f.metadata["a.nested"]
        assert nested[0].tolist() == [1, 2] and nested[0].dtype == np.int32 and nested[1] == ["q"]
        t = f.tensors["t.f32"]
        assert (t.type, t.shape, t.n_elements, t.n_bytes) == (GGMLType.F32, (2, 4), 8, 32)
        np.testing.assert_array_equal(t.rows().view(np.float32), np.arange(8, dtype=np.float32).reshape(2, 4))
        q = f.tensors["t.q8"]
        assert (q.type, q.shape, q.n_bytes, q.offset) == (GGMLType.Q8_0, (32,), 34, f.data_offset + 32)
        assert q.data.tobytes() == bytes(range(34))
        assert q.rows().shape == (1, 34)
        # Overlapping tensors are allowed (a view may alias another).
        assert f.tensors["t.alias"].data.tobytes() == t.data.tobytes()[:16]


def test_writer_file_patched_to_v2_reads_the_same(tmp_path: Path) -> None:
    path = tmp_path / "v3.gguf"
    write_model(path)
    raw = bytearray(path.read_bytes())
    raw[4:8] = struct.pack("<I", 2)
    v2 = write(tmp_path, bytes(raw), "v2.gguf")
    with GGUFFile(path) as a, GGUFFile(v2) as b:
        assert (a.version, b.version) == (3, 2)
        assert list(a.metadata) == list(b.metadata)
        assert b.metadata["tok.long"] == TOKENS_LONG
        assert [t.offset for t in a.tensors.values()] == [t.offset for t in b.tensors.values()]


def test_no_tensors_and_no_metadata(tmp_path: Path) -> None:
    with GGUFFile(write(tmp_path, build([], []))) as f:
        assert f.metadata == {} and f.tensors == {}
        assert f.data_offset == 32


def test_close_keeps_handed_out_views_alive(tmp_path: Path) -> None:
    path = write(tmp_path, tiny_file_bytes())
    f = GGUFFile(path)
    data = f.tensors["t.f32"].data
    scores = f.metadata["a.f32s"]
    f.close()
    assert f.tensors == {} and f.metadata == {}
    f.close()  # twice is fine
    assert data.view(np.float32).tolist() == list(range(8))
    assert scores.tolist() == [1.0, 2.0, 3.0]
    with GGUFFile(path) as g:
        pass
    assert g.tensors == {}


def test_error_class() -> None:
    assert issubclass(GGUFError, LlamacyError)


# --- string arrays: the vectorized path against the plain loop ----------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(
            st.text(max_size=12),
            st.text(alphabet="\x00a", max_size=10),
            st.text(min_size=250, max_size=300),
        ),
        min_size=0,
        max_size=150,
    )
)
def test_string_arrays_of_any_content(tmp_path: Path, strings: list[str]) -> None:
    path = write(tmp_path, build([gkv("s", 9, strings, 8), gkv("after", 4, 99)], []), "strs.gguf")
    with GGUFFile(path) as f:
        assert f.metadata["s"] == strings
        assert f.metadata["after"] == 99


def test_string_array_paths_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = [f"t{i}" for i in range(500)] + ["🙂" * 60]
    path = write(tmp_path, build([gkv("s", 9, tokens, 8)], []))
    calls: list[bool] = []
    fast = gguf_module._Parser.string_array_fast

    def spy(self: Any, count: int) -> Any:
        out = fast(self, count)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(gguf_module._Parser, "string_array_fast", spy)
    with GGUFFile(path) as f:
        assert f.metadata["s"] == tokens
    assert calls == [True]  # the vectorized path did the work
    monkeypatch.setattr(gguf_module, "_STRING_ARRAY_FAST_MIN", 10**9)
    with GGUFFile(path) as f:
        assert f.metadata["s"] == tokens
    assert calls == [True]


_WORDS = [f"w{i}" for i in range(100)]


@pytest.mark.parametrize(
    ("strings", "fast"),
    [
        (_WORDS, True),
        (["", *_WORDS], True),  # an empty first string still chains
        (["L" * 256, *_WORDS], False),  # no prefix candidate where the array starts
        ([*_WORDS[:50], "L" * 300, *_WORDS[50:]], False),  # a gap in the chain
        ([*_WORDS[:50], "", *_WORDS[50:]], False),  # an empty string makes a stray candidate
        ([*_WORDS[:50], "a\x00b", *_WORDS[50:]], False),  # one NUL: the split finds an extra piece
        ([*_WORDS[:50], "\x00" * 8, *_WORDS[50:]], False),  # a run of NULs: stray candidates
        ([*_WORDS, "L" * 256], False),  # the last one: the chain would run into the next key
    ],
    ids=["plain", "first-empty", "first-long", "middle-long", "empty", "nul", "nul-run", "last-long"],
)
def test_string_array_fast_path_falls_back_exactly_when_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strings: list[str], fast: bool
) -> None:
    results: list[Any] = []
    original = gguf_module._Parser.string_array_fast

    def spy(self: Any, count: int) -> Any:
        results.append(original(self, count))
        return results[-1]

    monkeypatch.setattr(gguf_module._Parser, "string_array_fast", spy)
    # The key after the array has a length prefix of its own: a candidate the fast path must not take.
    path = write(tmp_path, build([gkv("s", 9, strings, 8), gkv("next.key", 4, 5)], []))
    with GGUFFile(path) as f:
        assert f.metadata["s"] == strings
        assert f.metadata["next.key"] == 5
    assert len(results) == 1
    assert (results[0] is not None) == fast
    if fast:
        assert results[0] == strings


def test_invalid_utf8_in_a_long_array_falls_back_to_a_precise_error(tmp_path: Path) -> None:
    strings: list[str | bytes] = [*_WORDS, b"caf\xc3"]
    expect_error(write(tmp_path, build([gkv("tok", 9, strings, 8)], [])), "'tok'[100] is not valid UTF-8")


# --- validation: one error per rule, naming the file --------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    expect_error(tmp_path / "nope.gguf", "no such file")


def test_directory(tmp_path: Path) -> None:
    d = tmp_path / "dir.gguf"
    d.mkdir()
    expect_error(d, "is a directory")


def test_empty_file(tmp_path: Path) -> None:
    expect_error(write(tmp_path, b""), "empty file")


def test_fifo(tmp_path: Path) -> None:
    p = tmp_path / "fifo.gguf"
    os.mkfifo(p)
    expect_error(p, "not a regular file")


def test_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, tiny_file_bytes())

    def denied(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    # Root ignores file modes, so the denial is simulated where the module opens the file.
    monkeypatch.setattr(gguf_module, "open", denied, raising=False)
    expect_error(path, "permission denied")


def test_wrong_magic(tmp_path: Path) -> None:
    expect_error(write(tmp_path, b"GGML" + tiny_file_bytes()[4:]), "not a GGUF file", "b'GGML'")
    expect_error(write(tmp_path, b"PK", "short.gguf"), "not a GGUF file")


@pytest.mark.parametrize("version", [0, 1, 4, 2**32 - 1])
def test_unsupported_version(tmp_path: Path, version: int) -> None:
    raw = bytearray(tiny_file_bytes())
    raw[4:8] = struct.pack("<I", version)
    expect_error(write(tmp_path, bytes(raw)), f"unsupported GGUF version {version}")


def test_big_endian(tmp_path: Path) -> None:
    raw = bytearray(tiny_file_bytes())
    raw[4:8] = struct.pack(">I", 3)
    expect_error(write(tmp_path, bytes(raw)), "big-endian")


@pytest.mark.parametrize("cut", [4, 23])
def test_truncated_header(tmp_path: Path, cut: int) -> None:
    expect_error(write(tmp_path, tiny_file_bytes()[:cut]), "truncated file", "header")


def test_truncated_metadata(tmp_path: Path) -> None:
    raw = tiny_file_bytes()
    cut = raw.index(b"a.nested") + 4
    expect_error(write(tmp_path, raw[:cut]), "truncated file", "metadata key #7")
    expect_error(
        write(tmp_path, raw[:60], "short.gguf"), "metadata count 8 cannot fit", "truncated or corrupt"
    )


def test_truncated_tensor_info(tmp_path: Path) -> None:
    raw = build([gkv("k", 8, "x" * 100)], [ginfo("t", [4], 0, 0)], b"\0" * 16)
    cut = raw.index(b"t\x01\x00") + 2  # inside n_dims of the tensor info
    expect_error(write(tmp_path, raw[:cut]), "truncated file", "n_dims of tensor 't'")


def test_truncated_tensor_data(tmp_path: Path) -> None:
    raw = tiny_file_bytes()
    expect_error(write(tmp_path, raw[:-40]), "tensor 't.q8'", "run past the end")


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (build([], [], n_kv=2**60), "metadata count 1152921504606846976 cannot fit"),
        (build([], [], n_tensors=2**60), "tensor count 1152921504606846976 cannot fit"),
        (build([struct.pack("<Q", 2**60) + b"key"], []), "truncated file"),
        (build([gstr("k") + struct.pack("<IQ", 8, 2**60)], []), "truncated file"),
        (
            build([gstr("k") + struct.pack("<IIQ", 9, 4, 2**60)], []),
            "array 'k' of 1152921504606846976 elements",
        ),
        (
            build([gstr("k") + struct.pack("<IIQ", 9, 8, 2**60)], []),
            "array 'k' of 1152921504606846976 strings",
        ),
        (
            build([gstr("k") + struct.pack("<IIQ", 9, 9, 2**60)], []),
            "array 'k' of 1152921504606846976 arrays",
        ),
        (build([gstr("k") + struct.pack("<IIQ", 9, 12, 2**61)], []), "array 'k' of 2305843009213693952"),
    ],
    ids=["kv-count", "tensor-count", "key-length", "string-length", "numeric", "strings", "arrays", "f64"],
)
def test_hostile_counts_do_not_allocate(tmp_path: Path, data: bytes, fragment: str) -> None:
    expect_error(write(tmp_path, data), fragment)


def test_unknown_value_type(tmp_path: Path) -> None:
    expect_error(
        write(tmp_path, build([gstr("k") + struct.pack("<I", 13) + b"\0" * 8], [])),
        "unknown metadata value type 13",
    )


def test_unknown_array_element_type(tmp_path: Path) -> None:
    raw = build([gstr("k") + struct.pack("<IIQ", 9, 77, 1) + b"\0" * 8], [])
    expect_error(write(tmp_path, raw), "unknown array element type 77")


def test_nested_array_depth(tmp_path: Path) -> None:
    inner = struct.pack("<IQ", 4, 0)
    for _ in range(20):
        inner = struct.pack("<IQ", 9, 1) + inner
    expect_error(
        write(tmp_path, build([gstr("deep") + struct.pack("<I", 9) + inner], [])), "nested deeper than 8"
    )
    inner = struct.pack("<IQ", 4, 0)
    for _ in range(7):
        inner = struct.pack("<IQ", 9, 1) + inner
    with GGUFFile(write(tmp_path, build([gstr("ok") + struct.pack("<I", 9) + inner], []), "ok.gguf")) as f:
        v = f.metadata["ok"]
        for _ in range(7):
            assert isinstance(v, list) and len(v) == 1
            v = v[0]
        assert isinstance(v, np.ndarray) and v.dtype == np.uint32 and v.size == 0


def test_invalid_bool(tmp_path: Path) -> None:
    raw = build([gstr("b") + struct.pack("<IB", 7, 2)], [])
    expect_error(write(tmp_path, raw), "value of 'b' is not a valid bool (2)")
    raw = build([gstr("bs") + struct.pack("<IIQ", 9, 7, 3) + b"\x01\x00\x05"], [])
    expect_error(write(tmp_path, raw, "bs.gguf"), "invalid bool")


def test_duplicate_key(tmp_path: Path) -> None:
    expect_error(write(tmp_path, build([gkv("k", 4, 1), gkv("k", 4, 2)], [])), "duplicate metadata key 'k'")


@pytest.mark.parametrize(
    ("kv", "fragment"),
    [
        (gstr(b"bad\xffkey") + struct.pack("<II", 4, 1), "metadata key #0 is not valid UTF-8"),
        (gkv("k", 8, b"\xc3("), "value of 'k' is not valid UTF-8"),
        (gkv("k", 9, ["ok", b"\xe2\x82"], 8), "'k'[1] is not valid UTF-8"),
        (gkv("k", 9, [f"t{i}" for i in range(99)] + [b"\xff"], 8), "'k'[99] is not valid UTF-8"),
    ],
    ids=["key", "string", "short-array", "token-array"],
)
def test_invalid_utf8(tmp_path: Path, kv: bytes, fragment: str) -> None:
    expect_error(write(tmp_path, build([kv], [])), fragment)


def test_invalid_utf8_tensor_name(tmp_path: Path) -> None:
    expect_error(
        write(tmp_path, build([], [ginfo(b"w\xff", [4], 0, 0)], b"\0" * 16)),
        "name of tensor #0 is not valid UTF-8",
    )


@pytest.mark.parametrize(
    ("kv", "fragment"),
    [
        (gkv("general.alignment", 4, 0), "got 0"),
        (gkv("general.alignment", 4, 24), "got 24"),
        (gkv("general.alignment", 5, -32), "got -32"),
        (gkv("general.alignment", 8, "32"), "got '32'"),
        (gkv("general.alignment", 7, True), "got True"),
    ],
)
def test_bad_alignment(tmp_path: Path, kv: bytes, fragment: str) -> None:
    expect_error(
        write(tmp_path, build([kv], [])), "general.alignment must be a positive power of two", fragment
    )


@pytest.mark.parametrize(
    ("info", "data_len", "fragments"),
    [
        (ginfo("w", [8], 0, 64), 64, ("tensor 'w'", "run past the end")),
        (ginfo("w", [8], 0, 2**64 - 32), 64, ("tensor 'w'", "run past the end")),
        (ginfo("w", [8], 0, 16), 64, ("offset 16 is not a multiple of the alignment 32",)),
        (ginfo("w", [32], 4, 0), 64, ("unknown type 4",)),
        (ginfo("w", [32], 99, 0), 64, ("unknown type 99",)),
        (ginfo("w", [4, 0], 0, 0), 64, ("zero dimension",)),
        (ginfo("w", [], 0, 0), 64, ("0 dimensions",)),
        (ginfo("w", [1, 1, 1, 1, 1], 0, 0), 64, ("5 dimensions",)),
        (ginfo("w", [2**32, 2**32, 2**32], 0, 0), 64, ("too many elements",)),
        (ginfo("w", [33, 2], GGMLType.Q8_0, 0), 128, ("rows of 33 values", "Q8_0 blocks of 32")),
        (ginfo("w", [128], GGMLType.Q4_K, 0), 256, ("rows of 128 values", "Q4_K blocks of 256")),
    ],
    ids=[
        "past-end",
        "offset-wraps",
        "unaligned",
        "type-4",
        "type-99",
        "zero-dim",
        "0-dims",
        "5-dims",
        "overflow",
        "q8-row",
        "q4k-row",
    ],
)
def test_bad_tensor(tmp_path: Path, info: bytes, data_len: int, fragments: tuple[str, ...]) -> None:
    expect_error(write(tmp_path, build([], [info], b"\0" * data_len)), *fragments)


def test_duplicate_tensor_name(tmp_path: Path) -> None:
    raw = build([], [ginfo("w", [8], 0, 0), ginfo("w", [8], 0, 32)], b"\0" * 64)
    expect_error(write(tmp_path, raw), "duplicate tensor name 'w'")


def test_every_known_type_is_sized_from_the_block_table(tmp_path: Path) -> None:
    infos, offset = [], 0
    for t, (block, nbytes) in BLOCK_LAYOUT.items():
        infos.append(ginfo(f"t{int(t)}", [block * 2, 3], int(t), offset))
        offset += -(-6 * nbytes // 32) * 32
    with GGUFFile(write(tmp_path, build([], infos, b"\0" * offset))) as f:
        for t, (block, nbytes) in BLOCK_LAYOUT.items():
            x = f.tensors[f"t{int(t)}"]
            assert (x.type, x.shape, x.n_elements, x.n_bytes) == (t, (3, block * 2), 6 * block, 6 * nbytes)
            assert x.rows().shape == (3, 2 * nbytes)


# --- fuzz: any damage is a clean GGUFError or a valid load ----------------------------------------------


def load_or_gguf_error(path: Path) -> None:
    try:
        f = GGUFFile(path)
    except GGUFError as e:
        msg = str(e)
        assert str(path) in msg and "\n" not in msg
        assert "malformed GGUF file (" not in msg, msg
        return
    for t in f.tensors.values():  # whatever loaded is inside the file
        assert f.data_offset <= t.offset and t.offset + t.n_bytes <= f.file_size
        assert len(t.data) == t.n_bytes
    f.close()


@pytest.mark.slow
def test_fuzz_every_truncation(tmp_path: Path) -> None:
    raw = tiny_file_bytes()
    path = tmp_path / "cut.gguf"
    last_tensor_end = len(raw) - 30  # the file ends in 30 bytes of padding
    for cut in range(len(raw)):
        path.write_bytes(raw[:cut])
        if cut < last_tensor_end:
            with pytest.raises(GGUFError):
                GGUFFile(path)
        else:
            GGUFFile(path).close()
        load_or_gguf_error(path)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
@pytest.mark.slow
def test_fuzz_byte_flips(tmp_path: Path, data: st.DataObject) -> None:
    raw = bytearray(tiny_file_bytes())
    flips = data.draw(
        st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)), min_size=1, max_size=4)
    )
    for i, b in flips:
        raw[i] = b
    path = tmp_path / "flip.gguf"
    path.write_bytes(bytes(raw))
    load_or_gguf_error(path)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzz_token_array_flips(tmp_path: Path, data: st.DataObject) -> None:
    # Damage inside a long string array, where the vectorized path runs.
    raw = bytearray(build([gkv("tok", 9, [f"w{i}" for i in range(300)], 8), gkv("z", 4, 1)], []))
    flips = data.draw(
        st.lists(st.tuples(st.integers(24, len(raw) - 1), st.integers(0, 255)), min_size=1, max_size=3)
    )
    for i, b in flips:
        raw[i] = b
    path = tmp_path / "tokflip.gguf"
    path.write_bytes(bytes(raw))
    load_or_gguf_error(path)


# --- the real models against gguf.GGUFReader ------------------------------------------------------------


def smollm2_path() -> Path | None:
    from tests.conftest import find_smollm2

    return find_smollm2()


def gemma_path() -> Path | None:
    from tests.conftest import find_gemma3

    return find_gemma3()


def compare_with_gguf_reader(f: GGUFFile, reader: gguf.GGUFReader) -> None:
    fields = {k: v for k, v in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(f.metadata) == list(fields)
    for key, field in fields.items():
        ours = f.metadata[key]
        main = field.types[0]
        if main == VT.ARRAY and field.types[-1] == VT.STRING and len(field.types) == 2:
            assert ours == field.contents(), key
        elif main == VT.ARRAY and len(field.types) == 2:
            assert isinstance(ours, np.ndarray), key
            theirs = np.concatenate([field.parts[i] for i in field.data]) if field.data else np.array([])
            assert ours.dtype == theirs.dtype or len(theirs) == 0, key
            np.testing.assert_array_equal(ours, theirs, err_msg=key)
        elif main == VT.ARRAY:
            assert isinstance(ours, list), key  # nested: GGUFReader flattens them, we keep the structure
        else:
            assert ours == field.contents(), key
    assert len(f.tensors) == len(reader.tensors)
    for t, rt in zip(f.tensors.values(), reader.tensors, strict=True):
        assert t.name == rt.name
        assert t.type == int(rt.tensor_type), t.name
        assert t.shape == tuple(int(x) for x in reversed(rt.shape)), t.name
        assert (t.n_elements, t.n_bytes, t.offset) == (rt.n_elements, rt.n_bytes, rt.data_offset), t.name
        assert np.array_equal(t.data, rt.data.reshape(-1).view(np.uint8)), t.name


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_against_gguf_reader() -> None:
    path = smollm2_path()
    if path is None:
        pytest.skip("the default model is not installed (make model)")
    with GGUFFile(path) as f:
        assert f.get("general.architecture") == "llama"
        assert len(f.metadata["tokenizer.ggml.tokens"]) == 49152
        assert f.metadata["tokenizer.ggml.tokens"][:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        assert f.metadata["tokenizer.ggml.merges"][0] == "Ġ t"
        assert f.metadata["tokenizer.ggml.token_type"].dtype == np.int32
        emb = f.tensors["token_embd.weight"]
        assert (emb.type, emb.shape) == (GGMLType.Q8_0, (49152, 576))
        assert emb.rows().shape == (49152, 576 // 32 * 34)
        assert len(f.tensors) == 272
        compare_with_gguf_reader(f, gguf.GGUFReader(path))


@pytest.mark.model
def test_smollm2_string_paths_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    path = smollm2_path()
    if path is None:
        pytest.skip("the default model is not installed (make model)")
    with GGUFFile(path) as fast:
        monkeypatch.setattr(gguf_module, "_STRING_ARRAY_FAST_MIN", 10**9)
        with GGUFFile(path) as slow:
            for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
                assert fast.metadata[key] == slow.metadata[key]


@pytest.mark.model
def test_gemma_metadata() -> None:
    path = gemma_path()
    if path is None:
        pytest.skip("Gemma 3 270M not installed (make models)")
    with GGUFFile(path) as f:
        assert f.get("general.architecture") == "gemma3"
        tokens = f.metadata["tokenizer.ggml.tokens"]
        assert len(tokens) == 262144 and tokens[:4] == ["<pad>", "<eos>", "<bos>", "<unk>"]
        assert f.metadata["tokenizer.ggml.scores"].dtype == np.float32
        assert len(f.tensors) == 236
        emb = f.tensors["token_embd.weight"]
        assert (emb.type, emb.shape) == (GGMLType.Q8_0, (262144, 640))


@pytest.mark.model
@pytest.mark.slow
def test_gemma_against_gguf_reader() -> None:
    path = gemma_path()
    if path is None:
        pytest.skip("Gemma 3 270M not installed (make models)")
    with GGUFFile(path) as f:
        compare_with_gguf_reader(f, gguf.GGUFReader(path))
