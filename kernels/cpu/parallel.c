/* parallel.c: the kernels' thread pool and the process's one budget of compute threads.
 *
 * Design: one pool per process; every field is under `mu` unless its comment says otherwise.
 *   Slots. `running` counts the threads holding one of the budget's B slots: members of a
 *   job (threads running its chunks) and threads taken by tr_parallel_acquire. No chunk runs
 *   without a slot, so at most B chunk functions run at once in the process.
 *   Producers. A caller of tr_parallel_for (the job's owner) links its job (on its stack) at
 *   the tail of `jobs`, wakes the idle workers if the job has more than one chunk, then
 *   works on its own job like any member while it may take a slot, and sleeps on the
 *   job's `cv` otherwise.
 *   Consumers. The pool's B-1 workers, and each owner for its own job. A worker without a
 *   job takes a free slot for the job that has chunks left and the fewest members (the
 *   oldest of equals), or sleeps on `wake`. Members claim chunks with a fetch_add on the
 *   job's `claim`, outside the mutex (relaxed: the job's fields were published under mu,
 *   which every member took before joining).
 *   Sharing. After each chunk a member reads `rebalance`, a hint written under mu: set
 *   while every slot is taken and some job with chunks left has at least two members fewer
 *   than another (or a lowered budget has fewer slots than are taken: members then leave
 *   until it holds). Then the member takes mu and, if its own job is such a larger one,
 *   leaves it: a worker goes to the job with fewest members, an owner hands its slot to
 *   the neediest job and sleeps. Shares so even out within a chunk's time, and a
 *   difference of one stays (no thread swings back and forth). An owner likewise leaves a
 *   free slot to a needier job's sleeping owner or an idle worker when taking it would make
 *   its own job such a larger one.
 *   Freed slots. Whoever frees a slot while a job has chunks left hands it on: it signals
 *   the sleeping owner of the neediest job with a sleeping owner, the idle workers, and a
 *   thread waiting in tr_parallel_acquire. Woken threads re-check everything under mu; the
 *   losers sleep again.
 *   Completion. Members leave under mu; the last one out of a job with no chunk left
 *   signals its owner's cv. The owner unlinks the job once it has no chunk left and no
 *   member, so every chunk's writes happen-before its return (the mutex orders them) and
 *   no thread touches the job after.
 * A nested call (from a thread holding a slot) runs fn serially on that slot.
 */
#include "kernels/cpu/parallel.h"
#include "troupe/blas.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#define MAX_THREADS       256
#define CHUNKS_PER_THREAD 4

typedef struct job {
    struct job *prev, *next; /* in pool.jobs */
    tr_parallel_fn fn;
    void *ctx;
    size_t n, chunk;
    atomic_size_t claim; /* first item not handed out yet */
    int members;         /* threads holding a slot for it */
    atomic_int active;   /* threads inside fn; relaxed: a statistic */
    atomic_int peak;     /* most active at once; relaxed, read after the job completes */
    int owner_sleeps;    /* the owner waits on cv */
    pthread_cond_t cv;
} job_t;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake;      /* idle workers sleep here */
    pthread_cond_t slot_free; /* tr_parallel_acquire waits here */
    pthread_t threads[MAX_THREADS];
    int n_started; /* workers (indices 1..n_started) */
    int n_idle;    /* workers asleep on wake */
    int n_acquiring;
    int stopping;
    job_t *head, *tail;
    int n_jobs;
    int running;
    int peak_running;
    unsigned long waits;
    atomic_int budget_set; /* 0 = cores; relaxed: a setting, read once per decision */
    atomic_int rebalance;  /* relaxed: a hint, written under mu and re-checked under mu */
} pool = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .wake = PTHREAD_COND_INITIALIZER,
    .slot_free = PTHREAD_COND_INITIALIZER,
};

static _Thread_local int holds_slot;   /* running a chunk, or holding acquired threads */
static _Thread_local int acquired_own; /* tr_parallel_acquire counted this thread's slot */
static _Thread_local tr_parallel_job_info_t last_job;

/* ---- the budget ---------------------------------------------------------------------- */

