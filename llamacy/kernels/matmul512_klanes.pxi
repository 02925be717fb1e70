# The AVX-512 VNNI kernels of Q4_K and Q6_K in the row-lane float order: repacking, prefill, decode and
# few-token tiles, and their drivers. Included by matmul512.pyx (compiled with its AVX-512 flags), whose
# types, constants and helpers (ntoks, transpose_groups, rows8_sums) it uses.
#
# Float order (issue #29's new order). Per (row, token), super-block by super-block:
#   Q4_K: a = fma(float(isum), d_w * d_x, a)      isum = sum_j sc_j * sum_{i in sub-block j} u_i q_i
#         m = fma(float(imin), dmin_w * d_x, m)   imin = sum_j min_j * (sum of the token's quants in j)
#         Y = a - m. This is the order of llama.cpp's repacked Q4_K kernels, which it runs on every AVX2 CPU
#         (checked bit for bit against its ggml_gemv_q4_K_8x8_q8_K, same inputs: BENCHMARKS.md).
#   Q6_K: a = fma(float(isum), d_w * d_x, a)      isum = sum_g sc_g * sum_{i in group g} (u_i - 32) q_i
#         Y = a (one chain: Q6_K has no separate min).
# The integer sums are exact (int32), so how a kernel forms them (which lanes, which instructions) changes
# nothing: decode, few tokens, prefill and every thread count give the same bits. A row's running sums are
# one float lane each, so 8 rows advance with one conversion and one FMA per token and super-block for each
# chain, where the per-lane order (matmul512_kquant.pxi, still that of Q2_K, Q3_K, Q5_K) spends them per row.
#
# Prefill (repacked): dpbusd step s takes values 4s..4s+3 of 8 rows against 4 of the token's quants
# broadcast from memory, so each row's exact sum is one int32 lane; one vpmulld per 32 (Q4_K) or 16 (Q6_K)
# values applies the 8 rows' scales. Per 8 rows, token and super-block: 64 dpbusd + 8 (16) vpmulld, where
# the per-lane tile spends a maddubs and a dpwssd per 32 values and row (128).

ctypedef fused klblock:
    block_q4_K
    block_q5_K
    block_q6_K


# One super-block of LR rows, repacked for the prefill tile: u[s] is the 32 bytes that dpbusd step s takes,
# values 4s..4s+3 of the LR rows (row r in bytes 4r..4r+3), unsigned; sc[i][r] row r's scale of Q4_K
# sub-block i (32 values) or Q6_K group i (16 values); pr[k] the rows' int16 pairs that dpwssd takes
# against the token's pairs of sums of quants: Q4_K the mins of sub-blocks 2k, 2k+1 (k < 4, against
# ktoken_pairs), Q6_K the scales of groups 2k, 2k+1 (k < 8, against the token's bsums as they are); d, dmin
# the rows' fp32 super-block scales (dmin: Q4_K only).
ctypedef struct klanerec:
    uint8_t u[64][32]
    int32_t sc[16][LR]
    int32_t pr[8][LR]
    float d[LR]
    float dmin[LR]


# lo and hi as the int16 pair (lo, hi) of one int32 lane, for dpwssd.
cdef inline int32_t pair16(int32_t lo, int32_t hi) noexcept nogil:
    return <int32_t>((<uint32_t>(<uint16_t>lo)) | ((<uint32_t>(<uint16_t>hi)) << 16))


# pairs[4 * i + k]: token super-block i's sums of the quants of Q4_K sub-blocks 2k (low int16) and 2k + 1
# (high), for the n super-blocks of X. A sub-block's sum is two of Q8_K's 16-value bsums (|sum| <= 32 * 128).
cdef void ktoken_pairs(const block_q8k* X, Py_ssize_t n, int32_t* pairs) noexcept nogil:
    cdef Py_ssize_t i
    cdef int k
    for i in range(n):
        for k in range(4):
            pairs[4 * i + k] = pair16(X[i].bsums[4 * k] + X[i].bsums[4 * k + 1],
                                      X[i].bsums[4 * k + 2] + X[i].bsums[4 * k + 3])


