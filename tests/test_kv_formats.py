"""The KV cache's quantized row formats (ops.pxd's KV_Q8_0, KV_Q4_0): store_kv_row against gguf's
quantizer byte for byte, attention over the stored rows against numpy over gguf's dequantization of them,
and the grouped kernel against the one-head kernel bit for bit."""

import numpy as np
import pytest

from llamacy.errors import UsageError
from llamacy.ggml_types import GGMLType, row_bytes
from llamacy.model import kv_types

testing = pytest.importorskip("llamacy.kernels.testing")
cpu = pytest.importorskip("llamacy.kernels.cpu")
gguf = pytest.importorskip("gguf")
quants = pytest.importorskip("gguf.quants")

QFMTS = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}
FMT = testing.KV_FMT  # the kernel's format ids, from ops.pxd


def _rows(rng, n: int, hd: int) -> np.ndarray:
    """Rows with the cases a quantizer can get wrong: all-zero blocks, one nonzero value, large and tiny
    magnitudes, ties (x / d at k + 0.5), negative extremes (Q4_0's d takes the sign of the largest)."""
    X = rng.standard_normal((n, hd)).astype(np.float32)
    X[0] = 0.0
    X[1, :32] = 0.0
    X[1, 5] = -3.0
    X[2] *= 30000.0
    X[3] *= 1e-5
    X[4, :32] = np.arange(32, dtype=np.float32) - 15.5  # ties for Q4_0 (d = -16 / -8 = 2... off the grid)
    X[5, :32] = np.linspace(-127, 127, 32).astype(np.float32) / 2  # ties for Q8_0 (d = 0.5)
    X[6, 7] = -1000.0
    X[7, 7] = 1000.0
    return X


@pytest.mark.parametrize("name", list(QFMTS))
@pytest.mark.parametrize("hd", [32, 64, 128, 256])
def test_store_kv_row_is_ggufs_quantizer(name, hd):
    X = _rows(np.random.default_rng(hd), 12, hd)
    want = quants.quantize(X, QFMTS[name])
    for i, x in enumerate(X):
        got = testing.py_store_kv_row(x, FMT[name])
        assert got.dtype == np.uint8 and got.shape == (kv_types.kv_row_bytes(name, hd),)
        assert np.array_equal(got, want[i]), f"row {i}"
    assert np.array_equal(testing.py_store_kv_rows(X, FMT[name]), want)


def _quantized_query(q):
    """The query as the kernel scores it over quantized K rows: each head's values quantized to Q8_0 blocks
    (ggml's quantize_row_q8_0 reference, as gguf's quantizer) and dequantized."""
    Q8 = gguf.GGMLQuantizationType.Q8_0
    return quants.dequantize(quants.quantize(np.ascontiguousarray(q, dtype=np.float32), Q8), Q8).reshape(
        q.shape
    )


def _reference(q, Kd, Vd, first, last, scale, softcap):
    """Attention of each query head in float64 over the dequantized rows (q as given: pass
    _quantized_query(q) for the kernel's scores over quantized rows)."""
    s = (Kd[first : last + 1].astype(np.float64) @ q.astype(np.float64).T).T * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return p @ Vd[first : last + 1].astype(np.float64)


