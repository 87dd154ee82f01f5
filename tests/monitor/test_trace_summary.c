/* Reading traces back: the summary's overlap and breakdown are right on synthetic traces
 * with known overlap (0%, 50%, 100%), the critical path follows the message, several ranks
 * are aligned and compared, a trace from a killed run is repaired and read, bad input is an
 * error naming the file and the field, and plot and merge produce their files. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "trace_check.h"
#include "troupe/monitor.h"
#include "troupe/trace.h"

static char dir[256];

static uint64_t mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int setup(void **state)
{
    snprintf(dir, sizeof(dir), "/tmp/tr_test_summary_%d", (int)getpid());
    return 0;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), getenv("TR_KEEP") ? "true %s" : "rm -rf %s", dir);
    return system(cmd);
}

/* One step of a synthetic run, times in microseconds from the step's start: the executor
 * computes [0,100), sends a bucket at 90 that comm handles over [comm, comm+len); the swapper
 * does io over [io0, io1). scale stretches everything (a slower rank). */
typedef struct shape {
    double comm, comm_len, io0, io1, scale;
} shape_t;

static tr_monitor_t *open_rank(const char *sub, unsigned rank)
{
    char out[300];
    snprintf(out, sizeof(out), "%s/%s", dir, sub);
    tr_trace_opts_t o = {.enabled = 1, .output_path = out, .rank = rank};
    tr_monitor_t *m;
    assert_int_equal(tr_monitor_create(&o, &m), 0);
    tr_monitor_lane_set(m, 0, "executor", TR_LANE_COMPUTE);
    tr_monitor_lane_set(m, 1, "comm", TR_LANE_COMM);
    tr_monitor_lane_set(m, 2, "swapper", TR_LANE_IO);
    return m;
}

static void record_step(tr_monitor_t *m, uint64_t step, uint64_t base, shape_t s, uint64_t flow)
{
    double k = 1000 * (s.scale ? s.scale : 1); /* us -> ns */
    tr_monitor_step(m, step, base);
    tr_span_t ex = {"forward_backward", base, base + (uint64_t)(100 * k), step, 0, 0, 0, 0};
    tr_monitor_send(m, 0, flow, "bucket_full", base + (uint64_t)(90 * k));
    tr_monitor_span(m, &ex);
    tr_span_t cm = {"bucket_full",
                    base + (uint64_t)(s.comm * k),
                    base + (uint64_t)((s.comm + s.comm_len) * k),
                    step,
                    0,
                    1,
                    1 << 20,
                    flow};
    tr_monitor_span(m, &cm);
    tr_span_t io = {
        "swap_out", base + (uint64_t)(s.io0 * k), base + (uint64_t)(s.io1 * k), step, 0, 2, 1 << 16,
        0};
    tr_monitor_span(m, &io);
}

static json_t *summary_of(const char *path)
{
    tr_trace_t *t;
    char err[512] = "";
    int rc = tr_trace_load(path, &t, err, sizeof(err));
    if (rc) fail_msg("%s", err);
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    assert_int_equal(tr_trace_summary_write(t, mem, 1), 0);
    fclose(mem);
    tr_trace_destroy(t);
    json_error_t je;
    json_t *doc = json_loads(buf, 0, &je);
    if (!doc) fail_msg("summary is not JSON: %s", je.text);
    free(buf);
    return doc;
}

/* The trace at path drawn as SVG (opts may be NULL), in a buffer the caller frees. */
static char *plot_of(const char *path, const tr_plot_opts_t *opts)
{
    tr_trace_t *t;
    char err[512] = "";
    int rc = tr_trace_load(path, &t, err, sizeof(err));
    if (rc) fail_msg("%s", err);
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    assert_int_equal(tr_trace_plot_svg(t, mem, opts), 0);
    fclose(mem);
    tr_trace_destroy(t);
    return buf;
}

