/* ckpt.h: making the checkpointer actor (checkpoint.c, ckpt_read.c). */
#ifndef TR_ACTORS_CKPT_CKPT_H
#define TR_ACTORS_CKPT_CKPT_H

#include "actors/engine/plan.h"

struct tr__ckpt_actor;

/* Creates the checkpointer's state (*state) and actor (*self); no message is sent. On
 * failure *state may still be set. The caller's thread. */
int tr__checkpointer_spawn(const tr__plan_t *eng, struct tr__ckpt_actor **state, tr_actor_t *self);
/* After the runtime has closed; NULL does nothing. */
void tr__checkpointer_free(struct tr__ckpt_actor *c);

#endif
