# Q4_K, Q5_K and Q6_K weights repacked once, at load, into 8-row tiles (kernels/repack.pyx writes them,
# model/repack.py decides which): the VNNI products that read them. Included by matmul512.pyx after
# matmul512_x8.pxi (the legacy types' tiles, whose reasons and prefetch scheme these share), with the
# K-quants' row-lane helpers of matmul512_klanes.pxi.
#
# Float order: klanes_tile's two chains (Q6_K: one), so a repacked matrix gives the very bits of the same
# matrix as stored, on every path and thread count (tests/test_repack.py).


# One super-block of 8 rows: q[k][g], 32 bytes, row r's stored qs bytes 32k+4g..32k+4g+3 at bytes
# 4r..4r+3: the low nibbles are what dpbusd step g takes for sub-block 2k (values 64k+4g..), the high ones
# for sub-block 2k+1 (values 64k+32+4g..); sc[j][r] row r's 6-bit scale of sub-block j; mn[k][2r],
# mn[k][2r+1] its mins of sub-blocks 2k and 2k+1 (widened to int16 they are the pairs dpwssd takes against
# ktoken_pairs); d, dmin the rows' fp16 super-block scales. 1184 bytes: 148 a row.
ctypedef struct kx8rec:
    uint8_t q[4][8][32]
    uint8_t sc[8][LR]
    uint8_t mn[4][2 * LR]
    uint16_t d[LR]
    uint16_t dmin[LR]


# Q6_K's super-block of 8 rows: ql[k][g], 32 bytes, row r's stored ql bytes 32k+4g..32k+4g+3 at bytes
# 4r..4r+3 (for half n = k // 2: low nibbles of values 128n+4g.. (k even) or 128n+32+4g.. (k odd), high
# nibbles those 64 further); qh[n][g] row r's qh bytes 32n+4g..32n+4g+3, whose bit pairs 0-1, 2-3, 4-5, 6-7
# complete values 128n+4g.., +32, +64, +96 (k6_values' formulas); sc[k][2r], sc[k][2r+1] row r's int8
# scales of groups 2k and 2k+1 (widened to int16 they are the pairs dpwssd takes against the token's bsums);
# d the rows' fp16 scales. 1680 bytes: 210 a row, the stored size.
ctypedef struct kx8rec6:
    uint8_t ql[4][8][32]
    uint8_t qh[2][8][32]
    int8_t sc[8][2 * LR]
    uint16_t d[LR]


# Q5_K's super-block of 8 rows: kx8rec's fields (Q5_K has Q4_K's scales, mins and nibbles), then the fifth
# bits as byte masks: bit 4r+i of h[k][0][g] is row r's fifth bit of the value whose low bits wl[g] holds in
# byte 4r+i for sub-block 2k (bit 2k of the row's qh byte 4g+i), h[k][1][g] the same for wh[g] and
# sub-block 2k+1 (bit 2k+1). 1440 bytes: 180 a row (the stored 176 plus Q4_K's 4 of unpacked scales).
ctypedef struct kx8rec5:
    uint8_t q[4][8][32]
    uint8_t sc[8][LR]
    uint8_t mn[4][2 * LR]
    uint16_t d[LR]
    uint16_t dmin[LR]
    uint32_t h[4][2][8]


ctypedef fused kx8any:
    kx8rec
    kx8rec6
    kx8rec5


# Q4_K's and Q5_K's tiles (one kernel: Q5_K's nibbles take their fifth bits first).
ctypedef fused kx8q45:
    kx8rec
    kx8rec5