static json_t *step_of(json_t *doc, int rank_index, int step_index)
{
    json_t *r = json_array_get(json_object_get(doc, "per_rank"), (size_t)rank_index);
    return json_array_get(json_object_get(r, "steps"), (size_t)step_index);
}

static double at(json_t *o, const char *a, const char *b)
{
    json_t *v = json_object_get(json_object_get(o, a), b);
    assert_true(json_is_number(v));
    return json_number_value(v);
}

static void test_trace_summary_overlap_is_exact(void **state)
{
    /* comm 0%, 50%, 100% hidden; io 100%, 50%, 0% */
    shape_t shapes[3] = {{120, 100, 10, 60, 1}, {50, 100, 50, 150, 1}, {0, 100, 100, 200, 1}};
    double comm_want[3] = {0, 0.5, 1}, io_want[3] = {1, 0.5, 0};
    uint64_t base = mono_now() + 1000000000; /* after every monitor of the test starts */
    tr_monitor_t *m = open_rank("overlap", 0);
    for (uint64_t s = 0; s < 3; s++)
        record_step(m, s, base + s * 1000000, shapes[s], s + 1);
    tr_monitor_destroy(m);
    char path[300];
    snprintf(path, sizeof(path), "%s/overlap/trace_rank0.json", dir);
    trace_counts_t c;
    json_decref(trace_check_file(path, &c));
    json_t *doc = summary_of(path);
    for (int s = 0; s < 3; s++) {
        json_t *st = step_of(doc, 0, s);
        assert_float_equal(at(st, "overlap", "comm"), comm_want[s], 1e-6);
        assert_float_equal(at(st, "overlap", "io"), io_want[s], 1e-6);
    }
    /* step 0: compute 100, mailbox wait 20 (sent at 90, handled at 120), comm 100 */
    json_t *st = step_of(doc, 0, 0);
    assert_float_equal(json_number_value(json_object_get(st, "wall_ms")), 0.220, 1e-6);
    assert_float_equal(at(st, "breakdown_ms", "compute"), 0.100, 1e-6);
    assert_float_equal(at(st, "breakdown_ms", "mailbox_wait"), 0.020, 1e-6);
    assert_float_equal(at(st, "breakdown_ms", "comm_exposed"), 0.100, 1e-6);
    assert_float_equal(at(st, "breakdown_ms", "idle"), 0, 1e-6);
    /* step 2: io runs alone over [100, 200) */
    st = step_of(doc, 0, 2);
    assert_float_equal(at(st, "breakdown_ms", "io_exposed"), 0.100, 1e-6);
    /* whole run: comm 50 hidden of 300 */
    json_t *tot = json_object_get(json_array_get(json_object_get(doc, "per_rank"), 0), "total");
    assert_float_equal(at(tot, "overlap", "comm"), 150.0 / 300.0, 1e-6);
    json_decref(doc);
}

static void test_trace_summary_critical_path_follows_message(void **state)
{
    uint64_t base = mono_now() + 1000000000; /* after every monitor of the test starts */
    tr_monitor_t *m = open_rank("critical", 0);
    record_step(m, 0, base, (shape_t){120, 100, 10, 60, 1}, 7);
    tr_monitor_destroy(m);
    char path[300];
    snprintf(path, sizeof(path), "%s/critical/trace_rank0.json", dir);
    json_t *doc = summary_of(path);
    json_t *cp = json_object_get(step_of(doc, 0, 0), "critical_path");
    json_t *spans = json_object_get(cp, "spans");
    assert_int_equal(json_array_size(spans), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(spans, 0), "actor")),
                        "executor");
    assert_string_equal(json_string_value(json_object_get(json_array_get(spans, 1), "actor")),
                        "comm");
    assert_float_equal(json_number_value(json_object_get(cp, "ms")), 0.220, 1e-6);
    json_decref(doc);
}

