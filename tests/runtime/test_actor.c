/* Actors: delivery, per-sender FIFO, the urgent lane, chains, stop, stats, pinned actors,
 * init and cleanup, graceful shutdown. */
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "troupe.h"

enum { MSG_NUM = TR_MSG_USER, MSG_DONE };

typedef struct num {
    uint32_t producer;
    uint64_t value;
} num_t;

static tr_msg_t *num_msg(tr_runtime_t *rt, uint32_t type, uint32_t producer, uint64_t value)
{
    tr_msg_t *m = tr_msg_alloc(rt, type, sizeof(num_t));
    assert_non_null(m);
    num_t *n = tr_msg_body(m);
    n->producer = producer;
    n->value = value;
    return m;
}

static tr_runtime_t *start(unsigned workers)
{
    tr_runtime_t *rt;
    tr_runtime_opts_t o = {.n_workers = workers};
    assert_int_equal(tr_runtime_init(&rt, &o), 0);
    return rt;
}

/* --- per-sender FIFO from several external threads ------------------------------------- */

#define THREADS    4
#define PER_THREAD 20000

typedef struct fifo_state {
    uint64_t next[THREADS];
    uint64_t total;
    int errors;
} fifo_state_t;

static int fifo_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    fifo_state_t *s = ctx->state;
    num_t *n = tr_msg_body(msg);
    if (n->value != s->next[n->producer]) s->errors++;
    s->next[n->producer] = n->value + 1;
    if (++s->total == THREADS * PER_THREAD) tr_actor_stop(ctx->rt, ctx->self);
    return 0;
}

typedef struct producer_arg {
    tr_runtime_t *rt;
    tr_actor_t to;
    uint32_t id;
} producer_arg_t;

static void *producer_thread(void *p)
{
    producer_arg_t *a = p;
    for (uint64_t i = 0; i < PER_THREAD; i++)
        assert_int_equal(tr_actor_send(a->rt, a->to, num_msg(a->rt, MSG_NUM, a->id, i)), 0);
    return NULL;
}

static void test_actor_per_sender_fifo_from_threads(void **state)
{
    tr_runtime_t *rt = start(2);
    fifo_state_t s = {0};
    tr_actor_t a;
    assert_int_equal(tr_actor_spawn(rt, fifo_behaviour, &s, NULL, &a), 0);
    pthread_t t[THREADS];
    producer_arg_t args[THREADS];
    for (uint32_t i = 0; i < THREADS; i++) {
        args[i] = (producer_arg_t){rt, a, i};
        pthread_create(&t[i], NULL, producer_thread, &args[i]);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(tr_runtime_run(rt), 0);
    assert_int_equal(s.errors, 0);
    assert_int_equal(s.total, THREADS * PER_THREAD);
    tr_runtime_close(rt);
}

/* --- the urgent lane is drained first -------------------------------------------------- */

typedef struct order_state {
    uint64_t seen[16];
    int n;
} order_state_t;

static int record(tr_ctx_t *ctx, tr_msg_t *msg)
{
    order_state_t *s = ctx->state;
    s->seen[s->n++] = ((num_t *)tr_msg_body(msg))->value;
    if (s->n == 6) tr_actor_stop(ctx->rt, ctx->self);
    return 0;
}

static int blocker(tr_ctx_t *ctx, tr_msg_t *msg)
{
    /* sends to `target` while it is not running: three data, then three urgent */
    tr_actor_t target = *(tr_actor_t *)ctx->state;
    for (uint64_t i = 0; i < 3; i++)
        tr_actor_send(ctx->rt, target, num_msg(ctx->rt, MSG_NUM, 0, i));
    for (uint64_t i = 100; i < 103; i++)
        tr_actor_send_urgent(ctx->rt, target, num_msg(ctx->rt, MSG_NUM, 0, i));
    return tr_actor_stop(ctx->rt, ctx->self);
}

static void test_actor_urgent_lane_is_drained_first(void **state)
{
    tr_runtime_opts_t o = {.deterministic = 1, .seed = 7};
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &o), 0);
    order_state_t s = {0};
    tr_actor_t target, b;
    assert_int_equal(tr_actor_spawn(rt, record, &s, NULL, &target), 0);
    assert_int_equal(tr_actor_spawn(rt, blocker, &target, NULL, &b), 0);
    tr_actor_send(rt, b, num_msg(rt, MSG_NUM, 0, 0));
    assert_int_equal(tr_runtime_run(rt), 0);
    uint64_t expect[6] = {100, 101, 102, 0, 1, 2};
    assert_memory_equal(s.seen, expect, sizeof(expect));
    tr_runtime_close(rt);
}

