# Q4_K and Q6_K on AVX2 in the row-lane float order: 8 rows a tile, one float lane a row, as Q4_0's in
# mm_avx2_x8.pxi (whose reasons, tile shapes and scratch these share). Included by mm_avx2.pyx after it.


# =========================================================================================================
# Q4_K: the row-lane order of matmul512's K-quant kernels (matmul512_klanes.pxi, _kx8.pxi):
# per row and super-block, a = fma(float(isum), d_w * d_x, a) and m = fma(float(imin), dmin_w * d_x, m),
# Y = a - m; isum the exact sum over sub-blocks of scale x (quants . token quants), imin the exact sum of
# mins x the token's sub-block sums. Q8_K quants reach -128, so a sub-block's int16 lane (16 products of a
# nibble and a quant) is at most 16 x 15 x 128 = 30,720: exact. One madd against the row's scale in both
# halves of its lane then gives scale x the sub-block's sum in int32.

# One super-block of 8 rows (repack.pyx's Q4_K tile, matmul512_kx8.pxi's kx8rec): q[k][g], row r's stored
# qs bytes 32k+4g..32k+4g+3 at bytes 4r..4r+3 (low nibbles: sub-block 2k, high: 2k+1); sc[s][r] row r's
# 6-bit scale of sub-block s; mn[k][2r], mn[k][2r+1] its mins of sub-blocks 2k, 2k+1; d, dmin fp16.
ctypedef struct kx8q4:
    uint8_t q[4][8][32]
    uint8_t sc[8][X8R]
    uint8_t mn[4][2 * X8R]
    uint16_t d[X8R]
    uint16_t dmin[X8R]


# pairs[4 * i + k]: token super-block i's sums of the quants of sub-blocks 2k (low int16) and 2k + 1 (high);
# a sub-block's sum is two of Q8_K's 16-value bsums (|sum| <= 32 x 128).
cdef void kx8_pairs(const block_q8k* X, Py_ssize_t n, int32_t* pairs) noexcept nogil:
    cdef Py_ssize_t i
    cdef int k
    cdef int32_t lo, hi
    for i in range(n):
        for k in range(4):
            lo = X[i].bsums[4 * k] + X[i].bsums[4 * k + 1]
            hi = X[i].bsums[4 * k + 2] + X[i].bsums[4 * k + 3]
            pairs[4 * i + k] = <int32_t>((<uint32_t>(<uint16_t>lo)) | ((<uint32_t>(<uint16_t>hi)) << 16))


# One Q4_K tile: 8 rows of records rec x T tokens from y (nb super-blocks apart, their pairs beside them);
# out[t * ldo + r] for r < nrows; pf as x8_tile_avx2's.
cdef void kx8_tile_avx2(const xtok* tag, const kx8q4* rec, const block_q8k* y, const int32_t* pairs,
                        Py_ssize_t nb, float* out, Py_ssize_t ldo, int nrows, const char* pf) noexcept nogil:
    cdef int T = xtoks(tag)
    cdef __m256 fa[4]
    cdef __m256 fm[4]
    cdef __m256i ia[4]
    cdef __m256i wq[8]
    cdef __m256i m4 = _mm256_set1_epi8(0x0F)
    cdef __m128i sc8
    cdef __m256i p, s16, scp, im
    cdef __m256 dw, dm, dx
    cdef const kx8q4* k
    cdef const uint8_t* xq
    cdef const int32_t* pp
    cdef float res[X8R]
    cdef int t, g, j, half, r
    cdef Py_ssize_t b
    for t in range(T):
        fa[t] = _mm256_setzero_ps()
        fm[t] = _mm256_setzero_ps()
    for b in range(nb):
        k = rec + b
        if pf != NULL:
            lc_prefetch_span(pf + b * sizeof(kx8q4), sizeof(kx8q4))
        for t in range(T):
            ia[t] = _mm256_setzero_si256()
        for j in range(4):
            for half in range(2):  # sub-block 2j + half: the low nibbles of q[j], then the high ones
                for g in range(8):
                    p = _mm256_loadu_si256(<const __m256i*>k.q[j][g])
                    if half:
                        p = _mm256_srli_epi16(p, 4)
                    wq[g] = _mm256_and_si256(p, m4)
                # row r's scale in both int16 halves of lane r
                sc8 = _mm_loadl_epi64(<const __m128i*>k.sc[2 * j + half])
                scp = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc8, sc8))
                for t in range(T):
                    xq = <const uint8_t*>y[t * nb + b].qs + 64 * j + 32 * half
                    s16 = _mm256_maddubs_epi16(wq[0], _mm256_set1_epi32(<int>load_u32(xq)))
                    for g in range(1, 8):
                        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(
                            wq[g], _mm256_set1_epi32(<int>load_u32(xq + 4 * (g % 4) + 16 * (g // 4)))))
                    ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(s16, scp))
        dw = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>k.d))
        dm = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>k.dmin))
        for t in range(T):
            pp = pairs + 4 * (t * nb + b)
            im = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(<const __m128i*>k.mn[0])),
                                   _mm256_set1_epi32(pp[0]))
            for j in range(1, 4):
                im = _mm256_add_epi32(im, _mm256_madd_epi16(
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(<const __m128i*>k.mn[j])), _mm256_set1_epi32(pp[j])))
            dx = _mm256_set1_ps(y[t * nb + b].d)
            fa[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), _mm256_mul_ps(dw, dx), fa[t])
            fm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(dm, dx), fm[t])
    for t in range(T):
        if nrows == X8R:
            _mm256_storeu_ps(out + t * ldo, _mm256_sub_ps(fa[t], fm[t]))
        else:
            _mm256_storeu_ps(res, _mm256_sub_ps(fa[t], fm[t]))
            for r in range(nrows):
                out[t * ldo + r] = res[r]


