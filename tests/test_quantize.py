# ruff: noqa: E741 - the K-quant port below keeps ggml's variable names (l, L) to stay checkable line by line
"""Weight quantization kernels (llamacy.kernels.quantize) against independent oracles.

- Legacy types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) and BF16: bit-identical to gguf.quants.quantize, the numpy
  mirror of ggml's reference quantizers.
- K-quants (Q2_K..Q6_K): bit-identical to a scalar float32 port of ggml's quantize_row_*_ref written below
  in plain Python (np.float32 scalars round every operation as C floats do), and within the expected error
  of the source when dequantized by gguf.quants.dequantize.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from llamacy.kernels import quantize as qz

LEGACY = (QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1)
K_QUANTS = (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K)
f32 = np.float32


def _tricky_rows(rng: np.random.Generator, n_rows: int, n: int) -> np.ndarray:
    """Random rows plus the blocks that test rounding edges: zeros, constants, exact halves, a max that is
    negative, huge and tiny magnitudes, duplicated extremes of both signs."""
    x = rng.standard_normal((n_rows, n)).astype(np.float32)
    x[0, :32] = 0.0
    x[1, :32] = 1.0
    x[2, :32] = -3.0
    x[3, :32] = (np.arange(32) - 15.5) / 2  # halves after scaling
    x[4, :16], x[4, 16:32] = 5.0, -5.0  # |max| tie between signs: the first wins
    x[5] *= 1e-20
    x[6] *= 1e4
    x[7, :32] = np.linspace(-1, 1, 32, dtype=np.float32)
    x[8] = np.abs(x[8])  # all positive (min > 0 for the asymmetric types)
    x[9] = -np.abs(x[9])
    return x


@pytest.mark.parametrize("qtype", [*LEGACY, QT.BF16])
@pytest.mark.parametrize("scale", [1.0, 1e-3, 300.0])
def test_legacy_types_bit_identical_to_reference(qtype: QT, scale: float) -> None:
    rng = np.random.default_rng(int(qtype) * 7 + int(scale * 1000) % 97)
    x = _tricky_rows(rng, 40, 256) * np.float32(scale)
    want = gguf_quantize(x, qtype).view(np.uint8).reshape(x.shape[0], -1)
    got = qz.quantize(int(qtype), x)
    assert got.shape == want.shape
    bad = np.flatnonzero((got != want).any(axis=1))
    assert bad.size == 0, f"{qtype.name}: rows {bad[:5]} differ"


def test_f16_is_round_to_nearest_even() -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((8, 96)) * np.float32(1000)).astype(np.float32)
    x[0, :4] = [65504.0, 70000.0, 1e-8, -0.0]
    assert np.array_equal(qz.quantize(int(QT.F16), x).view(np.float16), x.astype(np.float16))
    assert np.array_equal(qz.quantize(int(QT.F32), x).view(np.float32), x)


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_K])
def test_results_do_not_depend_on_threads_or_layout(qtype: QT) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 512)).astype(np.float32)
    one = qz.quantize(int(qtype), x, n_threads=1)
    assert np.array_equal(one, qz.quantize(int(qtype), x, n_threads=4))
    assert np.array_equal(one, qz.quantize(int(qtype), x.reshape(4, 16, 512)))
    assert np.array_equal(one[3], qz.quantize(int(qtype), x[3])[0])  # a 1-D input is one row
    out = np.zeros_like(one)
    assert qz.quantize(int(qtype), np.asfortranarray(x), out=out) is out
    assert np.array_equal(out, one)


def test_argument_errors() -> None:
    x = np.ones((2, 48), dtype=np.float32)
    with pytest.raises(ValueError, match="multiple of 32"):
        qz.quantize(int(QT.Q8_0), x)
    with pytest.raises(ValueError, match="multiple of 256"):
        qz.quantize(int(QT.Q4_K), np.ones((1, 288), dtype=np.float32))
    with pytest.raises(ValueError, match="cannot quantize"):
        qz.quantize(int(QT.IQ4_NL), np.ones((1, 32), dtype=np.float32))
    with pytest.raises(ValueError, match="impl must be"):
        qz.quantize(int(QT.Q4_K), np.ones((1, 256), dtype=np.float32), impl="simd")
    with pytest.raises(ValueError, match="out must be"):
        qz.quantize(int(QT.Q8_0), np.ones((2, 32), dtype=np.float32), out=np.empty(10, dtype=np.uint8))
    assert qz.row_bytes(int(QT.Q4_K), 512) == 288
    assert qz.quantize(int(QT.Q8_0), np.ones((0, 32), dtype=np.float32)).shape == (0, 34)


@pytest.mark.parametrize("qtype", [QT.F16, QT.BF16, *LEGACY, *K_QUANTS])
def test_parallel_dequantize_matches_one_thread(qtype: QT) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((33, 512)).astype(np.float32)
    raw = qz.quantize(int(qtype), x)
    want = qz.dequantize(int(qtype), raw, x.shape, n_threads=1)
    assert np.array_equal(qz.dequantize(int(qtype), raw, x.shape, n_threads=3), want)
    assert np.array_equal(want.reshape(-1), gguf_dequantize(raw, qtype).reshape(-1))


# Relative RMS error of random Gaussian rows after a round trip; ggml's reference quantizers land at about
# 0.29 (Q2_K), 0.15 (Q3_K), 0.071 (Q4_K), 0.036 (Q5_K), 0.018 (Q6_K), 0.0054 (Q8_0).
ERROR_BOUND = {QT.Q2_K: 0.32, QT.Q3_K: 0.17, QT.Q4_K: 0.08, QT.Q5_K: 0.04, QT.Q6_K: 0.02, QT.Q8_0: 0.006,
               QT.Q4_0: 0.1, QT.Q4_1: 0.09, QT.Q5_0: 0.05, QT.Q5_1: 0.045}  # fmt: skip


@pytest.mark.parametrize("qtype", list(ERROR_BOUND))
def test_round_trip_error(qtype: QT) -> None:
    rng = np.random.default_rng(int(qtype))
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    back = gguf_dequantize(qz.quantize(int(qtype), x), qtype).reshape(x.shape)
    rel = np.sqrt(np.mean((back - x) ** 2) / np.mean(x**2))
    assert rel < ERROR_BOUND[qtype]
    zeros = gguf_dequantize(qz.quantize(int(qtype), np.zeros((1, 256), np.float32)), qtype)
    assert not np.any(zeros)


@pytest.mark.parametrize("qtype", K_QUANTS)
def test_k_quants_bit_identical_to_scalar_port(qtype: QT) -> None:
    rng = np.random.default_rng(100 + int(qtype))
    x = rng.standard_normal((3, 256)).astype(np.float32)
    x[1, :16] = 0.0  # an all-zero sub-block
    x[1, 100:140] = 2.5  # a constant stretch
    x[2] *= np.float32(1e-3)
    x[2, 7] = 40.0  # one outlier
    got = qz.quantize(int(qtype), x)
    assert np.array_equal(got, qz.quantize(int(qtype), x, impl="scalar"))
    for r in range(x.shape[0]):
        want = PORTS[qtype](x[r])
        assert got[r].tobytes() == want, f"{qtype.name} row {r}"


@pytest.mark.parametrize("qtype", K_QUANTS)
def test_k_quant_lanes_match_scalar_search(qtype: QT) -> None:
    """The 8-sub-blocks-at-a-time scale searches give the scalar searches' bytes, flat and zero sub-blocks
    included (the scalar code returns early for those)."""
    rng = np.random.default_rng(200 + int(qtype))
    x = _tricky_rows(rng, 96, 512)
    x[10, 32:64] = 7.0  # one flat Q4_K sub-block among normal ones
    x[11, ::2] = 0.0
    x[12, :256] = np.abs(x[12, :256]) + 5  # min > 0
    x[13] = np.round(x[13] * 2)  # few distinct values: many equal-error trials
    for scale in (np.float32(1), np.float32(1e-6), np.float32(1e5)):
        xs = x * scale
        assert np.array_equal(qz.quantize(int(qtype), xs), qz.quantize(int(qtype), xs, impl="scalar"))


# ---------------------------------------------------------------------------------------------------------
# A scalar float32 port of ggml-quants.c's reference K-quant quantizers, kept as close to the C as Python
# allows. Every intermediate is an np.float32, so each operation rounds as in C without FMA contraction.


def nearest_int(fval: np.float32) -> int:
    val = np.array(f32(fval) + f32(12582912.0), dtype=np.float32)
    i = int(val.view(np.int32))
    return (i & 0x007FFFFF) - 0x00400000


def fp16_bits(v: np.float32) -> int:
    return int(np.array(f32(v), dtype=np.float32).astype(np.float16).view(np.uint16))


def fp16_value(bits: int) -> np.float32:
    return f32(np.array(bits, dtype=np.uint16).view(np.float16))


def make_qkx2_quants(n, nmax, x, weights, L, rmin, rdelta, nstep, use_mad):
    mn, mx = x[0], x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        mn = x[i] if x[i] < mn else mn
        mx = x[i] if x[i] > mx else mx
        sum_w += weights[i]
        sum_x += weights[i] * x[i]
    if mn > 0:
        mn = f32(0)
    if mx == mn:
        L[:n] = [0] * n
        return f32(0), -mn
    iscale = f32(nmax) / (mx - mn)
    scale = f32(1) / iscale
    best_error = f32(0)
    for i in range(n):
        L[i] = max(0, min(nmax, nearest_int(iscale * (x[i] - mn))))
        diff = scale * f32(L[i]) + mn - x[i]
        diff = abs(diff) if use_mad else diff * diff
        best_error += weights[i] * diff
    laux = [0] * n
    for step in range(nstep + 1):
        iscale = (f32(rmin) + f32(rdelta) * f32(step) + f32(nmax)) / (mx - mn)
        sum_l = sum_l2 = sum_xl = f32(0)
        for i in range(n):
            l = max(0, min(nmax, nearest_int(iscale * (x[i] - mn))))
            laux[i] = l
            w = weights[i]
            sum_l += w * f32(l)
            sum_l2 += w * f32(l) * f32(l)
            sum_xl += w * f32(l) * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = f32(0)
                this_scale = sum_xl / sum_l2
            cur_error = f32(0)
            for i in range(n):
                diff = this_scale * f32(laux[i]) + this_min - x[i]
                diff = abs(diff) if use_mad else diff * diff
                cur_error += weights[i] * diff
            if cur_error < best_error:
                L[:n] = laux
                best_error, scale, mn = cur_error, this_scale, this_min
    return scale, -mn


def make_qx_quants(n, nmax, x, L):
    mx, amax = f32(0), f32(0)
    for v in x[:n]:
        if abs(v) > amax:
            amax, mx = abs(v), v
    if amax < f32(1e-15):
        L[:n] = [0] * n
        return f32(0)

    def fit(iscale):
        sumlx = suml2 = f32(0)
        ls = []
        for i in range(n):
            l = max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
            ls.append(l)
            w = x[i] * x[i]
            sumlx += w * x[i] * f32(l)
            suml2 += w * f32(l) * f32(l)
        return ls, sumlx, suml2

    iscale = f32(-nmax) / mx
    ls, sumlx, suml2 = fit(iscale)
    L[:n] = [l + nmax for l in ls]
    scale = sumlx / suml2 if suml2 != 0 else f32(0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(f32(nmax) + f32(0.1) * f32(step)) / mx
        ls, sumlx, suml2 = fit(iscale)
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            L[:n] = [l + nmax for l in ls]
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


def make_q3_quants(n, nmax, x, L):
    mx, amax = f32(0), f32(0)
    for v in x[:n]:
        if abs(v) > amax:
            amax, mx = abs(v), v
    if amax < f32(1e-15):
        L[:n] = [0] * n
        return f32(0)
    iscale = f32(-nmax) / mx
    sumlx = suml2 = f32(0)
    for i in range(n):
        L[i] = max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
        w = x[i] * x[i]
        sumlx += w * x[i] * f32(L[i])
        suml2 += w * f32(L[i]) * f32(L[i])
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = x[i] * x[i]
            slx = sumlx - w * x[i] * f32(L[i])
            if slx > 0:
                sl2 = suml2 - w * f32(L[i]) * f32(L[i])
                new_l = max(-nmax, min(nmax - 1, nearest_int(x[i] * sl2 / slx)))
                if new_l != L[i]:
                    slx += w * x[i] * f32(new_l)
                    sl2 += w * f32(new_l) * f32(new_l)
                    if sl2 > 0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i], sumlx, suml2 = new_l, slx, sl2
                        n_changed += 1
        if not n_changed:
            break
    for i in range(n):
        L[i] += nmax
    return sumlx / suml2 if suml2 > 0 else f32(0)


def _pack2(L: list[int]) -> bytes:
    qs = bytearray(64)
    for j in range(0, 256, 128):
        for l in range(32):
            qs[j // 4 + l] = L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6)
    return bytes(qs)


def q2_k_ref(xr: np.ndarray) -> bytes:
    x = [f32(v) for v in xr]
    L, scales, mins = [0] * 256, [f32(0)] * 16, [f32(0)] * 16
    max_scale = max_min = f32(0)
    for j in range(16):
        w = [abs(v) for v in x[16 * j : 16 * j + 16]]
        sub = [0] * 16
        scales[j], mins[j] = make_qkx2_quants(16, 3, x[16 * j : 16 * j + 16], w, sub, -0.5, 0.1, 15, True)
        L[16 * j : 16 * j + 16] = sub
        max_scale = scales[j] if scales[j] > max_scale else max_scale
        max_min = mins[j] if mins[j] > max_min else max_min
    sc = [0] * 16
    d = dmin = fp16_bits(f32(0))
    if max_scale > 0:
        iscale = f32(15) / max_scale
        sc = [nearest_int(iscale * s) & 0xFF for s in scales]
        d = fp16_bits(max_scale / f32(15))
    if max_min > 0:
        iscale = f32(15) / max_min
        sc = [(s | (nearest_int(iscale * m) << 4)) & 0xFF for s, m in zip(sc, mins, strict=True)]
        dmin = fp16_bits(max_min / f32(15))
    for j in range(16):
        dd = fp16_value(d) * f32(sc[j] & 0xF)
        if dd == 0:
            continue
        dm = fp16_value(dmin) * f32(sc[j] >> 4)
        for ii in range(16):
            L[16 * j + ii] = max(0, min(3, nearest_int((x[16 * j + ii] + dm) / dd)))
    return bytes(sc) + _pack2(L) + d.to_bytes(2, "little") + dmin.to_bytes(2, "little")


def q3_k_ref(xr: np.ndarray) -> bytes:
    x = [f32(v) for v in xr]
    L, scales = [0] * 256, [f32(0)] * 16
    max_scale = amax = f32(0)
    for j in range(16):
        sub = [0] * 16
        scales[j] = make_q3_quants(16, 4, x[16 * j : 16 * j + 16], sub)
        L[16 * j : 16 * j + 16] = sub
        if abs(scales[j]) > amax:
            amax, max_scale = abs(scales[j]), scales[j]
    packed = [0] * 12
    d = fp16_bits(f32(0))
    if max_scale != 0:
        iscale = f32(-32) / max_scale
        for j in range(16):
            l = int(np.int8(nearest_int(iscale * scales[j])))
            l = max(-32, min(31, l)) + 32
            if j < 8:
                packed[j] = l & 0xF
            else:
                packed[j - 8] |= (l & 0xF) << 4
            packed[j % 4 + 8] |= (l >> 4) << (2 * (j // 4))
        d = fp16_bits(f32(1) / iscale)
    for j in range(16):
        s = packed[j] & 0xF if j < 8 else packed[j - 8] >> 4
        s = (s | (((packed[8 + j % 4] >> (2 * (j // 4))) & 3) << 4)) - 32
        dd = fp16_value(d) * f32(s)
        if dd == 0:
            continue
        for ii in range(16):
            L[16 * j + ii] = max(-4, min(3, nearest_int(x[16 * j + ii] / dd))) + 4
    hmask = bytearray(32)
    for j in range(256):
        if L[j] > 3:
            hmask[j % 32] |= 1 << (j // 32)
            L[j] -= 4
    return bytes(hmask) + _pack2(L) + bytes(packed) + d.to_bytes(2, "little")


def _k4_ref(xr: np.ndarray, nmax: int, rmin: float, nstep: int) -> tuple[list[int], bytes, int, int]:
    """The shared part of Q4_K and Q5_K: L (0..nmax), the 12 packed scale bytes, d and dmin bits."""
    x = [f32(v) for v in xr]
    L, scales, mins = [0] * 256, [f32(0)] * 8, [f32(0)] * 8
    max_scale = max_min = f32(0)
    for j in range(8):
        sub = x[32 * j : 32 * j + 32]
        sum_x2 = f32(0)
        for v in sub:
            sum_x2 += v * v
        av_x = np.sqrt(sum_x2 / f32(32))
        w = [av_x + abs(v) for v in sub]
        ls = [0] * 32
        scales[j], mins[j] = make_qkx2_quants(32, nmax, sub, w, ls, rmin, 0.1, nstep, False)
        L[32 * j : 32 * j + 32] = ls
        max_scale = scales[j] if scales[j] > max_scale else max_scale
        max_min = mins[j] if mins[j] > max_min else max_min
    inv_scale = f32(63) / max_scale if max_scale > 0 else f32(0)
    inv_min = f32(63) / max_min if max_min > 0 else f32(0)
    packed = [0] * 12
    for j in range(8):
        ls = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
        lm = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
        if j < 4:
            packed[j], packed[j + 4] = ls, lm
        else:
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4)
            packed[j - 4] |= (ls >> 4) << 6
            packed[j] |= (lm >> 4) << 6
    d, dmin = fp16_bits(max_scale / f32(63)), fp16_bits(max_min / f32(63))
    for j in range(8):
        if j < 4:
            sc, m = packed[j] & 63, packed[j + 4] & 63
        else:
            sc = (packed[j + 4] & 0xF) | ((packed[j - 4] >> 6) << 4)
            m = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4)
        dd = fp16_value(d) * f32(sc)
        if dd == 0:
            continue
        dm = fp16_value(dmin) * f32(m)
        for ii in range(32):
            L[32 * j + ii] = max(0, min(nmax, nearest_int((x[32 * j + ii] + dm) / dd)))
    return L, bytes(packed), d, dmin


def q4_k_ref(xr: np.ndarray) -> bytes:
    L, packed, d, dmin = _k4_ref(xr, 15, -1.0, 20)
    qs = bytearray(128)
    for n, j in enumerate(range(0, 256, 64)):
        for l in range(32):
            qs[32 * n + l] = L[j + l] | (L[j + l + 32] << 4)
    return d.to_bytes(2, "little") + dmin.to_bytes(2, "little") + packed + bytes(qs)


def q5_k_ref(xr: np.ndarray) -> bytes:
    L, packed, d, dmin = _k4_ref(xr, 31, -0.5, 15)
    qh, ql = bytearray(32), bytearray(128)
    m1, m2 = 1, 2
    for k, n in enumerate(range(0, 256, 64)):
        for j in range(32):
            l1, l2 = L[n + j], L[n + j + 32]
            if l1 > 15:
                l1 -= 16
                qh[j] |= m1
            if l2 > 15:
                l2 -= 16
                qh[j] |= m2
            ql[32 * k + j] = l1 | (l2 << 4)
        m1, m2 = m1 << 2, m2 << 2
    return d.to_bytes(2, "little") + dmin.to_bytes(2, "little") + packed + bytes(qh) + bytes(ql)


def q6_k_ref(xr: np.ndarray) -> bytes:
    x = [f32(v) for v in xr]
    L, scales = [0] * 256, [f32(0)] * 16
    max_scale = max_abs = f32(0)
    for ib in range(16):
        sub = [0] * 16
        scales[ib] = make_qx_quants(16, 32, x[16 * ib : 16 * ib + 16], sub)
        L[16 * ib : 16 * ib + 16] = sub
        if abs(scales[ib]) > max_abs:
            max_abs, max_scale = abs(scales[ib]), scales[ib]
    if max_abs < f32(1e-15):
        return bytes(208) + fp16_bits(f32(0)).to_bytes(2, "little")
    iscale = f32(-128) / max_scale
    d = fp16_bits(f32(1) / iscale)
    sc = [min(127, nearest_int(iscale * s)) for s in scales]
    for j in range(16):
        dd = fp16_value(d) * f32(sc[j])
        if dd == 0:
            continue
        for ii in range(16):
            L[16 * j + ii] = max(-32, min(31, nearest_int(x[16 * j + ii] / dd))) + 32
    ql, qh = bytearray(128), bytearray(64)
    for h, j in enumerate(range(0, 256, 128)):
        for l in range(32):
            ql[64 * h + l] = (L[j + l] & 0xF) | ((L[j + l + 64] & 0xF) << 4)
            ql[64 * h + l + 32] = (L[j + l + 32] & 0xF) | ((L[j + l + 96] & 0xF) << 4)
            qh[32 * h + l] = (
                (L[j + l] >> 4)
                | ((L[j + l + 32] >> 4) << 2)
                | ((L[j + l + 64] >> 4) << 4)
                | ((L[j + l + 96] >> 4) << 6)
            )
    return bytes(ql) + bytes(qh) + np.array(sc, dtype=np.int8).tobytes() + d.to_bytes(2, "little")


PORTS = {QT.Q2_K: q2_k_ref, QT.Q3_K: q3_k_ref, QT.Q4_K: q4_k_ref, QT.Q5_K: q5_k_ref, QT.Q6_K: q6_k_ref}