/* --- chains, stop, stats ----------------------------------------------------------------- */

typedef struct count_state {
    _Atomic uint64_t handled;
    _Atomic int cleanups;
    _Atomic int inits;
    int cleanup_reason;
} count_state_t;

static int counter(tr_ctx_t *ctx, tr_msg_t *msg)
{
    count_state_t *s = ctx->state;
    atomic_fetch_add(&s->handled, 1);
    if (msg->type == MSG_DONE) tr_actor_stop(ctx->rt, ctx->self);
    return 0;
}

static int count_init(tr_ctx_t *ctx)
{
    atomic_fetch_add(&((count_state_t *)ctx->state)->inits, 1);
    return 0;
}

static void count_cleanup(tr_ctx_t *ctx, int reason)
{
    count_state_t *s = ctx->state;
    s->cleanup_reason = reason;
    atomic_fetch_add(&s->cleanups, 1);
}

static void test_actor_chain_send_and_stats(void **state)
{
    tr_runtime_t *rt = start(2);
    count_state_t s = {0};
    tr_actor_opts_t o = {.name = "counter", .init = count_init, .cleanup = count_cleanup};
    tr_actor_t a;
    assert_int_equal(tr_actor_spawn(rt, counter, &s, &o, &a), 0);
    assert_string_equal(tr_actor_name(rt, a), "counter");
    tr_msg_t *chain[10];
    for (int i = 0; i < 10; i++)
        chain[i] = num_msg(rt, i == 9 ? MSG_DONE : MSG_NUM, 0, (uint64_t)i);
    assert_int_equal(tr_actor_send_chain(rt, a, chain, 10), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    assert_int_equal(atomic_load(&s.handled), 10);
    assert_int_equal(atomic_load(&s.inits), 1);
    assert_int_equal(atomic_load(&s.cleanups), 1);
    assert_int_equal(s.cleanup_reason, 0);
    /* a stopped actor refuses sends, and the message stays with the caller */
    tr_msg_t *m = num_msg(rt, MSG_NUM, 0, 0);
    assert_int_equal(tr_actor_send(rt, a, m), TR_ESTOPPED);
    tr_msg_free(rt, m);
    assert_int_equal(tr_actor_stop(rt, a), TR_ESTOPPED);
    assert_null(tr_actor_name(rt, a));
    tr_runtime_stats_t st;
    tr_runtime_stats(rt, &st);
    assert_int_equal(st.actors_alive, 0);
    assert_int_equal(st.actors_spawned, 1);
    tr_runtime_close(rt);
}

static atomic_int gate_open;

/* Its first message waits for the gate: what is sent meanwhile queues behind it. */
static int gated(tr_ctx_t *ctx, tr_msg_t *msg)
{
    (void)msg;
    while (!atomic_load(&gate_open))
        ;
    atomic_fetch_add((atomic_int *)ctx->state, 1);
    return 0;
}

/* peak_depth is the largest backlog an activation met: 100 messages queued behind a gate, the
 * first activation handles its batch of 64 and leaves 36, so 100 (the depth when that
 * activation started was 1). */
static void test_actor_peak_depth_is_the_backlog_met(void **state)
{
    (void)state;
    tr_runtime_t *rt = start(1);
    atomic_int handled = 0;
    atomic_store(&gate_open, 0);
    tr_actor_t a;
    assert_int_equal(tr_actor_spawn(rt, gated, &handled, NULL, &a), 0);
    assert_int_equal(tr_actor_send(rt, a, num_msg(rt, MSG_NUM, 0, 0)), 0);
    tr_actor_stats_t st;
    do { /* until the first message is taken: its behaviour waits at the gate */
        assert_int_equal(tr_actor_stats(rt, a, &st), 0);
    } while (st.depth != 0);
    for (int i = 1; i < 100; i++)
        assert_int_equal(tr_actor_send(rt, a, num_msg(rt, MSG_NUM, 0, (uint64_t)i)), 0);
    atomic_store(&gate_open, 1);
    while (atomic_load(&handled) < 100)
        nanosleep(&(struct timespec){0, 100000}, NULL);
    do { /* the counters are written when the activations end */
        assert_int_equal(tr_actor_stats(rt, a, &st), 0);
    } while (st.activations < 2);
    assert_int_equal(st.msgs_in, 100);
    assert_int_equal(st.depth, 0);
    assert_int_equal(st.peak_depth, 100);
    assert_int_equal(tr_actor_stop(rt, a), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
}

static void test_actor_stats_count_in_out_and_depth(void **state)
{
    tr_runtime_opts_t o = {.deterministic = 1, .seed = 1};
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &o), 0);
    count_state_t s = {0};
    tr_actor_t a;
    assert_int_equal(tr_actor_spawn(rt, counter, &s, NULL, &a), 0);
    for (int i = 0; i < 5; i++)
        tr_actor_send(rt, a, num_msg(rt, MSG_NUM, 0, 0));
    tr_actor_stats_t st;
    assert_int_equal(tr_actor_stats(rt, a, &st), 0); /* nothing runs before tr_runtime_run */
    assert_int_equal(st.depth, 5);
    assert_int_equal(st.msgs_in, 0);
    tr_actor_send(rt, a, num_msg(rt, MSG_DONE, 0, 0));
    assert_int_equal(tr_runtime_run(rt), 0);
    assert_int_equal(tr_actor_stats(rt, a, &st), TR_ESTOPPED);
    assert_int_equal(tr_actor_stats(rt, (tr_actor_t){((uint64_t)1 << 32) | 999}, &st), TR_ENOACTOR);
    tr_runtime_close(rt);
}

