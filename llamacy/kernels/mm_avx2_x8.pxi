# Q4_0 and Q8_0 on AVX2 in issue #29's row-lane float order: 8 rows a tile, one float lane a row (the
# K-quants' tiles: mm_avx2_kx8.pxi). Included by mm_avx2.pyx.
#
# Why. The per-lane tiles (tile_lg) spend, for every (row, token, block), a maddubs, an offset, a madd, a
# conversion, a scale product and an FMA on 32 products. With 8 rows interleaved 4 values at a time (the
# layout repack.pyx writes for LAYOUT_Q4_0_X8, as llama.cpp's block_q4_0x8), one maddubs multiplies 4
# values of 8 rows by a token's 4 quants broadcast, the 8 products of a block add up in int16, and one
# madd, conversion and FMA then finish 8 rows: about 2.4 times fewer operations per product. On the AMD EPYC
# (Zen 3, AVX2 only) of session 27, llama.cpp's repacked Q4_0 prefill ran 1.25x ours (BENCHMARKS.md).
#
# Float order: per row, block by block, sum = fma(float(isum_b), d_w * d_x, sum) from 0, isum_b the block's
# exact integer sum (seeded with -8 x the token block's quant sum), the result the lane itself. That is the
# order of matmul512's row-lane kernels (matmul512_x8.pxi, matmul512_lanes.pxi), so on a CPU with both
# families the two give the same bits, and every Q4_0 path here (stored rows or tiles, decode, few tokens,
# prefill, token chunks, any thread count) gives the same bits (tests/test_kernels_avx2_lanes.py).
#
# Exactness of the int16 sums: a nibble is at most 15 and a token quant at most 128 in magnitude, so a
# maddubs pair is at most 3,840 and the 8 pairs a lane gathers over a block (values 4g..4g+3 and
# 16+4g..16+4g+3, g < 4) at most 30,720 < 32,767: nothing saturates.

cdef extern from "scratch.h" nogil:
    void* lc_scratch(size_t n)

cdef enum:
    X8R = 8         # rows per tile: one float lane each
    X8_REC = 144    # bytes of one tile block: 8 fp16 scales, 4 x 32 bytes of quants


# One 32-value block of 8 rows (repack.pyx's Q4_0 tile, matmul512_x8.pxi's x8rec): d, the rows' fp16 scales;
# q[g], row r's stored quant bytes 4g..4g+3 at bytes 4r..4r+3 (low nibbles values 4g.., high 16+4g..).
ctypedef struct x8q4:
    uint16_t d[X8R]
    uint8_t q[4][32]


# Token counts of a tile, as types: one C function per count, with the token loops unrolled.
ctypedef struct xtok1:
    char unused
ctypedef struct xtok2:
    char unused
ctypedef struct xtok3:
    char unused
ctypedef struct xtok4:
    char unused

ctypedef fused xtok:
    xtok1
    xtok2
    xtok3
    xtok4


cdef inline int xtoks(const xtok* tag) noexcept nogil:
    if xtok is xtok1:
        return 1
    elif xtok is xtok2:
        return 2
    elif xtok is xtok3:
        return 3
    else:
        return 4


# The seeds of n activation blocks: -8 x the sum of each block's 32 quants (exact).
cdef void x8_seeds(const block_q8a* X, Py_ssize_t n, int32_t* seeds) noexcept nogil:
    cdef __m256i ones8 = _mm256_set1_epi8(1)
    cdef __m256i ones16 = _mm256_set1_epi16(1)
    cdef Py_ssize_t i
    for i in range(n):
        seeds[i] = -8 * hsum8_epi32(_mm256_madd_epi16(
            _mm256_maddubs_epi16(ones8, _mm256_loadu_si256(<const __m256i*>X[i].qs)), ones16))


