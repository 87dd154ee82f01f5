/* Data parallelism over MPI (run by mpirun on 2, 3 and 4 ranks: 3 cuts the partitions unevenly):
 * each rank trains its share of the same global batch, and the run matches a one-process run with
 * the same global batch (the accumulation steps times the ranks) step by step, at ZeRO stages 0 to
 * 3, with overlap_comm on and off: the same losses within float summation order (1e-5 relative per
 * step: the ranks' sums are added in another order than one process's), the same evaluation
 * loss, parameters bit-identical on every rank after every step (below stage 3, where each
 * rank keeps its slice), and each rank's memory what
 * its stage says; with the optimizer state offloaded to NVMe, ZeRO 1, 2 and 3 are bitwise their
 * runs in memory. */
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

#define XD      TEST_XD
#define CLASSES TEST_CLASSES
#define STEPS   6

typedef struct dp_case {
    int stage;             /* zero_optimization.stage */
    int overlap;           /* zero_optimization.overlap_comm */
    int gas;               /* accumulation steps per rank */
    const char *optimizer; /* NULL: AdamW */
    const char *wire;      /* communication_data_type (NULL: fp32) */
    int bucket;            /* reduce_bucket_size (0: 60) */
    const char *zero3;     /* more zero_optimization keys (stage 3's), or NULL */
    bool deep;             /* the MLP 8 -> 16 -> 24 -> 12 -> 16 -> 3 (else 8 -> 16 -> 3) */
    int ckpt;              /* pipeline.activation_checkpoint_interval (0: none) */
    bool bf16;             /* bf16.enabled (bf16 mixed precision) */
    float tol;             /* relative loss tolerance per step (0: 1e-5) */
} dp_case_t;

/* An engine over `world` ranks (0: mpirun's) for case k, with `gas` accumulation steps of 4
 * samples. */
static tr_engine_t *engine(int world, const dp_case_t *k, int gas, tr_config_t **cfg)
{
    char json[1024];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": %d,"
             " \"optimizer\": {\"type\": \"%s\", \"params\": {\"lr\": 0.01,"
             " \"weight_decay\": 0.01}},"
             " \"gradient_clipping\": 1.0,"
             " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %d,"
             " \"overlap_comm\": %s%s%s}, \"communication_data_type\": \"%s\","
             " \"pipeline\": {\"activation_checkpoint_interval\": %d},"
             " \"bf16\": {\"enabled\": %s},"
             " \"troupe\": {\"runtime\": {\"workers\": 1}}}",
             gas, k->optimizer ? k->optimizer : "AdamW", world == 1 ? 0 : k->stage,
             k->bucket ? k->bucket : 60, k->overlap ? "true" : "false", k->zero3 ? ", " : "",
             k->zero3 ? k->zero3 : "", k->wire && world != 1 ? k->wire : "fp32", k->ckpt,
             k->bf16 ? "true" : "false");
    static const int deep[] = {XD, 16, 24, 12, 16, CLASSES}, shallow[] = {XD, 16, CLASSES};
    return test_mlp_engine_widths(json, "dp.json", world, cfg, k->deep ? deep : shallow,
                                  k->deep ? 6 : 3);
}

