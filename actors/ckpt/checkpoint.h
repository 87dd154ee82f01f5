/* checkpoint.h: the checkpoint format that the checkpointer actor writes (checkpoint.c) and
 * reads back (ckpt_read.c), and what a read leaves for a restore.
 *
 * A tag folder holds model_states.trck (written by rank 0: parameters, counters, data
 * position, optimizer scalars, and the layout of the optimizer files; from a pipeline across
 * ranks, stage 0's parameters, each other stage's in model_states_stage<s>.trck) and
 * optim_states_rank<k>.trck for k < optim_files: with ZeRO stage >= 1 on W ranks one per
 * rank, each holding its slice [lo, hi) of the flat optimizer state; otherwise one, rank 0's,
 * holding all of it (every rank's state is identical then). Each optimizer file's header says
 * its own lo, hi, n_params and world, so a load can re-partition from any saved layout.
 */
#ifndef TR_ACTORS_CKPT_CHECKPOINT_H
#define TR_ACTORS_CKPT_CHECKPOINT_H

#include <stdint.h>

#include <msgpack.h>

#include "actors/engine/plan.h"
#include "io/ckpt_file.h"

#define TR__CKPT_FORMAT "troupe-checkpoint"
/* 2: config_hash in both files; version, step, world in the optimizer's.
 * 3: the model file's zero_stage and optim_files; each optimizer file's lo, hi (its slice).
 * 4: the model file's "model", the model's description: {kind: "gpt2" (then vocab,
 *    padded_vocab, context, channels, layers, heads: its tr_gpt2_config_t) or "layers" (any
 *    other model), blocks: per layer [kind (its ops' kind), in_dim, out_dim, targets, y_dim]};
 *    a load compares it field by field (files before 4 are loaded on the parameter table).
 * 5: a pipeline across ranks (stage_files S in the model file) writes its parameters in one
 *    file per stage: model_states.trck holds stage 0's, model_states_stage<s>.trck stage s's,
 *    each with the model file's header plus its slice lo, hi of the flat parameters and the
 *    step; the slices tile [0, n_params). Other saves still say 4. */
#define TR__CKPT_VERSION 5

/* A tag read and checked for this rank; nothing in the engine has changed. */
typedef struct tr__ckpt_tag {
    tr_ckpt_file_t model;              /* its payload: the parameters (version 5 with stage
                                        * files: stage 0's) */
    float *params;                     /* all n_params parameters (the model file's payload, or
                                        * assembled from the stage files: then owned) */
    float *assembled;                  /* params when assembled (freed with the tag) */
    msgpack_unpacked mh;               /* its header */
    const msgpack_object *optim_state; /* the optimizer's scalars, inside mh */
    uint64_t counters[4];              /* global steps, samples, skipped, micro-steps */
    uint64_t data[3];                  /* epoch, cursor, batch index */
    int saved_world;
    int saved_replicas; /* data-parallel replicas of the saving run (its world, if unsaid) */
    float *moments;     /* this rank's slice, n_arrays x (hi - lo) floats (NULL: none) */
    size_t moments_bytes;
} tr__ckpt_tag_t;

/* Reads <tagdir>'s files for this rank and checks everything: checksums of what it uses, the
 * files against each other (one save), the parameter table against the model, the optimizer
 * files' arrays against this optimizer, their slices tiling [0, n_params); assembles this
 * rank's slice of the moments (eng->optim_slice) and rescales per-rank counters and the data
 * position to this world size. TR_E* with err naming the file and the field. Free t with
 * tr__ckpt_tag_free, also after a failure. The checkpointer's thread. */
int tr__ckpt_tag_read(const tr__plan_t *eng, const char *tagdir, tr__ckpt_tag_t *t, char *err,
                      size_t errlen);
void tr__ckpt_tag_free(tr__ckpt_tag_t *t);

#endif
