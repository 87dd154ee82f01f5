/* The trace recorder: what it records reaches trace_rank<R>.json in the Chrome format,
 * flows pair up across threads, the step window selects steps, full buffers drop and
 * count, and the flight recorder keeps the last spans. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tr_build_config.h"
#include "trace_check.h"
#include "troupe/monitor.h"

static char dir[256];
static uint64_t base; /* a monotonic time just after the test started, so ts > 0 */

static uint64_t mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
static char path[300];

static int make_dir(void **state)
{
    snprintf(dir, sizeof(dir), "/tmp/tr_test_recorder_%d", (int)getpid());
    snprintf(path, sizeof(path), "%s/trace_rank3.json", dir);
    base = mono_now() + 1000000000u;
    return 0;
}

static int remove_dir(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd);
}

static tr_monitor_t *open_monitor(tr_trace_steps_t steps, size_t buffer_events)
{
    tr_trace_opts_t o = {.enabled = 1,
                         .output_path = dir,
                         .rank = 3,
                         .steps = steps,
                         .buffer_events = buffer_events,
                         .flight_recorder = 1,
                         .flight_spans = 8,
                         .flush_ms = 5};
    tr_monitor_t *m;
    assert_int_equal(tr_monitor_create(&o, &m), 0);
    return m;
}

static tr_span_t span(uint32_t lane, uint64_t t0, uint64_t t1, uint64_t step, uint64_t flow)
{
    return (tr_span_t){.name = "grad_ready",
                       .begin_ns = t0,
                       .end_ns = t1,
                       .step = step,
                       .micro_step = 1,
                       .lane = lane,
                       .bytes = 4096,
                       .flow = flow};
}

static void test_recorder_writes_valid_chrome_json(void **state)
{
    tr_monitor_t *m = open_monitor((tr_trace_steps_t){0}, 0);
    assert_int_equal(tr_monitor_lane_set(m, 0, "executor \"0\"", TR_LANE_COMPUTE), 0);
    assert_int_equal(tr_monitor_lane_set(m, 1, "comm", TR_LANE_COMM), 0);
    assert_int_equal(tr_monitor_lane_set(m, TR_MONITOR_MAX_LANES, "x", TR_LANE_IO), TR_EINVAL);
    uint64_t t = base;
    tr_monitor_step(m, 0, t);
    for (uint64_t i = 1; i <= 10; i++) {
        tr_monitor_send(m, 0, i, "grad_ready", t + i * 1000 + 500);
        tr_span_t s = span(0, t + i * 1000, t + i * 1000 + 900, 0, 0);
        tr_monitor_span(m, &s);
        s = span(1, t + i * 1000 + 600, t + i * 1000 + 800, 0, i);
        tr_monitor_span(m, &s);
        tr_monitor_counter(m, 1, "mailbox_depth", (double)i, t + i * 1000 + 550);
    }
    tr_monitor_counter(m, -1, "pinned_bytes", 1.5, t + 20000);
    tr_monitor_instant(m, 0, "boundary", t + 20000);
    assert_int_equal(tr_monitor_flush(m), 0);
    tr_monitor_stats_t st;
    tr_monitor_stats(m, &st);
    assert_int_equal(st.dropped, 0);
    assert_int_equal(st.unmatched_flows, 0);
    /* a lane out of range is not written under a wrong lane: it is dropped and counted */
    tr_span_t bad = span(TR_MONITOR_MAX_LANES, t + 30000, t + 30001, 0, 0);
    tr_monitor_span(m, &bad);
    tr_monitor_send(m, TR_MONITOR_MAX_LANES + 7, 99, "x", t + 30000);
    tr_monitor_stats(m, &st);
    assert_int_equal(st.dropped, 2);
    tr_monitor_destroy(m);

    trace_counts_t c;
    json_t *root = trace_check_file(path, &c);
    assert_int_equal(c.spans, 20);
    assert_int_equal(c.flow_starts, 10);
    assert_int_equal(c.counters, 11);
    assert_int_equal(c.instants, 2); /* the step marker and "boundary" */
    assert_int_equal(c.lanes_named, 2);
    /* the lane's name came through escaped, its kind in the args */
    int found = 0;
    for (size_t i = 0; i < json_array_size(root); i++) {
        json_t *ev = json_array_get(root, i);
        if (strcmp(json_string_value(json_object_get(ev, "name")), "thread_name")) continue;
        json_t *args = json_object_get(ev, "args");
        if (!strcmp(json_string_value(json_object_get(args, "name")), "executor \"0\"")) {
            assert_string_equal(json_string_value(json_object_get(args, "kind")), "compute");
            found = 1;
        }
    }
    assert_true(found);
    json_decref(root);
}