static uint64_t params_hash(tr_engine_t *eng)
{
    const tr_model_t *m = tr_engine_model(eng);
    const unsigned char *p = (const unsigned char *)tr_model_params(m);
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < tr_model_num_params(m) * sizeof(float); i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* This rank's memory as its stage says: parameters whole; the backward's gradients whole, or
 * at stage 2 the window of 2 buckets (overlap_comm, else 1) and the largest layer (the MLP's
 * first, TEST_XD x 16 + 16); the optimizer's two moments (AdamW) and (stage 2) the reduced
 * gradients of its partition only: the flat buffer padded to a multiple of 2 W and cut in W
 * equal slices; MPI's copies of the gradients in flight. */
static void check_memory(tr_engine_t *dp, const dp_case_t *k, int world, int rank)
{
    tr_engine_memory_t mem;
    tr_engine_memory(dp, &mem);
    size_t n = tr_model_num_params(tr_engine_model(dp)), q = 2 * (size_t)world;
    size_t S = (n + q - 1) / q * q / (size_t)world, lo = (size_t)rank * S;
    size_t mine = k->stage ? (lo >= n ? 0 : lo + S <= n ? S : n - lo) : n;
    assert_int_equal(mem.params, n * 4);
    size_t window = (size_t)(k->overlap ? 2 : 1) * (size_t)(k->bucket ? k->bucket : 60) +
                    (size_t)(XD * 16 + 16);
    size_t held = k->stage == 2 && window < n ? window : n; /* gradients, in flight at most */
    bool wire16 = k->wire && strcmp(k->wire, "fp32");
    assert_int_equal(mem.grads, held * 4);
    assert_int_equal(mem.optimizer, 2 * mine * 4);
    assert_int_equal(mem.grad_partition, k->stage == 2 ? mine * 4 : 0);
    /* the 16-bit wire's copy of the gradient, and MPI's working copies of what is in flight */
    assert_int_equal(mem.comm, (wire16 ? n * 2 : 0) + held * (wire16 ? 2 : 4));
}

static void check_case(const dp_case_t *k)
{
    int world = 0, rank = 0;
    tr_config_t *cfg, *ref_cfg;
    tr_engine_t *dp = engine(0, k, k->gas, &cfg);
    float dp_loss[STEPS], ref_loss[STEPS], dp_val, ref_val;
    double dp_norm0 = 0, ref_norm0 = 0; /* the first step's gradient norms */
    uint64_t hash[STEPS];
    tr_step_stats_t st;
    for (int i = 0; i < STEPS; i++) {
        if (tr_engine_train_batch(dp, &st) != 0) fail_msg("step %d: %s", i, tr_engine_error(dp));
        dp_loss[i] = st.loss;
        if (i == 0) dp_norm0 = st.grad_norm;
        hash[i] = params_hash(dp);
    }
    world = (int)cfg->world_size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (k->stage < 3 && !k->deep) check_memory(dp, k, world, rank);
    /* the first 2W batches of the val stream at any world size: the ranks split them */
    assert_int_equal(tr_engine_eval(dp, 2 * (int)cfg->world_size, &dp_val), 0);
    tr_engine_destroy(dp); /* MPI is the test's again from here: no actor calls it */
    tr_config_destroy(cfg);

    tr_engine_t *ref = engine(1, k, k->gas * world, &ref_cfg); /* the same global batch */
    for (int i = 0; i < STEPS; i++) {
        assert_int_equal(tr_engine_train_batch(ref, &st), 0);
        ref_loss[i] = st.loss;
        if (i == 0) ref_norm0 = st.grad_norm;
    }
    assert_int_equal(tr_engine_eval(ref, 2 * world, &ref_val), 0);
    tr_engine_destroy(ref);
    tr_config_destroy(ref_cfg);

    float tol = k->tol > 0 ? k->tol : 1e-5f;
    for (int i = 0; i < STEPS; i++) {
        if (rank == 0)
            printf("%s, stage %d, overlap %d, GAS %d, wire %s: step %d: %d ranks %.7f, one "
                   "process %.7f\n",
                   k->optimizer ? k->optimizer : "AdamW", k->stage, k->overlap, k->gas,
                   k->wire ? k->wire : "fp32", i, world, dp_loss[i], ref_loss[i]);
        assert_true(fabsf(dp_loss[i] - ref_loss[i]) <= tol * fmaxf(1.0f, fabsf(ref_loss[i])));
    }
    assert_true(fabsf(dp_val - ref_val) <= tol * fmaxf(1.0f, fabsf(ref_val)));
    assert_true(fabs(dp_norm0 - ref_norm0) <= tol * ref_norm0);
    if (k->wire && strcmp(k->wire, "fp32")) /* the gradients did go through 16 bits */
        assert_true(fabs(dp_norm0 - ref_norm0) > 1e-6 * ref_norm0);
    uint64_t lo[STEPS], hi[STEPS];
    MPI_Allreduce(hash, lo, STEPS, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(hash, hi, STEPS, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    for (int i = 0; i < STEPS && k->stage < 3; i++) /* stage 3: each rank holds its slice */
        assert_true(lo[i] == hi[i]); /* every rank holds the same parameters, bit for bit */
    assert_true(world > 1);
}

static void test_engine_dp_matches_one_process_with_the_same_global_batch(void **state)
{
    (void)state;
    check_case(&(dp_case_t){.stage = 0, .overlap = 1, .gas = 1});
    check_case(&(dp_case_t){.stage = 0, .overlap = 0, .gas = 2});
}

/* ZeRO 1: each rank updates its slice of the parameters and keeps optimizer state for it only;
 * the slices are all-gathered after each step. */
static void test_engine_dp_zero1_matches_one_process(void **state)
{
    (void)state;
    check_case(&(dp_case_t){.stage = 1, .overlap = 0, .gas = 1});
    check_case(&(dp_case_t){.stage = 1, .overlap = 1, .gas = 2});
}

/* ZeRO 2: every micro-step's buckets are reduce-scattered, each rank accumulating the part it
 * owns; the gradient norm and overflow are reduced over the ranks before the step. */
static void test_engine_dp_zero2_matches_one_process(void **state)
{
    (void)state;
    check_case(&(dp_case_t){.stage = 2, .overlap = 1, .gas = 1});
    check_case(&(dp_case_t){.stage = 2, .overlap = 0, .gas = 1});
    check_case(&(dp_case_t){.stage = 2, .overlap = 1, .gas = 3});
    check_case(&(dp_case_t){.stage = 2, .overlap = 0, .gas = 2});
}

/* ZeRO 2 with buckets of 16 elements (the smallest; the MLP has 195): the backward's window
 * (32 + 144 elements with overlap_comm, else 16 + 144) is smaller than the gradient, so the
 * first layer's backward waits for the last layer's buckets to be reduced and freed, and the
 * losses are still one process's. */
static void test_engine_dp_zero2_gradient_window(void **state)
{
    (void)state;
    check_case(&(dp_case_t){.stage = 2, .overlap = 1, .gas = 1, .bucket = 16});
    check_case(&(dp_case_t){.stage = 2, .overlap = 0, .gas = 3, .bucket = 16});
    check_case(&(dp_case_t){.stage = 2, .overlap = 1, .gas = 2, .bucket = 20});
}

/* ZeRO 3: each rank keeps its slice of the parameters (and whole, the layers under the
 * persistence threshold); the fetcher all-gathers each layer before the executor runs it and
 * releases it after, within its prefetch and live windows; gradients and the optimizer as at
 * stage 2. The losses, the first gradient norm and the evaluation (whose last rounds some
 * ranks run without a batch of their own) are one process's. */
static void test_engine_dp_zero3_matches_one_process(void **state)
{
    (void)state;
    const char *none = "\"stage3_param_persistence_threshold\": 0";
    /* one layer at a time, nothing kept for reuse: every layer gathered twice a micro-step */
    const char *tight = "\"stage3_param_persistence_threshold\": 0,"
                        " \"stage3_prefetch_bucket_size\": 1, \"stage3_max_live_parameters\": 1,"
                        " \"stage3_max_reuse_distance\": 0";
    /* the small layers (<= 200 elements) whole, the rest fetched two layers ahead */
    const char *mixed =
        "\"stage3_param_persistence_threshold\": 200,"
        " \"stage3_prefetch_bucket_size\": 700, \"stage3_max_live_parameters\": 900,"
        " \"stage3_max_reuse_distance\": 500";
    check_case(&(dp_case_t){.stage = 3, .overlap = 1, .gas = 1, .zero3 = none});
    check_case(&(dp_case_t){.stage = 3, .overlap = 1, .gas = 1, .zero3 = tight, .deep = true});
    check_case(&(dp_case_t){.stage = 3, .overlap = 0, .gas = 3, .zero3 = mixed, .deep = true});
    check_case(&(dp_case_t){
        .stage = 3, .overlap = 1, .gas = 2, .zero3 = none, .deep = true, .bucket = 16});
    check_case(&(dp_case_t){.stage = 3, .overlap = 1, .gas = 1, .zero3 = NULL, .deep = true});
    check_case(&(dp_case_t){
        .stage = 3, .overlap = 1, .gas = 3, .zero3 = tight, .deep = true, .optimizer = "Lamb"});
    /* activation checkpointing: the backward of a group's last layer runs the group's forward
     * again, so it waits for every layer of the group (groups of 2 and of 4 layers) */
    check_case(
        &(dp_case_t){.stage = 3, .overlap = 1, .gas = 2, .zero3 = tight, .deep = true, .ckpt = 2});
    check_case(
        &(dp_case_t){.stage = 3, .overlap = 0, .gas = 1, .zero3 = mixed, .deep = true, .ckpt = 4});
}

/* bf16 mixed precision at ZeRO 3: the fetcher makes each layer's bf16 copies as it gathers it
 * (the products read them), so the training is ZeRO 2's in bf16 on the same ranks, bit for
 * bit. */
static void test_engine_dp_zero3_bf16_is_zero2s(void **state)
{
    (void)state;
    const char *tight = "\"stage3_param_persistence_threshold\": 0,"
                        " \"stage3_max_live_parameters\": 1, \"stage3_max_reuse_distance\": 0";
    float loss[2][STEPS];
    for (int stage = 2; stage <= 3; stage++) {
        dp_case_t k = {.stage = stage, .overlap = 1, .gas = 2, .deep = true, .bf16 = true};
        k.zero3 = stage == 3 ? tight : NULL;
        tr_config_t *cfg;
        tr_engine_t *eng = engine(0, &k, k.gas, &cfg);
        for (int i = 0; i < STEPS; i++) {
            tr_step_stats_t st;
            if (tr_engine_train_batch(eng, &st) != 0)
                fail_msg("stage %d, step %d: %s", stage, i, tr_engine_error(eng));
            loss[stage - 2][i] = st.loss;
        }
        tr_engine_destroy(eng);
        tr_config_destroy(cfg);
    }
    printf("bf16: ZeRO 2 %.9g -> %.9g, ZeRO 3 %.9g -> %.9g\n", loss[0][0], loss[0][STEPS - 1],
           loss[1][0], loss[1][STEPS - 1]);
    assert_memory_equal(loss[0], loss[1], sizeof(loss[0]));
}

/* Optimizer state offloaded to NVMe (a swap file per rank under a shared folder, sub-groups
 * of 20 elements cut inside the tensors and the partitions): at ZeRO 1 and 2 the run is
 * bitwise the same stage's run in memory on the same ranks. */
static void train_offload(int stage, const char *nvme, float *loss, uint64_t *hash)
{
    char json[1024], off[400] = "";
    if (nvme)
        snprintf(off, sizeof(off),
                 ", \"sub_group_size\": 20, \"offload_optimizer\": "
                 "{\"device\": \"nvme\", \"nvme_path\": \"%s\", \"buffer_count\": 3, "
                 "\"pipeline_read\": true, \"pipeline_write\": true}",
                 nvme);
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01,"
             " \"weight_decay\": 0.01}}, \"gradient_clipping\": 1.0,"
             " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 60%s},"
             " \"troupe\": {\"runtime\": {\"workers\": 1}}}",
             stage, off);
    tr_config_t *cfg;
    tr_engine_t *eng = test_mlp_engine(json, "dp_offload.json", 0, &cfg);
    for (int i = 0; i < STEPS; i++) {
        tr_step_stats_t st;
        if (tr_engine_train_batch(eng, &st) != 0) fail_msg("step %d: %s", i, tr_engine_error(eng));
        loss[i] = st.loss;
        hash[i] = params_hash(eng);
    }
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

static void test_engine_dp_nvme_offload_is_bitwise_in_memory(void **state)
{
    (void)state;
    char dir[64] = "/tmp/tr_dp_offload.XXXXXX";
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) assert_non_null(mkdtemp(dir));
    MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
    for (int stage = 1; stage <= 3; stage++) {
        float mem_loss[STEPS], nvme_loss[STEPS];
        uint64_t mem_hash[STEPS], nvme_hash[STEPS];
        train_offload(stage, NULL, mem_loss, mem_hash);
        train_offload(stage, dir, nvme_loss, nvme_hash);
        if (rank == 0)
            printf("nvme offload, stage %d: loss %.9g -> %.9g (in memory %.9g -> %.9g)\n", stage,
                   nvme_loss[0], nvme_loss[STEPS - 1], mem_loss[0], mem_loss[STEPS - 1]);
        assert_memory_equal(nvme_loss, mem_loss, sizeof(mem_loss));
        assert_memory_equal(nvme_hash, mem_hash, sizeof(mem_hash));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
    }
}

/* ZeRO 3 with the parameters offloaded (offload_param): each rank's slice in its own host
 * buffer (cpu) or in a swap file with the optimizer's state (nvme, sub-groups of 20 elements
 * cut inside the layers, a cache of 2 of them): the run is bitwise the in-memory run on the same
 * ranks, losses and the gathered parameters after every step, with a tight window (every
 * layer read from the file in each pass), persistent layers beside gathered ones, GAS 2 and
 * clipping; with nvme, a save after 3 steps loaded into a new engine (the slice written back
 * to the file) goes on bitwise too. */
#define OFFLOAD_ZERO3                                                                              \
    "\"stage3_param_persistence_threshold\": 200, \"stage3_prefetch_bucket_size\": 1,"             \
    " \"stage3_max_live_parameters\": 1, \"stage3_max_reuse_distance\": 0"

static tr_engine_t *param_offload_engine(const char *param, const char *nvme, int gas,
                                         tr_config_t **cfg)
{
    char json[1400], off[600] = "";
    if (param && !strcmp(param, "cpu"))
        snprintf(off, sizeof(off), ", \"offload_param\": {\"device\": \"cpu\"}");
    if (param && !strcmp(param, "nvme"))
        snprintf(off, sizeof(off),
                 ", \"sub_group_size\": 20, \"offload_optimizer\": {\"device\": \"nvme\","
                 " \"nvme_path\": \"%s\", \"buffer_count\": 3, \"pipeline_read\": true,"
                 " \"pipeline_write\": true}, \"offload_param\": {\"device\": \"nvme\","
                 " \"nvme_path\": \"%s\", \"buffer_count\": 2, \"buffer_size\": 20}",
                 nvme, nvme);
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": %d,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01,"
             " \"weight_decay\": 0.01}}, \"gradient_clipping\": 1.0,"
             " \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": 60, %s%s},"
             " \"troupe\": {\"runtime\": {\"workers\": 1}}}",
             gas, OFFLOAD_ZERO3, off);
    static const int deep[] = {XD, 16, 24, 12, 16, CLASSES};
    return test_mlp_engine_widths(json, "dp_param_offload.json", 0, cfg, deep, 6);
}

