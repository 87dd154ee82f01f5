/* Checkpoints on several ranks, run by test_engine_ckpt_dp.sh in four mpirun jobs that share a
 * folder (argv: mode, folder):
 *
 *   save (4 ranks, ZeRO 1)    K steps, a checkpoint (each rank writes its optimizer partition),
 *                             M more steps whose losses go to <dir>/losses4.
 *   resume (2 ranks)          loads the 4-rank checkpoint (each rank assembles its new slice
 *                             from two old partitions), saves it again as a 2-rank one, trains M
 *                             steps: the losses of the 4-rank run within TOL; so does a 2-rank
 *                             ZeRO 2 run from the same checkpoint. Then rank 0 alone
 *                             loads the 2-rank checkpoint (both partitions into one), saves it
 *                             as a 1-rank one, trains M steps: the 2-rank losses within TOL.
 *                             2 ranks at ZeRO 1 load that one-file checkpoint (each takes its
 *                             half of the one slice): the 2-rank losses within TOL; 2 ranks at
 *                             ZeRO 0 load the 2-rank ZeRO 1 checkpoint and save it (rank 0 alone
 *                             writes an optimizer file: every rank's state is the same then):
 *                             the 2-rank losses within TOL again.
 *   failing (2 ranks)         a save that rank 1 cannot write (RLIMIT_FSIZE, EFBIG) fails on
 *                             both ranks, naming rank 1's file there and latest's tag; rank 0
 *                             removes its files of the tag, the folder goes, latest stays on
 *                             the last good save, and the next save succeeds.
 *   partial (2 ranks)         rank 0 saves while rank 1 trains: both calls fail at once with
 *                             the ranks and what each was doing named, latest is not written;
 *                             then the MPI job ends (the collectives left cannot complete).
 *   idle (2 ranks)            rank 0 saves while rank 1 calls nothing: rank 0's save fails
 *                             after troupe.comm.timeout_s (2 s), naming the save it waits in.
 *
 * Every run has the same global batch (4 micro-batches of 4 samples: GAS = 4 / ranks) and the
 * same data (micro-batch i of a step is the same on any number of ranks), so losses differ only
 * by float summation order: the sum over ranks and micro-batches is taken in another order.
 * TOL is the data-parallel tests' 1e-5 of the loss (at least 1e-5) per step. */
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe.h"

#include "engine_testing.h"

#define XD      TEST_XD
#define CLASSES TEST_CLASSES
#define K       3 /* steps before the save */
#define M       4 /* steps after it */
#define TOL     1e-5f

static const char *dir;    /* the folder the jobs share */
static int timeout_s = 20; /* troupe.comm.timeout_s */

/* An engine over `world` ranks (0: mpirun's) at ZeRO `stage` with the global batch above. */
static tr_engine_t *engine(int world, int stage, tr_config_t **cfg)
{
    int w = world;
    if (!w) MPI_Comm_size(MPI_COMM_WORLD, &w);
    char json[512];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": %d,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
             " \"gradient_clipping\": 1.0,"
             " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 60},"
             " \"troupe\": {\"runtime\": {\"workers\": 1}, \"comm\": {\"timeout_s\": %d}}}",
             4 / w, stage, timeout_s);
    return test_mlp_engine(json, "ckpt_dp.json", world, cfg);
}

static void done(tr_engine_t *eng, tr_config_t *cfg)
{
    tr_engine_destroy(eng); /* MPI is the test's again from here: no actor calls it */
    tr_config_destroy(cfg);
}

static void train(tr_engine_t *eng, int n, float *losses)
{
    for (int i = 0; i < n; i++) {
        tr_step_stats_t st;
        if (tr_engine_train_batch(eng, &st)) fail_msg("train: %s", tr_engine_error(eng));
        if (losses) losses[i] = st.loss;
    }
}

static void save(tr_engine_t *eng, const char *tag)
{
    if (tr_engine_save_checkpoint(eng, dir, tag))
        fail_msg("save %s: %s", tag, tr_engine_error(eng));
}

