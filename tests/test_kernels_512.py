"""The AVX-512 VNNI kernels (llamacy.kernels.matmul512) and their run-time dispatch.

They are held against the same oracle as the AVX2 kernels (tests/test_kernels.py, whose helpers these
tests import) and against the AVX2 kernels themselves:
- vs the gguf oracle: the tolerances of test_kernels.py (1e-5 * B on the activations the kernel multiplies,
  the activation quantization bound on the float activations), B = sum_j |w_j| |x_j|.
- vs AVX2: bit-identical for the per-lane types (Q2_K, Q3_K): both sum the same int32 lanes exactly and scale
  them with the same float operations in the same order.
- Every other quantized type follows the row-lane order of issue #29 (for Q4_0 and Q4_K the order of
  llama.cpp's repacked kernels). Q4_0, Q5_0, Q8_0: per row and block, sum = fma(float(block's integer sum),
  d_w * d_x, sum); Q4_1 and Q5_1 the same plus a second chain, mins = fma(m_w, s_x, mins), Y = sum + mins.
  Q4_K and Q5_K: per row and super-block, a = fma(float(isum), d_w * d_x, a) and
  m = fma(float(imin), dmin_w * d_x, m), Y = a - m, with isum the super-block's exact integer sum of scaled
  products and imin its exact sum of mins x sub-block sums of the token's quants. Q6_K: one chain,
  a = fma(float(isum), d_w * d_x, a), isum the exact sum of scale x (quant - 32) x activation quant. Against AVX2 (the
  per-lane order) they agree within the SIMD-vs-scalar tolerance, not bit for bit. Against those very
  chains computed here with libm's fmaf, and across every path (decode, few tokens, prefill, token chunks,
  one token at a time, 1 or 2 threads), they are bit-identical.
- thread counts 1 and 2: bit-identical.
The dispatch tests run in subprocesses: LLAMACY_NO_AVX512=1 selects AVX2, and on a CPU without AVX-512
(simulated) matmul512 is never imported.

Skipped where the CPU (or the build) has no AVX-512 F/BW/VL + VNNI, except the dispatch tests that
simulate such a CPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llamacy.kernels import cpu, quant
from llamacy.kernels import matmul as mm
from tests.conftest import cpuinfo_flags
from tests.test_kernels import (
    FLOATS,
    KQUANTS,
    LEGACY,
    Q8A,
    Q8K,
    T,
    _f16_bytes,
    act_half_steps,
    act_values,
    bound_abs,
    make_weights,
    oracle_weights,
    worst,
)

ROOT = Path(__file__).resolve().parent.parent
QUANTS = LEGACY + KQUANTS
N_TOK = [1, 2, 3, 4, 5, 8, 16, 64]
# (rows, cols): odd row counts (tile and work-item remainders: 4-row tiles, 16-row work items)
SHAPES = {
    "legacy": [(1, 32), (3, 64), (17, 96), (33, 576), (7, 1536)],
    "k": [(1, 256), (3, 512), (17, 768), (37, 1536)],
}
# the VNNI kernels' own float order (see above)
ROW_LANE_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K)

needs_vnni = pytest.mark.skipif(not mm.vnni_available(), reason=f"AVX-512 VNNI kernels: {mm.AVX512_STATUS}")


def shapes(t: T) -> list[tuple[int, int]]:
    return SHAPES["k" if t in KQUANTS else "legacy"]


def _cases():
    for t in QUANTS:
        for rows, cols in shapes(t):
            yield pytest.param(t, rows, cols, id=f"{t.name}-{rows}x{cols}")


def assert_same_as_avx2(t: T, Y: np.ndarray, Yavx2: np.ndarray, B: np.ndarray, what) -> None:
    """Bit-identical, but for the row-lane types' order (see the module docstring)."""
    if t in ROW_LANE_TYPES:
        assert worst(np.abs(Y - Yavx2), 1e-6 * B) <= 1, what
        return
    same = Y.view(np.uint32) == Yavx2.view(np.uint32)
    assert same.all(), (what, np.argwhere(~same)[:5])