/* Steps [from, to) of eng: losses and the gathered parameters' hash after each. */
static void param_offload_steps(tr_engine_t *eng, int from, int to, float *loss, uint64_t *hash)
{
    for (int i = from; i < to; i++) {
        tr_step_stats_t st;
        if (tr_engine_train_batch(eng, &st) != 0) fail_msg("step %d: %s", i, tr_engine_error(eng));
        loss[i] = st.loss;
        if (tr_engine_gather_params(eng) != 0) fail_msg("gather: %s", tr_engine_error(eng));
        hash[i] = params_hash(eng);
    }
}

static void test_engine_dp_param_offload_is_bitwise_in_memory(void **state)
{
    (void)state;
    char dir[64] = "/tmp/tr_dp_poff.XXXXXX", ckpt[96];
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) assert_non_null(mkdtemp(dir));
    MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(ckpt, sizeof(ckpt), "%s/ckpt", dir);
    /* GAS 2: the reduced partition accumulates in memory; GAS 1: it goes to the swap files too
     * (plan.swap_grads) */
    for (int gas = 2; gas >= 1; gas--) {
        float loss[3][STEPS];
        uint64_t hash[3][STEPS];
        const char *how[3] = {NULL, "cpu", "nvme"};
        for (int k = 0; k < 3; k++) {
            tr_config_t *cfg;
            tr_engine_t *eng = param_offload_engine(how[k], dir, gas, &cfg);
            tr_engine_memory_t mem;
            tr_engine_memory(eng, &mem);
            if (k == 2) /* the partition: in memory with GAS 2, on disk with GAS 1 */
                assert_true(gas == 1 ? mem.grad_partition == 0 : mem.grad_partition > 0);
            param_offload_steps(eng, 0, k == 2 ? 3 : STEPS, loss[k], hash[k]);
            if (k == 2) { /* a save, and a new engine that loads it */
                if (tr_engine_save_checkpoint(eng, ckpt, "three") || tr_engine_wait_checkpoint(eng))
                    fail_msg("save: %s", tr_engine_error(eng));
                tr_engine_destroy(eng);
                tr_config_destroy(cfg);
                eng = param_offload_engine(how[k], dir, gas, &cfg);
                if (tr_engine_load_checkpoint(eng, ckpt, "three"))
                    fail_msg("load: %s", tr_engine_error(eng));
                param_offload_steps(eng, 3, STEPS, loss[k], hash[k]);
            }
            tr_engine_destroy(eng);
            tr_config_destroy(cfg);
            if (rank == 0)
                printf("GAS %d, offload_param %s: loss %.9g -> %.9g, parameters %.1f KiB, "
                       "reduced partition %.1f KiB in memory\n",
                       gas, how[k] ? how[k] : "none", loss[k][0], loss[k][STEPS - 1],
                       mem.params / 1024.0, mem.grad_partition / 1024.0);
        }
        for (int i = 0; i < STEPS && rank == 0; i++)
            printf("GAS %d, step %d: in memory %.9g, cpu %.9g, nvme %.9g%s\n", gas, i, loss[0][i],
                   loss[1][i], loss[2][i], hash[2][i] != hash[0][i] ? " (parameters differ)" : "");
        assert_memory_equal(loss[1], loss[0], sizeof(loss[0]));
        assert_memory_equal(hash[1], hash[0], sizeof(hash[0]));
        assert_memory_equal(loss[2], loss[0], sizeof(loss[0]));
        assert_memory_equal(hash[2], hash[0], sizeof(hash[0]));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
    }
}

