# The AVX2 matrix products (the `mm_simd` column of traits.pyx): Y[t, r] = dot(W row r, activation row t).
#
# Weights stay in their GGUF block format (read in place from the mmap); activations arrive quantized by
# quant.quantize_act_row (ACT_Q8A for the 32-value types, ACT_Q8K for the K-quants, ACT_F32 for float
# weights). The inner products are integer SIMD as in the reference engines: quants unpacked to unsigned
# bytes, _mm256_maddubs_epi16 (u8 x s8 -> pairs of int16) then _mm256_madd_epi16 (-> int32), converted to
# float once per block and scaled with one FMA.
#
# Work is cut into tiles of R weight rows x T tokens (tile_lg, tile_k, tile_f). A tile unpacks each weight
# block once and reuses it for its T tokens, and loads each activation block once for its R rows:
#   decode (n_tok == 1): DR rows x 1 token (a matvec), prefetching the weights a few tiles ahead;
#   prefill (n_tok > 1): PR rows x PT tokens, looping over token chunks of TCH inside a group of GR rows so
#   that the group's weight rows stay in L1 while a chunk of activations stays in L2.
# One walk (mm_avx2) serves every weight type but Q4_0, Q4_K, Q6_K and Q8_0; matmul.pyx splits the rows over the
# thread team. Nothing is allocated per call: the tiles live on the stack. In a portable build these compile
# against simd.h's plain-C intrinsics (for the tests); matmul runs the scalar twins (vecdot.pyx) there.
#
# Q4_0, Q4_K, Q6_K and Q8_0 (most of a Q4_0, Q4_K_M or Q8_0 file's bytes) take 8 rows a tile, one float lane a row
# (mm_avx2_x8.pxi and mm_avx2_kx8.pxi, included at the end): issue #29's row-lane float order, the VNNI
# kernels' bits.
from libc.stdint cimport int16_t, int32_t, uint8_t, uint16_t, uint32_t
from libc.stdio cimport fflush, fprintf, stderr
from libc.stdlib cimport abort
from libc.string cimport memcpy, memset

from llamacy.kernels.blocks cimport *
from llamacy.kernels.kunpack cimport k4_scales_mins, k45_quants, k6_values, move_bit, unpack_k
from llamacy.kernels.simd cimport *
from llamacy.kernels.values cimport fvalue, scale_min_k4

# Tile shapes (see the header comment). MAXR/MAXT bound the register arrays.
cdef enum:
    MAXR = 4
    MAXT = 4
    DR = 4      # decode: rows per tile
    PR = 2      # prefill: rows per tile
    PT = 4      # prefill: tokens per tile
    GR = 16     # prefill: rows per parallel work item
    TCH = 64    # prefill: tokens per chunk
    PF_TILES = 2  # decode: prefetch distance, in tiles

# Tile shapes as types, so that Cython emits one C function per (block type, shape) with R and T literal
# constants: the compiler then fully unrolls the r/t loops and keeps the accumulators in registers. (Left
# to itself it clones only some call sites and runs the others with the arrays in memory.)
ctypedef struct shape_dec:   # DR rows x 1 token
    char unused
ctypedef struct shape_pp:    # PR rows x PT tokens
    char unused
ctypedef struct shape_p1:    # PR rows x 1 token
    char unused
ctypedef struct shape_1p:    # 1 row x PT tokens
    char unused
ctypedef struct shape_11:    # 1 row x 1 token
    char unused

ctypedef fused tshape:
    shape_dec
    shape_pp
    shape_p1
    shape_1p
    shape_11


cdef inline int shape_rows(const tshape* s) noexcept nogil:
    if tshape is shape_dec:
        return DR
    elif tshape is shape_pp or tshape is shape_p1:
        return PR
    else:
        return 1


cdef inline int shape_toks(const tshape* s) noexcept nogil:
    if tshape is shape_pp or tshape is shape_1p:
        return PT
    else:
        return 1


# =========================================================================================================
# SIMD kernels for the 32-value types against ACT_Q8A.