static void load(tr_engine_t *eng, const char *tag)
{
    if (tr_engine_load_checkpoint(eng, dir, tag))
        fail_msg("load %s: %s", tag, tr_engine_error(eng));
    assert_int_equal(tr_engine_global_step(eng), K);
}

static char *path(const char *name)
{
    static char p[4][1024];
    static int next;
    char *out = p[next++ % 4];
    snprintf(out, sizeof(p[0]), "%s/%s", dir, name);
    return out;
}

static bool exists(const char *name)
{
    struct stat st;
    return stat(path(name), &st) == 0;
}

static void write_losses(const char *name, const float *losses)
{
    FILE *f = fopen(path(name), "w");
    assert_non_null(f);
    for (int i = 0; i < M; i++)
        fprintf(f, "%.9g\n", losses[i]);
    assert_int_equal(fclose(f), 0);
}

static void read_losses(const char *name, float *losses)
{
    FILE *f = fopen(path(name), "r");
    if (!f) fail_msg("%s: %s (run the save mode first)", path(name), strerror(errno));
    for (int i = 0; i < M; i++)
        assert_int_equal(fscanf(f, "%f", &losses[i]), 1);
    fclose(f);
}

static void expect_close(const char *what, const float *got, const char *ref_what, const float *ref)
{
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int i = 0; i < M; i++) {
        float tol = TOL * fmaxf(1.0f, fabsf(ref[i]));
        if (rank == 0)
            printf("step %d: %s %.7f, %s %.7f (|diff| %.2g, tolerance %.2g)\n", K + i + 1, what,
                   got[i], ref_what, ref[i], fabsf(got[i] - ref[i]), tol);
        assert_true(fabsf(got[i] - ref[i]) <= tol);
    }
}

/* --- the three jobs --------------------------------------------------------------------- */

static void test_engine_ckpt_dp_4_ranks_save_and_continue(void **state)
{
    (void)state;
    tr_config_t *cfg;
    tr_engine_t *eng = engine(0, 1, &cfg);
    assert_int_equal(tr_engine_world(eng), 4);
    float losses[M];
    train(eng, K, NULL);
    save(eng, "w4");
    train(eng, M, losses);
    int rank = tr_engine_rank(eng);
    done(eng, cfg);
    if (rank == 0) write_losses("losses4", losses);
    for (int r = 0; r < 4; r++) { /* one partition per rank, and latest */
        char name[64];
        snprintf(name, sizeof(name), "w4/optim_states_rank%d.trck", r);
        assert_true(exists(name));
    }
    assert_true(exists("latest"));
}

static void test_engine_ckpt_dp_resume_on_2_ranks_and_on_1(void **state)
{
    (void)state;
    float four[M], two[M], one[M], two_again[M], two_s0[M], two_z2[M];
    read_losses("losses4", four);
    tr_config_t *cfg;
    tr_engine_t *eng = engine(0, 1, &cfg); /* 2 ranks, ZeRO 1 */
    assert_int_equal(tr_engine_world(eng), 2);
    int rank = tr_engine_rank(eng);
    load(eng, "w4");
    save(eng, "w2");
    train(eng, M, two);
    done(eng, cfg);
    expect_close("2 ranks from a 4-rank checkpoint", two, "4 ranks continuing", four);
    assert_true(exists("w2/optim_states_rank1.trck") && !exists("w2/optim_states_rank2.trck"));

    eng = engine(0, 2, &cfg); /* 2 ranks, ZeRO 2: gradients partitioned as well */
    load(eng, "w4");
    train(eng, M, two_z2);
    done(eng, cfg);
    expect_close("2 ranks at ZeRO 2 from a 4-rank checkpoint", two_z2, "4 ranks continuing", four);

    if (rank == 0) { /* one process: the two partitions become one */
        eng = engine(1, 1, &cfg);
        load(eng, "w2");
        save(eng, "w1");
        train(eng, M, one);
        done(eng, cfg);
        expect_close("1 rank from a 2-rank checkpoint", one, "2 ranks", two);
        assert_true(exists("w1/optim_states_rank0.trck") && !exists("w1/optim_states_rank1.trck"));
    }
    MPI_Barrier(MPI_COMM_WORLD);

    eng = engine(0, 1, &cfg); /* 2 ranks, ZeRO 1: the one-file state split in two */
    load(eng, "w1");
    train(eng, M, two_again);
    done(eng, cfg);
    expect_close("2 ranks from a 1-rank checkpoint", two_again, "2 ranks", two);

    eng = engine(0, 0, &cfg); /* 2 ranks, ZeRO 0: every rank the whole state */
    load(eng, "w2");
    save(eng, "w2s0");
    train(eng, M, two_s0);
    done(eng, cfg);
    expect_close("2 ranks at stage 0 from a stage 1 checkpoint", two_s0, "2 ranks", two);
    assert_true(exists("w2s0/optim_states_rank0.trck") && !exists("w2s0/optim_states_rank1.trck"));
}

