/* parallel.c: the kernels' thread pool.
 *
 * Design: one pool per process. A call publishes a job (fn, ctx, n, chunk) under `mu`,
 * bumps `generation` and broadcasts `wake`. Workers and the caller then claim chunks with
 * an atomic fetch_add on `next` (relaxed: the job fields were published under the mutex,
 * which every participant took after the broadcast). A worker that joins a job counts itself
 * in `running` under `mu` and counts itself out under `mu` when no chunk is left; the caller,
 * after claiming chunks itself, waits on `finished` until running == 0, so no worker still
 * reads a job's fields when the next job is published, and every chunk's writes happen-before
 * the return (the mutex orders them). A worker that wakes late may join a job already done;
 * it finds no chunk and leaves, and the next job is not published while it is inside.
 * A try-lock on `busy` makes concurrent or nested calls run serially instead of deadlocking.
 */
#include "kernels/cpu/parallel.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_THREADS 256

static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_cond_t finished;
    pthread_t threads[MAX_THREADS];
    int n_started;  /* pool threads running (excludes callers) */
    int n_wanted;   /* threads including the caller; 0 = online cores */
    int stopping;
    unsigned long generation;
    /* the current job, written under mu */
    tr_parallel_fn fn;
    void *ctx;
    size_t n, chunk;
    int n_active;   /* participants the job uses, caller included */
    int running;    /* pool threads inside the current job */
    atomic_size_t next;
    atomic_int busy;
} pool = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .finished = PTHREAD_COND_INITIALIZER,
};

static void run_chunks(int thread)
{
    for (;;) {
        size_t begin = atomic_fetch_add_explicit(&pool.next, pool.chunk, memory_order_relaxed);
        if (begin >= pool.n)
            return;
        size_t end = begin + pool.chunk < pool.n ? begin + pool.chunk : pool.n;
        pool.fn(pool.ctx, begin, end, thread);
    }
}

static void *worker_main(void *arg)
{
    int index = (int)(size_t)arg; /* 1..; the caller is 0 */
    unsigned long seen = 0;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (!pool.stopping && (pool.generation == seen || index >= pool.n_active))
            pthread_cond_wait(&pool.wake, &pool.mu);
        if (pool.stopping)
            break;
        seen = pool.generation;
        pool.running++;
        pthread_mutex_unlock(&pool.mu);
        run_chunks(index);
        pthread_mutex_lock(&pool.mu);
        if (--pool.running == 0)
            pthread_cond_signal(&pool.finished);
    }
    pthread_mutex_unlock(&pool.mu);
    return NULL;
}

int tr_parallel_threads(void)
{
    int n = pool.n_wanted;
    if (n <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n = cores > 0 ? (int)cores : 1;
    }
    return n > MAX_THREADS ? MAX_THREADS : n;
}

void tr_parallel_set_threads(int n)
{
    pool.n_wanted = n < 0 ? 0 : n;
}

/* Starts pool threads until `want` participants exist. Called with mu held. */
static void grow(int want)
{
    while (pool.n_started + 1 < want) {
        int index = pool.n_started + 1;
        if (pthread_create(&pool.threads[pool.n_started], NULL, worker_main, (void *)(size_t)index))
            break; /* fewer threads: the work still gets done by those that exist */
        pool.n_started++;
    }
}

void tr_parallel_for(size_t n, size_t grain, tr_parallel_fn fn, void *ctx)
{
    if (n == 0)
        return;
    if (grain == 0)
        grain = 1;
    int want = tr_parallel_threads();
    int expected = 0;
    if (want <= 1 || n <= grain ||
        !atomic_compare_exchange_strong_explicit(&pool.busy, &expected, 1, memory_order_acquire,
                                                 memory_order_relaxed)) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&pool.mu);
    while (pool.running > 0) /* a late joiner of the previous job is still leaving it */
        pthread_cond_wait(&pool.finished, &pool.mu);
    grow(want);
    int active = pool.n_started + 1 < want ? pool.n_started + 1 : want;
    size_t chunks = (size_t)active * 4;
    size_t chunk = (n + chunks - 1) / chunks;
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.chunk = chunk < grain ? grain : chunk;
    pool.n_active = active;
    atomic_store_explicit(&pool.next, 0, memory_order_relaxed);
    pool.generation++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);

    run_chunks(0);

    pthread_mutex_lock(&pool.mu);
    while (pool.running > 0)
        pthread_cond_wait(&pool.finished, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
    /* release: pairs with the next caller's acquire CAS */
    atomic_store_explicit(&pool.busy, 0, memory_order_release);
}

void tr_parallel_shutdown(void)
{
    pthread_mutex_lock(&pool.mu);
    pool.stopping = 1;
    pthread_cond_broadcast(&pool.wake);
    int n = pool.n_started;
    pthread_mutex_unlock(&pool.mu);
    for (int i = 0; i < n; i++)
        pthread_join(pool.threads[i], NULL);
    pthread_mutex_lock(&pool.mu);
    pool.n_started = 0;
    pool.stopping = 0;
    pthread_mutex_unlock(&pool.mu);
}
