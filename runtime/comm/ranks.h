/* ranks: which rank of how many this process is, and on which node, from the launcher's
 * environment.
 *
 * Order (the first source that is present wins): values given by the caller; Open MPI's
 * OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK; PMI_RANK / PMI_SIZE (MPICH, Intel MPI, srun with
 * PMI; no local rank: 0); Slurm's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID; otherwise rank 0
 * of 1. torchrun's and DeepSpeed's launcher's RANK / WORLD_SIZE / LOCAL_RANK are recognised but
 * refused with how to launch under MPI instead: Troupe's collectives are MPI's.
 */
#ifndef TR_RUNTIME_COMM_RANKS_H
#define TR_RUNTIME_COMM_RANKS_H

#include <stddef.h>

typedef struct tr_ranks {
    int rank, world, local_rank;
    const char *source; /* "api", "Open MPI", "PMI", "Slurm", "single process" */
} tr_ranks_t;

/* Fills out from the environment. given (may be NULL) is used instead when its world > 0.
 * TR_EINVAL with why for a malformed or inconsistent value (naming the variable and what it
 * holds) and for a torchrun-style launch (saying how to launch under MPI). Any thread. */
int tr_ranks_discover(const tr_ranks_t *given, tr_ranks_t *out, char *why, size_t whylen);

#endif
