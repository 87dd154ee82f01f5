/* loader.h: the loader actor (loader.c): it reads the train set ahead into troupe.data.prefetch
 * registered slots and sends them to the executor as BATCH messages, one per credit. */
#ifndef TR_ACTORS_DATA_LOADER_H
#define TR_ACTORS_DATA_LOADER_H

#include "actors/data/dataset.h"
#include "actors/engine/plan.h"

struct tr__loader;

/* Creates the loader's state (*state, reading train) and actor (*self); no message is sent.
 * On failure *state may still be set: free it with tr__loader_free. The caller's thread. */
int tr__loader_spawn(const tr__plan_t *eng, tr__dataset_t *train, struct tr__loader **state,
                     tr_actor_t *self);
/* After the runtime has closed; NULL does nothing. */
void tr__loader_free(struct tr__loader *l);

#endif
