/* Ranges of work units that an owner thread takes from the front and the other threads steal from the back.
 *
 * A decode product gives each thread one contiguous range of rows (one sequential stream for the hardware
 * prefetchers). Split evenly, the two halves still finished far apart on a shared 2-vCPU machine: measured
 * per token of llama-3.2-1b Q4_K_M (129 products), the caller waited 0.9-2.2 ms for the worker and the worker
 * 0.3-1.8 ms for the caller, 6-14% of the token with one thread streaming alone, although the worker started
 * within 0.3 us of each job. So a thread that has finished its own range takes the back half of what is left
 * of another's, as long as there is some. The owner takes a quarter of what remains at a time, so that near
 * the end its steps are short and the thief finds work left. Decode with and without it, alternated in one
 * process at 2 threads: 0.99-1.02x on four 1B-3B models while the machine was quiet, 1.02x (quartiles
 * 1.01-1.08) on llama-3.2-1b Q4_K_M in a noisier period. It pays where a thread is held up, not on average.
 *
 * A range is one 64-bit word, lo in the low half and hi in the high half, on a cache line of its own: the
 * owner's takes stay in its own cache until a thief comes. Which thread computes a unit does not change
 * what is computed (every row of a product is computed the same way on any thread).
 */
#ifndef LLAMACY_RANGES_H
#define LLAMACY_RANGES_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>

typedef struct {
    alignas(64) _Atomic uint64_t w;
} lc_range;

/* The most ranges a caller keeps (on its stack): a team of more threads splits its products as before. */
#define LC_RANGES_MAX 64

static inline void lc_range_init(lc_range *r, uint32_t lo, uint32_t hi) {
    atomic_store_explicit(&r->w, ((uint64_t)hi << 32) | lo, memory_order_relaxed);
}

/* Up to a quarter of what is left (at least one unit) from the front: the first unit taken, and in *n how
 * many (0: none left). */
static inline uint32_t lc_range_front(lc_range *r, uint32_t *n) {
    uint64_t w = atomic_load_explicit(&r->w, memory_order_relaxed);
    for (;;) {
        uint32_t lo = (uint32_t)w, hi = (uint32_t)(w >> 32), k = (hi - lo) / 4;
        if (lo >= hi) {
            *n = 0;
            return lo;
        }
        if (k == 0) k = 1;
        if (atomic_compare_exchange_weak_explicit(&r->w, &w, w + k, memory_order_relaxed, memory_order_relaxed)) {
            *n = k;
            return lo;
        }
    }
}

/* Half of what is left (at least one unit) from the back: the first unit taken, and in *n how many. */
static inline uint32_t lc_range_back(lc_range *r, uint32_t *n) {
    uint64_t w = atomic_load_explicit(&r->w, memory_order_relaxed);
    for (;;) {
        uint32_t lo = (uint32_t)w, hi = (uint32_t)(w >> 32), k = (hi - lo + 1) / 2;
        if (lo >= hi) {
            *n = 0;
            return hi;
        }
        if (atomic_compare_exchange_weak_explicit(&r->w, &w, ((uint64_t)(hi - k) << 32) | lo, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *n = k;
            return hi - k;
        }
    }
}

/* ranges[i] = units i * units / n .. (i + 1) * units / n - 1: one for each thread of a team of n. */
static inline void lc_ranges_split(lc_range *ranges, int n, uint32_t units) {
    for (int i = 0; i < n; i++)
        lc_range_init(&ranges[i], (uint32_t)((uint64_t)units * i / n), (uint32_t)((uint64_t)units * (i + 1) / n));
}

typedef void (*lc_units_fn)(void *ctx, uint32_t u0, uint32_t n);

/* The share of a team task that holds items begin..end-1 (ranges): fn over its own ranges from the front,
 * then over what the others have left, from their backs, until every range is empty. */
static inline void lc_ranges_work(lc_range *ranges, int n, int64_t begin, int64_t end, lc_units_fn fn, void *ctx) {
    uint32_t u, k;
    for (int64_t c = begin; c < end; c++)
        while (u = lc_range_front(&ranges[c], &k), k) fn(ctx, u, k);
    for (int v = 1; v < n; v++) {
        lc_range *r = &ranges[(end - 1 + v) % n];
        while (u = lc_range_back(r, &k), k) fn(ctx, u, k);
    }
}

#endif