# Rows w[0..nrows) (nb super-blocks each, nrows <= LR) into the records dst[0..nb); the other slots get
# zeros, computed on and never stored.
cdef void repack_klanes(const klblock* w, int nrows, Py_ssize_t nb, klanerec* dst) noexcept nogil:
    cdef const char* pf = <const char*>(w + LR * nb)  # the next tile's rows, in flight while this one repacks
    cdef Py_ssize_t pfstep = LR * sizeof(klblock)
    cdef __m256i a[LR]
    cdef __m256i c[LR]
    cdef __m256i lo, hi
    cdef __m256i hb = _mm256_setzero_si256()
    cdef __m256i zero = _mm256_setzero_si256()
    cdef uint8_t sm[16]
    cdef const klblock* blk
    cdef int r, j, k, n
    cdef Py_ssize_t b
    for b in range(nb):
        lc_prefetch_span(pf + b * pfstep, pfstep)
        for r in range(LR):
            if r < nrows:
                blk = w + r * nb + b
            if klblock is block_q4_K or klblock is block_q5_K:
                if r < nrows:
                    _mm_storeu_si128(<__m128i*>sm, k4_scales_mins(blk.scales))  # 8 scales, then 8 mins
                    for j in range(8):
                        dst[b].sc[j][r] = sm[j]
                    for k in range(4):
                        dst[b].pr[k][r] = pair16(sm[8 + 2 * k], sm[9 + 2 * k])
                    dst[b].d[r] = fp16(blk.d)
                    dst[b].dmin[r] = fp16(blk.dmin)
                else:
                    for j in range(8):
                        dst[b].sc[j][r] = 0
                    for k in range(4):
                        dst[b].pr[k][r] = 0
                    dst[b].d[r] = 0.0
                    dst[b].dmin[r] = 0.0
            else:
                if r < nrows:
                    for j in range(16):
                        dst[b].sc[j][r] = blk.scales[j]
                    for k in range(8):
                        dst[b].pr[k][r] = pair16(blk.scales[2 * k], blk.scales[2 * k + 1])
                    dst[b].d[r] = fp16(blk.d)
                else:
                    for j in range(16):
                        dst[b].sc[j][r] = 0
                    for k in range(8):
                        dst[b].pr[k][r] = 0
                    dst[b].d[r] = 0.0
        if klblock is block_q4_K or klblock is block_q5_K:
            # qs[32k..32k+32): the low nibbles are values 64k..64k+31 (sub-block 2k), the high ones the next 32
            # (Q5_K: each with its fifth bit from qh)
            for k in range(4):
                for r in range(LR):
                    if r < nrows:
                        if klblock is block_q5_K:
                            hb = _mm256_loadu_si256(<const __m256i*>w[r * nb + b].qh)
                        k45_quants(w + r * nb + b, k, hb, &a[r], &c[r])
                    else:
                        a[r] = zero
                        c[r] = zero
                transpose_groups(a, &dst[b].u[16 * k][0])
                transpose_groups(c, &dst[b].u[16 * k + 8][0])
        else:
            for n in range(2):
                for j in range(4):
                    for r in range(LR):
                        if r < nrows:
                            blk = w + r * nb + b
                            lo = _mm256_loadu_si256(<const __m256i*>(blk.ql + 64 * n))
                            hi = _mm256_loadu_si256(<const __m256i*>(blk.ql + 64 * n + 32))
                            hb = _mm256_loadu_si256(<const __m256i*>(blk.qh + 32 * n))
                            a[r] = k6_values(lo, hi, hb, j)
                        else:
                            a[r] = zero
                    transpose_groups(a, &dst[b].u[8 * (4 * n + j)][0])


