/* Pipeline ranks that hold only their stage (run by mpirun on 2 and 4 ranks: 2 stages of a
 * GPT-2, 1 or 2 data-parallel replicas each). Against a one-process run of the same model on
 * the same global batch without a pipeline:
 *   - the losses, gradient norms (clipping on) and evaluation loss agree within 1e-5 relative
 *     (float summation order), at ZeRO 0 and 1;
 *   - a stage's parameters start as the whole init gives them, bit for bit, and one SGD step
 *     (lr 1) moves its layers and the tied wte by the one-process run's gradients (relative L2
 *     within 1e-5), on the stage that owns wte and on the last stage, which uses it;
 *   - the engine's memory figures are the stage's (its layers, the tied tensor its head uses,
 *     its optimizer slice), and the process's peak RSS (VmHWM from /proc/self/status, reset
 *     through /proc/self/clear_refs) grows by no more than those figures plus a stated slack,
 *     less than the one-process run's growth for the whole model (not under a sanitizer, whose
 *     shadow memory and quarantines make the resident set meaningless);
 *   - a save writes each stage's parameters from its own ranks, and after a load and a step a
 *     rank's resident set exceeds its level before the engine by at most its figures plus the
 *     same slack, and by at most 6 MiB more than a step from scratch (with freed memory handed
 *     back first: malloc_trim). */
#include <math.h>
#include <mpi.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>
#include <malloc.h>

#include "troupe.h"
#include "troupe/pipeline.h"

#include "engine_testing.h"

#define STAGES 2
#define B      2
#define T      8
#define STEPS  4
#define MIB    1048576.0

/* Tokens of a fixed pseudo-random stream, the targets its next tokens (a tr_batch_cb). */
static int token_batch(void *user, uint64_t index, int b, int t, int *tokens, float *x,
                       int *targets, float *y)
{
    (void)x;
    (void)y;
    int V = *(const int *)user;
    for (int i = 0; i < b * t; i++) {
        uint64_t s = index * (uint64_t)(b * t) + (uint64_t)i;
        tokens[i] = (int)((s * 7 + s / 5 * 3) % (uint64_t)V);
        targets[i] = (int)(((s + 1) * 7 + (s + 1) / 5 * 3) % (uint64_t)V);
    }
    return 0;
}

typedef struct run_case {
    int zero;
    const char *optimizer; /* its params: lr, and no decay or momentum */
    double lr, clip;
} run_case_t;

static const tr_gpt2_config_t small = {
    .max_seq_len = T, .vocab_size = 96, .num_layers = 3, .num_heads = 2, .channels = 32};
/* parameters dominate: 8 blocks of 790k parameters and a wte of 524k, against activations of
 * B T = 16 positions */
static const tr_gpt2_config_t big = {
    .max_seq_len = T, .vocab_size = 2048, .num_layers = 8, .num_heads = 4, .channels = 256};

/* An engine on `world` ranks (0: mpirun's) with `stages` (1: none), gas micro-batches per
 * replica; *cfg to destroy after it. */
static tr_engine_t *engine(const tr_gpt2_config_t *g, int world, int stages, int gas,
                           const run_case_t *k, tr_config_t **cfg)
{
    char json[768], pipe[64] = "";
    if (stages > 1) snprintf(pipe, sizeof(pipe), "\"pipeline\": {\"stages\": %d},", stages);
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d,"
             " \"optimizer\": {\"type\": \"%s\", \"params\": {\"lr\": %g, \"weight_decay\": 0}},"
             " \"gradient_clipping\": %g, \"zero_optimization\": {\"stage\": %d}, %s"
             " \"troupe\": {\"runtime\": {\"workers\": 1}}}",
             B, gas, k->optimizer, k->lr, k->clip, world == 1 ? 0 : k->zero, pipe);
    *cfg = test_config_world(json, "pipe_own.json", world);
    tr_model_t *model;
    char err[512];
    assert_int_equal(tr_model_gpt2_create(&model, g, err, sizeof(err)), 0);
    tr_engine_opts_t o = {.config = *cfg,
                          .model = model,
                          .seq_len = T,
                          .seed = 5,
                          .init_params = 1,
                          .world = world,
                          .train = {.batch = token_batch, .user = (void *)&g->vocab_size},
                          .val = {.batch = token_batch, .user = (void *)&g->vocab_size}};
    tr_engine_t *eng;
    if (tr_engine_create(&eng, &o, err, sizeof(err))) fail_msg("engine (world %d): %s", world, err);
    return eng;
}

