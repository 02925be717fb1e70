"""Q4_0 weights repacked at load into 8-row tiles (kernels/repack.pyx, model/repack.py, matmul512_x8.pxi).

The tiles must give the very bits the stored rows give, on every path (decode, few tokens, prompt chunks)
and thread count, in a kernel call and in a whole model; the layout is checked byte for byte against a
numpy statement of it; what is not a product's weight (token embeddings, expert stacks) stays as stored.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from llamacy.engine import Llama
from llamacy.kernels import matmul as mm
from llamacy.kernels import quantize as qz
from llamacy.kernels import repack as rp
from llamacy.model.repack import LAYOUT_Q4_0_X8, LAYOUT_STORED, repack_enabled

needs_x8 = pytest.mark.skipif(not mm.x8_available(), reason="8-row Q4_0 tiles need AVX-512 VNNI")


def _q4_0(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    return qz.quantize(int(QT.Q4_0), w)


def _tiles_numpy(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """The layout as stated in matmul512_x8.pxi: per 8 rows and block, the 8 fp16 scales, then for each
    4-byte group g of the quants the 8 rows' bytes 4g..4g+3 side by side."""
    nb = cols // 32
    blocks = raw.reshape(rows // 8, 8, nb, 18)
    scales = blocks[:, :, :, :2].transpose(0, 2, 1, 3).reshape(rows // 8, nb, 16)
    quants = blocks[:, :, :, 2:].reshape(rows // 8, 8, nb, 4, 4).transpose(0, 2, 3, 1, 4)
    return np.concatenate([scales, quants.reshape(rows // 8, nb, 128)], axis=2).reshape(-1)


@pytest.mark.parametrize(("rows", "cols"), [(8, 32), (24, 96), (64, 256)])
def test_layout_is_the_stated_one(rows, cols):
    raw = _q4_0(rows, cols)
    tiles = rp.repack_q4_0_x8(raw, rows, cols, 2)
    assert tiles.nbytes == raw.nbytes
    np.testing.assert_array_equal(tiles, _tiles_numpy(raw, rows, cols))


def test_shapes_that_do_not_tile_are_refused():
    raw = _q4_0(12, 64)
    assert not rp.q4_0_x8_fits(12, 64)
    with pytest.raises(ValueError, match="does not tile"):
        rp.repack_q4_0_x8(raw, 12, 64)
    with pytest.raises(ValueError, match="does not tile"):
        rp.repack_q4_0_x8(raw, 8, 48)
    with pytest.raises(ValueError, match="fewer than"):
        rp.repack_q4_0_x8(raw[:4], 8, 64)


@needs_x8
@pytest.mark.parametrize(("rows", "cols"), [(8, 32), (48, 96), (256, 512)])
def test_tiles_give_the_stored_rows_bits(rows, cols):
    """Every token count either side of the kernel's limits (4-token tiles, the 64-token chunk) and 1 and
    2 threads: bit for bit what the stored rows give through matmul."""
    raw = _q4_0(rows, cols, seed=rows)
    tiles = rp.repack_q4_0_x8(raw, rows, cols, 1)
    rng = np.random.default_rng(cols)
    for n in (1, 2, 3, 4, 5, 7, 8, 9, 13, 63, 64, 65, 130):
        x = (rng.standard_normal((n, cols)) * rng.uniform(0.1, 10, (n, 1))).astype(np.float32)
        want = mm.matmul_py(raw, int(QT.Q4_0), x)
        for threads in (1, 2):
            got = mm.matmul_q4_0_x8_py(tiles, rows, x, nthreads=threads)
            np.testing.assert_array_equal(got, want, err_msg=f"n={n} threads={threads}")


@needs_x8
def test_tile_product_checks_its_operands():
    raw = _q4_0(16, 64)
    tiles = rp.repack_q4_0_x8(raw, 16, 64)
    x = np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match="tiles"):
        mm.matmul_q4_0_x8_py(tiles[:-1], 16, x)
    with pytest.raises(ValueError, match="tiles"):
        mm.matmul_q4_0_x8_py(tiles, 12, x)


def _layouts(llm) -> dict[str, int]:
    fields = {
        f"{i}.{k}": m.layout
        for i, layer in enumerate(llm.weights.layers)
        for k, m in layer.items()
        if hasattr(m, "layout")
    }
    fields["token_embd"] = llm.weights.fields["token_embd"].layout
    return fields


def test_repack_off_by_environment(monkeypatch):
    monkeypatch.setenv("LLAMACY_REPACK", "0")
    assert not repack_enabled()
    monkeypatch.delenv("LLAMACY_REPACK")
    assert repack_enabled() == mm.x8_available()


@needs_x8
@pytest.mark.parametrize("tied", [True, False])
def test_model_gives_the_same_bits_repacked(tiny_model, monkeypatch, tied):
    """A Q4_0 model loaded repacked and as stored: the same logits bit for bit, whole prompt, micro-batches
    and one token at a time, 1 and 2 threads; its layer matrices are tiles, its token embeddings (the head
    too, when tied) rows."""
    path = tiny_model("llama", QT.Q4_0, tie_embeddings=tied)
    ids = np.random.default_rng(3).integers(0, 300, 40).tolist()
    monkeypatch.setenv("LLAMACY_REPACK", "0")
    stored = Llama(path, n_threads=1, kv_type="f32")
    want = stored.logits(ids)
    assert set(_layouts(stored).values()) == {LAYOUT_STORED}
    monkeypatch.delenv("LLAMACY_REPACK")
    for threads, n_batch in ((1, 512), (2, 512), (1, 7), (2, 1)):
        llm = Llama(path, n_threads=threads, n_batch=n_batch, kv_type="f32")
        np.testing.assert_array_equal(llm.logits(ids), want, err_msg=f"threads={threads} n_batch={n_batch}")
    layouts = _layouts(llm)
    assert layouts.pop("token_embd") == LAYOUT_STORED
    assert set(layouts.values()) == {LAYOUT_Q4_0_X8}
    output = llm.weights.fields["output"]
    assert output.layout == (LAYOUT_STORED if tied else LAYOUT_Q4_0_X8)


@needs_x8
def test_models_over_one_file_share_the_tiles(tiny_model):
    """Two Llama objects over one file hold one copy of each repacked matrix, as they share page cache."""
    path = tiny_model("llama", QT.Q4_0)
    a, b = Llama(path, n_threads=1), Llama(path, n_threads=1)
    wq_a, wq_b = a.weights.layers[0]["wq"], b.weights.layers[0]["wq"]
    assert wq_a.layout == wq_b.layout == LAYOUT_Q4_0_X8
    assert wq_a.data is wq_b.data