# One prefill tile: the LR rows of records rec x T tokens from y (nb super-blocks apart; Q4_K's pairs: the
# tokens' ktoken_pairs); out[t * ldo + r] for r < nvalid.
cdef void klanes_tile(const klblock* tag, const tshape* shape, const klanerec* rec, const block_q8k* y,
                      const int32_t* pairs, Py_ssize_t nb, float* out, Py_ssize_t ldo, int nvalid) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef int npr = 8 if klblock is block_q6_K else 4
    cdef __m256 fa[MAXT]
    cdef __m256 fm[MAXT]
    cdef __m256i ia[MAXT]
    cdef __m256i wq[8]
    cdef __m256i lo, hi, im
    cdef __m256i zero = _mm256_setzero_si256()
    cdef __m256 dw, dm, dx
    cdef const klanerec* k
    cdef const block_q8k* yb
    cdef const uint8_t* xq
    cdef const int32_t* pp
    cdef float res[LR]
    cdef int r, t, g, p
    cdef Py_ssize_t b
    for t in range(T):
        fa[t] = _mm256_setzero_ps()
        fm[t] = _mm256_setzero_ps()
    for b in range(nb):
        k = rec + b
        for t in range(T):
            ia[t] = zero
        # 32 values (steps 8p..8p+7) at a time: Q4_K sub-block p, Q6_K groups 2p and 2p + 1
        for p in range(8):
            for g in range(8):
                wq[g] = _mm256_loadu_si256(<const __m256i*>k.u[8 * p + g])
            for t in range(T):
                xq = <const uint8_t*>(y + t * nb + b).qs + 32 * p
                # two chains of 4 (for latency): values 0..15 and 16..31
                lo = _mm256_dpbusd_epi32(zero, wq[0], _mm256_set1_epi32(<int>load_u32(xq)))
                hi = _mm256_dpbusd_epi32(zero, wq[4], _mm256_set1_epi32(<int>load_u32(xq + 16)))
                for g in range(1, 4):
                    lo = _mm256_dpbusd_epi32(lo, wq[g], _mm256_set1_epi32(<int>load_u32(xq + 4 * g)))
                    hi = _mm256_dpbusd_epi32(hi, wq[g + 4], _mm256_set1_epi32(<int>load_u32(xq + 16 + 4 * g)))
                if klblock is block_q4_K or klblock is block_q5_K:
                    ia[t] = _mm256_add_epi32(ia[t], _mm256_mullo_epi32(
                        _mm256_add_epi32(lo, hi), _mm256_loadu_si256(<const __m256i*>k.sc[p])))
                else:
                    ia[t] = _mm256_add_epi32(ia[t], _mm256_add_epi32(
                        _mm256_mullo_epi32(lo, _mm256_loadu_si256(<const __m256i*>k.sc[2 * p])),
                        _mm256_mullo_epi32(hi, _mm256_loadu_si256(<const __m256i*>k.sc[2 * p + 1]))))
        dw = _mm256_loadu_ps(k.d)
        if klblock is block_q4_K or klblock is block_q5_K:
            dm = _mm256_loadu_ps(k.dmin)
        for t in range(T):
            yb = y + t * nb + b
            if klblock is block_q4_K or klblock is block_q5_K:
                pp = pairs + 4 * (t * nb + b)
            else:
                pp = <const int32_t*>yb.bsums
            im = _mm256_dpwssd_epi32(zero, _mm256_loadu_si256(<const __m256i*>k.pr[0]), _mm256_set1_epi32(pp[0]))
            for g in range(1, npr):
                im = _mm256_dpwssd_epi32(im, _mm256_loadu_si256(<const __m256i*>k.pr[g]), _mm256_set1_epi32(pp[g]))
            dx = _mm256_set1_ps(yb.d)
            if klblock is block_q4_K or klblock is block_q5_K:
                fa[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), _mm256_mul_ps(dw, dx), fa[t])
                fm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(dm, dx), fm[t])
            else:  # the -32 offset of Q6_K's values: 32 * sum_g sc_g * (group g's sum of quants)
                fa[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(ia[t], _mm256_slli_epi32(im, 5))),
                                        _mm256_mul_ps(dw, dx), fa[t])
    for t in range(T):
        if klblock is block_q4_K or klblock is block_q5_K:
            _mm256_storeu_ps(res, _mm256_sub_ps(fa[t], fm[t]))
        else:
            _mm256_storeu_ps(res, fa[t])
        for r in range(nvalid):
            out[t * ldo + r] = res[r]


