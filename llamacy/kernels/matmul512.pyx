# AVX-512 VNNI matrix products: Y[t, r] = dot(W row r, activation row t), the same numbers as mm_avx2.pyx's
# AVX2 kernels, bit for bit (but for the row-lane types: see "Float order"), in less time where the
# work is compute-bound (several tokens).
#
# This module alone is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (setup.py), and
# matmul.pyx imports it only on a CPU that has them (cpu.has_avx512_vnni), then has it write its kernels
# (mm512, one per type) into the traits table's mm_vnni column. A portable build does not build it.
#
# Why it is faster. On Zen 4 (and Intel) the integer multiplies (maddubs, madd, dpbusd, dpwssd) and the
# float multiplies/FMAs share two pipes, and the shuffles share pipes with them and with the int->float
# conversions. Per 32 values per (row, token) the AVX2 tile spends four multiplier slots (maddubs, madd,
# the scale multiply, the FMA) plus a broadcast, and per weight block the nibble unpacking and fp16
# conversions, amortised over 4 tokens, with 16 registers. Here:
#   - dpbusd (u8 x s8, 4 products per int32 lane, no saturation) replaces maddubs + madd; for the K-quants
#     dpwssd replaces madd + add. Both give the very int32 lanes of the AVX2 code (whose maddubs cannot
#     saturate on these inputs), so the float part can follow the AVX2 order exactly.
#   - Prefill repacks the rows of a work item (GR rows) once per call into a per-thread buffer: quants
#     unpacked, fp16 scales converted, K-quant scales expanded to what dpwssd takes. All the tokens then
#     reuse them, instead of every 4 tokens unpacking again (see lanerec, klanerec, krec).
#   - The 256-bit EVEX forms address 32 ymm registers: a tile is 4 rows x 4 tokens (16 accumulators).
#   - The scale products d_w * d_x are made 4 rows x 2 tokens per 256-bit multiply (scale_products), stored,
#     and each FMA takes its one as a broadcast from memory: a load, not a shuffle.
#   - The legacy types (matmul512_lanes.pxi) keep one row per float lane: 8 rows repacked so that each
#     dpbusd takes 4 values of 8 rows against 4 quants of a token broadcast from memory; one conversion and
#     one FMA (two for Q4_1/Q5_1) per 8 rows and block instead of one per row. Their prefill runs ~1.7-1.9x
#     the per-lane tiles' rate. Decode and a few tokens read the blocks as stored.
#   - Q4_K, Q5_K and Q6_K (matmul512_klanes.pxi) the same way: 8 rows repacked per super-block, one dpbusd
#     per 4 values of 8 rows, one vpmulld per sub-block for the 8 rows' scales; prefill ~1.6-1.9x the
#     per-lane tiles (ktile). Decode reads the blocks as stored and folds 8 rows' lanes into one vector.
#   - Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K repacked at load into 8-row tiles (model/repack.py;
#     matmul512_x8.pxi, matmul512_kx8.pxi): no per-product repacking at all; the same chains as the
#     row-lane kernels, so the same bits.
#   - A prompt's products take two 8-row tiles at once in 512-bit vectors (x16.h): each token's quants are
#     broadcast from memory once per 16 rows instead of once per 8. On Zen 4 the 512-bit multiplies are
#     double-pumped (no more multiplier throughput), but the broadcasts, not the multipliers, bound the
#     8-row tiles: 1.3-1.6x the kernels' rate. Each lane is still one row's chain, so the bits are the same.
# Decode and few tokens keep 256-bit forms: they stream the weights from memory.
#
# Float order (tested in tests/test_kernels_512.py). Per (row, token):
#   Q4_0, Q5_0, Q8_0: Y = fma(float(isum_b), d_w*d_x, Y) over blocks b in order, isum_b the block's exact
#            integer sum (issue #29's new order; llama.cpp's repacked Q4_0 kernels compute this; for Q5_0
#            and Q8_0 it keeps per-lane sums on x86). Every path here (decode, few tokens, prefill, any
#            thread count) gives the same bits; AVX2 keeps the per-lane order, within the oracle's tolerance
#            of this one (issue #29 allows the two ISAs to differ).
#   Q4_1, Q5_1: a = fma(float(isum_b), d_w*d_x, a), m = fma(m_w, s_x, m) over blocks, Y = a + m (the same
#            new order with the min's chain beside it; llama.cpp's vec_dot keeps per-lane sums and so does
#            AVX2 here: d_w*d_x times the 8 lanes, hsum, plus the rounded min products).
#   Q4_K, Q5_K: a = fma(float(isum_b), d_w*d_x, a), m = fma(float(imin_b), dmin_w*d_x, m) over
#            super-blocks, Y = a - m (isum_b, imin_b exact integers): llama.cpp's repacked Q4_K order (the
#            Q4_K kernels equal its ggml_gemv_q4_K_8x8_q8_K bit for bit on the same inputs).
#   Q6_K:    a = fma(float(isum_b), d_w*d_x, a), Y = a (issue #29's new order; for Q5_K and Q6_K not
#            llama.cpp's, whose vec_dot keeps per-lane sums). Every path gives the same bits, as for Q4_0;
#            AVX2 differs.
#   Q2_K, Q3_K: as mm_avx2.pyx's kdot.
# AVX2 uses the per-lane formulas for its tile shapes (decode and prefill), so one formula here matches
# them (test_kernels_512.py names the one AVX2 tile where the compiler fused the min term).
#
# What runs here: the quantized types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K) with n_tok >= 2, and the
# legacy types and Q4_K/Q5_K/Q6_K with n_tok == 1. Q2_K/Q3_K decode and the float types stay on the AVX2
# kernels (mm512 returns 0), as does a Q2_K/Q3_K call whose repack buffer cannot be allocated (the row-lane
# types then take their few-token tiles: the same numbers, so no path of them ever leaves this module).
from libc.math cimport fmaf
from libc.stdint cimport int8_t, int16_t, int32_t, uint8_t, uint16_t, uint32_t
from libc.string cimport memcpy, memset

