"""The layer loop's element-wise ops and attention against plain numpy."""

import numpy as np
import pytest

testing = pytest.importorskip("llamacy.kernels.testing")


def test_rmsnorm_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(577).astype(np.float32)
    w = rng.standard_normal(577).astype(np.float32)
    want = x / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-5) * w
    np.testing.assert_allclose(testing.py_rmsnorm(x, w, 1e-5), want, rtol=1e-5, atol=1e-6)


def _rope_numpy(x: np.ndarray, n_rot: int, pos: float, base: float, neox: bool) -> np.ndarray:
    x = x.astype(np.float64).copy()
    inv = base ** (-np.arange(0, n_rot, 2) / n_rot)
    ang = pos * inv
    c, s = np.cos(ang), np.sin(ang)
    if neox:
        a, b = x[:, : n_rot // 2].copy(), x[:, n_rot // 2 : n_rot].copy()
        x[:, : n_rot // 2], x[:, n_rot // 2 : n_rot] = a * c - b * s, a * s + b * c
    else:
        a, b = x[:, 0:n_rot:2].copy(), x[:, 1:n_rot:2].copy()
        x[:, 0:n_rot:2], x[:, 1:n_rot:2] = a * c - b * s, a * s + b * c
    return x


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_rot", [64, 32])
def test_rope_matches_numpy(neox, n_rot):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    want = _rope_numpy(x, n_rot, 37, 10000.0, neox)
    testing.py_rope(x, n_rot, 37, 10000.0, 2 if neox else 0)
    np.testing.assert_allclose(x, want, rtol=1e-4, atol=1e-5)


# head_dim: 16 and 80 take attention.h's one-vector column path (80 after one 64-column pass), 64 and 256
# the 64-column register path, 12 the plain loops; the ranges give 8-position blocks, tails and none.
# kv: the cache's value type; with f16 the oracle sees the very halves the kernel reads (as float64).
@pytest.mark.parametrize("kv", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("softcap", [0.0, 5.0])
@pytest.mark.parametrize("head_dim", [16, 64, 80, 256, 12])
@pytest.mark.parametrize(("first", "last"), [(5, 30), (0, 0), (3, 9), (0, 39)])
def test_attention_matches_numpy(kv, softcap, head_dim, first, last):
    rng = np.random.default_rng(2)
    K = rng.standard_normal((40, head_dim)).astype(kv)
    V = rng.standard_normal((40, head_dim)).astype(kv)
    q = rng.standard_normal(head_dim).astype(np.float32)
    scale = 1.0 / np.sqrt(head_dim)
    s = (K[first : last + 1].astype(np.float64) @ q) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    p = np.exp(s - s.max())
    p /= p.sum()
    want = p @ V[first : last + 1].astype(np.float64)
    np.testing.assert_allclose(
        testing.py_attend(q, K, V, first, last, scale, softcap), want, rtol=1e-5, atol=1e-6
    )


def test_half_cache_rows_round_to_nearest_even_as_numpy():
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [
            rng.standard_normal(1000) * 3,
            rng.standard_normal(100) * 1e-6,  # half subnormals
            [65504.0, 65519.0, 65520.0, 1e6, -1e6, 0.0, -0.0],  # the largest half, the overflow edge
            np.float32(1.0) + np.arange(16) * np.float32(2**-11),  # ties between halves
        ]
    ).astype(np.float32)
    got = testing.py_store_kv_row(x, True)
    assert got.dtype == np.float16
    with np.errstate(over="ignore"):  # numpy warns about the values that become inf, as they should
        want = x.astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(testing.py_store_kv_row(x, False), x)


def test_attention_rejects_mixed_cache_types():
    K = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="float16"):
        testing.py_attend(np.zeros(8, np.float32), K, K.astype(np.float16), 0, 3, 1.0)


def test_attention_rejects_bad_range():
    K = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError):
        testing.py_attend(np.zeros(8, np.float32), K, K, 0, 4, 1.0)


# The grouped kernel (each cached row read once for a KV group's query heads) against the one-head kernel,
# head by head: the outputs must be the same bits. head_dim 64 and 256 take the 64-column register path,
# 72 one 64-column pass and then the one-vector path, 12 the plain loops. The ranges leave 0..7 positions
# after the blocks of 8, and windows start past 0; 37 cached positions make each head's scores row odd-sized.
# Heads go through the kernel's steps four (head_dim a multiple of 32), two and one at a time: 7 takes all.
# The grouped call streams (requests rows ahead, as decoding does), the one-head calls do not: same bits.
@pytest.mark.parametrize("kv", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("softcap", [0.0, 5.0])
@pytest.mark.parametrize("head_dim", [64, 72, 256, 12])
@pytest.mark.parametrize("heads", [1, 3, 4, 7])
@pytest.mark.parametrize(
    ("first", "last"),
    [(0, 15), (0, 0), (5, 13), (1, 18), (3, 9), (0, 35), (7, 10), (2, 36), (11, 29), (4, 8), (3, 24)],
)
def test_grouped_attention_is_bitwise_the_one_head_kernel(kv, softcap, head_dim, heads, first, last):
    rng = np.random.default_rng(7)
    K = (rng.standard_normal((37, head_dim)) * 2).astype(kv)
    V = rng.standard_normal((37, head_dim)).astype(kv)
    q = rng.standard_normal((heads, head_dim)).astype(np.float32)
    scale = 1.0 / np.sqrt(head_dim)
    got = testing.py_attend_group(q, K, V, first, last, scale, softcap, stream=True)
    want = np.stack([testing.py_attend(q[h], K, V, first, last, scale, softcap) for h in range(heads)])
    assert np.array_equal(got, want)


def test_grouped_attention_over_many_heads_and_positions():
    # More heads than one pass of the kernel takes (16), and more V rows than one block (16 KB of rows:
    # 128 half rows of 64 values), with the one-vector column path (72) too; streaming or not, and with
    # the last rows' requests clipped at the end of the range.
    rng = np.random.default_rng(8)
    for kv in (np.float32, np.float16):
        for head_dim in (64, 72):
            K = rng.standard_normal((300, head_dim)).astype(kv)
            V = rng.standard_normal((300, head_dim)).astype(kv)
            q = rng.standard_normal((18, head_dim)).astype(np.float32)
            want = np.stack([testing.py_attend(q[h], K, V, 21, 298, 0.125) for h in range(18)])
            for stream in (False, True):
                got = testing.py_attend_group(q, K, V, 21, 298, 0.125, stream=stream)
                assert np.array_equal(got, want)


def test_grouped_attention_rejects_bad_shapes():
    K = np.zeros((4, 8), np.float32)
    with pytest.raises(ValueError, match="range"):
        testing.py_attend_group(np.zeros((2, 8), np.float32), K, K, 0, 4, 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        testing.py_attend_group(np.zeros((2, 4), np.float32), K, K, 0, 3, 1.0)
    with pytest.raises(ValueError, match="heads"):
        testing.py_attend_group(np.zeros((0, 8), np.float32), K, K, 0, 3, 1.0)
    with pytest.raises(ValueError, match="shape"):
        testing.py_attend_group(np.zeros((1, 8), np.float32), K, K[:3], 0, 2, 1.0)