# k4_scales_mins for two Q4_K super-blocks at once, in 256-bit registers: [a's 8 scales, 8 mins | b's], the
# same bytes. Each reads 16 bytes at scales (its 12, then 4 of qs: inside the block).
cdef inline __m256i k4_scales_mins2(const uint8_t* a, const uint8_t* b) noexcept nogil:
    cdef __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(<const __m128i*>a)),
                                             _mm_loadu_si128(<const __m128i*>b), 1)
    # per 128-bit half: A = bytes 0..3, 8..11, 4..7, 8..11; B = bytes 0..3 into 4..7 and 4..7 into 12..15
    cdef __m256i A = _mm256_shuffle_epi8(v, _mm256_setr_epi32(0x03020100, 0x0B0A0908, 0x07060504, 0x0B0A0908,
                                                              0x03020100, 0x0B0A0908, 0x07060504, 0x0B0A0908))
    cdef __m256i B = _mm256_shuffle_epi8(v, _mm256_setr_epi32(-1, 0x03020100, -1, 0x07060504,
                                                              -1, 0x03020100, -1, 0x07060504))
    # scales 0..3 / mins 0..3: low 6 bits of bytes 0..3 / 4..7; scales 4..7: low nibbles of 8..11, mins 4..7
    # their high nibbles; both + the top 2 bits of bytes 0..3 / 4..7 as bits 4..5
    cdef __m256i lo = _mm256_and_si256(A, _mm256_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0,
                                                            0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0))
    cdef __m256i hi = _mm256_and_si256(_mm256_srli_epi16(A, 4), _mm256_setr_epi32(0, 0, 0, 0x0f0f0f0f,
                                                                                 0, 0, 0, 0x0f0f0f0f))
    return _mm256_or_si256(_mm256_or_si256(lo, hi), _mm256_and_si256(_mm256_srli_epi16(B, 2), _mm256_set1_epi8(0x30)))


# One row's super-block against T tokens (y: token 0's super-block, the others ystride apart; Q4_K's scales
# and mins in sm, as k4_scales_mins gives them): per token the int32 lanes whose sum is isum (si) and, for
# Q4_K, those whose sum is imin (o). kdot's integer steps (maddubs, then dpwssd with the scale); the
# unpacked quants are shared by the tokens.
cdef inline void k_row_ints(const klblock* blk, __m128i sm, const block_q8k* y, Py_ssize_t ystride, int T,
                            __m256i* si, __m256i* o) noexcept nogil:
    cdef __m256i S, O, a, c, idx, u
    cdef __m256i hb = _mm256_setzero_si256()
    cdef int32_t s32[8]
    cdef int j, n, t, s
    for t in range(T):
        si[t] = _mm256_setzero_si256()
    if klblock is block_q4_K or klblock is block_q5_K:  # sm: the 8 scales, then the 8 mins (k4_scales_mins)
        S = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sm, sm))  # int32 lane j: (sc_j << 16 | sc_j)
        O = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm))
        _mm256_storeu_si256(<__m256i*>s32, S)  # broadcast back per step: loads, not shuffles
        for t in range(T):
            o[t] = _mm256_madd_epi16(O, _mm256_loadu_si256(<const __m256i*>(y + t * ystride).bsums))
        if klblock is block_q5_K:
            hb = _mm256_loadu_si256(<const __m256i*>blk.qh)
        for j in range(4):
            k45_quants(blk, j, hb, &a, &c)
            for t in range(T):
                si[t] = _mm256_dpwssd_epi32(si[t], _mm256_maddubs_epi16(
                    a, _mm256_loadu_si256(<const __m256i*>((y + t * ystride).qs + 64 * j))),
                    _mm256_set1_epi32(s32[2 * j]))
                si[t] = _mm256_dpwssd_epi32(si[t], _mm256_maddubs_epi16(
                    c, _mm256_loadu_si256(<const __m256i*>((y + t * ystride).qs + 64 * j + 32))),
                    _mm256_set1_epi32(s32[2 * j + 1]))
    else:
        S = _mm256_cvtepi8_epi16(_mm_loadu_si128(<const __m128i*>blk.scales))
        O = _mm256_slli_epi16(S, 5)
        for n in range(2):
            a = _mm256_loadu_si256(<const __m256i*>(blk.ql + 64 * n))
            c = _mm256_loadu_si256(<const __m256i*>(blk.ql + 64 * n + 32))
            hb = _mm256_loadu_si256(<const __m256i*>(blk.qh + 32 * n))
            for j in range(4):
                s = 4 * n + j
                u = k6_values(a, c, hb, j)
                # int16 lanes 0..7 pick the scale of group 2s, lanes 8..15 that of group 2s + 1
                idx = _mm256_add_epi16(_mm256_setr_epi32(0, 0, 0, 0, 0x10001, 0x10001, 0x10001, 0x10001),
                                       _mm256_set1_epi16(2 * s))
                for t in range(T):
                    si[t] = _mm256_dpwssd_epi32(si[t], _mm256_maddubs_epi16(
                        u, _mm256_loadu_si256(<const __m256i*>((y + t * ystride).qs + 32 * s))),
                        _mm256_permutexvar_epi16(idx, S))
        for t in range(T):  # the -32 offset, in integers
            si[t] = _mm256_sub_epi32(si[t], _mm256_madd_epi16(
                O, _mm256_loadu_si256(<const __m256i*>(y + t * ystride).bsums)))