/* What this rank's stage holds: its layers' range [*lo, *hi) and the tied range its layers
 * use [*tlo, *thi) (empty when none), from the partition the engine uses. */
typedef struct held {
    int stage, replica, replicas;
    size_t lo, hi, tlo, thi;
} held_t;

static held_t held_by(const tr_model_t *m, int rank, int world)
{
    int bounds[STAGES + 1];
    char err[256];
    assert_int_equal(tr_pipe_partition(m, "parameters", STAGES, bounds, err, sizeof(err)), 0);
    held_t h = {.replicas = world / STAGES};
    h.stage = rank / h.replicas;
    h.replica = rank % h.replicas;
    const tr_layer_t *a = tr_model_layer(m, bounds[h.stage]);
    const tr_layer_t *b = tr_model_layer(m, bounds[h.stage + 1] - 1);
    h.lo = a->param_offset;
    h.hi = b->param_offset + b->param_count;
    for (int i = bounds[h.stage]; i < bounds[h.stage + 1]; i++) {
        const tr_layer_t *l = tr_model_layer(m, i);
        if (l->tie_count &&
            (l->tie_layer < bounds[h.stage] || l->tie_layer >= bounds[h.stage + 1])) {
            h.tlo = l->tie_offset;
            h.thi = l->tie_offset + l->tie_count;
        }
    }
    return h;
}

/* The optimizer's slice of the stage at ZeRO 1: the stage's elements padded to a multiple of
 * 2 R and cut in R equal slices (DeepSpeed's partition, among the stage's replicas). */
static size_t slice_of(const held_t *h, int zero)
{
    size_t n = h->hi - h->lo, q = 2 * (size_t)h->replicas;
    if (!zero) return n;
    size_t S = (n + q - 1) / q * q / (size_t)h->replicas, a = (size_t)h->replica * S;
    return (a >= n ? n : a + S <= n ? a + S : n) - (a >= n ? n : a);
}

static void world_rank(int *world, int *rank)
{
    MPI_Comm_size(MPI_COMM_WORLD, world);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
}

/* Resident pages of the whole pages inside base[lo, hi) (mincore). */
static size_t resident(const float *base, size_t lo, size_t hi)
{
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)(base + lo) + pg - 1) & ~(pg - 1),
              b = (uintptr_t)(base + hi) & ~(pg - 1);
    if (b <= a) return 0;
    size_t n = (b - a) / pg, count = 0;
    unsigned char *v = malloc(n);
    assert_int_equal(mincore((void *)a, b - a, v), 0);
    for (size_t i = 0; i < n; i++)
        count += v[i] & 1;
    free(v);
    return count;
}

/* No page of another stage's parameters or gradients was ever touched (the buffers are mapped
 * whole; a page never written is not resident): the parameters outside the stage's layers and
 * the tied range it uses, the gradients outside its layers (its tied gradients are kept
 * apart). */
static void check_untouched(tr_engine_t *eng, const held_t *h)
{
    const tr_model_t *m = tr_engine_model(eng);
    const float *p = tr_model_params(m), *g = tr_model_grads(m);
    size_t n = tr_model_num_params(m);
    size_t tlo = h->thi > h->tlo ? h->tlo : h->lo, thi = h->thi > h->tlo ? h->thi : h->lo;
    size_t a = tlo < h->lo ? tlo : h->lo;                      /* below both held ranges */
    size_t gap_lo = thi < h->lo ? thi : h->lo, gap_hi = h->lo; /* between the tie and the layers */
    assert_int_equal(resident(p, 0, a), 0);
    assert_int_equal(resident(p, gap_lo, gap_hi), 0);
    assert_int_equal(resident(p, h->hi, n), 0);
    assert_int_equal(resident(g, 0, h->lo), 0);
    assert_int_equal(resident(g, h->hi, n), 0);
    assert_true(resident(p, h->lo, h->hi) > 0); /* the check can see pages */
}

