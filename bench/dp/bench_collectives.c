/* bench_collectives: Troupe's comm actor against bare MPI, same collectives, same sizes, same
 * mpirun (`make bench-dp` runs it on 2 and 4 ranks):
 *
 *   mpirun -np N bench_collectives [--sizes 1,4,16,64] [--warmup W] [--reps R] [--rounds N]
 *   bench_collectives --blas-info   (no MPI: OpenBLAS's best core here, for the peer)
 *
 * For each size (MiB of fp32, the whole buffer): a bare MPI_Iallreduce and the comm actor's
 * bucket all-reduce (an engine at ZeRO stage 0); a bare MPI_Ireduce_scatter and the comm
 * actor's bucket at ZeRO stage 2. Both sides compute the mean over the ranks, as the actor
 * delivers it (collectives.h says how each is timed). The two sides alternate in --rounds
 * rounds (default 3) of --warmup (3) + --reps (10) repetitions each, and each side's figure is
 * the median of its rounds * reps times, so a noisy moment of a shared machine falls on both.
 * Prints, on rank 0, `name: value unit` lines: the median time, algbw and busbw in Gbps by
 * DeepSpeed's formulas (all-reduce: algbw 2S/t, busbw S/t * 2(n-1)/n; reduce-scatter: S = the
 * buffer, algbw S/t, busbw S/t * (n-1)/n) of bare MPI (the mean), bare MPI's collective alone
 * (mpi_sum_only: without the mean's scaling pass) and the comm actor, and the comm actor's
 * busbw over bare MPI's (bound >= 0.90), and over the sum alone.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/monitor_internals.h"
#include "troupe/blas.h"

#include "collectives.h"

#define MAX_SIZES 16

typedef struct opts {
    int sizes_mib[MAX_SIZES], n_sizes, warmup, reps, rounds;
} opts_t;

static int parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.sizes_mib = {1, 4, 16, 64}, .n_sizes = 4, .warmup = 3, .reps = 10, .rounds = 3};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--warmup") && v)
            o->warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && v)
            o->reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && v)
            o->rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sizes") && v) {
            o->n_sizes = 0;
            for (char *s = argv[++i]; *s && o->n_sizes < MAX_SIZES; s += *s == ',')
                o->sizes_mib[o->n_sizes++] = (int)strtol(s, &s, 10);
        } else {
            fprintf(stderr,
                    "usage: bench_collectives [--sizes MiB,MiB,...] [--warmup W] "
                    "[--reps R] [--rounds N]\n (unknown or incomplete: %s)\n",
                    argv[i]);
            return -1;
        }
    }
    for (int i = 0; i < o->n_sizes; i++) {
        if (o->sizes_mib[i] < 1) {
            fprintf(stderr, "--sizes: whole MiB, 1 or more\n");
            return -1;
        }
    }
    if (o->reps < 1 || o->warmup < 0 || o->rounds < 1) {
        fprintf(stderr, "--reps >= 1, --warmup >= 0, --rounds >= 1\n");
        return -1;
    }
    return 0;
}

/* Time and bandwidths of one measurement; its busbw (Gbps), 0 if it failed. */
static double report(const char *who, bench_op_t op, int mib, double s, int world)
{
    const char *name = bench_op_name(op);
    if (s <= 0) {
        printf("%s_%s_%dMiB: failed\n", who, name, mib);
        return 0;
    }
    double bytes = (double)mib * 1048576.0, algbw, busbw;
    /* DeepSpeed's message size for a reduce-scatter is the output: each rank's share */
    tr_comms_bw(name, op == BENCH_REDUCE_SCATTER ? bytes / world : bytes, s * 1e3, world, &algbw,
                &busbw);
    printf("%s_%s_%dMiB_time: %.3f ms\n", who, name, mib, s * 1e3);
    printf("%s_%s_%dMiB_algbw: %.2f Gbps\n", who, name, mib, algbw);
    printf("%s_%s_%dMiB_busbw: %.2f Gbps\n", who, name, mib, busbw);
    return busbw;
}

/* Each side's times of op at `bytes` over o->rounds rounds, the two sides alternating (bare
 * MPI first in even rounds, the actor first in odd ones), so that the machine's drift falls on
 * both: mpi_sum[], mpi_mean[], actor[] of rounds * reps each. 0, or -1 when a side failed. */
