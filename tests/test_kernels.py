"""The quantized kernels against an independent oracle: the gguf package's numpy dequantizer.

Tolerances (all relative to B = sum_j |w_j| |x_j|, the natural scale of a float dot product's error):
- matmul vs the oracle on our own quantized-then-dequantized activations (same integers, float64 math):
  |Y - ref| <= 1e-5 * B. The integer part is exact, so what is left is float32 scaling/accumulation.
- matmul vs the oracle on the float activations: activation quantization rounds each value to the nearest
  multiple of d = amax/127 of its block, an error of at most d/2, so |Y - ref| <= sum_j |w_j| d_j / 2
  (+ 1e-5 * B for the float32 arithmetic, and 0.1% slack for the float32 rounding of x * 127/amax).
- SIMD vs scalar twins: |Y_simd - Y_scalar| <= 1e-6 * B (same integers; only the order of float32 adds
  differs).
- dequantize_row, quantize_act (SIMD and scalar) and thread counts 1 vs 2: bit-exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from llamacy import ggml_types
from llamacy.kernels import matmul as mm
from llamacy.kernels import quant, traits
from llamacy.kernels import quantize as qz

T = GGMLQuantizationType
FLOATS = [T.F32, T.F16, T.BF16]
LEGACY = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
KQUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
ALL = FLOATS + LEGACY + KQUANTS
IMPLS = ["simd", "scalar"]

# (rows, cols) per family: odd row counts (tile remainders), row lengths that are multiples of the block.
SHAPES = {
    "float": [(1, 32), (3, 37), (17, 96), (33, 576)],  # 37: not a multiple of the 8-float vector
    "legacy": [(1, 32), (3, 64), (17, 96), (33, 576), (5, 1536)],
    "k": [(1, 256), (3, 512), (17, 768), (33, 1536)],
}
N_TOK = [1, 2, 5, 64]

Q8A = np.dtype([("d", "<f4"), ("s", "<f4"), ("qs", "i1", 32)])
Q8K = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])


def family(t: T) -> str:
    return "float" if t in FLOATS else "legacy" if t in LEGACY else "k"


def _f16_bytes(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float16).view(np.uint8).reshape(*np.shape(a), 2)


def random_k_blocks(t: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid K-quant rows (the gguf package has no K quantizer): random quant/scale bytes and
    sane fp16 super-block scales (positive where the format subtracts mins)."""
    n = rows * cols // 256
    size = GGML_QUANT_SIZES[t][1]
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    d = _f16_bytes(rng.uniform(-0.05, 0.05, n) if t in (T.Q3_K, T.Q6_K) else rng.uniform(0.001, 0.05, n))
    dmin = _f16_bytes(rng.uniform(0.001, 0.05, n))
    if t == T.Q2_K:  # scales[16] qs[64] d dmin
        raw[:, 80:82], raw[:, 82:84] = d, dmin
    elif t == T.Q3_K:  # hmask[32] qs[64] scales[12] d
        raw[:, 108:110] = d
    elif t in (T.Q4_K, T.Q5_K):  # d dmin scales[12] (qh[32]) qs[128]
        raw[:, 0:2], raw[:, 2:4] = d, dmin
    elif t == T.Q6_K:  # ql[128] qh[64] scales[16] d
        raw[:, 208:210] = d
    return raw.reshape(rows, -1)


