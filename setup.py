"""Build the Cython kernels.

Environment switches:
  LLAMACY_PORTABLE=1     build without AVX2/FMA/F16C (scalar twins only); runs on any x86-64 or other CPU.
  LLAMACY_DEBUG_BUILD=1  bounds and wraparound checks on, -O1 -g: for hunting memory errors.
  LLAMACY_NATIVE=1       add -march=native (AVX-512 paths where the compiler finds them); not portable.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup

PORTABLE = os.environ.get("LLAMACY_PORTABLE", "") not in ("", "0")
DEBUG = os.environ.get("LLAMACY_DEBUG_BUILD", "") not in ("", "0")
NATIVE = os.environ.get("LLAMACY_NATIVE", "") not in ("", "0")
# Comma-separated module-name prefixes: build only these (development convenience).
ONLY = tuple(p for p in os.environ.get("LLAMACY_BUILD_ONLY", "").split(",") if p)

# Modules that must load on any CPU: they run before the AVX2 check can speak.
NO_SIMD = {"llamacy.kernels.cpu"}
# Element-wise float code (norms, SiLU/GELU, softmax, attention) may reassociate sums and call glibc's
# vector math (libmvec expf/tanhf): that is what lets GCC vectorise it. The integer kernels stay exact.
FAST_MATH = {"llamacy.kernels.ops"}
# The AVX-512 VNNI kernels: only these modules get the AVX-512 flags, and matmul imports them only on a CPU
# that has those instructions (cpu.has_avx512_vnni), so the floor stays AVX2. A portable build skips them.
# Their float arithmetic is spelled out with intrinsics; -ffp-contract=off keeps the compiler from fusing a
# product into a following add, which would break bit-equality with the AVX2 kernels.
AVX512 = {"llamacy.kernels.matmul512"}
# The weight quantizers port ggml's reference code, which rounds each product before adding: no fused
# multiply-adds (GCC contracts a*b+c into an FMA by default, which changes roundings and so blocks).
NO_CONTRACT = {"llamacy.kernels.qsearch", "llamacy.kernels.quantize_rows"}
# Only the whole-tensor quantizer runs OpenMP loops (prange); the rest use the thread team (threadpool.h).
OPENMP = {"llamacy.kernels.quantize"}
AVX512_FLAGS = [
    "-mavx512f",
    "-mavx512bw",
    "-mavx512vl",
    "-mavx512vnni",
    "-mprefer-vector-width=256",
    "-ffp-contract=off",
]


def compiler_takes(flags: list[str]) -> bool:
    """Whether the C compiler accepts these flags (old compilers lack -mamx-*: matmul512 then builds without
    its AMX steps, and runs without them)."""
    cc = os.environ.get("CC", "cc").split()
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "t.c")
        with open(src, "w") as f:
            f.write("int main(void) { return 0; }\n")
        try:
            r = subprocess.run([*cc, *flags, "-c", src, "-o", os.path.join(d, "t.o")], capture_output=True)
        except OSError:
            return False
        return r.returncode == 0


# Intel AMX's tile instructions for matmul512's prefill (amx.h), where the compiler has them: they run only
# where matmul512 finds the CPU and OS support them at import.
AMX_FLAGS = ["-mamx-tile", "-mamx-int8"]


def compile_args(name: str) -> list[str]:
    args = ["-O1", "-g"] if DEBUG else ["-O3"]
    if name in FAST_MATH:
        args += ["-ffast-math"]
    if name in OPENMP:
        args += ["-fopenmp"]
    if name in NO_CONTRACT:
        args += ["-ffp-contract=off"]
    args += ["-fno-math-errno", "-Wno-unused-function", "-Wno-unreachable-code"]
    if name not in NO_SIMD and not PORTABLE:
        args += ["-mavx2", "-mfma", "-mf16c"]
        if NATIVE:
            args += ["-march=native"]
    return args


def avx512_flags() -> list[str]:
    return AVX512_FLAGS + (AMX_FLAGS if compiler_takes(AMX_FLAGS) else [])


def extensions() -> list[Extension]:
    exts = []
    for path in sorted(glob("llamacy/**/*.pyx", recursive=True)):
        name = path[:-4].replace(os.sep, ".")
        if ONLY and not name.startswith(ONLY):
            continue
        if PORTABLE and name in AVX512:
            continue
        exts.append(
            Extension(
                name,
                [path],
                include_dirs=["llamacy/kernels"],
                depends=sorted(glob("llamacy/kernels/*.h")),  # recompile when a C header changes
                extra_compile_args=compile_args(name) + (avx512_flags() if name in AVX512 else []),
                extra_link_args=(["-fopenmp"] if name in OPENMP else [])
                + (["-lmvec", "-lm"] if name in FAST_MATH else []),
                define_macros=[
                    ("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
                    # Tells every module (cpu.pyx too, which is built without SIMD flags) which build this is.
                    ("LLAMACY_SIMD_BUILD", "0" if PORTABLE else "1"),
                ],
            )
        )
    return exts


directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "embedsignature": True,
}

setup(
    ext_modules=cythonize(
        extensions(),
        compiler_directives=directives,
        compile_time_env={"PORTABLE": PORTABLE},
        nthreads=int(os.environ.get("LLAMACY_BUILD_JOBS", "0")) or None,
        quiet=True,
    ),
)