from llamacy.kernels.blocks cimport *
from llamacy.kernels.kunpack cimport k4_scales_mins, k45_quants, k6_values, unpack_k
from llamacy.kernels.simd cimport *
from llamacy.kernels.simd512 cimport *
from llamacy.kernels.traits cimport (
    LAYOUT_Q4_0_X8, LAYOUT_Q4_1_X8, LAYOUT_Q4_K_X8, LAYOUT_Q5_0_X8, LAYOUT_Q5_K_X8, LAYOUT_Q6_K_X8, LAYOUT_Q8_0_X8,
    layout_slot, mm_try_fn, type_traits, writable_traits,
)

# Each thread that calls mm512 keeps one buffer for the repacked rows of its work items (scratch.h).
cdef extern from "scratch.h" nogil:
    void* lc_scratch(size_t n)

# Prompts' products over two 8-row tiles at once, in 512-bit vectors (x16.h): the legacy types' load-time
# tiles (x8rec, x8rec_min, x8rec_q8), the legacy types' lane records (lanerec, into which Q5_0's x8rec_q5
# tiles expand) and the K-quants' prefill records (klanerec).
cdef extern from "x16.h" nogil:
    ctypedef struct lc_x16_krec:
        pass
    void lc_x16_q4_0(const void* ra, const void* rb, Py_ssize_t rsz, const void* X, const int32_t* sums,
                     Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy)
    void lc_x16_q4_1(const void* ra, const void* rb, Py_ssize_t rsz, const void* X, const int32_t* sums,
                     Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy)
    void lc_x16_q8_0(const void* ra, const void* rb, Py_ssize_t rsz, const void* X, const int32_t* sums,
                     Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy)
    void lc_x16_lane(const void* ra, const void* rb, Py_ssize_t rsz, const void* X, const int32_t* sums,
                     Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy)
    void lc_x16_lane_min(const void* ra, const void* rb, Py_ssize_t rsz, const void* X, const int32_t* sums,
                         Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy)
    void lc_kx16_q4_k(const void* ra, const void* rb, const void* X, const int32_t* pairs, Py_ssize_t t0,
                      Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy)
    void lc_kx16_q6_k(const void* ra, const void* rb, const void* X, const int32_t* pairs, Py_ssize_t t0,
                      Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy)


