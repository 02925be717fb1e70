# Weights rewritten once, at load, into the layout their kernel reads fastest (model/repack.py decides
# which): 8-row tiles, one per quantized type that has a tile kernel (matmul512_x8.pxi and
# matmul512_kx8.pxi state each layout; tests/test_repack.py states them again in numpy). Q4_0: 144 bytes per 8 rows x 32 values, the 8 stored
# blocks' bytes, so tile i starts where row 8i did; Q4_1 likewise, 160 bytes (its mins beside the scales).
# Q8_0: 272 bytes per 8 rows x 32 values, the quants made unsigned (q + 128, what dpbusd takes). Q5_0: 176
# bytes per 8 rows x 32 values (the 8 stored blocks' bytes): the scales, the fifth bits regrouped into one
# 32-bit byte mask per group of 4 values, the nibbles as Q4_0's.
# Q4_K: 1184 bytes per 8 rows x 256 values (148 a row: the 6-bit scales and mins unpacked to bytes). Q5_K:
# Q4_K's tile, then the fifth bits as one 32-bit byte mask per group of 4 values and sub-block, 1440 bytes
# (180 a row). Q6_K:
# 1680 bytes per 8 rows x 256 values, the stored size (quant bytes interleaved 4 at a time, as Q4_K's).
from libc.stdint cimport int64_t, uint8_t, uint32_t
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.string cimport memcpy, memset

from llamacy.kernels.blocks cimport T_Q4_0, T_Q4_1, T_Q4_K, T_Q5_0, T_Q5_K, T_Q6_K, T_Q8_0
from llamacy.kernels.parallel cimport lc_task_fn, parallel_for
from llamacy.kernels.traits cimport (
    LAYOUT_Q4_0_X8 as _Q4_0_X8, LAYOUT_Q4_1_X8 as _Q4_1_X8, LAYOUT_Q4_K_X8 as _Q4_K_X8, LAYOUT_Q5_0_X8 as _Q5_0_X8,
    LAYOUT_Q5_K_X8 as _Q5_K_X8, LAYOUT_Q6_K_X8 as _Q6_K_X8, LAYOUT_Q8_0_X8 as _Q8_0_X8,
    layout_row_bytes,
)
from llamacy.kernels.values cimport scale_min_k4

import numpy as np

from llamacy.kernels.parallel import ensure_threads

# The layout ids (traits.pxd), for Python.
LAYOUT_STORED = 0
LAYOUT_Q4_0_X8 = _Q4_0_X8
LAYOUT_Q4_K_X8 = _Q4_K_X8
LAYOUT_Q4_1_X8 = _Q4_1_X8
LAYOUT_Q8_0_X8 = _Q8_0_X8
LAYOUT_Q6_K_X8 = _Q6_K_X8
LAYOUT_Q5_0_X8 = _Q5_0_X8
LAYOUT_Q5_K_X8 = _Q5_K_X8

cdef enum:
    TILE_ROWS = 8
    Q4_0_BYTES = 18    # fp16 scale, 16 bytes of nibbles (values j and j + 16 in byte j)
    Q4_1_BYTES = 20    # fp16 scale, fp16 min, 16 bytes of nibbles
    Q8_0_BYTES = 34    # fp16 scale, 32 int8 quants
    Q5_0_BYTES = 22    # fp16 scale, 4 bytes of fifth bits (bit j: value j's), 16 bytes of nibbles as Q4_0's
    Q5_0_TILE = 176    # x8rec_q5: d 16, h 32, q 128
    Q5_0_H = 16
    Q5_0_Q = 48
    Q4_K_BYTES = 144   # fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
    Q4_K_TILE = 1184   # kx8rec: q 1024, sc 64, mn 64, d 16, dmin 16
    Q4_K_SC = 1024
    Q4_K_MN = 1088
    Q4_K_D = 1152
    Q4_K_DMIN = 1168
    Q5_K_BYTES = 176   # Q4_K's d, dmin and 12 bytes of scales and mins, 32 bytes of fifth bits (qh), 128 of nibbles
    Q5_K_TILE = 1440   # kx8rec5: kx8rec's 1184, then h 256
    Q6_K_BYTES = 210   # 128 bytes of low nibbles (ql), 64 of high bit pairs (qh), 16 int8 scales, fp16 d
    Q6_K_TILE = 1680   # kx8rec6: ql 1024, qh 512, sc 128, d 16
    Q6_K_QH = 1024
    Q6_K_SC = 1536
    Q6_K_D = 1664
    PIECE_BYTES = 1 << 20  # repack_many: most stored bytes per work item