static int measure(const opts_t *o, bench_op_t op, size_t bytes, const char *tmpdir, int *as_stage1,
                   double *mpi_sum, double *mpi_mean, double *actor)
{
    int stage = op == BENCH_ALL_REDUCE ? 0 : 2;
    for (int r = 0; r < o->rounds; r++) {
        size_t at = (size_t)r * (size_t)o->reps;
        for (int k = 0; k < 2; k++) {
            int rc = (k + r) % 2 == 0 ? bench_mpi_times(op, bytes, o->warmup, o->reps, mpi_sum + at,
                                                        mpi_mean + at)
                                      : bench_actor_times(stage, bytes, o->warmup, o->reps, tmpdir,
                                                          as_stage1, actor + at);
            if (rc < 0) return -1;
        }
    }
    return 0;
}

static void run_size(const opts_t *o, int mib, const char *tmpdir, int rank, int world)
{
    size_t bytes = (size_t)mib << 20, n = (size_t)o->rounds * (size_t)o->reps;
    double *t = malloc(3 * n * sizeof(double));
    for (int k = 0; t && k < 2; k++) {
        bench_op_t op = k == 0 ? BENCH_ALL_REDUCE : BENCH_REDUCE_SCATTER;
        int stage = k == 0 ? 0 : 2, as_stage1 = 0;
        int rc = measure(o, op, bytes, tmpdir, &as_stage1, t, t + n, t + 2 * n);
        if (rank != 0) continue;
        double sum = rc < 0 ? -1 : bench_median(t, (int)n);
        double bare = rc < 0 ? -1 : bench_median(t + n, (int)n);
        double actor = rc < 0 ? -1 : bench_median(t + 2 * n, (int)n);
        double b = report("mpi", op, mib, bare, world);
        double bs = report("mpi_sum_only", op, mib, sum, world);
        /* a build without ZeRO 2 all-reduced the stage-2 bucket: name it as what it was */
        bench_op_t actor_op = stage == 2 && as_stage1 ? BENCH_ALL_REDUCE : op;
        char who[64];
        snprintf(who, sizeof(who), "actor_stage%d", stage);
        double a = report(who, actor_op, mib, actor, world);
        if (actor_op != op) {
            printf("actor_stage2_%dMiB_note: this build runs ZeRO stage 2 as stage 1 (bucket "
                   "all-reduced); no reduce-scatter to compare\n",
                   mib);
        } else if (a > 0 && b > 0) {
            printf("actor_%s_%dMiB_vs_mpi: %.3f x (busbw; bound >= 0.90: %s)\n", bench_op_name(op),
                   mib, a / b, a / b >= 0.90 ? "met" : "NOT met");
            printf("actor_%s_%dMiB_vs_mpi_sum_only: %.3f x (busbw; bare MPI without the mean's "
                   "scaling)\n",
                   bench_op_name(op), mib, a / bs);
        }
        fflush(stdout);
    }
    free(t);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--blas-info")) { /* for run.sh: the peer's settings */
        tr_blas_info_t b;
        tr_blas_check(&b);
        printf("blas: %s\nblas_best_core: %s\n", b.description, b.best_core);
        return 0;
    }
    tr_blas_reexec_if_needed(argc, argv); /* OpenBLAS's best kernels, before MPI starts */
    int provided, rank, world;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    opts_t o;
    if (parse(argc, argv, &o) < 0) {
        MPI_Finalize();
        return 2;
    }
    char tmpdir[64] = "/tmp/troupe-bench-dp-XXXXXX";
    if (rank == 0 && !mkdtemp(tmpdir)) tmpdir[0] = 0;
    MPI_Bcast(tmpdir, sizeof(tmpdir), MPI_CHAR, 0, MPI_COMM_WORLD);
    if (!tmpdir[0]) {
        if (rank == 0) perror("bench_collectives: mkdtemp /tmp/troupe-bench-dp-XXXXXX");
        MPI_Finalize();
        return 1;
    }
    if (rank == 0) {
        printf("world: %d ranks\n", world);
        printf("mpi_thread_level: %d\n", provided);
        printf("warmup_reps_rounds: %d %d %d\n", o.warmup, o.reps, o.rounds);
    }
    for (int i = 0; i < o.n_sizes; i++)
        run_size(&o, o.sizes_mib[i], tmpdir, rank, world);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) rmdir(tmpdir);
    MPI_Finalize();
    return 0;
}
