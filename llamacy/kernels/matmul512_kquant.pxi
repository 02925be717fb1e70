# The AVX-512 VNNI prefill kernels of Q2_K and Q3_K, in the per-lane order (ACT_Q8K activations): repacking
# and tiles (Q4_K, Q5_K and Q6_K take the row-lane kernels of matmul512_klanes.pxi). Included by
# matmul512.pyx (compiled with its AVX-512 flags), whose types and constants it uses. The unpacked form is
# kunpack.pxd's, the dot mm_avx2.pyx's kdot:
#   value_j = d * sc_g * u_j - doff * off_g,  dot = d_x * (d * sum_g sc_g sum u q - doff * sum_g off_g bsum_g)

# One 256-value super-block of R rows, repacked: mm_avx2.pyx's kunpacked, for 4 rows.
ctypedef struct krec:
    uint8_t u[4][256]
    # per 32-value step j, what dpwssd multiplies step j's 16 int16 pair sums with: the scale of group 2j in
    # int16 lanes 0..7, of group 2j+1 in lanes 8..15 (expanded); or, with few tokens (n_tok <= COMPACT_TOK),
    # just the 16 scales, expanded step by step in ktile (one vpermw per row and step): 8 stores fewer per
    # row and super-block, which is what bounds the repacking, against 8 shuffles per row and super-block
    # per tile.
    int16_t scx[4][128]
    int16_t off[4][16]
    float d[4]
    float doff[4]



# How ktile finds the scales (see krec): as types, so that each ktile is compiled for one.
ctypedef struct scx_expanded:
    char unused
ctypedef struct scx_compact:
    char unused

ctypedef fused scxform:
    scx_expanded
    scx_compact



# The 16 group scales S (int16) -> scx: step j's vector is S[2j] x 8 then S[2j+1] x 8 (one vpermw).
cdef inline void expand_scales(__m256i S, int16_t* scx) noexcept nogil:
    cdef int j
    for j in range(8):
        _mm256_storeu_si256(<__m256i*>&scx[16 * j], _mm256_permutexvar_epi16(
            _mm256_setr_epi32(0x10001 * 2 * j, 0x10001 * 2 * j, 0x10001 * 2 * j, 0x10001 * 2 * j,
                              0x10001 * (2 * j + 1), 0x10001 * (2 * j + 1), 0x10001 * (2 * j + 1),
                              0x10001 * (2 * j + 1)), S))


# One super-block into slot r of record k: kunpack.pxd's form, the scales as krec keeps them.
cdef inline void unpack_kr(const k23block* b, krec* k, int r, bint expand) noexcept nogil:
    cdef __m256i S, O
    unpack_k(b, k.u[r], &S, &O, &k.d[r], &k.doff[r])
    _mm256_storeu_si256(<__m256i*>k.off[r], O)
    if not expand:
        _mm256_storeu_si256(<__m256i*>k.scx[r], S)
    else:
        expand_scales(S, k.scx[r])


cdef void repack_k(const k23block* w, Py_ssize_t nb, krec* dst, int r, bint expand) noexcept nogil:
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
# (= AVX2's maddubs, madd, add), then scaled into float accumulators exactly as mm_avx2.pyx's kdot.
cdef void ktile(const k23block* tag, const tshape* shape, const scxform* form, const krec* w,
                const block_q8k* y, Py_ssize_t nb, float* out, Py_ssize_t ldo, int nvalid) noexcept nogil:
    cdef int T = ntoks(shape)
    cdef bint same_d = k23block is block_q3_K
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
                if scxform is scx_expanded:
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
