"""Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K weights repacked at load into 8-row tiles (kernels/repack.pyx, model/repack.py,
matmul512_x8.pxi).

The tiles must give the very bits the stored rows give, on every path (decode, few tokens, prompt chunks)
and thread count, in a kernel call and in a whole model; the layout is checked byte for byte against a
numpy statement of it; what is not a product's weight (token embeddings) stays as stored. (Expert stacks:
tests/test_moe.py's test_repacked_experts_give_the_stored_bits.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from llamacy.engine import Llama
from llamacy.kernels import matmul as mm
from llamacy.kernels import quantize as qz
from llamacy.kernels import repack as rp
from llamacy.model import Model
from llamacy.model.repack import (
    LAYOUT_Q4_0_X8,
    LAYOUT_Q4_1_X8,
    LAYOUT_Q4_K_X8,
    LAYOUT_Q5_0_X8,
    LAYOUT_Q5_K_X8,
    LAYOUT_Q6_K_X8,
    LAYOUT_Q8_0_X8,
    LAYOUT_STORED,
    repack_enabled,
)

needs_tiles = pytest.mark.skipif(not mm.tiles_available(), reason="every tile layout needs AVX-512 VNNI")
needs_q4_0_tiles = pytest.mark.skipif(
    not mm.layout_available(LAYOUT_Q4_0_X8), reason="no kernel reads Q4_0 tiles here (a portable build)"
)
LAYOUT = {
    QT.Q4_0: LAYOUT_Q4_0_X8,
    QT.Q4_1: LAYOUT_Q4_1_X8,
    QT.Q4_K: LAYOUT_Q4_K_X8,
    QT.Q8_0: LAYOUT_Q8_0_X8,
    QT.Q6_K: LAYOUT_Q6_K_X8,
    QT.Q5_0: LAYOUT_Q5_0_X8,
    QT.Q5_K: LAYOUT_Q5_K_X8,
}


def need_layout(wtype: QT) -> None:
    """Skip where no kernel reads this type's tiles: every type's where the AVX-512 VNNI kernels are on,
    Q4_0's, Q8_0's, Q4_K's and Q6_K's on any AVX2 build (mm_avx2_x8.pxi, mm_avx2_kx8.pxi)."""
    if not mm.layout_available(LAYOUT[wtype]):
        pytest.skip(f"no kernel reads {wtype.name} tiles here")


TYPES = pytest.mark.parametrize(
    "wtype", [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q8_0, QT.Q6_K], ids=lambda t: t.name
)


def _quantized(wtype: QT, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    return qz.quantize(int(wtype), w)


def _q4_0_tiles(raw: np.ndarray, rows: int, cols: int, has_min: bool = False) -> np.ndarray:
    """Q4_0's layout as stated in matmul512_x8.pxi: per 8 rows and block, the 8 fp16 scales (Q4_1: then the
    8 fp16 mins), then for each 4-byte group g of the quants the 8 rows' bytes 4g..4g+3 side by side."""
    nb = cols // 32
    head = 4 if has_min else 2
    blocks = raw.reshape(rows // 8, 8, nb, head + 16)
    heads = [
        blocks[:, :, :, h : h + 2].transpose(0, 2, 1, 3).reshape(rows // 8, nb, 16) for h in range(0, head, 2)
    ]
    quants = blocks[:, :, :, head:].reshape(rows // 8, 8, nb, 4, 4).transpose(0, 2, 3, 1, 4)
    return np.concatenate([*heads, quants.reshape(rows // 8, nb, 128)], axis=2).reshape(-1)


def _q8_0_tiles(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q8_0's layout as stated in matmul512_x8.pxi (x8rec_q8): per 8 rows and block, the 8 fp16 scales, then
    for each 4-byte group g of the quants the 8 rows' bytes 4g..4g+3 side by side, each xor 0x80 (q + 128)."""
    nb = cols // 32
    blocks = raw.reshape(rows // 8, 8, nb, 34)
    scales = blocks[:, :, :, 0:2].transpose(0, 2, 1, 3).reshape(rows // 8, nb, 16)
    quants = (blocks[:, :, :, 2:] ^ 0x80).reshape(rows // 8, 8, nb, 8, 4).transpose(0, 2, 3, 1, 4)
    return np.concatenate([scales, quants.reshape(rows // 8, nb, 256)], axis=2).reshape(-1)


def _q5_0_tiles(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q5_0's layout as stated in matmul512_x8.pxi (x8rec_q5): per 8 rows and block, the 8 fp16 scales; then
    h[g] for g < 8, 32 bits: bit 4r+i is bit 4g+i of row r's qh; then the nibbles as Q4_0's."""
    nb = cols // 32
    blocks = raw.reshape(rows // 8, 8, nb, 22).transpose(0, 2, 1, 3)  # [tile, block, row, bytes]
    qh = blocks[..., 2:6].copy().view("<u4")[..., 0].astype(np.uint64)  # [tile, block, row]
    g = np.arange(8, dtype=np.uint64)
    nib = (qh[..., None, :] >> (4 * g)[:, None]) & 0xF  # [tile, block, g, row]
    h = (nib << (4 * np.arange(8, dtype=np.uint64))).sum(axis=-1).astype("<u4")  # [tile, block, g]
    quants = blocks[..., 6:].reshape(rows // 8, nb, 8, 4, 4).transpose(0, 1, 3, 2, 4)
    parts = [
        blocks[..., 0:2].reshape(rows // 8, nb, 16),
        h.view(np.uint8).reshape(rows // 8, nb, 32),
        quants.reshape(rows // 8, nb, 128),
    ]
    return np.concatenate(parts, axis=2).reshape(-1)


def _scales_mins_k4(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., 12] packed bytes -> ([..., 8] scales, [..., 8] mins): ggml's get_scale_min_k4."""
    q = q.astype(np.uint16)
    sc = np.concatenate([q[..., 0:4] & 63, (q[..., 8:12] & 0xF) | ((q[..., 0:4] >> 6) << 4)], axis=-1)
    mn = np.concatenate([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)], axis=-1)
    return sc.astype(np.uint8), mn.astype(np.uint8)


def _q4_k_tiles(raw: np.ndarray, rows: int, cols: int, q5: bool = False) -> np.ndarray:
    """Q4_K's layout as stated in matmul512_x8.pxi (kx8rec): per 8 rows and super-block, q[k][g] = the 8
    rows' qs bytes 32k+4g..32k+4g+3 side by side; sc[j][r]; mn[k] = (min 2k, min 2k+1) per row; d; dmin.
    Q5_K's (kx8rec5, q5): the same from its blocks, then h[k][half][g], 32 bits: bit 4r+i is bit 2k+half of
    row r's qh byte 4g+i."""
    nb = cols // 256
    size, qs = (176, 48) if q5 else (144, 16)
    blocks = raw.reshape(rows // 8, 8, nb, size).transpose(0, 2, 1, 3)  # [tile, block, row, bytes]
    q = blocks[..., qs:].reshape(rows // 8, nb, 8, 4, 8, 4).transpose(0, 1, 3, 4, 2, 5)
    sc, mn = _scales_mins_k4(blocks[..., 4:16])  # [tile, block, row, 8]
    mn_pairs = mn.reshape(rows // 8, nb, 8, 4, 2).transpose(0, 1, 3, 2, 4)
    parts = [
        q.reshape(rows // 8, nb, 1024),
        sc.transpose(0, 1, 3, 2).reshape(rows // 8, nb, 64),
        mn_pairs.reshape(rows // 8, nb, 64),
        blocks[..., 0:2].reshape(rows // 8, nb, 16),
        blocks[..., 2:4].reshape(rows // 8, nb, 16),
    ]
    if q5:
        qh = blocks[..., 16:48].reshape(rows // 8, nb, 8, 8, 4).astype(np.uint64)  # [tile, block, row, g, i]
        shift = (4 * np.arange(8, dtype=np.uint64))[:, None, None] + np.arange(
            4, dtype=np.uint64
        )  # [row, 1, i]
        h = np.stack(
            [
                np.stack(
                    [(((qh >> np.uint64(2 * k + half)) & 1) << shift).sum(axis=(2, 4)) for half in (0, 1)], 2
                )
                for k in range(4)
            ],
            2,
        )  # [tile, block, k, half, g]
        parts.append(h.astype("<u4").view(np.uint8).reshape(rows // 8, nb, 256))
    return np.concatenate(parts, axis=2).reshape(-1)


def _q6_k_tiles(raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q6_K's layout as stated in matmul512_x8.pxi (kx8rec6): per 8 rows and super-block, ql[k][g] = the 8
    rows' ql bytes 32k+4g..32k+4g+3 side by side; qh[n][g] likewise for qh; sc[k] = (scale 2k, scale 2k+1)
    per row; d."""
    nb = cols // 256
    blocks = raw.reshape(rows // 8, 8, nb, 210).transpose(0, 2, 1, 3)  # [tile, block, row, bytes]
    ql = blocks[..., 0:128].reshape(rows // 8, nb, 8, 4, 8, 4).transpose(0, 1, 3, 4, 2, 5)
    qh = blocks[..., 128:192].reshape(rows // 8, nb, 8, 2, 8, 4).transpose(0, 1, 3, 4, 2, 5)
    sc = blocks[..., 192:208].reshape(rows // 8, nb, 8, 8, 2).transpose(0, 1, 3, 2, 4)
    parts = [
        ql.reshape(rows // 8, nb, 1024),
        qh.reshape(rows // 8, nb, 512),
        sc.reshape(rows // 8, nb, 128),
        blocks[..., 208:210].reshape(rows // 8, nb, 16),
    ]
    return np.concatenate(parts, axis=2).reshape(-1)


@pytest.mark.parametrize(("rows", "cols"), [(8, 256), (24, 512), (64, 768)])
@TYPES
def test_layout_is_the_stated_one(wtype, rows, cols):
    raw = _quantized(wtype, rows, cols)
    tiles, layout = rp.repack_tiles(int(wtype), raw, rows, cols, 2)
    assert layout == LAYOUT[wtype] == rp.tile_layout(int(wtype), rows, cols)
    if wtype in (QT.Q4_0, QT.Q4_1):
        assert tiles.nbytes == raw.nbytes
        np.testing.assert_array_equal(tiles, _q4_0_tiles(raw, rows, cols, has_min=wtype == QT.Q4_1))
    elif wtype == QT.Q8_0:
        assert tiles.nbytes == raw.nbytes
        np.testing.assert_array_equal(tiles, _q8_0_tiles(raw, rows, cols))
    elif wtype == QT.Q5_0:
        assert tiles.nbytes == raw.nbytes
        np.testing.assert_array_equal(tiles, _q5_0_tiles(raw, rows, cols))
    elif wtype == QT.Q5_K:
        assert tiles.nbytes == rows * cols // 256 * 180
        np.testing.assert_array_equal(tiles, _q4_k_tiles(raw, rows, cols, q5=True))
    elif wtype == QT.Q6_K:
        assert tiles.nbytes == raw.nbytes
        np.testing.assert_array_equal(tiles, _q6_k_tiles(raw, rows, cols))
    else:
        assert tiles.nbytes == rows * cols // 256 * 148
        np.testing.assert_array_equal(tiles, _q4_k_tiles(raw, rows, cols))


def test_shapes_that_do_not_tile_are_refused():
    raw = _quantized(QT.Q4_0, 12, 64)
    assert rp.tile_layout(int(QT.Q4_0), 12, 64) == LAYOUT_STORED
    assert rp.tile_layout(int(QT.Q5_0), 12, 64) == LAYOUT_STORED
    assert rp.tile_layout(int(QT.Q5_1), 16, 64) == LAYOUT_STORED
    assert rp.tile_layout(int(QT.Q8_0), 12, 64) == LAYOUT_STORED
    assert rp.tile_layout(int(QT.Q4_K), 16, 128) == LAYOUT_STORED
    assert rp.tile_layout(int(QT.Q6_K), 16, 128) == LAYOUT_STORED
    with pytest.raises(ValueError, match="does not tile"):
        rp.repack_tiles(int(QT.Q4_0), raw, 12, 64)
    with pytest.raises(ValueError, match="does not tile"):
        rp.repack_tiles(int(QT.Q4_0), raw, 8, 48)
    with pytest.raises(ValueError, match="fewer than"):
        rp.repack_tiles(int(QT.Q4_0), raw[:4], 8, 64)
    with pytest.raises(ValueError, match="fewer than"):
        rp.repack_tiles(int(QT.Q4_K), _quantized(QT.Q4_K, 8, 256)[:7], 8, 256)


@pytest.mark.parametrize(("rows", "cols"), [(8, 256), (48, 512), (256, 1024)])
@TYPES
def test_tiles_give_the_stored_rows_bits(wtype, rows, cols):
    """Every token count either side of the kernel's limits (4-token tiles, the 64-token chunk) and 1 and
    2 threads: bit for bit what the stored rows give through matmul."""
    need_layout(wtype)
    raw = _quantized(wtype, rows, cols, seed=rows)
    tiles, layout = rp.repack_tiles(int(wtype), raw, rows, cols, 1)
    rng = np.random.default_rng(cols)
    for n in (1, 2, 3, 4, 5, 7, 8, 9, 13, 63, 64, 65, 130):
        x = (rng.standard_normal((n, cols)) * rng.uniform(0.1, 10, (n, 1))).astype(np.float32)
        want = mm.matmul_py(raw, int(wtype), x)
        for threads in (1, 2):
            got = mm.matmul_tiled_py(tiles, layout, rows, x, nthreads=threads)
            np.testing.assert_array_equal(got, want, err_msg=f"n={n} threads={threads}")


@pytest.mark.parametrize(("rows", "cols"), [(16, 256), (40, 512), (56, 1024)])
@TYPES
def test_tile_pairs_give_the_single_tiles_bits(wtype, rows, cols):
    """A prompt's products take the tiles two at a time in 512-bit vectors (x16.h); an odd tile out (40 rows,
    and at 2 threads 56) goes alone: on or off, every chunk's tail, the same bits as the stored rows."""
    need_layout(wtype)
    raw = _quantized(wtype, rows, cols, seed=cols)
    tiles, layout = rp.repack_tiles(int(wtype), raw, rows, cols, 1)
    x = np.random.default_rng(rows).standard_normal((197, cols)).astype(np.float32)
    try:
        for n in (65, 66, 67, 128, 197):
            got = {}
            for on in (True, False):
                mm.pairs_set(on)
                for threads in (1, 2):
                    got[on, threads] = mm.matmul_tiled_py(tiles, layout, rows, x[:n], nthreads=threads)
            want = mm.matmul_py(raw, int(wtype), x[:n])
            for key, y in got.items():
                np.testing.assert_array_equal(y, want, err_msg=f"n={n} (pairs, threads)={key}")
    finally:
        mm.pairs_set(True)


@needs_tiles
def test_wide_q5_0_rows_pair_their_tiles():
    """A Q5_0 prompt expands its tiles into lane records a work item at a time, a pair of tiles at least
    even where one tile's records exceed the work item's byte budget (10240 columns: 320 blocks): the
    stored rows' bits, 1 and 2 threads."""
    rows, cols = 32, 10240
    raw = _quantized(QT.Q5_0, rows, cols, seed=5)
    tiles, layout = rp.repack_tiles(int(QT.Q5_0), raw, rows, cols, 1)
    x = np.random.default_rng(6).standard_normal((70, cols)).astype(np.float32)
    want = mm.matmul_py(raw, int(QT.Q5_0), x)
    for threads in (1, 2):
        np.testing.assert_array_equal(mm.matmul_tiled_py(tiles, layout, rows, x, nthreads=threads), want)


@needs_q4_0_tiles
def test_tile_product_checks_its_operands():
    raw = _quantized(QT.Q4_0, 16, 64)
    tiles, layout = rp.repack_tiles(int(QT.Q4_0), raw, 16, 64)
    x = np.ones((2, 64), np.float32)
    with pytest.raises(ValueError, match="tiles"):
        mm.matmul_tiled_py(tiles[:-1], layout, 16, x)
    with pytest.raises(ValueError, match="tiles"):
        mm.matmul_tiled_py(tiles, layout, 12, x)
    with pytest.raises(ValueError, match="tiles"):
        mm.matmul_tiled_py(tiles, LAYOUT_Q4_K_X8, 16, x)
    with pytest.raises(ValueError, match="layout"):
        mm.matmul_tiled_py(tiles, 8, 16, x)


def _layouts(llm) -> dict[str, int]:
    """Each matrix's layout, of a Llama's or a ModelWeights'."""
    weights = getattr(llm, "weights", llm)
    fields = {
        f"{i}.{k}": m.layout
        for i, layer in enumerate(weights.layers)
        for k, m in layer.items()
        if hasattr(m, "layout")
    }
    fields["token_embd"] = weights.fields["token_embd"].layout
    fields["output"] = weights.fields["output"].layout
    return fields


def _deferred_binding(llm) -> tuple:
    """The file of a Llama bound again with every repacking deferred, and a Model over it: what
    Llama(repack="deferred") makes, without the packing its load does while the tokenizer builds."""
    from llamacy.gguf import GGUFFile
    from llamacy.model.weights import WeightBinder

    gguf = GGUFFile(llm.model_path)
    weights = WeightBinder(gguf, llm.config, repack=True, threads=llm.n_threads).bind(defer=True)
    return weights, Model(gguf, 64, llm.n_threads, cfg=llm.config, kv_type="f32", weights=weights)


def test_repack_off_by_environment(monkeypatch):
    monkeypatch.setenv("LLAMACY_REPACK", "0")
    assert not repack_enabled()
    monkeypatch.delenv("LLAMACY_REPACK")
    assert repack_enabled() == mm.any_tiles_available()


@pytest.mark.parametrize(
    ("wtype", "tied"),
    [
        (QT.Q4_0, True),
        (QT.Q4_0, False),
        (QT.Q4_1, False),
        (QT.Q5_0, False),
        (QT.Q4_K, False),
        (QT.Q5_K, False),
        (QT.Q8_0, False),
        (QT.Q6_K, True),
    ],
)
def test_model_gives_the_same_bits_repacked(tiny_model, monkeypatch, wtype, tied):
    """A Q4_0 / Q4_1 / Q5_0 / Q4_K / Q5_K / Q8_0 / Q6_K model loaded repacked and as stored: the same logits bit for bit,
    whole prompt, micro-batches and one token at a time, 1 and 2 threads; its layer matrices and its output
    head are tiles (a tied head too: its own copy), its token embeddings rows."""
    need_layout(wtype)
    wide = {"n_embd": 256, "n_ff": 512, "head_dim": 64} if wtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K) else {}
    path = tiny_model("llama", wtype, tie_embeddings=tied, **wide)
    ids = np.random.default_rng(3).integers(0, 300, 40).tolist()
    monkeypatch.setenv("LLAMACY_REPACK", "0")
    stored = Llama(path, n_threads=1, kv_type="f32")
    want = stored.logits(ids)
    assert set(_layouts(stored).values()) == {LAYOUT_STORED}
    monkeypatch.delenv("LLAMACY_REPACK")
    for threads, n_batch in ((1, 512), (2, 512), (1, 7), (2, 1)):
        llm = Llama(path, n_threads=threads, n_batch=n_batch, kv_type="f32", repack="load")
        np.testing.assert_array_equal(llm.logits(ids), want, err_msg=f"threads={threads} n_batch={n_batch}")
    layouts = _layouts(llm)
    assert layouts.pop("token_embd") == LAYOUT_STORED
    layouts.pop("output")
    assert set(layouts.values()) == {LAYOUT[wtype]}
    output = llm.weights.fields["output"]
    assert output.layout == LAYOUT[wtype]


def _greedy_logits(model, prompt: list[int], steps: int) -> list[np.ndarray]:
    out = [model.eval(prompt)]
    for _ in range(steps):
        out.append(model.eval([int(np.argmax(out[-1]))]))
    return out


@pytest.mark.parametrize(
    ("wtype", "share"),
    [
        (QT.Q4_0, 0.0),
        (QT.Q5_0, 0.0),
        (QT.Q8_0, 0.0),
        (QT.Q4_K, 0.0),
        (QT.Q5_K, 0.0),
        (QT.Q6_K, 0.0),
        (QT.Q8_0, 1.0),
    ],
)
def test_deferred_repack_gives_the_load_time_bits(tiny_model, monkeypatch, wtype, share):
    """Repacked between evaluations (the default): the prompt runs on the stored rows with nothing packed,
    later steps swap matrices in (share 0: one a step; 1: as long as the last step took), and every step's
    logits are the bits of a model repacked at load; at the end every matrix is a tile, as at load."""
    need_layout(wtype)
    monkeypatch.setattr(Model, "REPACK_SHARE", share)
    wide = {"n_embd": 256, "n_ff": 512, "head_dim": 64} if wtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K) else {}
    path = tiny_model("llama", wtype, tie_embeddings=False, **wide)
    prompt = np.random.default_rng(5).integers(0, 300, 24).tolist()
    at_load = Llama(path, n_threads=2, kv_type="f32", repack="load")
    want = _greedy_logits(at_load.new_model(64, 2), prompt, 40)
    weights, model = _deferred_binding(at_load)
    deferred = weights.deferred
    assert deferred is not None and not deferred.done
    first = model.eval(prompt)
    assert deferred.generation == 0  # the first token is not kept waiting
    assert set(_layouts(weights).values()) == {LAYOUT_STORED}
    np.testing.assert_array_equal(first, want[0])
    seen = set()
    for step in range(len(want) - 1):
        got = model.eval([int(np.argmax(want[step]))])
        np.testing.assert_array_equal(got, want[step + 1], err_msg=f"step {step}")
        seen.add(deferred.generation)
    assert deferred.done
    if share == 0.0:  # one matrix a step: 7 in each of the layers, and the head
        assert sorted(seen)[:3] == [1, 2, 3] and len(seen) == 7 * at_load.config.n_layer + 1
    assert _layouts(weights) == _layouts(at_load)
    assert set(_layouts(weights).values()) == {LAYOUT_STORED, LAYOUT[wtype]}


@needs_tiles
def test_deferred_repack_order_and_stop(tiny_model):
    """The layers are packed in order and the output head last; a set stop packs nothing more."""
    import threading

    llm = Llama(tiny_model("llama", QT.Q8_0, tie_embeddings=False), n_threads=1, kv_type="f32", repack="load")
    weights, _ = _deferred_binding(llm)
    stop = threading.Event()
    stop.set()
    assert weights.deferred.advance(float("inf"), stop=stop) and weights.deferred.generation == 0
    n = 7 * llm.config.n_layer + 1
    for k in range(1, n + 1):
        weights.deferred.advance(0.0)
        layouts = _layouts(weights)
        assert (layouts["output"] == LAYOUT_Q8_0_X8) == (k == n), k
        assert layouts["0.wq"] == LAYOUT_Q8_0_X8
    assert weights.deferred.done and not weights.deferred.advance(0.0)


@needs_q4_0_tiles
def test_load_packs_while_the_tokenizer_builds(tiny_model, monkeypatch):
    """A deferred load packs while its tokenizer is built and stops when that is ready: with a tokenizer
    that takes long enough, a tiny model is all tiles by the end of the load; a model's first evaluation
    packs nothing more."""
    from llamacy.tokenizer import Tokenizer

    build = Tokenizer.from_metadata

    def slow(*args, **kwargs):
        time.sleep(0.5)
        return build(*args, **kwargs)

    path = tiny_model("llama", QT.Q4_0, tie_embeddings=False)
    monkeypatch.setattr(Tokenizer, "from_metadata", slow)
    llm = Llama(path, n_threads=2, kv_type="f32")
    assert llm.weights.deferred.done
    assert _layouts(llm) == _layouts(Llama(path, n_threads=2, kv_type="f32", repack="load"))
    monkeypatch.setattr(Tokenizer, "from_metadata", build)
    llm = Llama(path, n_threads=2, kv_type="f32")
    packed = llm.weights.deferred.generation
    llm.logits([3, 4, 5])
    assert llm.weights.deferred.generation == packed


@needs_q4_0_tiles
def test_deferred_repack_rebinds_every_model(tiny_model):
    """Models over one deferred binding: one packs, another built before then picks the swapped matrices up
    at its next evaluation and gives the same bits as the first."""
    path = tiny_model("llama", QT.Q4_0)
    prompt = list(range(3, 19))
    weights, a = _deferred_binding(Llama(path, n_threads=1, kv_type="f32", repack="load"))
    b = Model(a.gguf, 64, 1, cfg=a.cfg, kv_type="f32", weights=weights)
    a.eval(prompt)
    weights.deferred.finish()
    assert weights.deferred.done
    want = a.eval([7])  # a rebinds: tiles from here
    assert a._bound_generation == weights.deferred.generation
    assert b._bound_generation == 0
    np.testing.assert_array_equal(b.eval([*prompt, 7]), want)
    assert b._bound_generation == weights.deferred.generation


def test_repack_mode_is_checked(tiny_model):
    from llamacy.errors import UsageError

    with pytest.raises(UsageError, match="repack must be"):
        Llama(tiny_model("llama", QT.Q4_0), n_threads=1, repack="later")


@needs_q4_0_tiles
def test_repack_mode_follows_the_environment(tiny_model, monkeypatch):
    """Deferred by default; LLAMACY_REPACK=load repacks at load, =0 never; profiling repacks at load."""
    path = tiny_model("llama", QT.Q4_0)
    assert Llama(path, n_threads=1).weights.deferred is not None
    assert Llama(path, n_threads=1, profile=True).weights.deferred is None
    monkeypatch.setenv("LLAMACY_REPACK", "load")
    llm = Llama(path, n_threads=1)
    assert llm.weights.deferred is None and llm.weights.layers[0]["wq"].layout == LAYOUT_Q4_0_X8
    monkeypatch.setenv("LLAMACY_REPACK", "0")
    llm = Llama(path, n_threads=1)
    assert llm.weights.deferred is None and llm.weights.layers[0]["wq"].layout == LAYOUT_STORED


@needs_q4_0_tiles
def test_models_over_one_file_share_the_tiles(tiny_model):
    """Two Llama objects over one file hold one copy of each repacked matrix, as they share page cache."""
    path = tiny_model("llama", QT.Q4_0)
    a, b = Llama(path, n_threads=1, repack="load"), Llama(path, n_threads=1, repack="load")
    wq_a, wq_b = a.weights.layers[0]["wq"], b.weights.layers[0]["wq"]
    assert wq_a.layout == wq_b.layout == LAYOUT_Q4_0_X8
    assert wq_a.data is wq_b.data


def test_repack_many_is_repack_tiles_matrix_by_matrix(tmp_path):
    """One pass over several matrices of every tiled type, one of them larger than a work item (so cut
    into pieces), gives each matrix's own tiles; with release, the file's pages it gave back read the same
    when read again."""
    shapes = [
        (QT.Q4_0, 8, 64),
        (QT.Q4_1, 24, 96),
        (QT.Q4_K, 16, 512),
        (QT.Q4_1, 2056, 2048),
        (QT.Q4_0, 64, 32),
        (QT.Q8_0, 1032, 1024),
        (QT.Q5_0, 40, 160),
        (QT.Q6_K, 16, 256),
        (QT.Q5_K, 24, 512),
    ]
    raws = [_quantized(w, r, c, seed=i) for i, (w, r, c) in enumerate(shapes)]
    assert raws[3].nbytes > 2 * 2**20  # three pieces
    path = tmp_path / "rows.bin"
    path.write_bytes(b"".join(r.tobytes() for r in raws))
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    views, at = [], 0
    for r in raws:
        views.append(mapped[at : at + r.nbytes])
        at += r.nbytes
    for threads in (1, 2):
        got = rp.repack_many(
            [(int(w), v, r, c, True) for (w, r, c), v in zip(shapes, views, strict=True)], threads
        )
        for (w, r, c), raw, (tiles, layout) in zip(shapes, raws, got, strict=True):
            want, want_layout = rp.repack_tiles(int(w), raw, r, c, 1)
            assert layout == want_layout == LAYOUT[w]
            np.testing.assert_array_equal(tiles, want)
        np.testing.assert_array_equal(np.asarray(mapped), np.concatenate([r.reshape(-1) for r in raws]))
    assert rp.repack_many([], 2) == []
    with pytest.raises(ValueError, match="does not tile"):  # checked before any work
        rp.repack_many([(int(QT.Q4_0), raws[0], 8, 64, False), (int(QT.Q5_1), raws[0], 8, 64, False)])


def _vma_flags(addr: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds addr (Linux's /proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_tile_arena_is_one_block_on_huge_pages():
    """The arena's views: in order, 64-byte aligned, not overlapping, the first on a 2 MiB boundary, and
    the block advised for transparent huge pages (VmFlags "hg"); repack_many fills given destinations
    with the tiles it would have made, and refuses ones of the wrong size."""
    sizes = [3 * 2**20 + 5, 221184, 0, 64, 7 * 2**20]
    from numpy._core import multiarray

    was = multiarray._set_madvise_hugepage(False)  # numpy's own advice for large arrays would hide ours
    try:
        views = rp.arena(sizes)
    finally:
        multiarray._set_madvise_hugepage(was)
    assert [v.nbytes for v in views] == sizes and all(v.dtype == np.uint8 for v in views)
    del views[2]  # an empty view's address means nothing
    addrs = [v.ctypes.data for v in views]
    sizes = [v.nbytes for v in views]
    assert addrs[0] % (2 << 20) == 0 and all(a % 64 == 0 for a in addrs)
    assert all(a + s <= b for a, s, b in zip(addrs, sizes, addrs[1:], strict=False))
    if sys.platform == "linux":
        assert "hg" in _vma_flags(addrs[0]) and "hg" in _vma_flags(addrs[-1] + sizes[-1] - 1)
    shapes = [(QT.Q4_K, 16, 512), (QT.Q6_K, 8, 256), (QT.Q8_0, 24, 64)]
    raws = [_quantized(w, r, c, seed=i) for i, (w, r, c) in enumerate(shapes)]
    items = [(int(w), raw, r, c, False) for (w, r, c), raw in zip(shapes, raws, strict=True)]
    dst = rp.arena([rp.tiled_bytes(int(w), r, c) for w, r, c in shapes])
    got = rp.repack_many(items, 2, dst)
    for (w, r, c), raw, d, (tiles, layout) in zip(shapes, raws, dst, got, strict=True):
        assert tiles is d and layout == LAYOUT[w]
        np.testing.assert_array_equal(tiles, rp.repack_tiles(int(w), raw, r, c, 1)[0])
    assert rp.tiled_bytes(int(QT.Q5_0), 8, 64) == 8 * 2 * 22
    assert rp.tiled_bytes(int(QT.Q5_1), 8, 64) == 0
    with pytest.raises(ValueError, match="do not match"):
        rp.repack_many(items, 1, [dst[0], dst[1], dst[1]])


@needs_tiles
def test_load_leaves_no_thread_behind(tiny_model):
    """A repacking load binds the weights on a thread while the tokenizer builds: joined by the time the
    model is returned."""
    import threading

    Llama(tiny_model("llama", QT.Q4_1), n_threads=2, repack="load")
    assert not [t for t in threading.enumerate() if t.name == "llamacy-load"]


@needs_tiles
@pytest.mark.parametrize(
    "wtype", [QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q4_K, QT.Q5_K, QT.Q6_K], ids=lambda t: t.name
)
def test_prefetch_modes_give_the_same_bits(wtype):
    """Decode's prefetch (the next-tile walk, or each stream a distance ahead, which past a short row's end
    requests the next tile's row) changes only the speed: as stored and as tiles, 1 and 2 threads, rows
    both shorter and longer than the distance, the same bits as the oracle-checked default."""
    before = mm.PREFETCH
    try:
        for rows, cols in ((24, 256), (40, 2560)):
            raw = _quantized(wtype, rows, cols, seed=cols)
            tiled = rp.repack_tiles(int(wtype), raw, rows, cols, 1) if wtype in LAYOUT else None
            x = np.random.default_rng(rows).standard_normal((3, cols)).astype(np.float32)
            got = {}
            for mode in ("tile", "stream"):
                mm.prefetch_set(mode)
                assert mode == mm.PREFETCH
                for n in (1, 3):
                    for threads in (1, 2):
                        got[mode, n, threads, "stored"] = mm.matmul_py(
                            raw, int(wtype), x[:n], nthreads=threads
                        )
                        if tiled is not None:
                            got[mode, n, threads, "tiles"] = mm.matmul_tiled_py(
                                *tiled, rows, x[:n], nthreads=threads
                            )
            for (mode, n, threads, kind), y in got.items():
                np.testing.assert_array_equal(
                    y, got["tile", n, 1, "stored"], err_msg=f"{mode} {kind} {threads}"
                )
    finally:
        mm.prefetch_set(before)
    with pytest.raises(ValueError, match="prefetch mode"):
        mm.prefetch_set("far")


def test_prefetch_follows_the_environment():
    for env, want in (("tile", "tile"), ("stream", "stream" if mm.vnni_available() else "tile")):
        out = subprocess.run(
            [sys.executable, "-c", "from llamacy.kernels import matmul; print(matmul.PREFETCH)"],
            env={**os.environ, "LLAMACY_PREFETCH": env},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == want
