# AVX-512 VNNI matrix products: Y[t, r] = dot(W row r, activation row t), the same numbers as matmul.pyx's
# AVX2 kernels, bit for bit, in less time where the work is compute-bound (several tokens).
#
# This module alone is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (setup.py), and
# matmul.pyx imports it only on a CPU that has them (cpu.has_avx512_vnni), then calls mm512 through a
# function pointer chosen once at import. A portable build does not build it.
#
# Why it is faster. On Zen 4 (and Intel) the integer multiplies (maddubs, madd, dpbusd, dpwssd) and the
# float multiplies/FMAs share two pipes, and the shuffles share pipes with them and with the int->float
# conversions. Per 32 values per (row, token) the AVX2 tile spends four multiplier slots (maddubs, madd,
# the scale multiply, the FMA) plus a broadcast, and per weight block the nibble unpacking and fp16
# conversions, amortised over 4 tokens, with 16 registers. Here:
#   - dpbusd (u8 x s8, 4 products per int32 lane, no saturation) replaces maddubs + madd; for the K-quants
#     dpwssd replaces madd + add. Both give the very int32 lanes of the AVX2 code (whose maddubs cannot
#     saturate on these inputs), so the float part can follow the AVX2 order exactly.
#   - Prefill (n_tok > RAW_TOK) repacks the rows of a work item (GR rows) once per call into a per-thread
#     buffer: quants unpacked, fp16 scales converted, K-quant scales expanded to what dpwssd takes. All
#     the tokens then reuse them, instead of every 4 tokens unpacking again (see lrec, krec).
#   - The 256-bit EVEX forms address 32 ymm registers: a tile is 4 rows x 4 tokens (16 accumulators).
#   - The scale products d_w * d_x are made 4 rows x 2 tokens per 256-bit multiply (scale_products), stored,
#     and each FMA takes its one as a broadcast from memory: a load, not a shuffle.
#   - Few tokens (n_tok <= RAW_TOK, legacy types): the same tiles straight from the weights as stored
#     (ltile_raw): with so few tokens, unpacking a block where it is used beats storing and reloading it.
#   - Decode (n_tok == 1, legacy types): matmul.pyx's decode tile with dpbusd (ldec).
# The 256-bit forms keep the core at its AVX2 clock; 512-bit vectors would not add multiplier throughput on
# Zen 4 (double-pumped) and would change the order of the float sums.
#
# Float order (bit-equality with matmul.pyx, tested in tests/test_kernels_512.py). Per (row, token):
#   legacy:  acc(8 lanes) = fma(d_w*d_x, float(lanes_b), acc) over blocks b in order; Y = hsum8(acc),
#            + sum_b (m_w * s_x) in order for Q4_1/Q5_1 (products rounded, then added: no contraction,
#            see setup.py's -ffp-contract=off).
#   K-quants: as matmul.pyx's kdot.
# AVX2 uses those same formulas for its tile shapes (decode and prefill), so one formula here matches them
# (test_kernels_512.py names the one AVX2 tile where the compiler fused the min term).
#
# What runs here: the quantized types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K) with n_tok >= 2, and the
# legacy types with n_tok == 1. K-quant decode (a row's super-block unpacking dominates it, and in a whole
# model it streams from memory) and the float types stay on the AVX2 kernels (mm512 returns 0), as does a
# call whose repack buffer cannot be allocated.
from libc.stdint cimport int8_t, int16_t, int32_t, uint8_t, uint32_t
from libc.string cimport memcpy, memset

from llamacy.kernels.blocks cimport *
from llamacy.kernels.kunpack cimport unpack_k
from llamacy.kernels.simd cimport *
from llamacy.kernels.simd512 cimport *
from llamacy.kernels.traits cimport mm_try_fn, type_traits, writable_traits

# Each thread that calls mm512 keeps one buffer for the repacked rows of its work items, grown when a call
# needs more and freed when the thread ends: nothing is allocated in the steady state, no page is faulted in
# per call, and the repacked rows need no stack.
cdef extern from *:
    """
    #include <pthread.h>
    #include <stdlib.h>
    typedef struct { void* p; size_t n; } lc_scratch_t;
    static pthread_key_t lc_scratch_key;
    static pthread_once_t lc_scratch_once = PTHREAD_ONCE_INIT;
    static int lc_scratch_ok = 0;
    static void lc_scratch_free(void* v) { lc_scratch_t* s = (lc_scratch_t*)v; free(s->p); free(s); }
    static void lc_scratch_init(void) { lc_scratch_ok = pthread_key_create(&lc_scratch_key, lc_scratch_free) == 0; }
    /* This thread's buffer of at least n bytes (64-byte aligned, contents undefined); NULL if out of memory. */
    static void* lc_scratch(size_t n) {
        lc_scratch_t* s;
        pthread_once(&lc_scratch_once, lc_scratch_init);
        if (!lc_scratch_ok) return NULL;
        s = (lc_scratch_t*)pthread_getspecific(lc_scratch_key);
        if (s == NULL) {
            s = (lc_scratch_t*)calloc(1, sizeof *s);
            if (s == NULL) return NULL;
            if (pthread_setspecific(lc_scratch_key, s) != 0) { free(s); return NULL; }
        }
        if (s->n < n) {
            free(s->p);
            s->n = (n + 65535) & ~(size_t)65535;
            s->p = aligned_alloc(64, s->n);
            if (s->p == NULL) s->n = 0;
        }
        return s->p;
    }
    """
    void* lc_scratch(size_t n) nogil


