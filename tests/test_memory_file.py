"""Memory files (llamacy/model/memory_file.py): a sequence saved and loaded back continues with the very bits
it would have had, for full, sliding-window (ring) and shared layers and every KV type; files of another
model, KV type or version, truncated or corrupt ones are refused in one line and change nothing."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from llamacy.engine import Llama
from llamacy.model import Model
from llamacy.model.memory_file import MemoryFileError, load_memory, model_identity, save_memory


def _model(llm: Llama, n_ctx: int = 200, ubatch: int = 4, kv_type: str = "f32") -> Model:
    return Model(llm.gguf, n_ctx, 1, ubatch=ubatch, cfg=llm.config, kv_type=kv_type, weights=llm.weights)


def _ids(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 200, n)]


def _roundtrip(llm: Llama, tmp_path, kv_type: str, n: int = 60) -> None:
    ids = _ids(n + 20)
    a = _model(llm, kv_type=kv_type)
    a.eval(ids[:n])
    ident = model_identity(llm.gguf)
    f = tmp_path / "m.bin"
    save_memory(f, a.memory, 0, ident, llm.config.arch)
    b = _model(llm, kv_type=kv_type)
    b.eval(_ids(7, seed=9))  # something to be replaced
    got = load_memory(f, b.memory, 0, ident, llm.config.arch)
    assert got.tokens == ids[:n] and b.memory.tokens[0] == ids[:n]
    assert b.memory.high[0] == a.memory.high[0] and b.memory.lowest_cut(0) == a.memory.lowest_cut(0)
    want = a.eval(ids[n:], logits="all")
    assert np.array_equal(b.eval(ids[n:], logits="all"), want)


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0", "q4_0"])
def test_ring_layers_roundtrip_bit_exact(tiny_model, tmp_path, kv_type):
    llm = Llama(tiny_model("gemma3", QT.Q8_0, n_ctx=256), n_ctx=256, n_threads=1)
    _roundtrip(llm, tmp_path, kv_type)


def test_full_layers_roundtrip_and_a_prefix(tiny_model, tmp_path):
    llm = Llama(tiny_model("llama", QT.Q8_0), n_ctx=128, n_threads=1)
    _roundtrip(llm, tmp_path, "f16")
    ids = _ids(50, seed=3)
    a = _model(llm, 128, 16, "f16")
    a.eval(ids)
    ident = model_identity(llm.gguf)
    save_memory(tmp_path / "p.bin", a.memory, 0, ident, llm.config.arch, n_tokens=30)
    b = _model(llm, 128, 16, "f16")
    assert load_memory(tmp_path / "p.bin", b.memory, 0, ident, llm.config.arch).tokens == ids[:30]
    fresh = _model(llm, 128, 16, "f16")
    assert np.array_equal(b.eval(ids[30:], logits="all"), fresh.eval(ids, logits="all")[30:])


def test_shared_layers_roundtrip(tmp_path):
    from tests.hf_gemma4 import write_gemma4_hf_model, write_llama_cpp_gguf

    hf = write_gemma4_hf_model(tmp_path / "hf", seed=1)
    path = write_llama_cpp_gguf(hf, tmp_path / "g4.gguf")
    llm = Llama(path, n_ctx=64, n_threads=1)
    assert any(lm.shared_from >= 0 for lm in _model(llm, 64, 4).memory.layers)
    ids = [int(t) for t in np.random.default_rng(0).integers(0, hf.config["vocab_size"], 40)]
    a = _model(llm, 64, 4)
    a.eval(ids[:30])
    ident = model_identity(llm.gguf)
    save_memory(tmp_path / "s.bin", a.memory, 0, ident, llm.config.arch)
    b = _model(llm, 64, 4)
    load_memory(tmp_path / "s.bin", b.memory, 0, ident, llm.config.arch)
    assert np.array_equal(b.eval(ids[30:], logits="all"), a.eval(ids[30:], logits="all"))


def test_bad_files_are_refused_and_change_nothing(tiny_model, tmp_path):
    llm = Llama(tiny_model("llama", QT.Q8_0), n_ctx=128, n_threads=1)
    other = Llama(tiny_model("llama", QT.Q8_0, seed=5, n_layer=3), n_ctx=128, n_threads=1)
    ident, arch = model_identity(llm.gguf), llm.config.arch
    assert model_identity(other.gguf) != ident
    a = _model(llm, 128, 16)
    a.eval(_ids(40))
    f = tmp_path / "m.bin"
    save_memory(f, a.memory, 0, ident, arch)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # renamed into place
    data = f.read_bytes()
    b = _model(llm, 128, 16)
    b.eval([5, 6, 7])

    def refused(match: str, blob: bytes | None = None, model=None, mem=None) -> None:
        g = tmp_path / "bad.bin"
        g.write_bytes(data if blob is None else blob)
        target = mem or b
        with pytest.raises(MemoryFileError, match=match) as e:
            load_memory(g, target.memory, 0, model or ident, arch)
        assert "\n" not in str(e.value)
        if target is b:
            assert b.memory.tokens[0] == [5, 6, 7]  # nothing half-loaded

    refused("another model", model=model_identity(other.gguf))
    refused("--kv-type f32, not f16", mem=_model(llm, 128, 16, "f16"))
    refused("truncated", data[:-1000])
    refused("too short", data[:10])
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 1
    refused("checksum", bytes(flipped))
    refused("not a llamacy memory file", b"GGUF" + data[4:])
    refused("version 9", data[:8] + (9).to_bytes(4, "little") + data[12:])
    refused("more than the context", mem=_model(llm, 32, 16))
    with pytest.raises(MemoryFileError, match="cannot read"):
        load_memory(tmp_path / "missing.bin", b.memory, 0, ident, arch)


def test_a_ring_restored_into_a_smaller_ring_or_a_full_cache(tiny_model, tmp_path):
    """A file holds the positions its rings held: a larger ring (or a full cache) that would claim more is
    refused; a ring no larger accepts it."""
    llm = Llama(tiny_model("gemma3", QT.Q8_0, n_ctx=256), n_ctx=256, n_threads=1)
    ident, arch = model_identity(llm.gguf), llm.config.arch
    a = _model(llm, 200, 8)
    ids = _ids(70)
    a.eval(ids[:60])
    save_memory(tmp_path / "r.bin", a.memory, 0, ident, arch)
    with pytest.raises(MemoryFileError, match="needs"):
        load_memory(tmp_path / "r.bin", _model(llm, 200, 120).memory, 0, ident, arch)
    small = _model(llm, 200, 4)
    load_memory(tmp_path / "r.bin", small.memory, 0, ident, arch)
    assert np.array_equal(small.eval(ids[60:], logits="all"), a.eval(ids[60:], logits="all"))


def test_hostile_headers_with_a_valid_checksum_are_refused(tiny_model, tmp_path):
    """The checksum finds damage, not malice: a header rewritten (and the checksum recomputed) is still
    checked field by field, and refused in one line with nothing loaded."""
    import hashlib
    import json
    import struct

    llm = Llama(tiny_model("llama", QT.Q8_0), n_ctx=128, n_threads=1)
    ident, arch = model_identity(llm.gguf), llm.config.arch
    a = _model(llm, 128, 16)
    a.eval(_ids(20))
    f = tmp_path / "m.bin"
    save_memory(f, a.memory, 0, ident, arch)
    data = f.read_bytes()
    _, _, head_len = struct.unpack_from("<8sII", data)
    header = json.loads(data[16 : 16 + head_len])
    payload = data[16 + head_len : -32]
    b = _model(llm, 128, 16)
    b.eval([5, 6, 7])

    def forged(**changes) -> None:
        h = json.dumps({**header, **changes}).encode()
        body = data[:8] + struct.pack("<II", 1, len(h)) + h + payload
        g = tmp_path / "forged.bin"
        g.write_bytes(body + hashlib.sha256(body).digest())
        with pytest.raises(MemoryFileError) as e:
            load_memory(g, b.memory, 0, ident, arch)
        assert "\n" not in str(e.value) and b.memory.tokens[0] == [5, 6, 7]

    forged(n_tokens=-5)
    forged(n_tokens=10**9)
    forged(n_tokens=21)
    forged(layers=header["layers"][:-1])
    forged(layers="x")
    forged(layers=[{**header["layers"][0], "count": -3, "first": 23}, *header["layers"][1:]])
    forged(layers=[{**header["layers"][0], "row_bytes": 1}, *header["layers"][1:]])
    forged(high=5)
    forged(model=None)
    forged(kv_type=["f16"])