/* --- stop from outside, while messages are queued -------------------------------------- */

static int slow(tr_ctx_t *ctx, tr_msg_t *msg)
{
    count_state_t *s = ctx->state;
    atomic_fetch_add(&s->handled, 1);
    return 0;
}

static void test_actor_stop_from_outside_drops_the_rest(void **state)
{
    tr_runtime_opts_t o = {.deterministic = 1, .seed = 3};
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &o), 0);
    count_state_t s = {0};
    tr_actor_opts_t ao = {.cleanup = count_cleanup};
    tr_actor_t a;
    assert_int_equal(tr_actor_spawn(rt, slow, &s, &ao, &a), 0);
    for (int i = 0; i < 100; i++)
        tr_actor_send(rt, a, num_msg(rt, MSG_NUM, 0, 0));
    assert_int_equal(tr_actor_stop(rt, a), 0); /* urgent: before any queued message */
    assert_int_equal(tr_runtime_run(rt), 0);
    assert_int_equal(atomic_load(&s.handled), 0);
    assert_int_equal(atomic_load(&s.cleanups), 1);
    tr_runtime_stats_t st;
    tr_runtime_stats(rt, &st);
    assert_int_equal(st.dead_letters, 100);
    tr_runtime_close(rt);
}

/* --- pinned actors run on one dedicated thread ----------------------------------------- */

typedef struct pin_state {
    pthread_t first;
    int n, same;
} pin_state_t;

static int pinned_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    pin_state_t *s = ctx->state;
    if (s->n++ == 0) s->first = pthread_self();
    s->same += pthread_equal(s->first, pthread_self()) != 0;
    if (msg->type == MSG_DONE) tr_actor_stop(ctx->rt, ctx->self);
    return 0;
}

static void test_actor_pinned_runs_on_its_own_thread(void **state)
{
    for (int round = 0; round < 20; round++) {
        tr_runtime_t *rt = start(2);
        pin_state_t s[3] = {{0}};
        static const char *const names[3] = {"pinned-0", "pinned-1", "pinned-2"};
        tr_actor_t a[3];
        for (int k = 0; k < 3; k++) {
            tr_actor_opts_t o = {.name = names[k], .pinned = 1};
            assert_int_equal(tr_actor_spawn(rt, pinned_behaviour, &s[k], &o, &a[k]), 0);
        }
        for (int i = 0; i < 1000; i++)
            for (int k = 0; k < 3; k++)
                tr_actor_send(rt, a[k], num_msg(rt, i == 999 ? MSG_DONE : MSG_NUM, 0, 0));
        assert_int_equal(tr_runtime_run(rt), 0);
        for (int k = 0; k < 3; k++) {
            assert_int_equal(s[k].n, 1000);
            assert_int_equal(s[k].same, 1000);
            assert_false(pthread_equal(s[k].first, pthread_self()));
        }
        assert_false(pthread_equal(s[0].first, s[1].first));
        tr_runtime_close(rt);
    }
}

