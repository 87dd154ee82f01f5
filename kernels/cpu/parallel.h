/* parallel: the kernels' thread pool, and the process's one budget of compute threads.
 *
 * tr_parallel_for(n, grain, fn, ctx) splits [0, n) into chunks of at least `grain` items and
 * runs fn on them from the pool's threads and the calling thread, returning when all are
 * done. Threads are created on first use and sleep on a condition variable between calls
 * (no spinning when idle).
 *
 * The budget (tr_parallel_threads(), the online cores unless set) bounds the chunk functions
 * running at once in the whole process, whoever called: several threads may call
 * tr_parallel_for at the same time (the executor's GEMMs, the optimizer's gradient norm,
 * pipeline stages) and share the budget, each job getting an even share of it, re-balanced
 * between chunks; a thread left idle by one job joins another. A caller that finds the
 * whole budget busy waits for a slot: a job holding two or more gives one up after its
 * current chunk (with B jobs already holding one each, the caller waits for one to end). No
 * caller is run on one thread while threads are free, and none computes beside the budget. A nested
 * call (from inside fn) runs serially on the thread that made it, within that thread's place in the
 * budget. Libraries with threads of their own (OpenBLAS is kept at one thread per call; OpenMP, and
 * oneDNN on it) take their threads from the same budget with tr_parallel_acquire. See
 * docs/threads.md.
 */
#ifndef TR_KERNELS_CPU_PARALLEL_H
#define TR_KERNELS_CPU_PARALLEL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* fn handles items [begin, end); thread is 0 for the caller and 1..tr_parallel_threads()-1
 * for the pool's threads: unique among the chunks of one call running at once. */
typedef void (*tr_parallel_fn)(void *ctx, size_t begin, size_t end, int thread);

/* Runs fn over [0, n), returning when every chunk is done (their writes visible to the
 * caller). fn must not wait for another thread's tr_parallel_for (a nested call is fine).
 * Any thread. */
void tr_parallel_for(size_t n, size_t grain, tr_parallel_fn fn, void *ctx);

/* Sets the budget: compute threads in the whole process, callers included; 0 = the CPUs
 * this process may run on. Running jobs follow it from their next chunk (threads acquired
 * with tr_parallel_acquire stay until released). Any thread. */
void tr_parallel_set_threads(int n);

/* The budget (at most 256). Any thread. */
int tr_parallel_threads(void);

/* Takes up to `want` threads of the budget for a library that runs threads of its own (an
 * OpenMP region, oneDNN): waits until at least one is free, takes what is free up to want,
 * and returns how many it took; run the library with that many threads, then give them
 * back with tr_parallel_release. Inside a chunk function the calling thread's own place
 * counts as one and it never waits. want < 1 counts as 1. Any thread. */
int tr_parallel_acquire(int want);

/* Gives back n threads taken by tr_parallel_acquire (its return value). Same thread. */
void tr_parallel_release(int n);

/* What the calling thread's last tr_parallel_for got. */
typedef struct {
    int threads; /* most threads that ran its chunks at once, the caller included */
    int waited;  /* 1 when the whole budget was busy as it started and it waited */
    size_t chunks;
} tr_parallel_job_info_t;

/* Fills *info for the calling thread's most recent tr_parallel_for (zeros if none). */
void tr_parallel_last_job(tr_parallel_job_info_t *info);

/* The pool as a whole, for diagnostics. */
typedef struct {
    int budget;          /* tr_parallel_threads() */
    int running;         /* chunk functions and acquired threads running now */
    int peak_running;    /* most at once since the last reset (never above the budget) */
    int jobs;            /* tr_parallel_for calls in progress */
    unsigned long waits; /* calls that found the budget busy, since the last reset */
} tr_parallel_stats_t;

/* Fills *stats; reset != 0 then restarts peak_running and waits. Any thread. */
void tr_parallel_stats(tr_parallel_stats_t *stats, int reset);

/* Joins the pool's threads (they come back on next use). For leak checkers and fork; not
 * while a tr_parallel_for runs. */
void tr_parallel_shutdown(void);

#ifdef __cplusplus
}
#endif
#endif
