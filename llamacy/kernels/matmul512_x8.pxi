# Q4_0, Q4_1, Q5_0 and Q8_0 weights repacked once, at load, into 8-row tiles (kernels/repack.pyx writes
# them, model/repack.py decides which): the VNNI products that read them (the K-quants' tiles are
# matmul512_kx8.pxi's). Included by matmul512.pyx, whose types and the row-lane helpers of
# matmul512_lanes.pxi it uses.
#
# Why. The row-lane kernels give each of 8 rows a float lane; from the blocks as stored they first
# transpose 8 rows' quants per block (repack_lanes), once per product. With a prompt's hundreds of tokens
# that is amortised; with the 8 tokens of an 8-sequence server step, a few-token speculative check or a
# short prompt it is up to half of the product's work (an 8x8 transpose and 8 scale conversions per block
# against 8 tokens x 8 dpbusd). Done once at load, as llama.cpp's CPU "repack" buffers do (its
# block_q4_0x8), it costs nothing per product; a Q4_0 tile is the size of the 8 rows it replaces.
#
# Float order: each row's chain is the row-lane one, fma(float(isum_b), d_w * d_x, sum) block by block
# with isum_b the block's exact integer sum (the seed adds -offset x the token block's quant sum first, as
# lanes_tile's does; integer sums are exact in any order; Q4_1 has no seed and its mins' chain beside). So a repacked matrix gives the very bits of the same matrix as stored, on every
# path and thread count (tests/test_repack.py).


# One 32-value block of 8 rows: d, the rows' fp16 scales; q[g], 32 bytes, row r's stored qs bytes 4g..4g+3
# at bytes 4r..4r+3. A Q4_0 byte holds value j in its low nibble and value j + 16 in its high one, so
# q[g] & 0x0F is what dpbusd takes for values 4g..4g+3 of the 8 rows and q[g] >> 4 for values 16+4g..
# 16+4g+3: lanes_tile's wq[g] and wq[g + 4] without the transpose. 144 bytes, 8 stored blocks' worth: tile
# i (rows 8i..8i+7) starts where row 8i did.
ctypedef struct x8rec:
    uint16_t d[LR]
    uint8_t q[4][32]


# Q4_1's block of 8 rows: as x8rec, with the rows' fp16 mins after their scales. 160 bytes, 8 stored blocks'.
ctypedef struct x8rec_min:
    uint16_t d[LR]
    uint16_t m[LR]
    uint8_t q[4][32]

# Q8_0's block of 8 rows: d, the rows' fp16 scales; q[g], row r's quants 4g..4g+3 at bytes 4r..4r+3, each
# plus 128 (what dpbusd takes unsigned; load_u's q + 128): lanes_tile's wq[g] as they lie. 272 bytes, 8 stored
# blocks' worth. Read as stored, 8 rows are 8 streams of 34-byte blocks, whose scales decode gathers one by
# one; as a tile they are one stream (on the Intel Xeon a Llama-1B's 64-block rows streamed at 16-19 GB/s
# at 2 threads as stored, BENCHMARKS.md).
ctypedef struct x8rec_q8:
    uint16_t d[LR]
    uint8_t q[8][32]

# Q5_0's block of 8 rows: as x8rec, with the rows' fifth bits regrouped between the scales and the nibbles:
# bit 4r+i of h[g] is row r's fifth bit of the value whose low four bits wq[g] holds in byte 4r+i (g < 4:
# value 4g+i, from the low nibbles; g >= 4: value 16+4(g-4)+i, from the high ones), which is bit 4g+i of the
# row's stored qh. So one masked byte add per group makes lanes_tile's unsigned quants (load_u: q + 16),
# where the stored blocks take a 32-bit spread of qh per row and block. 176 bytes, 8 stored blocks' worth.
ctypedef struct x8rec_q5:
    uint16_t d[LR]
    uint32_t h[8]
    uint8_t q[4][32]

ctypedef fused x8any:
    x8rec
    x8rec_min
    x8rec_q8
    x8rec_q5


