/* link.h: the actor that carries a pipeline stage's transfers across ranks (link.c), for a
 * pipeline with across_ranks (run.c). */
#ifndef TR_ACTORS_PIPE_LINK_H
#define TR_ACTORS_PIPE_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "troupe/msg.h"
#include "troupe/runtime.h"

/* PIPE_XFER kinds, one list for the stages (run.c) and the link: START starts a batch on an
 * actor; ACT and GRAD are the transfers (and the link's MPI tags for them); END tells the link
 * its stage has run its last instruction; ABORT: a stage failed, and its neighbours fail too
 * (across ranks the link tells every other rank's stage: a frame with this tag travels both
 * ways along the pipeline), so no stage waits forever. */
enum {
    TR__PIPE_START = 0,
    TR__PIPE_ACT = 1,
    TR__PIPE_GRAD = 2,
    TR__PIPE_END = 3,
    TR__PIPE_ABORT = 4,
};

typedef struct tr__pipe_link tr__pipe_link_t;

/* This process's place when the job's ranks are stages x replicas, stage-major (rank = stage
 * * replicas + replica): MPI's *rank and *world and its *stage, from the launcher's
 * environment. TR_EINVAL with err naming both counts when the world is not stages x
 * replicas; the launcher's error otherwise. Any thread. */
int tr__pipe_rank_stage(int stages, int replicas, int *rank, int *world, int *stage, char *err,
                        size_t errlen);

/* Where a link lands the tensors of one kind it receives: slot micro-batch mod `slots`, each
 * of slot_bytes (the sending stage keeps as many; slots 0: transfers without tensors). */
typedef struct tr__pipe_link_area {
    int slots;
    uint64_t slot_bytes;
} tr__pipe_link_area_t;

typedef struct tr__pipe_link_spec {
    int rank, world;                /* MPI's */
    int stage, stages, replicas;    /* rank = stage * replicas + replica (pipeline.h) */
    tr_actor_t stage_actor;         /* the local stage */
    tr_actor_t runner;              /* the pipeline's runner, which gets the link's PIPE_DONE */
    int expect_act, expect_grad;    /* transfers its schedule receives */
    tr__pipe_link_area_t act, grad; /* where received tensors land */
    int dtype;                      /* their elements' tr_dtype_t */
} tr__pipe_link_spec_t;

/* Spawns the link of the local stage, once per pipeline; its id in *out, its state (free after
 * the runtime closed) in *state. Creates the MPI comm backend (TR_ENOTSUP without MPI) and
 * registers its receive areas. Each START runs a batch's transfers; the link reports to the
 * runner (PIPE_DONE with link 1) once its stage has ended and every transfer is through, or
 * when it fails (its error, after which it runs no more batches). */
int tr__pipe_link_spawn(tr_runtime_t *rt, const tr__pipe_link_spec_t *spec, tr_actor_t *out,
                        tr__pipe_link_t **state, char *err, size_t errlen);
void tr__pipe_link_free(tr__pipe_link_t *l);

#endif
