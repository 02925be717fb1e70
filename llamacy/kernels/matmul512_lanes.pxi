# The AVX-512 VNNI kernels of the legacy 32-value types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) in the row-lane float
# order: repacking, prefill, decode and few-token tiles, and their drivers. Included by matmul512.pyx
# (compiled with its AVX-512 flags), whose types and constants it uses.
#
# Float order (issue #29's new order; for Q4_0 the one llama.cpp's repacked Q4_0 kernels use; for the others
# not llama.cpp's on x86, whose vec_dot and tinyBLAS keep per-lane sums): per (row, token), block by block,
# sum = fma(float(isum), d_w * d_x, sum) with isum the block's exact integer sum; the types with a min (Q4_1,
# Q5_1) carry a second chain beside it, mins = fma(m_w, s_x, mins) (s_x = d_x * the token block's sum of
# quants), and Y = sum + mins. A row's running sums are one float lane each, so the tiles put 8 rows side by
# side and advance them with one conversion and one or two FMAs per token and block, where the per-lane
# order (8 lanes per (row, token), summed at the end) spends a conversion and an FMA per row. Which lanes
# hold which rows changes nothing in the result: decode, few tokens, prefill and every thread count give the
# same bits.
#
# The quants enter dpbusd unsigned (load_u: q + 8 for Q4_0, q + 16 for Q5_0, q + 128 for Q8_0, q itself for
# Q4_1 and Q5_1); the offset's share, offset x the token block's sum of quants, is subtracted through the
# accumulator's start (the seeds).


# One 32-value block of LR rows, repacked for the prefill tile, which keeps one row per lane: q[g] is the 32
# bytes that dpbusd takes for values 4g..4g+3 of the LR rows, row r in bytes 4r..4r+3, unsigned (load_u:
# q + c); the offset's share, c times the token block's sum of quants, is the accumulator's start
# (token_sums). d: the rows' fp32 scales.
ctypedef struct lanerec:
    uint8_t q[8][32]
    float d[LR]
    float m[LR]  # the rows' fp32 mins (Q4_1, Q5_1; unused by the others)


# One weight block's quants as the unsigned operand of dpbusd: the stored value (Q4_1, Q5_1), q + 8 (Q4_0),
# q + 16 (Q5_0), q + 128 (Q8_0).
cdef inline __m256i load_u(const laneblock* wb) noexcept nogil:
    if laneblock is block_q8_0:
        return _mm256_xor_si256(_mm256_loadu_si256(<const __m256i*>wb.qs), _mm256_set1_epi8(-128))
    elif laneblock is block_q4_0 or laneblock is block_q4_1:
        return unpack_nibbles(wb.qs)
    else:
        return _mm256_or_si256(unpack_nibbles(wb.qs),
                               _mm256_and_si256(unpack_bits(wb.qh), _mm256_set1_epi8(0x10)))


# The offset of a type's unsigned quants (load_u): q + 8 (Q4_0), q + 16 (Q5_0), q + 128 (Q8_0); none for
# the types with a min.
cdef inline int lane_offset(const laneblock* tag) noexcept nogil:
    if laneblock is block_q4_0:
        return 8
    elif laneblock is block_q5_0:
        return 16
    elif laneblock is block_q8_0:
        return 128
    else:
        return 0


# Up to how many tokens a product reads the blocks as stored (lanes_dec) rather than repacked. Q8_0's raw
# tile needs no unpacking and wins up to 8 tokens; Q4_0 unpacks nibbles in every pass and repacking wins
# from 5 (llama-3.2-1b at 2 threads: BENCHMARKS.md); Q5_0, unpacked like Q4_0 plus its fifth bits, follows
# Q4_0 (not measured on its own), and so do Q4_1 and Q5_1.
cdef inline int lane_raw_tok(const laneblock* tag) noexcept nogil:
    if laneblock is block_q8_0:
        return Q8_0_RAW_TOK
    else:
        return Q4_0_RAW_TOK