/* CPUs this process may run on (its affinity mask: taskset, cpusets), else online cores. */
static int cores(void)
{
    static atomic_int cached; /* relaxed: every thread computes the same value */
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c > 0) return c;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) c = CPU_COUNT(&set);
    if (c <= 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        c = online > 0 ? (int)online : 1;
    }
    atomic_store_explicit(&cached, c, memory_order_relaxed);
    return c;
}

int tr_parallel_threads(void)
{
    int n = atomic_load_explicit(&pool.budget_set, memory_order_relaxed);
    if (n <= 0) n = cores();
    return n > MAX_THREADS ? MAX_THREADS : n;
}

/* ---- jobs and slots (all with mu held) ----------------------------------------------- */

static int has_work(job_t *j)
{
    return atomic_load_explicit(&j->claim, memory_order_relaxed) < j->n;
}

/* The job with chunks left and the fewest members, the oldest of equals; NULL if none. */
static job_t *neediest(void)
{
    job_t *best = NULL;
    for (job_t *j = pool.head; j; j = j->next)
        if (has_work(j) && (!best || j->members < best->members)) best = j;
    return best;
}

/* Whether j, with `extra` more members, would have two more than another job with work. */
static int would_yield(job_t *j, int extra)
{
    for (job_t *u = pool.head; u; u = u->next)
        if (u != j && has_work(u) && u->members + 2 <= j->members + extra) return 1;
    return 0;
}

/* Sets the hint members read between chunks: some job has two members more than another
 * with work while every slot is taken, or more slots are taken than a lowered budget has. */
static void update_rebalance(void)
{
    int lo = INT_MAX, hi = 0, budget = tr_parallel_threads();
    if (pool.running > budget) {
        atomic_store_explicit(&pool.rebalance, 1, memory_order_relaxed);
        return;
    }
    if (pool.running == budget)
        for (job_t *j = pool.head; j; j = j->next)
            if (has_work(j)) {
                lo = j->members < lo ? j->members : lo;
                hi = j->members > hi ? j->members : hi;
            }
    atomic_store_explicit(&pool.rebalance, lo != INT_MAX && hi >= lo + 2, memory_order_relaxed);
}

static void take_slots(int n)
{
    pool.running += n;
    if (pool.running > pool.peak_running) pool.peak_running = pool.running;
}

/* A slot was freed: wake whoever should take it (they re-check under mu): a thread waiting
 * in tr_parallel_acquire, the sleeping owner of the neediest job, and the idle workers. */
static void hand_on(void)
{
    if (pool.running >= tr_parallel_threads()) return;
    if (pool.n_acquiring) pthread_cond_signal(&pool.slot_free);
    job_t *sleeper = NULL;
    int work = 0;
    for (job_t *j = pool.head; j; j = j->next)
        if (has_work(j)) {
            work = 1;
            if (j->owner_sleeps && (!sleeper || j->members < sleeper->members)) sleeper = j;
        }
    if (sleeper) pthread_cond_signal(&sleeper->cv);
    if (work && pool.n_idle) /* broadcast: some may be outside a lowered budget */
        pthread_cond_broadcast(&pool.wake);
}

/* At least how many idle workers the budget lets work (those with index >= budget never
 * do; counting them all as idle gives a lower bound). */
static int idle_workers(void)
{
    int outside = pool.n_started + 1 - tr_parallel_threads();
    int eligible = pool.n_idle - (outside > 0 ? outside : 0);
    return eligible > 0 ? eligible : 0;
}

static void join(job_t *j)
{
    take_slots(1);
    j->members++;
    update_rebalance();
}

static void leave(job_t *j)
{
    j->members--;
    pool.running--;
    if (j->members == 0 && !has_work(j) && j->owner_sleeps) pthread_cond_signal(&j->cv);
    update_rebalance();
    hand_on();
}

