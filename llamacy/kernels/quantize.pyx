# Weight quantization for `llamacy convert`: whole tensors of float32 rows -> stored GGML blocks, and back.
#
# Distinct from quant.pyx (activations, quantized on every matmul): this runs once per tensor when a model
# file is written, and its output must be what the reference engine writes. The row quantizers are the
# traits table's from_float column (quantize_rows.pyx, ports of ggml's reference quantizers).
#
# Rows are independent, so a tensor is quantized with prange over rows (dynamic schedule: K-quant rows cost
# ~20x more than legacy ones, and tensors have from one row to hundreds of thousands).
from cython.parallel cimport prange
from libc.stdint cimport uint8_t
cimport openmp

import numpy as np

from llamacy.kernels.blocks cimport QK_K
from llamacy.kernels.traits cimport type_traits, type_traits_of

from llamacy.kernels.traits import row_bytes, type_ids

# Shapes and sizes are checked here, before any raw pointer is touched.


def _quantizable():
    cdef int t
    return frozenset(t for t in type_ids() if type_traits_of(t).from_float != NULL)


# The types with a quantizer in the traits table.
QUANTIZE_TYPES = _quantizable()


cdef int _threads(int n_threads, Py_ssize_t work):
    # `work` in units of ~1 ns. Below ~1 ms per thread, starting and joining the threads costs more than it
    # saves (and on a busy machine, a descheduled thread stalls the whole region at its barrier).
    cdef int nt = n_threads if n_threads > 0 else openmp.omp_get_max_threads()
    cdef Py_ssize_t useful = work // 1000000
    return <int>max(1, min(<Py_ssize_t>nt, useful))


def quantize(int wtype, x, out=None, int n_threads=0, impl="auto"):
    """Quantize float rows x[..., cols] to type `wtype` as ggml's reference quantizer does.

    Returns (or fills `out`, a C-contiguous uint8 array of the right size) the stored bytes as
    uint8[rows, row_bytes], rows = product of the leading dimensions (a 1-D x is one row).
    n_threads <= 0: OpenMP's default. impl: "auto" (K-quant searches 8 sub-blocks at a time) or "scalar"
    (one at a time, as ggml's code reads; for the tests: both give the same bytes).
    """
    if impl not in ("auto", "scalar"):
        raise ValueError(f"impl must be 'auto' or 'scalar', got {impl!r}")
    cdef bint lanes = impl == "auto"
    cdef const type_traits* tt = type_traits_of(wtype)
    if tt == NULL or tt.from_float == NULL:
        raise ValueError(f"cannot quantize to weight type {wtype}")
    arr = np.ascontiguousarray(x, dtype=np.float32)
    if arr.ndim == 0:
        raise ValueError("x must have at least one dimension")
    cdef Py_ssize_t cols = arr.shape[arr.ndim - 1]
    cdef Py_ssize_t rows = arr.size // cols if cols else 0
    cdef Py_ssize_t rb = row_bytes(wtype, cols)
    if out is None:
        out = np.empty((rows, rb), dtype=np.uint8)
    elif not (isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.flags.c_contiguous
              and out.size == rows * rb and out.flags.writeable):
        raise ValueError(f"out must be a writable C-contiguous uint8 array of {rows * rb} bytes")
    if rows == 0:
        return out
    cdef const float[:, ::1] xv = arr.reshape(rows, cols)
    cdef uint8_t[::1] ov = out.reshape(-1)
    cdef const float* xp = &xv[0, 0]
    cdef uint8_t* op = &ov[0]
    # A K-quant value costs ~50x a legacy one (the scale searches).
    cdef int nt = _threads(n_threads, rows * cols * (50 if tt.blck_size == QK_K else 1))
    # Enough rows per chunk to amortise scheduling (~16k values), few enough to balance the threads.
    cdef Py_ssize_t chunk = max(1, 16384 // cols)
    cdef Py_ssize_t r
    with nogil:
        if rows == 1 or nt == 1:
            for r in range(rows):
                tt.from_float(xp + r * cols, op + r * rb, cols, lanes)
        else:
            for r in prange(rows, schedule="dynamic", chunksize=chunk, num_threads=nt):
                tt.from_float(xp + r * cols, op + r * rb, cols, lanes)
    return out


def dequantize(int wtype, data, shape, int n_threads=0):
    """Stored rows of type `wtype` -> float32 of `shape` (last axis = values per row), with the traits
    table's to_float; rows in parallel on n_threads OpenMP threads (<= 0: OpenMP's default)."""
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    if not shape or any(s < 0 for s in shape):
        raise ValueError(f"bad shape {shape}")
    cdef Py_ssize_t cols = shape[len(shape) - 1]
    cdef Py_ssize_t rb = row_bytes(wtype, cols)
    cdef const type_traits* tt = type_traits_of(wtype)
    cdef Py_ssize_t rows = 1
    for s in shape[:len(shape) - 1]:
        rows *= s
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    if raw.shape[0] != rows * rb:
        raise ValueError(f"{rows} rows of {cols} values of type {wtype} need {rows * rb} bytes, "
                         f"got {raw.shape[0]}")
    out = np.empty((rows, cols), dtype=np.float32)
    if rows == 0:
        return out.reshape(shape)
    cdef const uint8_t[::1] rv = raw
    cdef float[:, ::1] ov = out
    cdef const uint8_t* rp = &rv[0]
    cdef float* op = &ov[0, 0]
    cdef int nt = _threads(n_threads, rows * cols)
    cdef Py_ssize_t chunk = max(1, 65536 // cols)
    cdef Py_ssize_t r
    with nogil:
        if rows == 1 or nt == 1:
            for r in range(rows):
                tt.to_float(rp + r * rb, op + r * cols, cols)
        else:
            for r in prange(rows, schedule="static", chunksize=chunk, num_threads=nt):
                tt.to_float(rp + r * rb, op + r * cols, cols)
    return out.reshape(shape)