# The accumulator seed for one token block qy: minus the offset's share c * (sum of 4 quants) per lane, so
# that dpbusd(seed, u, qy) is the lane sum of (u - c) * qy (as AVX2's token_offset); zero for the types with
# a min (no offset).
cdef inline __m256i token_seed(const laneblock* tag, __m256i qy) noexcept nogil:
    cdef __m256i zero = _mm256_setzero_si256()
    if laneblock is block_q4_1 or laneblock is block_q5_1:
        return zero
    else:
        return _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(<char>lane_offset(tag)), qy))


# sums[i] = -c * (sum of token block i's 32 quants), for the n blocks of X (the prefill tile's seeds: the
# unsigned quants of load_u are q + c: lane_offset).
cdef void token_sums(const laneblock* tag, const block_q8a* X, Py_ssize_t n, int32_t* sums) noexcept nogil:
    cdef __m256i zero = _mm256_setzero_si256()
    cdef __m256i ones = _mm256_set1_epi8(1)
    cdef int32_t c = lane_offset(tag)
    cdef Py_ssize_t i
    if c == 0:
        memset(sums, 0, n * sizeof(int32_t))
        return
    for i in range(n):
        sums[i] = -c * hsum8_epi32(_mm256_dpbusd_epi32(zero, ones, _mm256_loadu_si256(<const __m256i*>X[i].qs)))


# The exact int32 sums of the 8 lanes of each of a, b, c, d, as [sum a, sum b, sum c, sum d].
cdef inline __m128i sum4_epi32(__m256i a, __m256i b, __m256i c, __m256i d) noexcept nogil:
    cdef __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d))
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1))


# The 8 rows' 32 bytes in v[0..8) as an 8 x 8 matrix of 4-byte groups, transposed in registers (unpacks of
# 32 and 64 bits, then 128-bit halves) into q[0..256): 32 bytes per group g, row r's bytes 4g..4g+3 in
# bytes 4r..4r+3 (what one dpbusd takes for 8 rows).
cdef inline void transpose_groups(const __m256i* v, uint8_t* q) noexcept nogil:
    cdef __m256i t[8]
    cdef __m256i s[8]
    cdef int i
    for i in range(4):
        t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1])
        t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1])
    for i in range(2):
        s[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2])
        s[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2])
        s[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3])
        s[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3])
    for i in range(4):
        _mm256_storeu_si256(<__m256i*>(q + 32 * i), _mm256_permute2x128_si256(s[i], s[4 + i], 0x20))
        _mm256_storeu_si256(<__m256i*>(q + 32 * (4 + i)), _mm256_permute2x128_si256(s[i], s[4 + i], 0x31))


# rows8_sums: the exact int32 sums of the 8 lanes of each of 8 vectors s[0..8), as one vector (lane r: the
# sum of s[r]'s lanes), from the pairs h[p] = hadd(s[2p], s[2p+1]) (so that a caller can fold each pair as
# soon as it has it, with fewer vectors live).
cdef inline __m256i rows8_sums(const __m256i* h) noexcept nogil:
    cdef __m256i g0 = _mm256_hadd_epi32(h[0], h[1])
    cdef __m256i g1 = _mm256_hadd_epi32(h[2], h[3])
    # g0: rows 0..3's sums of lanes 0..3, then of lanes 4..7; g1 the same for rows 4..7
    return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31))


# Rows w[0..nrows) (nb blocks each, nrows <= LR) into the records dst[0..nb); the other slots get zeros,
# computed on and never stored.
cdef void repack_lanes(const laneblock* w, int nrows, Py_ssize_t nb, lanerec* dst) noexcept nogil:
    cdef const char* pf = <const char*>(w + LR * nb)  # the next tile's rows, in flight while this one repacks
    cdef Py_ssize_t pfstep = LR * sizeof(laneblock)
    cdef __m256i v[8]
    cdef __m256i zero = _mm256_setzero_si256()
    cdef int r
    cdef Py_ssize_t b
    for b in range(nb):
        lc_prefetch_span(pf + b * pfstep, pfstep)
        for r in range(LR):
            if r < nrows:
                v[r] = load_u(w + r * nb + b)
                dst[b].d[r] = fp16(w[r * nb + b].d)
                if laneblock is block_q4_1 or laneblock is block_q5_1:
                    dst[b].m[r] = fp16(w[r * nb + b].m)
            else:
                v[r] = zero
                dst[b].d[r] = 0.0
                dst[b].m[r] = 0.0
        transpose_groups(v, &dst[b].q[0][0])


