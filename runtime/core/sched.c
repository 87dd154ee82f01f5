/* sched.c: worker threads, run queues, stealing, parking; pinned actors' threads; the
 * deterministic scheduler.
 *
 * Design:
 * - Each worker has a bounded local run queue (mailbox/runq.h) and a run-next slot. An actor
 *   woken by a send from a running actor goes into the sender's worker's run-next slot and
 *   runs as soon as the current activation ends (cache-hot, no queue traffic); whatever it
 *   displaces goes to the back of the local queue. Other threads (main, loop, pinned) put
 *   actors on the global inject queue. A full local queue spills half to the inject queue.
 * - A worker looks for work in this order: run-next, (every 61st time) inject, its local
 *   queue, inject, then steals half of another worker's queue, or that worker's run-next if
 *   its actor has waited there more than 50 µs (next_waited: the thief sees the same
 *   placement twice that far apart; the owner only counts placements, no clock on its path).
 *   A running behaviour streaming to a cheap actor takes it back out of the slot to run it
 *   inline (tr__sched_take_next, runtime/core/actor.c).
 * - Parking: a worker that finds nothing spins briefly, then adds itself to the idle list
 *   (under idle_mu), bumps n_idle (seq_cst) and looks once more (seq_cst loads); only then
 *   sleeps on its futex word. A thread that queues work publishes it with a seq_cst store
 *   (run queue tail, inject length) and then reads n_idle (seq_cst): if some worker is idle it
 *   pops one from the list and wakes it. All four accesses are in the single seq_cst order,
 *   so either the parker sees the work or the queuer sees the parker (no fences: GCC's
 *   ThreadSanitizer does not model them).
 * - Polling: between spinning and parking, a worker out of work looks again every
 *   POLL_SLEEP_NS for TR__POLL_NS, asleep in between (no core taken). It is not parked, so a
 *   queuer does not wake it: a sender outside the runtime whose stream pauses briefly (its
 *   core shared with the workers on a small machine) finds them awake instead of paying a
 *   futex wake per send while the workers take turns parking. An idle runtime parks after
 *   TR__POLL_NS and costs nothing more. The price: a message that arrives while a polling
 *   worker sleeps waits for its next look, and on a VM a short sleep lasts several times
 *   longer than a futex wake of a parked worker. So the window is short (300 us): a sender
 *   pausing longer finds the workers parked. The measurements behind the poll and its window
 *   are in bench/RESULTS.md, "Scheduler design history (moved from sched.c)".
 * - Busy workers that find themselves sharing a CPU move apart (spread.c): a worker busy for
 *   a millisecond looks at its CPU after its activations, with the clock they last read, and
 *   again each millisecond; a worker out of work counts as on no CPU.
 * - Pinned actors have a thread each, sleeping on a futex word with three states: IDLE,
 *   SIGNALED, EXITED. Scheduling is a CAS IDLE -> SIGNALED plus a wake; the thread leaves
 *   only by CAS IDLE -> EXITED once its actor is dead, after which its (dead) actor's stray
 *   messages are drained by the workers. The thread is created before the actor is
 *   published ("dead" then means: a generation other than the one it started with), so a
 *   thread that cannot be created fails the spawn instead of leaving a half-started actor.
 * - Deterministic mode has no worker thread: tr_runtime_run runs one scheduler loop on the
 *   caller, picking the next actor from the ready set with a seeded PRNG, one message per
 *   activation. Same seed and same inputs, same order.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "runtime/core/futex.h"
#include "runtime/core/internal.h"
#include "troupe/log.h"
#include "troupe/rng.h"

#define SPIN_ROUNDS 24
#define SPIN_PAUSES 16
/* a polling worker's sleep between looks (TR__POLL_NS: for how long) */
#define POLL_SLEEP_NS 10000
#define INJECT_EVERY  61

static tr__actor_t *from_qnode(tr__qnode_t *n)
{
    return n ? (tr__actor_t *)((char *)n - offsetof(tr__actor_t, qnode)) : NULL;
}

/* --- waking and parking ---------------------------------------------------------------- */