ctypedef struct PackJob:
    const uint8_t* src
    uint8_t* dst
    Py_ssize_t nb          # blocks (Q4_K: super-blocks) per row
    Py_ssize_t row_bytes   # stored
    int has_min            # Q4_1: an fp16 min after each block's scale
    int k_quant            # 4: Q4_K, 5: Q5_K (_pack_q4_k); 6: Q6_K (_pack_q6_k); 50: Q5_0 (_pack_q5_0);
                           # 0: Q4_0 / Q4_1 / Q8_0 (_pack_legacy)
    int groups             # _pack_legacy: 4-byte groups of quants per block (Q4_0 and Q4_1 4, Q8_0 8)
    uint32_t flip          # _pack_legacy: xor on every 4 quant bytes (Q8_0: 0x80808080, q + 128)


cdef inline void _spread(uint8_t* dst, const uint8_t* src, Py_ssize_t groups, Py_ssize_t r,
                         uint32_t flip) noexcept nogil:
    """Row r's `groups` 4-byte groups from src into a tile's lanes: group m at dst + 32m + 4r, xor flip."""
    cdef Py_ssize_t m
    cdef uint32_t v
    for m in range(groups):
        memcpy(&v, src + 4 * m, 4)
        v ^= flip
        memcpy(dst + 32 * m + 4 * r, &v, 4)


