/* test_engine_bad_batch.c: a layer that fails in the middle of tr_engine_train_batch's
 * accumulation window (issue 40, defect 4). The window is abandoned: the call returns the
 * layer's error, the gradients it had accumulated go, and the next call trains on the next
 * batches as a run that never saw the bad batch would. With ZeRO 2 the window's reduced
 * gradients are already with the optimizer, so a failure past the first micro-batch fails
 * the engine with the layer's error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "troupe.h"

#include "engine_testing.h"

#define GAS 2
#define MB  4

/* The failure to inject: the `at`-th training call (1-based) of layer 0's forward or backward
 * (backward: 1) returns TR_EIO, once. */
static struct {
    tr_layer_ops_t ops;
    const tr_layer_ops_t *real;
    int backward;
    int at, calls;
} inject;

static int failing_forward(tr_layer_t *l, tr_layer_ctx_t *ctx)
{
    if (!inject.backward && ctx->training && ++inject.calls == inject.at) return TR_EIO;
    return inject.real->forward(l, ctx);
}

static int failing_backward(tr_layer_t *l, tr_layer_ctx_t *ctx)
{
    if (inject.backward && ++inject.calls == inject.at) return TR_EIO;
    return inject.real->backward(l, ctx);
}

/* test_mlp_batch from batch *(uint64_t *)user on. */
static int shifted_batch(void *user, uint64_t index, int B, int T, int *tokens, float *x,
                         int *targets, float *y)
{
    return test_mlp_batch(NULL, index + *(const uint64_t *)user, B, T, tokens, x, targets, y);
}

static int overlap; /* zero_optimization.overlap_comm */

static tr_config_t *config(void)
{
    char json[512];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d,"
             " \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.01}},"
             " \"zero_optimization\": {\"overlap_comm\": %s, \"reduce_bucket_size\": 20},"
             " \"troupe\": {\"runtime\": {\"workers\": 2}}}",
             MB, GAS, overlap ? "true" : "false");
    return test_config(json, "bad_batch.json");
}

/* An engine on batches first, first + 1, ...; fail_at > 0: layer 0 fails as inject says. */
static tr_engine_t *engine(const tr_config_t *cfg, uint64_t *first, int fail_at, int backward)
{
    int widths[] = {TEST_XD, 16, TEST_CLASSES};
    tr_model_t *model;
    char why[256], err[512];
    assert_int_equal(tr_model_mlp_create(&model, widths, 3, why, sizeof(why)), 0);
    if (fail_at > 0) {
        tr_layer_t *l = tr_model_layer(model, 0);
        inject.real = l->ops;
        inject.ops = *l->ops;
        inject.ops.forward = failing_forward;
        inject.ops.backward = failing_backward;
        inject.backward = backward;
        inject.at = fail_at;
        inject.calls = 0;
        l->ops = &inject.ops;
    }
    tr_engine_opts_t o = {.config = cfg,
                          .model = model,
                          .seq_len = 1,
                          .seed = 11,
                          .init_params = 1,
                          .train = {.batch = shifted_batch, .user = first, .x_dim = TEST_XD}};
    tr_engine_t *eng;
    if (tr_engine_create(&eng, &o, err, sizeof(err))) fail_msg("engine: %s", err);
    return eng;
}

static float *params_of(tr_engine_t *eng, size_t *n)
{
    const tr_model_t *m = tr_engine_model(eng);
    *n = tr_model_num_params(m);
    float *p = malloc(*n * sizeof(float));
    assert_non_null(p);
    memcpy(p, tr_model_params(m), *n * sizeof(float));
    return p;
}

/* The parameters after `steps` steps of a run from batch `first` that sees no failure. */
static float *clean_run(const tr_config_t *cfg, uint64_t first, int steps, size_t *n)
{
    tr_engine_t *eng = engine(cfg, &first, 0, 0);
    for (int s = 0; s < steps; s++)
        assert_int_equal(tr_engine_train_batch(eng, NULL), 0);
    float *p = params_of(eng, n);
    tr_engine_destroy(eng);
    return p;
}