cdef enum:
    R = 4           # rows per tile (prefill and decode)
    MAXT = 4        # tokens per prefill tile
    GR = 16         # prefill: rows per parallel work item (repacked together)
    TCH = 64        # prefill: tokens per chunk (the chunk's activations stay in L2)
    PF_TILES = 2    # decode: prefetch distance, in tiles
    SCH = 16        # prefill: blocks per batch of scale products (ltile)
    RAW_TOK = 8     # legacy types: up to this many tokens, no repacking (ltile_raw)
    COMPACT_TOK = 8  # Q2_K, Q3_K, Q6_K: up to this many tokens, scales expanded in ktile (see krec)
    GROUP_BYTES = 196608  # prefill: most bytes of repacked rows per work item (they stay in L2)


# One 32-value block of R rows, repacked: the quants as dpbusd takes them, the fp32 scale and min.
#   Q4_0, Q5_0, Q8_0 (an offset, or signed quants): q holds the signed values (q - 8, q - 16, q), and the
#     activations are the unsigned operand, biased by 128 (x + 128, one xor per token block); seed holds
#     -128 * (sum of each 4 quants), the accumulator's start, so that dpbusd(seed, x + 128, q) is exactly
#     the lane sum of q * x. Nothing per token block but the xor, nothing per row block but two loads.
#   Q4_1, Q5_1 (unsigned quants, the min term apart): q holds the unsigned q, dpbusd(0, q, x); no seed.
ctypedef struct lrec:
    int8_t q[4][32]
    int32_t seed[4][8]
    float d[4]
    float m[4]

# One 256-value super-block of R rows, repacked: matmul.pyx's kunpacked, for 4 rows.
ctypedef struct krec:
    uint8_t u[4][256]
    # per 32-value step j, what dpwssd multiplies step j's 16 int16 pair sums with:
    #   Q4_K, Q5_K (one scale per 32 values): the int32 (sc_j << 16 | sc_j) at scx[r][2j], broadcast in ktile
    #   Q2_K, Q3_K, Q6_K: the scale of group 2j in int16 lanes 0..7, of group 2j+1 in lanes 8..15
    #     (expanded); or, with few tokens (n_tok <= COMPACT_TOK), just the 16 scales, expanded step by step
    #     in ktile (one vpermw per row and step): 8 stores fewer per row and super-block, which is what
    #     bounds the repacking, against 8 shuffles per row and super-block per tile.
    int16_t scx[4][128]
    int16_t off[4][16]
    float d[4]
    float doff[4]



# Token counts of a prefill tile and row counts of a decode tile as types (see matmul.pyx's shapes): one C
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

# How ktile finds the Q2_K/Q3_K/Q6_K scales (see krec): as types, so that each ktile is compiled for one.
ctypedef struct scx_expanded:
    char unused
ctypedef struct scx_compact:
    char unused

ctypedef fused scxform:
    scx_expanded
    scx_compact

ctypedef struct row1:
    char unused
ctypedef struct row4:
    char unused

ctypedef fused rshape:
    row1
    row4


cdef inline int ntoks(const tshape* s) noexcept nogil:
    if tshape is tok1:
        return 1
    elif tshape is tok2:
        return 2
    elif tshape is tok3:
        return 3
    else:
        return 4


cdef inline int nrows(const rshape* s) noexcept nogil:
    if rshape is row1:
        return 1
    else:
        return R


# =========================================================================================================
# Legacy 32-value types (ACT_Q8A activations).


# One weight block's quants as the unsigned operand of dpbusd: q (4/5-bit types), q + 128 (Q8_0).
cdef inline __m256i load_u(const lblock* wb) noexcept nogil:
    if lblock is block_q8_0:
        return _mm256_xor_si256(_mm256_loadu_si256(<const __m256i*>wb.qs), _mm256_set1_epi8(-128))
    elif lblock is block_q4_0 or lblock is block_q4_1:
        return unpack_nibbles(wb.qs)
    else:
        return _mm256_or_si256(unpack_nibbles(wb.qs),
                               _mm256_and_si256(unpack_bits(wb.qh), _mm256_set1_epi8(0x10)))