# One prefill tile: the LR rows of records rec x T tokens from y (nb blocks apart; sums: their seeds);
# out[t * ldo + r] for r < nvalid. Per token and block: 8 dpbusd, each against 4 of the token's quants
# broadcast from memory (two chains of 4, for latency), one conversion, one multiply and one FMA for the 8
# rows (and for the types with a min one more FMA).
cdef void lanes_tile(const laneblock* tag, const tshape* shape, const lanerec* rec, const block_q8a* y,
                     const int32_t* sums, Py_ssize_t nb, float* out, Py_ssize_t ldo, int nvalid) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef __m256 acc[MAXT]
    cdef __m256 mins[MAXT]
    cdef __m256 mw
    cdef __m256i wq[8]
    cdef __m256i lo, hi
    cdef __m256i zero = _mm256_setzero_si256()
    cdef __m256 dw
    cdef const block_q8a* yb
    cdef const uint8_t* xq
    cdef float res[LR]
    cdef int r, t, g
    cdef Py_ssize_t b
    for t in range(T):
        acc[t] = _mm256_setzero_ps()
        if laneblock is block_q4_1 or laneblock is block_q5_1:
            mins[t] = _mm256_setzero_ps()
    for b in range(nb):
        for g in range(8):
            wq[g] = _mm256_loadu_si256(<const __m256i*>rec[b].q[g])
        dw = _mm256_loadu_ps(rec[b].d)
        if laneblock is block_q4_1 or laneblock is block_q5_1:
            mw = _mm256_loadu_ps(rec[b].m)
        for t in range(T):
            yb = y + t * nb + b
            xq = <const uint8_t*>yb.qs
            lo = _mm256_set1_epi32(sums[t * nb + b])
            hi = zero
            for g in range(4):
                lo = _mm256_dpbusd_epi32(lo, wq[g], _mm256_set1_epi32(<int>load_u32(xq + 4 * g)))
                hi = _mm256_dpbusd_epi32(hi, wq[g + 4], _mm256_set1_epi32(<int>load_u32(xq + 16 + 4 * g)))
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi)),
                                     _mm256_mul_ps(dw, _mm256_set1_ps(yb.d)), acc[t])
            if laneblock is block_q4_1 or laneblock is block_q5_1:
                mins[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(yb.s), mins[t])
    for t in range(T):
        if laneblock is block_q4_1 or laneblock is block_q5_1:
            acc[t] = _mm256_add_ps(acc[t], mins[t])
        _mm256_storeu_ps(res, acc[t])
        for r in range(nvalid):
            out[t * ldo + r] = res[r]


# Two rows' quants of block b for lanes_dec, unsigned (load_u): lo holds row a's values 0..15 in its low
# half and row b's in its high half, hi their values 16..31.
cdef inline void pair_quants(const laneblock* a, const laneblock* b, __m256i* lo, __m256i* hi) noexcept nogil:
    cdef __m256i X
    cdef __m256i m4 = _mm256_set1_epi8(0x0F)
    cdef __m256i c128 = _mm256_set1_epi8(-128)
    cdef __m256i ua, ub
    if laneblock is block_q4_0 or laneblock is block_q4_1:  # low nibbles: values 0..15, high: 16..31
        X = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(<const __m128i*>a.qs)),
                                    _mm_loadu_si128(<const __m128i*>b.qs), 1)
        lo[0] = _mm256_and_si256(X, m4)
        hi[0] = _mm256_and_si256(_mm256_srli_epi16(X, 4), m4)
    elif laneblock is block_q5_0 or laneblock is block_q5_1:  # fifth bits per row: rows, then halves swapped
        ua = load_u(a)
        ub = load_u(b)
        lo[0] = _mm256_permute2x128_si256(ua, ub, 0x20)
        hi[0] = _mm256_permute2x128_si256(ua, ub, 0x31)
    else:
        lo[0] = _mm256_xor_si256(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(<const __m128i*>a.qs)),
            _mm_loadu_si128(<const __m128i*>b.qs), 1), c128)
        hi[0] = _mm256_xor_si256(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(<const __m128i*>(a.qs + 16))),
            _mm_loadu_si128(<const __m128i*>(b.qs + 16)), 1), c128)


