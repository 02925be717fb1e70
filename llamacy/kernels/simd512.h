/* The AVX-512 intrinsics matmul512 uses (declared for Cython in simd512.pxd), on top of simd.h.
 *
 * Only matmul512 includes this, and setup.py compiles that module alone with
 * -mavx512f -mavx512bw -mavx512vl -mavx512vnni. There is no portable twin: a portable build does not build
 * matmul512 at all, and a SIMD build imports it only on a CPU that has these instructions.
 *
 * The kernels use the 256-bit EVEX forms (AVX512VL): VNNI's dot products on ymm registers, 32 of them
 * instead of AVX2's 16, at the clock speed of AVX2 code.
 */
#ifndef LLAMACY_SIMD512_H
#define LLAMACY_SIMD512_H

#include "simd.h"

#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__))
#error "matmul512 must be compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (setup.py does this)"
#endif

#include <immintrin.h>

/* The floats at p are read back from memory after this point: the compiler may not keep them in registers.
   A kernel that stores a few scale products and then uses each in an FMA wants that, because the FMA then
   takes the value as a broadcast from memory (a load, {1to8}) instead of a register shuffle per use, and
   the shuffle pipes are shared with the multipliers. */
#define lc_spill(p) __asm__ __volatile__("" : : "r"(p) : "memory")

#endif /* LLAMACY_SIMD512_H */