cdef enum:
    R = 4           # rows per tile of the per-lane types (Q2_K, Q3_K)
    MAXT = 4        # tokens per prefill tile
    GR = 16         # prefill: rows per parallel work item (repacked together)
    TCH = 64        # prefill: tokens per chunk (the chunk's activations stay in L2)
    LR = 8          # Q4_0, Q5_0, Q8_0 (row lanes): rows per tile, one per float lane (lanerec)
    LANE_PF_TILES = 1  # their decode: prefetch distance, in 8-row tiles
    # Few-token limits of the row-lane types: up to this many tokens the weights are read as stored, 4
    # tokens per pass (lanes_dec, klanes_dec), the later passes finding the rows in L1; above it they are
    # repacked, the next tile's rows prefetched while one repacks. Measured inside llama-3.2-1b at 2 threads
    # on Zen 4, where the weights stream from memory (a kernel loop with its weights in cache favours
    # repacking from 4 tokens): as stored wins at 4 and 6 tokens for Q4_K (1.3x, 1.1x) and up to 8 for
    # Q8_0, repacked from 8 for Q4_K (1.17x), from 5 for Q4_0 (1.03-1.21x) and from about 10 for Q8_0
    # (BENCHMARKS.md). A batched server step of a few sequences is such a product.
    Q4_0_RAW_TOK = 4  # Q4_0, Q4_1, Q5_0, Q5_1 (lanes_dec; see lane_raw_tok)
    Q8_0_RAW_TOK = 8  # Q8_0
    KLANE_RAW_TOK = 7  # Q4_K, Q5_K, Q6_K (klanes_dec)
    KLANE_PF_TILES = 1  # Q4_K, Q5_K, Q6_K decode: prefetch distance, in 8-row tiles
    COMPACT_TOK = 8  # Q2_K, Q3_K: up to this many tokens, scales expanded in ktile (see krec)
    GROUP_BYTES = 196608  # prefill: most bytes of repacked rows per work item (they stay in L2)
    AMX_TOK = 16  # AMX prefill (matmul512_amx.pxi): tokens per tile (the A tile's rows); 16 rows per record
    AMX_PAIRS = 4  # AMX prefill: 16-row records per pass over the tokens (64 rows, in L2)

# Decode's weight prefetch (set by prefetch_set, which matmul calls once at import). pf_row_ahead 0: while
# one 8-row tile of stored rows is read, the next tile's bytes are requested, walked 8 times as fast (on Zen 4
# the best for stored rows). > 0: each stored row of the tile is requested that many bytes ahead of where it
# is read. On an Intel Xeon (Sapphire Rapids class) the next-tile walk held the line-fill buffers the rows'
# own loads waited for: one thread streamed 9 GB/s of Q8_0 rows against the 15.7 it reads bare; requested 512
# bytes ahead in each row, 12 (BENCHMARKS.md). pf_rec_ahead > 0: the load-time tiles' one stream of records
# is requested that many bytes ahead (Zen 4: 192 bytes, Q4_K 24 -> 31 GB/s at 2 threads); 0: they too walk
# the next tile. pf_page_ahead > 0 (with pf_rec_ahead): each record also asks for one line into L2 that many
# bytes beyond the line it requests: Zen 4, 2 threads, decode with and without it alternating 16-24 times
# in one process, 8 tokens each, at 4096 bytes: llama-3.2-1b Q4_0 1.03-1.06x, Q4_K_M 1.08x, qwen2.5-1.5b
# Q4_K_M 1.05-1.08x, Q8_0 and qwen2.5-3b 1.02x (1.00-1.08x at 1024 and 2048; the same setting measured
# again as a control: 0.98-1.02x). The products alone, back to back, gain 1.01x (benchmarks/bench_pages.py
# --page-ahead): the line helps the streams that other work interrupts. It is the attention kernel's line a
# page ahead (attention.h, lc_att_prefetch_rows), where requests that open a page were shown to fare badly.
cdef Py_ssize_t pf_row_ahead = 0
cdef Py_ssize_t pf_rec_ahead = 0
cdef Py_ssize_t pf_page_ahead = 0

