/* memory_plan.h: the engine's own use of the memory prediction (memory_plan.c; the estimator
 * itself is public, troupe/engine.h). The caller's thread, inside tr_engine_create. */
#ifndef TR_ACTORS_ENGINE_MEMORY_PLAN_H
#define TR_ACTORS_ENGINE_MEMORY_PLAN_H

#include <stddef.h>

#include "troupe/config.h"
#include "troupe/model.h"

/* Refuses (TR_ECONFIG, explained in err) a configuration whose predicted memory on this rank
 * (micro-batches of B x T; `training`: with the loader's slots) times the ranks on this node
 * exceeds what the machine has (tr_engine_memory_available), naming the prediction by kind and
 * each knob that would cut it with what it would then take. 0 when it fits, when the machine
 * does not say what it has, or with troupe.memory_check false. */
int tr__memory_check(const tr_config_t *c, const tr_model_t *model, int B, int T, int rank,
                     int training, char *err, size_t errlen);

#endif
