/* The engine's tracing and DeepSpeed outputs through its public API: a traced run writes
 * trace_rank0.json that passes the format checker, with spans on every engine actor's lane,
 * arrows between them, the bucket-memory counter, and only the steps the window asks for;
 * wall_clock_breakdown prints DeepSpeed's timer lines and csv_monitor writes its files with
 * the right names, headers and x values, tensorboard an event file, and a resumed run appends
 * without a second header;
 * a failing engine leaves a flight recorder dump. */
#include <dirent.h>
#include <pthread.h>
#include <fcntl.h>
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

#include "engine_testing.h"

#define XD      8
#define CLASSES 3

static char tmpdir[256];

static int batch_cb(void *user, uint64_t index, int B, int T, int *tokens, float *x, int *targets,
                    float *y)
{
    (void)tokens;
    if ((int64_t)index == *(int *)user) return TR_EIO;
    for (int b = 0; b < B * T; b++) {
        uint64_t s = index * (uint64_t)B + (uint64_t)b;
        for (int i = 0; i < XD; i++)
            x[b * XD + i] = (float)((s * 31 + (uint64_t)i * 17) % 13) / 6.5f - 1.0f;
        targets[b] = (int)(s % CLASSES);
    }
    return 0;
}

/* The test's config, with more keys for the troupe section and for the top level. */
static tr_config_t *config(const char *troupe_extra, const char *top_extra)
{
    char json[2048];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
             " \"zero_optimization\": {\"reduce_bucket_size\": 40},"
             " \"troupe\": {\"data\": {\"prefetch\": 2}, \"runtime\": {\"workers\": 2}%s}%s}",
             troupe_extra, top_extra);
    return test_config(json, "trace.json");
}

static tr_engine_t *engine(tr_config_t *cfg, int *fail_at, const char *trace_dir)
{
    int widths[] = {XD, 16, CLASSES};
    tr_model_t *model;
    assert_int_equal(tr_model_mlp_create(&model, widths, 3, NULL, 0), 0);
    tr_engine_opts_t o = {.config = cfg,
                          .model = model,
                          .seq_len = 1,
                          .seed = 7,
                          .init_params = 1,
                          .trace_dir = trace_dir,
                          .train = {.batch = batch_cb, .user = fail_at, .x_dim = XD}};
    tr_engine_t *eng;
    char err[512];
    int rc = tr_engine_create(&eng, &o, err, sizeof(err));
    if (rc) fprintf(stderr, "engine: %s\n", err);
    assert_int_equal(rc, 0);
    return eng;
}

/* "a/b" in one of 8 rotating buffers (a may be an earlier result): for immediate use. */
static char *path_in(const char *a, const char *b)
{
    static char p[8][512];
    static int i;
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%.250s/%.250s", a, b); /* test paths are short */
    char *s = p[i++ & 7];
    memcpy(s, tmp, sizeof(tmp));
    return s;
}

/* --- the trace ------------------------------------------------------------------------- */

/* The lane (tid) of the thread_name metadata called name, or -1. */
static long long lane_of(json_t *root, const char *name)
{
    size_t i;
    json_t *ev;
    json_array_foreach(root, i, ev)
    {
        const char *n = json_string_value(json_object_get(ev, "name"));
        const char *a = json_string_value(json_object_get(json_object_get(ev, "args"), "name"));
        if (n && a && !strcmp(n, "thread_name") && !strcmp(a, name))
            return json_integer_value(json_object_get(ev, "tid"));
    }
    return -1;
}

static int spans_on(json_t *root, long long tid)
{
    size_t i;
    json_t *ev;
    int n = 0;
    json_array_foreach(root, i, ev) n +=
        !strcmp(json_string_value(json_object_get(ev, "ph")), "X") &&
        json_integer_value(json_object_get(ev, "tid")) == tid;
    return n;
}

/* Counts the gradient messages' spans per step (steps < 8). */
static void grad_steps(json_t *root, int per_step[8])
{
    size_t i;
    json_t *ev;
    memset(per_step, 0, 8 * sizeof(int));
    json_array_foreach(root, i, ev)
    {
        const char *n = json_string_value(json_object_get(ev, "name"));
        if (strcmp(json_string_value(json_object_get(ev, "ph")), "X") ||
            (strcmp(n, "grad_ready") && strcmp(n, "bucket") && strcmp(n, "reduced")))
            continue;
        long long s = json_integer_value(json_object_get(json_object_get(ev, "args"), "step"));
        assert_true(s >= 0 && s < 8);
        per_step[s]++;
    }
}

