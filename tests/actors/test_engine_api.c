/* The engine's API contract where issue 10 found it broken: tr_engine_is_boundary answers
 * DeepSpeed's is_gradient_accumulation_boundary before and after backward for GAS 1, 2 and 3;
 * a checkpoint path longer than a message holds is refused, never truncated, and a long one
 * that fits is used whole; divergence ends training with a message naming the step and the
 * layer (never an empty one); a dataset whose widths do not match the model is refused at
 * create, naming both widths. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe.h"

#include "engine_testing.h"

#define XD      TEST_XD
#define CLASSES TEST_CLASSES

static char tmpdir[256];

static tr_config_t *config(int gas, const char *optimizer)
{
    char json[1024];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": %d,"
             " \"optimizer\": %s%s}",
             gas, optimizer ? optimizer : "{\"type\": \"SGD\", \"params\": {\"lr\": 0.01}}",
             optimizer && strstr(optimizer, "troupe")
                 ? ""
                 : ", \"troupe\": {\"runtime\": {\"workers\": 2}}");
    return test_config(json, "api.json");
}

static tr_model_t *mlp(void)
{
    int widths[] = {XD, 16, CLASSES};
    tr_model_t *model;
    char why[256];
    assert_int_equal(tr_model_mlp_create(&model, widths, 3, why, sizeof(why)), 0);
    return model;
}

/* The options of every engine here: a fresh MLP (XD -> 16 -> CLASSES), seed 7, initialised,
 * trained on batch's micro-batches. */
static tr_engine_opts_t mlp_opts(tr_config_t *cfg, tr_batch_cb batch)
{
    return (tr_engine_opts_t){.config = cfg,
                              .model = mlp(),
                              .seq_len = 1,
                              .seed = 7,
                              .init_params = 1,
                              .train = {.batch = batch, .x_dim = XD}};
}

static int create(tr_config_t *cfg, int x_dim, tr_engine_t **eng, char *err, size_t errlen)
{
    tr_engine_opts_t o = mlp_opts(cfg, test_mlp_batch);
    o.train.x_dim = x_dim;
    return tr_engine_create(eng, &o, err, errlen);
}

static tr_engine_t *engine(tr_config_t *cfg)
{
    tr_engine_t *eng;
    char err[512];
    int rc = create(cfg, XD, &eng, err, sizeof(err));
    if (rc) fprintf(stderr, "engine: %s\n", err);
    assert_int_equal(rc, 0);
    return eng;
}

/* --- is_boundary ------------------------------------------------------------------------ */

