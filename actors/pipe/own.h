/* own.h: what a pipeline across ranks does so that each rank holds only its stage (own.c):
 * its groups of ranks and the collectives among them, run on the caller's thread between
 * batches. Included by model.c only. */
#ifndef TR_ACTORS_PIPE_OWN_H
#define TR_ACTORS_PIPE_OWN_H

#include <stdbool.h>
#include <stddef.h>

#include "troupe/model.h"

typedef struct tr__pipe_own tr__pipe_own_t;

/* This rank's stage `stage` of `stages` (layers bounds[stage] .. bounds[stage + 1] - 1; bounds
 * is kept, and must outlive it) with `replicas` data-parallel replicas, MPI's rank and world,
 * batches of (B, T): its communicators (the stage's
 * data-parallel group; the tie group of the two stages that hold a tied tensor, for each
 * replica; a duplicate of the world for evaluation's transfers), split off a new
 * MPI communicator. Collective over the world: every rank calls it at the same point.
 * TR_EINVAL with err for ties this cannot reduce (tied tensors shared by more than one pair of
 * stages), the backend's error otherwise. */
int tr__pipe_own_create(tr__pipe_own_t **out, tr_model_t *model, const int *bounds, int stages,
                        int stage, int replicas, int rank, int world, int B, int T, char *err,
                        size_t errlen);
void tr__pipe_own_destroy(tr__pipe_own_t *o);

/* How long a collective may wait for the other ranks before it fails (seconds, > 0). */
void tr__pipe_own_set_timeout(tr__pipe_own_t *o, double seconds);

/* After a batch: the tied gradients summed over the two stages that hold them (the owner's in
 * the model's buffer, the user's in `tied`, the stage's area kept apart, indexed as the model:
 * both end with the sum; may be NULL on a stage that is neither), then the stage's range of
 * the gradients all-reduced in its data-parallel group: each value times pre before the sum,
 * the sum times post. */
int tr__pipe_own_reduce(tr__pipe_own_t *o, float *tied, float pre, float post, char *err,
                        size_t errlen);

/* After a step: with `partitioned` (ZeRO 1), each replica's slice of the stage's range
 * (tr__zero_owned's cut among the replicas) all-gathered in the group; then the tied
 * parameters sent from the stage that owns them to the stage that uses them. */
int tr__pipe_own_sync(tr__pipe_own_t *o, bool partitioned, char *err, size_t errlen);

/* One forward of an evaluation batch through the stages of this rank's replica: each stage
 * runs its layers (on an activation slot of its own, made at the first call) and sends its
 * output to the next stage's rank; *has_loss is set on the last stage, with its loss. */
int tr__pipe_own_eval(tr__pipe_own_t *o, const tr_batch_t *batch, float *loss, bool *has_loss,
                      char *err, size_t errlen);

/* For a caller that reads the whole model (an export, sampling): every stage's parameters
 * broadcast from its first replica to every rank. tr__pipe_own_unwhole gives what is not the
 * stage's back to the kernel again (nothing when no gather came since). */
int tr__pipe_own_gather(tr__pipe_own_t *o, char *err, size_t errlen);
void tr__pipe_own_unwhole(tr__pipe_own_t *o);

/* Zeroes the stage's gradients: its range of the model's buffer (and the caller zeroes the
 * stage's tied area). */
void tr__pipe_own_zero_grad(const tr__pipe_own_t *o);

#endif
