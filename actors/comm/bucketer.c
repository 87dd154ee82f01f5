/* bucketer.c: the bucketer actor. It receives each layer's final gradient range (in
 * backward order: last layer first) and packs consecutive ranges into buckets of at most
 * reduce_bucket_size elements, sending each full bucket to the communicator at once and the
 * remainder when the backward is complete (layer 0).
 *
 * The model keeps all gradients in one flat buffer, layer after layer, so consecutive ranges
 * are adjacent and a bucket is a range of that buffer: contiguous_gradients holds by
 * construction and buckets cost no memory and no copy. A range that does not continue the
 * current bucket (a model whose layers finish out of order) closes it first.
 */
#include <stdio.h>
#include <stdlib.h>

#include "actors/comm/comm_spawn.h"
#include "actors/engine/plan.h"

static int emit(tr_ctx_t *ctx, tr__buckets_t *b, size_t lo, size_t hi, uint64_t step)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_BUCKET);
    if (!m) return TR_ENOMEM;
    TR_MSG_AS(m, bucket)->bucket = b->next_id++;
    m->step = step;
    int rc = tr_buffer_ref(ctx->rt, b->eng->buf_grads, lo * sizeof(float),
                           (hi - lo) * sizeof(float), TR_DTYPE_F32, &TR_MSG_AS(m, bucket)->grads);
    if (rc == 0)
        rc = b->send ? b->send(ctx, b->send_arg, m) : tr_actor_send(ctx->rt, b->eng->comm, m);
    if (rc < 0)
        tr_msg_free(ctx->rt, m);
    else
        tr__engine_bucket_bytes(b->eng, (int64_t)((hi - lo) * sizeof(float)));
    return rc;
}

/* Sends whole buckets from the top of the open range; with flush, the rest too. */
static int drain(tr_ctx_t *ctx, tr__buckets_t *b, bool flush, uint64_t step)
{
    while (b->hi - b->lo >= b->bucket_size || (flush && b->hi > b->lo)) {
        size_t n = b->hi - b->lo < b->bucket_size ? b->hi - b->lo : b->bucket_size;
        int rc = emit(ctx, b, b->hi - n, b->hi, step);
        if (rc < 0) return rc;
        b->hi -= n;
    }
    return 0;
}

void tr__buckets_init(tr__buckets_t *b, const tr__plan_t *eng)
{
    int64_t size = eng->cfg->zero.reduce_bucket_size;
    *b = (tr__buckets_t){.eng = eng, .bucket_size = size > 0 ? (size_t)size : eng->n_params};
}

int tr__buckets_add(tr_ctx_t *ctx, tr__buckets_t *b, const tr_msg_grad_ready_t *g, uint64_t step)
{
    int rc = 0;
    if (g->count) {
        if (b->hi > b->lo && g->offset + g->count != b->lo)
            rc = drain(ctx, b, true, step); /* not adjacent: close the open bucket */
        if (rc == 0) {
            if (b->hi == b->lo) b->hi = g->offset + g->count;
            b->lo = g->offset;
            rc = drain(ctx, b, false, step);
        }
    }
    if (rc == 0 && g->last) {
        rc = drain(ctx, b, true, step);
        b->next_id = 0;
    }
    return rc;
}

static int bucketer_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    if (msg->type != TR_MSG_GRAD_READY) return 0;
    return tr__buckets_add(ctx, ctx->state, TR_MSG_AS(msg, grad_ready), msg->step);
}

/* The runtime's cleanup hook: the state is the bucketer's alone (its buckets are views of the
 * gradient buffer, which it does not own), so it goes when the actor stops. */
static void free_state(tr_ctx_t *ctx, int reason)
{
    (void)reason;
    free(ctx->state);
}

int tr__bucketer_spawn(const tr__plan_t *eng, tr_actor_t *self)
{
    tr__buckets_t *b = malloc(sizeof(*b));
    if (!b) return TR_ENOMEM;
    tr__buckets_init(b, eng);
    size_t n_buckets = (eng->n_params + b->bucket_size - 1) / b->bucket_size;
    tr_log(TR_LOG_INFO,
           "bucketer: %zu gradient elements in %zu bucket(s) of up to %zu "
           "(reduce_bucket_size); buckets are views of the gradient buffer: 0 extra bytes\n",
           eng->n_params, n_buckets, b->bucket_size);
    tr_actor_opts_t o = {.name = "bucketer",
                         .defer_stop = 1,
                         .supervisor = eng->supervisor,
                         .cleanup = free_state,
                         .lane_kind = TR_LANE_DATA};
    int rc = tr_actor_spawn(eng->rt, bucketer_behaviour, b, &o, self);
    if (rc < 0) free(b); /* not the runtime's */
    return rc;
}
