/* collectives.h: the two sides of bench_collectives, timed the same way on the same sizes.
 *
 * Both give one time per repetition of an (operation, size): the time a collective takes from
 * the moment the last rank is ready to start it until the last rank has it complete, in
 * seconds, the same on every rank (bench_collectives alternates the two sides in rounds and
 * takes the median of each side's times over all rounds). Sizes are the whole fp32 buffer in bytes
 * (a reduce-scatter's input; each rank receives bytes / world). Every function here is collective:
 * every rank calls it with the same arguments, from the thread that initialised MPI.
 */
#ifndef TR_BENCH_DP_COLLECTIVES_H
#define TR_BENCH_DP_COLLECTIVES_H

#include <stddef.h>

typedef enum { BENCH_ALL_REDUCE, BENCH_REDUCE_SCATTER } bench_op_t;

/* "all_reduce" or "reduce_scatter": DeepSpeed's comms-logger names. */
const char *bench_op_name(bench_op_t op);

/* mpi_collectives.c: bare MPI computing what the comm actor computes, the mean over the ranks,
 * as DeepSpeed does: per repetition a barrier, then an all-reduce (MPI_Iallreduce in place,
 * completed by polling MPI_Test in a tight loop, then the whole buffer times 1 / world) or a
 * reduce-scatter (the whole buffer times 1 / world, then MPI_Ireduce_scatter in place with the
 * actor's partitions, polled the same way); `warmup` untimed repetitions first. Fills sum[reps]
 * with the slowest rank's time of the collective alone and mean[reps] with it and its scaling.
 * Returns 0, or a negative value when MPI failed (printed). */
int bench_mpi_times(bench_op_t op, size_t bytes, int warmup, int reps, double *sum, double *mean);

/* actor_collectives.c: Troupe's comm actor inside an engine whose gradient is one bucket of
 * `bytes` (zero_optimization.stage 0: all-reduced; stage 2: reduce-scattered), trained for
 * warmup + reps steps with a trace. Fills t[reps], per traced step: from the last rank's BUCKET
 * reaching its comm actor to the last rank's REDUCED reaching its optimizer. `tmpdir` holds
 * the traces (the same path on every rank). *stage2_as_1 is set when this build ran stage 2 as
 * stage 1 (the engine said so), so the figure is an all-reduce. Returns 0, or a negative value
 * on failure (printed). */
int bench_actor_times(int stage, size_t bytes, int warmup, int reps, const char *tmpdir,
                      int *stage2_as_1, double *t);

/* The median of n values (sorts them). */
double bench_median(double *v, int n);

#endif