static void test_trace_summary_leaves_out_spans_of_unmarked_steps(void **state)
{
    /* steps 3 and 4 are traced (markers); one span of step 2 ended just after step 3 opened */
    uint64_t base = mono_now() + 1000000000; /* after every monitor of the test starts */
    tr_monitor_t *m = open_rank("straggler", 0);
    record_step(m, 3, base, (shape_t){120, 100, 10, 60, 1}, 1);
    tr_span_t late = {"reduced", base + 1000, base + 3000, 2, 0, 1, 64, 0};
    tr_monitor_span(m, &late);
    record_step(m, 4, base + 1000000, (shape_t){120, 100, 10, 60, 1}, 2);
    tr_monitor_destroy(m);
    char path[300];
    snprintf(path, sizeof(path), "%s/straggler/trace_rank0.json", dir);
    json_t *doc = summary_of(path);
    json_t *r = json_array_get(json_object_get(doc, "per_rank"), 0);
    json_t *steps = json_object_get(r, "steps");
    assert_int_equal(json_array_size(steps), 2);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(steps, 0), "step")), 3);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(steps, 1), "step")), 4);
    assert_int_equal(json_integer_value(json_object_get(r, "outside_spans")), 1);
    json_decref(doc);
}

static void test_trace_summary_compares_ranks(void **state)
{
    uint64_t base = mono_now() + 1000000000; /* after every monitor of the test starts */
    for (unsigned r = 0; r < 3; r++) {
        tr_monitor_t *m = open_rank("ranks", r);
        record_step(m, 0, base, (shape_t){50, 100, 50, 150, r == 1 ? 2 : 1}, 1);
        tr_monitor_destroy(m);
    }
    char path[300];
    snprintf(path, sizeof(path), "%s/ranks", dir);
    json_t *doc = summary_of(path);
    assert_int_equal(json_integer_value(json_object_get(doc, "ranks")), 3);
    json_t *across = json_array_get(json_object_get(doc, "across_ranks"), 0);
    json_t *wall = json_object_get(json_object_get(across, "phases_ms"), "wall");
    assert_float_equal(json_number_value(json_object_get(wall, "min")), 0.150, 1e-6);
    assert_float_equal(json_number_value(json_object_get(wall, "median")), 0.150, 1e-6);
    assert_float_equal(json_number_value(json_object_get(wall, "max")), 0.300, 1e-6);
    json_t *slowest = json_array_get(json_object_get(across, "slowest_ranks"), 0);
    assert_int_equal(json_integer_value(json_object_get(slowest, "rank")), 1);
    json_decref(doc);

    /* merge: one file, every rank, valid, clocks aligned (rank 1's step starts when rank 0's
     * does, although its monitor started later) */
    tr_trace_t *t;
    char err[256], merged[300];
    assert_int_equal(tr_trace_load(path, &t, err, sizeof(err)), 0);
    snprintf(merged, sizeof(merged), "%s/merged.json", dir);
    FILE *f = fopen(merged, "w");
    assert_int_equal(tr_trace_merge_write(t, f), 0);
    fclose(f);
    tr_trace_destroy(t);
    trace_counts_t c;
    json_decref(trace_check_file(merged, &c));
    assert_int_equal(c.spans, 9);
    doc = summary_of(merged);
    double s0 = json_number_value(json_object_get(step_of(doc, 0, 0), "start_ms"));
    double s1 = json_number_value(json_object_get(step_of(doc, 1, 0), "start_ms"));
    assert_float_equal(s0, s1, 0.002); /* the clocks' reading granularity */
    json_decref(doc);
}