/* Lamb's trust ratio is per tensor, and partitions cut tensors: each rank's piece gives its
 * sums of p² and u², added over the ranks before the update, so the ratio is the whole
 * tensor's and the run is the one process's. */
static void test_engine_dp_lamb_across_partitions(void **state)
{
    (void)state;
    check_case(&(dp_case_t){.stage = 1, .overlap = 1, .gas = 1, .optimizer = "Lamb"});
    check_case(&(dp_case_t){.stage = 2, .overlap = 0, .gas = 2, .optimizer = "Lamb"});
}

/* communication_data_type fp16 and bf16: the buckets travel as 16-bit values (MPI has no such
 * types: user-defined ones, summed in fp32 and rounded back), the steps follow one process's
 * within the rounding of the wire (bf16 keeps 8 bits of mantissa: 1e-2 relative, against 1e-5
 * in fp32; wrong conversions would be off by far more), and the comm buffer is 2 bytes a
 * parameter. */
static void test_engine_dp_16_bit_wire(void **state)
{
    (void)state;
    check_case(&(dp_case_t){.stage = 0, .overlap = 1, .gas = 1, .wire = "fp16", .tol = 1e-2f});
    check_case(&(dp_case_t){.stage = 2, .overlap = 1, .gas = 2, .wire = "bf16", .tol = 1e-2f});
}