@needs_vnni
@pytest.mark.parametrize("t,rows,cols", list(_cases()))
@pytest.mark.slow
def test_vnni_against_oracle_and_avx2(t, rows, cols):
    rng = np.random.default_rng(rows * 1000 + cols + int(t))
    data = make_weights(t, rows, cols, rng)
    Wd = oracle_weights(t, data, rows, cols)
    for n in N_TOK:
        x = rng.standard_normal((n, cols)).astype(np.float32)
        Xd = act_values(t, quant.quantize_act(int(t), x), n, cols)
        B = bound_abs(Wd, Xd)
        Y = mm.matmul_py(data, int(t), x, impl="vnni")
        assert Y.shape == (n, rows) and Y.dtype == np.float32
        assert worst(np.abs(Y - Xd @ Wd.T), 1e-5 * B) <= 1, n
        quant_err = act_half_steps(t, x) @ np.abs(Wd).T
        assert worst(np.abs(Y - x.astype(np.float64) @ Wd.T), 1.001 * quant_err + 1e-5 * B) <= 1, n
        assert_same_as_avx2(t, Y, mm.matmul_py(data, int(t), x, impl="simd"), B, n)
        # one token at a time (AVX2's, or for the row-lane types their own): bit-identical everywhere
        impl = "vnni" if t in ROW_LANE_TYPES else "simd"
        one = np.concatenate([mm.matmul_py(data, int(t), x[i : i + 1], impl=impl) for i in range(n)])
        assert np.array_equal(Y.view(np.uint32), one.view(np.uint32)), n


@needs_vnni
@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_vnni_many_tokens_long_rows(t):
    """Token chunks (64) crossed, and rows so long that a work item holds only one 4-row tile."""
    rng = np.random.default_rng(20 + int(t))
    cols = 25600 if t in KQUANTS else 16384
    data = make_weights(t, 9, cols, rng)
    Wd = oracle_weights(t, data, 9, cols)
    for n in (5, 131):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        Xd = act_values(t, quant.quantize_act(int(t), x), n, cols)
        B = bound_abs(Wd, Xd)
        Y = mm.matmul_py(data, int(t), x, impl="vnni")
        assert worst(np.abs(Y - Xd @ Wd.T), 1e-5 * B) <= 1, n
        assert_same_as_avx2(t, Y, mm.matmul_py(data, int(t), x, impl="simd"), B, n)


