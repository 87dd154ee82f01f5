/* parallel: a small persistent thread pool for CPU kernels.
 *
 * tr_parallel_for(n, grain, fn, ctx) splits [0, n) into chunks of at least `grain` items and
 * runs fn on them from the pool's threads and the calling thread, returning when all are
 * done. Threads are created on first use and sleep on a condition variable between calls
 * (no spinning when idle). One parallel region at a time: a call made while another runs
 * (from another thread, or nested inside fn) runs serially on the caller.
 */
#ifndef TR_KERNELS_CPU_PARALLEL_H
#define TR_KERNELS_CPU_PARALLEL_H

#include <stddef.h>

/* fn handles items [begin, end); thread is 0..tr_parallel_threads()-1, stable within a call. */
typedef void (*tr_parallel_fn)(void *ctx, size_t begin, size_t end, int thread);

/* Runs fn over [0, n). Any thread. */
void tr_parallel_for(size_t n, size_t grain, tr_parallel_fn fn, void *ctx);

/* Sets the number of threads kernels use (the caller included); 0 = online cores. Takes
 * effect at the next call. Not while a tr_parallel_for is running. */
void tr_parallel_set_threads(int n);

/* Threads the next tr_parallel_for will use. */
int tr_parallel_threads(void);

/* Joins the pool's threads (they come back on next use). For leak checkers and fork. */
void tr_parallel_shutdown(void);

#endif