# One tile: the 8 rows of records rec against T tokens from y (nb blocks apart, seeds beside them); row r's
# result for token t to out[t * ldo + r] for r < nrows. pf: the next tile's records, requested block by block
# as these are read (NULL: none).
cdef void x8_tile_avx2(const xtok* tag, const x8q4* rec, const block_q8a* y, const int32_t* seeds,
                       Py_ssize_t nb, float* out, Py_ssize_t ldo, int nrows, const char* pf) noexcept nogil:
    cdef int T = xtoks(tag)
    cdef __m256 acc[4]
    cdef __m256i s16[4]
    cdef __m256i m4 = _mm256_set1_epi8(0x0F)
    cdef __m256i ones16 = _mm256_set1_epi16(1)
    cdef __m256i p, lo, hi
    cdef __m256 dw
    cdef const uint8_t* xq
    cdef float res[X8R]
    cdef int t, g, r
    cdef Py_ssize_t b
    for t in range(T):
        acc[t] = _mm256_setzero_ps()
    for b in range(nb):
        if pf != NULL:
            lc_prefetch_span(pf + b * X8_REC, X8_REC)
        for t in range(T):
            s16[t] = _mm256_setzero_si256()
        for g in range(4):
            p = _mm256_loadu_si256(<const __m256i*>rec[b].q[g])
            lo = _mm256_and_si256(p, m4)
            hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), m4)
            for t in range(T):
                xq = <const uint8_t*>y[t * nb + b].qs
                s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(<int>load_u32(xq + 4 * g))))
                s16[t] = _mm256_add_epi16(
                    s16[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(<int>load_u32(xq + 16 + 4 * g))))
        dw = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>rec[b].d))
        for t in range(T):
            acc[t] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(s16[t], ones16),
                                                    _mm256_set1_epi32(seeds[t * nb + b]))),
                _mm256_mul_ps(dw, _mm256_set1_ps(y[t * nb + b].d)), acc[t])
    for t in range(T):
        if nrows == X8R:
            _mm256_storeu_ps(out + t * ldo, acc[t])
        else:
            _mm256_storeu_ps(res, acc[t])
            for r in range(nrows):
                out[t * ldo + r] = res[r]


# One tile against tokens [t0, t1): tiles of 4 tokens, then one of the 1-3 left. Y: the tile's first row's
# column of the output.
cdef inline void x8_tokens_avx2(const x8q4* rec, const block_q8a* X, const int32_t* seeds, Py_ssize_t t0,
                                Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy, int nrows,
                                const char* pf) noexcept nogil:
    cdef Py_ssize_t t = t0
    while t + 4 <= t1:
        x8_tile_avx2(<const xtok4*>NULL, rec, X + t * nb, seeds + t * nb, nb, Y + t * ldy, ldy, nrows, pf)
        pf = NULL  # the first pass over the records brought them in
        t += 4
    if t1 - t == 3:
        x8_tile_avx2(<const xtok3*>NULL, rec, X + t * nb, seeds + t * nb, nb, Y + t * ldy, ldy, nrows, pf)
    elif t1 - t == 2:
        x8_tile_avx2(<const xtok2*>NULL, rec, X + t * nb, seeds + t * nb, nb, Y + t * ldy, ldy, nrows, pf)
    elif t1 - t == 1:
        x8_tile_avx2(<const xtok1*>NULL, rec, X + t * nb, seeds + t * nb, nb, Y + t * ldy, ldy, nrows, pf)


# The 4-byte groups of 8 rows as tile vectors, transposed in registers (a gather of scalar copies cost
# decode over stored rows 2.5-4.4x the old kernel's time per product): p[r] points at row r's bytes.
# transpose8: 8 groups (32 bytes) of each row -> dst[32g + 4r] for g < 8.
cdef inline void transpose8(const uint8_t* const* p, uint8_t* dst, uint32_t flip) noexcept nogil:
    cdef __m256i a[8]
    cdef __m256i t[8]
    cdef __m256i u[8]
    cdef __m256i fl = _mm256_set1_epi32(<int>flip)
    cdef int r, g
    for r in range(8):
        a[r] = _mm256_loadu_si256(<const __m256i*>p[r])
    for r in range(0, 8, 2):  # t[r]: groups 0,1 | 4,5 of rows r, r+1; t[r+1]: groups 2,3 | 6,7
        t[r] = _mm256_unpacklo_epi32(a[r], a[r + 1])
        t[r + 1] = _mm256_unpackhi_epi32(a[r], a[r + 1])
    for r in range(0, 8, 4):  # u[r + g]: group g | g + 4 of rows r..r+3
        u[r] = _mm256_unpacklo_epi64(t[r], t[r + 2])
        u[r + 1] = _mm256_unpackhi_epi64(t[r], t[r + 2])
        u[r + 2] = _mm256_unpacklo_epi64(t[r + 1], t[r + 3])
        u[r + 3] = _mm256_unpackhi_epi64(t[r + 1], t[r + 3])
    for g in range(4):
        _mm256_storeu_si256(<__m256i*>(dst + 32 * g),
                            _mm256_xor_si256(_mm256_permute2x128_si256(u[g], u[4 + g], 0x20), fl))
        _mm256_storeu_si256(<__m256i*>(dst + 32 * (g + 4)),
                            _mm256_xor_si256(_mm256_permute2x128_si256(u[g], u[4 + g], 0x31), fl))


