# The traits table: one row per weight type the kernels compute with (see traits.pxd for the columns).
#
# Adding a weight type is: its block struct (and id) in blocks.pxd, its kernels (dequant.pyx,
# quantize_rows.pyx, vecdot.pyx, mm_avx2.pyx and, for a quantized type, matmul512.pyx, whose fill_traits
# writes the VNNI column) and one row below, with compute=True in ggml_types.TYPES. tests/test_traits.py
# walks the table and fails on a row that lacks an operation or disagrees with ggml_types.
from libc.stdio cimport fflush, fprintf, stderr
from libc.stdlib cimport abort

from llamacy.kernels.blocks cimport *
from llamacy.kernels.dequant cimport *
from llamacy.kernels.mm_avx2 cimport (
    mm_avx2, q4_0_rowlane_avx2, q4_0_x8_avx2, q4_k_rowlane_avx2, q4_k_x8_avx2, q6_k_rowlane_avx2, q6_k_x8_avx2,
    q8_0_rowlane_avx2, q8_0_x8_avx2,
)
from llamacy.kernels.quantize_rows cimport *
from llamacy.kernels.traits cimport from_float_fn, mm_fn, mm_try_fn, to_float_fn, type_traits, vec_dot_fn
from llamacy.kernels.simd cimport HAVE_SIMD
from llamacy.kernels.vecdot cimport *

from llamacy import ggml_types

cdef type_traits TRAITS[N_TYPE_IDS]
cdef mm_try_fn LAYOUT_KERNELS[N_LAYOUTS]  # avx2_layouts() below; matmul512 fills them all where VNNI is on


cdef void row(int t, const char* name, Py_ssize_t blck_size, Py_ssize_t type_size, int act,
              to_float_fn to_float, from_float_fn from_float, vec_dot_fn vec_dot, mm_fn mm_simd) noexcept:
    TRAITS[t].name = name
    TRAITS[t].blck_size = blck_size
    TRAITS[t].type_size = type_size
    TRAITS[t].act = act
    TRAITS[t].to_float = to_float
    TRAITS[t].from_float = from_float
    TRAITS[t].vec_dot = vec_dot
    TRAITS[t].mm_simd = mm_simd
    TRAITS[t].mm_rows = mm_simd
    TRAITS[t].mm_vnni = NULL


#   type    name    values  bytes               activations  dequantize, quantize, scalar dot, AVX2 product
row(T_F32,  "F32",  1,      sizeof(float),      ACT_F32, <to_float_fn>deq_float[float], q_f32,
    <vec_dot_fn>vd_float[float], <mm_fn>mm_avx2[float])
row(T_F16,  "F16",  1,      sizeof(block_f16),  ACT_F32, <to_float_fn>deq_float[block_f16], q_f16,
    <vec_dot_fn>vd_float[block_f16], <mm_fn>mm_avx2[block_f16])
row(T_BF16, "BF16", 1,      sizeof(block_bf16), ACT_F32, <to_float_fn>deq_float[block_bf16], q_bf16,
    <vec_dot_fn>vd_float[block_bf16], <mm_fn>mm_avx2[block_bf16])
row(T_Q4_0, "Q4_0", QK4_0,  sizeof(block_q4_0), ACT_Q8A, <to_float_fn>deq_legacy[block_q4_0],
    <from_float_fn>q_legacy[block_q4_0],
    <vec_dot_fn>vd_legacy[block_q4_0], <mm_fn>q4_0_rowlane_avx2)
row(T_Q4_1, "Q4_1", QK4_1,  sizeof(block_q4_1), ACT_Q8A, <to_float_fn>deq_legacy[block_q4_1],
    <from_float_fn>q_legacy[block_q4_1],
    <vec_dot_fn>vd_legacy[block_q4_1], <mm_fn>mm_avx2[block_q4_1])
row(T_Q5_0, "Q5_0", QK5_0,  sizeof(block_q5_0), ACT_Q8A, <to_float_fn>deq_legacy[block_q5_0],
    <from_float_fn>q_legacy[block_q5_0],
    <vec_dot_fn>vd_legacy[block_q5_0], <mm_fn>mm_avx2[block_q5_0])
row(T_Q5_1, "Q5_1", QK5_1,  sizeof(block_q5_1), ACT_Q8A, <to_float_fn>deq_legacy[block_q5_1],
    <from_float_fn>q_legacy[block_q5_1],
    <vec_dot_fn>vd_legacy[block_q5_1], <mm_fn>mm_avx2[block_q5_1])
row(T_Q8_0, "Q8_0", QK8_0,  sizeof(block_q8_0), ACT_Q8A, <to_float_fn>deq_legacy[block_q8_0], q_q8_0,
    <vec_dot_fn>vd_legacy[block_q8_0], <mm_fn>q8_0_rowlane_avx2)
row(T_Q2_K, "Q2_K", QK_K,   sizeof(block_q2_K), ACT_Q8K, <to_float_fn>deq_k23[block_q2_K], q_q2_K,
    <vec_dot_fn>vd_k23[block_q2_K], <mm_fn>mm_avx2[block_q2_K])
row(T_Q3_K, "Q3_K", QK_K,   sizeof(block_q3_K), ACT_Q8K, <to_float_fn>deq_k23[block_q3_K], q_q3_K,
    <vec_dot_fn>vd_k23[block_q3_K], <mm_fn>mm_avx2[block_q3_K])
row(T_Q4_K, "Q4_K", QK_K,   sizeof(block_q4_K), ACT_Q8K, <to_float_fn>deq_k45[block_q4_K], q_q4_K,
    <vec_dot_fn>vd_k45[block_q4_K], <mm_fn>q4_k_rowlane_avx2)