# One tile block's quants as dpbusd's unsigned operands, wq[g] as lanes_tile's (load_u: q + 8 for Q4_0, the
# stored nibble for Q4_1, q + 16 for Q5_0, q + 128 for Q8_0): Q8_0's as they lie, the others' nibbles split,
# Q5_0's then given their fifth bits.
cdef inline void x8_quants(const x8any* rec, __m256i* wq) noexcept nogil:
    cdef __m256i m4 = _mm256_set1_epi8(0x0F)
    cdef __m256i c16 = _mm256_set1_epi8(0x10)
    cdef __m256i p
    cdef int g
    if x8any is x8rec_q8:
        for g in range(8):
            wq[g] = _mm256_loadu_si256(<const __m256i*>rec.q[g])
        return
    for g in range(4):
        p = _mm256_loadu_si256(<const __m256i*>rec.q[g])
        wq[g] = _mm256_and_si256(p, m4)
        wq[g + 4] = _mm256_and_si256(_mm256_srli_epi16(p, 4), m4)
    if x8any is x8rec_q5:
        for g in range(8):
            wq[g] = _mm256_mask_add_epi8(wq[g], rec.h[g], wq[g], c16)


# The offset of a tile type's unsigned quants (lane_offset's): 8 (Q4_0), 16 (Q5_0), 128 (Q8_0), 0 (Q4_1).
cdef inline int x8_offset(const x8any* tag) noexcept nogil:
    if x8any is x8rec:
        return 8
    elif x8any is x8rec_q5:
        return 16
    elif x8any is x8rec_q8:
        return 128
    else:
        return 0


# One tile of the 8 rows of records rec x T tokens from y (nb blocks apart; sums: their seeds, or NULL to
# compute them here; Q4_1 has none); out[t * ldo + r]. pf: the next tile's records, requested block by block
# as these are read; with pf_rec_ahead set, only a flag: these records' own stream is requested that far
# ahead instead (NULL: no prefetch).
cdef void x8_tile(const tshape* shape, const x8any* rec, const block_q8a* y, const int32_t* sums,
                  Py_ssize_t nb, float* out, Py_ssize_t ldo, const char* pf) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef __m256 acc[MAXT]
    cdef __m256 mins[MAXT]
    cdef __m256 mw
    cdef __m256i wq[8]
    cdef __m256i lo, hi
    cdef __m256i zero = _mm256_setzero_si256()
    cdef __m256i ones = _mm256_set1_epi8(1)
    cdef __m256 dw
    cdef const block_q8a* yb
    cdef const uint8_t* xq
    cdef float res[LR]
    cdef int r, t, g
    cdef int32_t seed
    cdef Py_ssize_t b
    cdef Py_ssize_t ahead = pf_rec_ahead  # a local: the global would be read again at every block
    cdef Py_ssize_t page = pf_page_ahead
    for t in range(T):
        acc[t] = _mm256_setzero_ps()
        if x8any is x8rec_min:
            mins[t] = _mm256_setzero_ps()
    for b in range(nb):
        if pf != NULL:
            if ahead == 0:
                lc_prefetch_span(pf + b * sizeof(x8any), sizeof(x8any))
            else:
                lc_prefetch_span(<const char*>(rec + b) + ahead, sizeof(x8any))
                if page:
                    lc_prefetch_l2(<const char*>(rec + b) + ahead + page)
        x8_quants(&rec[b], wq)
        dw = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>rec[b].d))
        if x8any is x8rec_min:
            mw = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>rec[b].m))
        for t in range(T):
            yb = y + t * nb + b
            xq = <const uint8_t*>yb.qs
            if x8any is x8rec_min:
                seed = 0
            elif sums != NULL:
                seed = sums[t * nb + b]
            else:
                seed = -x8_offset(rec) * hsum8_epi32(
                    _mm256_dpbusd_epi32(zero, ones, _mm256_loadu_si256(<const __m256i*>xq)))
            lo = _mm256_set1_epi32(seed)
            hi = zero
            for g in range(4):
                lo = _mm256_dpbusd_epi32(lo, wq[g], _mm256_set1_epi32(<int>load_u32(xq + 4 * g)))
                hi = _mm256_dpbusd_epi32(hi, wq[g + 4], _mm256_set1_epi32(<int>load_u32(xq + 16 + 4 * g)))
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi)),
                                     _mm256_mul_ps(dw, _mm256_set1_ps(yb.d)), acc[t])
            if x8any is x8rec_min:
                mins[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(yb.s), mins[t])
    for t in range(T):
        if x8any is x8rec_min:
            acc[t] = _mm256_add_ps(acc[t], mins[t])
        _mm256_storeu_ps(res, acc[t])
        for r in range(LR):
            out[t * ldo + r] = res[r]


