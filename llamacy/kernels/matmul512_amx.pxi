# Prefill on Intel AMX: the row-lane products with each block's integer sums made by the tile unit, 16 rows
# x 16 tokens at a time, for the legacy types and Q4_K, Q5_K, Q6_K, stored or repacked at load. Included by
# matmul512.pyx last: it uses the records, repacking and VNNI tiles of the files before it. mm512_lanes,
# mm512_klanes and the 8-row-tile products hand a call's whole 16-row records here (amx_lanes, amx_klanes,
# amx_x8, amx_kx8) when the tile unit is on and there are 16 tokens or more, and do the rows left over.
#
# Why. In the VNNI prefill tile, per 8 rows, token and 32 values, eight dpbusd make the block's exact integer
# sums and one conversion, multiply and FMA advance the float chain. One TDPBSSD makes those integers for 16
# tokens x 16 rows x 32 values at once, leaving the float steps (a 512-bit conversion, multiply and FMA per
# token and block for 16 rows) as most of the work: 2.1-2.3x the VNNI prefill's speed for Q4_0 and Q8_0 in a
# 2048 x 8192 product of 512 tokens on one core.
#
# Q4_K and Q6_K go further (amx.h: lc_k4amxrec, lc_k3amxrec): each packed record has its sub-block scales
# folded into the quants, split so that every product still fits a signed byte (Q4_K: the 6-bit scale as
# 8 hi + lo; Q6_K: the signed scale's three balanced base-7 digits, the values made signed). The tile unit
# then sums a whole super-block per (token, row), 64 values per step, and the int32 multiplies by the scales
# that followed each sub-block's tile (one vpmulld per 16 tokens x 16 rows) are gone.
# A 2048 x 8192 product of 512 tokens on one core (ad-hoc loop, an Intel Xeon with AMX): Q4_K 38.5 -> 28-30
# ms, Q6_K 58 -> 35 ms. The integers are the same, so the bits are too. Q5_K keeps one tile step per sub-block
# (amx.h's lc_amx_k5_tile says why).
#
# How. Two 8-row records as the VNNI prefill makes them (repack_lanes, repack_klanes, or expanded from the
# 8-row tiles) are packed into one 16-row record (lc_amxrec, lc_kamxrec: amx.h; the K-quants' then scaled),
# whose blocks are the tile unit's B operand as they lie; the tokens' quants are its A operand where they lie
# (16 rows, nb blocks apart). The tiles themselves are C (amx.h: lc_amx_lanes_tile, lc_amx_k4_tile,
# lc_amx_k5_tile, lc_amx_k6_tile).
#
# Blocking. At hundreds of tokens the activations stream from L3; with one 16-row record per pass over them
# they would be read rows/16 times, faster than L3 feeds a core at the tile unit's pace. So a pass packs
# AMX_PAIRS records (64 rows: 0.2-1.6 MB, in L2) and each run of 16 tokens goes through all of them while
# its activations are in L2 (Q4_K's tiles take two runs at once). The last n_tok % 16 tokens of a pass read
# the rows as stored (the few-token tiles, or the 8-row tiles as they are).
#
# Float order: the VNNI kernels', bit for bit. The tile unit's int32 sums are exact, the very integers the
# dpbusd chains make (the quants enter signed, so the offset those chains take out through their seeds is
# taken out of the packed quants instead); per (row, token) the float steps are the same operations on the
# same values in the same order, one row per lane (which lane changes nothing). So AMX on or off, any thread
# count, decode or prefill, a sequence alone or batched: the same bits (tests/test_kernels_amx.py).


# The tiles (amx.h) read the activation blocks through their own declaration of them: the same layout.
assert sizeof(lc_q8a) == sizeof(block_q8a) and sizeof(lc_q8k) == sizeof(block_q8k)


