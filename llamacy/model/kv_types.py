"""The KV cache row types by name: a leaf module, so that the config (sizing a cache), the cache itself
(allocating one) and the layer loop (passing the attention kernel its row format) read the same table
without importing each other.

A cached row is head_dim values of one KV head at one position. f32 and f16 rows are plain arrays of that
numpy type; q8_0 and q4_0 rows are GGML blocks of 32 values (their layout is llamacy.ggml_types'), so
head_dim must be a multiple of 32 for them. Row i of a head's cache starts at byte i * kv_row_bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llamacy.errors import UsageError
from llamacy.ggml_types import TYPES, GGMLType


@dataclass(frozen=True)
class KVType:
    fmt: int  # the attention kernel's row format id (llamacy/kernels/ops.pxd, KV_*)
    ggml: GGMLType  # the row's layout: GGML blocks (or single values) of this type
    dtype: type | None  # the numpy value type of a plain row; None for rows of quantized blocks


# Name order: the one the --kv-type error message has always listed.
KV_TYPE_TABLE: dict[str, KVType] = {
    "f16": KVType(1, GGMLType.F16, np.float16),
    "f32": KVType(0, GGMLType.F32, np.float32),
    "q8_0": KVType(2, GGMLType.Q8_0, None),
    "q4_0": KVType(3, GGMLType.Q4_0, None),
}
KV_TYPE_NAMES: tuple[str, ...] = tuple(KV_TYPE_TABLE)
# The plain (numpy-typed) ones, name -> dtype.
KV_TYPES: dict[str, type] = {name: t.dtype for name, t in KV_TYPE_TABLE.items() if t.dtype is not None}
DEFAULT_KV_TYPE = "f16"


def kv_type_info(kv_type: str) -> KVType:
    """The table row of a cache type name; UsageError (one line) for an unknown one."""
    try:
        return KV_TYPE_TABLE[kv_type]
    except (KeyError, TypeError):
        raise UsageError(f"--kv-type must be one of {', '.join(KV_TYPE_NAMES)}, got {kv_type!r}") from None


def kv_format(kv_type: str) -> int:
    """The attention kernel's row format id (ops.pxd: KV_F32 0, KV_F16 1, KV_Q8_0 2, KV_Q4_0 3)."""
    return kv_type_info(kv_type).fmt


def kv_row_bytes(kv_type: str, head_dim: int) -> int:
    """Bytes of one cached row (head_dim values of one KV head at one position); UsageError (one line) when
    a quantized type's blocks do not divide head_dim."""
    t = kv_type_info(kv_type)
    block, size = TYPES[t.ggml].block, TYPES[t.ggml].size
    if head_dim % block:
        raise UsageError(
            f"--kv-type {kv_type} needs a head_dim that is a multiple of {block}; this model's is {head_dim}"
        )
    return head_dim // block * size


def kv_dtype(kv_type: str) -> type:
    """The numpy dtype of a plain cache type (f16, f32); UsageError (one line) for an unknown name or a
    quantized type, whose rows are blocks (size them with kv_row_bytes)."""
    t = kv_type_info(kv_type)
    if t.dtype is None:
        raise UsageError(
            f"--kv-type {kv_type} stores rows of {t.ggml.name} blocks, not {', '.join(KV_TYPES)} values"
        )
    return t.dtype


def kv_itemsize(kv_type: str) -> int:
    """Bytes per cached value of a plain cache type (kv_dtype's; kv_row_bytes covers every type)."""
    return np.dtype(kv_dtype(kv_type)).itemsize