static int count_counter(json_t *root, const char *name)
{
    size_t i;
    json_t *ev;
    int n = 0;
    json_array_foreach(root, i, ev) n +=
        !strcmp(json_string_value(json_object_get(ev, "ph")), "C") &&
        strstr(json_string_value(json_object_get(ev, "name")), name) != NULL;
    return n;
}

/* Creates the gate file (path: a static string) after 300 ms. */
static void *open_gate_later(void *path)
{
    usleep(300000);
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
    return NULL;
}

static void test_engine_trace_has_every_actor_and_honours_the_window(void **state)
{
    (void)state;
    /* skip step 0, warm up on step 1, write steps 2 and 3. (The run ends with the window: a
     * span that ends after the window closed is not written, and the checkpointer's reply
     * comes before its span ends.) */
    tr_config_t *cfg = config(", \"trace\": {\"steps\": {\"wait\": 1, \"warmup\": 1, "
                              "\"active\": 2, \"repeat\": 1}}",
                              "");
    int never = -1;
    char *dir = path_in(tmpdir, "trace");
    tr_engine_t *eng = engine(cfg, &never, dir);
    for (int i = 0; i < 5; i++) { /* step 4 opens after the window: it closes it */
        assert_int_equal(tr_engine_train_batch(eng, NULL), 0);
        if (i == 2) { /* inside the window: the checkpointer works too; a second save waits
                       * for the first (held 300 ms by the test's gate), and the trace shows it */
            static char gate[512];
            snprintf(gate, sizeof(gate), "%s", path_in(tmpdir, "gate"));
            setenv("TROUPE_TEST_CKPT_WRITE_GATE", gate, 1);
            pthread_t opener;
            pthread_create(&opener, NULL, open_gate_later, gate);
            assert_int_equal(tr_engine_save_checkpoint(eng, path_in(tmpdir, "ckpt"), "a"), 0);
            assert_int_equal(tr_engine_save_checkpoint(eng, path_in(tmpdir, "ckpt"), "b"), 0);
            pthread_join(opener, NULL);
            assert_int_equal(tr_engine_wait_checkpoint(eng), 0);
            unsetenv("TROUPE_TEST_CKPT_WRITE_GATE");
        }
    }
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);

    trace_counts_t c;
    json_t *root = trace_check_file(path_in(dir, "trace_rank0.json"), &c);
    printf("spans %d, flows %d, counters %d, instants %d\n", c.spans, c.flow_starts, c.counters,
           c.instants);
    const char *actors[] = {"executor", "optimizer",    "bucketer",        "comm",
                            "loader",   "checkpointer", "executor passes", "checkpoint wait"};
    for (size_t i = 0; i < sizeof(actors) / sizeof(actors[0]); i++) {
        long long tid = lane_of(root, actors[i]);
        assert_true(tid >= 0);
        if (spans_on(root, tid) == 0) fail_msg("no span on the %s lane", actors[i]);
    }
    /* forward and backward of each written step's 2 micro-batches, inside the window */
    int passes[2] = {0, 0}, step_done[4] = {0};
    size_t k;
    json_t *e;
    json_array_foreach(root, k, e)
    {
        const char *n = json_string_value(json_object_get(e, "name"));
        long long s = json_integer_value(json_object_get(json_object_get(e, "args"), "step"));
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X") || s < 2 || s > 3) continue;
        if (!strcmp(n, "forward") || !strcmp(n, "backward")) passes[!strcmp(n, "backward")]++;
        step_done[s] += !strcmp(n, "step_done");
    }
    assert_int_equal(passes[0], 4);
    assert_int_equal(passes[1], 4);
    /* each written step ends with its STEP_DONE, step 3's too, though its span may end after
     * step 4 opened and closed the window */
    assert_int_equal(step_done[2], 1);
    assert_int_equal(step_done[3], 1);
    assert_true(c.flow_starts > 10);
    assert_int_equal(c.flow_starts, c.flow_ends);
    assert_true(count_counter(root, "bucket_bytes") > 0);
    int per_step[8];
    grad_steps(root, per_step);
    printf("gradient spans per step: %d %d %d %d\n", per_step[0], per_step[1], per_step[2],
           per_step[3]);
    assert_int_equal(per_step[0], 0); /* wait */
    /* warmup: not written, except stragglers recorded across the edge: the last bucket's
     * grad_ready, bucket and reduced spans may end after step 2 opened */
    assert_true(per_step[1] <= 3);
    assert_true(per_step[2] > 0 && per_step[3] > 0);
    /* nothing of the step after the window (the last STEP_DONE carries the step it ends, a
     * pass or a credit the step it ran in), but the loader's prefetch: a batch carries the
     * step count when it was filled, 4 once step 3's optimizer step is done */
    size_t i;
    json_t *ev;
    json_array_foreach(
        root, i,
        ev) if (!strcmp(json_string_value(json_object_get(ev, "ph")), "X") &&
                strcmp(json_string_value(json_object_get(ev, "name")), "batch") &&
                json_integer_value(json_object_get(json_object_get(ev, "args"), "step")) >= 4)
        fail_msg("span '%s' of step %lld, after the window",
                 json_string_value(json_object_get(ev, "name")),
                 json_integer_value(json_object_get(json_object_get(ev, "args"), "step")));
    json_decref(root);
}