# Where decode requests row p of an 8-row tile ka blocks ahead of block b (pf_row_ahead): in that row, or past
# its end, in row p of the next tile, whose rows start cold otherwise (a tile of short rows, Llama-1B's
# gate and up at 64 blocks, would begin with 8 misses).
cdef inline Py_ssize_t row_ahead(int p, Py_ssize_t b, Py_ssize_t ka, Py_ssize_t nb) noexcept nogil:
    b += ka
    return p * nb + b if b < nb else (LR - 1 + p) * nb + b


# The AMX prefill tiles (matmul512_amx.pxi) run: set by amx_enable, which matmul calls once at import.
cdef bint amx_on = False
# A prompt's products take their 8-row tiles in pairs, in 512-bit vectors (x16.h): set by pairs_set.
cdef bint pairs_on = True
cdef int _amx_usable = -1  # this build, CPU and OS run them (lc_amx_enable): -1 not asked yet, 0 no, 1 yes


# Token counts of a prefill tile and row counts of a decode tile as types (see mm_avx2.pyx's shapes): one C
# function per count, with the count a literal constant, so the compiler unrolls the r/t loops and keeps
# the accumulators in registers.
ctypedef struct tok1:
    char unused
ctypedef struct tok2:
    char unused
ctypedef struct tok3:
    char unused
ctypedef struct tok4:
    char unused

ctypedef fused tshape:
    tok1
    tok2
    tok3
    tok4

cdef inline int ntoks(const tshape* s) noexcept nogil:
    if tshape is tok1:
        return 1
    elif tshape is tok2:
        return 2
    elif tshape is tok3:
        return 3
    else:
        return 4


# The legacy types, all in the row-lane order (matmul512_lanes.pxi).
ctypedef fused laneblock:
    block_q4_0
    block_q4_1
    block_q5_0
    block_q5_1
    block_q8_0


include "matmul512_lanes.pxi"
include "matmul512_kquant.pxi"
include "matmul512_klanes.pxi"
include "matmul512_x8.pxi"
include "matmul512_kx8.pxi"
include "matmul512_amx.pxi"


# =========================================================================================================
# Drivers of the per-lane types (Q2_K, Q3_K): prefill only (their decode is AVX2's)


# Rows [r0, r0 + R) (those below `rows`; zeros for the others) into the records of row tile wt.
cdef inline void repack_tile(const k23block* W, Py_ssize_t rows, Py_ssize_t r0, Py_ssize_t nb, krec* wt,
                             bint expand) noexcept nogil:
    cdef int r
    for r in range(R):
        if r0 + r < rows:
            repack_k(W + (r0 + r) * nb, nb, wt, r, expand)
        else:
            repack_k_empty(nb, wt, r)


# One tile of row tile wt x T tokens from X + t0.
cdef inline void qtile(const k23block* tag, const tshape* shape, const krec* wt, const block_q8k* X,
                       Py_ssize_t t0, Py_ssize_t nb, float* out, Py_ssize_t ldo, int nvalid,
                       bint expanded) noexcept nogil:
    if expanded:
        ktile(tag, shape, <const scx_expanded*>NULL, wt, X + t0 * nb, nb, out, ldo, nvalid)
    else:
        ktile(tag, shape, <const scx_compact*>NULL, wt, X + t0 * nb, nb, out, ldo, nvalid)


