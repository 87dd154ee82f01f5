/* mpi_collectives.c: the bare-MPI side of bench_collectives, what a program using MPI
 * directly gets: fp32 MPI_Iallreduce and MPI_Ireduce_scatter (both in place, as Troupe's mpi
 * backend posts them: the whole buffer in, each rank's 1/world out at its start), each completed
 * by polling MPI_Test in a loop, as the comm actor completes its operations. Nothing of
 * Troupe's is used here. Timing: see collectives.h.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* One collective, started and polled to completion: this rank's seconds, or -1. */
static double one(bench_op_t op, float *send, int *counts, int count)
{
    MPI_Request r;
    double t0 = MPI_Wtime();
    int rc = op == BENCH_ALL_REDUCE
                 ? MPI_Iallreduce(MPI_IN_PLACE, send, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r)
                 : MPI_Ireduce_scatter(MPI_IN_PLACE, send, counts, MPI_FLOAT, MPI_SUM,
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
    return MPI_Wtime() - t0;
}

double bench_mpi_seconds(bench_op_t op, size_t bytes, int warmup, int reps)
{
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int count = (int)(bytes / sizeof(float));
    float *send = malloc(bytes);
    int *counts = malloc((size_t)world * sizeof(int));
    double *times = malloc((size_t)reps * sizeof(double)), ok = send && counts && times;
    for (int r = 0; ok && r < world; r++) /* the actor's partitions of a one-bucket model */
        counts[r] = count / world + (r < count % world);
    for (int i = 0; ok && i < count; i++) /* small values: sums stay finite, no denormals */
        send[i] = (float)(i % 97) * 1e-3f;
    for (int i = 0; ok && i < warmup + reps; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double mine = one(op, send, counts, count), slowest;
        MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double failed = mine < 0, any_failed;
        MPI_Allreduce(&failed, &any_failed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        ok = !any_failed;
        if (ok && i >= warmup) times[i - warmup] = slowest;
    }
    double med = ok ? bench_median(times, reps) : -1;
    free(send);
    free(counts);
    free(times);
    return med;
}
