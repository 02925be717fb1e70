"""The AMX prefill tiles (matmul512_amx.pxi, amx.h): the same bits as the VNNI kernels, on every path.

The tile unit only makes each block's exact integer sums; the float steps are the VNNI row-lane kernels', so
AMX on and off must agree bit for bit: for every row-lane type, row counts that leave an odd 8-row record or
a partial one, token counts on both sides of 16 (the tile's tokens) and of the 64-token chunks, 1 and 2
threads, the weights as stored and as repacked at load into 8-row tiles, and the numpy statement of the
row-lane chain (test_kernels_512.py's) for the small cases. The dispatch: LLAMACY_NO_AMX=1 turns it off.

Skipped where this CPU, OS or build cannot run the tile unit (matmul.AMX_STATUS says why).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from llamacy.kernels import matmul as mm
from llamacy.kernels import quant
from llamacy.kernels import repack as rp
from tests.test_kernels import KQUANTS, T, make_weights
from tests.test_kernels_512 import ROW_LANE_CHAINS, ROW_LANE_TYPES

pytestmark = pytest.mark.skipif(mm.AMX_STATUS != "available", reason=f"AMX: {mm.AMX_STATUS}")

N_TOK = (15, 16, 17, 33, 64, 67, 131)


@pytest.fixture
def amx_toggle():
    """amx(on) sets the tile unit on or off for the products that follow; on again afterwards."""
    yield mm.amx_set
    mm.amx_set(True)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


def _both(amx, fn, *args, **kw):
    """fn(*args, **kw) with the tile unit off, then on."""
    amx(False)
    off = fn(*args, **kw)
    assert amx(True)
    return off, fn(*args, **kw)


@pytest.mark.parametrize("t", ROW_LANE_TYPES, ids=lambda t: t.name)
def test_amx_gives_the_vnni_bits(t, amx_toggle):
    rng = np.random.default_rng(70 + int(t))
    shapes = ((16, 512), (24, 256), (37, 768)) if t in KQUANTS else ((16, 64), (24, 96), (37, 1536))
    for rows, cols in shapes:
        data = make_weights(t, rows, cols, rng)
        for n in N_TOK:
            x = rng.standard_normal((n, cols)).astype(np.float32)
            for threads in (1, 2):
                off, on = _both(amx_toggle, mm.matmul_py, data, int(t), x, nthreads=threads, impl="vnni")
                assert np.array_equal(_bits(on), _bits(off)), (rows, cols, n, threads)
            if rows * n <= 24 * 33:  # the chain in Python: small cases only
                want = ROW_LANE_CHAINS[t](data, quant.quantize_act(int(t), x), rows, cols, n)
                assert np.array_equal(_bits(on), _bits(want)), (rows, cols, n)


@pytest.mark.parametrize("t", [T.Q8_0, T.Q4_1, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_amx_long_rows(t, amx_toggle):
    """Rows long enough that the VNNI prefill keeps one 8-row record per work item (AMX takes two)."""
    rng = np.random.default_rng(90 + int(t))
    cols = 25600 if t in KQUANTS else 16384
    data = make_weights(t, 33, cols, rng)
    x = rng.standard_normal((40, cols)).astype(np.float32)
    off, on = _both(amx_toggle, mm.matmul_py, data, int(t), x, nthreads=2, impl="vnni")
    assert np.array_equal(_bits(on), _bits(off))


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [16, 24, 40])
def test_amx_on_tiles_repacked_at_load(t, rows, amx_toggle):
    """Weights repacked into 8-row tiles (an odd number of tiles too): the stored rows' bits, AMX on or off."""
    rng = np.random.default_rng(rows + int(t))
    cols = 512 if t in KQUANTS else 256
    data = make_weights(t, rows, cols, rng)
    tiles, layout = rp.repack_tiles(int(t), data, rows, cols, 1)
    for n in (16, 17, 64, 100):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        stored = mm.matmul_py(data, int(t), x, impl="vnni")
        for threads in (1, 2):
            off, on = _both(amx_toggle, mm.matmul_tiled_py, tiles, layout, rows, x, nthreads=threads)
            assert np.array_equal(_bits(on), _bits(stored)), (n, threads)
            assert np.array_equal(_bits(off), _bits(stored)), (n, threads)


