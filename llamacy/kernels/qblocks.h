/* The activation blocks as blocks.pxd declares them, for the C kernels (amx.h, x16.h); matmul512 checks
 * that the sizes agree. */
#ifndef LLAMACY_QBLOCKS_H
#define LLAMACY_QBLOCKS_H

#include <stdint.h>

/* Q8 activations of the 32-value types: scale, scale x the sum of the quants, the quants. */
typedef struct {
    float d;
    float s;
    int8_t qs[32];
} lc_q8a;

/* Q8_K activations of the K-quants: scale, 256 quants, their sums by 16. */
typedef struct {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
} lc_q8k;

#endif /* LLAMACY_QBLOCKS_H */
