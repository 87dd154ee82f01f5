/* collectives.h: the two sides of bench_collectives, timed the same way on the same sizes.
 *
 * Both give one figure per (operation, size): the median over repetitions of the time a
 * collective takes from the moment the last rank is ready to start it until the last rank has
 * it complete, in seconds, the same on every rank. Sizes are the whole fp32 buffer in bytes (a
 * reduce-scatter's input; each rank receives bytes / world). Every function here is collective:
 * every rank calls it with the same arguments, from the thread that initialised MPI.
 */
#ifndef TR_BENCH_DP_COLLECTIVES_H
#define TR_BENCH_DP_COLLECTIVES_H

#include <stddef.h>

typedef enum { BENCH_ALL_REDUCE, BENCH_REDUCE_SCATTER } bench_op_t;

/* "all_reduce" or "reduce_scatter": DeepSpeed's comms-logger names. */
const char *bench_op_name(bench_op_t op);

/* mpi_collectives.c: bare MPI. Per repetition: a barrier, then MPI_Iallreduce (in place) or
 * MPI_Ireduce_scatter_block, completed by polling MPI_Test; `warmup` untimed repetitions
 * first. Returns the median seconds, or a negative value when MPI failed (printed). */
double bench_mpi_seconds(bench_op_t op, size_t bytes, int warmup, int reps);

/* actor_collectives.c: Troupe's comm actor inside an engine whose gradient is one bucket of
 * `bytes` (zero_optimization.stage 0: all-reduced; stage 2: reduce-scattered), trained for
 * warmup + reps steps with a trace. Per traced step: from the last rank's BUCKET reaching its
 * comm actor to the last rank's REDUCED reaching its optimizer. `tmpdir` holds the traces
 * (the same path on every rank). *stage2_as_1 is set when this build ran stage 2 as stage 1
 * (the engine said so), so the figure is an all-reduce. Negative on failure (printed). */
double bench_actor_seconds(int stage, size_t bytes, int warmup, int reps, const char *tmpdir,
                           int *stage2_as_1);

/* The median of n values (sorts them). */
double bench_median(double *v, int n);

#endif
