# CPU feature check. Built WITHOUT SIMD flags (setup.py's NO_SIMD) so that it loads on any CPU and can
# say, in one sentence, why the SIMD kernels cannot run, instead of the process dying on an illegal
# instruction. It must never import the SIMD modules.

import os

cdef extern from *:
    """
    #ifndef LLAMACY_SIMD_BUILD
    #define LLAMACY_SIMD_BUILD 1  /* built outside setup.py: assume the default (SIMD) flags */
    #endif
    static int llamacy_cpu_has(int which) {
    #if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
        __builtin_cpu_init();
        switch (which) {
            case 0: return __builtin_cpu_supports("avx2") != 0;
            case 1: return __builtin_cpu_supports("fma") != 0;
            case 2: return __builtin_cpu_supports("f16c") != 0;
            /* AVX-512 (libgcc also checks that the OS saves the zmm/opmask state, via XGETBV) */
            case 3: return __builtin_cpu_supports("avx512f") != 0;
            case 4: return __builtin_cpu_supports("avx512bw") != 0;
            case 5: return __builtin_cpu_supports("avx512vl") != 0;
            case 6: return __builtin_cpu_supports("avx512vnni") != 0;
            case 7: return __builtin_cpu_is("intel") != 0;
            case 8: return __builtin_cpu_is("amd") != 0;
        }
        return 0;
    #else
        (void)which;
        return 0;  /* not x86: no AVX2 */
    #endif
    }
    """
    const int LLAMACY_SIMD_BUILD
    int llamacy_cpu_has(int which) nogil


def has_avx2_fma():
    """True if this CPU has AVX2, FMA and F16C (what the SIMD build's kernels execute)."""
    return bool(llamacy_cpu_has(0) and llamacy_cpu_has(1) and llamacy_cpu_has(2))


def cpu_features():
    """{'avx2': bool, 'fma': bool, 'f16c': bool} for this CPU."""
    return {"avx2": bool(llamacy_cpu_has(0)), "fma": bool(llamacy_cpu_has(1)),
            "f16c": bool(llamacy_cpu_has(2))}


def avx512_features():
    """{'avx512f', 'avx512bw', 'avx512vl', 'avx512vnni': bool} for this CPU (and OS)."""
    return {"avx512f": bool(llamacy_cpu_has(3)), "avx512bw": bool(llamacy_cpu_has(4)),
            "avx512vl": bool(llamacy_cpu_has(5)), "avx512vnni": bool(llamacy_cpu_has(6))}


def vendor():
    """'intel', 'amd' or 'other': whose CPU this is (kernels tune their prefetching to it)."""
    return "intel" if llamacy_cpu_has(7) else "amd" if llamacy_cpu_has(8) else "other"


def avx512_allowed():
    """False where LLAMACY_NO_AVX512 asks for the AVX2 kernels only (matmul's products, ops' prompt
    attention; tests and benchmarks compare the two)."""
    return os.environ.get("LLAMACY_NO_AVX512", "") in ("", "0")


def has_avx512_vnni():
    """True if this CPU runs what matmul512 executes: AVX-512 F/BW/VL and VNNI (256-bit EVEX forms)."""
    return all(avx512_features().values())


def simd_build():
    """True if the kernel modules of this install were compiled with -mavx2 -mfma -mf16c.

    setup.py defines LLAMACY_SIMD_BUILD for every extension, so this module (itself built without SIMD
    flags) knows without importing a SIMD module.
    """
    return bool(LLAMACY_SIMD_BUILD)
