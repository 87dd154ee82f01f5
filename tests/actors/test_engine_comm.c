/* The comm actor with a backend that needs progress: a backend registered by the test that
 * completes each operation only on the third progress call after its start. The engine trains
 * on it exactly as on the local backend (same losses, bit for bit), the actor polled to get
 * there, and once nothing is pending it stops polling and parks. An unknown backend name is
 * refused at create, naming the backends there are. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/comm/comm.h"
#include "troupe.h"

#include "engine_testing.h"

#define XD      TEST_XD
#define CLASSES TEST_CLASSES
#define MAX_OPS 4096

/* --- the deferred backend ------------------------------------------------------------------ */

typedef struct deferred {
    uint64_t req[MAX_OPS], tag[MAX_OPS];
    int polls_left[MAX_OPS];
    int n;
} deferred_t;

static _Atomic long progress_calls, ops_started;

static int start(tr_comm_t *c, uint64_t *req)
{
    deferred_t *d = c->impl;
    if (d->n == MAX_OPS) return TR_ENOSPC;
    *req = tr_comm_next_req(c);
    d->req[d->n] = *req;
    d->tag[d->n] = c->op_tag;
    d->polls_left[d->n++] = 3;
    ops_started++;
    return 0;
}

static int d_all_reduce(tr_comm_t *c, void *buf, size_t n, tr_dtype_t dt, tr_reduce_op_t op,
                        uint64_t *req)
{
    int rc = tr_comm_check(c, buf, n, dt, (int)op, 0);
    return rc < 0 ? rc : start(c, req); /* one rank: the sum is the value */
}

static int d_progress(tr_comm_t *c)
{
    deferred_t *d = c->impl;
    progress_calls++;
    int keep = 0;
    for (int i = 0; i < d->n; i++) {
        if (--d->polls_left[i] == 0) {
            c->done(c->done_arg, d->req[i], d->tag[i], 0);
            continue;
        }
        d->req[keep] = d->req[i];
        d->tag[keep] = d->tag[i];
        d->polls_left[keep++] = d->polls_left[i];
    }
    return d->n = keep;
}

static void d_destroy(tr_comm_t *c)
{
    free(c->impl);
    free(c);
}

static const tr_comm_ops_t deferred_ops = {
    .all_reduce = d_all_reduce, .progress = d_progress, .destroy = d_destroy};

static int deferred_create(tr_comm_t *c, char *why, size_t whylen)
{
    (void)why;
    (void)whylen;
    if (!(c->impl = calloc(1, sizeof(deferred_t)))) return TR_ENOMEM;
    c->ops = &deferred_ops;
    return 0;
}

/* --- engines on one or the other ----------------------------------------------------------- */

static const char *extra_json = ""; /* more top-level keys for the next engine */

static int create(const char *backend, tr_config_t **cfg, tr_engine_t **eng, char *err,
                  size_t errlen)
{
    char json[1024];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
             " \"zero_optimization\": {\"reduce_bucket_size\": 50}%s,"
             " \"troupe\": {\"comm\": {\"backend\": \"%s\"}, \"runtime\": {\"workers\": 2}}}",
             extra_json, backend);
    *cfg = test_config(json, "comm.json");
    int widths[] = {XD, 16, CLASSES};
    tr_model_t *model;
    char why[256];
    assert_int_equal(tr_model_mlp_create(&model, widths, 3, why, sizeof(why)), 0);
    tr_engine_opts_t o = {.config = *cfg,
                          .model = model,
                          .seq_len = 1,
                          .seed = 3,
                          .init_params = 1,
                          .train = {.batch = test_mlp_batch, .x_dim = XD}};
    return tr_engine_create(eng, &o, err, errlen);
}

static void train(const char *backend, float *losses, int steps)
{
    tr_config_t *cfg;
    tr_engine_t *eng;
    char err[512];
    int rc = create(backend, &cfg, &eng, err, sizeof(err));
    if (rc) fail_msg("%s", err);
    tr_step_stats_t st;
    for (int i = 0; i < steps; i++) {
        assert_int_equal(tr_engine_train_batch(eng, &st), 0);
        losses[i] = st.loss;
    }
    if (!strcmp(backend, "deferred")) { /* nothing pending now: the comm actor parks */
        tr_runtime_t *rt = tr_engine_runtime(eng);
        tr_actor_stats_t a, b;
        usleep(20000);
        assert_int_equal(tr_actor_stats(rt, tr_actor_lookup(rt, "comm"), &a), 0);
        long polls = progress_calls;
        usleep(100000);
        assert_int_equal(tr_actor_stats(rt, tr_actor_lookup(rt, "comm"), &b), 0);
        assert_int_equal(b.msgs_in, a.msgs_in);
        assert_int_equal(progress_calls, polls);
    }
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

static void test_engine_comm_polled_backend_trains_as_local(void **state)
{
    (void)state;
    float local[6], deferred[6];
    train("local", local, 6);
    train("deferred", deferred, 6);
    assert_memory_equal(local, deferred, sizeof(local));
    printf("deferred backend: %ld operations, %ld progress calls\n", (long)ops_started,
           (long)progress_calls);
    assert_true(ops_started >= 6 * 2);    /* several buckets of 50 parameters per step */
    assert_true(progress_calls >= 6 * 3); /* a step's last bucket needs three polls at least */
}

static void test_engine_comm_unknown_backend_is_named(void **state)
{
    (void)state;
    tr_config_t *cfg;
    tr_engine_t *eng = NULL;
    char err[512];
    assert_int_equal(create("nope", &cfg, &eng, err, sizeof(err)), TR_ENOTSUP);
    assert_null(eng);
    assert_non_null(strstr(err, "troupe.comm.backend: no comm backend 'nope' in this build "
                                "(it has: local"));
    tr_config_destroy(cfg);
}

/* comms_logger: a verbose line per collective while training, DeepSpeed's summary table at
 * the end (the engine's destroy), as a scripted run shows on stdout. */
static void test_engine_comm_logger_lines_and_summary(void **state)
{
    (void)state;
    char path[] = "/tmp/troupe_comms_XXXXXX";
    int fd = mkstemp(path), saved = dup(1);
    assert_true(fd >= 0 && saved >= 0);
    fflush(stdout);
    dup2(fd, 1);
    extra_json = ", \"comms_logger\": {\"enabled\": true, \"verbose\": true},"
                 " \"steps_per_print\": 1000";
    float losses[3];
    long before = ops_started;
    train("deferred", losses, 3);
    extra_json = "";
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    long ops = ops_started - before;
    FILE *f = fdopen(fd, "r");
    rewind(f);
    char line[512];
    long verbose = 0, header = 0, rows = 0;
    while (fgets(line, sizeof(line), f)) {
        verbose += !strncmp(line, "comm op: all_reduce | time (ms): ", 33) &&
                   strstr(line, "| algbw (Gbps): ") && strstr(line, "| busbw (Gbps): ");
        header += !strncmp(line, "Comm. Op            Message Size        Count", 44);
        rows += !strncmp(line, "                    ", 20);
    }
    fclose(f);
    unlink(path);
    printf("comms logger: %ld lines for %ld operations, %ld summary rows\n", verbose, ops, rows);
    assert_int_equal(verbose, ops);
    assert_int_equal(header, 1);
    assert_true(rows >= 1); /* a row per bucket size */
}

static int setup(void **state)
{
    (void)state;
    return tr_comm_backend_register("deferred", deferred_create);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_comm_polled_backend_trains_as_local),
        cmocka_unit_test(test_engine_comm_unknown_backend_is_named),
        cmocka_unit_test(test_engine_comm_logger_lines_and_summary),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