# transpose4: 4 groups (16 bytes) of each row -> dst[32g + 4r] for g < 4 (Q4_0's quants).
cdef inline void transpose4(const uint8_t* const* p, uint8_t* dst) noexcept nogil:
    cdef __m256i a[4]
    cdef __m256i t[4]
    cdef int k
    for k in range(4):  # rows k and k + 4 side by side
        a[k] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(<const __m128i*>p[k])),
                                       _mm_loadu_si128(<const __m128i*>p[k + 4]), 1)
    t[0] = _mm256_unpacklo_epi32(a[0], a[1])
    t[1] = _mm256_unpackhi_epi32(a[0], a[1])
    t[2] = _mm256_unpacklo_epi32(a[2], a[3])
    t[3] = _mm256_unpackhi_epi32(a[2], a[3])
    _mm256_storeu_si256(<__m256i*>dst, _mm256_unpacklo_epi64(t[0], t[2]))
    _mm256_storeu_si256(<__m256i*>(dst + 32), _mm256_unpackhi_epi64(t[0], t[2]))
    _mm256_storeu_si256(<__m256i*>(dst + 64), _mm256_unpacklo_epi64(t[1], t[3]))
    _mm256_storeu_si256(<__m256i*>(dst + 96), _mm256_unpackhi_epi64(t[1], t[3]))


# A block of zeros (of any type: 256 bytes) that stands in for the rows past a matrix's last in a partial
# tile: read, never written.
cdef uint8_t ZERO_ROW[256]


# Rows r0..r0+nrows (nrows <= 8) of a stored Q4_0 matrix (rows nb blocks apart) as nb tile records: what
# repack.pyx writes, rows past nrows all zero (their lanes are computed and dropped).
cdef void x8_gather(const block_q4_0* W, Py_ssize_t nb, int nrows, x8q4* rec) noexcept nogil:
    cdef Py_ssize_t b
    cdef int r
    cdef const uint8_t* p[8]
    cdef const block_q4_0* row[8]
    cdef Py_ssize_t step[8]
    cdef const block_q4_0* wb
    for r in range(8):  # the rows past nrows read one block of zeros throughout
        row[r] = W + r * nb if r < nrows else <const block_q4_0*>ZERO_ROW
        step[r] = 1 if r < nrows else 0
    for b in range(nb):
        for r in range(8):
            wb = row[r] + b * step[r]
            p[r] = wb.qs
            rec[b].d[r] = wb.d
        transpose4(p, <uint8_t*>rec[b].q)


# The seeds of the call's tokens, in this thread's scratch after `extra` bytes of the caller's; NULL if out
# of memory.
cdef int32_t* x8_scratch_seeds(const block_q8a* X, Py_ssize_t n, size_t extra, void** base) noexcept nogil:
    cdef size_t sb = (n * sizeof(int32_t) + 63) // 64 * 64
    cdef char* s = <char*>lc_scratch(extra + sb)
    if s == NULL:
        return NULL
    base[0] = s
    x8_seeds(X, n, <int32_t*>(s + extra))
    return <int32_t*>(s + extra)


# The product of rows (a multiple of 8) repacked as Q4_0 tiles (the LAYOUT_Q4_0_X8 slot of traits.pyx):
# up to TCH tokens tile by tile over all the tokens, the next tile's records requested while one is read;
# more, chunk by chunk of TCH tokens (the chunk's activations stay in L2). 0 if out of memory.
cdef int q4_0_x8_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                      float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef const x8q4* rec = <const x8q4*>W
    cdef const block_q8a* Xa = <const block_q8a*>X
    cdef Py_ssize_t nb = cols // 32, ntiles = rows // X8R, i, t0, t1
    cdef void* base
    cdef const char* pf
    if ntiles <= 0 or n_tok <= 0 or nb <= 0:
        return 1
    cdef int32_t* seeds = x8_scratch_seeds(Xa, n_tok * nb, 0, &base)
    if seeds == NULL:
        return 0
    if n_tok <= TCH:
        for i in range(ntiles):
            pf = <const char*>(rec + (i + 1) * nb) if i + 1 < ntiles else NULL
            x8_tokens_avx2(rec + i * nb, Xa, seeds, 0, n_tok, nb, Y + i * X8R, ldy, X8R, pf)
        return 1
    t0 = 0
    while t0 < n_tok:
        t1 = min(n_tok, t0 + TCH)
        for i in range(ntiles):
            x8_tokens_avx2(rec + i * nb, Xa, seeds, t0, t1, nb, Y + i * X8R, ldy, X8R, NULL)
        t0 = t1
    return 1


