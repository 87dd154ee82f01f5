/* A push held in flight: a sender that has exchanged a mailbox's head but not yet linked its
 * message (what a sender preempted between the two steps leaves; mailbox/mpscq.h). The
 * receiver stays scheduled with nothing to pop, so the worker keeps running it empty and
 * yields its core every few tries (runtime/core/actor.c, after_empty_run). These tests hold such
 * a push open on purpose, through the mailbox's own steps, and check that the runtime goes
 * on serving other actors meanwhile and delivers the held message, once and in order, when
 * the link lands. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "runtime/core/internal.h"
#include "troupe.h"

enum { MSG_N = TR_MSG_USER + 1, HOLD_MS = 30, OTHERS = 200 };

typedef struct seen {
    _Atomic uint64_t count;
    _Atomic uint64_t order_ok; /* 1 while every value came in the order sent */
    uint64_t next;             /* the receiver's own: the value it expects next */
} seen_t;

static int note(tr_ctx_t *ctx, tr_msg_t *m)
{
    seen_t *s = ctx->state;
    if (m->type != MSG_N) return 0; /* the shutdown's stop */
    uint64_t v;
    memcpy(&v, tr_msg_body(m), sizeof(v));
    if (v != s->next) atomic_store(&s->order_ok, 0);
    s->next = v + 1;
    atomic_fetch_add(&s->count, 1);
    return 0;
}

static tr_msg_t *numbered(tr_runtime_t *rt, uint64_t v)
{
    tr_msg_t *m = tr_msg_alloc(rt, MSG_N, sizeof(v));
    assert_non_null(m);
    memcpy(tr_msg_body(m), &v, sizeof(v));
    return m;
}

static void sleep_ms(unsigned ms)
{
    nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000L}, NULL);
}

static void wait_count(seen_t *s, uint64_t want)
{
    for (int i = 0; i < 10000 && atomic_load(&s->count) < want; i++)
        sleep_ms(1);
    assert_int_equal(atomic_load(&s->count), want);
}

/* A push's first step (mailbox/mpscq.h) on to's mailbox, scheduling the receiver as a sender
 * whose exchange found it idle would; returns what the second step links to. */
static uintptr_t push_exchange_only(tr_runtime_t *rt, tr_actor_t to, tr_msg_t *m)
{
    tr__actor_t *a = tr__actor_lookup(rt, to);
    assert_non_null(a);
    m->receiver = to;
    uintptr_t prev = tr__mpscq_push_exchange(&a->data_in, m, 1);
    if (prev & TR__MARK_EMPTY) tr__sched_schedule(rt, a);
    return prev;
}

static void held_push(unsigned workers)
{
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = workers}), 0);
    seen_t held = {.order_ok = 1}, other = {.order_ok = 1};
    tr_actor_t h, o;
    assert_int_equal(tr_actor_spawn(rt, note, &held, NULL, &h), 0);
    assert_int_equal(tr_actor_spawn(rt, note, &other, NULL, &o), 0);
    assert_int_equal(tr_actor_send(rt, h, numbered(rt, 0)), 0);
    wait_count(&held, 1);

    tr_msg_t *m1 = numbered(rt, 1);
    uintptr_t prev = push_exchange_only(rt, h, m1);
    /* meanwhile the worker runs the held actor empty, over and over; others still run */
    for (uint64_t i = 0; i < OTHERS; i++)
        assert_int_equal(tr_actor_send(rt, o, numbered(rt, i)), 0);
    wait_count(&other, OTHERS);
    sleep_ms(HOLD_MS);
    assert_int_equal(atomic_load(&held.count), 1);
    tr_actor_stats_t st;
    assert_int_equal(tr_actor_stats(rt, h, &st), 0);
    printf("held %d ms: %llu empty activations of the held actor\n", HOLD_MS,
           (unsigned long long)(st.activations - 1));
    assert_true(st.activations > 2); /* it was kept scheduled, not marked idle */

    /* the second step: the link; the held message and the ones after it arrive in order */
    tr__mpscq_push_link(prev, m1);
    for (uint64_t v = 2; v < 10; v++)
        assert_int_equal(tr_actor_send(rt, h, numbered(rt, v)), 0);
    wait_count(&held, 10);
    assert_int_equal(atomic_load(&held.order_ok), 1);
    assert_int_equal(atomic_load(&other.order_ok), 1);

    tr_runtime_shutdown(rt, "test");
    assert_int_equal(tr_runtime_run(rt), 0);
    assert_int_equal(atomic_load(&held.count), 10); /* nothing delivered twice */
    tr_runtime_close(rt);
}

static void test_inflight_one_worker_serves_others_and_delivers(void **state)
{
    held_push(1);
}

static void test_inflight_two_workers_serve_others_and_deliver(void **state)
{
    held_push(2);
}

static double clock_s(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* What the yield is for: the preempted sender gets the core. Everything runs on one CPU; while
 * the worker runs the held actor empty, this thread computes for CPU_MS of its own CPU time,
 * standing in for the sender that must get back on the core. A worker that spun without
 * yielding would take half the CPU (wall ~2x the CPU time); yielding, it takes little. */
static void test_inflight_held_push_leaves_the_core_to_the_sender(void **state)
{
    enum { CPU_MS = 60 };
    cpu_set_t one, old;
    assert_int_equal(sched_getaffinity(0, sizeof(old), &old), 0);
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0); /* the runtime's threads too */
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 1}), 0);
    seen_t held = {.order_ok = 1};
    tr_actor_t h;
    assert_int_equal(tr_actor_spawn(rt, note, &held, NULL, &h), 0);
    assert_int_equal(tr_actor_send(rt, h, numbered(rt, 0)), 0);
    wait_count(&held, 1);
    tr_msg_t *m1 = numbered(rt, 1);
    uintptr_t prev = push_exchange_only(rt, h, m1);

    double wall0 = clock_s(CLOCK_MONOTONIC), cpu0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    volatile uint64_t x = 0;
    while (clock_s(CLOCK_THREAD_CPUTIME_ID) - cpu0 < CPU_MS / 1e3)
        for (int i = 0; i < 10000; i++)
            x = x + (uint64_t)i;
    double wall = clock_s(CLOCK_MONOTONIC) - wall0, cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    printf("the sender's %.0f ms of CPU took %.0f ms on the core shared with the spinning "
           "worker\n",
           cpu * 1e3, wall * 1e3);

    tr__mpscq_push_link(prev, m1);
    wait_count(&held, 2);
    tr_runtime_shutdown(rt, "test");
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
    assert_int_equal(sched_setaffinity(0, sizeof(old), &old), 0);
    assert_true(wall < 1.5 * cpu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inflight_one_worker_serves_others_and_delivers),
        cmocka_unit_test(test_inflight_two_workers_serve_others_and_deliver),
        cmocka_unit_test(test_inflight_held_push_leaves_the_core_to_the_sender),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