# Sub-blocks 2j and 2j + 1 of a Q4_K or Q5_K tile's super-block as dpbusd's unsigned operands: wl[g] the
# low nibbles of q[j][g], wh[g] the high ones, Q5_K's given their fifth bits.
cdef inline void kx8_quants(const kx8q45* k, int j, __m256i* wl, __m256i* wh) noexcept nogil:
    cdef __m256i m4 = _mm256_set1_epi8(0x0F)
    cdef __m256i c16 = _mm256_set1_epi8(0x10)
    cdef __m256i p
    cdef int g
    for g in range(8):
        p = _mm256_loadu_si256(<const __m256i*>k.q[j][g])
        wl[g] = _mm256_and_si256(p, m4)
        wh[g] = _mm256_and_si256(_mm256_srli_epi16(p, 4), m4)
        if kx8q45 is kx8rec5:
            wl[g] = _mm256_mask_add_epi8(wl[g], k.h[j][0][g], wl[g], c16)
            wh[g] = _mm256_mask_add_epi8(wh[g], k.h[j][1][g], wh[g], c16)


# One tile of the 8 rows of records rec x T tokens from y (nb super-blocks apart; pairs: their
# ktoken_pairs); out[t * ldo + r]. The integer sums are klanes_tile's (exact), so are the two chains.
cdef void kx8_tile(const tshape* shape, const kx8q45* rec, const block_q8k* y, const int32_t* pairs,
                   Py_ssize_t nb, float* out, Py_ssize_t ldo, const char* pf) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef __m256 fa[MAXT]
    cdef __m256 fm[MAXT]
    cdef __m256i ia[MAXT]
    cdef __m256i wl[8]
    cdef __m256i wh[8]
    cdef __m256i lo, hi, lo2, hi2, scl, sch, im
    cdef __m256i zero = _mm256_setzero_si256()
    cdef __m256 dw, dm, dx
    cdef const kx8q45* k
    cdef const uint8_t* xq
    cdef const int32_t* pp
    cdef float res[LR]
    cdef int r, t, g, j
    cdef Py_ssize_t b
    cdef Py_ssize_t ahead = pf_rec_ahead  # a local: the global would be read again at every block
    cdef Py_ssize_t page = pf_page_ahead
    for t in range(T):
        fa[t] = _mm256_setzero_ps()
        fm[t] = _mm256_setzero_ps()
    for b in range(nb):
        k = rec + b
        if pf != NULL:
            if ahead == 0:
                lc_prefetch_span(pf + b * sizeof(kx8q45), sizeof(kx8q45))
            else:
                lc_prefetch_span(<const char*>(rec + b) + ahead, sizeof(kx8q45))
                if page:
                    lc_prefetch_l2(<const char*>(rec + b) + ahead + page)
        for t in range(T):
            ia[t] = zero
        for j in range(4):  # sub-blocks 2j and 2j + 1
            kx8_quants(k, j, wl, wh)
            scl = _mm256_cvtepu8_epi32(_mm_loadl_epi64(<const __m128i*>k.sc[2 * j]))
            sch = _mm256_cvtepu8_epi32(_mm_loadl_epi64(<const __m128i*>k.sc[2 * j + 1]))
            for t in range(T):
                xq = <const uint8_t*>(y + t * nb + b).qs + 64 * j
                lo = _mm256_dpbusd_epi32(zero, wl[0], _mm256_set1_epi32(<int>load_u32(xq)))
                hi = _mm256_dpbusd_epi32(zero, wl[4], _mm256_set1_epi32(<int>load_u32(xq + 16)))
                lo2 = _mm256_dpbusd_epi32(zero, wh[0], _mm256_set1_epi32(<int>load_u32(xq + 32)))
                hi2 = _mm256_dpbusd_epi32(zero, wh[4], _mm256_set1_epi32(<int>load_u32(xq + 48)))
                for g in range(1, 4):
                    lo = _mm256_dpbusd_epi32(lo, wl[g], _mm256_set1_epi32(<int>load_u32(xq + 4 * g)))
                    hi = _mm256_dpbusd_epi32(hi, wl[g + 4], _mm256_set1_epi32(<int>load_u32(xq + 16 + 4 * g)))
                    lo2 = _mm256_dpbusd_epi32(lo2, wh[g], _mm256_set1_epi32(<int>load_u32(xq + 32 + 4 * g)))
                    hi2 = _mm256_dpbusd_epi32(hi2, wh[g + 4], _mm256_set1_epi32(<int>load_u32(xq + 48 + 4 * g)))
                ia[t] = _mm256_add_epi32(ia[t], _mm256_add_epi32(
                    _mm256_mullo_epi32(_mm256_add_epi32(lo, hi), scl),
                    _mm256_mullo_epi32(_mm256_add_epi32(lo2, hi2), sch)))
        dw = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>k.d))
        dm = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>k.dmin))
        for t in range(T):
            pp = pairs + 4 * (t * nb + b)
            im = zero
            for j in range(4):
                im = _mm256_dpwssd_epi32(im, _mm256_cvtepu8_epi16(_mm_loadu_si128(<const __m128i*>k.mn[j])),
                                         _mm256_set1_epi32(pp[j]))
            dx = _mm256_set1_ps((y + t * nb + b).d)
            fa[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), _mm256_mul_ps(dw, dx), fa[t])
            fm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(dm, dx), fm[t])
    for t in range(T):
        _mm256_storeu_ps(res, _mm256_sub_ps(fa[t], fm[t]))
        for r in range(LR):
            out[t * ldo + r] = res[r]