# One Q4_K tile against tokens [t0, t1), as x8_tokens_avx2.
cdef inline void kx8_tokens_avx2(const kx8q4* rec, const block_q8k* X, const int32_t* pairs, Py_ssize_t t0,
                                 Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy, int nrows,
                                 const char* pf) noexcept nogil:
    cdef Py_ssize_t t = t0
    while t + 4 <= t1:
        kx8_tile_avx2(<const xtok4*>NULL, rec, X + t * nb, pairs + 4 * t * nb, nb, Y + t * ldy, ldy, nrows, pf)
        pf = NULL
        t += 4
    if t1 - t == 3:
        kx8_tile_avx2(<const xtok3*>NULL, rec, X + t * nb, pairs + 4 * t * nb, nb, Y + t * ldy, ldy, nrows, pf)
    elif t1 - t == 2:
        kx8_tile_avx2(<const xtok2*>NULL, rec, X + t * nb, pairs + 4 * t * nb, nb, Y + t * ldy, ldy, nrows, pf)
    elif t1 - t == 1:
        kx8_tile_avx2(<const xtok1*>NULL, rec, X + t * nb, pairs + 4 * t * nb, nb, Y + t * ldy, ldy, nrows, pf)


# Rows of a stored Q4_K matrix (nb super-blocks apart, nrows <= 8) as nb tile records (repack.pyx's
# _pack_q4_k), rows past nrows all zero.
cdef void kx8_gather(const block_q4_K* W, Py_ssize_t nb, int nrows, kx8q4* rec) noexcept nogil:
    cdef Py_ssize_t b
    cdef int r, s, kk
    cdef const uint8_t* p[8]
    cdef const block_q4_K* row[8]
    cdef Py_ssize_t step[8]
    cdef const block_q4_K* wb
    for r in range(8):  # the rows past nrows read one block of zeros throughout
        row[r] = W + r * nb if r < nrows else <const block_q4_K*>ZERO_ROW
        step[r] = 1 if r < nrows else 0
    for b in range(nb):
        for r in range(8):
            wb = row[r] + b * step[r]
            rec[b].d[r] = wb.d
            rec[b].dmin[r] = wb.dmin
            for s in range(8):
                scale_min_k4(s, wb.scales, &rec[b].sc[s][r], &rec[b].mn[s // 2][2 * r + s % 2])
        for kk in range(4):
            for r in range(8):
                p[r] = <const uint8_t*>(row[r] + b * step[r]).qs + 32 * kk
            transpose8(p, <uint8_t*>rec[b].q[kk], 0)


# The tokens' pairs (kx8_pairs) in this thread's scratch after `extra` bytes of the caller's; NULL if out of
# memory.
cdef int32_t* kx8_scratch_pairs(const block_q8k* X, Py_ssize_t n, size_t extra, void** base) noexcept nogil:
    cdef char* s = <char*>lc_scratch(extra + (4 * n * sizeof(int32_t) + 63) // 64 * 64)
    if s == NULL:
        return NULL
    base[0] = s
    kx8_pairs(X, n, <int32_t*>(s + extra))
    return <int32_t*>(s + extra)


# The product of rows (a multiple of 8) repacked as Q4_K tiles (the LAYOUT_Q4_K_X8 slot), as q4_0_x8_avx2.
cdef int q4_k_x8_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                      float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef const kx8q4* rec = <const kx8q4*>W
    cdef const block_q8k* Xk = <const block_q8k*>X
    cdef Py_ssize_t nb = cols // QK_K, ntiles = rows // X8R, i, t0, t1
    cdef void* base
    cdef const char* pf
    if ntiles <= 0 or n_tok <= 0 or nb <= 0:
        return 1
    cdef int32_t* pairs = kx8_scratch_pairs(Xk, n_tok * nb, 0, &base)
    if pairs == NULL:
        return 0
    if n_tok <= TCH:
        for i in range(ntiles):
            pf = <const char*>(rec + (i + 1) * nb) if i + 1 < ntiles else NULL
            kx8_tokens_avx2(rec + i * nb, Xk, pairs, 0, n_tok, nb, Y + i * X8R, ldy, X8R, pf)
        return 1
    t0 = 0
    while t0 < n_tok:
        t1 = min(n_tok, t0 + TCH)
        for i in range(ntiles):
            kx8_tokens_avx2(rec + i * nb, Xk, pairs, t0, t1, nb, Y + i * X8R, ldy, X8R, NULL)
        t0 = t1
    return 1


# A stored Q4_K matrix (any rows) in the same order, as q4_0_rowlane_avx2: the tiles' bits.
cdef void q4_k_rowlane_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                            float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef const block_q4_K* Wq = <const block_q4_K*>W
    cdef const block_q8k* Xk = <const block_q8k*>X
    cdef Py_ssize_t nb = cols // QK_K, r, t0, t1
    cdef size_t rec_bytes = (nb * sizeof(kx8q4) + 63) // 64 * 64
    cdef void* base
    cdef int nrows
    if rows <= 0 or n_tok <= 0 or nb <= 0:
        return
    cdef int32_t* pairs = kx8_scratch_pairs(Xk, n_tok * nb, rec_bytes, &base)
    if pairs == NULL:
        fprintf(stderr, b"llamacy: out of memory for a matrix product's scratch (%zd tokens)\n", n_tok)
        fflush(stderr)
        abort()
    cdef kx8q4* rec = <kx8q4*>base
    t0 = 0
    while t0 < n_tok:
        t1 = min(n_tok, t0 + TCH)
        r = 0
        while r < rows:
            nrows = <int>min(<Py_ssize_t>X8R, rows - r)
            kx8_gather(Wq + r * nb, nb, nrows, rec)
            kx8_tokens_avx2(rec, Xk, pairs, t0, t1, nb, Y + r, ldy, nrows, NULL)
            r += X8R
        t0 = t1


# =========================================================================================================
# Q6_K likewise, in matmul512's Q6_K row-lane order: per row and super-block, a = fma(float(isum - 32 imin),
# d_w * d_x, a), isum the exact sum over 16-value groups of scale x (unsigned 6-bit values . token quants),
# imin the exact sum of scales x the token's group sums (bsums). A maddubs pair of 6-bit values is at most
# 2 x 63 x 128 = 16,128, so two pairs add in int16 (32,256) and a madd against the group's scale in both
# halves of each lane takes them to int32.

# One super-block of 8 rows (repack.pyx's Q6_K tile, matmul512_kx8.pxi's kx8rec6): ql[k][g], qh[n][g] the
# rows' 4-byte groups side by side; sc[k][2r], sc[k][2r+1] row r's scales of groups 2k, 2k+1; d fp16.
ctypedef struct kx8q6:
    uint8_t ql[4][8][32]
    uint8_t qh[2][8][32]
    int8_t sc[8][2 * X8R]
    uint16_t d[X8R]


# One Q6_K tile, as kx8_tile_avx2 (no pairs: the token's bsums serve as they are).
cdef void kx86_tile_avx2(const xtok* tag, const kx8q6* rec, const block_q8k* y, Py_ssize_t nb, float* out,
                         Py_ssize_t ldo, int nrows, const char* pf) noexcept nogil:
    cdef int T = xtoks(tag)
    cdef __m256 fa[4]
    cdef __m256i ia[4]
    cdef __m256i im[4]
    cdef __m256i wq[8]
    cdef __m256i lo16 = _mm256_set1_epi32(0xFFFF)
    cdef __m256i P, slo, shi, s16
    cdef __m256 dw, dx
    cdef const kx8q6* k
    cdef const uint8_t* xq
    cdef float res[X8R]
    cdef int t, g, n, j, s, r
    cdef Py_ssize_t b
    for t in range(T):
        fa[t] = _mm256_setzero_ps()
    for b in range(nb):
        k = rec + b
        if pf != NULL:
            lc_prefetch_span(pf + b * sizeof(kx8q6), sizeof(kx8q6))
        for t in range(T):
            ia[t] = _mm256_setzero_si256()
            im[t] = _mm256_setzero_si256()
        for n in range(2):
            for j in range(4):
                s = 4 * n + j  # the sub-block: groups 2s (values 4g.. of wq[g], g < 4) and 2s + 1 (g >= 4)
                for g in range(8):
                    wq[g] = k6_values(_mm256_loadu_si256(<const __m256i*>k.ql[2 * n][g]),
                                      _mm256_loadu_si256(<const __m256i*>k.ql[2 * n + 1][g]),
                                      _mm256_loadu_si256(<const __m256i*>k.qh[n][g]), j)
                # lane r: the int16 pair (sc_2s, sc_2s+1); slo, shi: (sc_2s, sc_2s), (sc_2s+1, sc_2s+1)
                P = _mm256_cvtepi8_epi16(_mm_loadu_si128(<const __m128i*>k.sc[s]))
                slo = _mm256_or_si256(_mm256_and_si256(P, lo16), _mm256_slli_epi32(P, 16))
                shi = _mm256_or_si256(_mm256_and_si256(_mm256_srai_epi32(P, 16), lo16),
                                      _mm256_andnot_si256(lo16, P))
                for t in range(T):
                    xq = <const uint8_t*>y[t * nb + b].qs + 32 * s
                    s16 = _mm256_add_epi16(_mm256_maddubs_epi16(wq[0], _mm256_set1_epi32(<int>load_u32(xq))),
                                           _mm256_maddubs_epi16(wq[1], _mm256_set1_epi32(<int>load_u32(xq + 4))))
                    ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(s16, slo))
                    s16 = _mm256_add_epi16(_mm256_maddubs_epi16(wq[2], _mm256_set1_epi32(<int>load_u32(xq + 8))),
                                           _mm256_maddubs_epi16(wq[3], _mm256_set1_epi32(<int>load_u32(xq + 12))))
                    ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(s16, slo))
                    s16 = _mm256_add_epi16(_mm256_maddubs_epi16(wq[4], _mm256_set1_epi32(<int>load_u32(xq + 16))),
                                           _mm256_maddubs_epi16(wq[5], _mm256_set1_epi32(<int>load_u32(xq + 20))))
                    ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(s16, shi))
                    s16 = _mm256_add_epi16(_mm256_maddubs_epi16(wq[6], _mm256_set1_epi32(<int>load_u32(xq + 24))),
                                           _mm256_maddubs_epi16(wq[7], _mm256_set1_epi32(<int>load_u32(xq + 28))))
                    ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(s16, shi))
                    im[t] = _mm256_add_epi32(im[t], _mm256_madd_epi16(
                        P, _mm256_set1_epi32((<const int32_t*>y[t * nb + b].bsums)[s])))
        dw = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>k.d))
        for t in range(T):
            dx = _mm256_set1_ps(y[t * nb + b].d)
            fa[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(ia[t], _mm256_slli_epi32(im[t], 5))),
                                    _mm256_mul_ps(dw, dx), fa[t])
    for t in range(T):
        if nrows == X8R:
            _mm256_storeu_ps(out + t * ldo, fa[t])
        else:
            _mm256_storeu_ps(res, fa[t])
            for r in range(nrows):
                out[t * ldo + r] = res[r]


