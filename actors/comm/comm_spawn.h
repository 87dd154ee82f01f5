/* comm_spawn.h: making the gradient bucketer (bucketer.c), the comm actor (comm.c) and ZeRO 3's
 * parameter fetcher (fetcher.c). */
#ifndef TR_ACTORS_COMM_COMM_SPAWN_H
#define TR_ACTORS_COMM_COMM_SPAWN_H

#include <stddef.h>
#include <stdint.h>

#include "actors/engine/plan.h"

struct tr__comm;

/* Each creates its actor and *self, its address; no message is sent. The caller's thread. */

/* The bucketer's state is freed by the runtime (its cleanup hook), when it stops. */
int tr__bucketer_spawn(const tr__plan_t *eng, tr_actor_t *self);

/* What the bucketer does, for an actor that packs the buckets itself (ZeRO 3's fetcher, whose
 * all-gathers must reach the comm actor in the same order as the buckets on every rank): the
 * open bucket, and each GRAD_READY added to it (full buckets go to the comm actor at once, the
 * rest at layer 0). */
typedef struct tr__buckets {
    const tr__plan_t *eng;
    size_t bucket_size; /* elements */
    size_t lo, hi;      /* the open bucket: [lo, hi) of the gradient buffer */
    uint32_t next_id;   /* bucket number within the step */
    /* NULL: a bucket goes to the comm actor at once; else through send, which owns the message
     * unless it fails (the fetcher's queue, when gathers wait for parameters from disk) */
    int (*send)(tr_ctx_t *ctx, void *arg, tr_msg_t *m);
    void *send_arg;
} tr__buckets_t;
void tr__buckets_init(tr__buckets_t *b, const tr__plan_t *eng);
int tr__buckets_add(tr_ctx_t *ctx, tr__buckets_t *b, const tr_msg_grad_ready_t *g, uint64_t step);

/* ZeRO 3: spawns the fetcher (fetcher.c), which from now on owns the parameter buffer outside
 * this rank's slice: it hands those pages back at once, keeping the layers under
 * param_persistence_threshold whole. Its state is the runtime's (freed when it stops). The
 * caller's thread, after the parameters are initialised or loaded. */
int tr__fetcher_spawn(const tr__plan_t *eng, tr_actor_t *self, char *err, size_t errlen);

/* The comm actor's state is *state, which outlives the actor: the other actors' buffers it
 * reduces may be in flight until all have stopped, and its comms_logger summary prints at the
 * end. Free it with tr__comm_free after the runtime has closed (NULL does nothing), also on
 * failure. *comm_bytes: the communication buffers it holds (16-bit wire copies). */
int tr__comm_spawn(const tr__plan_t *eng, struct tr__comm **state, tr_actor_t *self,
                   uint64_t *comm_bytes, char *err, size_t errlen);
void tr__comm_free(struct tr__comm *c);

#endif
