/* loader.c: the loader actor. It keeps `prefetch` batch slots, each registered in the buffer
 * registry; each filled slot is sent to the executor as a BATCH (tensor references into the
 * slot, never a copy) and comes back as a CREDIT when the executor is done with it, then is
 * refilled. So the loader is never more than `prefetch` batches ahead, and its memory is fixed
 * at start-up.
 *
 * It starts filling on the first TRAIN (so a checkpoint loaded before training positions the
 * stream without waste). A LOADER_SEEK (after a checkpoint load) moves the stream and starts a
 * new data generation; batches already sent carry the old one and the executor drops and
 * credits them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/data/loader.h"
#include "actors/engine/plan.h"

typedef struct slot {
    void *in;     /* (B, T) int tokens or (B, T, x_dim) floats */
    int *targets; /* (B, T), or NULL for a float-target model */
    float *y;     /* (B, T, y_dim), or NULL */
    uint64_t id_in, id_targets, id_y;
    bool out; /* sent, waiting for its credit */
} slot_t;

struct tr__loader {
    const tr__plan_t *eng;
    tr__dataset_t *data;
    int n_slots;
    slot_t slots[TR__MAX_PREFETCH];
    bool started;
    uint32_t gen;
    uint64_t step; /* the step of the last credit: a refill belongs to it in a trace */
    char err[512];
};

/* A reference to a whole slot array of (B, T) or, with ndim 3, (B, T, width) elements. */
static tr_tensor_ref_t ref(const tr__plan_t *e, uint64_t id, int dtype, int width, int ndim)
{
    if (!id) return (tr_tensor_ref_t){0}; /* none */
    tr_tensor_ref_t r = {.buffer_id = id,
                         .length = (uint64_t)e->B * (uint64_t)e->T * (uint64_t)width * 4,
                         .dtype = (uint8_t)dtype,
                         .device_type = TR_DEVICE_CPU,
                         .ndim = (uint8_t)ndim};
    r.shape[0] = e->B;
    r.shape[1] = e->T;
    r.shape[2] = width;
    return r;
}

/* Fills slot s from the dataset and sends it. */
static int fill(tr_ctx_t *ctx, struct tr__loader *l, int s)
{
    const tr__plan_t *e = l->eng;
    slot_t *sl = &l->slots[s];
    tr__data_pos_t before = tr__dataset_pos(l->data);
    bool wrapped;
    int rc = tr__dataset_next(l->data, e->x_dim ? NULL : sl->in, e->x_dim ? sl->in : NULL,
                              sl->targets, sl->y, &wrapped, l->err, sizeof(l->err));
    if (rc < 0) { /* the stream cannot go on: the engine fails with this explanation */
        tr__engine_fail(e, rc, "loader: %s", l->err);
        return rc;
    }
    if (wrapped)
        tr_log(TR_LOG_INFO, "loader: epoch %llu done; starting epoch %llu",
               (unsigned long long)before.epoch,
               (unsigned long long)tr__dataset_pos(l->data).epoch);
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_BATCH);
    if (!m) return TR_ENOMEM;
    tr_msg_batch_t *b = TR_MSG_AS(m, batch);
    tr__data_pos_t after = tr__dataset_pos(l->data);
    *b = (tr_msg_batch_t){.slot = (uint32_t)s,
                          .gen = l->gen,
                          .index = before.batch_index,
                          .epoch = after.epoch,
                          .cursor = after.cursor,
                          .tokens = ref(e, sl->id_in, e->x_dim ? TR_DTYPE_F32 : TR_DTYPE_I32,
                                        e->x_dim ? e->x_dim : 1, e->x_dim ? 3 : 2),
                          .targets = ref(e, sl->id_targets, TR_DTYPE_I32, 1, 2),
                          .y = ref(e, sl->id_y, TR_DTYPE_F32, e->y_dim, 3)};
    m->step = l->step;
    sl->out = true;
    rc = tr_actor_send(ctx->rt, e->executor, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    return rc;
}