# Decode and a few tokens (n_tok <= KLANE_RAW_TOK) from the super-blocks as stored: LR rows x T tokens. Each
# row's lanes are made by k_row_ints; each pair of rows is folded at once (one hadd), and rows8_sums makes
# the 4 pairs one lane per row for the FMAs.
cdef void klanes_dec(const klblock* w, const tshape* shape, const block_q8k* y, Py_ssize_t nb, float* out,
                     Py_ssize_t ldo) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef __m256 fa[MAXT]
    cdef __m256 fm[MAXT]
    cdef __m256i sa[MAXT]
    cdef __m256i oa[MAXT]
    cdef __m256i sb[MAXT]
    cdef __m256i ob[MAXT]
    cdef __m256i hs[MAXT][4]
    cdef __m256i ho[MAXT][4]
    cdef __m256i sm2 = _mm256_setzero_si256()
    cdef __m256 dw, dm, dx
    cdef uint16_t dh[LR]
    cdef uint16_t mh[LR]
    cdef float res[LR]
    cdef int r, t, p
    cdef Py_ssize_t b, i
    cdef const char* pf = <const char*>(w + KLANE_PF_TILES * LR * nb)
    cdef Py_ssize_t pfstep = LR * sizeof(klblock)
    cdef Py_ssize_t ka = (pf_row_ahead + sizeof(klblock) - 1) // sizeof(klblock)
    for t in range(T):
        fa[t] = _mm256_setzero_ps()
        fm[t] = _mm256_setzero_ps()
    for b in range(nb):
        for p in range(4):
            # a quarter of the step's prefetches with each pair of rows: in one burst they would hold the
            # load misses the rows' own loads wait for
            if ka == 0:
                lc_prefetch_span(pf + b * pfstep + p * pfstep // 4, (p + 1) * pfstep // 4 - p * pfstep // 4)
            else:
                lc_prefetch_span(w + row_ahead(2 * p, b, ka, nb), sizeof(klblock))
                lc_prefetch_span(w + row_ahead(2 * p + 1, b, ka, nb), sizeof(klblock))
            if klblock is block_q4_K or klblock is block_q5_K:
                sm2 = k4_scales_mins2(w[2 * p * nb + b].scales, w[(2 * p + 1) * nb + b].scales)
            k_row_ints(w + 2 * p * nb + b, _mm256_castsi256_si128(sm2), y + b, nb, T, sa, oa)
            k_row_ints(w + (2 * p + 1) * nb + b, _mm256_extracti128_si256(sm2, 1), y + b, nb, T, sb, ob)
            for t in range(T):
                hs[t][p] = _mm256_hadd_epi32(sa[t], sb[t])
                if klblock is block_q4_K or klblock is block_q5_K:
                    ho[t][p] = _mm256_hadd_epi32(oa[t], ob[t])
        for r in range(LR):
            dh[r] = w[r * nb + b].d
            if klblock is block_q4_K or klblock is block_q5_K:
                mh[r] = w[r * nb + b].dmin
        # through memory (lc_spill): narrow stores and one load, not inserts on the shuffle pipes
        lc_spill(<const float*>dh)
        dw = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>dh))
        if klblock is block_q4_K or klblock is block_q5_K:
            lc_spill(<const float*>mh)
            dm = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>mh))
        for t in range(T):
            dx = _mm256_set1_ps((y + t * nb + b).d)
            fa[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(rows8_sums(hs[t])), _mm256_mul_ps(dw, dx), fa[t])
            if klblock is block_q4_K or klblock is block_q5_K:
                fm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(rows8_sums(ho[t])), _mm256_mul_ps(dm, dx), fm[t])
    for t in range(T):
        if klblock is block_q4_K or klblock is block_q5_K:
            _mm256_storeu_ps(res, _mm256_sub_ps(fa[t], fm[t]))
        else:
            _mm256_storeu_ps(res, fa[t])
        for r in range(LR):
            out[t * ldo + r] = res[r]


