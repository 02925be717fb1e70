"""The KV cache value types by name: a leaf module, so that the config (sizing a cache) and the cache
itself (allocating one) read the same table without importing each other."""

from __future__ import annotations

import numpy as np

from llamacy.errors import UsageError

KV_TYPES: dict[str, type] = {"f16": np.float16, "f32": np.float32}
DEFAULT_KV_TYPE = "f16"


def kv_dtype(kv_type: str) -> type:
    """The numpy dtype of a cache type name; UsageError (one line) for an unknown one."""
    try:
        return KV_TYPES[kv_type]
    except (KeyError, TypeError):
        raise UsageError(f"--kv-type must be one of {', '.join(KV_TYPES)}, got {kv_type!r}") from None


def kv_itemsize(kv_type: str) -> int:
    """Bytes per cached value."""
    return np.dtype(kv_dtype(kv_type)).itemsize


def kv_format(kv_type: str) -> int:
    """The attention kernel's row format id (ops.pxd): 0 float32, 1 IEEE half."""
    return {"f32": 0, "f16": 1}[kv_type] if kv_type in KV_TYPES else kv_dtype(kv_type) and -1


def kv_row_bytes(kv_type: str, head_dim: int) -> int:
    """Bytes of one cached row (head_dim values of one KV head at one position)."""
    return head_dim * kv_itemsize(kv_type)