# Row tile wt (output rows from r0, nvalid of them) against tokens [t0, t1): tiles of 4 tokens, then one of
# the 1-3 left.
cdef inline void tile_tokens(const k23block* W, const krec* wt, const block_q8k* X, Py_ssize_t t0,
                             Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy, Py_ssize_t r0, int nvalid,
                             bint expanded) noexcept nogil:
    cdef Py_ssize_t t = t0
    while t + 4 <= t1:
        qtile(W, <const tok4*>NULL, wt, X, t, nb, Y + t * ldy + r0, ldy, nvalid, expanded)
        t += 4
    if t1 - t == 3:
        qtile(W, <const tok3*>NULL, wt, X, t, nb, Y + t * ldy + r0, ldy, nvalid, expanded)
    elif t1 - t == 2:
        qtile(W, <const tok2*>NULL, wt, X, t, nb, Y + t * ldy + r0, ldy, nvalid, expanded)
    elif t1 - t == 1:
        qtile(W, <const tok1*>NULL, wt, X, t, nb, Y + t * ldy + r0, ldy, nvalid, expanded)


# Prefill work item g: rows [g*G, g*G + G), repacked into buf (nb records per R rows), against every token.
# With one chunk of tokens (n_tok <= TCH) each row tile is repacked right before its tiles run, so that they
# find it in L1; with more, the whole work item is repacked first and the tokens go chunk by chunk of TCH,
# each row tile in turn (the work item's rows stay in L2, a chunk's activations too).
cdef void q_group(const k23block* W, Py_ssize_t rows, Py_ssize_t nb, const block_q8k* X, Py_ssize_t n_tok,
                  float* Y, Py_ssize_t ldy, Py_ssize_t G, Py_ssize_t g, krec* buf) noexcept nogil:
    cdef Py_ssize_t r0 = g * G
    cdef Py_ssize_t r1 = min(rows, r0 + G)
    cdef Py_ssize_t ntiles = (r1 - r0 + R - 1) // R
    cdef Py_ssize_t i, t0, t1
    cdef bint expand = n_tok > COMPACT_TOK
    if n_tok <= TCH:
        for i in range(ntiles):
            repack_tile(W, r1, r0 + i * R, nb, buf + i * nb, expand)
            tile_tokens(W, buf + i * nb, X, 0, n_tok, nb, Y, ldy, r0 + i * R,
                        <int>min(<Py_ssize_t>R, r1 - r0 - i * R), expand)
        return
    for i in range(ntiles):
        repack_tile(W, r1, r0 + i * R, nb, buf + i * nb, expand)
    t0 = 0
    while t0 < n_tok:
        t1 = min(n_tok, t0 + TCH)
        for i in range(ntiles):
            tile_tokens(W, buf + i * nb, X, t0, t1, nb, Y, ldy, r0 + i * R,
                        <int>min(<Py_ssize_t>R, r1 - r0 - i * R), expand)
        t0 = t1


# Rows per prefill work item whose repacked form takes row_bytes each: GR, or fewer (a multiple of R, at
# least R) so that a work item's repacked rows stay within GROUP_BYTES, in L2.
cdef inline Py_ssize_t group_rows(Py_ssize_t row_bytes) noexcept nogil:
    cdef Py_ssize_t tiles = GROUP_BYTES // (R * row_bytes)
    if tiles < 1:
        tiles = 1
    if tiles > GR // R:
        tiles = GR // R
    return tiles * R