/* --- graceful shutdown ----------------------------------------------------------------- */

typedef struct stop_state {
    char reason[48];
    int deferred;
} stop_state_t;

static int stoppable(tr_ctx_t *ctx, tr_msg_t *msg)
{
    stop_state_t *s = ctx->state;
    if (msg->type == TR_MSG_STOP) {
        snprintf(s->reason, sizeof(s->reason), "%s", TR_MSG_AS(msg, stop)->reason);
        if (s->deferred) /* finish some work first, then stop itself */
            tr_actor_send(ctx->rt, ctx->self, num_msg(ctx->rt, MSG_DONE, 0, 0));
    } else if (msg->type == MSG_DONE) {
        tr_actor_stop(ctx->rt, ctx->self);
    }
    return 0;
}

static void test_actor_shutdown_sends_stop_to_everyone(void **state)
{
    tr_runtime_t *rt = start(2);
    stop_state_t plain = {{0}, 0}, deferred = {{0}, 1};
    tr_actor_opts_t d = {.defer_stop = 1};
    tr_actor_t a, b;
    assert_int_equal(tr_actor_spawn(rt, stoppable, &plain, NULL, &a), 0);
    assert_int_equal(tr_actor_spawn(rt, stoppable, &deferred, &d, &b), 0);
    tr_runtime_shutdown(rt, "test");
    assert_int_equal(tr_runtime_run(rt), 0);
    assert_string_equal(plain.reason, "test");
    assert_string_equal(deferred.reason, "test");
    tr_runtime_close(rt);
}

/* The live actors left once they are all gone or 5 s have passed: a deadline, so that a
 * missing stop fails the test instead of hanging tr_runtime_run. */
