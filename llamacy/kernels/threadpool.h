/* A persistent thread pool for the layer loop: one team for the whole process, reused by every matmul
 * and attention call.
 *
 * Why not OpenMP's parallel-for: its join is a barrier that waits for every thread of the team, also one
 * the OS has not scheduled yet. On a machine where something else is running, that turns each of the
 * ~250 parallel regions of a token into a wait for a time slice (we measured 4-30 tok/s instead of 100+
 * with one busy process beside us). Here work is handed out in chunks from an atomic counter; the caller
 * takes chunks too and waits only for chunks a worker has actually claimed. A worker that wakes late
 * finds the counter exhausted and goes back to waiting: it never holds the caller up.
 *
 * Workers spin briefly between jobs (jobs come every few microseconds while decoding), then sleep on a
 * condition variable. A caller that knows a pause is coming (the server's scheduler, which samples and
 * hands out text between steps) sends them to sleep at once with lc_pool_rest: on a small machine the
 * ~0.5 ms of spinning is a core taken from the event loop and the clients.
 */
#ifndef LLAMACY_THREADPOOL_H
#define LLAMACY_THREADPOOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#define LC_PAUSE() __builtin_ia32_pause()
#else
#define LC_PAUSE() ((void)0)
#endif

#define LC_MAX_THREADS 256
#define LC_SPIN_ITERS 20000

/* tid: 0 for the caller, 1..n_workers for the workers (for per-thread scratch). */
typedef void (*lc_task_fn)(void *ctx, int64_t begin, int64_t end, int tid);

typedef struct lc_pool {
    pthread_t threads[LC_MAX_THREADS];
    int n_workers;                 /* threads started (the caller is not one of them) */
    /* the current job */
    lc_task_fn fn;
    void *ctx;
    int64_t n_items;
    int64_t chunk;
    int job_workers;               /* how many workers may join this job (nthreads - 1) */
    _Atomic uint64_t ticket;       /* (generation << 32) | next chunk index */
    _Atomic int64_t done;          /* items finished in the current job */
    _Atomic uint32_t gen;          /* bumped to publish a job */
    _Atomic int sleepers;
    _Atomic int stop;
    _Atomic int resting;           /* set by lc_pool_rest: skip the spin, sleep now */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t run_mu;        /* one job at a time; a second caller runs its job alone */
} lc_pool;

typedef struct {
    lc_pool *pool;
    int index;
} lc_worker_arg;

static lc_worker_arg lc_worker_args[LC_MAX_THREADS];

/* Take chunks of job `g` until none are left (or the job is no longer g). */
static inline void lc_run_chunks(lc_pool *p, uint32_t g, int tid) {
    for (;;) {
        uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
        if ((uint32_t)(t >> 32) != g || (uint32_t)t == 0xFFFFFFFFu) return;
        int64_t begin = (int64_t)(uint32_t)t * p->chunk;
        if (begin >= p->n_items) return;
        if (!atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        /* The job cannot change while this chunk is unfinished: fn/ctx/n_items are those of g. */
        int64_t end = begin + p->chunk;
        if (end > p->n_items) end = p->n_items;
        p->fn(p->ctx, begin, end, tid);
        atomic_fetch_add_explicit(&p->done, end - begin, memory_order_acq_rel);
    }
}

static void *lc_worker_main(void *arg) {
    lc_worker_arg *a = (lc_worker_arg *)arg;
    lc_pool *p = a->pool;
    uint32_t seen = atomic_load(&p->gen);
    int spin = 0; /* only a worker that took part in the last job expects the next one soon */
    for (;;) {
        uint32_t g = atomic_load(&p->gen);
        for (int i = 0; spin && g == seen && i < LC_SPIN_ITERS && !atomic_load_explicit(&p->resting,
                                                                                 memory_order_relaxed); i++) {
            LC_PAUSE();
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        spin = a->index < p->job_workers;
        if (spin) lc_run_chunks(p, g, a->index + 1);
    }
}

/* Workers waiting for the next job stop spinning and sleep until it comes (it wakes them as usual). */
static void lc_pool_rest(lc_pool *p) {
    if (p != NULL) atomic_store(&p->resting, 1);
}

/* Start workers until there are n_workers (never shrinks). Returns how many there are. */
static int lc_pool_grow(lc_pool *p, int n_workers) {
    if (n_workers > LC_MAX_THREADS) n_workers = LC_MAX_THREADS;
    pthread_mutex_lock(&p->run_mu); /* no job in flight while the team changes */
    for (int i = p->n_workers; i < n_workers; i++) {
        lc_worker_args[i].pool = p;
        lc_worker_args[i].index = i;
        if (pthread_create(&p->threads[i], NULL, lc_worker_main, &lc_worker_args[i]) != 0) break;
        p->n_workers = i + 1;
    }
    pthread_mutex_unlock(&p->run_mu);
    return p->n_workers;
}

/* An empty pool (no workers yet); NULL if out of memory. */
static lc_pool *lc_pool_create(void) {
    lc_pool *p = (lc_pool *)calloc(1, sizeof(lc_pool));
    if (p == NULL) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_mutex_init(&p->run_mu, NULL);
    atomic_store(&p->gen, 0);
    atomic_store(&p->ticket, 0);
    return p;
}

/* Run fn over [0, n_items) in chunks of `chunk` items with up to nthreads threads (the caller included).
 * Returns when every item is done. Not reentrant: one job at a time (the layer loop is sequential). */
static void lc_pool_run(lc_pool *p, lc_task_fn fn, void *ctx, int64_t n_items, int64_t chunk, int nthreads) {
    if (n_items <= 0) return;
    if (chunk < 1) chunk = 1;
    int workers = nthreads - 1;
    if (p == NULL || workers <= 0 || n_items <= chunk || p->n_workers == 0 ||
        pthread_mutex_trylock(&p->run_mu) != 0) {
        fn(ctx, 0, n_items, 0); /* alone: no team, or another thread's job holds it */
        return;
    }
    if (workers > p->n_workers) workers = p->n_workers;
    uint32_t g = atomic_load(&p->gen) + 1;
    /* Close the counter first: a late worker of the previous job that read the old ticket then fails
     * its compare-exchange instead of claiming a chunk with the fields we are about to rewrite. */
    atomic_store(&p->ticket, ((uint64_t)g << 32) | 0xFFFFFFFFu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n_items;
    p->chunk = chunk;
    p->job_workers = workers;
    atomic_store(&p->done, 0);
    atomic_store(&p->resting, 0);
    atomic_store(&p->ticket, (uint64_t)g << 32);
    atomic_store(&p->gen, g); /* publish: seq_cst, ordered before the sleepers check below */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    lc_run_chunks(p, g, 0);
    while (atomic_load_explicit(&p->done, memory_order_acquire) < n_items) LC_PAUSE();
    pthread_mutex_unlock(&p->run_mu);
}

static void lc_pool_destroy(lc_pool *p) {
    if (p == NULL) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_workers; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->run_mu);
    free(p);
}

#endif