# The accumulator seed for one token block in decode (as AVX2's token_offset): minus the offset's share
# c * (sum of 4 x quants) per lane, so that dpbusd(seed, u, qy) is the lane sum of (u - c) * qy; zero for
# the types without an offset. (Prefill instead moves the offset to the weights: see lrec.)
cdef inline __m256i token_seed(const lblock* tag, __m256i qy) noexcept nogil:
    cdef __m256i zero = _mm256_setzero_si256()
    if lblock is block_q4_0:
        return _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(8), qy))
    elif lblock is block_q5_0:
        return _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(16), qy))
    elif lblock is block_q8_0:
        return _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(-128), qy))
    else:
        return zero


# True for the types whose repacked quants are signed (see lrec).
cdef inline bint signed_q(const lblock* tag) noexcept nogil:
    return lblock is block_q4_0 or lblock is block_q5_0 or lblock is block_q8_0


# Row `w` (nb blocks) into slot r of the records dst[0..nb).
cdef void repack_l(const lblock* w, Py_ssize_t nb, lrec* dst, int r) noexcept nogil:
    cdef __m256i q
    cdef __m256i zero = _mm256_setzero_si256()
    cdef Py_ssize_t b
    for b in range(nb):
        if lblock is block_q8_0:
            q = _mm256_loadu_si256(<const __m256i*>w[b].qs)
        elif lblock is block_q4_0:
            q = _mm256_sub_epi8(unpack_nibbles(w[b].qs), _mm256_set1_epi8(8))
        elif lblock is block_q5_0:
            q = _mm256_sub_epi8(load_u(w + b), _mm256_set1_epi8(16))
        else:
            q = load_u(w + b)
        _mm256_storeu_si256(<__m256i*>dst[b].q[r], q)
        if signed_q(w):
            _mm256_storeu_si256(<__m256i*>dst[b].seed[r],
                                _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(-128), q)))
        dst[b].d[r] = fp16(w[b].d)
        if lblock is block_q4_1 or lblock is block_q5_1:
            dst[b].m[r] = fp16(w[b].m)


# A slot with no row behind it (the last tile of a matrix whose row count is not a multiple of R): zeros,
# computed on and never stored.
cdef void repack_l_empty(Py_ssize_t nb, lrec* dst, int r) noexcept nogil:
    cdef Py_ssize_t b
    for b in range(nb):
        memset(dst[b].q[r], 0, 32)
        memset(dst[b].seed[r], 0, 32)
        dst[b].d[r] = 0.0
        dst[b].m[r] = 0.0


# The scale products of one block for a tile: sc[t * 4 + r] = d_w[r] * d_x[t], and the min terms
# (Q4_1/Q5_1) ms[t][r] += m_w[r] * s_x[t]. Two tokens per 256-bit multiply: dx8 and mv8 hold the 4 rows'
# d and m twice, [d0..d3, d0..d3], against [d_x(t) x 4, d_x(t+1) x 4]. The same products and sums in the
# same order as one SSE multiply per token (each lane is its own (row, token)), in half the multiplies:
# these share the two pipes that every dpbusd and FMA of the tile needs, and made a third of its time.
# ms01 holds the min terms of tokens 0 (low half) and 1, ms23 those of 2 and 3; an odd last token uses ms.
cdef inline void scale_products(const lblock* tag, const tshape* shape, __m256 dx8, __m256 mv8,
                                const block_q8a* yb, Py_ssize_t nb, float* sc, __m128* ms,
                                __m256* ms01, __m256* ms23) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef int t
    if T >= 2:
        _mm256_storeu_ps(sc, _mm256_mul_ps(dx8, _mm256_set_m128(_mm_set1_ps(yb[nb].d), _mm_set1_ps(yb[0].d))))
        if lblock is block_q4_1 or lblock is block_q5_1:
            # the min term, in block order: m_w * s_x rounded, then added
            ms01[0] = _mm256_add_ps(ms01[0], _mm256_mul_ps(mv8, _mm256_set_m128(
                _mm_set1_ps(yb[nb].s), _mm_set1_ps(yb[0].s))))
    if T >= 4:
        _mm256_storeu_ps(sc + 8, _mm256_mul_ps(dx8, _mm256_set_m128(
            _mm_set1_ps(yb[3 * nb].d), _mm_set1_ps(yb[2 * nb].d))))
        if lblock is block_q4_1 or lblock is block_q5_1:
            ms23[0] = _mm256_add_ps(ms23[0], _mm256_mul_ps(mv8, _mm256_set_m128(
                _mm_set1_ps(yb[3 * nb].s), _mm_set1_ps(yb[2 * nb].s))))
    if T % 2:
        t = T - 1
        _mm_storeu_ps(sc + t * 4, _mm_mul_ps(_mm256_castps256_ps128(dx8), _mm_set1_ps(yb[t * nb].d)))
        if lblock is block_q4_1 or lblock is block_q5_1:
            ms[t] = _mm_add_ps(ms[t], _mm_mul_ps(_mm256_castps256_ps128(mv8), _mm_set1_ps(yb[t * nb].s)))