static void test_trace_summary_reads_killed_run(void **state)
{
    char sub[280], path[320];
    snprintf(sub, sizeof(sub), "%s/killed", dir);
    snprintf(path, sizeof(path), "%s/trace_rank0.json", sub);
    pid_t pid = fork();
    if (pid == 0) {
        tr_trace_opts_t o = {.enabled = 1, .output_path = sub, .flush_ms = 1};
        tr_monitor_t *m;
        if (tr_monitor_create(&o, &m)) _exit(3);
        tr_monitor_lane_set(m, 0, "executor", TR_LANE_COMPUTE);
        uint64_t base = mono_now() + 1000000000; /* after every monitor of the test starts */
        for (uint64_t i = 0; i < 1000; i++) {
            tr_span_t s = {"forward", base + i * 1000, base + i * 1000 + 500, i / 100, 0, 0, 0, 0};
            tr_monitor_span(m, &s);
        }
        tr_monitor_flush(m);
        raise(SIGKILL); /* dies without closing the array */
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    /* and cut the last span's line in half, as a kill during a write would (whatever the
     * writer put after it — a counter, a lane's name — goes with it) */
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char text[1 << 20];
    size_t len = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[len] = 0;
    char *last = NULL;
    for (char *p = strstr(text, "\"ph\":\"X\""); p; p = strstr(p + 1, "\"ph\":\"X\""))
        last = p;
    assert_non_null(last);
    assert_int_equal(truncate(path, (off_t)(last - text) + 10), 0);
    tr_trace_t *t;
    char err[512];
    assert_int_equal(tr_trace_load(path, &t, err, sizeof(err)), 0);
    assert_int_equal(tr_trace_repaired(t), 1);
    assert_int_equal(tr_trace_span_count(t), 999);
    tr_trace_destroy(t);
}

static void test_trace_summary_bad_input_names_file_and_field(void **state)
{
    char path[300], err[512];
    snprintf(path, sizeof(path), "%s/bad.json", dir);
    FILE *f = fopen(path, "w");
    fputs("[\n{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"name\":\"a\",\"ts\":1.0,\"dur\":2},\n"
          "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"name\":\"b\",\"ts\":5.0},\n]\n",
          f);
    fclose(f);
    tr_trace_t *t;
    assert_int_equal(tr_trace_load(path, &t, err, sizeof(err)), TR_EFORMAT);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "\"dur\""));
    assert_non_null(strstr(err, "event 1"));
    f = fopen(path, "w");
    fputs("{\"not\": \"a trace\"}", f);
    fclose(f);
    assert_int_equal(tr_trace_load(path, &t, err, sizeof(err)), TR_EFORMAT);
    assert_non_null(strstr(err, "traceEvents"));
    assert_true(tr_trace_load("/nonexistent/trace", &t, err, sizeof(err)) < 0);
}

static void test_trace_summary_plot_draws_lanes_spans_arrows(void **state)
{
    uint64_t base = mono_now() + 1000000000; /* after every monitor of the test starts */
    tr_monitor_t *m = open_rank("plot", 0);
    for (uint64_t s = 0; s < 2; s++)
        record_step(m, s, base + s * 300000, (shape_t){120, 100, 10, 60, 1}, s + 1);
    tr_monitor_destroy(m);
    char path[300];
    snprintf(path, sizeof(path), "%s/plot", dir);
    char *buf = plot_of(path, NULL);
    /* 6 spans, 2 arrows, 3 lanes, 2 step lines, well-formed enough to end properly */
    int rects = 0, arrows = 0;
    for (char *p = buf; (p = strstr(p, "<title>")); p++)
        rects++;
    for (char *p = buf; (p = strstr(p, "marker-end")); p++)
        arrows++;
    assert_int_equal(rects, 6);
    assert_int_equal(arrows, 2);
    assert_non_null(strstr(buf, ">r0 executor</text>"));
    assert_non_null(strstr(buf, "r0 step 1</text>"));
    assert_non_null(strstr(buf, " ms</text>"));
    assert_string_equal(buf + strlen(buf) - 7, "</svg>\n");
    free(buf);
}