# Q6_K's 8 value vectors of sub-block 4n + j (values 4g..4g+3 of its 32 for g < 8, 8 rows each) from record k.
cdef inline void kx86_values(const kx8rec6* k, int n, int j, __m256i* wq) noexcept nogil:
    cdef int g
    for g in range(8):
        wq[g] = k6_values(_mm256_loadu_si256(<const __m256i*>k.ql[2 * n][g]),
                          _mm256_loadu_si256(<const __m256i*>k.ql[2 * n + 1][g]),
                          _mm256_loadu_si256(<const __m256i*>k.qh[n][g]), j)


# kx86_tile's step for sub-block s (groups 2s, 2s + 1) of super-block b, its 8 value vectors in wq: the
# tokens' exact integer sums into ia (scaled) and im (the scales against the token's bsums, for the -32).
cdef inline void kx86_sub(const __m256i* wq, const kx8rec6* k, int s, const block_q8k* y, Py_ssize_t b,
                          Py_ssize_t nb, int T, __m256i* ia, __m256i* im) noexcept nogil:
    cdef __m256i zero = _mm256_setzero_si256()
    cdef __m256i P = _mm256_cvtepi8_epi16(_mm_loadu_si128(<const __m128i*>k.sc[s]))  # lane r: (sc_2s, sc_2s+1)
    cdef __m256i slo = _mm256_srai_epi32(_mm256_slli_epi32(P, 16), 16)
    cdef __m256i shi = _mm256_srai_epi32(P, 16)
    cdef __m256i lo, hi
    cdef const uint8_t* xq
    cdef int t, g
    for t in range(T):
        xq = <const uint8_t*>(y + t * nb + b).qs + 32 * s
        lo = _mm256_dpbusd_epi32(zero, wq[0], _mm256_set1_epi32(<int>load_u32(xq)))
        hi = _mm256_dpbusd_epi32(zero, wq[4], _mm256_set1_epi32(<int>load_u32(xq + 16)))
        for g in range(1, 4):
            lo = _mm256_dpbusd_epi32(lo, wq[g], _mm256_set1_epi32(<int>load_u32(xq + 4 * g)))
            hi = _mm256_dpbusd_epi32(hi, wq[g + 4], _mm256_set1_epi32(<int>load_u32(xq + 16 + 4 * g)))
        ia[t] = _mm256_add_epi32(ia[t], _mm256_add_epi32(_mm256_mullo_epi32(lo, slo), _mm256_mullo_epi32(hi, shi)))
        im[t] = _mm256_dpwssd_epi32(im[t], P, _mm256_set1_epi32((<const int32_t*>(y + t * nb + b).bsums)[s]))