# Token t's 4 min terms (see scale_products) into mo.
cdef inline void min_terms(const tshape* shape, const __m128* ms, __m256 ms01, __m256 ms23, int t,
                           float* mo) noexcept nogil:
    cdef int T = ntoks(shape)
    if t == T - 1 and T % 2:
        _mm_storeu_ps(mo, ms[t])
    elif t == 0:
        _mm_storeu_ps(mo, _mm256_castps256_ps128(ms01))
    elif t == 1:
        _mm_storeu_ps(mo, _mm256_extractf128_ps(ms01, 1))
    elif t == 2:
        _mm_storeu_ps(mo, _mm256_castps256_ps128(ms23))
    else:
        _mm_storeu_ps(mo, _mm256_extractf128_ps(ms23, 1))


# One prefill tile: the R repacked rows w[0..nb) x T tokens starting at y (nb blocks apart);
# out[t * ldo + r] for r < nvalid.
#
# Per (row, token, block): one dpbusd, one int->float conversion and one FMA whose scale d_w * d_x comes
# as a broadcast from memory. Those products are made first, for SCH blocks at a time (scale_products),
# into the small buffer sc: broadcasting each from a register instead costs one or two shuffles per use,
# and Zen 4's shuffle pipes are shared with the multipliers and the conversions.
cdef void ltile(const lblock* tag, const tshape* shape, const lrec* w, const block_q8a* y, Py_ssize_t nb,
                float* out, Py_ssize_t ldo, int nvalid) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef __m256 acc[4][MAXT]
    cdef __m128 ms[MAXT]
    cdef __m256 ms01 = _mm256_setzero_ps(), ms23 = _mm256_setzero_ps()
    cdef __m256i qx[4]
    cdef __m256i sd[4]
    cdef __m256i qy, isum
    cdef __m256i zero = _mm256_setzero_si256()
    cdef float sc[SCH * MAXT * 4]
    cdef const float* s
    cdef float mo[4]
    cdef const block_q8a* yb
    cdef int r, t
    cdef Py_ssize_t b, b0, b1
    for t in range(T):
        if lblock is block_q4_1 or lblock is block_q5_1:
            ms[t] = _mm_setzero_ps()
        for r in range(R):
            acc[r][t] = _mm256_setzero_ps()
    b0 = 0
    while b0 < nb:
        b1 = min(nb, b0 + SCH)
        for b in range(b0, b1):
            scale_products(tag, shape, _mm256_broadcast_ps(<const __m128*>w[b].d),
                           _mm256_broadcast_ps(<const __m128*>w[b].m), y + b, nb, &sc[(b - b0) * MAXT * 4],
                           ms, &ms01, &ms23)
        lc_spill(sc)
        for b in range(b0, b1):
            for r in range(R):
                qx[r] = _mm256_loadu_si256(<const __m256i*>w[b].q[r])
                if signed_q(tag):
                    sd[r] = _mm256_loadu_si256(<const __m256i*>w[b].seed[r])
            for t in range(T):
                yb = y + t * nb + b
                qy = _mm256_loadu_si256(<const __m256i*>yb.qs)
                if signed_q(tag):
                    qy = _mm256_xor_si256(qy, _mm256_set1_epi8(-128))  # x + 128
                s = &sc[((b - b0) * MAXT + t) * 4]
                for r in range(R):
                    if signed_q(tag):
                        isum = _mm256_dpbusd_epi32(sd[r], qy, qx[r])
                    else:
                        isum = _mm256_dpbusd_epi32(zero, qx[r], qy)
                    acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(s[r]), _mm256_cvtepi32_ps(isum), acc[r][t])
        b0 = b1
    for t in range(T):
        if lblock is block_q4_1 or lblock is block_q5_1:
            min_terms(shape, ms, ms01, ms23, t, mo)
            for r in range(nvalid):
                out[t * ldo + r] = hsum8(acc[r][t]) + mo[r]
        else:
            for r in range(nvalid):
                out[t * ldo + r] = hsum8(acc[r][t])