def _extreme_case(t, data, rows, cols, amx):
    """Stored and tiled, 17 and 33 tokens at activation quants of magnitude 127: AMX on = off = the chain."""
    tiles, layout = rp.repack_tiles(int(t), data, rows, cols, 1)
    for n in (17, 33):
        x = np.ones((n, cols), np.float32)
        x[0] = -1.0
        x[1::3, ::2] = -1.0
        x[2::3, 1::3] = -1.0
        want = ROW_LANE_CHAINS[t](data, quant.quantize_act(int(t), x), rows, cols, n)
        for threads in (1, 2):
            off, on = _both(amx, mm.matmul_py, data, int(t), x, nthreads=threads, impl="vnni")
            assert np.array_equal(_bits(off), _bits(want)), (n, threads)
            assert np.array_equal(_bits(on), _bits(want)), (n, threads)
            on = mm.matmul_tiled_py(tiles, layout, rows, x, nthreads=threads)
            assert np.array_equal(_bits(on), _bits(want)), (n, threads)


def test_amx_q4_k_scaled_tiles_at_the_extremes(amx_toggle):
    """Q4_K's tiles fold each sub-block scale into the quants in two parts below 8 (amx.h, lc_k4amxrec): with
    every nibble 15 and every scale and min 63 the parts reach 7 x 15 = 105 and the super-block's sums their
    largest magnitude; every integer must stay exact."""
    rows, cols = 16, 512
    data = make_weights(T.Q4_K, rows, cols, np.random.default_rng(5)).reshape(rows, cols // 256, 144)
    data[:, :, 4:16] = 0xFF  # scales and mins 63
    data[:8, :, 16:] = 0xFF  # nibbles 15
    data[9, :, 16:] = 0x00
    _extreme_case(T.Q4_K, data.reshape(rows, -1), rows, cols, amx_toggle)


def test_amx_q5_k_scaled_tiles_at_the_extremes(amx_toggle):
    """Q5_K's tiles fold each sub-block scale into the quants by its base-4 digits (amx.h, lc_k3amxrec): every
    value 31 and every scale and min 63 make the largest products (3 x 31) and sums."""
    rows, cols = 16, 512
    data = make_weights(T.Q5_K, rows, cols, np.random.default_rng(7)).reshape(rows, cols // 256, 176)
    data[:, :, 4:16] = 0xFF  # scales and mins 63
    data[:8, :, 16:] = 0xFF  # high bits and nibbles: every value 31
    data[9, :, 16:] = 0x00
    _extreme_case(T.Q5_K, data.reshape(rows, -1), rows, cols, amx_toggle)


def test_amx_q6_k_scaled_tiles_every_scale(amx_toggle):
    """Q6_K's tiles fold each group scale into the quants by its balanced base-7 digits (amx.h, lc_k6amxrec):
    every scale from -128 to 127 appears, against values 63 and 0 (-32) and random ones."""
    rows, cols = 16, 512
    data = make_weights(T.Q6_K, rows, cols, np.random.default_rng(6)).reshape(rows, cols // 256, 210)
    data[:, :, 192:208] = (
        (np.arange(rows * 2 * 16) % 256 - 128).astype(np.int8).view(np.uint8).reshape(rows, 2, 16)
    )
    data[:6, :, :192] = 0xFF  # every value 63
    data[6:10, :, :192] = 0x00  # every value 0 (-32)
    _extreme_case(T.Q6_K, data.reshape(rows, -1), rows, cols, amx_toggle)


def test_no_amx_env_turns_it_off():
    env = dict(os.environ, LLAMACY_NO_AMX="1")
    code = "from llamacy.kernels import matmul as mm; print(mm.AMX_STATUS)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "off (LLAMACY_NO_AMX)"
