/* bench_collectives: Troupe's comm actor against bare MPI, same collectives, same sizes, same
 * mpirun (`make bench-dp` runs it on 2 and 4 ranks):
 *
 *   mpirun -np N bench_collectives [--sizes 1,4,16,64] [--warmup W] [--reps R]
 *   bench_collectives --blas-info   (no MPI: OpenBLAS's best core here, for the peer)
 *
 * For each size (MiB of fp32, the whole buffer): a bare MPI_Iallreduce, then the comm actor's
 * bucket all-reduce (an engine at ZeRO stage 0); a bare MPI_Ireduce_scatter_block, then the
 * comm actor's bucket at ZeRO stage 2 (collectives.h says how each is timed). Prints, on rank
 * 0, `name: value unit` lines: the median time, algbw and busbw in Gbps by DeepSpeed's
 * formulas (all-reduce: algbw 2S/t, busbw S/t * 2(n-1)/n; reduce-scatter: S = the buffer,
 * algbw S/t, busbw S/t * (n-1)/n), and the comm actor's busbw over bare MPI's (bound >= 0.90).
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
    int sizes_mib[MAX_SIZES], n_sizes, warmup, reps;
} opts_t;

static int parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.sizes_mib = {1, 4, 16, 64}, .n_sizes = 4, .warmup = 3, .reps = 10};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--warmup") && v)
            o->warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && v)
            o->reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sizes") && v) {
            o->n_sizes = 0;
            for (char *s = argv[++i]; *s && o->n_sizes < MAX_SIZES; s += *s == ',')
                o->sizes_mib[o->n_sizes++] = (int)strtol(s, &s, 10);
        } else {
            fprintf(stderr,
                    "usage: bench_collectives [--sizes MiB,MiB,...] [--warmup W] "
                    "[--reps R]\n (unknown or incomplete: %s)\n",
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
    if (o->reps < 1 || o->warmup < 0) {
        fprintf(stderr, "--reps >= 1\n");
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

static void run_size(const opts_t *o, int mib, const char *tmpdir, int rank, int world)
{
    size_t bytes = (size_t)mib << 20;
    for (int k = 0; k < 2; k++) {
        bench_op_t op = k == 0 ? BENCH_ALL_REDUCE : BENCH_REDUCE_SCATTER;
        int stage = k == 0 ? 0 : 2, as_stage1 = 0;
        double bare = bench_mpi_seconds(op, bytes, o->warmup, o->reps);
        double actor = bench_actor_seconds(stage, bytes, o->warmup, o->reps, tmpdir, &as_stage1);
        if (rank != 0) continue;
        double b = report("mpi", op, mib, bare, world);
        /* a build without ZeRO 2 all-reduced the stage-2 bucket: name it as what it was */
        bench_op_t actor_op = stage == 2 && as_stage1 ? BENCH_ALL_REDUCE : op;
        char who[64];
        snprintf(who, sizeof(who), "actor_stage%d", stage);
        double a = report(who, actor_op, mib, actor, world);
        if (actor_op != op)
            printf("actor_stage2_%dMiB_note: this build runs ZeRO stage 2 as stage 1 (bucket "
                   "all-reduced); no reduce-scatter to compare\n",
                   mib);
        else if (a > 0 && b > 0)
            printf("actor_%s_%dMiB_vs_mpi: %.3f x (busbw; bound >= 0.90: %s)\n", bench_op_name(op),
                   mib, a / b, a / b >= 0.90 ? "met" : "NOT met");
        fflush(stdout);
    }
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
        printf("warmup_reps: %d %d\n", o.warmup, o.reps);
    }
    for (int i = 0; i < o.n_sizes; i++)
        run_size(&o, o.sizes_mib[i], tmpdir, rank, world);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) rmdir(tmpdir);
    MPI_Finalize();
    return 0;
}