/* The DeepSpeed-style loop (forward, backward, step) at ZeRO 2 with accumulation: rank r feeds
 * the batches the loader would (r, W + r, 2W + r, ...), each backward waits for the previous
 * micro-step's reductions (and, with buckets of 16, for room in its window: the call returns
 * once the pass is through), and the steps are those of tr_engine_train_batch. */
static void deepspeed_style_loop(int stage, int bucket)
{
    dp_case_t k = {.stage = stage,
                   .overlap = 1,
                   .gas = 2,
                   .bucket = bucket,
                   .zero3 = stage == 3 ? "\"stage3_param_persistence_threshold\": 0" : NULL,
                   .deep = stage == 3};
    tr_config_t *cfg;
    tr_engine_t *eng = engine(0, &k, k.gas, &cfg);
    float ref[STEPS], got[STEPS];
    tr_step_stats_t st;
    for (int i = 0; i < STEPS; i++) {
        assert_int_equal(tr_engine_train_batch(eng, &st), 0);
        ref[i] = st.loss;
    }
    int world = tr_engine_world(eng), rank = tr_engine_rank(eng);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    eng = engine(0, &k, k.gas, &cfg);
    float x[4 * XD], loss;
    int targets[4];
    for (int i = 0; i < STEPS; i++)
        for (int m = 0; m < k.gas; m++) {
            uint64_t index =
                ((uint64_t)i * (uint64_t)k.gas + (uint64_t)m) * (uint64_t)world + (uint64_t)rank;
            test_mlp_batch(NULL, index, 4, 1, NULL, x, targets, NULL);
            tr_engine_batch_t b = {.x = x, .targets = targets};
            assert_int_equal(tr_engine_forward(eng, &b, &loss), 0);
            assert_int_equal(tr_engine_backward(eng), 0);
            int rc = tr_engine_step(eng, &st);
            if (rc < 0) fail_msg("step %d.%d: %s", i, m, tr_engine_error(eng));
            if (m == k.gas - 1) got[i] = st.loss;
        }
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    for (int i = 0; i < STEPS; i++)
        assert_true(fabsf(got[i] - ref[i]) <= 1e-6f * fmaxf(1.0f, fabsf(ref[i])));
}

static void test_engine_dp_zero2_deepspeed_style_loop(void **state)
{
    (void)state;
    deepspeed_style_loop(2, 60);
    deepspeed_style_loop(2, 16);
    deepspeed_style_loop(3, 16); /* each forward and backward also waits for its layers */
}

