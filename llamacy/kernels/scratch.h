/* A per-thread scratch buffer for matmul512's repacked rows (declared for Cython in matmul512.pyx).
 *
 * Each thread that asks keeps one buffer, grown when a call needs more and freed when the thread ends:
 * nothing is allocated in the steady state, no page is faulted in per call, and the repacked rows need no
 * stack.
 */
#ifndef LLAMACY_SCRATCH_H
#define LLAMACY_SCRATCH_H

#include <pthread.h>
#include <stdlib.h>
typedef struct { void* p; size_t n; } lc_scratch_t;
static pthread_key_t lc_scratch_key;
static pthread_once_t lc_scratch_once = PTHREAD_ONCE_INIT;
static int lc_scratch_ok = 0;
static void lc_scratch_free(void* v) { lc_scratch_t* s = (lc_scratch_t*)v; free(s->p); free(s); }
static void lc_scratch_init(void) { lc_scratch_ok = pthread_key_create(&lc_scratch_key, lc_scratch_free) == 0; }
/* This thread's buffer of at least n bytes (64-byte aligned, contents undefined); NULL if out of memory. */
static void* lc_scratch(size_t n) {
    lc_scratch_t* s;
    pthread_once(&lc_scratch_once, lc_scratch_init);
    if (!lc_scratch_ok) return NULL;
    s = (lc_scratch_t*)pthread_getspecific(lc_scratch_key);
    if (s == NULL) {
        s = (lc_scratch_t*)calloc(1, sizeof *s);
        if (s == NULL) return NULL;
        if (pthread_setspecific(lc_scratch_key, s) != 0) { free(s); return NULL; }
    }
    if (s->n < n) {
        free(s->p);
        s->n = (n + 65535) & ~(size_t)65535;
        s->p = aligned_alloc(64, s->n);
        if (s->p == NULL) s->n = 0;
    }
    return s->p;
}

#endif /* LLAMACY_SCRATCH_H */