# Decode and a few tokens (n_tok <= lane_raw_tok), from the blocks as stored: 8 rows x T tokens. Two rows
# share a register (pair_quants), row a's values in the low half and row b's in the high half, each half
# dotted (dpbusd) with the token's matching 16 quants broadcast to both halves. A pair's lane sums are then 4
# per row instead of 8, and three hadds turn the 4 pairs into one lane per row, ordered [r0 r2 r4 r6 | r1 r3
# r5 r7] (the scales are loaded in that order, the results stored back by it). The offset (lane_offset) starts
# every lane (seed): after the hadds each row carries -offset * (the block's sum of quants). Per 8 rows and
# block that is 8 dpbusd, 3 hadds, 1 conversion and 1 FMA, where one row per register would need a 9-step
# reduction (measured slower: Q4_0 at 2 threads, Q8_0 at 1-3 tokens and at 2 threads).
cdef void lanes_dec(const laneblock* w, const tshape* shape, const block_q8a* y, Py_ssize_t nb, float* out,
                    Py_ssize_t ldo) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef __m256 acc[MAXT]
    cdef __m256 mins[MAXT]
    cdef __m256i lo[4]
    cdef __m256i hi[4]
    cdef __m256i a[4]
    cdef __m256i xlo, xhi, seed
    cdef __m256i offset = _mm256_set1_epi8(<char>lane_offset(w))
    cdef __m256i zero = _mm256_setzero_si256()
    cdef __m256 dw, mw
    cdef uint16_t dh[LR]
    cdef uint16_t mh[LR]
    cdef const block_q8a* yb
    cdef float res[LR]
    cdef int p, t
    cdef Py_ssize_t b
    cdef const char* pf = <const char*>(w + LANE_PF_TILES * LR * nb)
    cdef Py_ssize_t pfstep = LR * sizeof(laneblock)
    cdef Py_ssize_t ka = (pf_row_ahead + sizeof(laneblock) - 1) // sizeof(laneblock)
    for t in range(T):
        acc[t] = _mm256_setzero_ps()
        if laneblock is block_q4_1 or laneblock is block_q5_1:
            mins[t] = _mm256_setzero_ps()
    for b in range(nb):
        if ka == 0:
            lc_prefetch_span(pf + b * pfstep, pfstep)
        else:
            for p in range(LR):
                lc_prefetch(w + row_ahead(p, b, ka, nb))
        for p in range(4):
            pair_quants(w + 2 * p * nb + b, w + (2 * p + 1) * nb + b, &lo[p], &hi[p])
            dh[p] = w[2 * p * nb + b].d
            dh[4 + p] = w[(2 * p + 1) * nb + b].d
            if laneblock is block_q4_1 or laneblock is block_q5_1:
                mh[p] = w[2 * p * nb + b].m
                mh[4 + p] = w[(2 * p + 1) * nb + b].m
        # through memory (lc_spill): 8 narrow stores and one load, not inserts on the shuffle pipes
        lc_spill(<const float*>dh)
        dw = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>dh))
        if laneblock is block_q4_1 or laneblock is block_q5_1:
            lc_spill(<const float*>mh)
            mw = _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>mh))
        for t in range(T):
            yb = y + t * nb + b
            xlo = _mm256_broadcastsi128_si256(_mm_loadu_si128(<const __m128i*>yb.qs))
            xhi = _mm256_broadcastsi128_si256(_mm_loadu_si128(<const __m128i*>(yb.qs + 16)))
            if laneblock is block_q4_1 or laneblock is block_q5_1:
                seed = zero
            else:
                seed = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(zero, offset, xlo), offset, xhi))
            for p in range(4):
                a[p] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(seed, lo[p], xlo), hi[p], xhi)
            acc[t] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(_mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]))),
                _mm256_mul_ps(dw, _mm256_set1_ps(yb.d)), acc[t])
            if laneblock is block_q4_1 or laneblock is block_q5_1:
                mins[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(yb.s), mins[t])
    for t in range(T):
        if laneblock is block_q4_1 or laneblock is block_q5_1:
            acc[t] = _mm256_add_ps(acc[t], mins[t])
        _mm256_storeu_ps(res, acc[t])
        for p in range(4):
            out[t * ldo + 2 * p] = res[p]
            out[t * ldo + 2 * p + 1] = res[4 + p]