# One prefill tile for few tokens, straight from the weights as stored (no repacking: with few tokens
# unpacking a block where it is used costs less than storing and reloading it): R rows from w (nb blocks
# apart) x T tokens from y. Quants unsigned, offsets taken off per token block with token_seed (as decode
# does); the scale products as in ltile, from the 4 rows' fp16 (d, m) pairs converted 8 at a time.
cdef void ltile_raw(const lblock* w, const tshape* shape, const block_q8a* y, Py_ssize_t nb,
                    float* out, Py_ssize_t ldo) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef __m256 acc[4][MAXT]
    cdef __m128 ms[MAXT]
    cdef __m256 ms01 = _mm256_setzero_ps(), ms23 = _mm256_setzero_ps()
    cdef __m256i qx[4]
    cdef __m256i qy, seed
    cdef __m256 dm
    cdef float sc[SCH * MAXT * 4]
    cdef const float* s
    cdef float mo[4]
    cdef const block_q8a* yb
    cdef int r, t
    cdef Py_ssize_t b, b0, b1, k
    # As in decode: the weights stream from memory once, and the hardware prefetchers lose the thread of
    # R interleaved rows (Q8_0 lm_head, 4 tokens: 5.5 ms without this, 2.1 ms with the rows in cache).
    cdef const char* pf = <const char*>(w + PF_TILES * R * nb)
    cdef Py_ssize_t pfstep = R * sizeof(lblock)
    for t in range(T):
        if lblock is block_q4_1 or lblock is block_q5_1:
            ms[t] = _mm_setzero_ps()
        for r in range(R):
            acc[r][t] = _mm256_setzero_ps()
    b0 = 0
    while b0 < nb:
        b1 = min(nb, b0 + SCH)
        for b in range(b0, b1):
            for k in range(0, pfstep, 64):
                lc_prefetch(pf + b * pfstep + k)
            # [d0, m0, d1, m1, d2, m2, d3, m3] (for the types without m, the odd lanes are unused)
            dm = _mm256_cvtph_ps(_mm_set_epi32(
                <int>load_u32(<const uint8_t*>(w + 3 * nb + b)), <int>load_u32(<const uint8_t*>(w + 2 * nb + b)),
                <int>load_u32(<const uint8_t*>(w + nb + b)), <int>load_u32(<const uint8_t*>(w + b))))
            scale_products(w, shape, _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)),
                           _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7)), y + b, nb,
                           &sc[(b - b0) * MAXT * 4], ms, &ms01, &ms23)
        lc_spill(sc)
        for b in range(b0, b1):
            for r in range(R):
                qx[r] = load_u(w + r * nb + b)
            for t in range(T):
                yb = y + t * nb + b
                qy = _mm256_loadu_si256(<const __m256i*>yb.qs)
                seed = token_seed(w, qy)
                s = &sc[((b - b0) * MAXT + t) * 4]
                for r in range(R):
                    acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(s[r]),
                                                _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(seed, qx[r], qy)),
                                                acc[r][t])
        b0 = b1
    for t in range(T):
        if lblock is block_q4_1 or lblock is block_q5_1:
            min_terms(shape, ms, ms01, ms23, t, mo)
            for r in range(R):
                out[t * ldo + r] = hsum8(acc[r][t]) + mo[r]
        else:
            for r in range(R):
                out[t * ldo + r] = hsum8(acc[r][t])


# One decode tile: R rows (from the weights as stored) x 1 token. The scales as in matmul.pyx's decode:
# [d, m] converted with one F16C op and multiplied by [d_x, s] in one SSE multiply.
cdef void ldec(const lblock* w, const rshape* shape, const block_q8a* y, Py_ssize_t nb,
               float* out) noexcept nogil:
    cdef int RR = nrows(shape)
    cdef __m256 acc[4]
    cdef __m128 ms[4]
    cdef __m256i qy, seed
    cdef __m128 u, v
    cdef const lblock* wb
    cdef const block_q8a* yb
    cdef int r
    cdef Py_ssize_t b, k
    cdef const char* pf = <const char*>(w + PF_TILES * RR * nb)
    cdef Py_ssize_t pfstep = RR * sizeof(lblock)
    for r in range(RR):
        acc[r] = _mm256_setzero_ps()
        if lblock is block_q4_1 or lblock is block_q5_1:
            ms[r] = _mm_setzero_ps()
    for b in range(nb):
        # decode streams the weights once: prefetch the tile PF_TILES ahead at the pace this one is read
        for k in range(0, pfstep, 64):
            lc_prefetch(pf + b * pfstep + k)
        yb = y + b
        qy = _mm256_loadu_si256(<const __m256i*>yb.qs)
        u = _mm_castsi128_ps(_mm_loadl_epi64(<const __m128i*>yb))  # [d_x, s, 0, 0]
        seed = token_seed(w, qy)
        for r in range(RR):
            wb = w + r * nb + b
            v = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(<int>load_u32(<const uint8_t*>wb))), u)
            acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(v),
                                     _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(seed, load_u(wb), qy)), acc[r])
            if lblock is block_q4_1 or lblock is block_q5_1:
                ms[r] = _mm_add_ps(ms[r], v)
    for r in range(RR):
        if lblock is block_q4_1 or lblock is block_q5_1:
            out[r] = hsum8(acc[r]) + _mm_cvtss_f32(_mm_movehdup_ps(ms[r]))
        else:
            out[r] = hsum8(acc[r])


