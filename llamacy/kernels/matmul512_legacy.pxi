# The AVX-512 VNNI kernels of the legacy 32-value types with a min (Q4_1, Q5_1) in the per-lane order
# (ACT_Q8A activations): repacking, prefill and decode tiles (plblock). Q4_0, Q5_0 and Q8_0 take
# matmul512_lanes.pxi, which shares load_u. Included by matmul512.pyx (compiled with its AVX-512 flags),
# whose types and constants it uses.

# One 32-value block of R rows, repacked: the unsigned quants as dpbusd takes them (dpbusd(0, q, x): the
# min term apart, nothing to subtract), the fp32 scale and min.
ctypedef struct lrec:
    uint8_t q[4][32]
    float d[4]
    float m[4]



# One weight block's quants as the unsigned operand of dpbusd: the stored value (4/5-bit types: q, or q + 8,
# q + 16 for the types with an offset), q + 128 (Q8_0).
cdef inline __m256i load_u(const lblock* wb) noexcept nogil:
    if lblock is block_q8_0:
        return _mm256_xor_si256(_mm256_loadu_si256(<const __m256i*>wb.qs), _mm256_set1_epi8(-128))
    elif lblock is block_q4_0 or lblock is block_q4_1:
        return unpack_nibbles(wb.qs)
    else:
        return _mm256_or_si256(unpack_nibbles(wb.qs),
                               _mm256_and_si256(unpack_bits(wb.qh), _mm256_set1_epi8(0x10)))


# Row `w` (nb blocks) into slot r of the records dst[0..nb).
cdef void repack_l(const plblock* w, Py_ssize_t nb, lrec* dst, int r) noexcept nogil:
    cdef Py_ssize_t b
    for b in range(nb):
        _mm256_storeu_si256(<__m256i*>dst[b].q[r], load_u(w + b))
        dst[b].d[r] = fp16(w[b].d)
        dst[b].m[r] = fp16(w[b].m)


# A slot with no row behind it (the last tile of a matrix whose row count is not a multiple of R): zeros,
# computed on and never stored.
cdef void repack_l_empty(Py_ssize_t nb, lrec* dst, int r) noexcept nogil:
    cdef Py_ssize_t b
    for b in range(nb):
        memset(dst[b].q[r], 0, 32)
        dst[b].d[r] = 0.0
        dst[b].m[r] = 0.0


# The scale products of one block for a tile: sc[t * 4 + r] = d_w[r] * d_x[t], and the min terms
# ms[t][r] += m_w[r] * s_x[t]. Two tokens per 256-bit multiply: dx8 and mv8 hold the 4 rows'
# d and m twice, [d0..d3, d0..d3], against [d_x(t) x 4, d_x(t+1) x 4]. The same products and sums in the
# same order as one SSE multiply per token (each lane is its own (row, token)), in half the multiplies:
# these share the two pipes that every dpbusd and FMA of the tile needs.
# ms01 holds the min terms of tokens 0 (low half) and 1, ms23 those of 2 and 3; an odd last token uses ms.
cdef inline void scale_products(const tshape* shape, __m256 dx8, __m256 mv8,
                                const block_q8a* yb, Py_ssize_t nb, float* sc, __m128* ms,
                                __m256* ms01, __m256* ms23) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef int t
    if T >= 2:
        _mm256_storeu_ps(sc, _mm256_mul_ps(dx8, _mm256_set_m128(_mm_set1_ps(yb[nb].d), _mm_set1_ps(yb[0].d))))
        # the min term, in block order: m_w * s_x rounded, then added
        ms01[0] = _mm256_add_ps(ms01[0], _mm256_mul_ps(mv8, _mm256_set_m128(
            _mm_set1_ps(yb[nb].s), _mm_set1_ps(yb[0].s))))
    if T >= 4:
        _mm256_storeu_ps(sc + 8, _mm256_mul_ps(dx8, _mm256_set_m128(
            _mm_set1_ps(yb[3 * nb].d), _mm_set1_ps(yb[2 * nb].d))))
        ms23[0] = _mm256_add_ps(ms23[0], _mm256_mul_ps(mv8, _mm256_set_m128(
            _mm_set1_ps(yb[3 * nb].s), _mm_set1_ps(yb[2 * nb].s))))
    if T % 2:
        t = T - 1
        _mm_storeu_ps(sc + t * 4, _mm_mul_ps(_mm256_castps256_ps128(dx8), _mm_set1_ps(yb[t * nb].d)))
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