# The product of a stored Q4_0 matrix (any rows) in the same order: 8 rows at a time gathered into tile
# records in this thread's scratch (per chunk of TCH tokens when there are more), then q4_0_x8_avx2's
# tiles. The same numbers as the tiles, bit for bit. Out of memory for the scratch (a few KB per block
# column), it stops the process as matmul does for the tiles: an unwritten Y would be wrong numbers.
cdef void q4_0_rowlane_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                            float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef const block_q4_0* Wq = <const block_q4_0*>W
    cdef const block_q8a* Xa = <const block_q8a*>X
    cdef Py_ssize_t nb = cols // 32, r, t0, t1
    cdef size_t rec_bytes = (nb * sizeof(x8q4) + 63) // 64 * 64
    cdef void* base
    cdef int nrows
    if rows <= 0 or n_tok <= 0 or nb <= 0:
        return
    cdef int32_t* seeds = x8_scratch_seeds(Xa, n_tok * nb, rec_bytes, &base)
    if seeds == NULL:
        fprintf(stderr, b"llamacy: out of memory for a matrix product's scratch (%zd tokens)\n", n_tok)
        fflush(stderr)
        abort()
    cdef x8q4* rec = <x8q4*>base
    t0 = 0
    while t0 < n_tok:
        t1 = min(n_tok, t0 + TCH)
        r = 0
        while r < rows:
            nrows = <int>min(<Py_ssize_t>X8R, rows - r)
            x8_gather(Wq + r * nb, nb, nrows, rec)
            x8_tokens_avx2(rec, Xa, seeds, t0, t1, nb, Y + r, ldy, nrows, NULL)
            r += X8R
        t0 = t1


# =========================================================================================================
# Q8_0 likewise, in the legacy types' row-lane order (Q4_0's chain, no seed: the quants are signed). A Q8_0
# quant times a token quant does not fit maddubs unsigned (q + 128, as the tiles hold it for dpbusd, would
# saturate its int16 pairs), so each 4-value group takes the sign trick (|q| times the token quant with q's
# sign) and its own madd to int32: the pairs reach 2 x 128 x 127 = 32,512, exact.

# One 32-value block of 8 rows (repack.pyx's Q8_0 tile, matmul512_x8.pxi's x8rec_q8): d, the rows' fp16
# scales; q[g], row r's quants 4g..4g+3 at bytes 4r..4r+3, each plus 128 (as unsigned bytes).
ctypedef struct x8q8:
    uint16_t d[X8R]
    uint8_t q[8][32]


# One Q8_0 tile, as x8_tile_avx2 (no seeds).
cdef void x8q8_tile_avx2(const xtok* tag, const x8q8* rec, const block_q8a* y, Py_ssize_t nb, float* out,
                         Py_ssize_t ldo, int nrows, const char* pf) noexcept nogil:
    cdef int T = xtoks(tag)
    cdef __m256 acc[4]
    cdef __m256i is32[4]
    cdef __m256i flip = _mm256_set1_epi8(-128)
    cdef __m256i ones16 = _mm256_set1_epi16(1)
    cdef __m256i w, aw
    cdef __m256 dw
    cdef const uint8_t* xq
    cdef float res[X8R]
    cdef int t, g, r
    cdef Py_ssize_t b
    for t in range(T):
        acc[t] = _mm256_setzero_ps()
    for b in range(nb):
        if pf != NULL:
            lc_prefetch_span(pf + b * sizeof(x8q8), sizeof(x8q8))
        for t in range(T):
            is32[t] = _mm256_setzero_si256()
        for g in range(8):
            w = _mm256_xor_si256(_mm256_loadu_si256(<const __m256i*>rec[b].q[g]), flip)  # the signed quants
            aw = _mm256_sign_epi8(w, w)
            for t in range(T):
                xq = <const uint8_t*>y[t * nb + b].qs
                is32[t] = _mm256_add_epi32(is32[t], _mm256_madd_epi16(_mm256_maddubs_epi16(
                    aw, _mm256_sign_epi8(_mm256_set1_epi32(<int>load_u32(xq + 4 * g)), w)), ones16))
        dw = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>rec[b].d))
        for t in range(T):
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is32[t]), _mm256_mul_ps(dw, _mm256_set1_ps(y[t * nb + b].d)),
                                     acc[t])
    for t in range(T):
        if nrows == X8R:
            _mm256_storeu_ps(out + t * ldo, acc[t])
        else:
            _mm256_storeu_ps(res, acc[t])
            for r in range(nrows):
                out[t * ldo + r] = res[r]