row(T_Q5_K, "Q5_K", QK_K,   sizeof(block_q5_K), ACT_Q8K, <to_float_fn>deq_k45[block_q5_K], q_q5_K,
    <vec_dot_fn>vd_k45[block_q5_K], <mm_fn>mm_avx2[block_q5_K])
row(T_Q6_K, "Q6_K", QK_K,   sizeof(block_q6_K), ACT_Q8K, deq_q6_K, q_q6_K, vd_q6_K, <mm_fn>q6_k_rowlane_avx2)

# The types whose AVX2 product is the row-lane tiles keep the per-lane kernels over stored rows for
# matmul_rows (MoE experts, never repacked): gathering 8 rows into tiles per product costs decode 1.5-2.9x.
TRAITS[T_Q4_0].mm_rows = <mm_fn>mm_avx2[block_q4_0]
TRAITS[T_Q8_0].mm_rows = <mm_fn>mm_avx2[block_q8_0]
TRAITS[T_Q4_K].mm_rows = <mm_fn>mm_avx2[block_q4_K]
TRAITS[T_Q6_K].mm_rows = <mm_fn>mm_avx2[block_q6_K]


cdef void avx2_layouts() noexcept:
    cdef int layout
    for layout in range(N_LAYOUTS):
        LAYOUT_KERNELS[layout] = NULL
    if HAVE_SIMD:  # (a portable build runs the scalar twins, which read no tiles)
        LAYOUT_KERNELS[LAYOUT_Q4_0_X8] = q4_0_x8_avx2
        LAYOUT_KERNELS[LAYOUT_Q4_K_X8] = q4_k_x8_avx2
        LAYOUT_KERNELS[LAYOUT_Q6_K_X8] = q6_k_x8_avx2
        LAYOUT_KERNELS[LAYOUT_Q8_0_X8] = q8_0_x8_avx2


avx2_layouts()


def use_avx2_layouts():
    """The layout slots as the AVX2 kernels fill them (Q4_0's, Q4_K's, Q6_K's and Q8_0's tiles): matmul calls
    this where it loaded the VNNI kernels (which fill every slot) but LLAMACY_NO_AVX512 keeps them off."""
    avx2_layouts()


cdef const type_traits* type_traits_of(int wtype) noexcept nogil:
    if wtype < 0 or wtype >= N_TYPE_IDS or TRAITS[wtype].blck_size == 0:
        return NULL
    return &TRAITS[wtype]


cdef mm_try_fn* layout_slot(int layout) noexcept nogil:
    if layout <= LAYOUT_STORED or layout >= N_LAYOUTS:
        return NULL
    return &LAYOUT_KERNELS[layout]


cdef Py_ssize_t layout_row_bytes(int layout, Py_ssize_t cols) noexcept nogil:
    if layout == LAYOUT_Q4_0_X8:
        return cols // 32 * 18
    if layout == LAYOUT_Q4_K_X8:
        return cols // 256 * 148
    if layout == LAYOUT_Q4_1_X8:
        return cols // 32 * 20
    if layout == LAYOUT_Q8_0_X8:
        return cols // 32 * 34
    if layout == LAYOUT_Q6_K_X8:
        return cols // 256 * 210
    if layout == LAYOUT_Q5_0_X8:
        return cols // 32 * 22
    if layout == LAYOUT_Q5_K_X8:
        return cols // 256 * 180
    return 0


cdef type_traits* writable_traits(int wtype) noexcept nogil:
    return <type_traits*>type_traits_of(wtype)


cdef void unknown_type(const char* what, int wtype) noexcept nogil:
    fprintf(stderr, b"llamacy: %s called with GGML type %d, which has no kernels\n", what, wtype)
    fflush(stderr)
    abort()


# ---------------------------------------------------------------------------------------------------------
# Python surface: the table as data (tests, Python callers).


def type_ids():
    """The GGML type ids with a row, ascending."""
    return [t for t in range(N_TYPE_IDS) if TRAITS[t].blck_size]


def traits(int wtype):
    """The row of `wtype` as a dict: name, block_values, block_bytes, act_format, and for each operation
    (to_float, from_float, vec_dot, mm_simd, mm_vnni) whether the row has it; mm_rows_perlane: whether
    matmul_rows takes a kernel of its own here instead of mm_simd. ValueError if no row."""
    cdef const type_traits* tt = type_traits_of(wtype)
    if tt == NULL:
        raise ValueError(f"no kernels for weight type {wtype}")
    return {
        "name": tt.name.decode(),
        "block_values": int(tt.blck_size),
        "block_bytes": int(tt.type_size),
        "act_format": tt.act,
        "to_float": tt.to_float != NULL,
        "from_float": tt.from_float != NULL,
        "vec_dot": tt.vec_dot != NULL,
        "mm_simd": tt.mm_simd != NULL,
        "mm_vnni": tt.mm_vnni != NULL,
        "mm_rows_perlane": tt.mm_rows != tt.mm_simd,
    }


def row_bytes(int wtype, Py_ssize_t cols):
    """Bytes of one stored row of `cols` values of type `wtype` (ggml_types.row_bytes); ValueError for a
    type without kernels or a row length that is not a positive multiple of its block."""
    if type_traits_of(wtype) == NULL:
        raise ValueError(f"no kernels for weight type {wtype}")
    if cols <= 0:
        raise ValueError(f"rows need a positive number of values, got {cols}")
    return ggml_types.row_bytes(wtype, cols)