/* Whether name is gone within 5 s: a rank removes its files of a failed save when it hears of
 * the failure, which may be just after another rank's wait has returned it. */
static bool gone_soon(const char *name)
{
    for (int i = 0; i < 500 && exists(name); i++)
        usleep(10000);
    return !exists(name);
}

/* The tag latest names. */
static void read_latest(char *tag, size_t cap)
{
    FILE *f = fopen(path("latest"), "r");
    assert_non_null(f);
    assert_non_null(fgets(tag, (int)cap, f));
    fclose(f);
}

static void test_engine_ckpt_dp_failed_save_is_removed_on_every_rank(void **state)
{
    (void)state;
    tr_config_t *cfg;
    tr_engine_t *eng = engine(0, 1, &cfg); /* 2 ranks, ZeRO 1: each writes its partition */
    assert_int_equal(tr_engine_world(eng), 2);
    int rank = tr_engine_rank(eng);
    train(eng, K, NULL);
    save(eng, "good");
    if (tr_engine_wait_checkpoint(eng)) fail_msg("good: %s", tr_engine_error(eng));
    train(eng, 1, NULL);
    /* rank 1 alone cannot write a file past 1 byte (EFBIG: SIGXFSZ ignored); rank 0's files
     * of the save are written whole */
    struct rlimit was, one = {1, 0};
    signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &was), 0);
    one.rlim_max = was.rlim_max;
    if (rank == 1) assert_int_equal(setrlimit(RLIMIT_FSIZE, &one), 0);
    save(eng, "bad");
    int rc = tr_engine_wait_checkpoint(eng);
    const char *why = tr_engine_error(eng);
    printf("rank %d: the failed save: %d: %s\n", rank, rc, why);
    assert_int_equal(rc, TR_EFAILED);
    assert_non_null(strstr(why, "save of "));
    assert_non_null(strstr(why, "latest still names good"));
    if (rank == 1) {
        assert_non_null(strstr(why, "/bad/optim_states_rank1.trck"));
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &was), 0);
    } else {
        assert_non_null(strstr(why, "1 rank(s) could not write its checkpoint files"));
    }
    /* rank 0's whole files of the failed tag are removed too, and the folder */
    assert_true(gone_soon("bad/model_states.trck"));
    assert_true(gone_soon("bad/optim_states_rank0.trck"));
    assert_true(gone_soon("bad"));
    char tag[64] = "";
    read_latest(tag, sizeof(tag));
    assert_string_equal(tag, "good");
    /* the engine goes on: training, and a save that succeeds */
    train(eng, 1, NULL);
    save(eng, "after");
    if (tr_engine_wait_checkpoint(eng)) fail_msg("after: %s", tr_engine_error(eng));
    done(eng, cfg);
    read_latest(tag, sizeof(tag));
    assert_string_equal(tag, "after");
}

/* Not a cmocka test: the job cannot end cleanly (the ranks' last collectives differ), so each
 * rank checks what it was told, says so on stdout, and the script checks the job's output.
 * Rank 0 saves (in the background: its call returns once the state is copied), then every
 * rank trains: the step's all-reduce carries how many ranks are in a save, 1 of 2, and that
 * step fails on both ranks with the reason; no latest is written. */
