"""Refuse up front, with the numbers, a model and context that do not fit in memory."""

from __future__ import annotations

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