/* --- DeepSpeed's outputs --------------------------------------------------------------- */

static int count_lines(const char *text, const char *prefix)
{
    int n = 0;
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        n += !strncmp(p, prefix, strlen(prefix));
    return n;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("%s is missing", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* The size of the TensorBoard event file in dir (0: none). */
static long events_file_size(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    long size = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "events.out.tfevents.", 20)) {
            struct stat st;
            char p[1024];
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            if (stat(p, &st) == 0) size = (long)st.st_size;
        }
    closedir(d);
    return size;
}

/* Runs `steps` steps with stdout going to out_path. */
static void run_captured(tr_config_t *cfg, int steps, const char *out_path)
{
    int never = -1;
    fflush(stdout);
    int saved = dup(1), fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 1);
    tr_engine_t *eng = engine(cfg, &never, NULL);
    for (int i = 0; i < steps; i++)
        assert_int_equal(tr_engine_train_batch(eng, NULL), 0);
    tr_engine_destroy(eng);
    fflush(stdout);
    dup2(saved, 1);
    close(fd);
    close(saved);
}

static void test_engine_wall_clock_breakdown_and_csv_monitor(void **state)
{
    (void)state;
    char extra[1024];
    snprintf(
        extra, sizeof(extra),
        ", \"wall_clock_breakdown\": true, \"steps_per_print\": 2, "
        "\"csv_monitor\": {\"enabled\": true, \"output_path\": \"%s\", \"job_name\": \"job\"},"
        " \"tensorboard\": {\"enabled\": true, \"output_path\": \"%s/tb\", \"job_name\": \"job\"}",
        tmpdir, tmpdir);
    tr_config_t *cfg = config("", extra);
    char out[512];
    snprintf(out, sizeof(out), "%s/stdout.txt", tmpdir);
    run_captured(cfg, 4, out);
    char *text = slurp(out);
    /* a micro timer line per micro-step (GAS 2 x 4 steps), the global one every 2 steps */
    assert_int_equal(count_lines(text, "[Rank 0] time (ms) | fwd_microstep: "), 8);
    assert_int_equal(count_lines(text, "[Rank 0] time (ms) | fwd: "), 2);
    assert_non_null(strstr(text, "| bwd_inner_microstep: "));
    assert_non_null(strstr(text, "| bwd_allreduce: "));
    assert_non_null(strstr(text, " | step: "));
    assert_int_equal(count_lines(text, "[Rank 0] step=2, skipped=0, lr=[0.01], "
                                       "mom=[[0.9, 0.999]]"),
                     1);
    assert_int_equal(count_lines(text, "[Rank 0] step=4, skipped=0, lr="), 1);
    assert_int_equal(count_lines(text, "epoch=0/micro_step=8/global_step=4, "
                                       "RunningAvgSamplesPerSec="),
                     1);

    char job[512];
    snprintf(job, sizeof(job), "%s/job", tmpdir);
    char *loss = slurp(path_in(job, "Train_Samples_train_loss.csv"));
    assert_int_equal(strncmp(loss, "step,train_loss\r\n0,", 19), 0); /* before the 1st step */
    assert_int_equal(count_lines(loss, "step,"), 1);
    assert_int_equal(count_lines(loss, "24,"), 1); /* 8 samples a step: the 4th step's x */
    char *lr = slurp(path_in(job, "Train_Samples_lr.csv"));
    assert_int_equal(strncmp(lr, "step,lr\r\n8,0.01\r\n", 17), 0);
    const char *timers[] = {"forward", "backward", "backward_inner", "backward_allreduce", "step"};
    for (int i = 0; i < 5; i++) {
        char name[128];
        snprintf(name, sizeof(name), "Train_Samples_elapsed_time_ms_%s.csv", timers[i]);
        char *t = slurp(path_in(job, name));
        assert_int_equal(count_lines(t, "step,elapsed_time_ms_"), 1);
        assert_int_equal(count_lines(t, "32,"), 1);
    }

    assert_true(events_file_size(path_in(tmpdir, "tb/job")) > 100); /* 8 scalars a step */

    run_captured(cfg, 2, out); /* a resumed run appends, without a second header */
    loss = slurp(path_in(job, "Train_Samples_train_loss.csv"));
    assert_int_equal(count_lines(loss, "step,"), 1);
    assert_int_equal(count_lines(loss, "0,"), 2);
    tr_config_destroy(cfg);
}