# =========================================================================================================
# K-quants (ACT_Q8K activations). The unpacked form is kunpack.pxd's, the dot mm_avx2.pyx's kdot:
#   value_j = d * sc_g * u_j - doff * off_g,  dot = d_x * (d * sum_g sc_g sum u q - doff * sum_g off_g bsum_g)


# The 16 group scales S (int16) -> scx: step j's vector is S[2j] x 8 then S[2j+1] x 8 (one vpermw).
cdef inline void expand_scales(__m256i S, int16_t* scx) noexcept nogil:
    cdef int j
    for j in range(8):
        _mm256_storeu_si256(<__m256i*>&scx[16 * j], _mm256_permutexvar_epi16(
            _mm256_setr_epi32(0x10001 * 2 * j, 0x10001 * 2 * j, 0x10001 * 2 * j, 0x10001 * 2 * j,
                              0x10001 * (2 * j + 1), 0x10001 * (2 * j + 1), 0x10001 * (2 * j + 1),
                              0x10001 * (2 * j + 1)), S))


# One super-block into slot r of record k: kunpack.pxd's form, the scales as krec keeps them.
cdef inline void unpack_kr(const kblock* b, krec* k, int r, bint expand) noexcept nogil:
    cdef __m256i S, O
    unpack_k(b, k.u[r], &S, &O, &k.d[r], &k.doff[r])
    _mm256_storeu_si256(<__m256i*>k.off[r], O)
    # Q4_K/Q5_K: S holds each sub-block's scale twice, i.e. the int32 pairs (sc << 16 | sc) ktile broadcasts
    if kblock is block_q4_K or kblock is block_q5_K or not expand:
        _mm256_storeu_si256(<__m256i*>k.scx[r], S)
    else:
        expand_scales(S, k.scx[r])


cdef void repack_k(const kblock* w, Py_ssize_t nb, krec* dst, int r, bint expand) noexcept nogil:
    cdef Py_ssize_t b
    for b in range(nb):
        unpack_kr(w + b, dst + b, r, expand)


cdef void repack_k_empty(Py_ssize_t nb, krec* dst, int r) noexcept nogil:
    cdef Py_ssize_t b
    for b in range(nb):
        memset(dst[b].u[r], 0, 256)
        memset(dst[b].scx[r], 0, 256)
        memset(dst[b].off[r], 0, 32)
        dst[b].d[r] = 0.0
        dst[b].doff[r] = 0.0


# One prefill tile of a K-quant: the R repacked rows w[0..nb) x T tokens from y (nb super-blocks apart).
# Per super-block the int32 lanes of every (row, token) are summed in registers with maddubs + dpwssd
# (= AVX2's maddubs, madd, add), then scaled into float accumulators exactly as matmul.pyx's kdot.
cdef void ktile(const kblock* tag, const tshape* shape, const scxform* form, const krec* w,
                const block_q8k* y, Py_ssize_t nb, float* out, Py_ssize_t ldo, int nvalid) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef bint same_d = kblock is block_q3_K or kblock is block_q6_K
    cdef __m256 acc[4][MAXT]
    cdef __m256i sumi[4][MAXT]
    cdef __m256i ux[4]
    cdef __m256i qy[MAXT]
    cdef __m256i sc, o, bs, idx
    cdef const krec* k
    cdef const block_q8k* yb
    cdef int r, t, j
    cdef Py_ssize_t b
    for r in range(R):
        for t in range(T):
            acc[r][t] = _mm256_setzero_ps()
    for b in range(nb):
        k = w + b
        for r in range(R):
            for t in range(T):
                sumi[r][t] = _mm256_setzero_si256()
        for j in range(8):
            # int16 lanes 0..7 pick the scale of group 2j, lanes 8..15 that of group 2j + 1
            idx = _mm256_add_epi16(_mm256_setr_epi32(0, 0, 0, 0, 0x10001, 0x10001, 0x10001, 0x10001),
                                   _mm256_set1_epi16(2 * j))
            for r in range(R):
                ux[r] = _mm256_loadu_si256(<const __m256i*>(k.u[r] + 32 * j))
            for t in range(T):
                qy[t] = _mm256_loadu_si256(<const __m256i*>((y + t * nb + b).qs + 32 * j))
            for r in range(R):
                if kblock is block_q4_K or kblock is block_q5_K:
                    sc = _mm256_set1_epi32((<const int32_t*>k.scx[r])[j])
                elif scxform is scx_expanded:
                    sc = _mm256_loadu_si256(<const __m256i*>&k.scx[r][16 * j])
                else:
                    sc = _mm256_permutexvar_epi16(idx, _mm256_loadu_si256(<const __m256i*>k.scx[r]))
                for t in range(T):
                    sumi[r][t] = _mm256_dpwssd_epi32(sumi[r][t], _mm256_maddubs_epi16(ux[r], qy[t]), sc)
        for t in range(T):
            yb = y + t * nb + b
            bs = _mm256_loadu_si256(<const __m256i*>yb.bsums)
            for r in range(R):
                o = _mm256_madd_epi16(_mm256_loadu_si256(<const __m256i*>k.off[r]), bs)
                if same_d:
                    acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(k.d[r] * yb.d),
                                                _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[r][t], o)), acc[r][t])
                else:
                    acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(k.d[r] * yb.d),
                                                _mm256_cvtepi32_ps(sumi[r][t]), acc[r][t])
                    acc[r][t] = _mm256_fnmadd_ps(_mm256_set1_ps(k.doff[r] * yb.d),
                                                 _mm256_cvtepi32_ps(o), acc[r][t])
    for t in range(T):
        for r in range(nvalid):
            out[t * ldo + r] = hsum8(acc[r][t])


