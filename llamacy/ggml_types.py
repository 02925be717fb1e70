"""The GGML tensor types: ids as GGUF stores them, block sizes and bytes per block.

One table (TYPES) shared by the GGUF reader (to validate tensor sizes), the model loader and the converter
(which types the kernels compute with).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


# One row per type: (values per block, bytes per block, whether the kernels compute with it). Every type a
# GGUF file may hold, so that the reader can validate sizes even of tensors whose type our kernels do not
# compute with. For the computed types the kernels keep their own row (llamacy.kernels.traits: the block
# structs and operations); tests/test_traits.py holds the two tables to each other.
@dataclass(frozen=True)
class TypeLayout:
    block: int  # values per block (1 for the plain number types)
    size: int  # bytes per block
    compute: bool = False  # the kernels compute with it (matmul, dequantize, quantize)


TYPES: dict[int, TypeLayout] = {
    GGMLType.F32: TypeLayout(1, 4, compute=True),
    GGMLType.F16: TypeLayout(1, 2, compute=True),
    GGMLType.Q4_0: TypeLayout(32, 18, compute=True),
    GGMLType.Q4_1: TypeLayout(32, 20, compute=True),
    GGMLType.Q5_0: TypeLayout(32, 22, compute=True),
    GGMLType.Q5_1: TypeLayout(32, 24, compute=True),
    GGMLType.Q8_0: TypeLayout(32, 34, compute=True),
    GGMLType.Q8_1: TypeLayout(32, 40),
    GGMLType.Q2_K: TypeLayout(256, 84, compute=True),
    GGMLType.Q3_K: TypeLayout(256, 110, compute=True),
    GGMLType.Q4_K: TypeLayout(256, 144, compute=True),
    GGMLType.Q5_K: TypeLayout(256, 176, compute=True),
    GGMLType.Q6_K: TypeLayout(256, 210, compute=True),
    GGMLType.Q8_K: TypeLayout(256, 292),
    GGMLType.IQ2_XXS: TypeLayout(256, 66),
    GGMLType.IQ2_XS: TypeLayout(256, 74),
    GGMLType.IQ3_XXS: TypeLayout(256, 98),
    GGMLType.IQ1_S: TypeLayout(256, 50),
    GGMLType.IQ4_NL: TypeLayout(32, 18),
    GGMLType.IQ3_S: TypeLayout(256, 110),
    GGMLType.IQ2_S: TypeLayout(256, 82),
    GGMLType.IQ4_XS: TypeLayout(256, 136),
    GGMLType.I8: TypeLayout(1, 1),
    GGMLType.I16: TypeLayout(1, 2),
    GGMLType.I32: TypeLayout(1, 4),
    GGMLType.I64: TypeLayout(1, 8),
    GGMLType.F64: TypeLayout(1, 8),
    GGMLType.IQ1_M: TypeLayout(256, 56),
    GGMLType.BF16: TypeLayout(1, 2, compute=True),
    GGMLType.TQ1_0: TypeLayout(256, 54),
    GGMLType.TQ2_0: TypeLayout(256, 66),
    GGMLType.MXFP4: TypeLayout(32, 17),
}

# Views of the table.
BLOCK_LAYOUT: dict[int, tuple[int, int]] = {t: (row.block, row.size) for t, row in TYPES.items()}
COMPUTE_TYPES: frozenset[int] = frozenset(t for t, row in TYPES.items() if row.compute)


def type_name(t: int) -> str:
    try:
        return GGMLType(t).name
    except ValueError:
        return f"type {t}"


def row_bytes(t: int, n_values: int) -> int:
    """Bytes of one row of n_values values; n_values must be a whole number of blocks."""
    try:
        row = TYPES[t]
    except KeyError:
        raise ValueError(f"unknown GGML type {t}") from None
    block, size = row.block, row.size
    if n_values % block:
        raise ValueError(f"{type_name(t)} rows need a multiple of {block} values, got {n_values}")
    return n_values // block * size