static void notify(tr_runtime_t *rt)
{
    /* seq_cst: after the queue's seq_cst publication of the work, before the parker's
     * seq_cst n_idle increment or after it (see design block) */
    if (atomic_load_explicit(&rt->n_idle, memory_order_seq_cst) == 0) return;
    pthread_mutex_lock(&rt->idle_mu);
    tr__worker_t *w = rt->idle;
    if (w) {
        rt->idle = w->next_idle;
        w->in_idle_list = false;
        atomic_fetch_sub_explicit(&rt->n_idle, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&rt->idle_mu);
    if (w) {
        /* release: pairs with the parker's acquire load of its word */
        atomic_store_explicit(&w->parked, 0, memory_order_release);
        tr__futex_wake(&w->parked, 1);
    }
}

static bool work_visible(tr_runtime_t *rt)
{
    if (tr__inject_nonempty(&rt->inject)) return true;
    for (unsigned i = 0; i < rt->n_workers; i++)
        if (tr__runq_len(&rt->workers[i].runq)) return true;
    return false;
}

static void leave_idle_list(tr_runtime_t *rt, tr__worker_t *w)
{
    pthread_mutex_lock(&rt->idle_mu);
    if (w->in_idle_list) {
        tr__worker_t **p = &rt->idle;
        while (*p != w)
            p = &(*p)->next_idle;
        *p = w->next_idle;
        w->in_idle_list = false;
        atomic_fetch_sub_explicit(&rt->n_idle, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&rt->idle_mu);
    atomic_store_explicit(&w->parked, 0, memory_order_relaxed);
}

static void park(tr_runtime_t *rt, tr__worker_t *w)
{
    tr__pool_flush(w->pool);
    pthread_mutex_lock(&rt->idle_mu);
    w->next_idle = rt->idle;
    rt->idle = w;
    w->in_idle_list = true;
    /* seq_cst: if tr__sched_stop's store of 0 comes before this one, its store of `stopping`
     * comes before the load of it below */
    atomic_store_explicit(&w->parked, 1, memory_order_seq_cst);
    /* seq_cst: pairs with notify()'s seq_cst load; work_visible's loads are seq_cst too */
    atomic_fetch_add_explicit(&rt->n_idle, 1, memory_order_seq_cst);
    pthread_mutex_unlock(&rt->idle_mu);
    if (work_visible(rt) || atomic_load_explicit(&rt->stopping, memory_order_seq_cst)) {
        leave_idle_list(rt, w);
        return;
    }
    atomic_fetch_add_explicit(&rt->parks, 1, memory_order_relaxed);
    /* acquire: pairs with notify()'s release store */
    while (atomic_load_explicit(&w->parked, memory_order_acquire) == 1 &&
           !atomic_load_explicit(&rt->stopping, memory_order_relaxed))
        tr__futex_wait(&w->parked, 1);
    leave_idle_list(rt, w); /* only does something when woken by close */
}

/* --- queues ---------------------------------------------------------------------------- */

static void inject(tr_runtime_t *rt, tr__actor_t *a)
{
    tr__qnode_t *n = &a->qnode;
    tr__inject_push(&rt->inject, &n, 1);
}

static void push_local(tr_runtime_t *rt, tr__worker_t *w, tr__actor_t *a)
{
    if (tr__runq_push(&w->runq, a)) return;
    void *half[TR__RUNQ_CAP / 2 + 1];
    uint32_t n = tr__runq_take_half(&w->runq, half, TR__RUNQ_CAP / 2);
    half[n++] = a;
    tr__qnode_t *nodes[TR__RUNQ_CAP / 2 + 1];
    for (uint32_t i = 0; i < n; i++)
        nodes[i] = &((tr__actor_t *)half[i])->qnode;
    tr__inject_push(&rt->inject, nodes, n);
}

static void ready_push(tr__worker_t *w, tr__actor_t *a)
{
    if (w->n_ready == w->cap_ready) {
        size_t cap = w->cap_ready ? w->cap_ready * 2 : 64;
        tr__actor_t **r = realloc(w->ready, cap * sizeof(*r));
        if (!r) {
            tr_log(TR_LOG_ERROR, "out of memory growing the deterministic ready set");
            abort();
        }
        w->ready = r;
        w->cap_ready = cap;
    }
    w->ready[w->n_ready++] = a;
}

static void wake_deterministic(tr_runtime_t *rt, tr__actor_t *a)
{
    inject(rt, a);
    pthread_mutex_lock(&rt->mu);
    pthread_cond_broadcast(&rt->done_cv);
    pthread_mutex_unlock(&rt->mu);
}

/* Hands a pinned actor to its thread; false when that thread has exited. */
static bool pin_signal(tr__pinned_t *p)
{
    uint32_t s = TR__PIN_IDLE;
    /* seq_cst: exactly one of a signaller and an exiting thread wins the IDLE state */
    if (atomic_compare_exchange_strong_explicit(&p->state, &s, TR__PIN_SIGNALED,
                                                memory_order_seq_cst, memory_order_relaxed)) {
        tr__futex_wake(&p->state, 1);
        return true;
    }
    return s == TR__PIN_SIGNALED;
}

void tr__sched_schedule(tr_runtime_t *rt, tr__actor_t *a)
{
    tr__sched_schedule_as(rt, a, false);
}

void tr__sched_schedule_as(tr_runtime_t *rt, tr__actor_t *a, bool parallel)
{
    if (atomic_load_explicit(&a->pinned, memory_order_relaxed) && pin_signal(a->pin)) return;
    tr__worker_t *w = tr__tls.rt == rt ? tr__tls.worker : NULL;
    if (rt->deterministic) {
        if (w)
            ready_push(w, a);
        else
            wake_deterministic(rt, a);
        return;
    }
    if (w) {
        if (tr__tls.actor && !parallel) {
            atomic_store_explicit(&w->next_placed,
                                  atomic_load_explicit(&w->next_placed, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
            /* acq_rel: hands a (and its mailbox state) to whoever takes the slot */
            a = atomic_exchange_explicit(&w->run_next, a, memory_order_acq_rel);
            if (!a) return;
        }
        push_local(rt, w, a);
    } else {
        inject(rt, a);
    }
    notify(rt);
}

bool tr__sched_is_next(tr__worker_t *w, const tr__actor_t *a)
{
    return w && atomic_load_explicit(&w->run_next, memory_order_relaxed) == a;
}

bool tr__sched_take_next(tr__worker_t *w, tr__actor_t *a)
{
    tr__actor_t *want = a;
    /* acq_rel: takes a from the slot as find_work would (see tr__sched_schedule_as) */
    return atomic_compare_exchange_strong_explicit(&w->run_next, &want, NULL, memory_order_acq_rel,
                                                   memory_order_relaxed);
}

void tr__sched_reschedule(tr_runtime_t *rt, tr__worker_t *w, tr__actor_t *a)
{
    if (!w) { /* the pinned actor's own thread: run again without sleeping */
        atomic_store_explicit(&a->pin->state, TR__PIN_SIGNALED, memory_order_relaxed);
        return;
    }
    if (w->deterministic) {
        ready_push(w, a);
        return;
    }
    push_local(rt, w, a);
    notify(rt);
}

/* --- finding work ---------------------------------------------------------------------- */

/* Whether v's run-next actor has waited there longer than rt->steal_next_ticks: the same
 * placement (v's next_placed) seen by this thief that long ago. The victim only counts its
 * placements; the clock is read here, by the idle thief. */
static bool next_waited(tr_runtime_t *rt, tr__worker_t *w, tr__worker_t *v, uint64_t *now)
{
    tr__next_seen_t *s = &w->next_seen[v->index];
    uint64_t placed = atomic_load_explicit(&v->next_placed, memory_order_relaxed);
    *now = *now ? *now : tr__ticks();
    if (s->placed != placed || !s->since) {
        *s = (tr__next_seen_t){placed, *now};
        return false;
    }
    return *now - s->since > rt->steal_next_ticks;
}

static tr__actor_t *steal(tr_runtime_t *rt, tr__worker_t *w)
{
    unsigned n = rt->n_workers;
    if (n < 2) return NULL;
    /* splitmix64: good enough to pick victims and, in deterministic mode, the next actor */
    unsigned start = (unsigned)(tr_rng_next(&w->rng) % n);
    uint64_t now = 0;
    for (unsigned i = 0; i < n; i++) {
        tr__worker_t *v = &rt->workers[(start + i) % n];
        if (v == w) continue;
        tr__actor_t *a = tr__runq_steal(&w->runq, &v->runq);
        /* acquire: the placement count stored before the placing exchange (release) */
        if (!a && atomic_load_explicit(&v->run_next, memory_order_acquire) &&
            next_waited(rt, w, v, &now))
            a = atomic_exchange_explicit(&v->run_next, NULL, memory_order_acq_rel);
        if (a) {
            atomic_fetch_add_explicit(&rt->steals, 1, memory_order_relaxed);
            return a;
        }
    }
    return NULL;
}

static tr__actor_t *find_work(tr_runtime_t *rt, tr__worker_t *w)
{
    /* acq_rel: takes the actor handed over by tr__sched_schedule */
    tr__actor_t *a = atomic_exchange_explicit(&w->run_next, NULL, memory_order_acq_rel);
    if (a) return a;
    if (++w->tick % INJECT_EVERY == 0 && (a = from_qnode(tr__inject_pop(&rt->inject)))) return a;
    if ((a = tr__runq_pop(&w->runq))) return a;
    if ((a = from_qnode(tr__inject_pop(&rt->inject)))) return a;
    return steal(rt, w);
}

static tr__actor_t *find_work_or_park(tr_runtime_t *rt, tr__worker_t *w)
{
    for (int round = 0; round < SPIN_ROUNDS; round++) {
        tr__actor_t *a = find_work(rt, w);
        if (a) return a;
        for (int i = 0; i < SPIN_PAUSES; i++)
            tr__cpu_relax();
    }
    /* then polls, sleeping between looks, before it parks (see the design block) */
    tr__spread_idle(w);
    uint64_t until = tr__ticks() + rt->poll_ticks;
    while (tr__ticks() < until && !atomic_load_explicit(&rt->stopping, memory_order_relaxed)) {
        nanosleep(&(struct timespec){0, POLL_SLEEP_NS}, NULL);
        tr__actor_t *a = find_work(rt, w);
        if (a) return a;
    }
    park(rt, w);
    return NULL;
}

/* A thread's first malloc makes its arena (glibc: an mmap), and its first allocations fault
 * in the arena's pages (~30 us on a VM): done by the worker before it runs anything, not
 * inside the first behaviours that allocate (a timer's start, which bench latency measured).
 * 64 KiB stays below glibc's trim threshold: the pages stay with the arena. */
static void warm_arena(void)
{
    enum { BYTES = 64 * 1024, PAGE = 4096 };
    volatile char *p = malloc(BYTES); /* volatile: the writes, and so the pair, are kept */
    for (size_t off = 0; p && off < BYTES; off += PAGE)
        p[off] = 0;
    free((void *)p);
}

static void *worker_main(void *arg)
{
    tr__worker_t *w = arg;
    tr_runtime_t *rt = w->rt;
    tr__tls.rt = rt;
    tr__tls.worker = w;
    warm_arena();
    w->pool = tr__thread_pool(rt);
    while (!atomic_load_explicit(&rt->stopping, memory_order_relaxed)) {
        tr__actor_t *a = find_work_or_park(rt, w);
        if (!a) continue;
        /* Actors queued here run interleaved with the first (tr__actor_run_group): at most
         * half of those queued, so that an idle worker still finds the rest to steal. */
        tr__actor_t *group[TR__GROUP_MAX] = {a};
        uint32_t queued = tr__runq_len(&w->runq);
        uint32_t take = rt->n_workers > 1 ? queued / 2 : queued;
        int k = 1;
        while (take-- > 0 && k < TR__GROUP_MAX && (group[k] = tr__runq_pop(&w->runq)))
            k++;
        tr__spread_look(rt, w, tr__actor_run_group(rt, w, group, k));
    }
    tr__pool_flush(w->pool);
    tr__tls = (tr__tls_t){0};
    return NULL;
}

int tr__sched_start(tr_runtime_t *rt)
{
    if (rt->deterministic) return 0;
    for (unsigned i = 0; i < rt->n_workers; i++) {
        char name[32]; /* cut to 15 bytes, the kernel's limit, by tr__thread_create */
        snprintf(name, sizeof(name), "tr-worker-%u", i);
        int rc = tr__thread_create(rt, &rt->workers[i].thread, worker_main, &rt->workers[i], name);
        if (rc) {
            atomic_store(&rt->stopping, 1);
            for (unsigned j = 0; j < i; j++) {
                atomic_store(&rt->workers[j].parked, 0);
                tr__futex_wake(&rt->workers[j].parked, 1);
                pthread_join(rt->workers[j].thread, NULL);
            }
            return -rc;
        }
    }
    return 0;
}

/* --- pinned actors --------------------------------------------------------------------- */

static void *pinned_main(void *arg)
{
    tr__pinned_t *p = arg;
    tr_runtime_t *rt = p->rt;
    tr__tls.rt = rt;
    tr__tls.worker = NULL;
    for (;;) {
        if (atomic_load_explicit(&rt->stopping, memory_order_relaxed)) break;
        uint32_t s = atomic_load_explicit(&p->state, memory_order_acquire);
        if (s == TR__PIN_IDLE) {
            /* gen0: the thread starts before its actor is published and waits for it */
            uint32_t gen = atomic_load_explicit(&p->actor->gen, memory_order_acquire);
            if (!(gen & 1) && gen != p->gen0 &&
                atomic_compare_exchange_strong_explicit(&p->state, &s, TR__PIN_EXITED,
                                                        memory_order_seq_cst, memory_order_relaxed))
                break; /* dead and idle: strays go to the workers from now on */
            tr__futex_wait(&p->state, TR__PIN_IDLE);
            continue;
        }
        atomic_store_explicit(&p->state, TR__PIN_IDLE, memory_order_seq_cst);
        tr__actor_run(rt, NULL, p->actor);
    }
    tr__pool_flush(tr__thread_pool(rt));
    tr__tls = (tr__tls_t){0};
    return NULL;
}

int tr__pinned_prepare(tr_runtime_t *rt, tr__actor_t *a)
{
    tr__pinned_t *p = calloc(1, sizeof(*p));
    if (!p) return TR_ENOMEM;
    atomic_init(&p->state, TR__PIN_IDLE);
    p->gen0 = atomic_load_explicit(&a->gen, memory_order_relaxed);
    p->rt = rt;
    p->actor = a;
    a->pin = p;
    return 0;
}

/* Starts the thread of a prepared, not yet published pinned actor. On failure frees what
 * prepare made and returns the error: the caller gives the slot up unpublished. */
int tr__pinned_launch(tr_runtime_t *rt, tr__actor_t *a)
{
    tr__pinned_t *p = a->pin;
    char name[48]; /* cut to 15 bytes, the kernel's limit, by tr__thread_create */
    if (a->name[0])
        snprintf(name, sizeof(name), "tr-pin-%s", a->name);
    else
        snprintf(name, sizeof(name), "tr-pin-%u", a->slot);
    int rc = tr__thread_create(rt, &p->thread, pinned_main, p, name);
    if (rc) {
        a->pin = NULL;
        free(p);
        return -rc;
    }
    pthread_mutex_lock(&rt->mu);
    p->next = rt->pinned;
    rt->pinned = p;
    pthread_mutex_unlock(&rt->mu);
    return 0;
}

void tr__sched_stop(tr_runtime_t *rt)
{
    atomic_store(&rt->stopping, 1);
    if (!rt->deterministic) {
        for (unsigned i = 0; i < rt->n_workers; i++) {
            atomic_store(&rt->workers[i].parked, 0);
            tr__futex_wake(&rt->workers[i].parked, 1);
        }
        for (unsigned i = 0; i < rt->n_workers; i++)
            pthread_join(rt->workers[i].thread, NULL);
    }
    pthread_mutex_lock(&rt->mu);
    tr__pinned_t *p = rt->pinned;
    rt->pinned = NULL;
    pthread_mutex_unlock(&rt->mu);
    while (p) {
        tr__pinned_t *next = p->next;
        uint32_t s = TR__PIN_IDLE;
        atomic_compare_exchange_strong(&p->state, &s, TR__PIN_SIGNALED);
        tr__futex_wake(&p->state, 1);
        pthread_join(p->thread, NULL);
        free(p);
        p = next;
    }
}

/* --- deterministic mode ---------------------------------------------------------------- */

void tr__sched_run_deterministic(tr_runtime_t *rt)
{
    tr__worker_t *w = &rt->workers[0];
    tr__tls.rt = rt;
    tr__tls.worker = w;
    w->pool = tr__thread_pool(rt);
    while (atomic_load_explicit(&rt->alive, memory_order_acquire) > 0 || w->n_ready) {
        tr__actor_t *a;
        while ((a = from_qnode(tr__inject_pop(&rt->inject))))
            ready_push(w, a);
        if (w->n_ready == 0) {
            pthread_mutex_lock(&rt->mu);
            while (!tr__inject_nonempty(&rt->inject) &&
                   atomic_load_explicit(&rt->alive, memory_order_acquire) > 0)
                pthread_cond_wait(&rt->done_cv, &rt->mu);
            pthread_mutex_unlock(&rt->mu);
            continue;
        }
        size_t i = (size_t)(tr_rng_next(&w->rng) % w->n_ready);
        a = w->ready[i];
        w->ready[i] = w->ready[--w->n_ready];
        tr__actor_run(rt, w, a);
    }
    tr__tls.worker = NULL;
}