/* An idle engine of several ranks (between steps: nothing pending, only the watchdog's control
 * channel polled at 5 Hz) costs almost no CPU: measured over 3 s with getrusage, printed, and
 * bounded at 5% of a core per process (busy polling would be ~100%; the target is < 1%). */
static void test_engine_dp_idle_costs_almost_no_cpu(void **state)
{
    (void)state;
    tr_config_t *cfg;
    tr_engine_t *dp = engine(0, &(dp_case_t){.stage = 1, .overlap = 1, .gas = 1}, 1, &cfg);
    tr_step_stats_t st;
    assert_int_equal(tr_engine_train_batch(dp, &st), 0); /* every actor has run */
    struct rusage a, b;
    uint64_t t0 = tr_now_ns();
    getrusage(RUSAGE_SELF, &a);
    nanosleep(&(struct timespec){3, 0}, NULL);
    getrusage(RUSAGE_SELF, &b);
    double wall = (double)(tr_now_ns() - t0) / 1e9;
    double cpu =
        (double)(b.ru_utime.tv_sec - a.ru_utime.tv_sec + b.ru_stime.tv_sec - a.ru_stime.tv_sec) +
        (double)(b.ru_utime.tv_usec - a.ru_utime.tv_usec + b.ru_stime.tv_usec -
                 a.ru_stime.tv_usec) /
            1e6;
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    printf("idle: rank %d: %.3f%% of a core over %.1f s\n", r, 100.0 * cpu / wall, wall);
    assert_true(cpu / wall < 0.05);
    tr_engine_destroy(dp);
    tr_config_destroy(cfg);
}

/* A layer that scales its input by a gain per channel and, on one rank at one backward, adds
 * +Inf to its first gain's gradient: an overflow in one tensor that, once reduce-scattered,
 * lies in one rank's partition only. */
typedef struct spike {
    int rank, at, calls;
} spike_t;

static size_t spike_acts(const tr_layer_t *l, int B, int T)
{
    return (size_t)B * (size_t)T * (size_t)l->out_dim;
}

static int spike_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    size_t n = (size_t)c->B * (size_t)c->T * (size_t)l->in_dim;
    for (size_t i = 0; i < n; i++)
        c->out[i] = c->in[i] * c->params[i % (size_t)l->in_dim];
    return 0;
}

static int spike_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    spike_t *s = l->state;
    size_t n = (size_t)c->B * (size_t)c->T * (size_t)l->in_dim;
    for (size_t i = 0; i < n; i++) {
        c->grads[i % (size_t)l->in_dim] += c->dout[i] * c->in[i];
        if (c->din) c->din[i] += c->dout[i] * c->params[i % (size_t)l->in_dim];
    }
    if (s->calls++ == s->at && s->rank == 0) c->grads[0] += INFINITY;
    return 0;
}

static void spike_init(tr_layer_t *l, float *params, uint64_t *rng)
{
    (void)rng;
    for (int i = 0; i < l->in_dim; i++)
        params[i] = 1.0f;
}

static void spike_destroy(tr_layer_t *l)
{
    free(l->state);
}

static const tr_layer_ops_t spike_ops = {.kind = "spike",
                                         .act_size = spike_acts,
                                         .forward = spike_forward,
                                         .backward = spike_backward,
                                         .init = spike_init,
                                         .destroy = spike_destroy};

/* fc0 (XD -> 16), spike (16 gains at [144, 160) of 211 parameters: rank 1's partition of 2,
 * rank 2's of 4), fc1 (16 -> CLASSES), cross-entropy. */
static tr_model_t *spike_model(int rank, int at)
{
    tr_layer_t *layers[4] = {0};
    spike_t *s = calloc(1, sizeof(*s));
    layers[1] = calloc(1, sizeof(tr_layer_t));
    assert_non_null(s);
    assert_non_null(layers[1]);
    *s = (spike_t){.rank = rank, .at = at};
    assert_int_equal(tr_layer_init(layers[1], &spike_ops, "spike", 16, 16, s), 0);
    assert_int_equal(tr_layer_add_param(layers[1], "gain", 1, (int64_t[]){16}), 0);
    assert_int_equal(tr_layer_linear_create(&layers[0], "fc0", XD, 16, 1), 0);
    assert_int_equal(tr_layer_linear_create(&layers[2], "fc1", 16, CLASSES, 1), 0);
    assert_int_equal(tr_layer_crossentropy_create(&layers[3], "loss", CLASSES, -100), 0);
    tr_model_t *m;
    char why[256];
    if (tr_model_create(&m, layers, 4, why, sizeof(why))) fail_msg("spike model: %s", why);
    return m;
}

/* fp16's dynamic loss scaling at ZeRO 2: the overflow of one tensor lies in one rank's
 * partition, so only that rank sees it unless the flag is reduced (MAX) over the ranks; every
 * rank skips that step, lowers its loss scale, and the parameters stay bit-identical. */