# One Q6_K tile against tokens [t0, t1), as x8_tokens_avx2.
cdef inline void kx86_tokens_avx2(const kx8q6* rec, const block_q8k* X, Py_ssize_t t0, Py_ssize_t t1,
                                  Py_ssize_t nb, float* Y, Py_ssize_t ldy, int nrows, const char* pf) noexcept nogil:
    cdef Py_ssize_t t = t0
    while t + 4 <= t1:
        kx86_tile_avx2(<const xtok4*>NULL, rec, X + t * nb, nb, Y + t * ldy, ldy, nrows, pf)
        pf = NULL
        t += 4
    if t1 - t == 3:
        kx86_tile_avx2(<const xtok3*>NULL, rec, X + t * nb, nb, Y + t * ldy, ldy, nrows, pf)
    elif t1 - t == 2:
        kx86_tile_avx2(<const xtok2*>NULL, rec, X + t * nb, nb, Y + t * ldy, ldy, nrows, pf)
    elif t1 - t == 1:
        kx86_tile_avx2(<const xtok1*>NULL, rec, X + t * nb, nb, Y + t * ldy, ldy, nrows, pf)


# Rows of a stored Q6_K matrix (nrows <= 8) as nb tile records (repack.pyx's _pack_q6_k), the rest zero.
cdef void kx86_gather(const block_q6_K* W, Py_ssize_t nb, int nrows, kx8q6* rec) noexcept nogil:
    cdef Py_ssize_t b
    cdef int r, kk
    cdef const uint8_t* p[8]
    cdef const block_q6_K* row[8]
    cdef Py_ssize_t step[8]
    cdef const block_q6_K* wb
    for r in range(8):
        row[r] = W + r * nb if r < nrows else <const block_q6_K*>ZERO_ROW
        step[r] = 1 if r < nrows else 0
    for b in range(nb):
        for r in range(8):
            wb = row[r] + b * step[r]
            for kk in range(8):
                memcpy(&rec[b].sc[kk][2 * r], &wb.scales[2 * kk], 2)
            rec[b].d[r] = wb.d
        for kk in range(4):
            for r in range(8):
                p[r] = <const uint8_t*>(row[r] + b * step[r]).ql + 32 * kk
            transpose8(p, <uint8_t*>rec[b].ql[kk], 0)
        for kk in range(2):
            for r in range(8):
                p[r] = <const uint8_t*>(row[r] + b * step[r]).qh + 32 * kk
            transpose8(p, <uint8_t*>rec[b].qh[kk], 0)


