/* Memory per rank at ZeRO 1 and 2 (run by mpirun on 2 and 4 ranks), measured as the process's
 * peak resident set (VmHWM) while it trains a model whose parameters dominate its memory: an
 * MLP of 16 hidden layers of 1024 x 1024 (16.8 M parameters, AdamW), buckets of 256 Ki elements.
 * At stage 2 the backward holds only the gradients of the buckets in flight (the engine's
 * window), so the peak is strictly below stage 1's; at stage 3 each rank holds its slice of
 * the parameters and the fetcher's window (two layers), below stage 2's; and each stage's
 * peak above the memory
 * before the engine stays within the engine's own prediction (tr_engine_memory) plus a
 * stated slack for what the prediction leaves out (activations, scratch, mailboxes, MPI's
 * buffers). Stage 2 runs first: memory the allocator keeps after its engine could only make
 * stage 1's figure smaller, never stage 2's, so the comparison cannot pass by accident (and a
 * first stage-2 run, not measured, pays for what a process makes once: MPI's set-up). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <malloc.h>
#include <math.h>

#include "troupe.h"

#include "engine_testing.h"

#define HIDDEN 1024
#define LAYERS 16
#define BUCKET (256 * 1024)
#define STEPS  3
#define SLACK  (24.0 * 1048576.0) /* bytes the prediction leaves out */

/* A field of /proc/self/status in bytes (VmRSS, VmHWM). */
static double status_bytes(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    assert_non_null(f);
    char line[256];
    double kib = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, field, n) == 0 && line[n] == ':') kib = strtod(line + n + 1, NULL);
    fclose(f);
    assert_true(kib >= 0);
    return kib * 1024.0;
}

/* The peak from here on: the kernel resets VmHWM to the current resident set. */
static void reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    assert_non_null(f);
    assert_true(fputs("5", f) >= 0);
    assert_int_equal(fclose(f), 0);
}

typedef struct run {
    int rank, world;
    double peak;      /* VmHWM minus VmRSS before the engine */
    double predicted; /* tr_engine_memory's total */
    double saved;     /* what the backward holds less than a whole gradient (ZeRO 2) */
    double params;    /* the prediction's parameters */
    float loss[STEPS];
} run_t;

/* ZeRO 3's fetcher: every layer gathered when used, two layers' worth live at most */
#define STAGE3_KEYS                                                                                \
    ", \"stage3_param_persistence_threshold\": 0, \"stage3_max_live_parameters\": 2200000,"        \
    " \"stage3_prefetch_bucket_size\": 1100000, \"stage3_max_reuse_distance\": 0"

static void train(int stage, run_t *r)
{
    char json[768];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 1,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}},"
             " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %d,"
             " \"overlap_comm\": true%s}, \"troupe\": {\"runtime\": {\"workers\": 1}}}",
             stage, BUCKET, stage == 3 ? STAGE3_KEYS : "");
    tr_config_t *cfg = test_config_world(json, "zero_mem.json", 0);
    int widths[LAYERS + 2];
    widths[0] = TEST_XD;
    for (int i = 1; i <= LAYERS; i++)
        widths[i] = HIDDEN;
    widths[LAYERS + 1] = TEST_CLASSES;
    malloc_trim(0); /* what an earlier engine freed goes back to the kernel */
    reset_peak();
    double before = status_bytes("VmRSS");
    tr_model_t *model;
    char why[256], err[512];
    assert_int_equal(tr_model_mlp_create(&model, widths, LAYERS + 2, why, sizeof(why)), 0);
    tr_engine_opts_t o = {.config = cfg,
                          .model = model,
                          .seq_len = 1,
                          .seed = 5,
                          .init_params = 1,
                          .train = {.batch = test_mlp_batch, .x_dim = TEST_XD}};
    tr_engine_t *eng;
    if (tr_engine_create(&eng, &o, err, sizeof(err))) fail_msg("engine: %s", err);
    for (int s = 0; s < STEPS; s++) {
        tr_step_stats_t st;
        if (tr_engine_train_batch(eng, &st) != 0) fail_msg("step %d: %s", s, tr_engine_error(eng));
        r->loss[s] = st.loss;
    }
    r->peak = status_bytes("VmHWM") - before;
    r->rank = tr_engine_rank(eng);
    r->world = (int)cfg->world_size;
    tr_engine_memory_t m;
    tr_engine_memory(eng, &m);
    r->predicted = (double)(m.params + m.grads + m.grad_partition + m.optimizer + m.comm +
                            m.batches + m.bf16_copies);
    r->params = (double)m.params;
    r->saved = (double)(tr_model_num_params(tr_engine_model(eng)) * sizeof(float)) -
               (double)(m.grads + m.grad_partition);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

static void test_each_stage_holds_less_within_its_prediction(void **state)
{
    (void)state;
    if (SANITIZED) skip();
    run_t z3, z2, z1;
    train(2, &z2); /* a first run pays for what is made once per process: MPI's set-up */
    train(3, &z3);
    train(2, &z2);
    train(1, &z1);
    double mib = 1048576.0;
    printf("rank %d of %d: stage 1 peak %.1f MiB (predicted %.1f), stage 2 peak %.1f MiB "
           "(predicted %.1f; the window saves %.1f), stage 3 peak %.1f MiB (predicted %.1f; "
           "parameters %.1f of %.1f), slack %.0f MiB\n",
           z1.rank, z1.world, z1.peak / mib, z1.predicted / mib, z2.peak / mib, z2.predicted / mib,
           z2.saved / mib, z3.peak / mib, z3.predicted / mib, z3.params / mib, z2.params / mib,
           SLACK / mib);
    for (int s = 0; s < STEPS; s++) { /* the same training, whatever the stage */
        assert_true(fabsf(z1.loss[s] - z2.loss[s]) <= 1e-5f * z1.loss[s]);
        assert_true(fabsf(z3.loss[s] - z2.loss[s]) <= 1e-5f * z2.loss[s]);
    }
    assert_true(z2.predicted < z1.predicted);
    assert_true(z1.peak <= z1.predicted + SLACK);
    assert_true(z2.peak <= z2.predicted + SLACK);
    assert_true(z3.peak <= z3.predicted + SLACK);
    /* strictly below, by at least half of what the backward's window saves (MPI's copies of
     * the collectives in flight are part of the prediction but not on every rank) */
    assert_true(z2.saved > 0);
    assert_true(z2.peak < z1.peak - 0.5 * z2.saved);
    /* stage 3 holds the slice and the fetcher's window of the parameters: below stage 2 by at
     * least half of what its prediction saves there */
    assert_true(z3.params < z2.params);
    assert_true(z3.peak < z2.peak - 0.5 * (z2.params - z3.params));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_stage_holds_less_within_its_prediction),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