static int fill_free_slots(tr_ctx_t *ctx, struct tr__loader *l)
{
    for (int s = 0; s < l->n_slots; s++)
        if (!l->slots[s].out) {
            int rc = fill(ctx, l, s);
            if (rc < 0) return rc;
        }
    return 0;
}

static int seek(tr_ctx_t *ctx, struct tr__loader *l, const tr_msg_loader_seek_t *s)
{
    tr__data_pos_t pos = {s->epoch, s->cursor, s->batch_index};
    int rc = tr__dataset_seek(l->data, pos);
    if (rc < 0) {
        tr__engine_fail(l->eng, rc,
                        "loader: cannot continue the data stream at epoch %llu, "
                        "sample %llu: %s",
                        (unsigned long long)pos.epoch, (unsigned long long)pos.cursor,
                        tr_strerror(rc));
        return 0;
    }
    l->gen = s->gen;
    return l->started ? fill_free_slots(ctx, l) : 0;
}

static int loader_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    struct tr__loader *l = ctx->state;
    switch (msg->type) {
    case TR_MSG_CREDIT: {
        uint32_t s = TR_MSG_AS(msg, credit)->slot;
        if (s >= (uint32_t)l->n_slots || !l->slots[s].out)
            return TR_EINVAL; /* an engine bug: fail loudly */
        l->slots[s].out = false;
        l->step = msg->step;
        return l->started ? fill(ctx, l, (int)s) : 0;
    }
    case TR_MSG_LOADER_SEEK:
        return seek(ctx, l, TR_MSG_AS(msg, loader_seek));
    case TR_MSG_ENGINE_REQ: /* START */
        l->started = true;
        l->step = msg->step;
        return fill_free_slots(ctx, l);
    default:
        return 0; /* TR_MSG_STOP: the engine stops its actors itself */
    }
}

/* Allocates and registers one array of a slot; none when width is 0. */
static int slot_array(const tr__plan_t *eng, int s, const char *what, int dtype, int width,
                      void **mem, uint64_t *id)
{
    if (!width) return 0;
    tr_buffer_info_t info = {.bytes = (size_t)eng->B * (size_t)eng->T * (size_t)width * 4,
                             .dtype = (uint8_t)dtype,
                             .owner = eng->loader,
                             .lifetime = TR_BUFFER_RUNTIME};
    snprintf(info.name, sizeof(info.name), "loader/slot%d/%s", s, what);
    return tr_buffer_alloc_host(eng->rt, &info, mem, id);
}

int tr__loader_spawn(const tr__plan_t *eng, tr__dataset_t *train, struct tr__loader **state,
                     tr_actor_t *self)
{
    struct tr__loader *l = calloc(1, sizeof(*l));
    if (!l) return TR_ENOMEM;
    *state = l;
    l->eng = eng;
    l->data = train;
    l->n_slots = eng->prefetch;
    tr_actor_opts_t o = {.name = "loader",
                         .defer_stop = 1,
                         .supervisor = eng->supervisor,
                         .lane_kind = TR_LANE_DATA};
    int rc = tr_actor_spawn(eng->rt, loader_behaviour, l, &o, self);
    for (int s = 0; s < l->n_slots && rc == 0; s++) {
        slot_t *sl = &l->slots[s];
        rc = slot_array(eng, s, "inputs", eng->x_dim ? TR_DTYPE_F32 : TR_DTYPE_I32,
                        eng->x_dim ? eng->x_dim : 1, &sl->in, &sl->id_in);
        if (rc == 0)
            rc = slot_array(eng, s, "targets", TR_DTYPE_I32, eng->y_dim ? 0 : 1,
                            (void **)&sl->targets, &sl->id_targets);
        if (rc == 0)
            rc = slot_array(eng, s, "y", TR_DTYPE_F32, eng->y_dim, (void **)&sl->y, &sl->id_y);
    }
    return rc; /* the slots are freed by tr__loader_free */
}

void tr__loader_free(struct tr__loader *l)
{
    if (!l) return;
    for (int s = 0; s < TR__MAX_PREFETCH; s++) {
        free(l->slots[s].in);
        free(l->slots[s].targets);
        free(l->slots[s].y);
    }
    free(l);
}