# head_dim 32 and 96 take attention.h's one-vector column path (96 after one 64-column pass: a block of its
# own), 64, 128 and 256 the 64-column register path. The windows start past 0 and leave 0..7 positions
# after the blocks of 8. Heads: 1 the one-head kernel; in the grouped kernel 3 one pair and one single head,
# 7 one group of four (lc_att_scores8x4, lc_att_values_acc4), a pair and a single head, 8 two groups of four.
@pytest.mark.parametrize("name", list(QFMTS))
@pytest.mark.parametrize("softcap", [0.0, 5.0])
@pytest.mark.parametrize("hd", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("heads", [1, 3, 7, 8])
@pytest.mark.parametrize(("first", "last"), [(0, 0), (5, 30), (3, 9), (0, 39), (9, 44)])
def test_attention_over_quantized_rows_matches_numpy(name, softcap, hd, heads, first, last):
    rng = np.random.default_rng(hd + heads)
    n = 45
    K = testing.py_store_kv_rows((rng.standard_normal((n, hd)) * 2).astype(np.float32), FMT[name])
    V = testing.py_store_kv_rows(rng.standard_normal((n, hd)).astype(np.float32), FMT[name])
    q = rng.standard_normal((heads, hd)).astype(np.float32)
    scale = 1.0 / np.sqrt(hd)
    Kd, Vd = quants.dequantize(K, QFMTS[name]), quants.dequantize(V, QFMTS[name])
    want = _reference(_quantized_query(q), Kd, Vd, first, last, scale, softcap)
    got = testing.py_attend_group(q, K, V, first, last, scale, softcap, kv_fmt=FMT[name])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # and close to attention with the unquantized query (a wrong query scale would be far off): the query's
    # rounding moves these outputs by up to 1.1% (head_dim 256, K rows twice V's spread: sharp softmax)
    plain = _reference(q, Kd, Vd, first, last, scale, softcap)
    assert np.linalg.norm(got - plain) <= 2e-2 * np.linalg.norm(plain)
    one = np.stack(
        [testing.py_attend(q[h], K, V, first, last, scale, softcap, kv_fmt=FMT[name]) for h in range(heads)]
    )
    assert np.array_equal(got, one)


def test_grouped_attention_over_quantized_rows_many_heads_and_blocks():
    # 18 heads (two passes of the grouped kernel) and more V rows than one 16 KB block (481 Q8_0 rows of
    # 64 values), each head bit for bit the one-head kernel and close to numpy; the grouped call streams
    # (requests its rows ahead, as decoding does).
    rng = np.random.default_rng(11)
    for name in QFMTS:
        for hd in (64, 96):
            K = testing.py_store_kv_rows(rng.standard_normal((700, hd)).astype(np.float32), FMT[name])
            V = testing.py_store_kv_rows(rng.standard_normal((700, hd)).astype(np.float32), FMT[name])
            q = rng.standard_normal((18, hd)).astype(np.float32)
            got = testing.py_attend_group(q, K, V, 21, 698, 0.125, kv_fmt=FMT[name], stream=True)
            one = np.stack(
                [testing.py_attend(q[h], K, V, 21, 698, 0.125, kv_fmt=FMT[name]) for h in range(18)]
            )
            assert np.array_equal(got, one)
            Kd, Vd = quants.dequantize(K, QFMTS[name]), quants.dequantize(V, QFMTS[name])
            want = _reference(_quantized_query(q), Kd, Vd, 21, 698, 0.125, 0.0)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            plain = _reference(q, Kd, Vd, 21, 698, 0.125, 0.0)
            assert np.linalg.norm(got - plain) <= 1e-2 * np.linalg.norm(plain)


@pytest.mark.parametrize("name", list(QFMTS))
@pytest.mark.parametrize("hd", [32, 64, 256])
def test_leftover_positions_score_as_the_blocks_of_8(name, hd):
    # Positions 0..7 are scored 8 at a time (lc_attq_scores8xh), position 8 on its own (lc_attq_dot, the
    # scalar loop in the portable build). K row 8 is a copy of row 0 and those two rows give every head its
    # largest score (rows 1..7 are small), so both weights are exp(0) = 1 exactly when the two paths agree
    # bit for bit, and one of them exp(-1 ulp of a score of about 10) < 1 when they do not; with V rows
    # one-hot, out[d] is row d's weight times the same value, so out[0] == out[8] checks it (comparing the
    # weights through expf itself would not: the softmax loop's vector and scalar expf may differ by an ulp).
    rng = np.random.default_rng(hd)
    for trial in range(20):
        X = (rng.standard_normal((9, hd)) * 0.01).astype(np.float32)
        X[0] = rng.standard_normal(hd) * 3
        X[8] = X[0]
        K = testing.py_store_kv_rows(X, FMT[name])
        V = testing.py_store_kv_rows(np.eye(9, hd, dtype=np.float32), FMT[name])
        q = (X[0] + rng.standard_normal((5, hd))).astype(np.float32)
        scale = 10.0 / float(q[0] @ X[0])
        for got in (
            testing.py_attend_group(q, K, V, 0, 8, scale, kv_fmt=FMT[name]),
            np.stack([testing.py_attend(q[h], K, V, 0, 8, scale, kv_fmt=FMT[name]) for h in range(5)]),
        ):
            assert np.array_equal(got[:, 0], got[:, 8]), f"trial {trial}"


def test_quantized_rows_are_checked():
    q = np.zeros(64, np.float32)
    K = np.zeros((4, 68), np.uint8)
    with pytest.raises(ValueError, match="quantized kv_fmt"):
        testing.py_attend(q, K, K, 0, 3, 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        testing.py_attend(q, K, K, 0, 3, 1.0, kv_fmt=FMT["q4_0"])
    with pytest.raises(ValueError, match="multiple of 32"):
        testing.py_store_kv_row(np.zeros(48, np.float32), FMT["q8_0"])
    with pytest.raises(ValueError, match="match"):
        testing.py_attend(
            q, np.zeros((4, 64), np.float32), np.zeros((4, 64), np.float32), 0, 3, 1.0, kv_fmt=FMT["f16"]
        )


def test_kv_types_table():
    assert kv_types.KV_TYPE_NAMES == ("f16", "f32", "q8_0", "q4_0")
    for name in kv_types.KV_TYPE_NAMES:
        assert kv_types.kv_format(name) == FMT[name]
        for hd in (32, 64, 128, 256):
            assert kv_types.kv_row_bytes(name, hd) == testing.py_kv_row_bytes(FMT[name], hd)
    assert kv_types.kv_row_bytes("q8_0", 128) == row_bytes(GGMLType.Q8_0, 128) == 136
    assert kv_types.kv_row_bytes("q4_0", 64) == row_bytes(GGMLType.Q4_0, 64) == 36
    assert kv_types.kv_row_bytes("f16", 80) == 160 and kv_types.kv_row_bytes("f32", 12) == 48
    assert kv_types.kv_itemsize("f16") == 2 and kv_types.kv_dtype("f32") is np.float32
    for bad in ("q5_0", "F16", None):
        with pytest.raises(UsageError, match="--kv-type must be one of f16, f32, q8_0, q4_0"):
            kv_types.kv_format(bad)
    with pytest.raises(UsageError, match="multiple of 32"):
        kv_types.kv_row_bytes("q4_0", 80)
    with pytest.raises(UsageError, match="q8_0"):
        kv_types.kv_dtype("q8_0")  # no numpy value type: the rows are blocks