/* The progress line's mom is the betas the next step uses, as DeepSpeed's get_mom() after
 * engine.step(): OneCycle cycles beta1 (from 0.75 down to 0.5 over 2 steps and back; values
 * exact in binary), beta2 stays the config's. */
static void test_engine_progress_line_prints_the_cycled_betas(void **state)
{
    (void)state;
    tr_config_t *cfg = config(
        "", ", \"steps_per_print\": 1, \"scheduler\": {\"type\": \"OneCycle\", \"params\": "
            "{\"cycle_min_lr\": 0.001, \"cycle_max_lr\": 0.01, \"cycle_first_step_size\": 2, "
            "\"cycle_min_mom\": 0.5, \"cycle_max_mom\": 0.75}}");
    char *out = path_in(tmpdir, "betas.txt");
    run_captured(cfg, 4, out);
    char *text = slurp(out);
    static const char *const mom[] = {"0.625", "0.5", "0.625", "0.75"};
    for (int i = 0; i < 4; i++) {
        char head[64], want[64];
        snprintf(head, sizeof(head), "[Rank 0] step=%d, ", i + 1);
        snprintf(want, sizeof(want), ", mom=[[%s, 0.999]]\n", mom[i]);
        const char *line = strstr(text, head), *end = line ? strchr(line, '\n') : NULL;
        const char *at = line ? strstr(line, want) : NULL;
        if (!end || !at || at > end)
            fail_msg("step %d: no line \"%s...%s\" in:\n%s", i + 1, head, want, text);
    }
    tr_config_destroy(cfg);
}

/* --- failure --------------------------------------------------------------------------- */

static void test_engine_failure_dumps_the_flight_recorder(void **state)
{
    (void)state;
    char extra[512];
    char *dir = path_in(tmpdir, "flight");
    snprintf(extra, sizeof(extra), ", \"trace\": {\"output_path\": \"%s\"}", dir);
    tr_config_t *cfg = config(extra, ""); /* tracing off, the flight recorder on by default */
    int fail_at = 5;
    tr_engine_t *eng = engine(cfg, &fail_at, NULL);
    int rc = 0;
    for (int i = 0; i < 10 && rc == 0; i++)
        rc = tr_engine_train_batch(eng, NULL);
    assert_int_equal(rc, TR_EIO);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    trace_counts_t c;
    json_t *root = trace_check_file(path_in(dir, "flight_rank0.json"), &c);
    assert_true(c.spans > 5);
    assert_true(lane_of(root, "loader") >= 0);
    json_decref(root);
    assert_int_equal(access(path_in(dir, "trace_rank0.json"), F_OK), -1); /* tracing was off */
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/troupe_test_engine_trace_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_trace_has_every_actor_and_honours_the_window),
        cmocka_unit_test(test_engine_wall_clock_breakdown_and_csv_monitor),
        cmocka_unit_test(test_engine_progress_line_prints_the_cycled_betas),
        cmocka_unit_test(test_engine_failure_dumps_the_flight_recorder),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (rc == 0 && system(cmd) != 0) rc = 1;
    return rc;
}
