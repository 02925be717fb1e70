# The GGML block formats, bit-exact with ggml-common.h, as Cython sees them.
#
# Weights are read in place from the memory-mapped GGUF file, so these structs must match the file byte
# for byte: packed (no padding, alignment 1, so any block address is valid) and fp16 scales kept as their
# raw uint16 bits (converted with F16C where it matters). tests/test_kernels.py checks every sizeof against
# gguf.constants.GGML_QUANT_SIZES.
from libc.stdint cimport int8_t, int16_t, uint8_t, uint16_t

cdef enum:
    QK4_0 = 32
    QK4_1 = 32
    QK5_0 = 32
    QK5_1 = 32
    QK8_0 = 32
    QK_K = 256
    K_SCALE_SIZE = 12

# The ggml type ids we compute with (llamacy.ggml_types.GGMLType has the full list; traits.pyx the kernels).
cdef enum:
    T_F32 = 0
    T_F16 = 1
    T_Q4_0 = 2
    T_Q4_1 = 3
    T_Q5_0 = 6
    T_Q5_1 = 7
    T_Q8_0 = 8
    T_Q2_K = 10
    T_Q3_K = 11
    T_Q4_K = 12
    T_Q5_K = 13
    T_Q6_K = 14
    T_BF16 = 30
    N_TYPE_IDS = 40  # one more than the largest GGML type id (traits.pyx's table size)

# Activation formats. They live only in memory, never in files, so their layout is ours.
# ACT_F32: plain float rows (for F32/F16/BF16 weights).
# ACT_Q8A: for the legacy 32-value types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): per 32 values a float scale d,
#          s = d * sum(qs) (what the offset types Q4_1/Q5_1 need), and 32 int8 values.
# ACT_Q8K: for the K-quants: per 256 values a float scale, 256 int8 values, and 16 sums of 16 values.
cdef enum:
    ACT_F32 = 0
    ACT_Q8A = 1
    ACT_Q8K = 2
    N_ACT_FORMATS = 3

ctypedef struct block_q8a:
    float d
    float s
    int8_t qs[32]

ctypedef struct block_q8k:
    float d
    int8_t qs[256]
    int16_t bsums[16]

# Float weights: one value per "block". Distinct types so kernels can be specialised on them.
ctypedef packed struct block_f16:
    uint16_t bits  # IEEE half

ctypedef packed struct block_bf16:
    uint16_t bits  # upper half of an IEEE single

# x = d * (q - 8), q the 4-bit value; value j in the low nibble of qs[j], value j+16 in the high nibble.
ctypedef packed struct block_q4_0:
    uint16_t d
    uint8_t qs[16]

# x = d * q + m.
ctypedef packed struct block_q4_1:
    uint16_t d
    uint16_t m
    uint8_t qs[16]

# x = d * (q - 16); bit j of the little-endian uint32 qh is the 5th bit of value j.
ctypedef packed struct block_q5_0:
    uint16_t d
    uint8_t qh[4]
    uint8_t qs[16]

# x = d * q + m.
ctypedef packed struct block_q5_1:
    uint16_t d
    uint16_t m
    uint8_t qh[4]
    uint8_t qs[16]

# x = d * q.
ctypedef packed struct block_q8_0:
    uint16_t d
    int8_t qs[32]

# K-quants: super-blocks of 256 values.
# Q2_K: 16 sub-blocks of 16; scales[i] = scale (low 4 bits) | min (high 4 bits); x = d*sc*q - dmin*m.
ctypedef packed struct block_q2_K:
    uint8_t scales[16]
    uint8_t qs[64]
    uint16_t d
    uint16_t dmin

# Q3_K: 16 sub-blocks of 16; q = 2 low bits - (4 if the hmask bit is clear); 6-bit scales, offset 32.
ctypedef packed struct block_q3_K:
    uint8_t hmask[32]
    uint8_t qs[64]
    uint8_t scales[12]
    uint16_t d

# Q4_K: 8 sub-blocks of 32; 6-bit scales and mins packed in 12 bytes; x = d*sc*q - dmin*m.
ctypedef packed struct block_q4_K:
    uint16_t d
    uint16_t dmin
    uint8_t scales[12]
    uint8_t qs[128]

# Q5_K: as Q4_K plus a 5th bit per value in qh (bit i of qh[l] belongs to sub-block i).
ctypedef packed struct block_q5_K:
    uint16_t d
    uint16_t dmin
    uint8_t scales[12]
    uint8_t qh[32]
    uint8_t qs[128]

# Q6_K: 16 sub-blocks of 16 with int8 scales; 4 low bits in ql, 2 high bits in qh; x = d*sc*(q - 32).
ctypedef packed struct block_q6_K:
    uint8_t ql[128]
    uint8_t qh[64]
    int8_t scales[16]
    uint16_t d


# The quantized block types as fused types, for kernels written once for several formats.
# The 32-value (legacy) types:
ctypedef fused lblock:
    block_q4_0
    block_q4_1
    block_q5_0
    block_q5_1
    block_q8_0

# The 256-value K-quants:
ctypedef fused kblock:
    block_q2_K
    block_q3_K
    block_q4_K
    block_q5_K
    block_q6_K

# The K-quants whose low bits are 2-bit fields, 16 groups of 16 values:
ctypedef fused k23block:
    block_q2_K
    block_q3_K

# The K-quants with 8 sub-blocks of 32 values, a 6-bit scale and min each:
ctypedef fused k45block:
    block_q4_K
    block_q5_K

# Every quantized weight type:
ctypedef fused qblock:
    block_q4_0
    block_q4_1
    block_q5_0
    block_q5_1
    block_q8_0
    block_q2_K
    block_q3_K
    block_q4_K
    block_q5_K
    block_q6_K

# The float weight types (a "block" is one value):
ctypedef fused fblock:
    float
    block_f16
    block_bf16

# Every weight type the kernels compute with:
ctypedef fused wblock:
    fblock
    qblock