# One weight block's quants as 32 bytes: unsigned 0..15 / 0..31 for the 4/5-bit types; for Q8_0 |q| (its
# signs go to sx: the sign trick, since maddubs wants one unsigned operand).
cdef inline __m256i load_qx(const lblock* wb, __m256i* sx) noexcept nogil:
    if lblock is block_q8_0:
        sx[0] = _mm256_loadu_si256(<const __m256i*>wb.qs)
        return _mm256_sign_epi8(sx[0], sx[0])
    elif lblock is block_q4_0 or lblock is block_q4_1:
        return unpack_nibbles(wb.qs)
    else:
        return _mm256_or_si256(unpack_nibbles(wb.qs),
                               _mm256_and_si256(unpack_bits(wb.qh), _mm256_set1_epi8(0x10)))


# maddubs of a row's quants with a token's quants: 16 int16 sums of adjacent products. The offsets of Q4_0
# (-8) and Q5_0 (-16) are taken off in integers with off = maddubs(8 or 16, qy), computed once per token
# block: exact, and no float offset term.
cdef inline __m256i prod16(const lblock* wb, __m256i qx, __m256i sx, __m256i qy, __m256i off) noexcept nogil:
    if lblock is block_q8_0:
        return _mm256_maddubs_epi16(qx, _mm256_sign_epi8(qy, sx))
    elif lblock is block_q4_0 or lblock is block_q5_0:
        return _mm256_sub_epi16(_mm256_maddubs_epi16(qx, qy), off)
    else:
        return _mm256_maddubs_epi16(qx, qy)


cdef inline __m256i token_offset(const lblock* wb, __m256i qy) noexcept nogil:
    if lblock is block_q4_0:
        return _mm256_maddubs_epi16(_mm256_set1_epi8(8), qy)
    elif lblock is block_q5_0:
        return _mm256_maddubs_epi16(_mm256_set1_epi8(16), qy)
    else:
        return qy  # unused


# One tile: R rows starting at w (rows nb blocks apart) x T tokens starting at y (nb blocks apart);
# out[t * ldo + r] = dot. R and T come from the shape type: constants in each generated C function.
#
# Scales: with one token (decode) the block's fp16 pair (d, m) is loaded as 32 bits, converted with one
# F16C op and multiplied by the activation's float pair (d_y, s) in one SSE mul, giving [d*d_y, m*s]:
# lane 0 scales the integer dot (broadcast + FMA), lane 1 is Q4_1/Q5_1's min term m * d_y * sum(qy),
# summed in a vector (for the other types the second half-word is unused). With several tokens, the row
# scale is broadcast once per block and multiplied per token, and the min term is a scalar FMA.
cdef void tile_lg(const lblock* w, const tshape* shape, const block_q8a* y, Py_ssize_t nb,
                  float* out, Py_ssize_t ldo) noexcept nogil:
    cdef int R = shape_rows(shape)
    cdef int T = shape_toks(shape)
    cdef __m256 acc[MAXR][MAXT]
    cdef float moff[MAXR][MAXT]
    cdef __m128 ms[MAXR]
    cdef __m256i qx[MAXR]
    cdef __m256i sx[MAXR]
    cdef __m256 dx[MAXR]
    cdef float mx[MAXR]
    cdef __m256i qy, p, off
    cdef __m256 dy
    cdef __m128 u, v
    cdef __m256i ones = _mm256_set1_epi16(1)
    cdef const lblock* wb
    cdef const block_q8a* yb
    cdef int r, t
    cdef Py_ssize_t b
    for r in range(R):
        if lblock is block_q4_1 or lblock is block_q5_1:
            ms[r] = _mm_setzero_ps()
        for t in range(T):
            acc[r][t] = _mm256_setzero_ps()
            moff[r][t] = 0.0
    cdef const char* pf = <const char*>(w + PF_TILES * R * nb)
    cdef Py_ssize_t pfstep = R * sizeof(lblock)
    if T == 1:
        for b in range(nb):
            # Decode streams the weights from memory once: prefetch the tile PF_TILES ahead at the pace
            # this one is read (R blocks' worth per step), so the loads below find it in cache.
            lc_prefetch_span(pf + b * pfstep, pfstep)
            yb = y + b
            qy = _mm256_loadu_si256(<const __m256i*>yb.qs)
            u = _mm_castsi128_ps(_mm_loadl_epi64(<const __m128i*>yb))  # [d_y, s, 0, 0]
            off = token_offset(w, qy)
            for r in range(R):
                wb = w + r * nb + b
                qx[r] = load_qx(wb, &sx[r])
                p = prod16(wb, qx[r], sx[r], qy, off)
                v = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(<int>load_u32(<const uint8_t*>wb))), u)
                acc[r][0] = _mm256_fmadd_ps(_mm256_broadcastss_ps(v),
                                            _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc[r][0])
                if lblock is block_q4_1 or lblock is block_q5_1:
                    ms[r] = _mm_add_ps(ms[r], v)
        for r in range(R):
            if lblock is block_q4_1 or lblock is block_q5_1:
                out[r] = hsum8(acc[r][0]) + _mm_cvtss_f32(_mm_movehdup_ps(ms[r]))
            else:
                out[r] = hsum8(acc[r][0])
        return
    for b in range(nb):
        for r in range(R):
            wb = w + r * nb + b
            qx[r] = load_qx(wb, &sx[r])
            dx[r] = _mm256_set1_ps(fp16(wb.d))
            if lblock is block_q4_1 or lblock is block_q5_1:
                mx[r] = fp16(wb.m)
        for t in range(T):
            yb = y + t * nb + b
            qy = _mm256_loadu_si256(<const __m256i*>yb.qs)
            dy = _mm256_set1_ps(yb.d)
            off = token_offset(w, qy)
            for r in range(R):
                p = prod16(w, qx[r], sx[r], qy, off)
                acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(dx[r], dy),
                                            _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), acc[r][t])
                if lblock is block_q4_1 or lblock is block_q5_1:
                    moff[r][t] += lc_no_contract(mx[r] * yb.s)  # as the VNNI path: no FMA
    for r in range(R):
        for t in range(T):
            out[t * ldo + r] = hsum8(acc[r][t]) + moff[r][t]