# The tile for 4 of the rows a matrix has left after its 8-row tiles, one row per register: the R rows'
# lane sums become one lane each by sum4_epi32 and advance with one SSE conversion, multiply and FMA.
cdef void lanes_raw4(const laneblock* w, const tshape* shape, const block_q8a* y, Py_ssize_t nb, float* out,
                     Py_ssize_t ldo) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef __m128 acc[MAXT]
    cdef __m128 mins[MAXT]
    cdef __m256i qx[R]
    cdef __m256i qy, seed
    cdef __m128 dw, mw
    cdef const block_q8a* yb
    cdef float res[R]
    cdef int r, t
    cdef Py_ssize_t b
    for t in range(T):
        acc[t] = _mm_setzero_ps()
        if laneblock is block_q4_1 or laneblock is block_q5_1:
            mins[t] = _mm_setzero_ps()
    for b in range(nb):
        dw = _mm_cvtph_ps(_mm_set_epi32(0, 0, <int>((<uint32_t>w[3 * nb + b].d) << 16 | w[2 * nb + b].d),
                                        <int>((<uint32_t>w[nb + b].d) << 16 | w[b].d)))
        if laneblock is block_q4_1 or laneblock is block_q5_1:
            mw = _mm_cvtph_ps(_mm_set_epi32(0, 0, <int>((<uint32_t>w[3 * nb + b].m) << 16 | w[2 * nb + b].m),
                                            <int>((<uint32_t>w[nb + b].m) << 16 | w[b].m)))
        for r in range(R):
            qx[r] = load_u(w + r * nb + b)
        for t in range(T):
            yb = y + t * nb + b
            qy = _mm256_loadu_si256(<const __m256i*>yb.qs)
            seed = token_seed(w, qy)
            acc[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(sum4_epi32(
                _mm256_dpbusd_epi32(seed, qx[0], qy), _mm256_dpbusd_epi32(seed, qx[1], qy),
                _mm256_dpbusd_epi32(seed, qx[2], qy), _mm256_dpbusd_epi32(seed, qx[3], qy))),
                _mm_mul_ps(dw, _mm_set1_ps(yb.d)), acc[t])
            if laneblock is block_q4_1 or laneblock is block_q5_1:
                mins[t] = _mm_fmadd_ps(mw, _mm_set1_ps(yb.s), mins[t])
    for t in range(T):
        if laneblock is block_q4_1 or laneblock is block_q5_1:
            acc[t] = _mm_add_ps(acc[t], mins[t])
        _mm_storeu_ps(res, acc[t])
        for r in range(R):
            out[t * ldo + r] = res[r]