@needs_vnni
@pytest.mark.parametrize("t", [T.Q4_1, T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_vnni_threads_give_identical_results(t):
    rng = np.random.default_rng(5)
    cols = 512 if t in KQUANTS else 96
    data = make_weights(t, 70, cols, rng)
    for n in (1, 5, 67):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        y1 = mm.matmul_py(data, int(t), x, nthreads=1, impl="vnni")
        y2 = mm.matmul_py(data, int(t), x, nthreads=2, impl="vnni")
        assert np.array_equal(y1.view(np.uint32), y2.view(np.uint32)), n


def libm_fmaf():
    """The C library's fmaf (one rounding, as the FMA instruction)."""
    fmaf = ctypes.CDLL(ctypes.util.find_library("m")).fmaf
    fmaf.argtypes = [ctypes.c_float, ctypes.c_float, ctypes.c_float]
    fmaf.restype = ctypes.c_float
    return fmaf


def fma_chain(ints: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """[t, r]: acc = fmaf(float32(ints[t, r, b]), scale[t, r, b], acc) over b in order, from acc = 0."""
    fmaf = libm_fmaf()
    n, rows, nb = ints.shape
    out = np.zeros((n, rows), dtype=np.float32)
    for t in range(n):
        for r in range(rows):
            acc = 0.0
            for b in range(nb):
                acc = fmaf(float(np.float32(ints[t, r, b])), float(scale[t, r, b]), acc)
            out[t, r] = acc
    return out


def legacy_row_lane_chain(t: T, data: np.ndarray, xq: np.ndarray, rows: int, cols: int, n: int) -> np.ndarray:
    """Y[t, r] by the legacy types' row-lane order, from the raw blocks (ggml's layouts, decoded here with
    numpy): exact integer block sums (numpy int64), the scale d_w * d_x rounded to float32, then the fmaf
    chain over blocks; for Q4_1 and Q5_1 a second fmaf chain of m_w * s_x, added at the end."""
    nb = cols // 32
    wb = data.reshape(rows, nb, {T.Q4_0: 18, T.Q4_1: 20, T.Q5_0: 22, T.Q5_1: 24, T.Q8_0: 34}[t])
    dw = wb[:, :, :2].copy().view(np.float16)[..., 0].astype(np.float32)
    has_min = t in (T.Q4_1, T.Q5_1)
    q_at = 4 if has_min else 2  # the quants (or qh) follow d, and m where the type has one
    if t in (T.Q4_0, T.Q4_1):
        packed = wb[:, :, q_at:].astype(np.int64)
        q = np.concatenate([packed & 15, packed >> 4], axis=2)  # values 0..15 then 16..31 of each block
    elif t in (T.Q5_0, T.Q5_1):  # bit j of the 32-bit qh: value j's fifth bit
        qh = wb[:, :, q_at : q_at + 4].copy().view("<u4").astype(np.int64)
        packed = wb[:, :, q_at + 4 :].astype(np.int64)
        q = np.concatenate([packed & 15, packed >> 4], axis=2) | (((qh >> np.arange(32)) & 1) << 4)
    else:
        q = wb[:, :, 2:].copy().view(np.int8).astype(np.int64)
    q = q - {T.Q4_0: 8, T.Q5_0: 16}.get(t, 0)
    xb = np.frombuffer(xq.tobytes(), dtype=Q8A).reshape(n, nb)
    isum = np.einsum("rbj,tbj->trb", q, xb["qs"].astype(np.int64))
    scale = dw[None, :, :] * xb["d"].astype(np.float32)[:, None, :]  # float32 products, rounded
    y = fma_chain(isum, scale)
    if not has_min:
        return y
    mw = wb[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    sx = np.broadcast_to(xb["s"].astype(np.float32)[:, None, :], (n, rows, nb))
    return y + fma_chain(np.broadcast_to(mw[None], (n, rows, nb)), sx)


def q45_k_row_lane_chain(t: T, data: np.ndarray, xq: np.ndarray, rows: int, cols: int, n: int) -> np.ndarray:
    """Y[t, r] by Q4_K's or Q5_K's row-lane order, from the raw super-blocks (ggml's layout, decoded here with
    numpy): exact integer sums isum (scaled products) and imin (mins x the token's sub-block sums of quants),
    the scales d_w * d_x and dmin_w * d_x rounded to float32, two fmaf chains over super-blocks, a - m."""
    nb = cols // 256
    size = 144 if t == T.Q4_K else 176
    wb = data.reshape(rows, nb, size)
    d = wb[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = wb[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    s = wb[:, :, 4:16].astype(np.int64)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], axis=2)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=2)
    qs = wb[:, :, size - 128 :].astype(np.int64).reshape(rows, nb, 4, 32)
    u = np.stack([qs & 15, qs >> 4], axis=3).reshape(rows, nb, 8, 32)  # sub-block 2p, then 2p+1
    if t == T.Q5_K:  # bit j of qh[l]: the fifth bit of value l of sub-block j
        qh = wb[:, :, 16:48].astype(np.int64)
        u = u | (((qh[:, :, None, :] >> np.arange(8)[None, None, :, None]) & 1) << 4)
    xb = np.frombuffer(xq.tobytes(), dtype=Q8K).reshape(n, nb)
    xqs = xb["qs"].astype(np.int64).reshape(n, nb, 8, 32)
    isum = np.einsum("rbj,rbji,tbji->trb", sc, u, xqs)
    imin = np.einsum("rbj,tbj->trb", mn, xqs.sum(axis=3))
    dx = xb["d"].astype(np.float32)[:, None, :]
    a = fma_chain(isum, d[None, :, :] * dx)  # float32 products, rounded
    m = fma_chain(imin, dmin[None, :, :] * dx)
    return a - m


def q6_k_row_lane_chain(data: np.ndarray, xq: np.ndarray, rows: int, cols: int, n: int) -> np.ndarray:
    """Y[t, r] by Q6_K's row-lane order, from the raw super-blocks (ggml's layout, decoded here with numpy):
    the exact integer sum of scale x (quant - 32) x activation quant per super-block, the scale d_w * d_x
    rounded to float32, one fmaf chain over super-blocks."""
    nb = cols // 256
    wb = data.reshape(rows, nb, 210)
    ql = wb[:, :, 0:128].astype(np.int64).reshape(rows, nb, 2, 2, 32)  # [half n][low/high 32 bytes][l]
    qh = wb[:, :, 128:192].astype(np.int64).reshape(rows, nb, 2, 1, 32)
    sc = wb[:, :, 192:208].view(np.int8).astype(np.int64)
    d = wb[:, :, 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
    # values 128n + 32m + l, m = 0..3: nibble m // 2 of ql byte 32 * (m % 2) + l, high bits 2m of qh
    quarters = [
        ((ql[:, :, :, m % 2] >> (4 * (m // 2))) & 15) | (((qh[:, :, :, 0] >> (2 * m)) & 3) << 4)
        for m in range(4)
    ]
    q = np.concatenate(quarters, axis=3).reshape(rows, nb, 256) - 32
    xb = np.frombuffer(xq.tobytes(), dtype=Q8K).reshape(n, nb)
    prod = np.einsum("rbv,tbv->trbv", q, xb["qs"].astype(np.int64)).reshape(n, rows, nb, 16, 16).sum(axis=4)
    isum = (prod * sc[None]).sum(axis=3)
    return fma_chain(isum, d[None, :, :] * xb["d"].astype(np.float32)[:, None, :])


ROW_LANE_CHAINS = {
    T.Q4_0: lambda *a: legacy_row_lane_chain(T.Q4_0, *a),
    T.Q4_1: lambda *a: legacy_row_lane_chain(T.Q4_1, *a),
    T.Q5_1: lambda *a: legacy_row_lane_chain(T.Q5_1, *a),
    T.Q5_0: lambda *a: legacy_row_lane_chain(T.Q5_0, *a),
    T.Q8_0: lambda *a: legacy_row_lane_chain(T.Q8_0, *a),
    T.Q4_K: lambda *a: q45_k_row_lane_chain(T.Q4_K, *a),
    T.Q5_K: lambda *a: q45_k_row_lane_chain(T.Q5_K, *a),
    T.Q6_K: q6_k_row_lane_chain,
}


@needs_vnni
@pytest.mark.parametrize("t", ROW_LANE_TYPES, ids=lambda t: t.name)
def test_row_lane_order_is_exact_on_every_path(t):
    rng = np.random.default_rng(40 + int(t))
    shapes = ((13, 512), (70, 1536)) if t in KQUANTS else ((13, 96), (70, 1536))
    for rows, cols in shapes:
        data = make_weights(t, rows, cols, rng)
        for n in (1, 2, 3, 4, 7, 8, 9, 13, 67, 131):  # both sides of each few-token limit
            x = rng.standard_normal((n, cols)).astype(np.float32)
            Y = mm.matmul_py(data, int(t), x, impl="vnni")
            for threads in (1, 2):
                got = mm.matmul_py(data, int(t), x, nthreads=threads, impl="vnni")
                assert np.array_equal(got.view(np.uint32), Y.view(np.uint32)), (rows, n, threads)
            one = np.concatenate([mm.matmul_py(data, int(t), x[i : i + 1], impl="vnni") for i in range(n)])
            assert np.array_equal(one.view(np.uint32), Y.view(np.uint32)), (rows, n)
            if rows * n <= 13 * 131:  # the chain in Python: small cases only
                want = ROW_LANE_CHAINS[t](data, quant.quantize_act(int(t), x), rows, cols, n)
                assert np.array_equal(Y.view(np.uint32), want.view(np.uint32)), (rows, n)


@needs_vnni
def test_vnni_q8_0_full_byte_range():
    """-128 quants (a file may hold them): the unsigned form (q + 128) must cope; the row-lane chain exactly,
    AVX2 within the SIMD-vs-scalar tolerance."""
    rng = np.random.default_rng(7)
    rows, cols = 9, 128
    raw = rng.integers(0, 256, size=(rows * cols // 32, 34), dtype=np.uint8)
    raw[:, 0:2] = _f16_bytes(rng.uniform(-0.1, 0.1, rows * cols // 32))
    raw[:, 2:6] = 0x80
    data = raw.reshape(rows, -1)
    Wd = oracle_weights(T.Q8_0, data, rows, cols)
    for n in (1, 6, 64):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        x[:, :32] = np.where(x[:, :32] > 0, 10.0, -10.0)  # activation quants of +-127
        Xd = act_values(T.Q8_0, quant.quantize_act(int(T.Q8_0), x), n, cols)
        B = bound_abs(Wd, Xd)
        Y = mm.matmul_py(data, int(T.Q8_0), x, impl="vnni")
        assert worst(np.abs(Y - Xd @ Wd.T), 1e-5 * B) <= 1
        assert_same_as_avx2(T.Q8_0, Y, mm.matmul_py(data, int(T.Q8_0), x, impl="simd"), B, n)
        want = legacy_row_lane_chain(T.Q8_0, data, quant.quantize_act(int(T.Q8_0), x), rows, cols, n)
        assert np.array_equal(Y.view(np.uint32), want.view(np.uint32)), n


@needs_vnni
def test_vnni_zero_activations_and_row_stride():
    rng = np.random.default_rng(8)
    for t in (T.Q4_0, T.Q5_1, T.Q2_K, T.Q4_K):
        data = make_weights(t, 5, 256, rng)
        for n in (1, 4, 7):
            assert not mm.matmul_py(data, int(t), np.zeros((n, 256), np.float32), impl="vnni").any()
            x = rng.standard_normal((n, 256)).astype(np.float32)
            out = np.full((n, 12), 7.0, dtype=np.float32)
            assert mm.matmul_py(data, int(t), x, out=out, impl="vnni") is out
            assert np.array_equal(out[:, :5], mm.matmul_py(data, int(t), x, impl="vnni"))
            assert (out[:, 5:] == 7.0).all()


@needs_vnni
@pytest.mark.parametrize("t", FLOATS, ids=lambda t: t.name)
def test_vnni_leaves_float_weights_to_avx2(t):
    rng = np.random.default_rng(9)
    data = make_weights(t, 7, 64, rng)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    assert np.array_equal(
        mm.matmul_py(data, int(t), x, impl="vnni"), mm.matmul_py(data, int(t), x, impl="simd")
    )


@needs_vnni
def test_auto_is_vnni_here():
    """matmul() (what the forward pass calls; matmul_py's impl="auto") takes the VNNI kernels."""
    assert mm.kernel_path() == "avx512-vnni"
    rng = np.random.default_rng(10)
    for t in (T.Q4_1, T.Q6_K):
        data = make_weights(t, 6, 512, rng)
        x = rng.standard_normal((9, 512)).astype(np.float32)
        assert np.array_equal(mm.matmul_py(data, int(t), x), mm.matmul_py(data, int(t), x, impl="vnni"))


# ---------------------------------------------------------------------------------------------------------
# Features and dispatch


def test_avx512_features_match_proc_cpuinfo():
    feats = cpu.avx512_features()
    assert set(feats) == {"avx512f", "avx512bw", "avx512vl", "avx512vnni"}
    assert cpu.has_avx512_vnni() == all(feats.values())
    flags = cpuinfo_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo flags")
    names = {
        "avx512f": "avx512f",
        "avx512bw": "avx512bw",
        "avx512vl": "avx512vl",
        "avx512vnni": "avx512_vnni",
    }
    assert feats == {k: v in flags for k, v in names.items()}
    if quant.simd_build() and cpu.has_avx512_vnni():
        assert mm.vnni_available(), mm.AVX512_STATUS


def _run(code: str, **env: str) -> str:
    full = {**os.environ, **env}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


_COMPARE = """
import numpy as np
from llamacy.kernels import matmul as mm
from tests.test_kernels import make_weights, T
rng = np.random.default_rng(0)
ok = True
for t in (T.Q4_0, T.Q4_K):
    data = make_weights(t, 9, 512, rng)
    x = rng.standard_normal((6, 512)).astype(np.float32)
    ok &= np.array_equal(mm.matmul_py(data, int(t), x), mm.matmul_py(data, int(t), x, impl="simd"))
print(mm.kernel_path(), mm.AVX512_STATUS, ok)
"""


@needs_vnni
def test_no_avx512_env_selects_avx2():
    assert _run(_COMPARE, LLAMACY_NO_AVX512="1") == "avx2 off (LLAMACY_NO_AVX512) True"
    assert _run(_COMPARE, LLAMACY_NO_AVX512="0").startswith("avx512-vnni available")


def test_cpu_without_avx512_never_imports_matmul512():
    """A CPU without AVX-512 (simulated): matmul runs, on AVX2, and the AVX-512 module is never loaded."""
    if not quant.simd_build():
        pytest.skip("portable build: no SIMD kernels at all")
    code = """
import sys
from llamacy.kernels import cpu
cpu.has_avx512_vnni = lambda: False
import numpy as np
from llamacy.kernels import matmul as mm
assert "llamacy.kernels.matmul512" not in sys.modules
try:
    mm.matmul_py(np.zeros((1, 18), np.uint8), 2, np.zeros((1, 32), np.float32), impl="vnni")
except ValueError as e:
    print("ValueError:", e)
print(mm.kernel_path(), mm.vnni_available())
"""
    out = _run(code)
    assert out.splitlines() == [
        "ValueError: impl 'vnni' is not available here: this CPU lacks AVX-512 F/BW/VL/VNNI",
        "avx2 False",
    ]
