/* spread.c: busy workers that find themselves sharing a CPU, while a CPU they may run on has
 * no busy worker, move apart.
 *
 * Why: Linux wakes a thread on its waker's CPU when that looks cheaper (wake-affine), and its
 * load balancer evens out how many threads each CPU runs, not which ones share. With two
 * workers and one busy thread outside the runtime (a trainer's thread, fjthrput's sender) on
 * two CPUs, a worker woken by the other often lands on its CPU, and there the two stay: one
 * CPU with two threads and one with one is as balanced as the other way round. The runtime
 * then gets one CPU where it could have one and a half, and a sender outside it outruns its
 * receivers: their mailboxes grow to hundreds of thousands of messages, every message misses
 * in the cache, and the receivers fall further behind. Measured on fjthrput with the two
 * vCPUs far apart (bench/RESULTS.md; six alternating processes, median of 3 runs each): 80-101
 * ms with the workers left where the kernel put them, 56-66 ms with this, Go 64-89.
 *
 * How: a worker that has run actors for SPREAD_NS without running out of work publishes the
 * CPU it is on (busy_cpu), and again every SPREAD_NS while it stays busy; -1 when it runs out
 * (tr__spread_idle: a polling or parked worker takes no CPU time worth avoiding, and one woken
 * for a message or two does not look at all: bench latency's path has no look in it). When
 * it sees a busy worker with a lower index on its CPU on two looks in a row, it moves to a
 * CPU of its affinity mask where no worker is busy: it sets its mask to that CPU alone, which
 * migrates it before the call returns, and at once back to the mask it had. Nothing stays
 * pinned, so a wake-up, the balancer or the application's own sched_setaffinity may place it
 * anywhere afterwards, and a worker woken from a park still wakes on the waker's CPU (pinning
 * each worker to a CPU of its own made bench wakeup's p90 83 us against 5: a parked worker
 * then always wakes on its own, idle, vCPU). Only the higher-indexed of two stacked workers
 * moves, so they do not swap places. A mask of one CPU (an application that pinned the
 * thread creating the runtime) never moves. Each move counts in
 * tr_runtime_stats().worker_moves.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sched.h>

#include "base/clock.h"
#include "runtime/core/internal.h"

#define SPREAD_NS 1000000 /* how often a busy worker looks */

void tr__spread_init(tr_runtime_t *rt)
{
    rt->spread_ticks = tr__ns_to_ticks(SPREAD_NS);
    for (unsigned i = 0; i < rt->n_workers; i++)
        atomic_init(&rt->workers[i].busy_cpu, -1);
}

static bool cpu_busy(const tr_runtime_t *rt, int cpu, unsigned below)
{
    for (unsigned j = 0; j < below; j++)
        if (atomic_load_explicit(&rt->workers[j].busy_cpu, memory_order_relaxed) == cpu)
            return true;
    return false;
}

/* Moves the calling worker to a CPU of its mask where no worker is busy, if there is one:
 * the CPU it is on now. */
static int move_off(tr_runtime_t *rt, int from)
{
    cpu_set_t mask, one;
    if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return from;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (c == from || !CPU_ISSET(c, &mask) || cpu_busy(rt, c, rt->n_workers)) continue;
        CPU_ZERO(&one);
        CPU_SET(c, &one);
        if (sched_setaffinity(0, sizeof(one), &one) != 0) return from;
        /* the mask it had: if this fails the thread stays on c, still within it */
        (void)sched_setaffinity(0, sizeof(mask), &mask);
        atomic_fetch_add_explicit(&rt->worker_moves, 1, memory_order_relaxed);
        return c;
    }
    return from;
}

void tr__spread_look(tr_runtime_t *rt, tr__worker_t *w, uint64_t now)
{
    if (!w->spread_at) { /* busy since now: the first look comes after SPREAD_NS of it */
        w->spread_at = now + rt->spread_ticks;
        return;
    }
    if (now < w->spread_at) return;
    w->spread_at = now + rt->spread_ticks;
    int cpu = sched_getcpu();
    atomic_store_explicit(&w->busy_cpu, cpu, memory_order_relaxed);
    w->stacked = cpu >= 0 && cpu_busy(rt, cpu, w->index) ? w->stacked + 1 : 0;
    if (w->stacked < 2) return;
    w->stacked = 0;
    atomic_store_explicit(&w->busy_cpu, move_off(rt, cpu), memory_order_relaxed);
}

void tr__spread_idle(tr__worker_t *w)
{
    atomic_store_explicit(&w->busy_cpu, -1, memory_order_relaxed);
    w->spread_at = 0; /* a worker woken for a message or two never looks */
    w->stacked = 0;
}