static uint64_t alive_after_5s(tr_runtime_t *rt)
{
    tr_runtime_stats_t st = {0};
    for (int i = 0; i < 5000; i++) {
        tr_runtime_stats(rt, &st);
        if (st.actors_alive == 0) break;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return st.actors_alive;
}

/* Actors spawned after a shutdown (by a behaviour handling its stop, or by a thread that
 * raced it) get a stop too, with the first shutdown's reason; otherwise tr_runtime_run would
 * wait for them forever. Checked with a deadline before the run, so a miss fails fast. */
static void test_actor_shutdown_stops_later_spawns_too(void **state)
{
    tr_runtime_t *rt = start(2);
    stop_state_t plain = {{0}, 0}, deferred = {{0}, 1};
    tr_actor_opts_t d = {.defer_stop = 1};
    tr_actor_t a, b;
    tr_runtime_shutdown(rt, "first");
    tr_runtime_shutdown(rt, "second");
    assert_int_equal(tr_actor_spawn(rt, stoppable, &plain, NULL, &a), 0);
    assert_int_equal(tr_actor_spawn(rt, stoppable, &deferred, &d, &b), 0);
    assert_int_equal(alive_after_5s(rt), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    assert_string_equal(plain.reason, "first");
    assert_string_equal(deferred.reason, "first");
    tr_runtime_close(rt);
}

/* A supervisor (defer_stop) that restarts its child once when it exits during a shutdown: the
 * restarted generation is published after the shutdown and gets its stop too. */
typedef struct restarter {
    int exits, restart_rc;
} restarter_t;

static int restarter(tr_ctx_t *ctx, tr_msg_t *msg)
{
    restarter_t *r = ctx->state;
    if (msg->type != TR_MSG_EXIT) return 0; /* its own stop: waits for the child */
    if (++r->exits == 1) {
        tr_actor_t again;
        r->restart_rc = tr_actor_restart(ctx->rt, TR_MSG_AS(msg, exit)->actor, &again);
        return 0;
    }
    return tr_actor_stop(ctx->rt, ctx->self);
}

static void test_actor_shutdown_stops_a_restart_after_it(void **state)
{
    tr_runtime_t *rt = start(2);
    restarter_t r = {0};
    stop_state_t child = {{0}, 0};
    tr_actor_t s, c;
    assert_int_equal(tr_actor_spawn(rt, restarter, &r, &(tr_actor_opts_t){.defer_stop = 1}, &s), 0);
    assert_int_equal(tr_actor_spawn(rt, stoppable, &child, &(tr_actor_opts_t){.supervisor = s}, &c),
                     0);
    tr_runtime_shutdown(rt, "test");
    assert_int_equal(alive_after_5s(rt), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    assert_int_equal(r.restart_rc, 0);
    assert_int_equal(r.exits, 2);
    tr_runtime_close(rt);
}

/* --- close with messages in flight frees everything (checked by ASan's leak checker) --- */

static int never_stops(tr_ctx_t *ctx, tr_msg_t *msg)
{
    return 0;
}

static void test_actor_close_with_messages_in_flight_frees_them(void **state)
{
    tr_runtime_t *rt = start(2);
    count_state_t s = {0};
    tr_actor_opts_t o = {.cleanup = count_cleanup};
    tr_actor_t a[8];
    for (int i = 0; i < 8; i++)
        assert_int_equal(tr_actor_spawn(rt, never_stops, &s, &o, &a[i]), 0);
    for (int r = 0; r < 2000; r++)
        for (int i = 0; i < 8; i++) {
            tr_msg_t *m = tr_msg_alloc(rt, MSG_NUM, r % 3 ? 16 : 100000); /* some are large */
            assert_int_equal(tr_actor_send(rt, a[i], m), 0);
        }
    tr_runtime_close(rt); /* no run: actors alive, mailboxes full */
    assert_int_equal(atomic_load(&s.cleanups), 8);
    assert_int_equal(s.cleanup_reason, TR_ESHUTDOWN);
}

static int slow_init(tr_ctx_t *ctx)
{
    count_init(ctx);
    nanosleep(&(struct timespec){0, 200000000}, NULL);
    return 0;
}

/* At close, cleanup runs only for actors whose init ran: one queued behind another's long init
 * on the only worker never ran its init, and gets no cleanup to undo it. */
static void test_actor_close_cleans_up_only_what_init_began(void **state)
{
    tr_runtime_t *rt = start(1);
    count_state_t slow = {0}, queued = {0};
    tr_actor_opts_t so = {.init = slow_init, .cleanup = count_cleanup};
    tr_actor_opts_t qo = {.init = count_init, .cleanup = count_cleanup};
    tr_actor_t a, b;
    assert_int_equal(tr_actor_spawn(rt, never_stops, &slow, &so, &a), 0);
    assert_int_equal(tr_actor_spawn(rt, never_stops, &queued, &qo, &b), 0);
    nanosleep(&(struct timespec){0, 20000000}, NULL); /* the worker is inside slow_init */
    tr_runtime_close(rt);
    assert_int_equal(atomic_load(&slow.inits), 1);
    assert_int_equal(atomic_load(&slow.cleanups), 1);
    assert_int_equal(slow.cleanup_reason, TR_ESHUTDOWN);
    assert_int_equal(atomic_load(&queued.inits), 0);
    assert_int_equal(atomic_load(&queued.cleanups), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_actor_per_sender_fifo_from_threads),
        cmocka_unit_test(test_actor_urgent_lane_is_drained_first),
        cmocka_unit_test(test_actor_chain_send_and_stats),
        cmocka_unit_test(test_actor_stats_count_in_out_and_depth),
        cmocka_unit_test(test_actor_peak_depth_is_the_backlog_met),
        cmocka_unit_test(test_actor_stop_from_outside_drops_the_rest),
        cmocka_unit_test(test_actor_pinned_runs_on_its_own_thread),
        cmocka_unit_test(test_actor_shutdown_sends_stop_to_everyone),
        cmocka_unit_test(test_actor_shutdown_stops_later_spawns_too),
        cmocka_unit_test(test_actor_shutdown_stops_a_restart_after_it),
        cmocka_unit_test(test_actor_close_with_messages_in_flight_frees_them),
        cmocka_unit_test(test_actor_close_cleans_up_only_what_init_began),
    };
    return cmocka_run_group_tests_name("actor", tests, NULL, NULL);
}
