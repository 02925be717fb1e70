"""Our Q4_K product beside llama.cpp's repacked Q4_K kernel, bit for bit, on the same inputs.

    python3 benchmarks/check_kernels_vs_ggml.py --lib /path/to/llama.cpp/build/bin/libggml-cpu.so

llama.cpp repacks Q4_K weights at load into 8-row interleaved blocks (block_q4_Kx8) on any AVX2 CPU and
multiplies them with ggml_gemv_q4_K_8x8_q8_K (one token). Our AVX-512 VNNI kernels follow that float order
(issue #29); this script repacks random Q4_K rows into llama.cpp's layout, quantizes one activation row with
our Q8_K quantizer (the same block layout as ggml's block_q8_K), calls ggml's exported gemv through ctypes and
compares the outputs with ours (impl="vnni") and with our AVX2 kernel (per-lane order), as uint32 bits.
It needs a native build of llama.cpp (benchmarks/build_reference.sh) and a CPU with AVX-512 VNNI.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llamacy.kernels import matmul as mm  # noqa: E402
from llamacy.kernels import quant  # noqa: E402
from tests.test_kernels import T, make_weights  # noqa: E402

Q4K_BYTES = 144  # d, dmin (fp16), 12 bytes of 6-bit scales/mins, 128 bytes of nibbles


def pack_scales(s: np.ndarray, m: np.ndarray) -> np.ndarray:
    """One sub-block's scales s[8] and mins m[8] of 8 rows (0..63 each) in block_q4_Kx8's 12-byte form:
    the low 6 bits of rows 0-3, their top 2 bits carried by rows 4-7's bytes, rows 4-7's low nibbles."""
    out = np.zeros(12, dtype=np.uint8)
    for j in range(4):
        out[j] = (s[j] & 63) | ((s[4 + j] & 48) << 2)
        out[4 + j] = (m[j] & 63) | ((m[4 + j] & 48) << 2)
        out[8 + j] = (s[4 + j] & 15) | ((m[4 + j] & 15) << 4)
    return out


def repack_q4_k_x8(data: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Q4_K rows -> block_q4_Kx8 (d[8], dmin[8], scales[96], qs[1024] per 8 rows and super-block)."""
    nb = cols // 256
    blk = data.reshape(rows, nb, Q4K_BYTES).astype(np.int64)
    out = np.zeros((rows // 8, nb, 32 + 96 + 1024), dtype=np.uint8)
    for g in range(rows // 8):
        for b in range(nb):
            rec = blk[8 * g : 8 * g + 8, b]
            o = out[g, b]
            o[0:16] = rec[:, 0:2].reshape(-1)  # the 8 d's
            o[16:32] = rec[:, 2:4].reshape(-1)  # the 8 dmin's
            sc = rec[:, 4:16]
            # sub-block j's scale and min of every row (Q4_K's 12-byte packing, decoded)
            s_lo, m_lo = sc[:, 0:4] & 63, sc[:, 4:8] & 63
            s_hi = (sc[:, 8:12] & 15) | ((sc[:, 0:4] >> 6) << 4)
            m_hi = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
            for j in range(4):
                o[32 + 12 * j : 44 + 12 * j] = pack_scales(s_lo[:, j], m_lo[:, j])
                o[80 + 12 * j : 92 + 12 * j] = pack_scales(s_hi[:, j], m_hi[:, j])
            # the nibble bytes, 8 at a time from each row in turn
            qs = rec[:, 16:]
            for i in range(128):
                o[128 + 8 * i : 136 + 8 * i] = qs[i % 8, 8 * (i // 8) : 8 * (i // 8) + 8]
    return np.ascontiguousarray(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", required=True, help="llama.cpp's libggml-cpu.so (native build)")
    args = ap.parse_args()
    if not mm.vnni_available():
        print("this CPU (or build) has no AVX-512 VNNI kernels: nothing to compare", file=sys.stderr)
        return 1
    gemv = ctypes.CDLL(args.lib).ggml_gemv_q4_K_8x8_q8_K
    rng = np.random.default_rng(3)
    ok = True
    for rows, cols in ((8, 256), (64, 1536), (1536, 1536), (256, 8960)):
        data = make_weights(T.Q4_K, rows, cols, rng)
        x = rng.standard_normal((1, cols)).astype(np.float32)
        xq = np.ascontiguousarray(quant.quantize_act(int(T.Q4_K), x))
        ours = mm.matmul_py(data, int(T.Q4_K), x, impl="vnni")[0]
        avx2 = mm.matmul_py(data, int(T.Q4_K), x, impl="simd")[0]
        packed = repack_q4_k_x8(data, rows, cols)
        ref = np.zeros(rows, dtype=np.float32)
        gemv(
            ctypes.c_int(cols),
            ref.ctypes.data_as(ctypes.c_void_p),
            ctypes.c_size_t(rows),
            packed.ctypes.data_as(ctypes.c_void_p),
            xq.ctypes.data_as(ctypes.c_void_p),
            ctypes.c_int(1),
            ctypes.c_int(rows),
        )
        same = np.array_equal(ours.view(np.uint32), ref.view(np.uint32))
        same_avx2 = np.array_equal(avx2.view(np.uint32), ref.view(np.uint32))
        print(
            f"Q4_K {rows}x{cols}: VNNI == ggml {same}, AVX2 == ggml {same_avx2}, max |VNNI - ggml| {np.abs(ours - ref).max():.3g}"
        )
        ok &= same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