static int partial_save(void)
{
    tr_config_t *cfg;
    tr_engine_t *eng = engine(0, 1, &cfg);
    int rank = tr_engine_rank(eng);
    if (tr_engine_train_batch(eng, NULL)) {
        fprintf(stderr, "partial: rank %d: %s\n", rank, tr_engine_error(eng));
        return 1;
    }
    /* as in `if rank == 0: engine.save_checkpoint(...)`, then every rank trains on */
    int saved = rank == 0 ? tr_engine_save_checkpoint(eng, dir, "partial") : 0;
    int rc = saved ? saved : tr_engine_train_batch(eng, NULL);
    const char *why = tr_engine_error(eng);
    printf("partial: rank %d: %s returned %d: %s\n", rank, saved ? "save" : "train", rc, why);
    bool named = rc == TR_EFAILED && strstr(why, "a checkpoint save was called on 1 of 2 ranks") &&
                 strstr(why, "no latest was written");
    printf("partial: rank %d: %s\n", rank, named ? "reported" : "NOT REPORTED");
    if (rank == 0) printf("partial: latest %s\n", exists("latest") ? "WRITTEN" : "not written");
    fflush(stdout);
    done(eng, cfg);
    return named ? 0 : 1;
}

/* Rank 1 calls nothing at all for a while: rank 0's save returns, and its wait for the save
 * waits in its agreement until the watchdog (troupe.comm.timeout_s 2 here) names what it
 * waits for. */
static int idle_save(void)
{
    timeout_s = 2;
    tr_config_t *cfg;
    tr_engine_t *eng = engine(0, 1, &cfg);
    int rank = tr_engine_rank(eng);
    if (tr_engine_train_batch(eng, NULL)) {
        fprintf(stderr, "idle: rank %d: %s\n", rank, tr_engine_error(eng));
        return 1;
    }
    if (rank != 0) {
        sleep(60); /* the job ends before this does (the script's timeout is the backstop) */
        return 1;
    }
    int rc = tr_engine_save_checkpoint(eng, dir, "idle");
    if (rc == 0) rc = tr_engine_wait_checkpoint(eng);
    const char *why = tr_engine_error(eng);
    bool named = rc == TR_ETIMEDOUT && strstr(why, "watchdog: rank 1 diverged") &&
                 strstr(why, "the header exchange before collective") &&
                 strstr(why, "a wait for a checkpoint save (every rank must call it)");
    printf("idle: rank 0: save returned %d: %s\nidle: rank 0: %s\nidle: latest %s\n", rc, why,
           named ? "reported" : "NOT REPORTED", exists("latest") ? "WRITTEN" : "not written");
    fflush(stdout);
    done(eng, cfg);
    return named ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr,
                "usage: %s save|resume|failing|partial|idle DIR (see test_engine_ckpt_dp.sh)\n",
                argv[0]);
        return 2;
    }
    dir = argv[2];
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    int rc;
    if (!strcmp(argv[1], "partial")) {
        rc = partial_save();
    } else if (!strcmp(argv[1], "idle")) {
        rc = idle_save();
    } else if (!strcmp(argv[1], "failing")) {
        const struct CMUnitTest failing[] = {
            cmocka_unit_test(test_engine_ckpt_dp_failed_save_is_removed_on_every_rank)};
        rc = cmocka_run_group_tests(failing, NULL, NULL);
    } else {
        const struct CMUnitTest save[] = {
            cmocka_unit_test(test_engine_ckpt_dp_4_ranks_save_and_continue)};
        const struct CMUnitTest resume[] = {
            cmocka_unit_test(test_engine_ckpt_dp_resume_on_2_ranks_and_on_1)};
        rc = !strcmp(argv[1], "save") ? cmocka_run_group_tests(save, NULL, NULL)
                                      : cmocka_run_group_tests(resume, NULL, NULL);
    }
    MPI_Finalize();
    return rc;
}