# =========================================================================================================
# Drivers


# One tile of any quantized type: repacked row tile wt x T tokens from X + t0.
cdef inline void qtile(const qblock* tag, const tshape* shape, const void* wt, const void* X, Py_ssize_t t0,
                       Py_ssize_t nb, float* out, Py_ssize_t ldo, int nvalid, bint expanded) noexcept nogil:
    if qblock is block_q2_K or qblock is block_q3_K or qblock is block_q4_K or qblock is block_q5_K \
            or qblock is block_q6_K:
        if expanded:
            ktile(tag, shape, <const scx_expanded*>NULL, <const krec*>wt, <const block_q8k*>X + t0 * nb, nb, out,
                  ldo, nvalid)
        else:
            ktile(tag, shape, <const scx_compact*>NULL, <const krec*>wt, <const block_q8k*>X + t0 * nb, nb, out,
                  ldo, nvalid)
    else:
        ltile(tag, shape, <const lrec*>wt, <const block_q8a*>X + t0 * nb, nb, out, ldo, nvalid)


# Rows [r0, r0 + R) (those below `rows`; zeros for the others) into the records of row tile wt.
cdef inline void repack_tile(const qblock* W, Py_ssize_t rows, Py_ssize_t r0, Py_ssize_t nb, void* wt,
                             bint expand) noexcept nogil:
    cdef int r
    for r in range(R):
        if qblock is block_q2_K or qblock is block_q3_K or qblock is block_q4_K or qblock is block_q5_K \
                or qblock is block_q6_K:
            if r0 + r < rows:
                repack_k(W + (r0 + r) * nb, nb, <krec*>wt, r, expand)
            else:
                repack_k_empty(nb, <krec*>wt, r)
        else:
            if r0 + r < rows:
                repack_l(W + (r0 + r) * nb, nb, <lrec*>wt, r)
            else:
                repack_l_empty(nb, <lrec*>wt, r)