# One row x one token in scalar float (the last 1-7 rows of a matrix).
cdef float klanes_dec1(const klblock* w, const block_q8k* y, Py_ssize_t nb) noexcept nogil:
    cdef float fa = 0.0
    cdef float fm = 0.0
    cdef __m256i si, o
    cdef __m128i sm = _mm_setzero_si128()
    cdef Py_ssize_t b
    for b in range(nb):
        if klblock is block_q4_K or klblock is block_q5_K:
            sm = k4_scales_mins(w[b].scales)
        k_row_ints(w + b, sm, y + b, 0, 1, &si, &o)
        fa = fmaf(<float>hsum8_epi32(si), fp16(w[b].d) * y[b].d, fa)
        if klblock is block_q4_K or klblock is block_q5_K:
            fm = fmaf(<float>hsum8_epi32(o), fp16(w[b].dmin) * y[b].d, fm)
    if klblock is block_q4_K or klblock is block_q5_K:
        return fa - fm
    else:
        return fa


# ---- drivers


# Row tile rec against tokens [t0, t1): tiles of 4 tokens, then one of the 1-3 left.
cdef inline void klanes_tokens(const klblock* tag, const klanerec* rec, const block_q8k* X, const int32_t* pairs,
                               Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy,
                               Py_ssize_t r0, int nvalid) noexcept nogil:
    cdef Py_ssize_t t = t0
    while t + 4 <= t1:
        klanes_tile(tag, <const tok4*>NULL, rec, X + t * nb, pairs + 4 * t * nb, nb, Y + t * ldy + r0, ldy, nvalid)
        t += 4
    if t1 - t == 3:
        klanes_tile(tag, <const tok3*>NULL, rec, X + t * nb, pairs + 4 * t * nb, nb, Y + t * ldy + r0, ldy, nvalid)
    elif t1 - t == 2:
        klanes_tile(tag, <const tok2*>NULL, rec, X + t * nb, pairs + 4 * t * nb, nb, Y + t * ldy + r0, ldy, nvalid)
    elif t1 - t == 1:
        klanes_tile(tag, <const tok1*>NULL, rec, X + t * nb, pairs + 4 * t * nb, nb, Y + t * ldy + r0, ldy, nvalid)


# Row tiles rec and rec + nb (16 rows, output rows from Y) against tokens [t0, t1), in 512-bit vectors
# (x16.h): klanes_tile's steps, so its bits.
cdef inline void klanes_pair(const klblock* tag, const klanerec* rec, const block_q8k* X, const int32_t* pairs,
                             Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy) noexcept nogil:
    if klblock is block_q6_K:
        lc_kx16_q6_k(rec, rec + nb, X, NULL, t0, t1, nb, Y, ldy)
    else:
        lc_kx16_q4_k(rec, rec + nb, X, pairs, t0, t1, nb, Y, ldy)


assert sizeof(lc_x16_krec) == sizeof(klanerec)


# Prefill work item g: rows [g*G, g*G + G), repacked LR at a time into buf (nb records per LR rows), against
# every token, TCH tokens at a time. Each row tile is repacked right before its first chunk of tokens (so
# that with one chunk it is still in L1) and kept for the later chunks (in L2).
cdef void klanes_group(const klblock* W, Py_ssize_t rows, Py_ssize_t nb, const block_q8k* X,
                       Py_ssize_t n_tok, const int32_t* pairs, float* Y, Py_ssize_t ldy, Py_ssize_t G,
                       Py_ssize_t g, klanerec* buf) noexcept nogil:
    cdef Py_ssize_t r0 = g * G
    cdef Py_ssize_t r1 = min(rows, r0 + G)
    cdef Py_ssize_t ntiles = (r1 - r0 + LR - 1) // LR
    cdef Py_ssize_t i, t0, t1
    cdef int nvalid
    t0 = 0
    while t0 < n_tok:
        t1 = min(n_tok, t0 + TCH)
        i = 0
        if pairs_on and n_tok > TCH:  # a prompt: whole tiles two at a time (few tokens gain nothing)
            while r0 + (i + 2) * LR <= r1:
                if t0 == 0:
                    repack_klanes(W + (r0 + i * LR) * nb, LR, nb, buf + i * nb)
                    repack_klanes(W + (r0 + i * LR + LR) * nb, LR, nb, buf + (i + 1) * nb)
                klanes_pair(W, buf + i * nb, X, pairs, t0, t1, nb, Y + r0 + i * LR, ldy)
                i += 2
        while i < ntiles:
            nvalid = <int>min(<Py_ssize_t>LR, r1 - r0 - i * LR)
            if t0 == 0:
                repack_klanes(W + (r0 + i * LR) * nb, nvalid, nb, buf + i * nb)
            klanes_tokens(W, buf + i * nb, X, pairs, t0, t1, nb, Y, ldy, r0 + i * LR, nvalid)
            i += 1
        t0 = t1