static void test_trace_summary_plot_groups_subpixel_spans(void **state)
{
    uint64_t base = mono_now() + 1000000000; /* after every monitor of the test starts */
    tr_monitor_t *m = open_rank("dense", 0);
    for (uint64_t i = 0; i < 1000; i++) { /* 1000 back-to-back 1 us messages, then a long one */
        tr_span_t s = {"credit", base + i * 1000, base + i * 1000 + 900, 0, 0, 2, 0, 0};
        tr_monitor_span(m, &s);
    }
    tr_span_t s = {"forward", base + 1000000, base + 9000000, 0, 0, 0, 0, 0};
    tr_monitor_span(m, &s);
    tr_monitor_destroy(m);
    char path[300];
    snprintf(path, sizeof(path), "%s/dense", dir);
    char *buf = plot_of(path, &(tr_plot_opts_t){.width = 1000});
    int titles = 0;
    for (char *p = buf; (p = strstr(p, "<title>")); p++)
        titles++;
    assert_true(titles < 100);
    assert_non_null(strstr(buf, " messages, "));
    assert_non_null(strstr(buf, "<title>forward step 0/0, 8.000 ms</title>"));
    free(buf);
}

/* A lane with nested spans, as a pipeline stage writes them (its forward and backward inside
 * the span of the message that ran them; the inner spans written first): stage0 handles
 * pipe_xfer over [0,100) holding ForwardPass [10,50) and BackwardPass [50,90) (itself holding
 * recompute [60,70)) and sends to comm at 95, after its inner spans ended; comm reduces over
 * [100,140), answers at 140 and gathers over [150,170); stage0 handles the answer over
 * [140,180) holding ForwardPass [145,175). Times in microseconds. */
static const char nested_trace[] =
    "[\n"
    "{\"ph\":\"M\",\"pid\":0,\"tid\":1,\"name\":\"thread_name\","
    "\"args\":{\"name\":\"stage0\",\"kind\":\"compute\"}},\n"
    "{\"ph\":\"M\",\"pid\":0,\"tid\":2,\"name\":\"thread_name\","
    "\"args\":{\"name\":\"comm\",\"kind\":\"comm\"}},\n"
    "{\"ph\":\"i\",\"pid\":0,\"tid\":1,\"s\":\"p\",\"name\":\"step\",\"ts\":0,"
    "\"args\":{\"step\":0}},\n"
    "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"name\":\"ForwardPass\",\"ts\":10,\"dur\":40,"
    "\"args\":{\"step\":0}},\n"
    "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"name\":\"recompute\",\"ts\":60,\"dur\":10,"
    "\"args\":{\"step\":0}},\n"
    "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"name\":\"BackwardPass\",\"ts\":50,\"dur\":40,"
    "\"args\":{\"step\":0}},\n"
    "{\"ph\":\"s\",\"pid\":0,\"tid\":1,\"name\":\"grads\",\"id\":1,\"ts\":95},\n"
    "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"name\":\"pipe_xfer\",\"ts\":0,\"dur\":100,"
    "\"args\":{\"step\":0}},\n"
    "{\"ph\":\"X\",\"pid\":0,\"tid\":2,\"name\":\"allreduce\",\"ts\":100,\"dur\":40,"
    "\"args\":{\"step\":0,\"flow\":1}},\n"
    "{\"ph\":\"s\",\"pid\":0,\"tid\":2,\"name\":\"reduced\",\"id\":2,\"ts\":140},\n"
    "{\"ph\":\"X\",\"pid\":0,\"tid\":2,\"name\":\"allgather\",\"ts\":150,\"dur\":20,"
    "\"args\":{\"step\":0}},\n"
    "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"name\":\"ForwardPass\",\"ts\":145,\"dur\":30,"
    "\"args\":{\"step\":0,\"micro_step\":1}},\n"
    "{\"ph\":\"X\",\"pid\":0,\"tid\":1,\"name\":\"pipe_xfer\",\"ts\":140,\"dur\":40,"
    "\"args\":{\"step\":0,\"flow\":2}}\n"
    "]\n";

static void write_nested_trace(char *path, size_t cap)
{
    snprintf(path, cap, "%s/nested_rank0.json", dir);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "mkdir -p %s", dir);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(nested_trace, f);
    fclose(f);
}

static double field(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    assert_true(json_is_number(v));
    return json_number_value(v);
}