/* Claims and runs chunks of j until none is left or `rebalance` is set; at least one. */
static void run_chunks(job_t *j, int thread)
{
    do {
        size_t begin = atomic_fetch_add_explicit(&j->claim, j->chunk, memory_order_relaxed);
        if (begin >= j->n) return;
        size_t end = j->n - begin > j->chunk ? begin + j->chunk : j->n;
        int in = atomic_fetch_add_explicit(&j->active, 1, memory_order_relaxed) + 1;
        int peak = atomic_load_explicit(&j->peak, memory_order_relaxed);
        while (in > peak && !atomic_compare_exchange_weak_explicit(
                                &j->peak, &peak, in, memory_order_relaxed, memory_order_relaxed)) {
        }
        j->fn(j->ctx, begin, end, thread);
        atomic_fetch_sub_explicit(&j->active, 1, memory_order_relaxed);
    } while (!atomic_load_explicit(&pool.rebalance, memory_order_relaxed));
}

/* A member's stint in j: runs chunks until none is left or its share says go. Called with
 * mu held and the slot taken (join); returns with mu held, the slot still taken. */
static void work_on(job_t *j, int thread)
{
    for (;;) {
        pthread_mutex_unlock(&pool.mu);
        holds_slot = 1;
        run_chunks(j, thread);
        holds_slot = 0;
        pthread_mutex_lock(&pool.mu);
        if (!has_work(j)) return;
        int budget = tr_parallel_threads();
        if (pool.running > budget || (pool.running == budget && would_yield(j, 0))) return;
    }
}

/* ---- the workers --------------------------------------------------------------------- */

static void *worker_main(void *arg)
{
    int index = (int)(size_t)arg; /* 1..; owners are 0 */
    pthread_mutex_lock(&pool.mu);
    while (!pool.stopping) {
        int budget = tr_parallel_threads();
        job_t *j = index < budget && pool.running < budget ? neediest() : NULL;
        if (!j) {
            pool.n_idle++;
            pthread_cond_wait(&pool.wake, &pool.mu);
            pool.n_idle--;
            continue;
        }
        join(j);
        work_on(j, index);
        leave(j);
    }
    pthread_mutex_unlock(&pool.mu);
    return NULL;
}

/* Starts workers until the budget's B-1 exist. With mu held. */
static void grow(int budget)
{
    while (pool.n_started + 1 < budget) {
        int index = pool.n_started + 1;
        void *arg = (void *)(size_t)index;
        if (pthread_create(&pool.threads[pool.n_started], NULL, worker_main, arg))
            break; /* fewer threads: the work still gets done by those that exist */
        pool.n_started++;
    }
}

/* ---- the callers --------------------------------------------------------------------- */

static void link_job(job_t *j)
{
    j->prev = pool.tail;
    if (pool.tail)
        pool.tail->next = j;
    else
        pool.head = j;
    pool.tail = j;
    pool.n_jobs++;
}

static void unlink_job(job_t *j)
{
    if (j->prev)
        j->prev->next = j->next;
    else
        pool.head = j->next;
    if (j->next)
        j->next->prev = j->prev;
    else
        pool.tail = j->prev;
    pool.n_jobs--;
}

/* If taking a free slot would give j two members more than a job with chunks left, and
 * that job has a thread ready to take the slot (its sleeping owner, an idle worker), wakes
 * it and returns 1. */
static int pass_slot(job_t *j)
{
    job_t *u = NULL;
    for (job_t *x = pool.head; x; x = x->next)
        if (x != j && has_work(x) && x->members + 1 <= j->members &&
            (!u || x->members < u->members))
            u = x;
    if (!u) return 0;
    if (u->owner_sleeps)
        pthread_cond_signal(&u->cv);
    else if (idle_workers())
        pthread_cond_broadcast(&pool.wake);
    else
        return 0;
    return 1;
}

static void owner_sleep(job_t *j)
{
    j->owner_sleeps = 1;
    pthread_cond_wait(&j->cv, &pool.mu);
    j->owner_sleeps = 0;
}

/* The owner's part: works on j while it may, sleeps otherwise, until j is complete.
 * Returns whether it ever found the budget busy. With mu held. */
static int own(job_t *j)
{
    int waited = 0, first = 1;
    for (;;) {
        if (!has_work(j)) {
            if (j->members == 0) return waited;
            owner_sleep(j);
            continue;
        }
        if (pool.running >= tr_parallel_threads()) {
            waited |= first;
            first = 0;
            owner_sleep(j);
            continue;
        }
        first = 0;
        if (pass_slot(j)) {
            owner_sleep(j);
            continue;
        }
        join(j);
        work_on(j, 0);
        leave(j);
    }
}

