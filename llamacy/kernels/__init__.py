"""Quantized CPU kernels (Cython): activation quantization, row dequantization, matrix products.

Importing this package checks the CPU first: a SIMD build (AVX2/FMA/F16C) on a CPU without those
instructions would die on an illegal instruction inside a kernel, so instead we raise CPUError with one
sentence before any SIMD module (quant, matmul, ...) is imported.
"""

from __future__ import annotations

from llamacy.errors import CPUError
from llamacy.kernels import cpu

__all__ = ["CPUError", "ensure_cpu"]

_MESSAGE = (
    "This CPU lacks AVX2/FMA, which this build of llamacy needs; reinstall with LLAMACY_PORTABLE=1 "
    "(for example `LLAMACY_PORTABLE=1 pip install --force-reinstall llamacy`, or `make portable` in a "
    "source checkout) to get the portable build."
)


def ensure_cpu() -> None:
    """Raise CPUError if this is a SIMD build and the CPU lacks AVX2, FMA or F16C."""
    if cpu.simd_build() and not cpu.has_avx2_fma():
        raise CPUError(_MESSAGE)


ensure_cpu()