cdef void _pack_legacy(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    """Row tiles begin..end-1 of Q4_0, Q4_1 or Q8_0: per block, the 8 scales (Q4_1: then the 8 mins), then
    for each 4-byte group g of the quants the 8 rows' bytes 4g..4g+3 side by side, xor j.flip (Q8_0: each
    byte plus 128, the unsigned operand of dpbusd)."""
    cdef PackJob* j = <PackJob*> ctx
    cdef Py_ssize_t i, b, r
    cdef Py_ssize_t head = 4 if j.has_min else 2  # stored: d (and m) before the quants
    cdef Py_ssize_t block = head + 4 * j.groups
    cdef Py_ssize_t quants = 8 * head  # in the tile: the 8 rows' d (and m) before the quants
    cdef const uint8_t* row
    cdef uint8_t* rec
    for i in range(begin, end):
        for b in range(j.nb):
            rec = j.dst + (i * j.nb + b) * TILE_ROWS * block
            for r in range(TILE_ROWS):
                row = j.src + (i * TILE_ROWS + r) * j.row_bytes + b * block
                memcpy(rec + 2 * r, row, 2)
                if j.has_min:
                    memcpy(rec + 16 + 2 * r, row + 2, 2)
                _spread(rec + quants, row + head, j.groups, r, j.flip)


cdef void _pack_q5_0(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    """Row tiles begin..end-1 of Q5_0: per block, the 8 scales; then h[g], g < 8: bit 4r+i is bit 4g+i of
    row r's qh (the fifth bit of the value whose low bits dpbusd group g takes in byte 4r+i); then the
    nibbles as Q4_0's."""
    cdef PackJob* j = <PackJob*> ctx
    cdef Py_ssize_t i, b, r, g
    cdef uint32_t qh
    cdef uint32_t h[8]
    cdef const uint8_t* row
    cdef uint8_t* rec
    for i in range(begin, end):
        for b in range(j.nb):
            rec = j.dst + (i * j.nb + b) * Q5_0_TILE
            for g in range(8):
                h[g] = 0
            for r in range(TILE_ROWS):
                row = j.src + (i * TILE_ROWS + r) * j.row_bytes + b * Q5_0_BYTES
                memcpy(rec + 2 * r, row, 2)
                memcpy(&qh, row + 2, 4)
                for g in range(8):
                    h[g] |= ((qh >> (4 * g)) & 0xF) << (4 * r)
                _spread(rec + Q5_0_Q, row + 6, 4, r, 0)
            memcpy(rec + Q5_0_H, h, 32)


cdef void _pack_q4_k(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    """Row tiles begin..end-1 of Q4_K or Q5_K (k_quant 5): per super-block, the 8 rows' 4-byte groups of qs
    side by side (32 bytes per group, 8 groups per 32 bytes of qs), their scales per sub-block, their mins
    in pairs of sub-blocks, then d and dmin; Q5_K then h[k][half][g]: bit 4r+i is bit 2k+half of row r's qh
    byte 4g+i."""
    cdef PackJob* j = <PackJob*> ctx
    cdef bint q5 = j.k_quant == 5
    cdef Py_ssize_t i, b, r, s, l, bit
    cdef Py_ssize_t qs = 48 if q5 else 16  # stored: d, dmin, 12 bytes of scales (Q5_K: then qh), then qs
    cdef uint32_t h[8][8]  # kx8rec5's h[4][2][8] as [2k + half][g]
    cdef const uint8_t* row
    cdef uint8_t* rec
    for i in range(begin, end):
        for b in range(j.nb):
            rec = j.dst + (i * j.nb + b) * (Q5_K_TILE if q5 else Q4_K_TILE)
            if q5:
                memset(h, 0, sizeof(h))
            for r in range(TILE_ROWS):
                row = j.src + (i * TILE_ROWS + r) * j.row_bytes + b * (Q5_K_BYTES if q5 else Q4_K_BYTES)
                memcpy(rec + Q4_K_D + 2 * r, row, 2)
                memcpy(rec + Q4_K_DMIN + 2 * r, row + 2, 2)
                for s in range(8):
                    scale_min_k4(s, row + 4, rec + Q4_K_SC + 8 * s + r,
                                  rec + Q4_K_MN + 16 * (s // 2) + 2 * r + s % 2)
                _spread(rec, row + qs, 32, r, 0)
                if q5:  # qh byte l = 4g + i: its bit 2k + half into h[2k + half][g], at bit 4r + i
                    for l in range(32):
                        for bit in range(8):
                            h[bit][l // 4] |= <uint32_t>((row[16 + l] >> bit) & 1) << (4 * r + l % 4)
            if q5:
                memcpy(rec + Q4_K_TILE, h, sizeof(h))


cdef void _pack_q6_k(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    """Row tiles begin..end-1: per super-block, the 8 rows' 4-byte groups of ql side by side (32 bytes per
    group), then of qh, then their scales in pairs of groups (row r's scales of groups 2k, 2k+1 at bytes
    2r, 2r+1 of pair k), then d."""
    cdef PackJob* j = <PackJob*> ctx
    cdef Py_ssize_t i, b, r, k
    cdef const uint8_t* row
    cdef uint8_t* rec
    for i in range(begin, end):
        for b in range(j.nb):
            rec = j.dst + (i * j.nb + b) * Q6_K_TILE
            for r in range(TILE_ROWS):
                row = j.src + (i * TILE_ROWS + r) * j.row_bytes + b * Q6_K_BYTES
                _spread(rec, row, 32, r, 0)
                _spread(rec + Q6_K_QH, row + 128, 16, r, 0)
                for k in range(8):
                    memcpy(rec + Q6_K_SC + 16 * k + 2 * r, row + 192 + 2 * k, 2)
                memcpy(rec + Q6_K_D + 2 * r, row + 208, 2)


def tile_layout(int wtype, Py_ssize_t rows, Py_ssize_t cols) -> int:
    """The tiled layout a matrix of this type and shape can take (LAYOUT_STORED: none)."""
    if rows <= 0 or rows % TILE_ROWS or cols <= 0:
        return LAYOUT_STORED
    if wtype == T_Q4_0 and cols % 32 == 0:
        return LAYOUT_Q4_0_X8
    if wtype == T_Q4_1 and cols % 32 == 0:
        return LAYOUT_Q4_1_X8
    if wtype == T_Q4_K and cols % 256 == 0:
        return LAYOUT_Q4_K_X8
    if wtype == T_Q8_0 and cols % 32 == 0:
        return LAYOUT_Q8_0_X8
    if wtype == T_Q6_K and cols % 256 == 0:
        return LAYOUT_Q6_K_X8
    if wtype == T_Q5_0 and cols % 32 == 0:
        return LAYOUT_Q5_0_X8
    if wtype == T_Q5_K and cols % 256 == 0:
        return LAYOUT_Q5_K_X8
    return LAYOUT_STORED


cdef extern from "sys/mman.h" nogil:
    int madvise(void* addr, size_t length, int advice)
    int MADV_DONTNEED

# Transparent huge pages are Linux's; elsewhere the advice is MADV_NORMAL, i.e. none.
cdef extern from *:
    """
    #include <sys/mman.h>
    #ifndef MADV_HUGEPAGE
    #define MADV_HUGEPAGE MADV_NORMAL
    #endif
    """
    int MADV_HUGEPAGE

cdef extern from "unistd.h" nogil:
    long sysconf(int name)
    int _SC_PAGESIZE


# One work item of repack_many: row tiles t0..t1-1 of matrix `job`; rel: give back the source pages of
# those rows once packed.
ctypedef struct Piece:
    Py_ssize_t job
    Py_ssize_t t0
    Py_ssize_t t1
    int rel


ctypedef struct ManyJob:
    PackJob* jobs          # per matrix
    Piece* pieces
    size_t page


cdef void _pack_pieces(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    """Pieces begin..end-1, each then releasing the whole pages of the rows it read (madvise DONTNEED:
    pages of a file mapping leave the resident set and stay in the page cache)."""
    cdef ManyJob* m = <ManyJob*> ctx
    cdef Piece* pc
    cdef PackJob* j
    cdef size_t a, b
    cdef Py_ssize_t i
    for i in range(begin, end):
        pc = &m.pieces[i]
        j = &m.jobs[pc.job]
        if j.k_quant == 4:
            _pack_q4_k(j, pc.t0, pc.t1, tid)
        elif j.k_quant == 6:
            _pack_q6_k(j, pc.t0, pc.t1, tid)
        elif j.k_quant == 5:
            _pack_q4_k(j, pc.t0, pc.t1, tid)
        elif j.k_quant == 50:
            _pack_q5_0(j, pc.t0, pc.t1, tid)
        else:
            _pack_legacy(j, pc.t0, pc.t1, tid)
        if pc.rel and m.page > 0:
            a = <size_t>(j.src + pc.t0 * TILE_ROWS * j.row_bytes)
            b = <size_t>(j.src + pc.t1 * TILE_ROWS * j.row_bytes)
            a = (a + m.page - 1) // m.page * m.page
            b = b // m.page * m.page
            if b > a:
                madvise(<void*>a, b - a, MADV_DONTNEED)


cdef inline const uint8_t[::1] _bytes_of(data):
    return data.reshape(-1).view(np.uint8) if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)


def _plan(int wtype, data, Py_ssize_t rows, Py_ssize_t cols):
    """(layout, blocks per row, stored row bytes, its bytes as uint8) of one matrix, its operands checked."""
    cdef int layout = tile_layout(wtype, rows, cols)
    if layout == LAYOUT_STORED:
        raise ValueError(f"a {rows} x {cols} matrix of type {wtype} does not tile by {TILE_ROWS} rows")
    nb = cols // 256 if layout in (LAYOUT_Q4_K_X8, LAYOUT_Q5_K_X8, LAYOUT_Q6_K_X8) else cols // 32
    row_bytes = nb * {LAYOUT_Q4_0_X8: Q4_0_BYTES, LAYOUT_Q4_1_X8: Q4_1_BYTES, LAYOUT_Q8_0_X8: Q8_0_BYTES,
                      LAYOUT_Q4_K_X8: Q4_K_BYTES, LAYOUT_Q6_K_X8: Q6_K_BYTES, LAYOUT_Q5_0_X8: Q5_0_BYTES,
                      LAYOUT_Q5_K_X8: Q5_K_BYTES}[layout]
    src = _bytes_of(data)
    if src.shape[0] < rows * row_bytes:
        raise ValueError(f"{src.shape[0]} bytes hold fewer than {rows} rows of {row_bytes}")
    return layout, nb, row_bytes, src


# Huge pages: the tiles are streamed once a token, and on 4 KB pages a 1 GB model crosses 250,000 of them
# a token (a TLB walk each, and the hardware prefetchers stop at every page boundary).
cdef enum:
    HUGE = 2 << 20
    ALIGN = 64


def arena(sizes):
    """Fresh uint8 arrays of these sizes (64-byte aligned), views of one allocation that starts on a 2 MiB
    boundary and that the kernel is asked to back with transparent huge pages (MADV_HUGEPAGE: THP mode
    "madvise", the usual default, gives them only to ranges that ask). One allocation, not one per matrix:
    a matrix smaller than a huge page shares pages with its neighbours, and a large one has no edges left
    on small pages. Pages never written are never backed."""
    cdef Py_ssize_t total = 0, off, size, rounded
    starts = []
    for size in sizes:
        if size < 0:
            raise ValueError(f"negative size {size}")
        starts.append(total)
        total += (size + ALIGN - 1) // ALIGN * ALIGN
    rounded = (total + HUGE - 1) // HUGE * HUGE
    buf = np.empty(rounded + HUGE, dtype=np.uint8)
    cdef uint8_t[::1] view = buf
    cdef size_t addr = <size_t>&view[0]
    off = (HUGE - addr % HUGE) % HUGE
    if rounded:
        madvise(<void*>(addr + off), rounded, MADV_HUGEPAGE)  # advice only: refused, small pages serve
    return [buf[off + start:off + start + size] for start, size in zip(starts, sizes)]


def tiled_bytes(int wtype, Py_ssize_t rows, Py_ssize_t cols) -> int:
    """Bytes of a rows x cols matrix of wtype in its tile layout; 0 where it has none."""
    cdef int layout = tile_layout(wtype, rows, cols)
    return 0 if layout == LAYOUT_STORED else rows * layout_row_bytes(layout, cols)


def repack_tiles(int wtype, data, Py_ssize_t rows, Py_ssize_t cols, int nthreads=1):
    """Stored rows of `wtype` (a uint8 buffer of at least their bytes) -> (a new uint8 array in the
    layout, the layout id)."""
    return repack_many([(wtype, data, rows, cols, False)], nthreads)[0]


def repack_many(items, int nthreads=1, outs=None):
    """[(wtype, data, rows, cols, release)] -> [(a new uint8 array in the layout, the layout id)], in
    order. Every matrix is checked first, then all are packed in one pass over the thread team without the
    GIL (so a model's load can build its tokenizer meanwhile), in pieces of at most PIECE_BYTES of rows.
    release: `data` is a file mapping whose pages this process no longer needs once packed; each piece
    gives back the whole pages of its rows (the copy replaced them; reading them again would only fault
    them back in). outs: the destination arrays (uint8, each exactly the matrix's tiled bytes), made here
    (one arena) if None."""
    cdef Py_ssize_t n = len(items), n_pieces = 0, i, k, t, step, total
    if n == 0:
        return []
    plans = [_plan(wtype, data, rows, cols) for wtype, data, rows, cols, _ in items]  # their bytes alive
    sizes = [item[2] * layout_row_bytes(plan[0], item[3]) for plan, item in zip(plans, items)]
    if outs is None:
        outs = arena(sizes)
    elif len(outs) != n or any(o.dtype != np.uint8 or o.nbytes != size for o, size in zip(outs, sizes)):
        raise ValueError("the destination arrays do not match the matrices")
    steps = []
    for plan, item in zip(plans, items):
        step = max(1, PIECE_BYTES // (TILE_ROWS * plan[2]))
        steps.append(step)
        n_pieces += (item[2] // TILE_ROWS + step - 1) // step
    cdef PackJob* jobs = <PackJob*>PyMem_Malloc(n * sizeof(PackJob))
    cdef Piece* pieces = <Piece*>PyMem_Malloc(n_pieces * sizeof(Piece))
    cdef const uint8_t[::1] src
    cdef uint8_t[::1] dst
    cdef ManyJob many
    try:
        if jobs == NULL or pieces == NULL:
            raise MemoryError("no memory to plan the repacking")
        k = 0
        for i in range(n):
            layout, nb, row_bytes, src = plans[i]
            dst = outs[i]
            jobs[i].src = &src[0]
            jobs[i].dst = &dst[0]
            jobs[i].nb = nb
            jobs[i].row_bytes = row_bytes
            jobs[i].has_min = layout == LAYOUT_Q4_1_X8
            jobs[i].k_quant = {LAYOUT_Q4_K_X8: 4, LAYOUT_Q5_K_X8: 5, LAYOUT_Q6_K_X8: 6, LAYOUT_Q5_0_X8: 50}.get(layout, 0)
            jobs[i].groups = 8 if layout == LAYOUT_Q8_0_X8 else 4
            jobs[i].flip = 0x80808080u if layout == LAYOUT_Q8_0_X8 else 0
            total = items[i][2] // TILE_ROWS
            step = steps[i]
            for t in range(0, total, step):
                pieces[k].job = i
                pieces[k].t0 = t
                pieces[k].t1 = min(total, t + step)
                pieces[k].rel = bool(items[i][4])
                k += 1
        many.jobs = jobs
        many.pieces = pieces
        many.page = max(sysconf(_SC_PAGESIZE), 0)  # 0: unknown, nothing given back
        nthreads = max(1, min(nthreads, ensure_threads(nthreads)))
        with nogil:
            parallel_for(_pack_pieces, &many, n_pieces, 1, nthreads)
    finally:
        PyMem_Free(jobs)
        PyMem_Free(pieces)
    return [(out, plan[0]) for out, plan in zip(outs, plans)]
