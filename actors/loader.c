/* loader.c: the loader actor. It keeps `prefetch` batch slots; each filled slot is sent to
 * the executor as a BATCH (tensor references into the slot, never a copy) and comes back as a
 * CREDIT when the executor is done with it, then is refilled. So the loader is never more than
 * `prefetch` batches ahead, and its memory is fixed at start-up.
 *
 * It starts filling on the first TRAIN (so a checkpoint loaded before training positions the
 * stream without waste). A RESEEK (after a checkpoint load) moves the stream; batches already
 * sent carry the old data generation and the executor drops and credits them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/engine_internal.h"

#define BUF_SLOT0 (TR__BUF_GRADS + 1)

struct tr__loader {
    tr_engine_t *eng;
    int n_slots;
    size_t in_floats; /* floats (or ints) of input per slot */
    void *slot_mem[TR__MAX_PREFETCH];
    bool out[TR__MAX_PREFETCH]; /* sent, waiting for its credit */
    bool started;
    uint32_t gen;
    char err[512];
};

static int *slot_inputs(struct tr__loader *l, int s)
{
    return l->slot_mem[s];
}

static int *slot_targets(struct tr__loader *l, int s)
{
    return (int *)((char *)l->slot_mem[s] + l->in_floats * 4);
}

static tr_tensor_ref_t ref(struct tr__loader *l, int s, size_t offset, size_t count, int dtype,
                           int ndim)
{
    tr_engine_t *e = l->eng;
    tr_tensor_ref_t r = {.buffer_id = (uint64_t)(BUF_SLOT0 + s),
                         .offset = offset,
                         .length = count * 4,
                         .dtype = (uint8_t)dtype,
                         .device_type = TR_DEVICE_CPU,
                         .ndim = (uint8_t)ndim};
    r.shape[0] = e->B;
    r.shape[1] = e->T;
    r.shape[2] = e->x_dim;
    return r;
}

/* Fills slot s from the dataset and sends it. */
static int fill(tr_ctx_t *ctx, struct tr__loader *l, int s)
{
    tr_engine_t *e = l->eng;
    tr__data_pos_t before = tr__dataset_pos(e->train);
    bool wrapped;
    int rc = tr__dataset_next(e->train, e->x_dim ? NULL : slot_inputs(l, s),
                              e->x_dim ? (float *)slot_inputs(l, s) : NULL, slot_targets(l, s),
                              &wrapped, l->err, sizeof(l->err));
    if (rc < 0) {
        tr__engine_reply(e, rc, "loader: %s", l->err);
        return rc;
    }
    if (wrapped)
        fprintf(stderr, "troupe: loader: epoch %llu done; starting epoch %llu\n",
                (unsigned long long)before.epoch,
                (unsigned long long)tr__dataset_pos(e->train).epoch);
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_BATCH);
    if (!m) return TR_ENOMEM;
    tr_msg_batch_t *b = TR_MSG_AS(m, batch);
    b->slot = (uint32_t)s;
    b->gen = l->gen;
    tr__data_pos_t after = tr__dataset_pos(e->train);
    b->index = before.batch_index;
    b->epoch = after.epoch;
    b->cursor = after.cursor;
    b->tokens =
        ref(l, s, 0, l->in_floats, e->x_dim ? TR_DTYPE_F32 : TR_DTYPE_I32, e->x_dim ? 3 : 2);
    b->targets = ref(l, s, l->in_floats * 4, (size_t)e->B * (size_t)e->T, TR_DTYPE_I32, 2);
    m->step = e->global_steps;
    l->out[s] = true;
    rc = tr_actor_send(ctx->rt, e->executor, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    return rc;
}

static int fill_free_slots(tr_ctx_t *ctx, struct tr__loader *l)
{
    for (int s = 0; s < l->n_slots; s++)
        if (!l->out[s]) {
            int rc = fill(ctx, l, s);
            if (rc < 0) return rc;
        }
    return 0;
}

static int loader_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    struct tr__loader *l = ctx->state;
    tr_engine_t *e = l->eng;
    switch (msg->type) {
    case TR_MSG_CREDIT: {
        uint32_t s = TR_MSG_AS(msg, credit)->slot;
        if (s >= (uint32_t)l->n_slots || !l->out[s])
            return TR_EINVAL; /* an engine bug: fail loudly */
        l->out[s] = false;
        return l->started ? fill(ctx, l, (int)s) : 0;
    }
    case TR_MSG_ENGINE_REQ:
        if (TR_MSG_AS(msg, engine_req)->kind == TR__REQ_RESEEK) {
            int rc = tr__dataset_seek(e->train, e->resume);
            if (rc < 0) {
                tr__engine_reply(e, rc, "loader: cannot seek to epoch %llu, sample %llu",
                                 (unsigned long long)e->resume.epoch,
                                 (unsigned long long)e->resume.cursor);
                return 0;
            }
            l->gen = atomic_load(&e->data_gen);
        } else {
            l->started = true;
        }
        return l->started ? fill_free_slots(ctx, l) : 0;
    default:
        return 0; /* TR_MSG_STOP: the engine stops its actors itself */
    }
}

int tr__loader_spawn(tr_engine_t *eng)
{
    struct tr__loader *l = calloc(1, sizeof(*l));
    if (!l) return TR_ENOMEM;
    l->eng = eng;
    l->n_slots = eng->prefetch;
    size_t bt = (size_t)eng->B * (size_t)eng->T;
    l->in_floats = eng->x_dim ? bt * (size_t)eng->x_dim : bt;
    for (int s = 0; s < l->n_slots; s++) {
        l->slot_mem[s] = aligned_alloc(64, ((l->in_floats + bt) * 4 + 63) & ~(size_t)63);
        if (!l->slot_mem[s]) return TR_ENOMEM; /* freed by tr__loader_free */
        eng->buffers[BUF_SLOT0 + s] = l->slot_mem[s];
    }
    eng->ld = l;
    tr_actor_opts_t o = {.name = "loader",
                         .defer_stop = 1,
                         .supervisor = eng->supervisor,
                         .lane_kind = TR_LANE_DATA};
    return tr_actor_spawn(eng->rt, loader_behaviour, l, &o, &eng->loader);
}

void tr__loader_free(tr_engine_t *eng)
{
    struct tr__loader *l = eng->ld;
    if (!l) return;
    for (int s = 0; s < TR__MAX_PREFETCH; s++)
        free(l->slot_mem[s]);
    free(l);
    eng->ld = NULL;
}