/* The engine's figures are the stage's: its layers and the tied tensor (parameters, and
 * gradients kept apart), two AdamW moments for its slice; strictly less than the model. */
static void check_figures(tr_engine_t *eng, const held_t *h, int zero, int moments)
{
    tr_engine_memory_t mem;
    tr_engine_memory(eng, &mem);
    size_t held = h->hi - h->lo + h->thi - h->tlo;
    size_t n = tr_model_num_params(tr_engine_model(eng));
    assert_int_equal(mem.params, held * 4);
    assert_int_equal(mem.grads, held * 4);
    assert_int_equal(mem.optimizer, (size_t)moments * slice_of(h, zero) * 4);
    assert_true(mem.params < n * 4);
}

static void losses_match(int zero)
{
    int world, rank;
    world_rank(&world, &rank);
    int R = world / STAGES;
    run_case_t k = {.zero = zero, .optimizer = "AdamW", .lr = 3e-3, .clip = 0.05};
    tr_config_t *cfg;
    tr_engine_t *eng = engine(&small, 0, STAGES, 2, &k, &cfg);
    held_t h = held_by(tr_engine_model(eng), rank, world);
    float loss[STEPS], norm[STEPS], val, ref_val;
    tr_step_stats_t st;
    for (int i = 0; i < STEPS; i++) {
        if (tr_engine_train_batch(eng, &st)) fail_msg("step %d: %s", i, tr_engine_error(eng));
        loss[i] = st.loss;
        norm[i] = (float)st.grad_norm;
    }
    check_figures(eng, &h, zero, 2);
    assert_int_equal(tr_engine_eval(eng, 2 * R, &val), 0);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);

    eng = engine(&small, 1, 1, 2 * R, &k, &cfg); /* the same global batch, one process */
    for (int i = 0; i < STEPS; i++) {
        assert_int_equal(tr_engine_train_batch(eng, &st), 0);
        if (rank == 0)
            printf("ZeRO %d, %d stages x %d replicas: step %d: loss %.7f (one process %.7f), "
                   "norm %.6f (%.6f)\n",
                   zero, STAGES, R, i, loss[i], st.loss, norm[i], st.grad_norm);
        assert_true(fabsf(loss[i] - st.loss) <= 1e-5f * fabsf(st.loss));
        assert_true(fabs(norm[i] - st.grad_norm) <= 1e-5 * st.grad_norm);
        assert_true(st.grad_norm > k.clip); /* the clipping took part */
    }
    assert_int_equal(tr_engine_eval(eng, 2 * R, &ref_val), 0);
    assert_true(fabsf(val - ref_val) <= 1e-5f * fabsf(ref_val));
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

static void test_pipe_own_losses_zero0(void **state)
{
    (void)state;
    losses_match(0);
}

static void test_pipe_own_losses_zero1(void **state)
{
    (void)state;
    losses_match(1);
}

/* ||a - b|| / ||b|| over n floats. */
static double rel_l2(const float *a, const float *b, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}

/* One SGD step of lr 1 from the same init: what moved is the gradient. The stage's layers
 * and the tied wte (on the stage that owns it and on the one whose head uses it) move as the
 * one-process run's. */
