/* comm.c: the comm actor. Each BUCKET is reduced (averaged over the data-parallel ranks) by
 * the backend and passed on to the optimizer as REDUCED once the backend reports completion.
 * With the local backend (world size 1) that is at once; asynchronous backends are polled
 * here and never block a worker.
 */
#include <stdlib.h>

#include "actors/engine_internal.h"
#include "runtime/comm.h"

struct tr__comm {
    tr_engine_t *eng;
    tr_comm_t *backend;
};

static int comm_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    struct tr__comm *c = ctx->state;
    if (msg->type != TR_MSG_BUCKET) return 0;
    tr_msg_bucket_t *b = TR_MSG_AS(msg, bucket);
    uint64_t req;
    int done = 0;
    int rc = c->backend->ops->all_reduce_mean(c->backend, tr__engine_buffer(c->eng, &b->grads),
                                              b->grads.length / 4, TR_DTYPE_F32, &req);
    while (rc == 0 && !done) /* the local backend is done at once */
        rc = c->backend->ops->test(c->backend, req, &done);
    if (rc < 0) return rc;
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_REDUCED);
    if (!m) return TR_ENOMEM;
    TR_MSG_AS(m, reduced)->bucket = b->bucket;
    TR_MSG_AS(m, reduced)->grads = b->grads;
    m->step = msg->step;
    rc = tr_actor_send(ctx->rt, c->eng->optimizer, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    return rc;
}

int tr__comm_spawn(tr_engine_t *eng)
{
    struct tr__comm *c = calloc(1, sizeof(*c));
    if (!c) return TR_ENOMEM;
    eng->cm = c;
    c->eng = eng;
    int rc = tr_comm_create("local", eng->rank, eng->world, &c->backend);
    if (rc < 0) return rc;
    tr_actor_opts_t o = {
        .name = "comm", .defer_stop = 1, .supervisor = eng->supervisor, .lane_kind = TR_LANE_COMM};
    return tr_actor_spawn(eng->rt, comm_behaviour, c, &o, &eng->comm);
}

void tr__comm_free(tr_engine_t *eng)
{
    if (!eng->cm) return;
    tr_comm_destroy(eng->cm->backend);
    free(eng->cm);
    eng->cm = NULL;
}