# Tokens [0, n_tok) of LR rows from w as stored: tiles of up to MAXT tokens.
cdef inline void klanes_raw_tokens(const klblock* w, const block_q8k* X, Py_ssize_t n_tok, Py_ssize_t nb,
                                   float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t t = 0
    while t + 4 <= n_tok:
        klanes_dec(w, <const tok4*>NULL, X + t * nb, nb, Y + t * ldy, ldy)
        t += 4
    if n_tok - t == 3:
        klanes_dec(w, <const tok3*>NULL, X + t * nb, nb, Y + t * ldy, ldy)
    elif n_tok - t == 2:
        klanes_dec(w, <const tok2*>NULL, X + t * nb, nb, Y + t * ldy, ldy)
    elif n_tok - t == 1:
        klanes_dec(w, <const tok1*>NULL, X + t * nb, nb, Y + t * ldy, ldy)


# Decode and few tokens, no repacking: rows LR at a time, then the rows left over one by one.
cdef void klanes_raw(const klblock* W, Py_ssize_t rows, Py_ssize_t nb, const block_q8k* X, Py_ssize_t n_tok,
                     float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t r = 0
    cdef Py_ssize_t t
    while r + LR <= rows:
        klanes_raw_tokens(W + r * nb, X, n_tok, nb, Y + r, ldy)
        r += LR
    while r < rows:
        for t in range(n_tok):
            Y[t * ldy + r] = klanes_dec1(W + r * nb, X + t * nb, nb)
        r += 1


# The product in the row-lane order: decode and few tokens from the weights as stored, more tokens
# repacked. Always 1: with no memory for the repacked rows it takes the few-token tiles, whose numbers are
# the same.
cdef int mm512_klanes(const klblock* W, Py_ssize_t rows, Py_ssize_t nb, const block_q8k* X, Py_ssize_t n_tok,
                      float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t G, g, tiles, pairs_bytes, done
    cdef char* buf
    if amx_on and n_tok >= AMX_TOK:  # the tile unit takes the whole 16-row records (matmul512_amx.pxi)
        done = amx_klanes(W, rows, nb, X, n_tok, Y, ldy)
        if done == rows:
            return 1
        W += done * nb
        rows -= done
        Y += done
    if n_tok > KLANE_RAW_TOK:
        tiles = max(1, min(GROUP_BYTES // (nb * <Py_ssize_t>sizeof(klanerec)), GR // LR))
        G = tiles * LR
        pairs_bytes = 0  # Q6_K's dpwssd takes the token's bsums as they are
        if klblock is block_q4_K or klblock is block_q5_K:
            pairs_bytes = (4 * n_tok * nb * <Py_ssize_t>sizeof(int32_t) + 63) // 64 * 64
        buf = <char*>lc_scratch(pairs_bytes + tiles * nb * sizeof(klanerec))
        if buf != NULL:
            if klblock is block_q4_K or klblock is block_q5_K:
                ktoken_pairs(X, n_tok * nb, <int32_t*>buf)
            for g in range((rows + G - 1) // G):
                klanes_group(W, rows, nb, X, n_tok, <const int32_t*>buf, Y, ldy, G, g,
                             <klanerec*>(buf + pairs_bytes))
            return 1
    klanes_raw(W, rows, nb, X, n_tok, Y, ldy)
    return 1