def make_weights(t: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Raw weight rows, uint8[rows, row_bytes]."""
    if t in KQUANTS:
        return random_k_blocks(t, rows, cols, rng)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    return np.ascontiguousarray(quants.quantize(w, t)).view(np.uint8).reshape(rows, -1)


def oracle_weights(t: T, data: np.ndarray, rows: int, cols: int) -> np.ndarray:
    if t == T.F32:
        return data.view(np.float32).reshape(rows, cols).astype(np.float64)
    return quants.dequantize(data, t).reshape(rows, cols).astype(np.float64)


def act_values(t: T, xq: np.ndarray, n: int, cols: int) -> np.ndarray:
    """Our activation rows decoded back to float64 (what the integer kernels actually multiply)."""
    fmt = quant.act_format_py(int(t))
    if fmt == 0:
        return xq.view(np.float32).reshape(n, cols).astype(np.float64)
    blocks = np.frombuffer(xq.tobytes(), dtype=Q8A if fmt == 1 else Q8K).reshape(n, -1)
    return (blocks["d"][..., None].astype(np.float64) * blocks["qs"]).reshape(n, cols)


def act_half_steps(t: T, x: np.ndarray) -> np.ndarray:
    """Per value, half the quantization step of its activation block (0 for float weights)."""
    if t in FLOATS:
        return np.zeros_like(x, dtype=np.float64)
    qk = 32 if t in LEGACY else 256
    n = x.shape[0]
    amax = np.abs(x.reshape(n, -1, qk)).max(-1).astype(np.float64)
    return np.repeat(amax / 127 / 2, qk, axis=1)


def np_quantize_q8(x: np.ndarray, qk: int):
    """numpy reimplementation of the activation quantizer (ggml's q8_0 rule, float32 arithmetic):
    d = amax/127, q = round-half-even(x * (127/amax))."""
    n, cols = x.shape
    b = x.reshape(n, cols // qk, qk).astype(np.float32)
    amax = np.abs(b).max(-1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        iscale = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.round(b * iscale[..., None]).astype(np.int32)
    return d.astype(np.float32), q


def bound_abs(W: np.ndarray, X: np.ndarray) -> np.ndarray:
    """B[t, r] = sum_j |W[r, j]| |X[t, j]| (floored so that all-zero rows compare as exact)."""
    return np.maximum(np.abs(X) @ np.abs(W).T, 1e-30)


def worst(err: np.ndarray, allowed: np.ndarray) -> float:
    """Largest err/allowed: the check passes when this is <= 1."""
    return float(np.max(err / allowed))


# ---------------------------------------------------------------------------------------------------------
# Layout


def test_struct_sizes_match_ggml():
    """The block structs (their sizeof is the traits table's bytes per block) and the activation blocks."""
    for t in ALL:
        assert traits.traits(int(t))["block_bytes"] == GGML_QUANT_SIZES[t][1], t.name
    assert quant.act_layout(0) == (1, 4)
    assert quant.act_layout(1) == (32, 40)  # float d, float s, int8 qs[32]
    assert quant.act_layout(2) == GGML_QUANT_SIZES[T.Q8_K]  # float d, int8 qs[256], int16 bsums[16]
    with pytest.raises(ValueError, match="activation format"):
        quant.act_layout(3)


def test_block_layout_matches_ggml_types():
    for t in ggml_types.COMPUTE_TYPES:
        assert quant.supported(int(t))
        assert quant.block_layout(int(t)) == ggml_types.BLOCK_LAYOUT[t]
        assert quant.block_layout(int(t)) == GGML_QUANT_SIZES[T(int(t))]
    assert set(ggml_types.COMPUTE_TYPES) == {int(t) for t in ALL}


@pytest.mark.parametrize("t", ALL, ids=lambda t: t.name)
def test_act_format_and_row_bytes(t):
    fmt = quant.act_format_py(int(t))
    assert fmt == (0 if t in FLOATS else 1 if t in LEGACY else 2)
    cols = 512
    expected = {0: cols * 4, 1: cols // 32 * 40, 2: cols // 256 * 292}[fmt]
    assert quant.act_row_bytes_py(int(t), cols) == expected


def test_unsupported_types():
    for t in (T.Q8_1, T.Q8_K, T.IQ4_NL, T.IQ2_XXS, T.TQ1_0, 999):
        assert not quant.supported(int(t))
        assert quant.act_format_py(int(t)) == -1


def test_simd_build_flags_agree():
    from llamacy.kernels import cpu

    assert quant.simd_build() == cpu.simd_build()


# ---------------------------------------------------------------------------------------------------------
# Activation quantization


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("qk,t", [(32, T.Q4_0), (256, T.Q4_K)], ids=["q8a", "q8k"])
def test_quantize_act_matches_numpy(qk, t, impl):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((7, 1536)) * rng.uniform(0.01, 100, (7, 1))).astype(np.float32)
    x[3, :qk] = 0.0  # an all-zero block: d = 0, q = 0
    x[4, 5] = 1e4  # one large value: the rest of its block rounds to small ints
    ours = quant.quantize_act(int(t), x, impl=impl)
    d, q = np_quantize_q8(x, qk)
    if qk == 32:
        ref = np.zeros((7, 1536 // 32), dtype=Q8A)
        ref["d"], ref["qs"] = d, q
        ref["s"] = d * q.sum(-1).astype(np.float32)
    else:
        ref = np.zeros((7, 1536 // 256), dtype=Q8K)
        ref["d"], ref["qs"] = d, q
        ref["bsums"] = q.reshape(7, -1, 16, 16).sum(-1)
    assert ours.tobytes() == ref.tobytes()
    assert np.abs(q).max() <= 127


def test_quantize_act_simd_equals_scalar_and_float_copy():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((9, 768)).astype(np.float32)
    for t in (T.Q8_0, T.Q6_K):
        assert np.array_equal(quant.quantize_act(int(t), x, "simd"), quant.quantize_act(int(t), x, "scalar"))
    # float weights take the floats as they are
    assert quant.quantize_act(int(T.F16), x).view(np.float32).tobytes() == x.tobytes()
    # one row in, one row out
    assert quant.quantize_act(int(T.Q8_0), x[0]).shape == (768 // 32 * 40,)


# ---------------------------------------------------------------------------------------------------------
# Dequantization


@pytest.mark.parametrize("t", ALL, ids=lambda t: t.name)
def test_dequantize_matches_gguf_exactly(t):
    rng = np.random.default_rng(3)
    for rows, cols in SHAPES[family(t)][:3]:
        data = make_weights(t, rows, cols, rng)
        ours = qz.dequantize(int(t), data, (rows, cols))
        ref = oracle_weights(t, data, rows, cols).astype(np.float32)
        assert ours.dtype == np.float32 and ours.shape == (rows, cols)
        assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), (rows, cols)


def test_dequantize_shapes():
    rng = np.random.default_rng(4)
    data = make_weights(T.Q4_1, 6, 64, rng)
    flat = qz.dequantize(int(T.Q4_1), data, (6, 64))
    assert np.array_equal(
        qz.dequantize(int(T.Q4_1), data.reshape(2, 3, -1), (2, 3, 64)), flat.reshape(2, 3, 64)
    )
    assert np.array_equal(qz.dequantize(int(T.Q4_1), data[0], 64), flat[0])


# ---------------------------------------------------------------------------------------------------------
# Matrix products


def _cases():
    for t in ALL:
        for rows, cols in SHAPES[family(t)]:
            yield pytest.param(t, rows, cols, id=f"{t.name}-{rows}x{cols}")


@pytest.mark.parametrize("t,rows,cols", list(_cases()))
def test_matmul_against_oracle(t, rows, cols):
    rng = np.random.default_rng(rows * 1000 + cols + int(t))
    data = make_weights(t, rows, cols, rng)
    Wd = oracle_weights(t, data, rows, cols)
    for n in N_TOK:
        x = rng.standard_normal((n, cols)).astype(np.float32)
        xq = quant.quantize_act(int(t), x)
        Xd = act_values(t, xq, n, cols)
        B = bound_abs(Wd, Xd)
        ref_q = Xd @ Wd.T  # the oracle on the very activations the kernel multiplies
        ref_f = x.astype(np.float64) @ Wd.T  # the oracle on the float activations
        quant_err = act_half_steps(t, x) @ np.abs(Wd).T
        outs = {}
        for impl in IMPLS:
            Y = mm.matmul_py(data, int(t), x, impl=impl)
            assert Y.shape == (n, rows) and Y.dtype == np.float32
            assert worst(np.abs(Y - ref_q), 1e-5 * B) <= 1, (impl, n)
            assert worst(np.abs(Y - ref_f), 1.001 * quant_err + 1e-5 * B) <= 1, (impl, n)
            outs[impl] = Y
        assert worst(np.abs(outs["simd"] - outs["scalar"]), 1e-6 * B) <= 1, n


@pytest.mark.parametrize("t", [T.Q4_1, T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K, T.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("impl", IMPLS)
def test_threads_give_identical_results(t, impl):
    rng = np.random.default_rng(5)
    cols = 512 if t in KQUANTS else 96
    data = make_weights(t, 70, cols, rng)
    for n in (1, 5, 67):  # 67: crosses a token chunk (64)
        x = rng.standard_normal((n, cols)).astype(np.float32)
        y1 = mm.matmul_py(data, int(t), x, nthreads=1, impl=impl)
        y2 = mm.matmul_py(data, int(t), x, nthreads=2, impl=impl)
        assert np.array_equal(y1.view(np.uint32), y2.view(np.uint32)), n


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_stolen_rows_give_identical_results(t):
    # Decode products hand out their rows as ranges that threads done early steal from (matmul.steal_set):
    # whoever computes a row, and with or without stealing, every thread count gives the same bits.
    rng = np.random.default_rng(11)
    cols = 512 if t in KQUANTS else 96
    data = make_weights(t, 530, cols, rng)  # 34 units of 16 rows, the last one short
    for n in (1, 3, 8):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        y1 = mm.matmul_py(data, int(t), x, nthreads=1)
        try:
            for steal in (True, False):
                mm.steal_set(steal)
                for nthreads in (2, 3, 4):
                    y = mm.matmul_py(data, int(t), x, nthreads=nthreads)
                    assert np.array_equal(y1.view(np.uint32), y.view(np.uint32)), (n, steal, nthreads)
        finally:
            mm.steal_set(True)


@pytest.mark.parametrize("t", [T.Q4_0, T.Q5_1, T.Q3_K, T.BF16], ids=lambda t: t.name)
def test_many_tokens_cross_chunks(t):
    rng = np.random.default_rng(6)
    cols = 256 if t in KQUANTS else 64
    data = make_weights(t, 19, cols, rng)
    x = rng.standard_normal((131, cols)).astype(np.float32)
    Wd = oracle_weights(t, data, 19, cols)
    Xd = act_values(t, quant.quantize_act(int(t), x), 131, cols)
    Y = mm.matmul_py(data, int(t), x)
    assert worst(np.abs(Y - Xd @ Wd.T), 1e-5 * bound_abs(Wd, Xd)) <= 1


def test_q8_0_full_byte_range():
    """Q8_0 weights from a file may hold -128 (the quantizer never writes it): the sign trick must cope."""
    rng = np.random.default_rng(7)
    rows, cols = 9, 128
    raw = rng.integers(0, 256, size=(rows * cols // 32, 34), dtype=np.uint8)
    raw[:, 0:2] = _f16_bytes(rng.uniform(-0.1, 0.1, rows * cols // 32))
    raw[:, 2:6] = 0x80  # some -128 quants in every block
    data = raw.reshape(rows, -1)
    Wd = oracle_weights(T.Q8_0, data, rows, cols)
    for n in (1, 6):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        Xd = act_values(T.Q8_0, quant.quantize_act(int(T.Q8_0), x), n, cols)
        for impl in IMPLS:
            Y = mm.matmul_py(data, int(T.Q8_0), x, impl=impl)
            assert worst(np.abs(Y - Xd @ Wd.T), 1e-5 * bound_abs(Wd, Xd)) <= 1


def test_zero_activations_give_zero():
    rng = np.random.default_rng(8)
    for t in (T.Q4_1, T.Q5_1, T.Q2_K, T.Q4_K):
        cols = 256
        data = make_weights(t, 5, cols, rng)
        for n in (1, 4):
            assert not mm.matmul_py(data, int(t), np.zeros((n, cols), np.float32)).any()


def test_out_buffer_with_row_stride():
    rng = np.random.default_rng(9)
    data = make_weights(T.Q4_1, 13, 64, rng)
    x = rng.standard_normal((6, 64)).astype(np.float32)
    out = np.full((6, 20), 7.0, dtype=np.float32)
    res = mm.matmul_py(data, int(T.Q4_1), x, out=out)
    assert res is out
    assert np.array_equal(out[:, :13], mm.matmul_py(data, int(T.Q4_1), x))
    assert (out[:, 13:] == 7.0).all()


@pytest.mark.parametrize("t", [T.F32, T.Q4_1, T.Q8_0, T.Q5_K], ids=lambda t: t.name)
def test_vec_dot_matches_matmul(t):
    rng = np.random.default_rng(10)
    cols = 512
    data = make_weights(t, 1, cols, rng)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    for impl in IMPLS:
        xq = quant.quantize_act(int(t), x[0], impl=impl)
        got = mm.vec_dot_py(int(t), data[0], xq, cols, impl=impl)
        assert got == float(mm.matmul_py(data, int(t), x, impl=impl)[0, 0])
        assert mm.vec_dot_py(int(t), data[0].tobytes(), xq.tobytes(), cols, impl=impl) == got


def test_a_wrong_kernel_would_fail():
    """The checks are sharp enough to catch a kernel that is off by one quant step in one block."""
    rng = np.random.default_rng(11)
    t, rows, cols = T.Q4_1, 4, 256
    data = make_weights(t, rows, cols, rng)
    bad = data.copy()
    bad[2, 4 + 20 * 3] ^= 0x01  # one nibble of row 2, block 3: that weight moves by d
    x = rng.standard_normal((3, cols)).astype(np.float32)
    Wd = oracle_weights(t, data, rows, cols)
    Xd = act_values(t, quant.quantize_act(int(t), x), 3, cols)
    B = bound_abs(Wd, Xd)
    good = mm.matmul_py(data, int(t), x)
    wrong = mm.matmul_py(bad, int(t), x)
    assert worst(np.abs(good - Xd @ Wd.T), 1e-5 * B) <= 1
    assert worst(np.abs(wrong - Xd @ Wd.T), 1e-5 * B) > 1
    assert worst(np.abs(wrong - good), 1e-6 * B) > 1


# ---------------------------------------------------------------------------------------------------------
# Validation in the Python wrappers


def test_wrapper_validation():
    rng = np.random.default_rng(12)
    data = make_weights(T.Q4_0, 3, 64, rng)  # 3 x 36 bytes
    x = rng.standard_normal((2, 64)).astype(np.float32)
    q4 = int(T.Q4_0)
    with pytest.raises(ValueError, match="weights must be"):
        mm.matmul_py(data[:, :-1], q4, x)
    with pytest.raises(ValueError, match="multiple of 32"):
        mm.matmul_py(data, q4, x[:, :48])
    with pytest.raises(ValueError, match="no kernels"):
        mm.matmul_py(data, int(T.IQ4_NL), x)
    with pytest.raises(ValueError, match="impl"):
        mm.matmul_py(data, q4, x, impl="avx512")
    with pytest.raises(ValueError, match="nthreads"):
        mm.matmul_py(data, q4, x, nthreads=0)
    with pytest.raises(ValueError, match="x must be"):
        mm.matmul_py(data, q4, x.reshape(2, 2, 32))
    with pytest.raises(ValueError, match="x must be"):
        mm.matmul_py(data, q4, np.zeros((0, 64), np.float32))
    with pytest.raises(ValueError, match="out must be"):
        mm.matmul_py(data, q4, x, out=np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="weight row"):
        mm.vec_dot_py(q4, data[0, :-2], quant.quantize_act(q4, x[0]), 64)
    with pytest.raises(ValueError, match="activation row"):
        mm.vec_dot_py(q4, data[0], quant.quantize_act(q4, x[0])[:-1], 64)
    with pytest.raises(ValueError, match="bytes"):
        qz.dequantize(q4, data[:, :-1], (3, 64))
    with pytest.raises(ValueError, match="multiple of 256"):
        qz.dequantize(int(T.Q4_K), np.zeros(144, np.uint8), (1, 128))
    with pytest.raises(ValueError, match="multiple of 32"):
        quant.quantize_act(q4, np.zeros((2, 33), np.float32))
    with pytest.raises(ValueError, match="1-D or 2-D"):
        quant.quantize_act(q4, np.zeros((2, 2, 32), np.float32))
    with pytest.raises(ValueError, match="impl"):
        quant.quantize_act(q4, x, impl="fast")