static void check_boundary_gas(int gas)
{
    tr_config_t *cfg = config(gas, NULL);
    tr_engine_t *eng = engine(cfg);
    float x[4 * XD], loss;
    int t[4];
    for (int i = 0; i < 3 * gas; i++) {
        test_mlp_batch(NULL, (uint64_t)i, 4, 1, NULL, x, t, NULL);
        tr_engine_batch_t b = {.x = x, .targets = t};
        int want = i % gas == gas - 1; /* the step happens on this micro-batch */
        assert_int_equal(tr_engine_is_boundary(eng), want); /* before its forward */
        assert_int_equal(tr_engine_forward(eng, &b, &loss), 0);
        assert_int_equal(tr_engine_is_boundary(eng), want);
        assert_int_equal(tr_engine_backward(eng), 0);
        assert_int_equal(tr_engine_is_boundary(eng), want); /* after backward, before step */
        tr_step_stats_t st;
        uint64_t before = tr_engine_global_step(eng);
        assert_int_equal(tr_engine_step(eng, &st), 0);
        assert_int_equal(tr_engine_global_step(eng), before + (uint64_t)want);
    }
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

static void test_engine_is_boundary_before_and_after_backward(void **state)
{
    (void)state;
    check_boundary_gas(1);
    check_boundary_gas(2);
    check_boundary_gas(3);
}

/* --- paths ------------------------------------------------------------------------------ */

static void test_engine_long_paths_are_refused_not_truncated(void **state)
{
    (void)state;
    tr_config_t *cfg = config(1, NULL);
    tr_engine_t *eng = engine(cfg);
    assert_int_equal(tr_engine_train_batch(eng, NULL), 0);
    /* longer than a message holds: refused with the length, nothing written */
    char huge[5000];
    memset(huge, 'd', sizeof(huge) - 1);
    huge[sizeof(huge) - 1] = '\0';
    assert_int_equal(tr_engine_save_checkpoint(eng, huge, NULL), TR_ENAMETOOLONG);
    assert_non_null(strstr(tr_engine_error(eng), "save: directory: 4999 bytes, longer than"));
    char tag[300];
    memset(tag, 't', sizeof(tag) - 1);
    tag[sizeof(tag) - 1] = '\0';
    assert_int_equal(tr_engine_save_checkpoint(eng, tmpdir, tag), TR_ENAMETOOLONG);
    assert_non_null(strstr(tr_engine_error(eng), "checkpoint tag: 299 bytes"));
    /* 263 characters (truncated to 240 before): used whole */
    char dir[512];
    int n = snprintf(dir, sizeof(dir), "%s/", tmpdir);
    for (; n < 263; n++)
        dir[n] = n % 60 == 0 ? '/' : 'p';
    dir[n] = '\0';
    assert_int_equal(tr_engine_save_checkpoint(eng, dir, NULL), 0);
    assert_int_equal(tr_engine_wait_checkpoint(eng), 0); /* written in the background */
    char latest[600];
    snprintf(latest, sizeof(latest), "%s/latest", dir);
    struct stat sb;
    assert_int_equal(stat(latest, &sb), 0);
    assert_int_equal(tr_engine_load_checkpoint(eng, dir, NULL), 0);
    assert_int_equal(tr_engine_global_step(eng), 1);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

/* --- divergence ------------------------------------------------------------------------- */

static void test_engine_divergence_names_the_step_and_layer(void **state)
{
    (void)state;
    tr_config_t *cfg = config(1, "{\"type\": \"SGD\", \"params\": {\"lr\": 1e30}}");
    tr_engine_t *eng = engine(cfg);
    int rc = 0, steps = 0;
    while (rc == 0 && steps < 100) {
        rc = tr_engine_train_batch(eng, NULL);
        steps++;
    }
    assert_int_equal(rc, TR_ENONFINITE);
    const char *why = tr_engine_error(eng);
    fprintf(stderr, "divergence: %s\n", why);
    assert_true(why[0] != '\0');
    assert_non_null(strstr(why, "optimizer: step "));
    assert_non_null(strstr(why, "is the first in backward order whose gradients hold Inf or NaN"));
    assert_non_null(strstr(why, "layer "));
    /* the engine stays failed, and says why again */
    char first[1024];
    snprintf(first, sizeof(first), "%s", why);
    assert_int_equal(tr_engine_train_batch(eng, NULL), TR_ENONFINITE);
    assert_string_equal(tr_engine_error(eng), first);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

static void test_engine_nan_weight_names_a_layer(void **state)
{
    (void)state;
    tr_config_t *cfg = config(1, NULL);
    tr_engine_t *eng = engine(cfg);
    const tr_model_t *m = tr_engine_model(eng);
    tr_layer_t *last_linear = tr_model_layer(m, 2); /* linear, gelu, linear, loss */
    tr_model_params(m)[last_linear->param_offset] = NAN;
    assert_int_equal(tr_engine_train_batch(eng, NULL), TR_ENONFINITE);
    const char *why = tr_engine_error(eng);
    fprintf(stderr, "nan weight: %s\n", why);
    assert_non_null(strstr(why, "optimizer: step 0: layer 2 'fc1': parameter 'weight' holds Inf "
                                "or NaN before the step"));
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

/* --- a failure and what follows it --------------------------------------------------------- */

static int failing_cb(void *user, uint64_t index, int B, int T, int *tokens, float *x, int *targets,
                      float *y)
{
    return index == 3 ? TR_EIO : test_mlp_batch(user, index, B, T, tokens, x, targets, y);
}

/* The loader's data error fails the engine; what it causes afterwards (the executor's credit to
 * a stopped loader, the loader's exit notice) never replaces its code or its text. */
static void test_engine_first_failure_stands(void **state)
{
    (void)state;
    tr_config_t *cfg = config(1, NULL);
    char err[256];
    tr_engine_opts_t o = mlp_opts(cfg, failing_cb);
    tr_engine_t *eng;
    assert_int_equal(tr_engine_create(&eng, &o, err, sizeof(err)), 0);
    int rc = 0;
    for (int i = 0; i < 10 && rc == 0; i++)
        rc = tr_engine_train_batch(eng, NULL);
    assert_int_equal(rc, TR_EIO);
    char first[1024];
    snprintf(first, sizeof(first), "%s", tr_engine_error(eng));
    assert_non_null(strstr(first, "loader: dataset callback: batch 3"));
    for (int i = 0; i < 3; i++) { /* whatever the other actors did meanwhile */
        usleep(20000);
        assert_int_equal(tr_engine_train_batch(eng, NULL), TR_EIO);
        assert_string_equal(tr_engine_error(eng), first);
    }
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

/* --- targets ---------------------------------------------------------------------------- */

static int bad_target_cb(void *user, uint64_t index, int B, int T, int *tokens, float *x,
                         int *targets, float *y)
{
    int rc = test_mlp_batch(user, index, B, T, tokens, x, targets, y);
    if (index == 1) targets[2 * T] = CLASSES + 3; /* row 2, position 0 */
    return rc;
}

/* A class target past the model's classes (a custom data file, a callback) names its value,
 * where it is in the batch and the number of classes; issue 40: it said only TR_EINVAL. */
static void test_engine_out_of_range_target_is_named(void **state)
{
    (void)state;
    tr_config_t *cfg = config(1, NULL);
    char err[256];
    tr_engine_opts_t o = mlp_opts(cfg, bad_target_cb);
    tr_engine_t *eng;
    assert_int_equal(tr_engine_create(&eng, &o, err, sizeof(err)), 0);
    int rc = 0;
    for (int i = 0; i < 4 && rc == 0; i++)
        rc = tr_engine_train_batch(eng, NULL);
    assert_int_equal(rc, TR_EINVAL);
    const char *e = tr_engine_error(eng);
    char want[256];
    snprintf(want, sizeof(want),
             "target %d at batch index 2, position 0 is not a class of the %d (expected 0 to %d",
             CLASSES + 3, CLASSES, CLASSES - 1);
    if (!strstr(e, want)) print_message("error: %s\nwanted: %s\n", e, want);
    assert_non_null(strstr(e, want));
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

/* --- widths ----------------------------------------------------------------------------- */

static void test_engine_checks_dataset_widths_at_create(void **state)
{
    (void)state;
    tr_config_t *cfg = config(1, NULL);
    tr_engine_t *eng = NULL;
    char err[512];
    assert_int_equal(create(cfg, 5, &eng, err, sizeof(err)), TR_EINVAL);
    assert_null(eng);
    assert_non_null(strstr(err, "train dataset: x_dim 5"));
    assert_non_null(strstr(err, "of width 8"));
    assert_int_equal(create(cfg, 0, &eng, err, sizeof(err)), TR_EINVAL);
    assert_non_null(strstr(err, "train dataset: x_dim 0"));
    tr_config_destroy(cfg);
}

/* --- deterministic mode ------------------------------------------------------------------ */

/* Trains 6 steps under the seeded scheduler; the losses go to out. */
static void deterministic_run(uint64_t seed, float *out)
{
    char extra[256];
    snprintf(extra, sizeof(extra),
             "{\"type\": \"Adam\", \"params\": {\"lr\": 0.01}}, \"troupe\": {\"runtime\": "
             "{\"deterministic\": true, \"seed\": %llu}, \"data\": {\"prefetch\": 3}}",
             (unsigned long long)seed);
    tr_config_t *cfg = config(2, extra);
    tr_engine_t *eng = engine(cfg);
    assert_int_equal(tr_runtime_seed(tr_engine_runtime(eng)), seed);
    assert_int_equal(tr_runtime_workers(tr_engine_runtime(eng)), 1);
    tr_step_stats_t st;
    for (int i = 0; i < 6; i++) {
        assert_int_equal(tr_engine_train_batch(eng, &st), 0);
        out[i] = st.loss;
    }
    float val;
    assert_int_equal(tr_engine_eval(eng, 2, &val), 0);
    assert_int_equal(tr_engine_save_checkpoint(eng, tmpdir, "det"), 0);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

static void test_engine_deterministic_mode_trains_and_replays(void **state)
{
    (void)state;
    float a[6], b[6];
    deterministic_run(5, a);
    deterministic_run(5, b);
    assert_memory_equal(a, b, sizeof(a));
    assert_true(a[5] < a[0]);
}

/* --- tracing and logging ----------------------------------------------------------------- */

static int create_traced(tr_config_t *cfg, const char *trace_dir, tr_engine_t **eng, char *err,
                         size_t errlen)
{
    tr_engine_opts_t o = mlp_opts(cfg, test_mlp_batch);
    o.trace_dir = trace_dir;
    return tr_engine_create(eng, &o, err, errlen);
}

static void test_engine_second_engine_may_not_overwrite_a_trace(void **state)
{
    (void)state;
    tr_config_t *cfg = config(1, NULL);
    char dir[300], other[300], err[512];
    snprintf(dir, sizeof(dir), "%s/trace", tmpdir);
    snprintf(other, sizeof(other), "%s/trace/../trace", tmpdir); /* the same folder */
    tr_engine_t *a, *b = NULL;
    assert_int_equal(create_traced(cfg, dir, &a, err, sizeof(err)), 0);
    assert_int_equal(create_traced(cfg, other, &b, err, sizeof(err)), TR_EBUSY);
    assert_null(b);
    assert_non_null(strstr(err, "another engine in this process is tracing into"));
    assert_int_equal(tr_engine_train_batch(a, NULL), 0);
    tr_engine_destroy(a);
    assert_int_equal(create_traced(cfg, dir, &b, err, sizeof(err)), 0); /* free again */
    tr_engine_destroy(b);
    tr_config_destroy(cfg);
}

typedef struct lines {
    int n, bucketer;
} lines_t;

static void count_line(void *user, int level, const char *line)
{
    lines_t *l = user;
    (void)level;
    l->n++;
    l->bucketer += strstr(line, "bucketer:") != NULL;
}

static void test_engine_log_level_comes_from_the_config(void **state)
{
    (void)state;
    if (getenv("TROUPE_LOG_LEVEL")) skip(); /* the environment overrides the config */
    lines_t seen = {0, 0};
    tr_log_set_sink(count_line, &seen);
    tr_config_t *cfg = config(1, "{\"type\": \"SGD\", \"params\": {\"lr\": 0.01}}, "
                                 "\"troupe\": {\"log_level\": \"warning\"}");
    tr_engine_t *eng = engine(cfg);
    assert_int_equal(tr_log_level(), TR_LOG_WARN);
    assert_int_equal(seen.bucketer, 0); /* the start-up line is info */
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    cfg = config(1, NULL);
    eng = engine(cfg);
    assert_int_equal(tr_log_level(), TR_LOG_INFO);
    assert_int_equal(seen.bucketer, 1);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    tr_log_set_sink(NULL, NULL);
}

/* --- refused arguments (issue 40, defects 12 and 13) -------------------------------------- */

/* rc is TR_EINVAL and the thread's tr_last_error names `fn` and `arg`. */
static void assert_refused(int rc, const char *fn, const char *arg)
{
    assert_int_equal(rc, TR_EINVAL);
    if (!strstr(tr_last_error(), fn) || !strstr(tr_last_error(), arg))
        fail_msg("%s: tr_last_error '%s' does not name %s", fn, tr_last_error(), arg);
}

static void test_engine_null_pointers_are_refused_with_a_message(void **state)
{
    (void)state;
    tr_config_t *cfg = config(1, NULL);
    char err[512];
    tr_engine_t *eng = NULL;
    tr_engine_opts_t o = {.config = cfg, .model = mlp(), .seq_len = 1, .seed = 7};
    /* create: out, opts and opts->model; the model is the engine's also on failure */
    assert_int_equal(tr_engine_create(NULL, &o, err, sizeof(err)), TR_EINVAL);
    assert_non_null(strstr(err, "out is NULL"));
    o.model = NULL; /* destroyed by the call */
    assert_refused(tr_engine_create(NULL, &o, NULL, 0), "tr_engine_create", "out is NULL");
    assert_refused(tr_engine_create(&eng, NULL, NULL, 0), "tr_engine_create", "opts is NULL");
    assert_null(eng);
    assert_int_equal(tr_engine_create(&eng, NULL, err, sizeof(err)), TR_EINVAL);
    assert_non_null(strstr(err, "opts is NULL"));
    o.model = NULL;
    assert_int_equal(tr_engine_create(&eng, &o, err, sizeof(err)), TR_EINVAL);
    assert_non_null(strstr(err, "opts->model is NULL"));
    o.model = mlp();
    assert_refused(tr_engine_create(NULL, &o, err, 0), "tr_engine_create", "out is NULL");

    /* every call on a NULL engine */
    tr_step_stats_t st;
    float loss;
    tr_engine_batch_t b = {0};
    tr_engine_memory_t mem;
    assert_refused(tr_engine_train_batch(NULL, &st), "tr_engine_train_batch", "eng is NULL");
    assert_refused(tr_engine_eval(NULL, 1, &loss), "tr_engine_eval", "eng is NULL");
    assert_refused(tr_engine_forward(NULL, &b, &loss), "tr_engine_forward", "eng is NULL");
    assert_refused(tr_engine_backward(NULL), "tr_engine_backward", "eng is NULL");
    assert_refused(tr_engine_step(NULL, &st), "tr_engine_step", "eng is NULL");
    assert_refused(tr_engine_is_boundary(NULL), "tr_engine_is_boundary", "eng is NULL");
    assert_refused(tr_engine_save_checkpoint(NULL, tmpdir, NULL), "tr_engine_save_checkpoint",
                   "eng is NULL");
    assert_refused(tr_engine_wait_checkpoint(NULL), "tr_engine_wait_checkpoint", "eng is NULL");
    assert_refused(tr_engine_load_checkpoint(NULL, tmpdir, NULL), "tr_engine_load_checkpoint",
                   "eng is NULL");
    assert_refused(tr_engine_rank(NULL), "tr_engine_rank", "eng is NULL");
    assert_refused(tr_engine_world(NULL), "tr_engine_world", "eng is NULL");
    assert_refused(tr_engine_stop_requested(NULL), "tr_engine_stop_requested", "eng is NULL");
    assert_non_null(strstr(tr_engine_error(NULL), "eng is NULL"));
    assert_null(tr_engine_model(NULL));
    assert_refused(TR_EINVAL, "tr_engine_model", "eng is NULL");
    assert_null(tr_engine_config(NULL));
    assert_refused(TR_EINVAL, "tr_engine_config", "eng is NULL");
    assert_null(tr_engine_runtime(NULL));
    assert_refused(TR_EINVAL, "tr_engine_runtime", "eng is NULL");
    assert_int_equal(tr_engine_global_step(NULL), 0);
    assert_refused(TR_EINVAL, "tr_engine_global_step", "eng is NULL");
    memset(&mem, 0xff, sizeof(mem));
    tr_engine_memory(NULL, &mem);
    assert_refused(TR_EINVAL, "tr_engine_memory", "eng is NULL");
    assert_int_equal(mem.params, 0);
    tr_engine_destroy(NULL);

    /* the other pointers, on an engine: tr_engine_error says it too */
    eng = engine(cfg);
    assert_refused(tr_engine_eval(eng, 1, NULL), "tr_engine_eval", "loss is NULL");
    assert_non_null(strstr(tr_engine_error(eng), "loss is NULL"));
    assert_refused(tr_engine_forward(eng, NULL, &loss), "tr_engine_forward", "batch is NULL");
    assert_non_null(strstr(tr_engine_error(eng), "batch is NULL"));
    float x[4 * XD];
    int t[4];
    test_mlp_batch(NULL, 0, 4, 1, NULL, x, t, NULL);
    b = (tr_engine_batch_t){.x = x, .targets = t};
    assert_refused(tr_engine_forward(eng, &b, NULL), "tr_engine_forward", "loss is NULL");
    assert_non_null(strstr(tr_engine_error(eng), "loss is NULL"));
    assert_refused(tr_engine_save_checkpoint(eng, NULL, NULL), "tr_engine_save_checkpoint",
                   "dir is NULL");
    assert_non_null(strstr(tr_engine_error(eng), "dir is NULL"));
    assert_refused(tr_engine_load_checkpoint(eng, NULL, "t"), "tr_engine_load_checkpoint",
                   "dir is NULL");
    assert_non_null(strstr(tr_engine_error(eng), "dir is NULL"));
    tr_engine_memory(eng, NULL);
    assert_refused(TR_EINVAL, "tr_engine_memory", "out is NULL");
    /* still usable */
    assert_int_equal(tr_engine_train_batch(eng, NULL), 0);
    assert_int_equal(tr_engine_forward(eng, &b, &loss), 0);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

static void test_engine_bad_checkpoint_tags_are_named(void **state)
{
    (void)state;
    tr_config_t *cfg = config(1, NULL);
    tr_engine_t *eng = engine(cfg);
    assert_int_equal(tr_engine_train_batch(eng, NULL), 0);
    assert_int_equal(tr_engine_save_checkpoint(eng, "", NULL), TR_EINVAL);
    assert_non_null(strstr(tr_engine_error(eng), "dir is empty"));
    assert_int_equal(tr_engine_load_checkpoint(eng, "", NULL), TR_EINVAL);
    assert_non_null(strstr(tr_engine_error(eng), "dir is empty"));
    const char *bad[] = {"..", ".", "a/b", "../escape", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char want[64];
        snprintf(want, sizeof(want), "tag '%s'", bad[i]);
        assert_int_equal(tr_engine_save_checkpoint(eng, tmpdir, bad[i]), TR_EINVAL);
        if (!strstr(tr_engine_error(eng), want))
            fail_msg("save, tag '%s': error '%s'", bad[i], tr_engine_error(eng));
        assert_non_null(strstr(tr_last_error(), want));
        assert_int_equal(tr_engine_load_checkpoint(eng, tmpdir, bad[i]), TR_EINVAL);
        if (!strstr(tr_engine_error(eng), want))
            fail_msg("load, tag '%s': error '%s'", bad[i], tr_engine_error(eng));
    }
    /* nothing escaped the directory */
    struct stat sb;
    char path[400];
    snprintf(path, sizeof(path), "%s/../escape", tmpdir);
    assert_int_not_equal(stat(path, &sb), 0);
    assert_int_equal(tr_engine_save_checkpoint(eng, tmpdir, "ok"), 0);
    assert_int_equal(tr_engine_wait_checkpoint(eng), 0);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

/* A batch source that holds its first batch until the test opens the gate (10 s at most). */
static atomic_int gate_entered, gate_open;

static int gated_batch(void *user, uint64_t index, int B, int T, int *tokens, float *x,
                       int *targets, float *y)
{
    atomic_store(&gate_entered, 1);
    for (int i = 0; i < 10000 && !atomic_load(&gate_open); i++)
        usleep(1000);
    return test_mlp_batch(user, index, B, T, tokens, x, targets, y);
}

struct train_arg {
    tr_engine_t *eng;
    int rc;
};

static void *train_thread(void *p)
{
    struct train_arg *a = p;
    a->rc = tr_engine_train_batch(a->eng, NULL);
    return NULL;
}

static void test_engine_concurrent_call_is_refused_with_a_message(void **state)
{
    (void)state;
    tr_config_t *cfg = config(1, NULL);
    tr_engine_opts_t o = mlp_opts(cfg, gated_batch);
    tr_engine_t *eng;
    char err[512];
    assert_int_equal(tr_engine_create(&eng, &o, err, sizeof(err)), 0);
    atomic_store(&gate_entered, 0);
    atomic_store(&gate_open, 0);
    struct train_arg a = {.eng = eng, .rc = 1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, train_thread, &a), 0);
    /* the loader starts at the first train request: once it asks for a batch, the other
     * thread's call is running */
    for (int i = 0; i < 10000 && !atomic_load(&gate_entered); i++)
        usleep(1000);
    assert_true(atomic_load(&gate_entered));
    int rc = tr_engine_train_batch(eng, NULL);
    char why[256];
    snprintf(why, sizeof(why), "%s", tr_last_error());
    /* any call, even one with a bad argument: the engine's error is the running call's */
    assert_int_equal(tr_engine_save_checkpoint(eng, NULL, NULL), TR_EBUSY);
    assert_int_equal(tr_engine_forward(eng, NULL, NULL), TR_EBUSY);
    atomic_store(&gate_open, 1);
    pthread_join(th, NULL);
    assert_int_equal(rc, TR_EBUSY);
    if (!strstr(why, "tr_engine_train_batch") || !strstr(why, "another call"))
        fail_msg("refused call's tr_last_error: '%s'", why);
    assert_int_equal(a.rc, 0); /* the running call was not disturbed */
    assert_string_equal(tr_engine_error(eng), "");
    assert_int_equal(tr_engine_train_batch(eng, NULL), 0);
    assert_int_equal(tr_engine_global_step(eng), 2);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

struct create_arg {
    tr_engine_opts_t *o;
    tr_engine_t *eng;
    int rc;
};

static void *create_thread(void *p)
{
    struct create_arg *a = p;
    char err[512];
    a->rc = tr_engine_create(&a->eng, a->o, err, sizeof(err));
    return NULL;
}

/* engine.h and docs/embedding.md: created on any thread, then driven from any other, one call
 * at a time. */
static void test_engine_created_on_one_thread_is_driven_from_another(void **state)
{
    (void)state;
    tr_config_t *cfg = config(1, NULL);
    tr_engine_opts_t o = mlp_opts(cfg, test_mlp_batch);
    struct create_arg a = {.o = &o, .rc = 1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, create_thread, &a), 0);
    pthread_join(th, NULL); /* the creating thread has ended */
    assert_int_equal(a.rc, 0);
    assert_int_equal(tr_engine_train_batch(a.eng, NULL), 0);
    struct train_arg t = {.eng = a.eng, .rc = 1};
    assert_int_equal(pthread_create(&th, NULL, train_thread, &t), 0);
    pthread_join(th, NULL);
    assert_int_equal(t.rc, 0);
    assert_int_equal(tr_engine_global_step(a.eng), 2);
    tr_engine_destroy(a.eng);
    tr_config_destroy(cfg);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/troupe_api_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_is_boundary_before_and_after_backward),
        cmocka_unit_test(test_engine_long_paths_are_refused_not_truncated),
        cmocka_unit_test(test_engine_divergence_names_the_step_and_layer),
        cmocka_unit_test(test_engine_nan_weight_names_a_layer),
        cmocka_unit_test(test_engine_checks_dataset_widths_at_create),
        cmocka_unit_test(test_engine_out_of_range_target_is_named),
        cmocka_unit_test(test_engine_first_failure_stands),
        cmocka_unit_test(test_engine_deterministic_mode_trains_and_replays),
        cmocka_unit_test(test_engine_second_engine_may_not_overwrite_a_trace),
        cmocka_unit_test(test_engine_log_level_comes_from_the_config),
        cmocka_unit_test(test_engine_null_pointers_are_refused_with_a_message),
        cmocka_unit_test(test_engine_bad_checkpoint_tags_are_named),
        cmocka_unit_test(test_engine_concurrent_call_is_refused_with_a_message),
        cmocka_unit_test(test_engine_created_on_one_thread_is_driven_from_another),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
