"""Q4_0, Q4_K, Q6_K and Q8_0 on AVX2 in issue #29's row-lane float order
(llamacy/kernels/mm_avx2_x8.pxi, mm_avx2_kx8.pxi).

Q4_0 and Q8_0: per row and block, sum = fma(float(isum_b), d_w * d_x, sum) from 0, isum_b the block's exact
integer sum. Q4_K: per row and super-block, a = fma(float(isum), d_w * d_x, a), m = fma(float(imin), dmin_w * d_x, m),
Y = a - m. Q6_K: per row and super-block, a = fma(float(isum - 32 imin), d_w * d_x, a). Those are the VNNI
kernels' orders (tests/test_kernels_512.py states them and computes them with
libm's fmaf). Here the AVX2 kernels are held to those chains bit for bit on every path: stored rows (any row
count, the last 8 rows partly filled) and 8-row tiles, decode, few tokens, 4-token tiles with 1-3 left over,
token chunks of 64, 1 and 2 threads; and against the VNNI kernels where this CPU has them. The gguf
oracle's tolerance (tests/test_kernels.py) holds for them through test_kernels.py's own cases, which run the
same kernels.
"""

from __future__ import annotations

import numpy as np
import pytest

from llamacy.ggml_types import GGMLType as T
from llamacy.kernels import cpu
from llamacy.kernels import matmul as mm
from llamacy.kernels import repack as rp
from tests.test_kernels import Q8K, make_weights
from tests.test_kernels_512 import ROW_LANE_CHAINS, legacy_row_lane_chain, q45_k_row_lane_chain

pytestmark = pytest.mark.skipif(not cpu.simd_build(), reason="a portable build runs the scalar twins")

