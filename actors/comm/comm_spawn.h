/* comm_spawn.h: making the gradient bucketer (bucketer.c) and the comm actor (comm.c). */
#ifndef TR_ACTORS_COMM_COMM_SPAWN_H
#define TR_ACTORS_COMM_COMM_SPAWN_H

#include <stddef.h>
#include <stdint.h>

#include "actors/engine/plan.h"

struct tr__comm;

/* Each creates its actor and *self, its address; no message is sent. The caller's thread. */

/* The bucketer's state is freed by the runtime (its cleanup hook), when it stops. */
int tr__bucketer_spawn(const tr__plan_t *eng, tr_actor_t *self);

/* The comm actor's state is *state, which outlives the actor: the other actors' buffers it
 * reduces may be in flight until all have stopped, and its comms_logger summary prints at the
 * end. Free it with tr__comm_free after the runtime has closed (NULL does nothing), also on
 * failure. *comm_bytes: the communication buffers it holds (16-bit wire copies). */
int tr__comm_spawn(const tr__plan_t *eng, struct tr__comm **state, tr_actor_t *self,
                   uint64_t *comm_bytes, char *err, size_t errlen);
void tr__comm_free(struct tr__comm *c);

#endif
