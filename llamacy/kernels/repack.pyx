# Weights rewritten once, at load, into the layout their kernel reads fastest (model/repack.py decides
# which). One layout so far: Q4_0 in 8-row tiles (matmul512_x8.pxi's x8rec), 144 bytes per block of 8
# rows, the same bytes as the 8 stored rows, so tile i starts where row 8i did.
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy

from llamacy.kernels.parallel cimport parallel_for

import numpy as np

from llamacy.kernels.parallel import ensure_threads

# A Q4_0 block: fp16 scale, then 16 bytes of nibbles (values j and j + 16 in byte j).
cdef enum:
    Q4_0_BYTES = 18
    TILE_ROWS = 8
    REC_BYTES = TILE_ROWS * Q4_0_BYTES  # 2 bytes of scale and 16 of quants per row


ctypedef struct PackJob:
    const uint8_t* src
    uint8_t* dst
    Py_ssize_t nb          # blocks per row
    Py_ssize_t row_bytes


cdef void _pack_tiles(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    """Row tiles begin..end-1: per block, the 8 scales, then for each 4-byte group g of the quants the 8
    rows' bytes 4g..4g+3 side by side."""
    cdef PackJob* j = <PackJob*> ctx
    cdef Py_ssize_t i, b, r, g
    cdef const uint8_t* row
    cdef uint8_t* rec
    for i in range(begin, end):
        for b in range(j.nb):
            rec = j.dst + (i * j.nb + b) * REC_BYTES
            for r in range(TILE_ROWS):
                row = j.src + (i * TILE_ROWS + r) * j.row_bytes + b * Q4_0_BYTES
                memcpy(rec + 2 * r, row, 2)
                for g in range(4):
                    memcpy(rec + 16 + 32 * g + 4 * r, row + 2 + 4 * g, 4)


def q4_0_x8_fits(Py_ssize_t rows, Py_ssize_t cols) -> bool:
    """Whether a Q4_0 matrix of this shape can take the 8-row tile layout."""
    return rows > 0 and rows % TILE_ROWS == 0 and cols > 0 and cols % 32 == 0


def repack_q4_0_x8(data, Py_ssize_t rows, Py_ssize_t cols, int nthreads=1):
    """Q4_0 rows (uint8 buffer of rows * cols / 32 * 18 bytes or more) -> a new uint8 array in the 8-row
    tile layout, the same size."""
    if not q4_0_x8_fits(rows, cols):
        raise ValueError(f"a {rows} x {cols} matrix does not tile by {TILE_ROWS} rows of 32-value blocks")
    cdef const uint8_t[::1] src = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) \
        else data.reshape(-1).view(np.uint8)
    cdef Py_ssize_t nb = cols // 32, row_bytes = nb * Q4_0_BYTES
    if src.shape[0] < rows * row_bytes:
        raise ValueError(f"{src.shape[0]} bytes hold fewer than {rows} rows of {row_bytes}")
    out = np.empty(rows * row_bytes, dtype=np.uint8)
    cdef uint8_t[::1] dst = out
    cdef PackJob job
    job.src = &src[0]
    job.dst = &dst[0]
    job.nb = nb
    job.row_bytes = row_bytes
    nthreads = max(1, min(nthreads, ensure_threads(nthreads)))
    with nogil:
        parallel_for(_pack_tiles, &job, rows // TILE_ROWS, 1, nthreads)
    return out