/* Spans on lane 1 handle messages sent from lane 0 on another thread. */
typedef struct pair_ctx {
    tr_monitor_t *m;
    int sender;
    int n;
} pair_ctx_t;

static void *pair_thread(void *arg)
{
    pair_ctx_t *p = arg;
    for (int i = 1; i <= p->n; i++) {
        uint64_t t = base + (uint64_t)i * 10000;
        if (p->sender) {
            tr_monitor_send(p->m, 0, (uint64_t)i, "bucket_full", t + 100);
            tr_span_t s = span(0, t, t + 200, 0, 0);
            tr_monitor_span(p->m, &s);
        } else {
            tr_span_t s = span(1, t + 300, t + 900, 0, (uint64_t)i);
            tr_monitor_span(p->m, &s);
        }
        if (i % 64 == 0) usleep(100);
    }
    return NULL;
}

static void test_recorder_pairs_flows_across_threads(void **state)
{
    tr_monitor_t *m = open_monitor((tr_trace_steps_t){0}, 1 << 14);
    tr_monitor_lane_set(m, 0, "bucketer", TR_LANE_DATA);
    tr_monitor_lane_set(m, 1, "comm", TR_LANE_COMM);
    pair_ctx_t a = {m, 1, 5000}, b = {m, 0, 5000};
    pthread_t ta, tb;
    pthread_create(&tb, NULL, pair_thread, &b); /* the receiver first: ends before starts */
    pthread_create(&ta, NULL, pair_thread, &a);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    tr_monitor_stats_t st;
    tr_monitor_stats(m, &st);
    assert_int_equal(st.dropped, 0);
    assert_int_equal(st.threads, 2);
    tr_monitor_destroy(m);
    trace_counts_t c;
    json_decref(trace_check_file(path, &c));
    assert_int_equal(c.spans, 10000);
    assert_int_equal(c.flow_starts, 5000);
    assert_int_equal(c.flow_ends, 5000);
}

/* Each thread owns a lane and records n back-to-back spans. */
static void *lane_thread(void *arg)
{
    pair_ctx_t *p = arg;
    uint64_t t = base + 1000;
    for (int i = 0; i < p->n; i++) {
        tr_span_t s =
            span((uint32_t)p->sender, t + (uint64_t)i * 100, t + (uint64_t)i * 100 + 50, 0, 0);
        tr_monitor_span(p->m, &s);
    }
    return NULL;
}