# One Q8_0 tile against tokens [t0, t1), as x8_tokens_avx2.
cdef inline void x8q8_tokens_avx2(const x8q8* rec, const block_q8a* X, Py_ssize_t t0, Py_ssize_t t1,
                                  Py_ssize_t nb, float* Y, Py_ssize_t ldy, int nrows, const char* pf) noexcept nogil:
    cdef Py_ssize_t t = t0
    while t + 4 <= t1:
        x8q8_tile_avx2(<const xtok4*>NULL, rec, X + t * nb, nb, Y + t * ldy, ldy, nrows, pf)
        pf = NULL
        t += 4
    if t1 - t == 3:
        x8q8_tile_avx2(<const xtok3*>NULL, rec, X + t * nb, nb, Y + t * ldy, ldy, nrows, pf)
    elif t1 - t == 2:
        x8q8_tile_avx2(<const xtok2*>NULL, rec, X + t * nb, nb, Y + t * ldy, ldy, nrows, pf)
    elif t1 - t == 1:
        x8q8_tile_avx2(<const xtok1*>NULL, rec, X + t * nb, nb, Y + t * ldy, ldy, nrows, pf)


# Rows of a stored Q8_0 matrix (nrows <= 8) as nb tile records (repack.pyx's _pack_legacy with its flip), the
# rest zero: a zero scale, so their lanes come out 0 and are dropped.
cdef void x8q8_gather(const block_q8_0* W, Py_ssize_t nb, int nrows, x8q8* rec) noexcept nogil:
    cdef Py_ssize_t b
    cdef int r
    cdef const uint8_t* p[8]
    cdef const block_q8_0* row[8]
    cdef Py_ssize_t step[8]
    cdef const block_q8_0* wb
    for r in range(8):
        row[r] = W + r * nb if r < nrows else <const block_q8_0*>ZERO_ROW
        step[r] = 1 if r < nrows else 0
    for b in range(nb):
        for r in range(8):
            wb = row[r] + b * step[r]
            p[r] = <const uint8_t*>wb.qs
            rec[b].d[r] = wb.d
        transpose8(p, <uint8_t*>rec[b].q, 0x80808080u)


# The product of rows (a multiple of 8) repacked as Q8_0 tiles (the LAYOUT_Q8_0_X8 slot).
cdef int q8_0_x8_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                      float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef const x8q8* rec = <const x8q8*>W
    cdef const block_q8a* Xa = <const block_q8a*>X
    cdef Py_ssize_t nb = cols // 32, ntiles = rows // X8R, i, t0, t1
    cdef const char* pf
    if ntiles <= 0 or n_tok <= 0 or nb <= 0:
        return 1
    if n_tok <= TCH:
        for i in range(ntiles):
            pf = <const char*>(rec + (i + 1) * nb) if i + 1 < ntiles else NULL
            x8q8_tokens_avx2(rec + i * nb, Xa, 0, n_tok, nb, Y + i * X8R, ldy, X8R, pf)
        return 1
    t0 = 0
    while t0 < n_tok:
        t1 = min(n_tok, t0 + TCH)
        for i in range(ntiles):
            x8q8_tokens_avx2(rec + i * nb, Xa, t0, t1, nb, Y + i * X8R, ldy, X8R, NULL)
        t0 = t1
    return 1


# A stored Q8_0 matrix (any rows) in the same order, as q4_0_rowlane_avx2: the tiles' bits.
cdef void q8_0_rowlane_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                            float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef const block_q8_0* Wq = <const block_q8_0*>W
    cdef const block_q8a* Xa = <const block_q8a*>X
    cdef Py_ssize_t nb = cols // 32, r, t0, t1
    cdef int nrows
    if rows <= 0 or n_tok <= 0 or nb <= 0:
        return
    cdef x8q8* rec = <x8q8*>lc_scratch(nb * sizeof(x8q8))
    if rec == NULL:
        fprintf(stderr, b"llamacy: out of memory for a matrix product's scratch (%zd tokens)\n", n_tok)
        fflush(stderr)
        abort()
    t0 = 0
    while t0 < n_tok:
        t1 = min(n_tok, t0 + TCH)
        r = 0
        while r < rows:
            nrows = <int>min(<Py_ssize_t>X8R, rows - r)
            x8q8_gather(Wq + r * nb, nb, nrows, rec)
            x8q8_tokens_avx2(rec, Xa, t0, t1, nb, Y + r, ldy, nrows, NULL)
            r += X8R
        t0 = t1