/* Layer 0 fails at the micro-batch `micro` of the first window (forward, or backward): the
 * call returns TR_EIO naming the layer, the pass and the micro-step; the next two calls train
 * on the batches after the window's, bit for bit as a run that starts there. */
static void bad_window_is_skipped(int micro, int backward)
{
    tr_config_t *cfg = config();
    uint64_t first = 0;
    tr_engine_t *eng = engine(cfg, &first, micro + 1, backward);
    tr_step_stats_t st;
    assert_int_equal(tr_engine_train_batch(eng, &st), TR_EIO);
    char at[64], pass[64];
    snprintf(at, sizeof(at), "micro-step %d: layer 0 '", micro);
    snprintf(pass, sizeof(pass), "' %s failed: TR_EIO", backward ? "backward" : "forward");
    const char *why = tr_engine_error(eng);
    if (!strstr(why, at) || !strstr(why, pass))
        fail_msg("error '%s' does not say '%s...%s'", why, at, pass);
    for (int s = 0; s < 2; s++) {
        int rc = tr_engine_train_batch(eng, &st);
        if (rc) fail_msg("train_batch %d after the bad batch: %d: %s", s, rc, tr_engine_error(eng));
        assert_int_equal(st.global_step, s + 1);
        assert_int_equal(st.global_samples, (uint64_t)(s + 1) * MB * GAS);
    }
    size_t n, n_ref;
    float *p = params_of(eng, &n);
    tr_engine_destroy(eng);
    float *ref = clean_run(cfg, (uint64_t)(micro + 1), 2, &n_ref);
    assert_int_equal(n, n_ref);
    assert_memory_equal(p, ref, n * sizeof(float));
    free(p);
    free(ref);
    tr_config_destroy(cfg);
}

static void test_bad_batch_forward_fails_at_micro_step_1(void **state)
{
    (void)state;
    bad_window_is_skipped(1, 0);
}

static void test_bad_batch_forward_fails_at_micro_step_0(void **state)
{
    (void)state;
    bad_window_is_skipped(0, 0);
}

static void test_bad_batch_backward_fails_at_micro_step_0(void **state)
{
    (void)state;
    bad_window_is_skipped(0, 1);
}

static void test_bad_batch_backward_fails_at_the_boundary(void **state)
{
    (void)state;
    bad_window_is_skipped(1, 1);
}

/* overlap_comm: at the boundary the layers above the failing one have already handed their
 * gradients to the bucketer, which has sent full buckets on to the optimizer: the window cannot
 * be taken back, and the engine fails with the layer's error (every later call returns it). */
static void test_bad_batch_backward_fails_at_the_boundary_with_overlap(void **state)
{
    (void)state;
    overlap = 1;
    tr_config_t *cfg = config();
    overlap = 0;
    uint64_t first = 0;
    tr_engine_t *eng = engine(cfg, &first, 2, 1);
    assert_int_equal(tr_engine_train_batch(eng, NULL), TR_EIO);
    assert_non_null(strstr(tr_engine_error(eng), "micro-step 1: layer 0 '"));
    assert_non_null(strstr(tr_engine_error(eng), "' backward failed: TR_EIO"));
    assert_int_equal(tr_engine_train_batch(eng, NULL), TR_EIO);
    assert_int_equal(tr_engine_step(eng, NULL), TR_EIO);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_batch_forward_fails_at_micro_step_1),
        cmocka_unit_test(test_bad_batch_forward_fails_at_micro_step_0),
        cmocka_unit_test(test_bad_batch_backward_fails_at_micro_step_0),
        cmocka_unit_test(test_bad_batch_backward_fails_at_the_boundary),
        cmocka_unit_test(test_bad_batch_backward_fails_at_the_boundary_with_overlap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