void tr_parallel_for(size_t n, size_t grain, tr_parallel_fn fn, void *ctx)
{
    if (n == 0) return;
    if (grain == 0) grain = 1;
    if (holds_slot) { /* nested: this thread's slot runs it */
        fn(ctx, 0, n, 0);
        last_job = (tr_parallel_job_info_t){.threads = 1, .chunks = 1};
        return;
    }
    int budget = tr_parallel_threads();
    size_t chunk = n;
    if (budget > 1 && n > grain) {
        size_t parts = (size_t)budget * CHUNKS_PER_THREAD;
        chunk = (n + parts - 1) / parts;
        chunk = chunk < grain ? grain : chunk;
    }
    job_t j = {.fn = fn, .ctx = ctx, .n = n, .chunk = chunk};
    atomic_init(&j.claim, 0);
    atomic_init(&j.active, 0);
    atomic_init(&j.peak, 0);
    pthread_cond_init(&j.cv, NULL);
    pthread_mutex_lock(&pool.mu);
    link_job(&j);
    update_rebalance();
    if (chunk < n) {
        grow(budget);
        if (pool.n_idle) pthread_cond_broadcast(&pool.wake);
    }
    int waited = own(&j);
    unlink_job(&j);
    pool.waits += (unsigned long)waited;
    update_rebalance();
    hand_on();
    pthread_mutex_unlock(&pool.mu);
    pthread_cond_destroy(&j.cv);
    last_job =
        (tr_parallel_job_info_t){.threads = atomic_load_explicit(&j.peak, memory_order_relaxed),
                                 .waited = waited,
                                 .chunks = (n + chunk - 1) / chunk};
}

/* ---- threads for other libraries ----------------------------------------------------- */

int tr_parallel_acquire(int want)
{
    want = want < 1 ? 1 : want;
    pthread_mutex_lock(&pool.mu);
    int own_slot = holds_slot > 0, got = own_slot;
    if (!own_slot) {
        int counted = 0;
        while (pool.running >= tr_parallel_threads()) {
            if (!counted) pool.waits++;
            counted = 1;
            pool.n_acquiring++;
            pthread_cond_wait(&pool.slot_free, &pool.mu);
            pool.n_acquiring--;
        }
    }
    int free_slots = tr_parallel_threads() - pool.running;
    int more = want - got < free_slots ? want - got : free_slots;
    more = more < 0 ? 0 : more;
    take_slots(more);
    update_rebalance();
    pthread_mutex_unlock(&pool.mu);
    acquired_own = own_slot;
    holds_slot++;
    return got + more;
}

void tr_parallel_release(int n)
{
    holds_slot--;
    pthread_mutex_lock(&pool.mu);
    pool.running -= n - acquired_own;
    update_rebalance();
    hand_on();
    pthread_mutex_unlock(&pool.mu);
}

/* ---- settings and diagnostics -------------------------------------------------------- */

void tr_kernels_set_threads(int n)
{
    tr_parallel_set_threads(n);
}

void tr_parallel_set_threads(int n)
{
    atomic_store_explicit(&pool.budget_set, n < 0 ? 0 : n, memory_order_relaxed);
    pthread_mutex_lock(&pool.mu); /* a larger budget: the threads it frees find their jobs */
    update_rebalance();
    hand_on();
    pthread_mutex_unlock(&pool.mu);
}

void tr_parallel_last_job(tr_parallel_job_info_t *info)
{
    *info = last_job;
}

void tr_parallel_stats(tr_parallel_stats_t *stats, int reset)
{
    pthread_mutex_lock(&pool.mu);
    *stats = (tr_parallel_stats_t){.budget = tr_parallel_threads(),
                                   .running = pool.running,
                                   .peak_running = pool.peak_running,
                                   .jobs = pool.n_jobs,
                                   .waits = pool.waits};
    if (reset) {
        pool.peak_running = pool.running;
        pool.waits = 0;
    }
    pthread_mutex_unlock(&pool.mu);
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