static const char *path_actor(json_t *spans, size_t i)
{
    return json_string_value(json_object_get(json_array_get(spans, i), "actor"));
}

/* Time on a lane counts once: the nested spans are their outer span's time for busy (140 of
 * 180 us, not 260), the breakdown, the overlap and the critical path, which goes from comm's
 * message back to the outer span that sent it although the send came after its inner spans
 * ended, and names what each outer span held. The plot draws the inner spans over the outer
 * ones. */
static void test_trace_summary_counts_nested_spans_once(void **state)
{
    char path[300];
    write_nested_trace(path, sizeof(path));
    json_t *doc = summary_of(path);
    json_t *st = step_of(doc, 0, 0);
    assert_float_equal(field(st, "wall_ms"), 0.180, 1e-9);
    json_t *busy = json_object_get(st, "busy");
    assert_int_equal(json_array_size(busy), 2);
    assert_string_equal(path_actor(busy, 0), "stage0");
    assert_float_equal(field(json_array_get(busy, 0), "ms"), 0.140, 1e-9);
    double frac = field(json_array_get(busy, 0), "fraction");
    assert_float_equal(frac, 140.0 / 180.0, 1e-6);
    assert_true(frac <= 1);
    assert_string_equal(path_actor(busy, 1), "comm");
    assert_float_equal(field(json_array_get(busy, 1), "ms"), 0.060, 1e-9);
    assert_float_equal(at(st, "breakdown_ms", "compute"), 0.140, 1e-9);
    assert_float_equal(at(st, "breakdown_ms", "comm_exposed"), 0.040, 1e-9);
    assert_float_equal(at(st, "breakdown_ms", "mailbox_wait"), 0, 1e-9);
    assert_float_equal(at(st, "breakdown_ms", "idle"), 0, 1e-9);
    assert_float_equal(at(st, "overlap", "comm"), 20.0 / 60.0, 1e-6);
    json_t *cp = json_object_get(st, "critical_path"), *spans = json_object_get(cp, "spans");
    assert_int_equal(json_array_size(spans), 3);
    assert_string_equal(path_actor(spans, 0), "stage0");
    assert_string_equal(path_actor(spans, 1), "comm");
    assert_string_equal(path_actor(spans, 2), "stage0");
    for (size_t i = 0; i < 3; i++)
        assert_string_equal(json_string_value(json_object_get(json_array_get(spans, i), "message")),
                            i == 1 ? "allreduce" : "pipe_xfer");
    json_t *nested = json_object_get(json_array_get(spans, 0), "nested"); /* direct ones only */
    assert_int_equal(json_array_size(nested), 2);
    assert_string_equal(json_string_value(json_array_get(nested, 0)), "ForwardPass");
    assert_string_equal(json_string_value(json_array_get(nested, 1)), "BackwardPass");
    assert_null(json_object_get(json_array_get(spans, 1), "nested"));
    assert_float_equal(field(cp, "ms"), 0.180, 1e-9);
    assert_float_equal(field(cp, "busy_ms"), 0.180, 1e-9);
    json_decref(doc);

    /* the plot draws each inner span after (over) its outer span, inset 2 pixels a level
     * within the lane's 16, and the outer span paler */
    char *buf = plot_of(path, NULL);
    char *outer = strstr(buf, "<title>pipe_xfer step 0/0, 0.100 ms");
    char *fwd = strstr(buf, "<title>ForwardPass step 0/0, 0.040 ms");
    char *bwd = strstr(buf, "<title>BackwardPass step 0/0, 0.040 ms");
    char *rec = strstr(buf, "<title>recompute step 0/0, 0.010 ms");
    assert_true(outer && fwd && bwd && rec);
    assert_true(outer < fwd && fwd < bwd && bwd < rec);
    assert_non_null(
        strstr(buf, "height=\"16\" fill=\"#4e79a7\" fill-opacity=\"0.5\"><title>pipe_xfer"));
    assert_non_null(strstr(buf, "height=\"12\" fill=\"#4e79a7\"><title>ForwardPass step 0/0"));
    assert_non_null(strstr(buf, "height=\"8\" fill=\"#4e79a7\"><title>recompute"));
    free(buf);
}

