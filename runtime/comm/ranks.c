/* ranks.c: rank discovery from the launcher's environment (runtime/comm/ranks.h). */
#include "runtime/comm/ranks.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/errf.h"
#include "troupe/error.h"

/* One launcher's variables: rank, size and (NULL when it has none) local rank. */
typedef struct source {
    const char *name, *rank, *size, *local;
} source_t;

static const source_t sources[] = {
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"PMI", "PMI_RANK", "PMI_SIZE", NULL},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

/* Reads variable var as an integer in [lo, hi] into *out (absent: *out untouched, 0). */
static int read_int(const char *var, int lo, int hi, int *out, char *why, size_t whylen)
{
    const char *s = getenv(var);
    if (!s) return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return tr__errf(why, whylen, TR_EINVAL, "%s=\"%s\": expected an integer from %d to %d", var,
                        s, lo, hi);
    *out = (int)v;
    return 0;
}

static int from_source(const source_t *src, tr_ranks_t *out, char *why, size_t whylen)
{
    int rank = -1, world = -1, local = 0;
    int rc = read_int(src->size, 1, INT_MAX, &world, why, whylen);
    if (!rc) rc = read_int(src->rank, 0, INT_MAX, &rank, why, whylen);
    if (!rc && src->local) rc = read_int(src->local, 0, INT_MAX, &local, why, whylen);
    if (rc) return rc;
    if (rank < 0 || world < 0)
        return tr__errf(why, whylen, TR_EINVAL, "%s sets %s but not %s", src->name,
                        rank < 0 ? src->size : src->rank, rank < 0 ? src->rank : src->size);
    if (rank >= world)
        return tr__errf(why, whylen, TR_EINVAL, "%s: %s=%d is not below %s=%d", src->name,
                        src->rank, rank, src->size, world);
    *out = (tr_ranks_t){rank, world, local, src->name};
    return 0;
}

int tr_ranks_discover(const tr_ranks_t *given, tr_ranks_t *out, char *why, size_t whylen)
{
    char scratch[8];
    if (!why) {
        why = scratch;
        whylen = sizeof(scratch);
    }
    why[0] = '\0';
    if (given && given->world > 0) {
        if (given->rank < 0 || given->rank >= given->world || given->local_rank < 0)
            return tr__errf(why, whylen, TR_EINVAL,
                            "rank %d of world %d: the rank must be from 0 to %d", given->rank,
                            given->world, given->world - 1);
        *out = *given;
        out->source = "api";
        return 0;
    }
    for (size_t i = 0; i < sizeof(sources) / sizeof(sources[0]); i++)
        if (getenv(sources[i].rank) || getenv(sources[i].size))
            return from_source(&sources[i], out, why, whylen);
    if (getenv("WORLD_SIZE") || getenv("RANK")) {
        int world = 1;
        if (read_int("WORLD_SIZE", 1, INT_MAX, &world, why, whylen) < 0) return TR_EINVAL;
        if (world > 1)
            return tr__errf(why, whylen, TR_EINVAL,
                            "RANK/WORLD_SIZE (torchrun or the DeepSpeed launcher) say world "
                            "size %d; Troupe's ranks talk over MPI: launch with `mpirun -np %d "
                            "...` or `srun -n %d ...`",
                            world, world, world);
    }
    *out = (tr_ranks_t){0, 1, 0, "single process"};
    return 0;
}