static void test_engine_dp_zero2_overflow_in_one_partition_skips_everywhere(void **state)
{
    (void)state;
    const char *json = "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 1,"
                       " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
                       " \"fp16\": {\"enabled\": true, \"initial_scale_power\": 8,"
                       " \"hysteresis\": 1},"
                       " \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 60},"
                       " \"troupe\": {\"runtime\": {\"workers\": 1}}}";
    tr_config_t *cfg = NULL;
    tr_config_diag_t d;
    tr_config_diag_init(&d);
    assert_int_equal(tr_config_from_string(json, strlen(json), "spike.json", 0, &cfg, &d), 0);
    tr_config_diag_close(&d);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    tr_engine_opts_t o = {.config = cfg,
                          .model = spike_model(rank, 2),
                          .seq_len = 1,
                          .seed = 11,
                          .init_params = 1,
                          .train = {.batch = test_mlp_batch, .x_dim = XD}};
    tr_engine_t *eng;
    char err[512];
    if (tr_engine_create(&eng, &o, err, sizeof(err))) fail_msg("engine: %s", err);
    uint64_t hash[STEPS];
    int skipped[STEPS];
    double scale[STEPS];
    tr_step_stats_t st;
    for (int i = 0; i < STEPS; i++) {
        if (tr_engine_train_batch(eng, &st) != 0) fail_msg("step %d: %s", i, tr_engine_error(eng));
        hash[i] = params_hash(eng);
        skipped[i] = st.skipped;
        scale[i] = st.loss_scale;
    }
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    uint64_t lo[STEPS], hi[STEPS];
    MPI_Allreduce(hash, lo, STEPS, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(hash, hi, STEPS, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    for (int i = 0; i < STEPS; i++) {
        if (rank == 0)
            printf("overflow: step %d skipped %d, loss scale %g\n", i, skipped[i], scale[i]);
        assert_int_equal(skipped[i], i == 2);
        assert_true(lo[i] == hi[i]);
    }
    assert_true(scale[3] == scale[2] / 2);
}

/* The stress test's layer: out = in * gain (per channel, so it has a gradient of its own),
 * sleeping a random 0-400 us in each forward and backward (a stream of its own per rank), so
 * that the ranks reach their buckets at different moments and several collectives (buckets,
 * header exchanges, the norm's and Lamb's all-reduces, the parameter all-gather) are in flight
 * at once, in different orders of arrival on each rank. */
typedef struct jitter {
    uint64_t rng; /* 0: no sleeps */
} jitter_t;

static void jitter_sleep(jitter_t *j)
{
    if (!j->rng) return;
    j->rng ^= j->rng << 13;
    j->rng ^= j->rng >> 7;
    j->rng ^= j->rng << 17;
    nanosleep(&(struct timespec){0, (long)(j->rng % 400) * 1000}, NULL);
}

static int jitter_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    jitter_sleep(l->state);
    return spike_forward(l, c);
}

static int jitter_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    jitter_sleep(l->state);
    size_t n = (size_t)c->B * (size_t)c->T * (size_t)l->in_dim;
    for (size_t i = 0; i < n; i++) {
        c->grads[i % (size_t)l->in_dim] += c->dout[i] * c->in[i];
        if (c->din) c->din[i] += c->dout[i] * c->params[i % (size_t)l->in_dim];
    }
    return 0;
}

static void jitter_destroy(tr_layer_t *l)
{
    free(l->state);
}

static const tr_layer_ops_t jitter_ops = {.kind = "jitter",
                                          .act_size = spike_acts,
                                          .forward = jitter_forward,
                                          .backward = jitter_backward,
                                          .init = spike_init,
                                          .destroy = jitter_destroy};

/* fc0 (XD -> 16), jitter, fc1 (16 -> 16), jitter, fc2 (16 -> CLASSES), cross-entropy: 499
 * parameters. rng 0: no sleeps. */