# One row x one token in scalar float (the last 1-3 rows of a matrix).
cdef float lanes_dec1(const laneblock* w, const block_q8a* y, Py_ssize_t nb) noexcept nogil:
    cdef float acc = 0.0
    cdef float mins = 0.0
    cdef __m256i qy
    cdef Py_ssize_t b
    for b in range(nb):
        qy = _mm256_loadu_si256(<const __m256i*>y[b].qs)
        acc = fmaf(<float>hsum8_epi32(_mm256_dpbusd_epi32(token_seed(w, qy), load_u(w + b), qy)),
                   fp16(w[b].d) * y[b].d, acc)
        if laneblock is block_q4_1 or laneblock is block_q5_1:
            mins = fmaf(fp16(w[b].m), y[b].s, mins)
    if laneblock is block_q4_1 or laneblock is block_q5_1:
        return acc + mins
    else:
        return acc


# ---- drivers


# Row tile rec against tokens [t0, t1): tiles of 4 tokens, then one of the 1-3 left.
cdef inline void lanes_tokens(const laneblock* W, const lanerec* rec, const block_q8a* X, const int32_t* sums,
                              Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy,
                              Py_ssize_t r0, int nvalid) noexcept nogil:
    cdef Py_ssize_t t = t0
    while t + 4 <= t1:
        lanes_tile(W, <const tok4*>NULL, rec, X + t * nb, sums + t * nb, nb, Y + t * ldy + r0, ldy, nvalid)
        t += 4
    if t1 - t == 3:
        lanes_tile(W, <const tok3*>NULL, rec, X + t * nb, sums + t * nb, nb, Y + t * ldy + r0, ldy, nvalid)
    elif t1 - t == 2:
        lanes_tile(W, <const tok2*>NULL, rec, X + t * nb, sums + t * nb, nb, Y + t * ldy + r0, ldy, nvalid)
    elif t1 - t == 1:
        lanes_tile(W, <const tok1*>NULL, rec, X + t * nb, sums + t * nb, nb, Y + t * ldy + r0, ldy, nvalid)


assert sizeof(lanerec) == 320  # x16.h reads d at byte 256, m at 288


# Row tiles rec and rec + nb (16 rows, output rows from Y) against tokens [t0, t1), in 512-bit vectors
# (x16.h): lanes_tile's steps, so its bits.
cdef inline void lanes_pair(const laneblock* tag, const lanerec* rec, const block_q8a* X, const int32_t* sums,
                            Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t nb, float* Y, Py_ssize_t ldy) noexcept nogil:
    if laneblock is block_q4_1 or laneblock is block_q5_1:
        lc_x16_lane_min(rec, rec + nb, sizeof(lanerec), X, NULL, t0, t1, nb, Y, ldy)
    else:
        lc_x16_lane(rec, rec + nb, sizeof(lanerec), X, sums, t0, t1, nb, Y, ldy)


# Prefill work item g: rows [g*G, g*G + G), repacked LR at a time into buf (nb records per LR rows), against
# every token (sums: their seeds), TCH tokens at a time. Each row tile is repacked right before its first
# chunk of tokens (so that with one chunk it is still in L1) and kept for the later chunks (in L2).
cdef void lanes_group(const laneblock* W, Py_ssize_t rows, Py_ssize_t nb, const block_q8a* X, Py_ssize_t n_tok,
                      const int32_t* sums, float* Y, Py_ssize_t ldy, Py_ssize_t G, Py_ssize_t g,
                      lanerec* buf) noexcept nogil:
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
                    repack_lanes(W + (r0 + i * LR) * nb, LR, nb, buf + i * nb)
                    repack_lanes(W + (r0 + i * LR + LR) * nb, LR, nb, buf + (i + 1) * nb)
                lanes_pair(W, buf + i * nb, X, sums, t0, t1, nb, Y + r0 + i * LR, ldy)
                i += 2
        while i < ntiles:
            nvalid = <int>min(<Py_ssize_t>LR, r1 - r0 - i * LR)
            if t0 == 0:
                repack_lanes(W + (r0 + i * LR) * nb, nvalid, nb, buf + i * nb)
            lanes_tokens(W, buf + i * nb, X, sums, t0, t1, nb, Y, ldy, r0 + i * LR, nvalid)
            i += 1
        t0 = t1