# Records rec0 (rows 0-7) and rec1 (rows 8-15), nb blocks each, as one 16-row record per block.
cdef void amx_pack_lanes(const laneblock* tag, const lanerec* rec0, const lanerec* rec1, Py_ssize_t nb,
                         lc_amxrec* dst) noexcept nogil:
    cdef __m256i c = _mm256_set1_epi8(<char>lane_offset(tag))
    cdef Py_ssize_t b
    cdef int g
    for b in range(nb):
        for g in range(8):
            _mm256_storeu_si256(<__m256i*>&dst[b].q[g][0],
                                _mm256_sub_epi8(_mm256_loadu_si256(<const __m256i*>rec0[b].q[g]), c))
            _mm256_storeu_si256(<__m256i*>&dst[b].q[g][32],
                                _mm256_sub_epi8(_mm256_loadu_si256(<const __m256i*>rec1[b].q[g]), c))
        memcpy(&dst[b].d[0], rec0[b].d, 8 * sizeof(float))
        memcpy(&dst[b].d[8], rec1[b].d, 8 * sizeof(float))
        if laneblock is block_q4_1 or laneblock is block_q5_1:
            memcpy(&dst[b].m[0], rec0[b].m, 8 * sizeof(float))
            memcpy(&dst[b].m[8], rec1[b].m, 8 * sizeof(float))


cdef void amx_pack_klanes(const klblock* tag, const klanerec* rec0, const klanerec* rec1, Py_ssize_t nb,
                          lc_kamxrec* dst) noexcept nogil:
    cdef Py_ssize_t b
    cdef int s
    for b in range(nb):
        for s in range(64):
            memcpy(&dst[b].u[s][0], rec0[b].u[s], 32)
            memcpy(&dst[b].u[s][32], rec1[b].u[s], 32)
        for s in range(16):
            memcpy(&dst[b].sc[s][0], rec0[b].sc[s], 8 * sizeof(int32_t))
            memcpy(&dst[b].sc[s][8], rec1[b].sc[s], 8 * sizeof(int32_t))
        for s in range(8):
            memcpy(&dst[b].pr[s][0], rec0[b].pr[s], 8 * sizeof(int32_t))
            memcpy(&dst[b].pr[s][8], rec1[b].pr[s], 8 * sizeof(int32_t))
        memcpy(&dst[b].d[0], rec0[b].d, 8 * sizeof(float))
        memcpy(&dst[b].d[8], rec1[b].d, 8 * sizeof(float))
        if klblock is block_q4_K or klblock is block_q5_K:
            memcpy(&dst[b].dmin[0], rec0[b].dmin, 8 * sizeof(float))
            memcpy(&dst[b].dmin[8], rec1[b].dmin, 8 * sizeof(float))


# ---- drivers