# The Q6_K tile of kx8_tile: out[t * ldo + r] for 8 rows x T tokens; pf as kx8_tile's. klanes_tile's chain
# (one FMA of float(isum - 32 * sum_g sc_g * bsum_g) by d_w * d_x per super-block), its integers formed from
# the 6-bit values unpacked here (k6_values) instead of read from an expanded record. The four sub-blocks
# of a half are spelled out so that each k6_values is one branch-free formula.
cdef void kx86_tile(const tshape* shape, const kx8rec6* rec, const block_q8k* y, Py_ssize_t nb, float* out,
                    Py_ssize_t ldo, const char* pf) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef __m256 fa[MAXT]
    cdef __m256i ia[MAXT]
    cdef __m256i im[MAXT]
    cdef __m256i wq[8]
    cdef __m256i zero = _mm256_setzero_si256()
    cdef __m256 dw, dx
    cdef const kx8rec6* k
    cdef float res[LR]
    cdef int r, t, n
    cdef Py_ssize_t b
    cdef Py_ssize_t ahead = pf_rec_ahead  # a local: the global would be read again at every block
    cdef Py_ssize_t page = pf_page_ahead
    for t in range(T):
        fa[t] = _mm256_setzero_ps()
    for b in range(nb):
        k = rec + b
        if pf != NULL:
            if ahead == 0:
                lc_prefetch_span(pf + b * sizeof(kx8rec6), sizeof(kx8rec6))
            else:
                lc_prefetch_span(<const char*>(rec + b) + ahead, sizeof(kx8rec6))
                if page:
                    lc_prefetch_l2(<const char*>(rec + b) + ahead + page)
        for t in range(T):
            ia[t] = zero
            im[t] = zero
        for n in range(2):
            kx86_values(k, n, 0, wq)
            kx86_sub(wq, k, 4 * n, y, b, nb, T, ia, im)
            kx86_values(k, n, 1, wq)
            kx86_sub(wq, k, 4 * n + 1, y, b, nb, T, ia, im)
            kx86_values(k, n, 2, wq)
            kx86_sub(wq, k, 4 * n + 2, y, b, nb, T, ia, im)
            kx86_values(k, n, 3, wq)
            kx86_sub(wq, k, 4 * n + 3, y, b, nb, T, ia, im)
        dw = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>k.d))
        for t in range(T):
            dx = _mm256_set1_ps((y + t * nb + b).d)
            fa[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(ia[t], _mm256_slli_epi32(im[t], 5))),
                                    _mm256_mul_ps(dw, dx), fa[t])
    for t in range(T):
        _mm256_storeu_ps(res, fa[t])
        for r in range(LR):
            out[t * ldo + r] = res[r]


# One token tile of Q4_K or Q5_K (kx8_tile) or Q6_K (kx86_tile, which has no pairs) records.
cdef inline void kx8_run(const tshape* shape, const kx8any* rec, const block_q8k* y, const int32_t* pairs,
                         Py_ssize_t nb, float* out, Py_ssize_t ldo, const char* pf) noexcept nogil:
    if kx8any is kx8rec or kx8any is kx8rec5:
        kx8_tile(shape, rec, y, pairs, nb, out, ldo, pf)
    else:
        kx86_tile(shape, rec, y, nb, out, ldo, pf)


# Tile rec (output rows from r0) against tokens [t0, t1): tiles of 4 tokens, then one of the 1-3 left.
cdef inline void kx8_tokens(const kx8any* rec, const block_q8k* X, const int32_t* pairs, Py_ssize_t t0,
                            Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy, Py_ssize_t r0,
                            const char* pf) noexcept nogil:
    cdef Py_ssize_t t = t0
    while t + 4 <= t1:
        kx8_run(<const tok4*>NULL, rec, X + t * nb, pairs + 4 * t * nb, nb, Y + t * ldy + r0, ldy, pf)
        pf = NULL
        t += 4
    if t1 - t == 3:
        kx8_run(<const tok3*>NULL, rec, X + t * nb, pairs + 4 * t * nb, nb, Y + t * ldy + r0, ldy, pf)
    elif t1 - t == 2:
        kx8_run(<const tok2*>NULL, rec, X + t * nb, pairs + 4 * t * nb, nb, Y + t * ldy + r0, ldy, pf)
    elif t1 - t == 1:
        kx8_run(<const tok1*>NULL, rec, X + t * nb, pairs + 4 * t * nb, nb, Y + t * ldy + r0, ldy, pf)