# Tokens [0, n_tok) of the rows from w as stored, 8 (eight) or 4 of them: tiles of 4 tokens, then one of
# the 1-3 left.
cdef inline void lanes_raw_tokens(const laneblock* w, bint eight, const block_q8a* X, Py_ssize_t n_tok,
                                  Py_ssize_t nb, float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t t = 0
    while t + 4 <= n_tok:
        if eight:
            lanes_dec(w, <const tok4*>NULL, X + t * nb, nb, Y + t * ldy, ldy)
        else:
            lanes_raw4(w, <const tok4*>NULL, X + t * nb, nb, Y + t * ldy, ldy)
        t += 4
    if n_tok - t == 3:
        if eight:
            lanes_dec(w, <const tok3*>NULL, X + t * nb, nb, Y + t * ldy, ldy)
        else:
            lanes_raw4(w, <const tok3*>NULL, X + t * nb, nb, Y + t * ldy, ldy)
    elif n_tok - t == 2:
        if eight:
            lanes_dec(w, <const tok2*>NULL, X + t * nb, nb, Y + t * ldy, ldy)
        else:
            lanes_raw4(w, <const tok2*>NULL, X + t * nb, nb, Y + t * ldy, ldy)
    elif n_tok - t == 1:
        if eight:
            lanes_dec(w, <const tok1*>NULL, X + t * nb, nb, Y + t * ldy, ldy)
        else:
            lanes_raw4(w, <const tok1*>NULL, X + t * nb, nb, Y + t * ldy, ldy)


# Decode and few tokens, no repacking: rows LR at a time; the rows left over at the end (fewer than LR) 4 at
# a time, then one by one, token by token.
cdef void lanes_raw(const laneblock* W, Py_ssize_t rows, Py_ssize_t nb, const block_q8a* X, Py_ssize_t n_tok,
                    float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t r = 0
    cdef Py_ssize_t t
    while r + LR <= rows:
        lanes_raw_tokens(W + r * nb, True, X, n_tok, nb, Y + r, ldy)
        r += LR
    if r + R <= rows:
        lanes_raw_tokens(W + r * nb, False, X, n_tok, nb, Y + r, ldy)
        r += R
    while r < rows:
        for t in range(n_tok):
            Y[t * ldy + r] = lanes_dec1(W + r * nb, X + t * nb, nb)
        r += 1


# The product in the row-lane order: decode and few tokens from the weights as stored, more tokens
# repacked. Always 1: with no memory for the repacked rows it takes the few-token tiles, whose numbers are
# the same.
cdef int mm512_lanes(const laneblock* W, Py_ssize_t rows, Py_ssize_t nb, const block_q8a* X, Py_ssize_t n_tok,
                     float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t G, g, tiles, sums_bytes, done
    cdef char* buf
    if amx_on and n_tok >= AMX_TOK:  # the tile unit takes the whole 16-row records (matmul512_amx.pxi)
        done = amx_lanes(W, rows, nb, X, n_tok, Y, ldy)
        if done == rows:
            return 1
        W += done * nb
        rows -= done
        Y += done
    if n_tok > lane_raw_tok(W):
        tiles = max(1, min(GROUP_BYTES // (nb * <Py_ssize_t>sizeof(lanerec)), GR // LR))
        G = tiles * LR
        sums_bytes = (n_tok * nb * <Py_ssize_t>sizeof(int32_t) + 63) // 64 * 64
        buf = <char*>lc_scratch(sums_bytes + tiles * nb * sizeof(lanerec))
        if buf != NULL:
            token_sums(W, X, n_tok * nb, <int32_t*>buf)
            for g in range((rows + G - 1) // G):
                lanes_group(W, rows, nb, X, n_tok, <const int32_t*>buf, Y, ldy, G, g,
                            <lanerec*>(buf + sums_bytes))
            return 1
    lanes_raw(W, rows, nb, X, n_tok, Y, ldy)
    return 1