# =========================================================================================================
# SIMD kernels for the K-quants against ACT_Q8K: each weight super-block is unpacked once (kunpack.pxd's
# canonical form) and dotted with the tile's tokens.

ctypedef struct kunpacked:
    uint8_t u[256]
    int16_t scx[128]   # per 32-value step j: sc of group 2j in int16 lanes 0..7, of group 2j+1 in 8..15
    int16_t off[16]
    float d
    float doff


# The 16 group scales S (int16) -> scx: step j's vector is S[2j] x 8 then S[2j+1] x 8 (the dword holding
# both broadcast, then an in-lane byte shuffle keeps the low word in the low lane, the high in the high).
cdef inline void expand_scales(__m256i S, kunpacked* k) noexcept nogil:
    cdef __m256i mask = _mm256_set_epi64x(0x0302030203020302, 0x0302030203020302,
                                          0x0100010001000100, 0x0100010001000100)
    cdef int j
    for j in range(8):
        _mm256_storeu_si256(<__m256i*>&k.scx[16 * j],
                            _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(S, _mm256_set1_epi32(j)), mask))


cdef inline void unpack_kx(const kblock* b, kunpacked* k) noexcept nogil:
    cdef __m256i S, O
    unpack_k(b, k.u, &S, &O, &k.d, &k.doff)
    _mm256_storeu_si256(<__m256i*>k.off, O)
    expand_scales(S, k)


# acc += the dot of one unpacked super-block with one Q8_K block (8 float lanes, summed at the end).
cdef inline __m256 kdot(const kunpacked* k, const block_q8k* y, __m256 acc, bint same_d) noexcept nogil:
    cdef __m256i sumi = _mm256_setzero_si256()
    cdef __m256i p, o
    cdef int j
    for j in range(8):
        p = _mm256_maddubs_epi16(_mm256_loadu_si256(<const __m256i*>(k.u + 32 * j)),
                                 _mm256_loadu_si256(<const __m256i*>(y.qs + 32 * j)))
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_loadu_si256(<const __m256i*>&k.scx[16 * j])))
    o = _mm256_madd_epi16(_mm256_loadu_si256(<const __m256i*>k.off), _mm256_loadu_si256(<const __m256i*>y.bsums))
    if same_d:
        return _mm256_fmadd_ps(_mm256_set1_ps(k.d * y.d), _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi, o)), acc)
    acc = _mm256_fmadd_ps(_mm256_set1_ps(k.d * y.d), _mm256_cvtepi32_ps(sumi), acc)
    return _mm256_fnmadd_ps(_mm256_set1_ps(k.doff * y.d), _mm256_cvtepi32_ps(o), acc)


