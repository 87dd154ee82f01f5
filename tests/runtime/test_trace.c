/* The runtime feeding a monitor: two actors bounce messages (kicked off from the test's thread
 * and by a timer from the loop thread); the trace file passes the format checker with a span
 * per handled message on each actor's named lane, an arrow per send, and mailbox-depth
 * counters. An unhandled failure writes the flight recorder. A bad lane kind is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "../monitor/trace_check.h"
#include "troupe.h"

#define ROUNDS 200

static char tmpdir[256];

typedef struct peer {
    tr_actor_t other;
    int handled;
    int fail_at; /* fail handling this message number (0: never) */
} peer_t;

static int bounce(tr_ctx_t *ctx, tr_msg_t *msg)
{
    peer_t *p = ctx->state;
    p->handled++;
    if (p->fail_at && p->handled == p->fail_at) return TR_EIO;
    if (msg->type == TR_MSG_TIMER) return 0;
    if (msg->step >= ROUNDS) {
        tr_actor_stop(ctx->rt, p->other);
        tr_actor_stop(ctx->rt, ctx->self);
        return 0;
    }
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_CREDIT);
    assert_non_null(m);
    m->step = msg->step + 1;
    if (tr_actor_send(ctx->rt, p->other, m) < 0) tr_msg_free(ctx->rt, m);
    return 0;
}

/* Spawns ping and pong on rt, kicks ping from this thread and pong by a timer. */
static void start_pair(tr_runtime_t *rt, peer_t *ping, peer_t *pong)
{
    tr_actor_t a, b;
    tr_actor_opts_t oa = {.name = "ping", .lane_kind = TR_LANE_COMPUTE};
    tr_actor_opts_t ob = {.name = "pong", .lane_kind = TR_LANE_COMM};
    assert_int_equal(tr_actor_spawn(rt, bounce, ping, &oa, &a), 0);
    assert_int_equal(tr_actor_spawn(rt, bounce, pong, &ob, &b), 0);
    ping->other = b;
    pong->other = a;
    uint64_t timer;
    assert_int_equal(tr_timer_start(rt, b, 7, 1000, 0, &timer), 0);
    usleep(20000); /* the timer fires before the bouncing starts */
    tr_msg_t *m = tr_msg_new(rt, TR_MSG_CREDIT);
    assert_int_equal(tr_actor_send(rt, a, m), 0);
}

static int lane_named(json_t *root, const char *name)
{
    size_t i;
    json_t *ev;
    json_array_foreach(root, i, ev)
    {
        const char *n = json_string_value(json_object_get(ev, "name"));
        json_t *args = json_object_get(ev, "args");
        if (n && !strcmp(n, "thread_name") &&
            !strcmp(json_string_value(json_object_get(args, "name")), name))
            return 1;
    }
    return 0;
}

static void test_trace_runtime_records_spans_and_flows(void **state)
{
    (void)state;
    tr_trace_opts_t to = {.enabled = 1, .output_path = tmpdir, .flight_recorder = 1};
    tr_monitor_t *mon;
    assert_int_equal(tr_monitor_create(&to, &mon), 0);
    tr_runtime_opts_t ro = {.n_workers = 2, .monitor = mon};
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &ro), 0);
    peer_t ping = {0}, pong = {0};
    start_pair(rt, &ping, &pong);
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
    tr_monitor_destroy(mon);

    char path[512];
    snprintf(path, sizeof(path), "%s/trace_rank0.json", tmpdir);
    trace_counts_t c;
    json_t *root = trace_check_file(path, &c);
    printf("spans %d, flows %d/%d, counters %d, lanes %d\n", c.spans, c.flow_starts, c.flow_ends,
           c.counters, c.lanes_named);
    /* every handled message is a span: ROUNDS+1 credits, the timer, the two stops (KILL);
     * the external lane adds a point span per send from outside an actor */
    assert_true(c.spans >= ROUNDS + 1 + 1 + 2);
    assert_true(c.flow_starts >= ROUNDS + 2);
    assert_int_equal(c.flow_starts, c.flow_ends);
    assert_true(c.counters >= 1);
    assert_true(lane_named(root, "ping") && lane_named(root, "pong"));
    assert_true(lane_named(root, "external"));
    json_decref(root);
}

static void test_trace_failure_dumps_flight_recorder(void **state)
{
    (void)state;
    tr_trace_opts_t to = {.flight_recorder = 1}; /* tracing off, the ring on */
    tr_monitor_t *mon;
    assert_int_equal(tr_monitor_create(&to, &mon), 0);
    char path[512];
    snprintf(path, sizeof(path), "%s/flight_rank0.json", tmpdir);
    unlink(path);
    tr_runtime_opts_t ro = {.n_workers = 2, .monitor = mon, .flight_path = path};
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &ro), 0);
    peer_t ping = {.fail_at = 50}, pong = {0};
    start_pair(rt, &ping, &pong);
    assert_int_equal(tr_runtime_run(rt), TR_EFAILED);
    assert_non_null(strstr(tr_runtime_failure(rt), "ping"));
    tr_runtime_close(rt);
    tr_monitor_destroy(mon);
    trace_counts_t c;
    json_t *root = trace_check_file(path, &c);
    assert_true(c.spans >= 50); /* ping's 50 messages and pong's, up to the failure */
    json_decref(root);
}

static void test_trace_bad_lane_kind_is_refused(void **state)
{
    (void)state;
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 1}), 0);
    tr_actor_t a;
    peer_t p = {0};
    tr_actor_opts_t o = {.name = "bad", .lane_kind = TR_LANE_KIND_COUNT_};
    assert_int_equal(tr_actor_spawn(rt, bounce, &p, &o, &a), TR_EINVAL);
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/troupe_test_trace_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_runtime_records_spans_and_flows),
        cmocka_unit_test(test_trace_failure_dumps_flight_recorder),
        cmocka_unit_test(test_trace_bad_lane_kind_is_refused),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (rc == 0 && system(cmd) != 0) rc = 1;
    return rc;
}