# Tile rec (output rows from r0) against tokens [t0, t1): tiles of 4 tokens, then one of the 1-3 left.
cdef inline void x8_tokens(const x8any* rec, const block_q8a* X, const int32_t* sums, Py_ssize_t t0,
                           Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy, Py_ssize_t r0,
                           const char* pf) noexcept nogil:
    cdef Py_ssize_t t = t0
    cdef const int32_t* s
    while t + 4 <= t1:
        s = sums + t * nb if sums != NULL else NULL
        x8_tile(<const tok4*>NULL, rec, X + t * nb, s, nb, Y + t * ldy + r0, ldy, pf)
        pf = NULL  # the tile's first pass over the records brought them in
        t += 4
    s = sums + t * nb if sums != NULL else NULL
    if t1 - t == 3:
        x8_tile(<const tok3*>NULL, rec, X + t * nb, s, nb, Y + t * ldy + r0, ldy, pf)
    elif t1 - t == 2:
        x8_tile(<const tok2*>NULL, rec, X + t * nb, s, nb, Y + t * ldy + r0, ldy, pf)
    elif t1 - t == 1:
        x8_tile(<const tok1*>NULL, rec, X + t * nb, s, nb, Y + t * ldy + r0, ldy, pf)


# The product of rows (a multiple of LR) repacked as x8rec (x8rec_min) tiles. Up to TCH tokens, tile by
# tile over all the tokens, the next tile's bytes requested while one is read (decode and few tokens stream
# the weights); more, chunk by chunk of TCH tokens, each tile of the call's rows in turn (the chunk's
# activations stay in L2). Q4_0's seeds come from a scratch buffer, or where none can be had from the tiles
# themselves: the same integers either way. Q5_0's prompts go through lane records (x8_expand_lanes, a work
# item's tiles at a time, as kx8_product does for the K-quants): spreading its fifth bits once per product
# instead of once per 8 tokens (Gemma 3 270M pp512, BENCHMARKS.md). Always 1.
cdef int x8_product(const x8any* rec, Py_ssize_t rows, Py_ssize_t cols, const block_q8a* X, Py_ssize_t n_tok,
                    float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t nb = cols // QK8_0, ntiles = rows // LR, i, t0, t1, per = 0, sums_bytes, g0, ng
    cdef int32_t* sums = NULL
    cdef lanerec* buf = NULL
    cdef const char* pf
    cdef Py_ssize_t done
    cdef const block_q5_0* q5_0 = NULL
    if ntiles <= 0 or n_tok <= 0 or nb <= 0:
        return 1
    if amx_on and n_tok >= AMX_TOK:  # the tile unit takes the pairs of tiles (matmul512_amx.pxi)
        done = amx_x8(rec, rows, nb, X, n_tok, Y, ldy)
        if done == rows:
            return 1
        rec += done // LR * nb
        rows -= done
        ntiles = rows // LR
        Y += done
    if x8any is x8rec or x8any is x8rec_q8 or x8any is x8rec_q5:
        sums_bytes = (n_tok * nb * <Py_ssize_t>sizeof(int32_t) + 63) // 64 * 64
        if x8any is x8rec_q5 and n_tok > TCH and pairs_on:
            # tiles per item: what fits GROUP_BYTES, but a pair at least (wide rows would otherwise go unpaired)
            per = max(2, min(GROUP_BYTES // (nb * <Py_ssize_t>sizeof(lanerec)), GR // LR))
        sums = <int32_t*>lc_scratch(sums_bytes + per * nb * sizeof(lanerec))
        if sums != NULL:
            buf = <lanerec*>(<char*>sums + sums_bytes)
            if x8any is x8rec:
                token_sums(<const block_q4_0*>NULL, X, n_tok * nb, sums)
            elif x8any is x8rec_q5:
                token_sums(<const block_q5_0*>NULL, X, n_tok * nb, sums)
            else:
                token_sums(<const block_q8_0*>NULL, X, n_tok * nb, sums)
    if n_tok <= TCH:
        for i in range(ntiles):
            pf = <const char*>(rec + (i + 1) * nb) if i + 1 < ntiles or pf_rec_ahead else NULL
            x8_tokens(rec + i * nb, X, sums, 0, n_tok, nb, Y, ldy, i * LR, pf)
        return 1
    if x8any is x8rec_q5:
        if per > 0 and sums != NULL:
            g0 = 0
            while g0 < ntiles:
                ng = min(per, ntiles - g0)
                x8_expand_lanes(rec + g0 * nb, ng, nb, buf)
                t0 = 0
                while t0 < n_tok:
                    t1 = min(n_tok, t0 + TCH)
                    i = 0
                    while i + 2 <= ng:
                        lanes_pair(q5_0, buf + i * nb, X, sums, t0, t1, nb, Y + (g0 + i) * LR, ldy)
                        i += 2
                    if i < ng:  # the odd tile from its records: the same numbers
                        x8_tokens(rec + (g0 + i) * nb, X, sums, t0, t1, nb, Y, ldy, (g0 + i) * LR, NULL)
                    t0 = t1
                g0 += ng
            return 1
    t0 = 0
    while t0 < n_tok:
        t1 = min(n_tok, t0 + TCH)
        i = 0
        if x8any is x8rec or x8any is x8rec_min or x8any is x8rec_q8:  # Q5_0's pairs: lane records, above
            if pairs_on and (sums != NULL or x8any is x8rec_min):
                while i + 2 <= ntiles:
                    x16_tokens(rec + i * nb, X, sums, t0, t1, nb, Y + i * LR, ldy)
                    i += 2
        while i < ntiles:
            x8_tokens(rec + i * nb, X, sums, t0, t1, nb, Y, ldy, i * LR, NULL)
            i += 1
        t0 = t1
    return 1


# Tiles rec and rec + nb (16 rows, output rows from Y) against tokens [t0, t1), in 512-bit vectors (x16.h).
cdef inline void x16_tokens(const x8any* rec, const block_q8a* X, const int32_t* sums, Py_ssize_t t0,
                            Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy) noexcept nogil:
    if x8any is x8rec:
        lc_x16_q4_0(rec, rec + nb, sizeof(x8any), X, sums, t0, t1, nb, Y, ldy)
    elif x8any is x8rec_min:
        lc_x16_q4_1(rec, rec + nb, sizeof(x8any), X, sums, t0, t1, nb, Y, ldy)
    elif x8any is x8rec_q8:
        lc_x16_q8_0(rec, rec + nb, sizeof(x8any), X, sums, t0, t1, nb, Y, ldy)


cdef int mm512_q4_0_x8(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                       float* Y, Py_ssize_t ldy) noexcept nogil:
    return x8_product(<const x8rec*>W, rows, cols, <const block_q8a*>X, n_tok, Y, ldy)


cdef int mm512_q4_1_x8(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                       float* Y, Py_ssize_t ldy) noexcept nogil:
    return x8_product(<const x8rec_min*>W, rows, cols, <const block_q8a*>X, n_tok, Y, ldy)


cdef int mm512_q8_0_x8(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                       float* Y, Py_ssize_t ldy) noexcept nogil:
    return x8_product(<const x8rec_q8*>W, rows, cols, <const block_q8a*>X, n_tok, Y, ldy)


cdef int mm512_q5_0_x8(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                       float* Y, Py_ssize_t ldy) noexcept nogil:
    return x8_product(<const x8rec_q5*>W, rows, cols, <const block_q8a*>X, n_tok, Y, ldy)
