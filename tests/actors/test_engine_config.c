/* The engine acts on the config keys issue 10 found read and dropped: an evaluation-only
 * engine needs no "optimizer" section (a step then fails with a message saying so); amsgrad,
 * Lion and the 1-bit names train; scheduler.params.last_batch_iteration resumes the schedule;
 * weight decay skips tensors marked no_decay. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "troupe.h"

#include "engine_testing.h"

#define XD      8
#define CLASSES 3

/* --- a synthetic classification task, deterministic per batch index -------------------- */

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int batch_cb(void *user, uint64_t index, int B, int T, int *tokens, float *x, int *targets,
                    float *y)
{
    (void)user;
    (void)tokens;
    for (int b = 0; b < B * T; b++) {
        uint64_t s = index * (uint64_t)B + (uint64_t)b;
        float best = -1e30f;
        for (int i = 0; i < XD; i++) {
            float v = (float)(mix(s * XD + (uint64_t)i + 1) >> 11) / (float)(1ull << 53) * 2 - 1;
            x[(size_t)b * XD + (size_t)i] = v;
        }
        for (int c = 0; c < CLASSES; c++) {
            float v = 0;
            for (int i = 0; i < XD; i++)
                v += x[(size_t)b * XD + (size_t)i] * (float)((i * 5 + c * 3) % 4 - 1);
            if (v > best) {
                best = v;
                targets[b] = c;
            }
        }
    }
    return 0;
}

static tr_config_t *config(const char *body)
{
    char json[2048];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 1%s%s}",
             strstr(body, "\"troupe\"") ? "" : ", \"troupe\": {\"runtime\": {\"workers\": 2}}",
             body[0] ? ", " : "");
    snprintf(json + strlen(json) - 1, sizeof(json) - strlen(json) + 1, "%s}", body);
    return test_config(json, "test.json");
}

/* An MLP XD -> 16 -> CLASSES; no_decay_tensor >= 0 marks that tensor (in model order). */
static tr_engine_t *engine(tr_config_t *cfg, int no_decay_tensor)
{
    int widths[] = {XD, 16, CLASSES};
    tr_model_t *model;
    char why[256];
    assert_int_equal(tr_model_mlp_create(&model, widths, 3, why, sizeof(why)), 0);
    for (int i = 0, t = 0; i < tr_model_num_layers(model); i++) {
        tr_layer_t *l = tr_model_layer(model, i);
        for (int k = 0; k < l->n_params; k++, t++)
            l->params[k].no_decay = t == no_decay_tensor;
    }
    tr_engine_opts_t o = {.config = cfg,
                          .model = model,
                          .seq_len = 1,
                          .seed = 42,
                          .init_params = 1,
                          .train = {.batch = batch_cb, .x_dim = XD}};
    tr_engine_t *eng;
    char err[512];
    int rc = tr_engine_create(&eng, &o, err, sizeof(err));
    if (rc) fprintf(stderr, "engine: %s\n", err);
    assert_int_equal(rc, 0);
    return eng;
}

static float *params_copy(tr_engine_t *eng)
{
    const tr_model_t *m = tr_engine_model(eng);
    size_t n = tr_model_num_params(m);
    float *p = malloc(n * sizeof(float));
    memcpy(p, tr_model_params(m), n * sizeof(float));
    return p;
}

/* --- tests ------------------------------------------------------------------------------ */