static void test_pipe_own_tied_gradients_equal_one_process(void **state)
{
    (void)state;
    int world, rank;
    world_rank(&world, &rank);
    int R = world / STAGES;
    run_case_t k = {.zero = 1, .optimizer = "SGD", .lr = 1.0, .clip = 0};
    tr_config_t *cfg, *ref_cfg;
    tr_engine_t *eng = engine(&small, 0, STAGES, 2, &k, &cfg);
    tr_engine_t *ref = engine(&small, 1, 1, 2 * R, &k, &ref_cfg);
    const tr_model_t *m = tr_engine_model(eng), *rm = tr_engine_model(ref);
    held_t h = held_by(m, rank, world);
    size_t n = tr_model_num_params(m), tn = h.thi - h.tlo;
    const float *p = tr_model_params(m), *rp = tr_model_params(rm);
    float *g = malloc(n * sizeof(float)), *rg = malloc(n * sizeof(float));
    /* the stage's parameters are the whole init's, bit for bit */
    assert_memory_equal(p + h.lo, rp + h.lo, (h.hi - h.lo) * sizeof(float));
    if (tn) assert_memory_equal(p + h.tlo, rp + h.tlo, tn * sizeof(float));
    for (size_t i = h.lo; i < h.hi; i++)
        g[i] = p[i], rg[i] = rp[i];
    for (size_t i = h.tlo; i < h.thi; i++)
        g[i] = p[i], rg[i] = rp[i];
    tr_step_stats_t st;
    assert_int_equal(tr_engine_train_batch(eng, &st), 0);
    assert_int_equal(tr_engine_train_batch(ref, &st), 0);
    for (size_t i = h.lo; i < h.hi; i++)
        g[i] -= p[i], rg[i] -= rp[i];
    for (size_t i = h.tlo; i < h.thi; i++)
        g[i] -= p[i], rg[i] -= rp[i];
    double own = rel_l2(g + h.lo, rg + h.lo, h.hi - h.lo);
    double tied = tn ? rel_l2(g + h.tlo, rg + h.tlo, tn) : 0;
    printf("rank %d (stage %d): its layers' gradients %.2e from one process's, the tied wte's "
           "%.2e (%s)\n",
           rank, h.stage, own, tied, tn ? "the head's copy" : "the owner's, in its layers");
    assert_true(own <= 1e-5);
    assert_true(tied <= 1e-5);
    /* GPT-2's wte lives on both stages: in stage 0's embedding, as the last stage's copy */
    assert_true(h.stage == 0 ? h.lo == 0 && tn == 0 : tn > 0);
    free(g);
    free(rg);
    tr_engine_destroy(eng);
    tr_engine_destroy(ref);
    tr_config_destroy(cfg);
    tr_config_destroy(ref_cfg);
}

/* The process's "Vm<name>:" line of /proc/self/status, in bytes. */
static double vm_bytes(const char *name)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    size_t len = strlen(name);
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, name, len) && line[len] == ':') kb = atof(line + len + 1);
    if (f) fclose(f);
    assert_true(kb >= 0);
    return kb * 1024;
}

/* The peak RSS starts again from the current RSS (Linux: clear_refs 5). */
static void reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    assert_non_null(f);
    assert_true(fputs("5", f) >= 0);
    assert_int_equal(fclose(f), 0);
}

/* How much the peak RSS grows over two steps and an evaluation of the big GPT-2. */
static double peak_growth(int world, int stages, int gas, const run_case_t *k, held_t *h, int rank)
{
    MPI_Barrier(MPI_COMM_WORLD);
    reset_peak();
    double before = vm_bytes("VmRSS");
    tr_config_t *cfg;
    tr_engine_t *eng = engine(&big, world, stages, gas, k, &cfg);
    tr_step_stats_t st;
    float val;
    for (int i = 0; i < 2; i++)
        if (tr_engine_train_batch(eng, &st)) fail_msg("step %d: %s", i, tr_engine_error(eng));
    assert_int_equal(tr_engine_eval(eng, 1, &val), 0);
    double grown = vm_bytes("VmHWM") - before;
    if (h) {
        int size;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        *h = held_by(tr_engine_model(eng), rank, size);
        check_figures(eng, h, k->zero, 2);
        check_untouched(eng, h);
    }
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    return grown;
}

/* Each rank's peak RSS grows by at most its stage's figures (parameters, gradients, AdamW's
 * two moments) plus SLACK for what is not parameters (activations of 16 positions, the
 * stages' slots and send areas, the actors, MPI's buffers for the collectives), and by less
 * than the whole model's growth in one process. */