# Decode (one token) for Q4_K, Q5_K and Q6_K without the unpacked copy: each 32-value step's unsigned bytes
# and its scale vector are made in registers and dotted at once, instead of unpack_kx storing 256 bytes of
# quants and 256 of expanded scales that kdot then reloads. The int32 lanes of sumi and o are those of
# kdot (integer sums, exact in any order; the same 4 adjacent values per lane) and the float steps are
# kdot's, so the result is kdot's bit for bit.
cdef inline __m256i kstep_scale16(__m256i S, int s) noexcept nogil:
    # 16 int16 group scales S -> step s's vector: S[2s] in int16 lanes 0..7, S[2s+1] in 8..15 (as scx)
    cdef __m256i mask = _mm256_set_epi64x(0x0302030203020302, 0x0302030203020302,
                                          0x0100010001000100, 0x0100010001000100)
    return _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(S, _mm256_set1_epi32(s)), mask)


cdef inline __m256i kstep(__m256i sumi, __m256i u, const block_q8k* y, int s, __m256i sc) noexcept nogil:
    return _mm256_add_epi32(sumi, _mm256_madd_epi16(
        _mm256_maddubs_epi16(u, _mm256_loadu_si256(<const __m256i*>(y.qs + 32 * s))), sc))


cdef inline __m256 kdec(const kblock* b, const block_q8k* y, __m256 acc) noexcept nogil:
    cdef __m256i m4 = _mm256_set1_epi8(0x0F)
    cdef __m256i sumi = _mm256_setzero_si256()
    cdef __m256i S, O, v, a, c, hb, o
    cdef __m128i sm
    cdef float d, doff
    cdef int j, n
    cdef int32_t s32[8]
    if kblock is block_q4_K or kblock is block_q5_K:
        sm = k4_scales_mins(b.scales)
        S = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sm, sm))  # int32 lane s: sc_s twice
        _mm256_storeu_si256(<__m256i*>s32, S)  # broadcast back per step: loads, not shuffles
        O = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm))
        if kblock is block_q5_K:
            hb = _mm256_loadu_si256(<const __m256i*>b.qh)
        else:
            hb = _mm256_setzero_si256()  # Q4_K has no fifth bits
        for j in range(4):
            k45_quants(b, j, hb, &a, &c)
            sumi = kstep(sumi, a, y, 2 * j, _mm256_set1_epi32(s32[2 * j]))
            sumi = kstep(sumi, c, y, 2 * j + 1, _mm256_set1_epi32(s32[2 * j + 1]))
        d = fp16(b.d)
        doff = fp16(b.dmin)
        o = _mm256_madd_epi16(O, _mm256_loadu_si256(<const __m256i*>y.bsums))
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi), acc)
        return _mm256_fnmadd_ps(_mm256_set1_ps(doff * y.d), _mm256_cvtepi32_ps(o), acc)
    elif kblock is block_q6_K:
        S = _mm256_cvtepi8_epi16(_mm_loadu_si128(<const __m128i*>b.scales))
        O = _mm256_slli_epi16(S, 5)
        for n in range(2):
            a = _mm256_loadu_si256(<const __m256i*>(b.ql + 64 * n))
            c = _mm256_loadu_si256(<const __m256i*>(b.ql + 64 * n + 32))
            hb = _mm256_loadu_si256(<const __m256i*>(b.qh + 32 * n))
            sumi = kstep(sumi, _mm256_or_si256(_mm256_and_si256(a, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(hb, 4), _mm256_set1_epi8(0x30))),
                         y, 4 * n, kstep_scale16(S, 4 * n))
            sumi = kstep(sumi, _mm256_or_si256(_mm256_and_si256(c, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(hb, 2), _mm256_set1_epi8(0x30))),
                         y, 4 * n + 1, kstep_scale16(S, 4 * n + 1))
            sumi = kstep(sumi, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4),
                                               _mm256_and_si256(hb, _mm256_set1_epi8(0x30))),
                         y, 4 * n + 2, kstep_scale16(S, 4 * n + 2))
            sumi = kstep(sumi, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4),
                                               _mm256_and_si256(_mm256_srli_epi16(hb, 2), _mm256_set1_epi8(0x30))),
                         y, 4 * n + 3, kstep_scale16(S, 4 * n + 3))
        d = fp16(b.d)
        o = _mm256_madd_epi16(O, _mm256_loadu_si256(<const __m256i*>y.bsums))
        return _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi, o)), acc)
    return acc  # Q2_K/Q3_K: not used (tile_k keeps them on unpack_kx + kdot)