# Tiles rec[0..ntiles) (nb records each) into the prefill tile's records dst (klanerec, nb per tile): the
# nibbles split (Q6_K: with their high bits), scales widened, min (Q6_K: scale) pairs made, d and dmin
# converted. The same numbers repack_klanes makes from the stored rows, for a fraction of its work (no
# transpose, no 6-bit scale unpacking).
cdef void kx8_expand(const kx8any* rec, Py_ssize_t ntiles, Py_ssize_t nb, klanerec* dst) noexcept nogil:
    cdef __m256i wl[8]
    cdef __m256i wh[8]
    cdef __m256i a, c, h, P
    cdef const kx8any* k
    cdef klanerec* o
    cdef Py_ssize_t i
    cdef int j, g, n
    for i in range(ntiles * nb):
        k = rec + i
        o = dst + i
        if kx8any is kx8rec or kx8any is kx8rec5:
            for j in range(4):
                kx8_quants(k, j, wl, wh)
                for g in range(8):
                    _mm256_storeu_si256(<__m256i*>o.u[16 * j + g], wl[g])
                    _mm256_storeu_si256(<__m256i*>o.u[16 * j + 8 + g], wh[g])
            for j in range(8):
                _mm256_storeu_si256(<__m256i*>o.sc[j], _mm256_cvtepu8_epi32(_mm_loadl_epi64(<const __m128i*>k.sc[j])))
            for j in range(4):
                _mm256_storeu_si256(<__m256i*>o.pr[j], _mm256_cvtepu8_epi16(_mm_loadu_si128(<const __m128i*>k.mn[j])))
            _mm256_storeu_ps(o.d, _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>k.d)))
            _mm256_storeu_ps(o.dmin, _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>k.dmin)))
        else:
            for n in range(2):
                for g in range(8):
                    a = _mm256_loadu_si256(<const __m256i*>k.ql[2 * n][g])
                    c = _mm256_loadu_si256(<const __m256i*>k.ql[2 * n + 1][g])
                    h = _mm256_loadu_si256(<const __m256i*>k.qh[n][g])
                    for j in range(4):
                        _mm256_storeu_si256(<__m256i*>o.u[32 * n + 8 * j + g], k6_values(a, c, h, j))
            for j in range(8):
                P = _mm256_cvtepi8_epi16(_mm_loadu_si128(<const __m128i*>k.sc[j]))
                _mm256_storeu_si256(<__m256i*>o.pr[j], P)
                _mm256_storeu_si256(<__m256i*>o.sc[2 * j], _mm256_srai_epi32(_mm256_slli_epi32(P, 16), 16))
                _mm256_storeu_si256(<__m256i*>o.sc[2 * j + 1], _mm256_srai_epi32(P, 16))
            _mm256_storeu_ps(o.d, _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>k.d)))
            _mm256_storeu_ps(o.dmin, _mm256_setzero_ps())


