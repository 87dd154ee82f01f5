/* mpi_collectives.c: the bare-MPI side of bench_collectives, what a program using MPI
 * directly gets: fp32 MPI_Iallreduce and MPI_Ireduce_scatter (both in place, as Troupe's mpi
 * backend posts them: the whole buffer in, each rank's 1/world out at its start), each completed
 * by polling MPI_Test in a tight loop (bare MPI's best: on a quiet core as fast as polling with
 * sched_yield or 1 us sleeps between tests, and on a loaded one faster than either), and the
 * mean's scaling where the actor (and DeepSpeed) scale: the all-reduced buffer after the sum, a
 * reduce-scatter's input before it. The scaling is Troupe's vector kernel (tr__vec()->scale,
 * the actor's): the plain loop, which -O2 leaves scalar, took ~230 us of a 1 MiB all-reduce's
 * ~800 us, against ~30 us vectorised, so bare MPI's mean was handicapped by its own loop, not by
 * MPI. Nothing else of Troupe's is used here. Timing: see collectives.h.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/kernel_internals.h"

#include "collectives.h"

const char *bench_op_name(bench_op_t op)
{
    return op == BENCH_ALL_REDUCE ? "all_reduce" : "reduce_scatter";
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One collective, started and polled to completion, with the mean's scaling as the actor's:
 * after an all-reduce, before a reduce-scatter. This rank's seconds for the collective alone
 * in *sum and with the scaling in *mean; -1 when MPI failed. */
static int one(bench_op_t op, float *buf, int *counts, int count, float inv_world, double *sum,
               double *mean)
{
    MPI_Request r;
    double t0 = MPI_Wtime(), t1 = t0;
    if (op == BENCH_REDUCE_SCATTER) {
        tr__vec()->scale(buf, inv_world, (size_t)count);
        t1 = MPI_Wtime();
    }
    int rc = op == BENCH_ALL_REDUCE
                 ? MPI_Iallreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r)
                 : MPI_Ireduce_scatter(MPI_IN_PLACE, buf, counts, MPI_FLOAT, MPI_SUM,
                                       MPI_COMM_WORLD, &r);
    int done = 0;
    while (rc == MPI_SUCCESS && !done)
        rc = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, text, &len);
        fprintf(stderr, "mpi_collectives: %s of %d floats: %s\n", bench_op_name(op), count, text);
        return -1;
    }
    double t2 = MPI_Wtime();
    if (op == BENCH_ALL_REDUCE) tr__vec()->scale(buf, inv_world, (size_t)count);
    *sum = t2 - t1;
    *mean = MPI_Wtime() - t0;
    return 0;
}

int bench_mpi_times(bench_op_t op, size_t bytes, int warmup, int reps, double *sum, double *mean)
{
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int count = (int)(bytes / sizeof(float));
    float *buf = aligned_alloc(64, (bytes + 63) / 64 * 64); /* as the engine's buffers */
    int *counts = malloc((size_t)world * sizeof(int)), ok = buf && counts;
    for (int r = 0; ok && r < world; r++) /* the actor's partitions of a one-bucket model */
        counts[r] = count / world + (r < count % world);
    for (int i = 0; ok && i < warmup + reps; i++) {
        /* the buffer written afresh, as the actor's gradient is by each backward (and no
         * value halved rep after rep into a denormal by the scaling): small values, finite
         * sums */
        for (int j = 0; j < count; j++)
            buf[j] = (float)(j % 97) * 1e-3f;
        MPI_Barrier(MPI_COMM_WORLD);
        double mine[2] = {-1, -1}, slowest[2];
        int failed = one(op, buf, counts, count, 1.0f / (float)world, &mine[0], &mine[1]) < 0;
        MPI_Allreduce(mine, slowest, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        int any_failed;
        MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        ok = !any_failed;
        if (ok && i >= warmup) {
            sum[i - warmup] = slowest[0];
            mean[i - warmup] = slowest[1];
        }
    }
    free(buf);
    free(counts);
    return ok ? 0 : -1;
}