# Where a prefill tile reads its R rows (as types, so that each ltile is compiled for one):
#   from_records: the repacked records w[0..nb) (lrec): many tokens;
#   from_blocks: the rows as stored, nb blocks apart (few tokens, n_tok <= RAW_TOK: unpacking a block where
#     it is used costs less than storing and reloading it); the scales converted 8 at a time from the 4
#     rows' fp16 (d, m) pairs, and the weights prefetched as in decode: they stream from memory once, and the
#     hardware prefetchers lose the thread of R interleaved rows.
ctypedef struct from_records:
    char unused
ctypedef struct from_blocks:
    char unused

ctypedef fused lsource:
    from_records
    from_blocks


# One prefill tile: R rows from w x T tokens starting at y (nb blocks apart); out[t * ldo + r] for
# r < nvalid.
#
# Per (row, token, block): one dpbusd, one int->float conversion and one FMA whose scale d_w * d_x comes
# as a broadcast from memory. Those products are made first, for SCH blocks at a time (scale_products),
# into the small buffer sc: broadcasting each from a register instead costs one or two shuffles per use,
# and Zen 4's shuffle pipes are shared with the multipliers and the conversions.
cdef void ltile(const plblock* tag, const tshape* shape, const lsource* src, const void* w,
                const block_q8a* y, Py_ssize_t nb, float* out, Py_ssize_t ldo, int nvalid) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef const lrec* rec = <const lrec*>w
    cdef const plblock* blk = <const plblock*>w
    cdef __m256 acc[4][MAXT]
    cdef __m128 ms[MAXT]
    cdef __m256 ms01 = _mm256_setzero_ps(), ms23 = _mm256_setzero_ps()
    cdef __m256i qx[4]
    cdef __m256i qy
    cdef __m256i zero = _mm256_setzero_si256()
    cdef __m256 dx8, mv8, dm
    cdef float sc[SCH * MAXT * 4]
    cdef const float* s
    cdef float mo[4]
    cdef int r, t
    cdef Py_ssize_t b, b0, b1
    cdef const char* pf = <const char*>(blk + PF_TILES * R * nb)
    cdef Py_ssize_t pfstep = R * sizeof(plblock)
    for t in range(T):
        ms[t] = _mm_setzero_ps()
        for r in range(R):
            acc[r][t] = _mm256_setzero_ps()
    b0 = 0
    while b0 < nb:
        b1 = min(nb, b0 + SCH)
        for b in range(b0, b1):
            if lsource is from_blocks:
                lc_prefetch_span(pf + b * pfstep, pfstep)
                # [d0, m0, d1, m1, d2, m2, d3, m3]
                dm = _mm256_cvtph_ps(_mm_set_epi32(
                    <int>load_u32(<const uint8_t*>(blk + 3 * nb + b)),
                    <int>load_u32(<const uint8_t*>(blk + 2 * nb + b)),
                    <int>load_u32(<const uint8_t*>(blk + nb + b)), <int>load_u32(<const uint8_t*>(blk + b))))
                dx8 = _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6))
                mv8 = _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7))
            else:
                dx8 = _mm256_broadcast_ps(<const __m128*>rec[b].d)
                mv8 = _mm256_broadcast_ps(<const __m128*>rec[b].m)
            scale_products(shape, dx8, mv8, y + b, nb, &sc[(b - b0) * MAXT * 4], ms, &ms01, &ms23)
        lc_spill(sc)
        for b in range(b0, b1):
            for r in range(R):
                if lsource is from_blocks:
                    qx[r] = load_u(blk + r * nb + b)
                else:
                    qx[r] = _mm256_loadu_si256(<const __m256i*>rec[b].q[r])
            for t in range(T):
                qy = _mm256_loadu_si256(<const __m256i*>y[t * nb + b].qs)
                s = &sc[((b - b0) * MAXT + t) * 4]
                for r in range(R):
                    acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(s[r]),
                                                _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(zero, qx[r], qy)), acc[r][t])
        b0 = b1
    for t in range(T):
        min_terms(shape, ms, ms01, ms23, t, mo)
        for r in range(nvalid):
            out[t * ldo + r] = hsum8(acc[r][t]) + mo[r]