# The product of rows (a multiple of LR) repacked as kx8rec (Q4_K), kx8rec5 (Q5_K) or kx8rec6 (Q6_K) tiles.
# Up to TCH tokens, straight from the tiles as mm512_q4_0_x8 does; more (a prompt), work items of up to
# GROUP_BYTES of expanded records (kx8_expand), each against every token chunk by klanes_tile, as the stored rows' prefill
# runs: with hundreds of tokens, splitting nibbles and widening scales once per work item beats doing it in
# every 4-token tile (llama-3.2-1b pp512: 0.89-0.95x the stored rows' speed when done per tile). Q4_K's
# tokens' pairs of sub-block sums (and the expanded records) live in scratch memory; where none can be had
# the call returns 0 and matmul aborts with one line (no other kernel reads these tiles).
cdef int kx8_product(const kx8any* rec, Py_ssize_t rows, Py_ssize_t cols, const block_q8k* X, Py_ssize_t n_tok,
                     float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t nb = cols // QK_K, ntiles = rows // LR, i, t0, t1, per, g0, ng, pairs_bytes = 0
    cdef int32_t* pairs
    cdef klanerec* buf
    cdef const char* pf
    cdef Py_ssize_t done
    cdef const block_q4_K* q4_k = NULL
    cdef const block_q5_K* q5_k = NULL
    cdef const block_q6_K* q6_k = NULL
    if ntiles <= 0 or n_tok <= 0 or nb <= 0:
        return 1
    if amx_on and n_tok >= AMX_TOK:  # the tile unit takes the pairs of tiles (matmul512_amx.pxi)
        done = amx_kx8(rec, rows, nb, X, n_tok, Y, ldy)
        if done == rows:
            return 1
        rec += done // LR * nb
        rows -= done
        ntiles = rows // LR
        Y += done
    if kx8any is kx8rec or kx8any is kx8rec5:  # Q6_K's dpwssd takes the token's bsums as they are
        pairs_bytes = (4 * n_tok * nb * <Py_ssize_t>sizeof(int32_t) + 63) // 64 * 64
    per = max(1, min(GROUP_BYTES // (nb * <Py_ssize_t>sizeof(klanerec)), GR // LR))  # tiles per work item
    # + 64: Q6_K's decode needs no scratch, but lc_scratch(0) is NULL in a thread that has none yet
    pairs = <int32_t*>lc_scratch(pairs_bytes + (per * nb * sizeof(klanerec) if n_tok > TCH else 0) + 64)
    if pairs == NULL:
        return 0
    if kx8any is kx8rec or kx8any is kx8rec5:
        ktoken_pairs(X, n_tok * nb, pairs)
    if n_tok <= TCH:
        for i in range(ntiles):
            pf = <const char*>(rec + (i + 1) * nb) if i + 1 < ntiles or pf_rec_ahead else NULL
            kx8_tokens(rec + i * nb, X, pairs, 0, n_tok, nb, Y, ldy, i * LR, pf)
        return 1
    buf = <klanerec*>(<char*>pairs + pairs_bytes)
    g0 = 0
    while g0 < ntiles:
        ng = min(per, ntiles - g0)
        kx8_expand(rec + g0 * nb, ng, nb, buf)
        t0 = 0
        while t0 < n_tok:
            t1 = min(n_tok, t0 + TCH)
            i = 0
            if pairs_on:
                while i + 2 <= ng:
                    if kx8any is kx8rec:
                        klanes_pair(q4_k, buf + i * nb, X, pairs, t0, t1, nb, Y + (g0 + i) * LR, ldy)
                    elif kx8any is kx8rec5:
                        klanes_pair(q5_k, buf + i * nb, X, pairs, t0, t1, nb, Y + (g0 + i) * LR, ldy)
                    else:
                        klanes_pair(q6_k, buf + i * nb, X, pairs, t0, t1, nb, Y + (g0 + i) * LR, ldy)
                    i += 2
            while i < ng:
                if kx8any is kx8rec:
                    klanes_tokens(q4_k, buf + i * nb, X, pairs, t0, t1, nb, Y, ldy, (g0 + i) * LR, LR)
                elif kx8any is kx8rec5:
                    klanes_tokens(q5_k, buf + i * nb, X, pairs, t0, t1, nb, Y, ldy, (g0 + i) * LR, LR)
                else:
                    klanes_tokens(q6_k, buf + i * nb, X, pairs, t0, t1, nb, Y, ldy, (g0 + i) * LR, LR)
                i += 1
            t0 = t1
        g0 += ng
    return 1


cdef int mm512_q4_k_x8(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                       float* Y, Py_ssize_t ldy) noexcept nogil:
    return kx8_product(<const kx8rec*>W, rows, cols, <const block_q8k*>X, n_tok, Y, ldy)


cdef int mm512_q5_k_x8(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                       float* Y, Py_ssize_t ldy) noexcept nogil:
    return kx8_product(<const kx8rec5*>W, rows, cols, <const block_q8k*>X, n_tok, Y, ldy)


cdef int mm512_q6_k_x8(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                       float* Y, Py_ssize_t ldy) noexcept nogil:
    return kx8_product(<const kx8rec6*>W, rows, cols, <const block_q8k*>X, n_tok, Y, ldy)