# The product of rows (a multiple of 8) repacked as Q6_K tiles (the LAYOUT_Q6_K_X8 slot).
cdef int q6_k_x8_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                      float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef const kx8q6* rec = <const kx8q6*>W
    cdef const block_q8k* Xk = <const block_q8k*>X
    cdef Py_ssize_t nb = cols // QK_K, ntiles = rows // X8R, i, t0, t1
    cdef const char* pf
    if ntiles <= 0 or n_tok <= 0 or nb <= 0:
        return 1
    if n_tok <= TCH:
        for i in range(ntiles):
            pf = <const char*>(rec + (i + 1) * nb) if i + 1 < ntiles else NULL
            kx86_tokens_avx2(rec + i * nb, Xk, 0, n_tok, nb, Y + i * X8R, ldy, X8R, pf)
        return 1
    t0 = 0
    while t0 < n_tok:
        t1 = min(n_tok, t0 + TCH)
        for i in range(ntiles):
            kx86_tokens_avx2(rec + i * nb, Xk, t0, t1, nb, Y + i * X8R, ldy, X8R, NULL)
        t0 = t1
    return 1


# A stored Q6_K matrix (any rows) in the same order, as q4_0_rowlane_avx2: the tiles' bits.
cdef void q6_k_rowlane_avx2(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                            float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef const block_q6_K* Wq = <const block_q6_K*>W
    cdef const block_q8k* Xk = <const block_q8k*>X
    cdef Py_ssize_t nb = cols // QK_K, r, t0, t1
    cdef int nrows
    if rows <= 0 or n_tok <= 0 or nb <= 0:
        return
    cdef kx8q6* rec = <kx8q6*>lc_scratch(nb * sizeof(kx8q6))
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
            kx86_gather(Wq + r * nb, nb, nrows, rec)
            kx86_tokens_avx2(rec, Xk, t0, t1, nb, Y + r, ldy, nrows, NULL)
            r += X8R
        t0 = t1
