# The weight types the kernels compute with: one table, one row per GGML type (traits.pyx), the way
# ggml-cpu keeps type_traits_cpu[]. Every dispatch on a weight type (matmul, dequantize_row, act_format,
# quantize) reads it.

# (src, dst, n): n values, a whole number of blocks, stored -> float32.
ctypedef void (*to_float_fn)(const void* src, float* dst, Py_ssize_t n) noexcept nogil
# (dst, ...) float32 -> stored; lanes: the K-quant scale searches 8 sub-blocks at a time (same bytes).
ctypedef void (*from_float_fn)(const float* x, void* out, Py_ssize_t n, bint lanes) noexcept nogil
# The dot product of one stored row with one activation row of n values (the scalar twins).
ctypedef float (*vec_dot_fn)(const void* w, const void* x, Py_ssize_t n) noexcept nogil
# Y[t * ldy + r] = dot(W row r, activation row t) for r < rows, t < n_tok.
ctypedef void (*mm_fn)(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                       float* Y, Py_ssize_t ldy) noexcept nogil
# The same; returns 0 (and writes nothing) for a case it leaves to mm_simd.
ctypedef int (*mm_try_fn)(const void* W, Py_ssize_t rows, Py_ssize_t cols, const void* X, Py_ssize_t n_tok,
                          float* Y, Py_ssize_t ldy) noexcept nogil

ctypedef struct type_traits:
    const char* name
    Py_ssize_t blck_size    # values per block (1 for the float types); 0 marks a type without kernels
    Py_ssize_t type_size    # bytes per block
    int act                 # the activation format it multiplies with (blocks.pxd's ACT_*)
    to_float_fn to_float    # dequantize (dequant.pyx)
    from_float_fn from_float  # quantize as ggml's reference quantizer (quantize_rows.pyx)
    vec_dot_fn vec_dot      # scalar dot product (vecdot.pyx): the portable build's kernel
    mm_fn mm_simd           # AVX2 matrix product (mm_avx2.pyx)
    mm_fn mm_rows           # AVX2 matrix product over stored rows for matmul_rows (matmul.pxd): mm_simd,
                            # but the per-lane kernel where mm_simd gathers stored rows into row-lane tiles
    mm_try_fn mm_vnni       # AVX-512 VNNI matrix product (matmul512.pyx), where this CPU has one: filled
                            # by matmul512 when matmul loads it; NULL otherwise and for the float types

# The row of GGML type `wtype`; NULL if the kernels do not compute with it.
cdef const type_traits* type_traits_of(int wtype) noexcept nogil
# Weights repacked at load into 8-row tiles (repack.pyx writes them; model/repack.py decides which): a
# layout id per tiled format (0: the file's rows), and the one kernel that reads each, written by matmul512
# where it loads (matmul512_x8.pxi); NULL elsewhere, where nothing is repacked.
cdef enum:
    LAYOUT_STORED = 0
    LAYOUT_Q4_0_X8 = 1   # Q4_0, 144 bytes per 8 rows x 32 values (the 8 rows' bytes)
    LAYOUT_Q4_K_X8 = 2   # Q4_K, 1184 bytes per 8 rows x 256 values (8 x 148)
    LAYOUT_Q4_1_X8 = 3   # Q4_1, 160 bytes per 8 rows x 32 values (the 8 rows' bytes)
    LAYOUT_Q8_0_X8 = 4   # Q8_0, 272 bytes per 8 rows x 32 values (the 8 rows' bytes)
    LAYOUT_Q6_K_X8 = 5   # Q6_K, 1680 bytes per 8 rows x 256 values (8 x 210, the stored size)
    LAYOUT_Q5_0_X8 = 6   # Q5_0, 176 bytes per 8 rows x 32 values (the 8 rows' bytes)
    LAYOUT_Q5_K_X8 = 7   # Q5_K, 1440 bytes per 8 rows x 256 values (8 x 180)
    N_LAYOUTS = 8
# The kernel slot of a tiled layout; NULL for LAYOUT_STORED and unknown ids.
cdef mm_try_fn* layout_slot(int layout) noexcept nogil
# Bytes per row of `cols` values in a tiled layout (a tile of 8 rows is 8 times that); 0 if unknown.
cdef Py_ssize_t layout_row_bytes(int layout, Py_ssize_t cols) noexcept nogil
# For matmul512 only, to fill in its column.
cdef type_traits* writable_traits(int wtype) noexcept nogil
# Bytes of a row of `cols` values (a whole number of blocks) of the type of row `tt`.
cdef inline Py_ssize_t traits_row_bytes(const type_traits* tt, Py_ssize_t cols) noexcept nogil:
    return cols // tt.blck_size * tt.type_size

# Print one line naming `what` and the type to stderr and abort: a C-level call with a weight type that has
# no row is a bug in the caller (every Python surface and the model loader check the type first), and
# leaving its output unwritten would turn it into wrong numbers.
cdef void unknown_type(const char* what, int wtype) noexcept nogil