# The VNNI product of one quantized type (the mm_vnni column of traits.pyx); 0 where it leaves the case to
# the AVX2 kernels: Q2_K/Q3_K decode, or no memory for the repacked rows.
cdef int mm512(const qblock* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok, float* Y,
               Py_ssize_t ldy) noexcept nogil:
    cdef bint kq = qblock is block_q2_K or qblock is block_q3_K or qblock is block_q4_K \
        or qblock is block_q5_K or qblock is block_q6_K
    cdef Py_ssize_t nb = cols // (QK_K if kq else QK8_0)
    cdef Py_ssize_t G, g
    cdef krec* buf
    if rows <= 0 or n_tok <= 0 or nb <= 0:
        return 0
    if qblock is block_q4_0 or qblock is block_q4_1 or qblock is block_q5_0 or qblock is block_q5_1 \
            or qblock is block_q8_0:
        return mm512_lanes(W, rows, nb, <const block_q8a*>X, n_tok, Y, ldy)
    elif qblock is block_q4_K or qblock is block_q5_K or qblock is block_q6_K:
        return mm512_klanes(W, rows, nb, <const block_q8k*>X, n_tok, Y, ldy)
    else:  # Q2_K, Q3_K: prefill tiles (per-lane order); decode stays on AVX2
        if n_tok == 1:
            return 0
        G = group_rows(nb * sizeof(krec) // R)
        buf = <krec*>lc_scratch(G // R * nb * sizeof(krec))
        if buf == NULL:
            return 0  # out of memory: AVX2 needs none
        for g in range((rows + G - 1) // G):
            q_group(W, rows, nb, <const block_q8k*>X, n_tok, Y, ldy, G, g, buf)
        return 1


# =========================================================================================================
# Python surface: matmul.pyx calls fill_traits once, on a CPU that has AVX-512 F/BW/VL + VNNI. Importing
# this module runs no AVX-512 code of its own; still, matmul imports it only on such a CPU.


cdef void vnni(int wtype, mm_try_fn fn) noexcept:
    writable_traits(wtype).mm_vnni = fn


def fill_traits():
    """Write these kernels into the traits table's mm_vnni column."""
    vnni(T_Q4_0, <mm_try_fn>mm512[block_q4_0])
    vnni(T_Q4_1, <mm_try_fn>mm512[block_q4_1])
    vnni(T_Q5_0, <mm_try_fn>mm512[block_q5_0])
    vnni(T_Q5_1, <mm_try_fn>mm512[block_q5_1])
    vnni(T_Q8_0, <mm_try_fn>mm512[block_q8_0])
    vnni(T_Q2_K, <mm_try_fn>mm512[block_q2_K])
    vnni(T_Q3_K, <mm_try_fn>mm512[block_q3_K])
    vnni(T_Q4_K, <mm_try_fn>mm512[block_q4_K])
    vnni(T_Q5_K, <mm_try_fn>mm512[block_q5_K])
    vnni(T_Q6_K, <mm_try_fn>mm512[block_q6_K])
    layout_slot(LAYOUT_Q4_0_X8)[0] = mm512_q4_0_x8
    layout_slot(LAYOUT_Q4_1_X8)[0] = mm512_q4_1_x8
    layout_slot(LAYOUT_Q4_K_X8)[0] = mm512_q4_k_x8
    layout_slot(LAYOUT_Q8_0_X8)[0] = mm512_q8_0_x8
    layout_slot(LAYOUT_Q5_0_X8)[0] = mm512_q5_0_x8
    layout_slot(LAYOUT_Q5_K_X8)[0] = mm512_q5_k_x8
    layout_slot(LAYOUT_Q6_K_X8)[0] = mm512_q6_k_x8


def amx_enable(bint want):
    """Turn the AMX prefill tiles on (want) where this build, CPU and OS run them, or off; the new state.

    Either way the products give the same bits (matmul512_amx.pxi): this only picks the faster path.
    """
    global amx_on, _amx_usable
    if want and _amx_usable < 0:
        _amx_usable = 1 if lc_amx_enable() else 0
    amx_on = want and _amx_usable == 1
    return amx_on


def prefetch_set(Py_ssize_t row_ahead, Py_ssize_t rec_ahead, Py_ssize_t page_ahead=0):
    """Decode's weight prefetch: 0, 0 the next-tile walk; else bytes ahead within each stored row and
    within a stream of tile records; page_ahead, one more line that much further on in a stream of records
    (0: none). Speed only: the products give the same bits either way."""
    global pf_row_ahead, pf_rec_ahead, pf_page_ahead
    if row_ahead < 0 or rec_ahead < 0 or page_ahead < 0:
        raise ValueError("prefetch distances must be >= 0")
    pf_row_ahead = row_ahead
    pf_rec_ahead = rec_ahead
    pf_page_ahead = page_ahead


def pairs_set(bint on):
    """A prompt's products over two 8-row tiles at a time in 512-bit vectors (x16.h), or one at a time.
    Speed only: the same bits either way."""
    global pairs_on
    pairs_on = on


def amx_compiled():
    """True if this build carries the AMX tile steps (the compiler took -mamx-tile -mamx-int8)."""
    return bool(LC_AMX)