static tr_model_t *jitter_model(uint64_t rng)
{
    tr_layer_t *layers[6] = {0};
    for (int k = 1; k <= 3; k += 2) {
        jitter_t *j = calloc(1, sizeof(*j));
        layers[k] = calloc(1, sizeof(tr_layer_t));
        assert_non_null(j);
        assert_non_null(layers[k]);
        j->rng = rng ? rng + (uint64_t)k : 0;
        assert_int_equal(
            tr_layer_init(layers[k], &jitter_ops, k == 1 ? "jitter0" : "jitter1", 16, 16, j), 0);
        assert_int_equal(tr_layer_add_param(layers[k], "gain", 1, (int64_t[]){16}), 0);
    }
    assert_int_equal(tr_layer_linear_create(&layers[0], "fc0", XD, 16, 1), 0);
    assert_int_equal(tr_layer_linear_create(&layers[2], "fc1", 16, 16, 1), 0);
    assert_int_equal(tr_layer_linear_create(&layers[4], "fc2", 16, CLASSES, 1), 0);
    assert_int_equal(tr_layer_crossentropy_create(&layers[5], "loss", CLASSES, -100), 0);
    tr_model_t *m;
    char why[256];
    if (tr_model_create(&m, layers, 6, why, sizeof(why))) fail_msg("jitter model: %s", why);
    return m;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* One stress run of `steps` steps on `world` ranks (0: mpirun's; 1: the one-process
 * reference, no sleeps, GAS times the ranks): the losses, and the parameters' hash per step. */
static void stress_run(const char *json, int world, uint64_t rng, int steps, float *loss,
                       uint64_t *hash)
{
    tr_config_t *cfg = test_config_world(json, "stress.json", world);
    tr_engine_opts_t o = {.config = cfg,
                          .model = jitter_model(rng),
                          .seq_len = 1,
                          .seed = 11,
                          .init_params = 1,
                          .world = world,
                          .train = {.batch = test_mlp_batch, .x_dim = XD}};
    tr_engine_t *eng;
    char err[512];
    if (tr_engine_create(&eng, &o, err, sizeof(err))) fail_msg("engine: %s", err);
    for (int i = 0; i < steps; i++) {
        tr_step_stats_t st;
        if (tr_engine_train_batch(eng, &st) != 0) fail_msg("step %d: %s", i, tr_engine_error(eng));
        loss[i] = st.loss;
        hash[i] = params_hash(eng);
    }
    tr_engine_destroy(eng); /* MPI is the test's again from here */
    tr_config_destroy(cfg);
}

/* Stress: random configurations (stage, overlap, bucket size from 16 to 200 floats, i.e. 3 to
 * 31 buckets a micro-step, GAS, AdamW or Lamb, workers) with random per-rank sleeps in the
 * compute, from a seed printed first (TROUPE_TEST_SEED repeats one). No collective is lost
 * (the run ends), none is reordered or mixed with another (the header check would fail the
 * engine, and the sums would differ): every step's loss is the one process's with the same
 * global batch, and every rank holds the same parameters, bit for bit, after every step. */
static void test_engine_dp_stress_random_configs_and_skew(void **state)
{
    (void)state;
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const char *env = getenv("TROUPE_TEST_SEED");
    unsigned long long seed = env ? strtoull(env, NULL, 10) : (unsigned long long)tr_now_ns();
    MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("stress: seed %llu (TROUPE_TEST_SEED=%llu repeats it)\n", seed, seed);
    fflush(stdout);
    uint64_t s = seed;
    for (int run = 0; run < 4; run++) {
        int stage = (int)(splitmix(&s) % 3), overlap = (int)(splitmix(&s) % 2);
        int bucket = 16 + (int)(splitmix(&s) % 185), gas = 1 + (int)(splitmix(&s) % 3);
        int lamb = (int)(splitmix(&s) % 2), workers = 1 + (int)(splitmix(&s) % 2);
        uint64_t rng = splitmix(&s) + (uint64_t)rank * 0x1000193u;
        char json[768];
        float dp_loss[STEPS], ref_loss[STEPS];
        uint64_t dp_hash[STEPS], ref_hash[STEPS], lo[STEPS], hi[STEPS];
        const char *fmt =
            "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": %d,"
            " \"optimizer\": {\"type\": \"%s\", \"params\": {\"lr\": 0.01,"
            " \"weight_decay\": 0.01}}, \"gradient_clipping\": 1.0,"
            " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %d,"
            " \"overlap_comm\": %s}, \"troupe\": {\"runtime\": {\"workers\": %d}}}";
        const char *opt = lamb ? "Lamb" : "AdamW", *ov = overlap ? "true" : "false";
        if (rank == 0)
            printf("stress %d: stage %d, overlap %d, bucket %d floats, GAS %d, %s, %d "
                   "worker(s)\n",
                   run, stage, overlap, bucket, gas, opt, workers);
        snprintf(json, sizeof(json), fmt, gas, opt, stage, bucket, ov, workers);
        stress_run(json, 0, rng | 1, STEPS, dp_loss, dp_hash);
        snprintf(json, sizeof(json), fmt, gas * world, opt, 0, bucket, ov, workers);
        stress_run(json, 1, 0, STEPS, ref_loss, ref_hash);
        MPI_Allreduce(dp_hash, lo, STEPS, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(dp_hash, hi, STEPS, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
        for (int i = 0; i < STEPS; i++) {
            if (rank == 0)
                printf("stress %d: step %d: %d ranks %.7f, one process %.7f\n", run, i, world,
                       dp_loss[i], ref_loss[i]);
            assert_true(fabsf(dp_loss[i] - ref_loss[i]) <= 1e-5f * fmaxf(1.0f, fabsf(ref_loss[i])));
            assert_true(lo[i] == hi[i]);
        }
        (void)ref_hash;
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_dp_matches_one_process_with_the_same_global_batch),
        cmocka_unit_test(test_engine_dp_zero1_matches_one_process),
        cmocka_unit_test(test_engine_dp_zero2_matches_one_process),
        cmocka_unit_test(test_engine_dp_zero2_gradient_window),
        cmocka_unit_test(test_engine_dp_zero3_matches_one_process),
        cmocka_unit_test(test_engine_dp_zero3_bf16_is_zero2s),
        cmocka_unit_test(test_engine_dp_lamb_across_partitions),
        cmocka_unit_test(test_engine_dp_nvme_offload_is_bitwise_in_memory),
        cmocka_unit_test(test_engine_dp_param_offload_is_bitwise_in_memory),
        cmocka_unit_test(test_engine_dp_zero2_deepspeed_style_loop),
        cmocka_unit_test(test_engine_dp_16_bit_wire),
        cmocka_unit_test(test_engine_dp_zero2_overflow_in_one_partition_skips_everywhere),
        cmocka_unit_test(test_engine_dp_stress_random_configs_and_skew),
        cmocka_unit_test(test_engine_dp_idle_costs_almost_no_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