/* Random traces (the seed is printed): the breakdown partitions each step's wall time,
 * overlaps are fractions, hidden time never exceeds busy time, and the critical path is no
 * longer than the step. */
static void test_trace_summary_invariants_on_random_traces(void **state)
{
    const char *given = getenv("TR_TEST_SEED"); /* replays a failing run */
    unsigned seed = given ? (unsigned)strtoul(given, NULL, 10) : (unsigned)time(NULL);
    printf("seed %u (TR_TEST_SEED replays it)\n", seed);
    srand(seed);
    uint64_t base = mono_now() + 1000000000; /* after every monitor of the test starts */
    tr_monitor_t *m = open_rank("random", 0);
    tr_monitor_lane_set(m, 3, "loader", TR_LANE_DATA);
    uint64_t flow = 1;
    for (uint64_t step = 0; step < 5; step++) {
        uint64_t lane_free[4] = {0}, t0 = base + step * 10000000;
        tr_monitor_step(m, step, t0);
        for (int i = 0; i < 200; i++) {
            uint32_t lane = (uint32_t)(rand() % 4), from = (uint32_t)(rand() % 4);
            uint64_t start = t0 + (uint64_t)(rand() % 5000000), len = 1000 + rand() % 200000;
            if (start < lane_free[lane])
                start = lane_free[lane]; /* an actor runs one message at a time */
            if (start + len > t0 + 9000000) continue;
            tr_monitor_send(m, from, flow, "msg", start - (uint64_t)(rand() % 50000));
            tr_span_t sp = {"msg", start, start + len, step, 0, lane, 0, flow++};
            tr_monitor_span(m, &sp);
            lane_free[lane] = start + len;
        }
    }
    tr_monitor_destroy(m);
    char path[300];
    snprintf(path, sizeof(path), "%s/random", dir);
    json_t *doc = summary_of(path);
    for (int k = 0; k < 5; k++) {
        json_t *st = step_of(doc, 0, k), *b = json_object_get(st, "breakdown_ms");
        json_t *ov = json_object_get(st, "overlap");
        double sum = 0, wall = json_number_value(json_object_get(st, "wall_ms"));
        const char *key;
        json_t *v;
        json_object_foreach(b, key, v)
        {
            assert_true(json_number_value(v) >= 0);
            sum += json_number_value(v);
        }
        assert_float_equal(sum, wall, 1e-6 * wall + 1e-9);
        for (int i = 0; i < 2; i++) {
            json_t *f = json_object_get(ov, i ? "io" : "comm");
            double x = json_number_value(f);
            assert_true(json_is_null(f) || (x >= 0 && x <= 1));
        }
        double cp = json_number_value(json_object_get(json_object_get(st, "critical_path"), "ms"));
        assert_true(cp > 0 && cp <= wall + 1e-9);
    }
    json_decref(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_summary_overlap_is_exact),
        cmocka_unit_test(test_trace_summary_critical_path_follows_message),
        cmocka_unit_test(test_trace_summary_leaves_out_spans_of_unmarked_steps),
        cmocka_unit_test(test_trace_summary_compares_ranks),
        cmocka_unit_test(test_trace_summary_reads_killed_run),
        cmocka_unit_test(test_trace_summary_bad_input_names_file_and_field),
        cmocka_unit_test(test_trace_summary_plot_draws_lanes_spans_arrows),
        cmocka_unit_test(test_trace_summary_plot_groups_subpixel_spans),
        cmocka_unit_test(test_trace_summary_counts_nested_spans_once),
        cmocka_unit_test(test_trace_summary_invariants_on_random_traces),
    };
    return cmocka_run_group_tests_name("trace_summary", tests, setup, teardown);
}
