# Q4_0 weights repacked once, at load, into 8-row tiles (kernels/repack.pyx writes them, model/repack.py
# decides which): the VNNI product that reads them. Included by matmul512.pyx, whose types and the row-lane
# helpers of matmul512_lanes.pxi it uses.
#
# Why. The row-lane kernels give each of 8 rows a float lane; from the blocks as stored they first
# transpose 8 rows' quants per block (repack_lanes), once per product. With a prompt's hundreds of tokens
# that is amortised; with the 8 tokens of an 8-sequence server step, a few-token speculative check or a
# short prompt it is up to half of the product's work (an 8x8 transpose and 8 scale conversions per block
# against 8 tokens x 8 dpbusd). Done once at load, as llama.cpp's CPU "repack" buffers do (its
# block_q4_0x8), it costs nothing per product, and the tile is the same size as the 8 rows it replaces.
#
# Float order: each row's chain is the row-lane one, fma(float(isum_b), d_w * d_x, sum) block by block with
# isum_b the block's exact integer sum (the seed adds -8 x the token block's quant sum first, as
# lanes_tile's does; integer sums are exact in any order). So a repacked matrix gives the very bits of the
# same matrix as stored, on every path and thread count (tests/test_repack.py).


# One 32-value block of 8 rows: d, the rows' fp16 scales; q[g], 32 bytes, row r's stored qs bytes 4g..4g+3
# at bytes 4r..4r+3. A Q4_0 byte holds value j in its low nibble and value j + 16 in its high one, so
# q[g] & 0x0F is what dpbusd takes for values 4g..4g+3 of the 8 rows and q[g] >> 4 for values 16+4g..
# 16+4g+3: lanes_tile's wq[g] and wq[g + 4] without the transpose. 144 bytes, 8 stored blocks' worth: tile
# i (rows 8i..8i+7) starts where row 8i did.
ctypedef struct x8rec:
    uint16_t d[LR]
    uint8_t q[4][32]


# One tile of the 8 rows of records rec x T tokens from y (nb blocks apart; sums: their seeds, or NULL to
# compute them here); out[t * ldo + r]. pf: bytes to request ahead, block by block (NULL: none).
cdef void x8_tile(const tshape* shape, const x8rec* rec, const block_q8a* y, const int32_t* sums,
                  Py_ssize_t nb, float* out, Py_ssize_t ldo, const char* pf) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef __m256 acc[MAXT]
    cdef __m256i wq[8]
    cdef __m256i p, lo, hi
    cdef __m256i zero = _mm256_setzero_si256()
    cdef __m256i ones = _mm256_set1_epi8(1)
    cdef __m256i m4 = _mm256_set1_epi8(0x0F)
    cdef __m256 dw
    cdef const block_q8a* yb
    cdef const uint8_t* xq
    cdef float res[LR]
    cdef int r, t, g
    cdef int32_t seed
    cdef Py_ssize_t b
    for t in range(T):
        acc[t] = _mm256_setzero_ps()
    for b in range(nb):
        if pf != NULL:
            lc_prefetch_span(pf + b * sizeof(x8rec), sizeof(x8rec))
        for g in range(4):
            p = _mm256_loadu_si256(<const __m256i*>rec[b].q[g])
            wq[g] = _mm256_and_si256(p, m4)
            wq[g + 4] = _mm256_and_si256(_mm256_srli_epi16(p, 4), m4)
        dw = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>rec[b].d))
        for t in range(T):
            yb = y + t * nb + b
            xq = <const uint8_t*>yb.qs
            if sums != NULL:
                seed = sums[t * nb + b]
            else:
                seed = -8 * hsum8_epi32(_mm256_dpbusd_epi32(zero, ones, _mm256_loadu_si256(<const __m256i*>xq)))
            lo = _mm256_set1_epi32(seed)
            hi = zero
            for g in range(4):
                lo = _mm256_dpbusd_epi32(lo, wq[g], _mm256_set1_epi32(<int>load_u32(xq + 4 * g)))
                hi = _mm256_dpbusd_epi32(hi, wq[g + 4], _mm256_set1_epi32(<int>load_u32(xq + 16 + 4 * g)))
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi)),
                                     _mm256_mul_ps(dw, _mm256_set1_ps(yb.d)), acc[t])
    for t in range(T):
        _mm256_storeu_ps(res, acc[t])
        for r in range(LR):
            out[t * ldo + r] = res[r]


# Tile rec (output rows from r0) against tokens [t0, t1): tiles of 4 tokens, then one of the 1-3 left.
cdef inline void x8_tokens(const x8rec* rec, const block_q8a* X, const int32_t* sums, Py_ssize_t t0,
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


# The product of rows (a multiple of LR) repacked as x8rec tiles. Up to TCH tokens, tile by tile over all
# the tokens, the next tile's bytes requested while one is read (decode and few tokens stream the weights);
# more, chunk by chunk of TCH tokens, each tile of the call's rows in turn (the chunk's activations stay in
# L2). The seeds come from a scratch buffer, or where none can be had from the tiles themselves: the same
# integers either way. Always 1.
cdef int mm512_q4_0_x8(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* Xv, Py_ssize_t n_tok,
                       float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef const x8rec* rec = <const x8rec*>W
    cdef const block_q8a* X = <const block_q8a*>Xv
    cdef Py_ssize_t nb = cols // QK8_0, ntiles = rows // LR, i, t0, t1
    cdef int32_t* sums
    cdef const char* pf
    if ntiles <= 0 or n_tok <= 0 or nb <= 0:
        return 1
    sums = <int32_t*>lc_scratch(n_tok * nb * sizeof(int32_t))
    if sums != NULL:
        token_sums(<const block_q4_0*>NULL, X, n_tok * nb, sums)
    if n_tok <= TCH:
        for i in range(ntiles):
            pf = <const char*>(rec + (i + 1) * nb) if i + 1 < ntiles else NULL
            x8_tokens(rec + i * nb, X, sums, 0, n_tok, nb, Y, ldy, i * LR, pf)
        return 1
    t0 = 0
    while t0 < n_tok:
        t1 = min(n_tok, t0 + TCH)
        for i in range(ntiles):
            x8_tokens(rec + i * nb, X, sums, t0, t1, nb, Y, ldy, i * LR, NULL)
        t0 = t1
    return 1
