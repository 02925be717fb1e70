# Stored weights read one value (or one scale) at a time: shared by the scalar dot products (vecdot.pyx),
# dequantization (dequant.pyx), weight quantization (quantize_rows.pyx) and the scalar tails of the SIMD
# tiles. The SIMD unpacking of whole blocks is simd.pxd's and kunpack.pxd's.
from libc.stdint cimport int32_t, uint8_t, uint32_t

from llamacy.kernels.blocks cimport *
from llamacy.kernels.simd cimport bf16_to_f32, fp16, load_u32


# One value of a float weight type.
cdef inline float fvalue(const fblock* p) noexcept nogil:
    if fblock is float:
        return p[0]
    elif fblock is block_f16:
        return fp16(p[0].bits)
    else:
        return bf16_to_f32(p[0].bits)


# Value j (0..31) of a legacy block as the integer its scale multiplies: q - 8 (Q4_0), q - 16 (Q5_0), q
# (Q8_0; Q4_1 and Q5_1, whose offset is the block's min m). Value j sits in the low nibble of qs[j] for
# j < 16, in the high nibble of qs[j - 16] above; bit j of qh (little-endian) is a 5-bit value's top bit.
cdef inline int32_t lvalue(const lblock* b, int j) noexcept nogil:
    cdef int32_t q
    if lblock is block_q8_0:
        return b.qs[j]
    else:
        q = (b.qs[j % 16] >> (4 * (j // 16))) & 0xF
        if lblock is block_q5_0 or lblock is block_q5_1:
            q |= ((load_u32(b.qh) >> j) & 1) << 4
        if lblock is block_q4_0:
            q -= 8
        elif lblock is block_q5_0:
            q -= 16
        return q


# Q4_K/Q5_K: scale and min of sub-block j (0..7), 6 bits each, packed in 12 bytes:
#   j < 4:  scale = q[j] & 63,                          min = q[j+4] & 63
#   j >= 4: scale = (q[j+4] & 15) | (q[j-4] >> 6) << 4, min = (q[j+4] >> 4) | (q[j] >> 6) << 4
cdef inline void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) noexcept nogil:
    if j < 4:
        sc[0] = q[j] & 63
        m[0] = q[j + 4] & 63
    else:
        sc[0] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)
        m[0] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


# Q3_K: the signed scale of group i (0..15): 6 bits, the low 4 in bytes 0..7 (nibble i // 8 of byte i % 8),
# the high 2 in bytes 8..11 (bits 2 * (i // 4) of byte 8 + i % 4), stored with an offset of 32.
cdef inline int q3k_scale(const uint8_t* packed, int i) noexcept nogil:
    return (((packed[i % 8] >> (4 * (i // 8))) & 0xF) | (((packed[8 + i % 4] >> (2 * (i // 4))) & 3) << 4)) - 32


# Value l (0..31) of sub-block s (0..7) of a Q4_K/Q5_K super-block, before its scale and min: the low
# (s even) or high nibble of qs[32 * (s // 2) + l], with bit s of qh[l] on top for Q5_K.
cdef inline int32_t k45value(const k45block* b, int s, int l) noexcept nogil:
    cdef int32_t q = (b.qs[32 * (s // 2) + l] >> (4 * (s % 2))) & 0xF
    if k45block is block_q5_K:
        q |= ((b.qh[l] >> s) & 1) << 4
    return q


# Value 128 n + 32 k + l (n < 2, k < 4, l < 32) of a Q2_K/Q3_K super-block, before its group's scale: the
# 2-bit field k of qs[32 n + l]; for Q3_K minus 4 where bit 4 n + k of hmask[l] (the high bit) is clear.
cdef inline int32_t k23value(const k23block* b, int n, int k, int l) noexcept nogil:
    cdef int32_t q = (b.qs[32 * n + l] >> (2 * k)) & 3
    if k23block is block_q3_K:
        if not b.hmask[l] & (1 << (4 * n + k)):
            q -= 4
    return q