# The legacy types: rows [0, 16 * (rows // 16)) of W (nb blocks each) against the n_tok >= AMX_TOK tokens of
# X; returns how many rows it did (0 where no scratch memory could be had); the caller does the rest.
cdef Py_ssize_t amx_lanes(const laneblock* W, Py_ssize_t rows, Py_ssize_t nb, const block_q8a* X,
                          Py_ssize_t n_tok, float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t npairs = rows // 16
    cdef Py_ssize_t nfull = n_tok - n_tok % AMX_TOK
    cdef bint with_min = laneblock is block_q4_1 or laneblock is block_q5_1
    cdef Py_ssize_t p0, p, n, t, r
    cdef lanerec* tmp
    cdef lc_amxrec* abuf
    if npairs == 0:
        return 0
    tmp = <lanerec*>lc_scratch(2 * nb * sizeof(lanerec) + AMX_PAIRS * nb * sizeof(lc_amxrec))
    if tmp == NULL:
        return 0
    abuf = <lc_amxrec*>(tmp + 2 * nb)
    lc_amx_config()
    p0 = 0
    while p0 < npairs:
        n = min(<Py_ssize_t>AMX_PAIRS, npairs - p0)
        for p in range(n):
            r = (p0 + p) * 16
            repack_lanes(W + r * nb, LR, nb, tmp)
            repack_lanes(W + (r + LR) * nb, LR, nb, tmp + nb)
            amx_pack_lanes(W, tmp, tmp + nb, nb, abuf + p * nb)
        t = 0
        while t < nfull:
            for p in range(n):
                lc_amx_lanes_tile(abuf + p * nb, <const lc_q8a*>(X + t * nb), nb, Y + t * ldy + (p0 + p) * 16,
                                  ldy, 16, with_min)
            t += AMX_TOK
        if nfull < n_tok:
            lanes_raw(W + p0 * 16 * nb, n * 16, nb, X + nfull * nb, n_tok - nfull, Y + nfull * ldy + p0 * 16, ldy)
        p0 += n
    lc_amx_release()
    return npairs * 16


# Q4_K, Q5_K, Q6_K: as amx_lanes.
cdef Py_ssize_t amx_klanes(const klblock* W, Py_ssize_t rows, Py_ssize_t nb, const block_q8k* X, Py_ssize_t n_tok,
                           float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t npairs = rows // 16
    cdef Py_ssize_t nfull = n_tok - n_tok % AMX_TOK
    cdef Py_ssize_t pairs_bytes = 0  # Q6_K takes the tokens' bsums as they are
    cdef Py_ssize_t p0, p, n, r
    cdef char* scratch
    cdef int32_t* pairs
    cdef klanerec* tmp
    cdef lc_kamxrec* abuf
    cdef void* sbuf
    if npairs == 0:
        return 0
    if klblock is block_q4_K or klblock is block_q5_K:
        pairs_bytes = (4 * n_tok * nb * <Py_ssize_t>sizeof(int32_t) + 63) // 64 * 64
    scratch = <char*>lc_scratch(pairs_bytes + 2 * nb * sizeof(klanerec) + amx_kbuf_bytes(W, nb))
    if scratch == NULL:
        return 0
    pairs = <int32_t*>scratch
    if klblock is block_q4_K or klblock is block_q5_K:
        ktoken_pairs(X, n_tok * nb, pairs)
    tmp = <klanerec*>(scratch + pairs_bytes)
    abuf = <lc_kamxrec*>(tmp + 2 * nb)
    sbuf = <void*>(abuf + nb)
    amx_kconfig(W)
    p0 = 0
    while p0 < npairs:
        n = min(<Py_ssize_t>AMX_PAIRS, npairs - p0)
        for p in range(n):
            r = (p0 + p) * 16
            repack_klanes(W + r * nb, LR, nb, tmp)
            repack_klanes(W + (r + LR) * nb, LR, nb, tmp + nb)
            amx_pack_krecord(W, tmp, nb, abuf, sbuf, p)
        amx_klanes_runs(W, abuf, sbuf, n, X, pairs, nfull, nb, Y + p0 * 16, ldy)
        if nfull < n_tok:
            klanes_raw(W + p0 * 16 * nb, n * 16, nb, X + nfull * nb, n_tok - nfull, Y + nfull * ldy + p0 * 16, ldy)
        p0 += n
    lc_amx_release()
    return npairs * 16


# The K-quants' pass buffers: Q5_K keeps AMX_PAIRS 16-row records (lc_kamxrec, nb super-blocks each) at abuf;
# Q4_K and Q6_K pack each record at abuf first and keep its scaled form (lc_k4amxrec, lc_k3amxrec: the
# sub-block scales folded into the quants, amx.h) at sbuf, after it.
cdef inline size_t amx_kbuf_bytes(const klblock* tag, Py_ssize_t nb) noexcept nogil:
    if klblock is block_q4_K:
        return nb * sizeof(lc_kamxrec) + AMX_PAIRS * nb * sizeof(lc_k4amxrec)
    elif klblock is block_q6_K:
        return nb * sizeof(lc_kamxrec) + AMX_PAIRS * nb * sizeof(lc_k3amxrec)
    else:
        return AMX_PAIRS * nb * sizeof(lc_kamxrec)


# The tile roles of a K-quant product call.
cdef inline void amx_kconfig(const klblock* tag) noexcept nogil:
    if klblock is block_q5_K:
        lc_amx_config()
    else:
        lc_amx_config_k()


# The two 8-row records at tmp (rows 0-7, 8-15) as record p of the pass.
cdef inline void amx_pack_krecord(const klblock* tag, const klanerec* tmp, Py_ssize_t nb, lc_kamxrec* abuf,
                                  void* sbuf, Py_ssize_t p) noexcept nogil:
    if klblock is block_q4_K:
        amx_pack_klanes(tag, tmp, tmp + nb, nb, abuf)
        lc_amx_pack_k4(abuf, nb, <lc_k4amxrec*>sbuf + p * nb)
    elif klblock is block_q6_K:
        amx_pack_klanes(tag, tmp, tmp + nb, nb, abuf)
        lc_amx_pack_k6(abuf, nb, <lc_k3amxrec*>sbuf + p * nb)
    else:
        amx_pack_klanes(tag, tmp, tmp + nb, nb, abuf + p * nb)


# Tokens [0, nfull) (a multiple of AMX_TOK) of the n 16-row records of the pass (amx_kbuf_bytes), whose rows
# are Y's columns from 0.
cdef inline void amx_klanes_runs(const klblock* tag, const lc_kamxrec* abuf, const void* sbuf, Py_ssize_t n,
                                 const block_q8k* X, const int32_t* pairs, Py_ssize_t nfull, Py_ssize_t nb,
                                 float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t t, p
    cdef int nrun
    t = 0
    while t < nfull:
        if klblock is block_q4_K:
            nrun = 2 if nfull - t >= 2 * AMX_TOK else 1
            for p in range(n):
                lc_amx_k4_tile(<const lc_k4amxrec*>sbuf + p * nb, <const lc_q8k*>(X + t * nb), pairs + 4 * t * nb,
                               nb, Y + t * ldy + p * 16, ldy, 16, nrun)
            t += nrun * AMX_TOK
        elif klblock is block_q5_K:
            for p in range(n):
                lc_amx_k5_tile(abuf + p * nb, <const lc_q8k*>(X + t * nb), pairs + 4 * t * nb,
                               nb, Y + t * ldy + p * 16, ldy, 16)
            t += AMX_TOK
        else:
            for p in range(n):
                lc_amx_k6_tile(<const lc_k3amxrec*>sbuf + p * nb, <const lc_q8k*>(X + t * nb), nb,
                               Y + t * ldy + p * 16, ldy, 16)
            t += AMX_TOK


# Tiles rec[0..ntiles) (nb records each) into the row-lane records dst (lanerec, nb per tile), as
# repack_lanes makes them from the stored rows: the quants as x8_quants gives them (what load_u gives),
# scales and mins converted.
cdef void x8_expand_lanes(const x8any* rec, Py_ssize_t ntiles, Py_ssize_t nb, lanerec* dst) noexcept nogil:
    cdef __m256i wq[8]
    cdef Py_ssize_t i
    cdef int g
    for i in range(ntiles * nb):
        x8_quants(&rec[i], wq)
        for g in range(8):
            _mm256_storeu_si256(<__m256i*>dst[i].q[g], wq[g])
        _mm256_storeu_ps(dst[i].d, _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>rec[i].d)))
        if x8any is x8rec_min:
            _mm256_storeu_ps(dst[i].m, _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>rec[i].m)))