static void test_engine_config_evaluates_without_an_optimizer(void **state)
{
    tr_config_t *cfg = config("");
    tr_engine_t *eng = engine(cfg, -1);
    float loss = 0;
    assert_int_equal(tr_engine_eval(eng, 2, &loss), 0);
    assert_true(isfinite(loss) && loss > 0);
    tr_step_stats_t st;
    assert_int_equal(tr_engine_train_batch(eng, &st), TR_ECONFIG);
    /* the optimizer's explanation reaches the caller (STEP_DONE carries it) */
    assert_non_null(strstr(tr_engine_error(eng), "optimizer: step requested but the config has "
                                                 "no \"optimizer\" section"));
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

/* After one AdamW step from the same start, gradients are equal in both runs, so a tensor
 * marked no_decay ends bit-for-bit where it ends without weight decay; the others do not. */
static void test_engine_config_no_decay_tensors_are_not_decayed(void **state)
{
    const int marked = 1; /* the first layer's bias */
    float *after[2];
    for (int run = 0; run < 2; run++) {
        tr_config_t *cfg = config(run ? "\"optimizer\": {\"type\": \"AdamW\", \"params\": "
                                        "{\"lr\": 0.01, \"weight_decay\": 0.5}}"
                                      : "\"optimizer\": {\"type\": \"AdamW\", \"params\": "
                                        "{\"lr\": 0.01, \"weight_decay\": 0}}");
        tr_engine_t *eng = engine(cfg, run ? marked : -1);
        assert_int_equal(tr_engine_train_batch(eng, NULL), 0);
        after[run] = params_copy(eng);
        tr_engine_destroy(eng);
        tr_config_destroy(cfg);
    }
    int widths[] = {XD, 16, CLASSES};
    tr_model_t *m;
    char why[256];
    assert_int_equal(tr_model_mlp_create(&m, widths, 3, why, sizeof(why)), 0);
    for (int i = 0, t = 0; i < tr_model_num_layers(m); i++) {
        tr_layer_t *l = tr_model_layer(m, i);
        for (int k = 0; k < l->n_params; k++, t++) {
            size_t at = l->param_offset + l->params[k].offset, n = l->params[k].numel;
            int same = !memcmp(after[0] + at, after[1] + at, n * sizeof(float));
            if (same != (t == marked))
                fail_msg("tensor %d (%s): %s", t, l->params[k].name,
                         same ? "not decayed" : "decayed although marked no_decay");
        }
    }
    tr_model_destroy(m);
    free(after[0]);
    free(after[1]);
}

/* Adam with amsgrad trains, keeps a third state array, and differs from plain Adam. */
static void test_engine_config_amsgrad_is_applied(void **state)
{
    float *after[2];
    for (int ams = 0; ams < 2; ams++) {
        char body[256];
        snprintf(body, sizeof(body),
                 "\"optimizer\": {\"type\": \"Adam\", \"params\": "
                 "{\"lr\": 0.05, \"amsgrad\": %s}}",
                 ams ? "true" : "false");
        tr_config_t *cfg = config(body);
        tr_engine_t *eng = engine(cfg, -1);
        tr_step_stats_t st, first = {0};
        for (int i = 0; i < 40; i++) {
            assert_int_equal(tr_engine_train_batch(eng, &st), 0);
            if (i == 0) first = st;
        }
        assert_true(st.loss < first.loss);
        after[ams] = params_copy(eng);
        tr_engine_destroy(eng);
        tr_config_destroy(cfg);
    }
    int widths[] = {XD, 16, CLASSES};
    size_t n = (size_t)(XD * 16 + 16 + 16 * CLASSES + CLASSES);
    (void)widths;
    assert_true(memcmp(after[0], after[1], n * sizeof(float)) != 0);
    free(after[0]);
    free(after[1]);
}

/* Lion's first step from zero momentum moves every parameter by exactly lr (or not at all
 * where the gradient is 0): sign(c) with c = (1 - beta1) g. Then the loss falls. The 1-bit
 * names train as their base optimizer. */
static void test_engine_config_lion_and_onebit_names_train(void **state)
{
    tr_config_t *cfg = config("\"optimizer\": {\"type\": \"Lion\", \"params\": {\"lr\": 0.001,"
                              " \"betas\": [0.9, 0.99]}}");
    tr_engine_t *eng = engine(cfg, -1);
    float *before = params_copy(eng);
    tr_step_stats_t st, first;
    assert_int_equal(tr_engine_train_batch(eng, &first), 0);
    const float *p = tr_model_params(tr_engine_model(eng));
    size_t n = tr_model_num_params(tr_engine_model(eng)), moved = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(p[i] - before[i]);
        assert_true(d == 0.0f || fabsf(d - 0.001f) < 1e-6f);
        moved += d != 0.0f;
    }
    assert_true(moved > n / 2);
    for (int i = 0; i < 60; i++)
        assert_int_equal(tr_engine_train_batch(eng, &st), 0);
    assert_true(st.loss < first.loss);
    free(before);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    static const char *const names[] = {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"};
    for (int i = 0; i < 3; i++) {
        char body[256];
        snprintf(body, sizeof(body),
                 "\"optimizer\": {\"type\": \"%s\", \"params\": "
                 "{\"lr\": 0.01}}",
                 names[i]);
        cfg = config(body);
        eng = engine(cfg, -1);
        for (int k = 0; k < 30; k++)
            assert_int_equal(tr_engine_train_batch(eng, k ? &st : &first), 0);
        assert_true(st.loss < first.loss);
        tr_engine_destroy(eng);
        tr_config_destroy(cfg);
    }
}

/* A run started with last_batch_iteration k continues the uninterrupted run's learning
 * rates: its step 1 uses what the uninterrupted run's step k + 2 uses (lr(k)). */
static void test_engine_config_last_batch_iteration_resumes_the_schedule(void **state)
{
    const char *sched = "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}, "
                        "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\":"
                        " 0, \"warmup_max_lr\": 0.1, \"warmup_num_steps\": 10, \"warmup_type\":"
                        " \"linear\"%s}}";
    double lr[2][8];
    for (int run = 0; run < 2; run++) {
        char body[512];
        snprintf(body, sizeof(body), sched, run ? ", \"last_batch_iteration\": 3" : "");
        tr_config_t *cfg = config(body);
        tr_engine_t *eng = engine(cfg, -1);
        for (int i = 0; i < 8; i++) {
            tr_step_stats_t st;
            assert_int_equal(tr_engine_train_batch(eng, &st), 0);
            lr[run][i] = st.lr;
        }
        tr_engine_destroy(eng);
        tr_config_destroy(cfg);
    }
    for (int i = 0; i + 4 < 8; i++) /* resumed step i+1 = uninterrupted step i+5 */
        assert_true(fabs(lr[1][i] - lr[0][i + 4]) < 1e-12);
    assert_true(fabs(lr[1][0] - 0.1 * 3 / 10) < 1e-12); /* lr(3), linear warmup */
}

/* Step 1 trains at the rate each of DeepSpeed's schedulers writes into the optimizer when it
 * is made (its iteration -1; DeepSpeed 0.19, runtime/lr_schedules.py), not at the optimizer's
 * lr (0.1 here): warmup_min_lr for WarmupLR and WarmupDecayLR, 0 for WarmupCosineLR,
 * cycle_min_lr for OneCycle. Step 3 (iteration 1) is past it. */
static void test_engine_config_first_step_uses_the_schedulers_initial_rate(void **state)
{
    (void)state;
    static const struct {
        const char *sched;
        double first;
    } cases[] = {
        {"\"WarmupLR\", \"params\": {\"warmup_min_lr\": 0.002, \"warmup_max_lr\": 0.05, "
         "\"warmup_num_steps\": 10}",
         0.002},
        {"\"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": 0.003, \"warmup_max_lr\": 0.05, "
         "\"warmup_num_steps\": 10, \"total_num_steps\": 20}",
         0.003},
        {"\"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": 10, \"total_num_steps\": 20}",
         0.0},
        {"\"OneCycle\", \"params\": {\"cycle_min_lr\": 0.004, \"cycle_max_lr\": 0.05, "
         "\"cycle_first_step_size\": 5}",
         0.004},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        char body[512];
        snprintf(body, sizeof(body),
                 "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.1}}, "
                 "\"scheduler\": {\"type\": %s}",
                 cases[c].sched);
        tr_config_t *cfg = config(body);
        tr_engine_t *eng = engine(cfg, -1);
        tr_step_stats_t st;
        assert_int_equal(tr_engine_train_batch(eng, &st), 0);
        if (fabs(st.lr - cases[c].first) > 1e-12)
            fail_msg("%s: step 1 trained at lr %g, expected %g", cases[c].sched, st.lr,
                     cases[c].first);
        for (int i = 0; i < 2; i++) /* steps 2 and 3: iterations 0 and 1, warming up */
            assert_int_equal(tr_engine_train_batch(eng, &st), 0);
        assert_true(st.lr > cases[c].first);
        tr_engine_destroy(eng);
        tr_config_destroy(cfg);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_config_evaluates_without_an_optimizer),
        cmocka_unit_test(test_engine_config_no_decay_tensors_are_not_decayed),
        cmocka_unit_test(test_engine_config_amsgrad_is_applied),
        cmocka_unit_test(test_engine_config_lion_and_onebit_names_train),
        cmocka_unit_test(test_engine_config_last_batch_iteration_resumes_the_schedule),
        cmocka_unit_test(test_engine_config_first_step_uses_the_schedulers_initial_rate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
