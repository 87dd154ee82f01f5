/* Busy workers that share a CPU move apart (runtime/core/spread.c). The test stacks both workers
 * on one CPU while a thread outside the runtime keeps another busy (the layout Linux's
 * balancer leaves alone) and checks that they end up on different CPUs, counted in
 * tr_runtime_stats().worker_moves; and that a runtime created by a thread pinned to one CPU
 * never moves its workers off it. Needs two CPUs in the process's mask; skips otherwise. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "thread_testing.h"
#include "troupe.h"

static atomic_int stop_all;

/* The calling thread's mask in *mask and its two first CPUs; false when it has fewer than
 * two. */
static bool two_cpus(cpu_set_t *mask, int *a, int *b)
{
    assert_int_equal(sched_getaffinity(0, sizeof(*mask), mask), 0);
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, mask)) *(n++ ? b : a) = c;
    if (n < 2) print_message("fewer than two CPUs to run on\n");
    return n == 2;
}

/* The CPU thread tid last ran on: field 39 of its stat. */
static int cpu_of(pid_t tid)
{
    char path[64], line[1024];
    snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    char *p = strrchr(line, ')'); /* the name may hold spaces; the fields after it do not */
    assert_non_null(p);
    int field = 2, cpu = -1;
    for (char *t = strtok(p + 1, " "); t; t = strtok(NULL, " "))
        if (++field == 39) cpu = atoi(t);
    return cpu;
}

static void set_cpu(pid_t tid, int cpu)
{
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    assert_int_equal(sched_setaffinity(tid, sizeof(one), &one), 0);
}

static atomic_int handled[2];

/* An actor that stays busy: each message spins 100 us and sends the next to itself. */
static int busy(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    atomic_fetch_add((atomic_int *)ctx->state, 1);
    if (atomic_load(&stop_all)) return tr_actor_stop(ctx->rt, ctx->self);
    uint64_t t0 = tr_now_ns();
    while (tr_now_ns() - t0 < 100000)
        ;
    return tr_actor_send(ctx->rt, ctx->self, tr_msg_alloc(ctx->rt, TR_MSG_USER, 0));
}

static void *hog(void *arg)
{
    set_cpu(0, *(int *)arg);
    while (!atomic_load(&stop_all))
        ;
    return NULL;
}

/* Two busy actors on a two-worker runtime, both running (each worker has one: a worker
 * that finds the other's second actor queued steals it); workers gets its workers' tids. */
static tr_runtime_t *start_busy(pid_t workers[2])
{
    atomic_store(&stop_all, 0);
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 2}), 0);
    for (int i = 0; i < 2; i++) {
        tr_actor_t a;
        atomic_store(&handled[i], 0);
        assert_int_equal(tr_actor_spawn(rt, busy, &handled[i], NULL, &a), 0);
        assert_int_equal(tr_actor_send(rt, a, tr_msg_alloc(rt, TR_MSG_USER, 0)), 0);
    }
    while (atomic_load(&handled[0]) < 20 || atomic_load(&handled[1]) < 20)
        usleep(1000);
    workers[0] = tid_named("tr-worker-0");
    workers[1] = tid_named("tr-worker-1");
    return rt;
}

static void stop_busy(tr_runtime_t *rt)
{
    atomic_store(&stop_all, 1);
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
}

static void stacked_workers_move_apart(void **state)
{
    (void)state;
    cpu_set_t mask;
    int a, b;
    if (!two_cpus(&mask, &a, &b)) skip();
    atomic_store(&stop_all, 0); /* before the hog starts: it spins until stop_all */
    pthread_t h;
    assert_int_equal(pthread_create(&h, NULL, hog, &b), 0);
    pid_t w[2];
    tr_runtime_t *rt = start_busy(w);
    /* both onto CPU a, then free to run anywhere again. Linux's balancer separated them
     * only after 71-188 ms here (each is busy, and the hog keeps the other CPU busy too) */
    for (int i = 0; i < 2; i++)
        set_cpu(w[i], a);
    for (int i = 0; i < 2; i++)
        assert_int_equal(sched_setaffinity(w[i], sizeof(mask), &mask), 0);
    tr_runtime_stats_t st = {0};
    int apart = 0, ms = 0;
    for (; ms < 50 && !(apart && st.worker_moves); ms++) {
        usleep(1000);
        apart = cpu_of(w[0]) != cpu_of(w[1]);
        tr_runtime_stats(rt, &st);
    }
    print_message("workers on CPUs %d and %d after %d ms, %llu moves\n", cpu_of(w[0]), cpu_of(w[1]),
                  ms, (unsigned long long)st.worker_moves);
    stop_busy(rt);
    pthread_join(h, NULL);
    assert_true(apart);
    assert_true(st.worker_moves >= 1);
}

static void one_cpu_mask_never_moves(void **state)
{
    (void)state;
    cpu_set_t mask;
    int a, b;
    if (!two_cpus(&mask, &a, &b)) skip();
    set_cpu(0, a); /* the workers inherit the creating thread's mask */
    pid_t w[2];
    tr_runtime_t *rt = start_busy(w);
    usleep(50000);
    tr_runtime_stats_t st;
    tr_runtime_stats(rt, &st);
    int on[2] = {cpu_of(w[0]), cpu_of(w[1])};
    stop_busy(rt);
    assert_int_equal(sched_setaffinity(0, sizeof(mask), &mask), 0);
    assert_int_equal(st.worker_moves, 0);
    assert_int_equal(on[0], a);
    assert_int_equal(on[1], a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stacked_workers_move_apart),
        cmocka_unit_test(one_cpu_mask_never_moves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
