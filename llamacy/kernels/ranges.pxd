# Ranges of work units that owners take from the front and other threads steal from the back (ranges.h):
# the decode products' rows (matmul.pyx), and a coverage check for the tests (testing.pyx).
from libc.stdint cimport int64_t, uint32_t

cdef extern from "ranges.h" nogil:
    ctypedef struct lc_range:
        pass
    enum: LC_RANGES_MAX  # the most ranges a caller keeps (on its stack)
    ctypedef void (*lc_units_fn)(void* ctx, uint32_t u0, uint32_t n) noexcept nogil
    # ranges[i] = units i * units / n .. (i + 1) * units / n - 1, one for each thread of a team of n.
    void lc_ranges_split(lc_range* ranges, int n, uint32_t units)
    # A team task's share: fn over its ranges begin..end-1 from the front, then over the others' from the back.
    void lc_ranges_work(lc_range* ranges, int n, int64_t begin, int64_t end, lc_units_fn fn, void* ctx)
