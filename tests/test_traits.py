"""The kernels' traits table (llamacy.kernels.traits): one row per weight type the kernels compute with.

Walks the table: every row has every operation (dequantize, quantize, the scalar dot, the AVX2 product and,
where this CPU has AVX-512 VNNI, the VNNI product for the quantized types), agrees with ggml_types' table and
the gguf package's block sizes, and every operation of every row runs. A type without a row is an error at
every entry point, never an unwritten output.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from llamacy import ggml_types
from llamacy.kernels import matmul as mm
from llamacy.kernels import quant, traits
from llamacy.kernels import quantize as qz

T = GGMLQuantizationType
OPERATIONS = ("to_float", "from_float", "vec_dot", "mm_simd")
ROWS = traits.type_ids()
# Types a GGUF file may hold that the kernels do not compute with, and ids no GGML type has.
UNKNOWN = [t for t in ggml_types.TYPES if t not in ROWS] + [-1, 4, 40, 999]


def test_table_is_ggml_types_compute_set():
    assert set(ROWS) == set(ggml_types.COMPUTE_TYPES)


@pytest.mark.parametrize("t", ROWS, ids=lambda t: T(t).name)
def test_row_is_complete(t):
    row = traits.traits(t)
    assert row["name"] == T(t).name
    missing = [op for op in OPERATIONS if not row[op]]
    quantized = row["block_values"] > 1
    if quantized and mm.vnni_available() and not row["mm_vnni"]:
        missing.append("mm_vnni")
    assert not missing, f"{row['name']} lacks {missing}"
    assert (row["block_values"], row["block_bytes"]) == ggml_types.BLOCK_LAYOUT[t] == GGML_QUANT_SIZES[T(t)]
    assert row["act_format"] == (0 if not quantized else 1 if row["block_values"] == 32 else 2)
    assert quant.act_format_py(t) == row["act_format"]
    assert t in qz.QUANTIZE_TYPES


def test_matmul_rows_keeps_the_per_lane_kernels_of_the_row_lane_types():
    """matmul_rows (MoE experts, never repacked) takes the AVX2 per-lane kernel exactly where mm_simd would
    gather stored rows into row-lane tiles per product: Q4_0, Q8_0, Q4_K, Q6_K."""
    own = {T(t).name for t in ROWS if traits.traits(t)["mm_rows_perlane"]}
    assert own == {"Q4_0", "Q8_0", "Q4_K", "Q6_K"}


@pytest.mark.parametrize("t", ROWS, ids=lambda t: T(t).name)
def test_every_operation_runs(t):
    """quantize -> dequantize -> matmul on every kernel family, for one small matrix of each type."""
    rng = np.random.default_rng(t)
    cols = 512
    w = rng.standard_normal((5, cols)).astype(np.float32)
    raw = qz.quantize(t, w)
    assert raw.shape == (5, traits.row_bytes(t, cols))
    wd = qz.dequantize(t, raw, (5, cols))
    assert np.isfinite(wd).all() and np.abs(wd - w).max() < 2.0
    x = rng.standard_normal((3, cols)).astype(np.float32)
    ref = x.astype(np.float64) @ wd.astype(np.float64).T
    impls = ["scalar", "simd"] + (["vnni"] if mm.vnni_available() else [])
    for impl in impls:
        y = mm.matmul_py(raw, t, x, impl=impl)
        assert np.allclose(y, ref, rtol=0.05, atol=0.05 * np.abs(ref).max()), impl


@pytest.mark.parametrize("t", UNKNOWN)
def test_unknown_type_is_an_error(t):
    x = np.ones((1, 256), np.float32)
    data = np.zeros((1, 256), np.uint8)
    with pytest.raises(ValueError, match="no kernels"):
        traits.traits(t)
    with pytest.raises(ValueError, match="no kernels"):
        traits.row_bytes(t, 256)
    with pytest.raises(ValueError, match="no kernels"):
        mm.matmul_py(data, t, x)
    with pytest.raises(ValueError, match="no kernels"):
        qz.dequantize(t, data, (1, 256))
    with pytest.raises(ValueError, match="no kernels"):
        quant.quantize_act(t, x)
    with pytest.raises(ValueError, match="cannot quantize"):
        qz.quantize(t, x)
    assert quant.act_format_py(t) == -1
    assert not quant.supported(t)