static void test_recorder_accounts_for_every_event_under_contention(void **state)
{
    /* small buffers and a fast writer: some events are dropped, none is lost or doubled */
    enum { THREADS = 4, N = 20000 };
    tr_trace_opts_t o = {
        .enabled = 1, .output_path = dir, .rank = 3, .buffer_events = 512, .flush_ms = 1};
    tr_monitor_t *m;
    assert_int_equal(tr_monitor_create(&o, &m), 0);
    pthread_t th[THREADS];
    pair_ctx_t ctx[THREADS];
    for (int i = 0; i < THREADS; i++) {
        ctx[i] = (pair_ctx_t){m, i, N};
        pthread_create(&th[i], NULL, lane_thread, &ctx[i]);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    tr_monitor_destroy(m);
    trace_counts_t c;
    json_t *root = trace_check_file(path, &c); /* lanes do not overlap: none doubled */
    json_int_t dropped = -1;
    for (size_t i = 0; i < json_array_size(root); i++) {
        json_t *ev = json_array_get(root, i);
        if (!strcmp(json_string_value(json_object_get(ev, "name")), "troupe_stats"))
            dropped = json_integer_value(json_object_get(json_object_get(ev, "args"), "dropped"));
    }
    json_decref(root);
    assert_true(dropped >= 0);
    assert_int_equal(c.spans + dropped, THREADS * N);
    assert_true(c.spans >= THREADS * 512);
}

static void test_recorder_window_selects_steps(void **state)
{
    /* wait 1, warmup 1, active 2, once: steps 2 and 3 are written, nothing after */
    tr_monitor_t *m = open_monitor((tr_trace_steps_t){1, 1, 2, 1}, 0);
    assert_false(tr_monitor_recording(m));
    uint64_t t = base;
    for (uint64_t step = 0; step < 8; step++) {
        tr_monitor_step(m, step, t + step * 1000);
        tr_span_t s = span(0, t + step * 1000 + 10, t + step * 1000 + 20, step, 0);
        tr_monitor_span(m, &s);
        assert_int_equal(tr_monitor_recording(m), step >= 1 && step <= 3);
    }
    tr_monitor_destroy(m);
    trace_counts_t c;
    json_t *root = trace_check_file(path, &c);
    assert_int_equal(c.spans, 2);
    for (size_t i = 0; i < json_array_size(root); i++) {
        json_t *ev = json_array_get(root, i);
        if (!strcmp(json_string_value(json_object_get(ev, "ph")), "X")) {
            json_t *args = json_object_get(ev, "args");
            json_int_t step = json_integer_value(json_object_get(args, "step"));
            assert_true(step == 2 || step == 3);
        }
    }
    json_decref(root);
}

static void test_recorder_rejects_bad_options(void **state)
{
    tr_monitor_t *m;
    tr_trace_opts_t o = {.enabled = 1, .output_path = NULL};
    assert_int_equal(tr_monitor_create(&o, &m), TR_EINVAL);
    o = (tr_trace_opts_t){.enabled = 1, .output_path = dir, .steps = {2, 0, 0, 0}};
    assert_int_equal(tr_monitor_create(&o, &m), TR_EINVAL);
    o = (tr_trace_opts_t){.enabled = 1, .output_path = "/proc/no/such/dir"};
    assert_true(tr_monitor_create(&o, &m) < 0);
    /* NULL monitor: every hot-path call is a no-op */
    tr_span_t s = span(0, 1, 2, 0, 0);
    tr_monitor_span(NULL, &s);
    tr_monitor_send(NULL, 0, 1, "x", 1);
    tr_monitor_step(NULL, 0, 1);
    tr_monitor_destroy(NULL);
}

static void test_recorder_full_buffer_drops_and_counts(void **state)
{
    tr_trace_opts_t o = {
        .enabled = 1, .output_path = dir, .rank = 3, .buffer_events = 16, .flush_ms = 100000};
    tr_monitor_t *m;
    assert_int_equal(tr_monitor_create(&o, &m), 0);
    for (uint64_t i = 0; i < 100; i++) {
        tr_span_t s = span(0, base + i * 10, base + i * 10 + 5, 0, 0);
        tr_monitor_span(m, &s);
    }
    tr_monitor_stats_t st;
    tr_monitor_stats(m, &st);
    assert_int_equal(st.dropped, 84);
    tr_monitor_destroy(m);
    trace_counts_t c;
    json_decref(trace_check_file(path, &c));
    assert_int_equal(c.spans, 16);
}

static void test_recorder_flight_dump_keeps_last_spans(void **state)
{
    /* the flight recorder alone, tracing off */
    tr_trace_opts_t o = {.flight_recorder = 1, .flight_spans = 8, .rank = 3};
    tr_monitor_t *m;
    assert_int_equal(tr_monitor_create(&o, &m), 0);
    tr_monitor_lane_set(m, 2, "optimizer", TR_LANE_COMPUTE);
    for (uint64_t i = 0; i < 20; i++) {
        tr_span_t s = span(2, i * 100, i * 100 + 50, i, 0);
        tr_monitor_span(m, &s);
    }
    char dump[300];
    snprintf(dump, sizeof(dump), "%s/flight.json", dir);
    assert_int_equal(tr_monitor_flight_dump(m, dump), 0);
    tr_monitor_destroy(m);
    trace_counts_t c;
    json_t *root = trace_check_file(dump, &c);
    assert_int_equal(c.spans, 8);
    assert_int_equal(c.lanes_named, 1);
    json_int_t first = -1;
    for (size_t i = 0; i < json_array_size(root) && first < 0; i++) {
        json_t *ev = json_array_get(root, i);
        if (!strcmp(json_string_value(json_object_get(ev, "ph")), "X"))
            first = json_integer_value(json_object_get(json_object_get(ev, "args"), "step"));
    }
    assert_int_equal(first, 12);
    json_decref(root);
}

static void test_recorder_nvtx_ranges_follow_the_build(void **state)
{
    tr_trace_opts_t o = {.flight_recorder = 1};
    tr_monitor_t *m;
    assert_int_equal(tr_monitor_create(&o, &m), 0);
    assert_int_equal(tr_monitor_nvtx_available(), TR_HAVE_CUDA);
    for (int i = 0; i < 100; i++) { /* no tool attached: nested pushes and pops are no-ops */
        tr_monitor_range_push(m, "forward");
        tr_monitor_range_push(m, "grad_ready");
        tr_monitor_range_pop(m);
        tr_monitor_range_pop(m);
    }
    tr_monitor_range_push(NULL, "x");
    tr_monitor_range_pop(NULL);
    tr_monitor_destroy(m);
}

static void test_recorder_two_monitors_on_one_thread(void **state)
{
    /* alternating between monitors reuses each one's buffer: one per (thread, monitor) */
    char dir2[300];
    snprintf(dir2, sizeof(dir2), "%s/second", dir);
    tr_trace_opts_t o = {.enabled = 1, .output_path = dir2, .rank = 0};
    tr_monitor_t *a = open_monitor((tr_trace_steps_t){0}, 0), *b;
    assert_int_equal(tr_monitor_create(&o, &b), 0);
    for (uint64_t i = 0; i < 1000; i++) {
        tr_span_t s = span(0, base + i * 10, base + i * 10 + 5, 0, 0);
        tr_monitor_span(i % 2 ? a : b, &s);
    }
    tr_monitor_stats_t sa, sb;
    tr_monitor_stats(a, &sa);
    tr_monitor_stats(b, &sb);
    assert_int_equal(sa.threads, 1);
    assert_int_equal(sb.threads, 1);
    tr_monitor_destroy(b);
    tr_monitor_destroy(a);
    trace_counts_t c;
    json_decref(trace_check_file(path, &c));
    assert_int_equal(c.spans, 500);
}

static void test_recorder_prunes_flows_never_handled(void **state)
{
    /* 70000 sends never handled (dead letters) spread over 7 s, then one 20 s later: the
     * writer forgets the old halves, so handling one of them much later writes no arrow */
    tr_monitor_t *m = open_monitor((tr_trace_steps_t){0}, 1 << 17);
    for (uint64_t i = 1; i <= 70000; i++)
        tr_monitor_send(m, 0, i, "dead_letter", base + i * 100000);
    tr_monitor_send(m, 0, 999999, "recent", base + 20000000000ull);
    assert_int_equal(tr_monitor_flush(m), 0);
    uint64_t late = base + 20000000000ull;
    for (uint64_t i = 1; i <= 10; i++) {
        tr_span_t s = span(1, late + i * 100, late + i * 100 + 50, 0, i);
        tr_monitor_span(m, &s);
    }
    assert_int_equal(tr_monitor_flush(m), 0);
    tr_monitor_stats_t st;
    tr_monitor_stats(m, &st);
    assert_int_equal(st.unmatched_flows, 70000 + 1 + 10);
    tr_monitor_destroy(m);
    trace_counts_t c;
    json_decref(trace_check_file(path, &c));
    assert_int_equal(c.flow_starts, 0);
    assert_int_equal(c.spans, 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recorder_writes_valid_chrome_json),
        cmocka_unit_test(test_recorder_pairs_flows_across_threads),
        cmocka_unit_test(test_recorder_accounts_for_every_event_under_contention),
        cmocka_unit_test(test_recorder_window_selects_steps),
        cmocka_unit_test(test_recorder_rejects_bad_options),
        cmocka_unit_test(test_recorder_full_buffer_drops_and_counts),
        cmocka_unit_test(test_recorder_flight_dump_keeps_last_spans),
        cmocka_unit_test(test_recorder_nvtx_ranges_follow_the_build),
        cmocka_unit_test(test_recorder_two_monitors_on_one_thread),
        cmocka_unit_test(test_recorder_prunes_flows_never_handled),
    };
    return cmocka_run_group_tests_name("recorder", tests, make_dir, remove_dir);
}