# Q4_0, Q4_1, Q5_0, Q8_0 repacked at load (x8rec, x8rec_min, x8rec_q5, x8rec_q8 tiles; rows a multiple of
# 8): as amx_lanes, the records expanded from the tiles.
cdef Py_ssize_t amx_x8(const x8any* rec, Py_ssize_t rows, Py_ssize_t nb, const block_q8a* X, Py_ssize_t n_tok,
                       float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t npairs = rows // 16
    cdef Py_ssize_t nfull = n_tok - n_tok % AMX_TOK
    cdef Py_ssize_t p0, p, n, t, i
    cdef lanerec* tmp
    cdef lc_amxrec* abuf
    cdef const block_q4_0* q4_0 = NULL
    cdef const block_q4_1* q4_1 = NULL
    cdef const block_q8_0* q8_0 = NULL
    cdef const block_q5_0* q5_0 = NULL
    if npairs == 0:
        return 0
    tmp = <lanerec*>lc_scratch(2 * nb * sizeof(lanerec) + AMX_PAIRS * nb * sizeof(lc_amxrec))
    if tmp == NULL:
        return 0
    abuf = <lc_amxrec*>(tmp + 2 * nb)
    lc_amx_config()
    p0 = 0
    while p0 < npairs:
        n = min(<Py_ssize_t>AMX_PAIRS, npairs - p0)
        for p in range(n):
            x8_expand_lanes(rec + 2 * (p0 + p) * nb, 2, nb, tmp)
            if x8any is x8rec:
                amx_pack_lanes(q4_0, tmp, tmp + nb, nb, abuf + p * nb)
            elif x8any is x8rec_q8:
                amx_pack_lanes(q8_0, tmp, tmp + nb, nb, abuf + p * nb)
            elif x8any is x8rec_q5:
                amx_pack_lanes(q5_0, tmp, tmp + nb, nb, abuf + p * nb)
            else:
                amx_pack_lanes(q4_1, tmp, tmp + nb, nb, abuf + p * nb)
        t = 0
        while t < nfull:
            for p in range(n):
                lc_amx_lanes_tile(abuf + p * nb, <const lc_q8a*>(X + t * nb), nb, Y + t * ldy + (p0 + p) * 16,
                                  ldy, 16, x8any is x8rec_min)
            t += AMX_TOK
        if nfull < n_tok:
            for i in range(2 * p0, 2 * (p0 + n)):
                x8_tokens(rec + i * nb, X, NULL, nfull, n_tok, nb, Y, ldy, i * LR, NULL)
        p0 += n
    lc_amx_release()
    return npairs * 16


# Q4_K, Q5_K and Q6_K repacked at load (kx8rec, kx8rec5, kx8rec6 tiles): as amx_klanes, the records
# expanded from the tiles.
cdef Py_ssize_t amx_kx8(const kx8any* rec, Py_ssize_t rows, Py_ssize_t nb, const block_q8k* X, Py_ssize_t n_tok,
                        float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t npairs = rows // 16
    cdef Py_ssize_t nfull = n_tok - n_tok % AMX_TOK
    cdef Py_ssize_t pairs_bytes = 0  # Q6_K takes the tokens' bsums as they are
    cdef Py_ssize_t p0, p, n, i
    cdef char* scratch
    cdef int32_t* pairs
    cdef klanerec* tmp
    cdef lc_kamxrec* abuf
    cdef void* sbuf
    cdef const block_q4_K* q4_k = NULL
    cdef const block_q5_K* q5_k = NULL
    cdef const block_q6_K* q6_k = NULL
    cdef size_t kbuf_bytes
    if npairs == 0:
        return 0
    if kx8any is kx8rec or kx8any is kx8rec5:
        pairs_bytes = (4 * n_tok * nb * <Py_ssize_t>sizeof(int32_t) + 63) // 64 * 64
    if kx8any is kx8rec:
        kbuf_bytes = amx_kbuf_bytes(q4_k, nb)
    elif kx8any is kx8rec5:
        kbuf_bytes = amx_kbuf_bytes(q5_k, nb)
    else:
        kbuf_bytes = amx_kbuf_bytes(q6_k, nb)
    scratch = <char*>lc_scratch(pairs_bytes + 2 * nb * sizeof(klanerec) + kbuf_bytes)
    if scratch == NULL:
        return 0
    pairs = <int32_t*>scratch
    if kx8any is kx8rec or kx8any is kx8rec5:
        ktoken_pairs(X, n_tok * nb, pairs)
    tmp = <klanerec*>(scratch + pairs_bytes)
    abuf = <lc_kamxrec*>(tmp + 2 * nb)
    sbuf = <void*>(abuf + nb)
    if kx8any is kx8rec:
        amx_kconfig(q4_k)
    elif kx8any is kx8rec5:
        amx_kconfig(q5_k)
    else:
        amx_kconfig(q6_k)
    p0 = 0
    while p0 < npairs:
        n = min(<Py_ssize_t>AMX_PAIRS, npairs - p0)
        for p in range(n):
            kx8_expand(rec + 2 * (p0 + p) * nb, 2, nb, tmp)
            if kx8any is kx8rec:
                amx_pack_krecord(q4_k, tmp, nb, abuf, sbuf, p)
            elif kx8any is kx8rec5:
                amx_pack_krecord(q5_k, tmp, nb, abuf, sbuf, p)
            else:
                amx_pack_krecord(q6_k, tmp, nb, abuf, sbuf, p)
        if kx8any is kx8rec:
            amx_klanes_runs(q4_k, abuf, sbuf, n, X, pairs, nfull, nb, Y + p0 * 16, ldy)
        elif kx8any is kx8rec5:
            amx_klanes_runs(q5_k, abuf, sbuf, n, X, pairs, nfull, nb, Y + p0 * 16, ldy)
        else:
            amx_klanes_runs(q6_k, abuf, sbuf, n, X, pairs, nfull, nb, Y + p0 * 16, ldy)
        if nfull < n_tok:
            for i in range(2 * p0, 2 * (p0 + n)):
                kx8_tokens(rec + i * nb, X, pairs, nfull, n_tok, nb, Y, ldy, i * LR, NULL)
        p0 += n
    lc_amx_release()
    return npairs * 16