# Repacked row tile wt (output rows from r0, nvalid of them) against tokens [t0, t1): tiles of 4 tokens,
# then one of the 1-3 left.
cdef inline void tile_tokens(const qblock* W, const void* wt, const void* X, Py_ssize_t t0, Py_ssize_t t1,
                             Py_ssize_t nb, float* Y, Py_ssize_t ldy, Py_ssize_t r0, int nvalid,
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


# Prefill work item g: rows [g*G, g*G + G), repacked into buf (rec bytes per block of R rows), against every
# token. With one chunk of tokens (n_tok <= TCH) each row tile is repacked right before its tiles run, so
# that they find it in L1; with more, the whole work item is repacked first and the tokens go chunk by chunk
# of TCH, each row tile in turn (the work item's rows stay in L2, a chunk's activations too).
cdef void q_group(const qblock* W, Py_ssize_t rows, Py_ssize_t nb, const void* X, Py_ssize_t n_tok,
                  float* Y, Py_ssize_t ldy, Py_ssize_t G, Py_ssize_t g, char* buf, Py_ssize_t rec) noexcept nogil:
    cdef Py_ssize_t r0 = g * G
    cdef Py_ssize_t r1 = min(rows, r0 + G)
    cdef Py_ssize_t ntiles = (r1 - r0 + R - 1) // R
    cdef Py_ssize_t i, t0, t1
    cdef bint expand = n_tok > COMPACT_TOK
    if n_tok <= TCH:
        for i in range(ntiles):
            repack_tile(W, r1, r0 + i * R, nb, buf + i * nb * rec, expand)
            tile_tokens(W, buf + i * nb * rec, X, 0, n_tok, nb, Y, ldy, r0 + i * R,
                        <int>min(<Py_ssize_t>R, r1 - r0 - i * R), expand)
        return
    for i in range(ntiles):
        repack_tile(W, r1, r0 + i * R, nb, buf + i * nb * rec, expand)
    t0 = 0
    while t0 < n_tok:
        t1 = min(n_tok, t0 + TCH)
        for i in range(ntiles):
            tile_tokens(W, buf + i * nb * rec, X, t0, t1, nb, Y, ldy, r0 + i * R,
                        <int>min(<Py_ssize_t>R, r1 - r0 - i * R), expand)
        t0 = t1


# buf: the repacked rows of one work item (G rows).
cdef void mm_prefill(const qblock* W, Py_ssize_t rows, Py_ssize_t nb, const void* X, Py_ssize_t n_tok,
                     float* Y, Py_ssize_t ldy, Py_ssize_t G, char* buf) noexcept nogil:
    cdef Py_ssize_t g, ngroups = (rows + G - 1) // G
    cdef Py_ssize_t rec = sizeof(krec) if qblock is block_q2_K or qblock is block_q3_K \
        or qblock is block_q4_K or qblock is block_q5_K or qblock is block_q6_K else sizeof(lrec)
    for g in range(ngroups):
        q_group(W, rows, nb, X, n_tok, Y, ldy, G, g, buf, rec)


# Few tokens (n_tok <= RAW_TOK), no repacking: rows [g*R, g*R + R) against all tokens; rows left over at
# the end (fewer than R) one at a time with the decode tile, token by token.
cdef inline void l_raw_group(const lblock* W, Py_ssize_t rows, Py_ssize_t nb, const block_q8a* X,
                             Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, Py_ssize_t g) noexcept nogil:
    cdef Py_ssize_t r = g * R
    cdef Py_ssize_t t = 0
    if r + R <= rows:
        while t + 4 <= n_tok:
            ltile_raw(W + r * nb, <const tok4*>NULL, X + t * nb, nb, Y + t * ldy + r, ldy)
            t += 4
        if n_tok - t == 3:
            ltile_raw(W + r * nb, <const tok3*>NULL, X + t * nb, nb, Y + t * ldy + r, ldy)
        elif n_tok - t == 2:
            ltile_raw(W + r * nb, <const tok2*>NULL, X + t * nb, nb, Y + t * ldy + r, ldy)
        elif n_tok - t == 1:
            ltile_raw(W + r * nb, <const tok1*>NULL, X + t * nb, nb, Y + t * ldy + r, ldy)
    else:
        while r < rows:
            for t in range(n_tok):
                ldec(W + r * nb, <const row1*>NULL, X + t * nb, nb, Y + t * ldy + r)
            r += 1


cdef void mm_raw(const lblock* W, Py_ssize_t rows, Py_ssize_t nb, const block_q8a* X, Py_ssize_t n_tok,
                 float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t g, ngroups = (rows + R - 1) // R
    for g in range(ngroups):
        l_raw_group(W, rows, nb, X, n_tok, Y, ldy, g)


# Decode: rows [g*R, g*R + R) against one token.
cdef inline void l_decode_group(const lblock* W, Py_ssize_t rows, Py_ssize_t nb, const block_q8a* X,
                                float* Y, Py_ssize_t g) noexcept nogil:
    cdef Py_ssize_t r = g * R
    if r + R <= rows:
        ldec(W + r * nb, <const row4*>NULL, X, nb, Y + r)
    else:
        while r < rows:
            ldec(W + r * nb, <const row1*>NULL, X, nb, Y + r)
            r += 1


cdef void mm_decode(const lblock* W, Py_ssize_t rows, Py_ssize_t nb, const block_q8a* X,
                    float* Y) noexcept nogil:
    cdef Py_ssize_t g, ngroups = (rows + R - 1) // R
    for g in range(ngroups):
        l_decode_group(W, rows, nb, X, Y, g)


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
# the AVX2 kernels: K-quant decode, or no memory for the repacked rows.
cdef int mm512(const qblock* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok, float* Y,
               Py_ssize_t ldy) noexcept nogil:
    cdef bint kq = qblock is block_q2_K or qblock is block_q3_K or qblock is block_q4_K \
        or qblock is block_q5_K or qblock is block_q6_K
    cdef Py_ssize_t nb = cols // (QK_K if kq else QK8_0)
    cdef Py_ssize_t G, rec
    cdef char* buf
    if rows <= 0 or n_tok <= 0 or nb <= 0:
        return 0
    if qblock is block_q4_0 or qblock is block_q4_1 or qblock is block_q5_0 or qblock is block_q5_1 \
            or qblock is block_q8_0:
        if n_tok == 1:
            mm_decode(W, rows, nb, <const block_q8a*>X, Y)
            return 1
        if n_tok <= RAW_TOK:
            mm_raw(W, rows, nb, <const block_q8a*>X, n_tok, Y, ldy)
            return 1
    elif n_tok == 1:
        return 0
    rec = sizeof(krec) if kq else sizeof(lrec)
    G = group_rows(nb * rec // R)
    buf = <char*>lc_scratch(G // R * nb * rec)
    if buf == NULL:
        return 0  # out of memory: AVX2 needs none
    mm_prefill(W, rows, nb, X, n_tok, Y, ldy, G, buf)
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
