/* Data parallelism over MPI (run by mpirun on 2 and 4 ranks): each rank trains its share of the
 * same global batch, and the run matches a one-process run with the same global batch (the
 * accumulation steps times the ranks) step by step: the same losses within float summation
 * order, the same evaluation loss, and parameters identical on every rank after training. */
#include <math.h>
#include <mpi.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <cmocka.h>

#include "troupe.h"

#include "engine_testing.h"

#define XD TEST_XD
#define CLASSES TEST_CLASSES
#define STEPS 6


static int zero_stage; /* zero_optimization.stage of the next data-parallel engine */

/* An engine over `world` ranks (0: mpirun's) with `gas` accumulation steps of 4 samples. */
static tr_engine_t *engine(int world, int gas, tr_config_t **cfg)
{
    char json[512];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": %d,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
             " \"gradient_clipping\": 1.0,"
             " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 60},"
             " \"troupe\": {\"runtime\": {\"workers\": 1}}}",
             gas, world == 1 ? 0 : zero_stage);
    tr_config_diag_t d;
    tr_config_diag_init(&d);
    assert_int_equal(tr_config_from_string(json, strlen(json), "dp.json", world, cfg, &d), 0);
    tr_config_diag_close(&d);
    int widths[] = {XD, 16, CLASSES};
    tr_model_t *model;
    char why[256], err[512];
    assert_int_equal(tr_model_mlp_create(&model, widths, 3, why, sizeof(why)), 0);
    tr_engine_opts_t o = {.config = *cfg, .model = model, .seq_len = 1, .seed = 11,
                          .init_params = 1, .world = world,
                          .train = {.batch = test_mlp_batch, .x_dim = XD}};
    tr_engine_t *eng;
    int rc = tr_engine_create(&eng, &o, err, sizeof(err));
    if (rc) fail_msg("engine (world %d): %s", world, err);
    return eng;
}

static uint64_t params_hash(tr_engine_t *eng)
{
    tr_model_t *m = tr_engine_model(eng);
    const unsigned char *p = (const unsigned char *)tr_model_params(m);
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < tr_model_num_params(m) * sizeof(float); i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void test_engine_dp_matches_one_process_with_the_same_global_batch(void **state)
{
    (void)state;
    int world = 0, rank = 0;
    tr_config_t *cfg, *ref_cfg;
    tr_engine_t *dp = engine(0, 1, &cfg);
    float dp_loss[STEPS], ref_loss[STEPS], dp_val, ref_val;
    tr_step_stats_t st;
    for (int i = 0; i < STEPS; i++) {
        assert_int_equal(tr_engine_train_batch(dp, &st), 0);
        dp_loss[i] = st.loss;
    }
    world = (int)cfg->world_size;
    tr_engine_memory_t mem;
    tr_engine_memory(dp, &mem);
    size_t n = tr_model_num_params(tr_engine_model(dp)), S = (n + (size_t)world - 1) / world;
    assert_int_equal(mem.params, n * 4);
    assert_int_equal(mem.grads, n * 4);
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    size_t mine = zero_stage ? ((size_t)r + 1) * S <= n ? S : n - (size_t)r * S : n;
    assert_int_equal(mem.optimizer, 2 * mine * 4); /* AdamW: m and v, of this rank's slice */
    assert_int_equal(tr_engine_eval(dp, 2, &dp_val), 0);
    uint64_t hash = params_hash(dp);
    tr_engine_destroy(dp); /* MPI is the test's again from here: no actor calls it */
    tr_config_destroy(cfg);

    tr_engine_t *ref = engine(1, world, &ref_cfg); /* one process, the same global batch */
    for (int i = 0; i < STEPS; i++) {
        assert_int_equal(tr_engine_train_batch(ref, &st), 0);
        ref_loss[i] = st.loss;
    }
    assert_int_equal(tr_engine_eval(ref, 2 * world, &ref_val), 0);
    tr_engine_destroy(ref);
    tr_config_destroy(ref_cfg);

    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int i = 0; i < STEPS; i++) {
        if (rank == 0) printf("step %d: %d ranks %.7f, one process %.7f\n", i, world, dp_loss[i],
                              ref_loss[i]);
        assert_true(fabsf(dp_loss[i] - ref_loss[i]) <= 1e-5f * fmaxf(1.0f, fabsf(ref_loss[i])));
    }
    assert_true(fabsf(dp_val - ref_val) <= 1e-5f * fmaxf(1.0f, fabsf(ref_val)));
    uint64_t lo = 0, hi = 0;
    MPI_Allreduce(&hash, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&hash, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    assert_true(lo == hi); /* every rank holds the same parameters, bit for bit */
    assert_true(world > 1);
}

/* ZeRO 1: each rank updates its slice of the parameters and keeps optimizer state for it only;
 * the slices are all-gathered after each step. The same run as above, the same results. */
static void test_engine_dp_zero1_matches_one_process(void **state)
{
    zero_stage = 1;
    test_engine_dp_matches_one_process_with_the_same_global_batch(state);
    zero_stage = 0;
}

static void test_engine_dp_refuses_checkpoints_for_now(void **state)
{
    (void)state;
    tr_config_t *cfg;
    tr_engine_t *dp = engine(0, 1, &cfg);
    assert_int_equal(tr_engine_train_batch(dp, NULL), 0);
    assert_int_equal(tr_engine_save_checkpoint(dp, "/tmp/troupe_dp_ckpt", NULL), TR_ENOTSUP);
    assert_non_null(strstr(tr_engine_error(dp), "checkpoints of"));
    tr_engine_destroy(dp);
    tr_config_destroy(cfg);
}

/* An idle engine of several ranks (between steps: nothing pending, only the watchdog's control
 * channel polled at 5 Hz) costs almost no CPU: measured over 3 s with getrusage, printed, and
 * bounded at 5% of a core per process (busy polling would be ~100%; the target is < 1%). */
static void test_engine_dp_idle_costs_almost_no_cpu(void **state)
{
    (void)state;
    tr_config_t *cfg;
    tr_engine_t *dp = engine(0, 1, &cfg);
    tr_step_stats_t st;
    assert_int_equal(tr_engine_train_batch(dp, &st), 0); /* every actor has run */
    struct rusage a, b;
    uint64_t t0 = tr_now_ns();
    getrusage(RUSAGE_SELF, &a);
    nanosleep(&(struct timespec){3, 0}, NULL);
    getrusage(RUSAGE_SELF, &b);
    double wall = (double)(tr_now_ns() - t0) / 1e9;
    double cpu = (double)(b.ru_utime.tv_sec - a.ru_utime.tv_sec + b.ru_stime.tv_sec -
                          a.ru_stime.tv_sec) +
                 (double)(b.ru_utime.tv_usec - a.ru_utime.tv_usec + b.ru_stime.tv_usec -
                          a.ru_stime.tv_usec) / 1e6;
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    printf("idle: rank %d: %.3f%% of a core over %.1f s\n", r, 100.0 * cpu / wall, wall);
    assert_true(cpu / wall < 0.05);
    tr_engine_destroy(dp);
    tr_config_destroy(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_dp_matches_one_process_with_the_same_global_batch),
        cmocka_unit_test(test_engine_dp_zero1_matches_one_process),
        cmocka_unit_test(test_engine_dp_refuses_checkpoints_for_now),
        cmocka_unit_test(test_engine_dp_idle_costs_almost_no_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