cdef void tile_k(const kblock* w, const tshape* shape, const block_q8k* y, Py_ssize_t nb,
                 float* out, Py_ssize_t ldo) noexcept nogil:
    cdef int R = shape_rows(shape)
    cdef int T = shape_toks(shape)
    cdef bint same_d = kblock is block_q3_K or kblock is block_q6_K
    cdef kunpacked up[MAXR]
    cdef __m256 acc[MAXR][MAXT]
    cdef const char* pf = <const char*>(w + PF_TILES * R * nb)
    cdef Py_ssize_t pfstep = R * sizeof(kblock)
    cdef Py_ssize_t b
    cdef int r, t
    for r in range(R):
        for t in range(T):
            acc[r][t] = _mm256_setzero_ps()
    if T == 1 and (kblock is block_q4_K or kblock is block_q5_K or kblock is block_q6_K):
        for b in range(nb):  # decode: prefetch the weights PF_TILES tiles ahead (see tile_lg)
            lc_prefetch_span(pf + b * pfstep, pfstep)
            for r in range(R):
                acc[r][0] = kdec(w + r * nb + b, y + b, acc[r][0])
        for r in range(R):
            out[r] = hsum8(acc[r][0])
        return
    for b in range(nb):
        if T == 1:  # decode: prefetch the weights PF_TILES tiles ahead (see tile_lg)
            lc_prefetch_span(pf + b * pfstep, pfstep)
        for r in range(R):
            unpack_kx(w + r * nb + b, &up[r])
        for t in range(T):
            for r in range(R):
                acc[r][t] = kdot(&up[r], y + t * nb + b, acc[r][t], same_d)
    for r in range(R):
        for t in range(T):
            out[t * ldo + r] = hsum8(acc[r][t])


# =========================================================================================================
# SIMD kernels for float weights (F32, F16, BF16) against ACT_F32.


cdef inline __m256 load8(const fblock* p) noexcept nogil:
    if fblock is float:
        return _mm256_loadu_ps(p)
    elif fblock is block_f16:
        return _mm256_cvtph_ps(_mm_loadu_si128(<const __m128i*>p))
    else:  # bf16: the upper half of a float
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(<const __m128i*>p)), 16))


cdef void tile_f(const fblock* w, const tshape* shape, const float* x, Py_ssize_t cols,
                 float* out, Py_ssize_t ldo) noexcept nogil:
    cdef int R = shape_rows(shape)
    cdef int T = shape_toks(shape)
    cdef __m256 acc[MAXR][MAXT]
    cdef __m256 wv[MAXR]
    cdef __m256 xv
    cdef float tail
    cdef int r, t
    cdef Py_ssize_t k, k8 = cols - cols % 8
    for r in range(R):
        for t in range(T):
            acc[r][t] = _mm256_setzero_ps()
    cdef const char* pf = <const char*>(w + PF_TILES * R * cols)
    for k in range(0, k8, 8):
        if T == 1:  # decode streams the weights: prefetch PF_TILES tiles ahead (see tile_lg)
            lc_prefetch_span(pf + R * k * sizeof(fblock), R * 8 * <Py_ssize_t>sizeof(fblock))
        for r in range(R):
            wv[r] = load8(w + r * cols + k)
        for t in range(T):
            xv = _mm256_loadu_ps(x + t * cols + k)
            for r in range(R):
                acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t])
    for r in range(R):
        for t in range(T):
            tail = 0.0
            for k in range(k8, cols):
                tail += fvalue(w + r * cols + k) * x[t * cols + k]
            out[t * ldo + r] = hsum8(acc[r][t]) + tail


# =========================================================================================================
# The walk over tiles, one for every weight type: rows in groups, tokens in chunks, each tile the shape's
# R rows x T tokens.


# Values per weight block.
cdef inline Py_ssize_t block_values(const wblock* tag) noexcept nogil:
    if wblock is float or wblock is block_f16 or wblock is block_bf16:
        return 1
    elif wblock is block_q2_K or wblock is block_q3_K or wblock is block_q4_K or wblock is block_q5_K \
            or wblock is block_q6_K:
        return QK_K
    else:
        return 32


