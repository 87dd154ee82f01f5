/* dataset.h: the datasets the loader and the executor read (dataset.c): token shards in the
 * llm.c format, or a caller's batch function. Not an actor: the engine opens a dataset on the
 * caller's thread and hands it to the one actor that reads it (the loader the train set, the
 * executor the val set). */
#ifndef TR_ACTORS_DATA_DATASET_H
#define TR_ACTORS_DATA_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/engine/plan.h"

typedef struct tr__dataset tr__dataset_t;

/* Where the data stream is: enough to continue it exactly. */
typedef struct tr__data_pos {
    uint64_t epoch;
    uint64_t cursor;      /* samples of this rank consumed in the epoch */
    uint64_t batch_index; /* batches produced so far */
} tr__data_pos_t;

/* Opens spec for plan's shapes and this replica's share. The caller's thread. */
int tr__dataset_open(tr__dataset_t **out, const tr_dataset_t *spec, const tr__plan_t *eng,
                     bool shuffle, uint64_t seed, char *err, size_t errlen);
void tr__dataset_close(tr__dataset_t *ds);
/* Fills one micro-batch: tokens (or x), targets (int, when the dataset gives them) and y
 * (float targets, when it gives them). *wrapped says an epoch ended. */
int tr__dataset_next(tr__dataset_t *ds, int *tokens, float *x, int *targets, float *y,
                     bool *wrapped, char *err, size_t errlen);
tr__data_pos_t tr__dataset_pos(const tr__dataset_t *ds);
int tr__dataset_seek(tr__dataset_t *ds, tr__data_pos_t pos);
uint64_t tr__dataset_samples_per_epoch(const tr__dataset_t *ds);

#endif
