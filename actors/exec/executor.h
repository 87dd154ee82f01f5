/* executor.h: the executor actor (executor.c), which owns the model: forward and backward per
 * micro-batch, the pipeline's stages, evaluation and the step's bookkeeping. */
#ifndef TR_ACTORS_EXEC_EXECUTOR_H
#define TR_ACTORS_EXEC_EXECUTOR_H

#include <stddef.h>

#include "actors/data/dataset.h"
#include "actors/engine/plan.h"

struct tr__exec;
struct tr__dsmon;

/* Creates the executor's state (*state) and actor (*self); no message is sent. It owns model
 * (writable: it runs it), reads val (NULL: none) and writes DeepSpeed's outputs through ds.
 * On failure *state may still be set: free it with tr__executor_free. The caller's thread. */
int tr__executor_spawn(const tr__plan_t *eng, tr_model_t *model, tr__dataset_t *val,
                       struct tr__dsmon *ds, struct tr__exec **state, tr_actor_t *self, char *err,
                       size_t errlen);
/* After the runtime has closed; NULL does nothing. */
void tr__executor_free(struct tr__exec *x);

#endif
