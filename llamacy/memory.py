"""Refuse up front, with the numbers, a model and context that do not fit in memory."""

from __future__ import annotations

from collections.abc import Iterable

from llamacy.errors import LlamacyError


class OutOfMemoryError(LlamacyError):
    pass


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def human_size(n: float) -> str:
    """Bytes for people: 812 B, 125.5 KiB, 93.8 MiB, 1.2 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def check_fits(weights: int, kv_cache: int, scratch: int, what: str) -> None:
    """Weights are memory-mapped (page cache counts toward MemAvailable), so all three are compared."""
    avail = available_memory()
    need = weights + kv_cache + scratch
    if avail is not None and need > avail:
        raise OutOfMemoryError(
            f"{what} needs {_gib(need)} (weights {_gib(weights)} + KV cache {_gib(kv_cache)} + buffers "
            f"{_gib(scratch)}) but only {_gib(avail)} is available; lower --ctx-size"
        )


def weights_per_token(tensors: Iterable[tuple[str, int, int]], n_expert: int, n_used: int) -> tuple[int, int]:
    """(parameters, bytes) of the weights one token reads, from (name, elements, bytes) of every tensor.

    A mixture-of-experts model maps all of its experts (the memory check counts them all) but a token
    reads only n_used of the n_expert in each stacked ffn_*_exps tensor; everything else is read whole.
    """
    params = n_bytes = 0
    for name, elements, size in tensors:
        if n_expert and "_exps." in name:
            elements, size = elements * n_used // n_expert, size * n_used // n_expert
        params += elements
        n_bytes += size
    return params, n_bytes