TOKENS = (1, 2, 3, 4, 5, 7, 8, 9, 63, 64, 65, 131)
ROW_LANE_TYPES = pytest.mark.parametrize("wtype", [T.Q4_0, T.Q4_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
LAYOUTS = {
    T.Q4_0: rp.LAYOUT_Q4_0_X8,
    T.Q4_K: rp.LAYOUT_Q4_K_X8,
    T.Q6_K: rp.LAYOUT_Q6_K_X8,
    T.Q8_0: rp.LAYOUT_Q8_0_X8,
}


def _bits(y: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(y).view(np.uint32)


@pytest.mark.parametrize(("rows", "cols"), [(8, 256), (3, 512), (13, 256), (16, 768), (40, 1536)])
@ROW_LANE_TYPES
def test_stored_rows_give_the_row_lane_chain(wtype, rows, cols):
    rng = np.random.default_rng(rows * cols)
    data = make_weights(wtype, rows, cols, rng)
    for n in TOKENS:
        x = (rng.standard_normal((n, cols)) * rng.uniform(0.1, 10, (n, 1))).astype(np.float32)
        _, xq, _, _ = mm.operands(data, int(wtype), x, "simd")
        want = ROW_LANE_CHAINS[wtype](data, xq, rows, cols, n)
        for threads in (1, 2):
            got = mm.matmul_py(data, int(wtype), x, nthreads=threads, impl="simd")
            np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"n={n} threads={threads}")


@pytest.mark.parametrize(("rows", "cols"), [(8, 256), (48, 512), (64, 2048)])
@ROW_LANE_TYPES
def test_tiles_give_the_stored_rows_bits(wtype, rows, cols):
    """The tiles through the kernel matmul runs for them here (AVX2's, or VNNI's where it is on): the bits of
    the stored rows through AVX2."""
    rng = np.random.default_rng(cols)
    data = make_weights(wtype, rows, cols, rng)
    tiles, layout = rp.repack_tiles(int(wtype), data, rows, cols)
    assert layout == LAYOUTS[wtype]
    assert mm.layout_available(layout)
    for n in TOKENS:
        x = rng.standard_normal((n, cols)).astype(np.float32)
        want = mm.matmul_py(data, int(wtype), x, impl="simd")
        for threads in (1, 2):
            got = mm.matmul_tiled_py(tiles, layout, rows, x, nthreads=threads)
            np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"n={n} threads={threads}")


@pytest.mark.skipif(not mm.vnni_available(), reason="no AVX-512 VNNI here")
@ROW_LANE_TYPES
def test_avx2_gives_the_vnni_bits(wtype):
    rows, cols = 40, 1024
    rng = np.random.default_rng(9)
    data = make_weights(wtype, rows, cols, rng)
    for n in TOKENS:
        x = rng.standard_normal((n, cols)).astype(np.float32)
        np.testing.assert_array_equal(
            _bits(mm.matmul_py(data, int(wtype), x, impl="simd")),
            _bits(mm.matmul_py(data, int(wtype), x, impl="vnni")),
            err_msg=f"n={n}",
        )


def test_q4_0_extreme_quants_do_not_saturate():
    """Every nibble 15 against every activation quant at +-127: the int16
    sums of a block reach 30,480 in magnitude and must stay exact."""
    rows, cols = 9, 256
    data = make_weights(T.Q4_0, rows, cols, np.random.default_rng(1)).reshape(rows, cols // 32, 18)
    data[:, :, 2:] = 0xFF  # value 15 - 8 = 7 everywhere
    data[1, :, 2:] = 0x00  # value -8 everywhere
    data = data.reshape(rows, -1)
    for sign in (1.0, -1.0):
        x = np.full((3, cols), sign, np.float32)
        _, xq, _, _ = mm.operands(data, int(T.Q4_0), x, "simd")
        want = legacy_row_lane_chain(T.Q4_0, data, xq, rows, cols, 3)
        for threads in (1, 2):
            got = mm.matmul_py(data, int(T.Q4_0), x, nthreads=threads, impl="simd")
            np.testing.assert_array_equal(_bits(got), _bits(want))


def test_q4_k_extreme_quants_do_not_saturate():
    """Every nibble 15 (and every scale and min 63) against activation quants of magnitude 127: a
    sub-block's int16 lanes reach 30,480 in magnitude and must stay exact."""
    rows, cols = 9, 512
    data = make_weights(T.Q4_K, rows, cols, np.random.default_rng(2)).reshape(rows, cols // 256, 144)
    data[:, :, 4:16] = 0xFF  # scales and mins 63
    data[:, :, 16:] = 0xFF  # nibbles 15
    data[1, :, 16:] = 0x00
    data = data.reshape(rows, -1)
    x = np.ones((3, cols), np.float32)
    x[0] = -1.0
    x[1, ::2] = -1.0
    _, xq, _, _ = mm.operands(data, int(T.Q4_K), x, "simd")
    quants = np.frombuffer(xq.tobytes(), dtype=Q8K)["qs"]
    assert (np.abs(quants.astype(np.int32)) == 127).all()
    want = q45_k_row_lane_chain(T.Q4_K, data, xq, rows, cols, 3)
    for threads in (1, 2):
        got = mm.matmul_py(data, int(T.Q4_K), x, nthreads=threads, impl="simd")
        np.testing.assert_array_equal(_bits(got), _bits(want))


def test_q6_k_extreme_quants_do_not_saturate():
    """Every 6-bit value 63 (and -32: all bits clear) against activation quants of magnitude 127, scales of
    -128 and 127: two maddubs pairs reach 32,004 in an int16 lane and must stay exact."""
    rows, cols = 9, 512
    data = make_weights(T.Q6_K, rows, cols, np.random.default_rng(3)).reshape(rows, cols // 256, 210)
    data[:, :, :192] = 0xFF  # every value 63
    data[1, :, :192] = 0x00  # every value 0 (-32)
    data[:, :, 192:208] = np.array([0x80, 0x7F] * 8, np.uint8)  # scales -128, 127
    data = data.reshape(rows, -1)
    x = np.ones((3, cols), np.float32)
    x[0] = -1.0
    x[1, ::2] = -1.0
    _, xq, _, _ = mm.operands(data, int(T.Q6_K), x, "simd")
    want = ROW_LANE_CHAINS[T.Q6_K](data, xq, rows, cols, 3)
    for threads in (1, 2):
        got = mm.matmul_py(data, int(T.Q6_K), x, nthreads=threads, impl="simd")
        np.testing.assert_array_equal(_bits(got), _bits(want))


def test_q8_0_extreme_quants_do_not_saturate():
    """Quants of -128 (a file may hold them; ggml's quantizer writes -127..127) and 127 against token quants
    of magnitude 127: a maddubs pair reaches 32,512 and must stay exact, the sign trick must not lose -128."""
    rows, cols = 9, 256
    data = make_weights(T.Q8_0, rows, cols, np.random.default_rng(4)).reshape(rows, cols // 32, 34)
    data[:, :, 2:] = 0x80  # -128
    data[1, :, 2:] = 0x7F  # 127
    data[2, :, 2::2] = 0x7F
    data = data.reshape(rows, -1)
    x = np.ones((3, cols), np.float32)
    x[0] = -1.0
    x[1, ::2] = -1.0
    _, xq, _, _ = mm.operands(data, int(T.Q8_0), x, "simd")
    want = legacy_row_lane_chain(T.Q8_0, data, xq, rows, cols, 3)
    for threads in (1, 2):
        got = mm.matmul_py(data, int(T.Q8_0), x, nthreads=threads, impl="simd")
        np.testing.assert_array_equal(_bits(got), _bits(want))
