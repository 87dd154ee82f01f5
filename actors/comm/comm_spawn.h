/* comm_spawn.h: making the gradient bucketer (bucketer.c) and the comm actor (comm.c). */
#ifndef TR_ACTORS_COMM_COMM_SPAWN_H
#define TR_ACTORS_COMM_COMM_SPAWN_H

#include <stddef.h>
#include <stdint.h>

#include "actors/engine/plan.h"

struct tr__bucketer;
struct tr__comm;

/* Each creates its actor's state (*state) and actor (*self); no message is sent. On failure
 * *state may still be set: free it with the matching _free after the runtime has closed
 * (NULL does nothing). The caller's thread. */
int tr__bucketer_spawn(const tr__plan_t *eng, struct tr__bucketer **state, tr_actor_t *self);
void tr__bucketer_free(struct tr__bucketer *b);
/* *comm_bytes: the communication buffers it holds (16-bit wire copies). */
int tr__comm_spawn(const tr__plan_t *eng, struct tr__comm **state, tr_actor_t *self,
                   uint64_t *comm_bytes, char *err, size_t errlen);
void tr__comm_free(struct tr__comm *c);

#endif