# One tile of any type: rows from w (n blocks apart) x tokens from t0 of the activation matrix X.
cdef inline void tile(const wblock* w, const tshape* shape, const void* X, Py_ssize_t t0, Py_ssize_t n,
                      float* out, Py_ssize_t ldo) noexcept nogil:
    if wblock is float or wblock is block_f16 or wblock is block_bf16:
        tile_f(w, shape, <const float*>X + t0 * n, n, out, ldo)
    elif wblock is block_q2_K or wblock is block_q3_K or wblock is block_q4_K or wblock is block_q5_K \
            or wblock is block_q6_K:
        tile_k(w, shape, <const block_q8k*>X + t0 * n, n, out, ldo)
    else:
        tile_lg(w, shape, <const block_q8a*>X + t0 * n, n, out, ldo)


# Decode: rows [g*DR, g*DR + DR) against one token.
cdef inline void decode_group(const wblock* W, Py_ssize_t rows, Py_ssize_t n, const void* X,
                              float* Y, Py_ssize_t g) noexcept nogil:
    cdef Py_ssize_t r = g * DR
    if r + DR <= rows:
        tile(W + r * n, <const shape_dec*>NULL, X, 0, n, Y + r, 1)
    else:
        while r < rows:
            tile(W + r * n, <const shape_11*>NULL, X, 0, n, Y + r, 1)
            r += 1


# Row-count tags for token_tiles: PR rows (shapes pp, p1) or 1 row (shapes 1p, 11).
ctypedef struct rows_pr:
    char unused
ctypedef struct rows_1:
    char unused

ctypedef fused rtag:
    rows_pr
    rows_1


# The rows of one tile row (from w) against tokens [t0, t1): tiles of PT tokens, then one token at a time.
cdef inline void token_tiles(const wblock* w, const rtag* rows, const void* X, Py_ssize_t t0, Py_ssize_t t1,
                             Py_ssize_t n, float* Y, Py_ssize_t ldy, Py_ssize_t r) noexcept nogil:
    cdef Py_ssize_t t = t0
    while t + PT <= t1:
        if rtag is rows_pr:
            tile(w, <const shape_pp*>NULL, X, t, n, Y + t * ldy + r, ldy)
        else:
            tile(w, <const shape_1p*>NULL, X, t, n, Y + t * ldy + r, ldy)
        t += PT
    while t < t1:
        if rtag is rows_pr:
            tile(w, <const shape_p1*>NULL, X, t, n, Y + t * ldy + r, ldy)
        else:
            tile(w, <const shape_11*>NULL, X, t, n, Y + t * ldy + r, ldy)
        t += 1


# Prefill: rows [g*GR, g*GR + GR) against all tokens, chunk by chunk of TCH tokens, so that the group's
# weights stay in L1 and the chunk's activations in L2.
cdef inline void prefill_group(const wblock* W, Py_ssize_t rows, Py_ssize_t n, const void* X,
                               Py_ssize_t n_tok, float* Y, Py_ssize_t ldy, Py_ssize_t g) noexcept nogil:
    cdef Py_ssize_t r0 = g * GR
    cdef Py_ssize_t r1 = min(rows, r0 + GR)
    cdef Py_ssize_t t0 = 0, t1, r
    while t0 < n_tok:  # (a C loop: range() with a non-literal step would be a Python loop)
        t1 = min(n_tok, t0 + TCH)
        r = r0
        while r + PR <= r1:
            token_tiles(W + r * n, <const rows_pr*>NULL, X, t0, t1, n, Y, ldy, r)
            r += PR
        while r < r1:
            token_tiles(W + r * n, <const rows_1*>NULL, X, t0, t1, n, Y, ldy, r)
            r += 1
        t0 = t1


cdef void mm_avx2(const wblock* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                  float* Y, Py_ssize_t ldy) noexcept nogil:
    cdef Py_ssize_t n = cols // block_values(W)
    cdef Py_ssize_t g, ngroups
    if n_tok == 1:
        ngroups = (rows + DR - 1) // DR
        for g in range(ngroups):
            decode_group(W, rows, n, X, Y, g)
    else:
        ngroups = (rows + GR - 1) // GR
        for g in range(ngroups):
            prefill_group(W, rows, n, X, n_tok, Y, ldy, g)


include "mm_avx2_x8.pxi"
include "mm_avx2_kx8.pxi"