# One decode tile: R rows (from the weights as stored) x 1 token. The scales as in mm_avx2.pyx's decode:
# [d, m] converted by F16C and multiplied by [d_x, s] (each lane the same single product as there), but for
# all R rows of the tile at once: one 8-lane conversion and multiply per block instead of R 4-lane ones, and
# the min terms of the R rows summed in one vector (lane 2r + 1 is row r's, added in block order).
cdef void ldec(const plblock* w, const rshape* shape, const block_q8a* y, Py_ssize_t nb,
               float* out) noexcept nogil:
    cdef int RR = nrows(shape)
    cdef __m256 acc[4]
    cdef __m128 ms[4]
    cdef __m256 ms8 = _mm256_setzero_ps()
    cdef __m256i qy
    cdef __m256i zero = _mm256_setzero_si256()
    cdef __m128 u, v
    cdef __m256 v8
    cdef const plblock* wb
    cdef const block_q8a* yb
    cdef int r
    cdef Py_ssize_t b
    cdef const char* pf = <const char*>(w + PF_TILES * RR * nb)
    cdef Py_ssize_t pfstep = RR * sizeof(plblock)
    for r in range(RR):
        acc[r] = _mm256_setzero_ps()
        ms[r] = _mm_setzero_ps()
    for b in range(nb):
        # decode streams the weights once: prefetch the tile PF_TILES ahead at the pace this one is read
        lc_prefetch_span(pf + b * pfstep, pfstep)
        yb = y + b
        qy = _mm256_loadu_si256(<const __m256i*>yb.qs)
        if rshape is row4:
            # [d0 d_x, m0 s, d1 d_x, m1 s, ...]: the token's [d_x, s] (8 bytes) in every pair of lanes
            v8 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_set_epi32(
                <int>load_u32(<const uint8_t*>(w + 3 * nb + b)), <int>load_u32(<const uint8_t*>(w + 2 * nb + b)),
                <int>load_u32(<const uint8_t*>(w + nb + b)), <int>load_u32(<const uint8_t*>(w + b)))),
                _mm256_castsi256_ps(_mm256_set1_epi64x(load_u64(<const uint8_t*>yb))))
            ms8 = _mm256_add_ps(ms8, v8)
            for r in range(4):
                acc[r] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(v8, _mm256_set1_epi32(2 * r)),
                                         _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(zero, load_u(w + r * nb + b), qy)),
                                         acc[r])
        else:
            u = _mm_castsi128_ps(_mm_loadl_epi64(<const __m128i*>yb))  # [d_x, s, 0, 0]
            for r in range(RR):
                wb = w + r * nb + b
                v = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(<int>load_u32(<const uint8_t*>wb))), u)
                acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(v),
                                         _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(zero, load_u(wb), qy)), acc[r])
                ms[r] = _mm_add_ps(ms[r], v)
    cdef float msum[8]
    if rshape is row4:
        _mm256_storeu_ps(msum, ms8)
    for r in range(RR):
        if rshape is row4:
            out[r] = hsum8(acc[r]) + msum[2 * r + 1]
        else:
            out[r] = hsum8(acc[r]) + _mm_cvtss_f32(_mm_movehdup_ps(ms[r]))