#define SLACK (24 * MIB)
static void test_pipe_own_rank_memory_holds_only_its_stage(void **state)
{
    (void)state;
    int world, rank;
    world_rank(&world, &rank);
    int R = world / STAGES;
    run_case_t k = {.zero = 1, .optimizer = "AdamW", .lr = 1e-3, .clip = 0};
    held_t h;
    double grown = peak_growth(0, STAGES, 1, &k, &h, rank);
    size_t held = h.hi - h.lo + h.thi - h.tlo;
    double figures = 2.0 * (double)held * 4 + 2.0 * (double)slice_of(&h, k.zero) * 4;
    double whole = peak_growth(1, 1, R, &k, NULL, rank);
    printf("rank %d (stage %d of %d x %d replicas, ZeRO %d): peak RSS +%.1f MiB; its figures "
           "%.1f MiB (+ %.0f MiB slack); the whole model in one process +%.1f MiB\n",
           rank, h.stage, STAGES, R, k.zero, grown / MIB, figures / MIB, SLACK / MIB, whole / MIB);
    if (SANITIZED) return; /* the engine's figures were checked; the resident set says little */
    assert_true(grown <= figures + SLACK);
    assert_true(grown + SLACK < whole);
}

/* A save writes each stage's parameters from its own ranks, and a load into a pipelined
 * engine leaves each rank holding only its stage: its resident set after the load and a step
 * exceeds the level before the engine by at most its figures plus SLACK. */
static void test_pipe_own_checkpoint_leaves_each_rank_its_stage(void **state)
{
    (void)state;
    int world, rank;
    world_rank(&world, &rank);
    char dir[64] = "";
    if (rank == 0 && !mkdtemp(strcpy(dir, "/tmp/tr_pipe_own.XXXXXX"))) fail_msg("mkdtemp");
    MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
    run_case_t k = {.zero = 1, .optimizer = "AdamW", .lr = 1e-3, .clip = 0};
    tr_config_t *cfg;
    tr_step_stats_t st;
    malloc_trim(0); /* what is freed goes back: the resident set is what is held */
    double trained = vm_bytes("VmRSS");
    tr_engine_t *eng = engine(&big, 0, STAGES, 1, &k, &cfg);
    assert_int_equal(tr_engine_train_batch(eng, &st), 0);
    malloc_trim(0);
    trained = vm_bytes("VmRSS") - trained; /* a step from scratch, before any save */
    if (tr_engine_save_checkpoint(eng, dir, "t") || tr_engine_wait_checkpoint(eng))
        fail_msg("save: %s", tr_engine_error(eng));
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);

    MPI_Barrier(MPI_COMM_WORLD);
    malloc_trim(0);
    double before = vm_bytes("VmRSS");
    eng = engine(&big, 0, STAGES, 1, &k, &cfg);
    if (tr_engine_load_checkpoint(eng, dir, "t")) fail_msg("load: %s", tr_engine_error(eng));
    assert_int_equal(tr_engine_train_batch(eng, &st), 0);
    malloc_trim(0); /* the load's reads and staging are freed by now */
    double now = vm_bytes("VmRSS") - before;
    held_t h = held_by(tr_engine_model(eng), rank, world);
    check_untouched(eng, &h); /* the load copied in only the stage's */
    tr_engine_memory_t mem;
    tr_engine_memory(eng, &mem);
    double figures = (double)(mem.params + mem.grads + mem.optimizer);
    printf("rank %d (stage %d): after a load and a step, resident +%.1f MiB (a step from "
           "scratch: +%.1f MiB); its figures %.1f MiB (+ %.0f MiB slack)\n",
           rank, h.stage, now / MIB, trained / MIB, figures / MIB, SLACK / MIB);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
    }
    if (!SANITIZED) assert_true(now <= figures + SLACK);
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    const struct CMUnitTest tests[] = {
        /* first: the later tests' models are freed, but their pages may stay with malloc */
        cmocka_unit_test(test_pipe_own_rank_memory_holds_only_its_stage),
        cmocka_unit_test(test_pipe_own_losses_zero0),
        cmocka_unit_test(test_pipe_own_losses_zero1),
        cmocka_unit_test(test_pipe_own_tied_gradients_equal_one_process),
        cmocka_unit_test(test_pipe_own_checkpoint_leaves_each_rank_its_stage),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    MPI_Finalize();
    return rc;
}
