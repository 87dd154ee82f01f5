/* fetcher.c: the parameter actor of ZeRO 3. Each rank keeps its slice of the flat parameters
 * (tr__zero_owned, the optimizer's) and, whole, the layers under
 * zero_optimization.param_persistence_threshold (up to model_persistence_threshold elements in
 * all); every other layer's parameters are all-gathered into the parameter buffer just before
 * the executor needs them and handed back to the kernel after.
 *
 * A pass (the forward of a micro-batch, its backward, or a forward alone) starts with a
 * PARAM_FETCH from the executor. The fetcher walks the pass's layers in order (the backward's
 * from the last), asking the comm actor for each layer's all-gather (COMM_GATHER of its range;
 * with its tied tensor's layer, GPT-2's head reading the embedding's wte) ahead of the
 * executor, while the layers fetched and not yet used stay within prefetch_bucket_size
 * elements and the gathered ones within max_live_parameters (always at least one layer). A
 * layer whose parameters are whole is answered with PARAM_READY; the executor runs it only
 * then, and says when it is done with it. A used layer's range is released, unless the same
 * pass or the next one (a forward's backward, a backward's next forward) uses it again within
 * max_reuse_distance elements of other layers' fetches: GPT-2's last blocks go from the
 * forward into the backward without a second all-gather. A step or a restore rewrites the
 * parameters: the executor's next pass carries a new version, and every copy of an older one
 * is dropped (the persistent layers are gathered again from the new slices).
 *
 * MPI wants every rank to post its collectives on a communicator in the same order. The
 * fetcher's all-gathers and the backward's gradient buckets would reach the comm actor from two
 * actors, in an order that differs from rank to rank; so at stage 3 the fetcher also packs the
 * buckets (the bucketer's code, tr__buckets_add): the executor's GRAD_READY and PARAM_FETCH
 * messages reach it in one stream, in the executor's order, and a gather leaves only in answer
 * to one of them (never to a gather's completion), so every rank sends the comm actor the same
 * sequence.
 *
 * The fetcher owns the residency of the parameter buffer outside this rank's slice: it alone
 * gathers and releases there. The executor reads a layer between PARAM_READY and its own
 * PARAM_FETCH "done"; the optimizer writes only the slice, between the last gradient bucket and
 * STEP_DONE, when no pass is running.
 *
 * With zero_optimization.offload_param the slice lives elsewhere, and the parameter buffer
 * holds only the gathered layers (and the persistent ones): "cpu", in its own host buffer
 * (plan.buf_param_home), copied into place before a layer's all-gather; "nvme", in the
 * swapper's parameter file, read into place by a READ_PARAMS the fetcher sends as it decides
 * the gather. The gather itself then waits in a queue that also holds the gradient buckets, and
 * leaves once its slice is read: the comm actor gets every collective in the order it was
 * decided, the same on every rank, and the read of the next layers overlaps the compute of
 * this one (prefetch_bucket_size ahead). The optimizer steps the slice where it lives; a restore
 * writes the restored slice back there (TR__FETCH_REWRITTEN).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/comm/comm_spawn.h"
#include "actors/engine/plan.h"
#include "base/fifo.h"
#include "base/vmem.h"
#include "kernels/cpu/half.h"

enum { U_ABSENT, U_FLIGHT, U_LIVE };

typedef struct unit { /* a layer's parameter range */
    size_t off, count;
    bool persistent;  /* stays whole; gathered again after each step */
    int state;        /* U_ABSENT, U_FLIGHT, U_LIVE */
    uint64_t version; /* of the copy gathered or in flight */
    int in_use;       /* layers of the pass that fetched it and are not done with it */
    bool loaded;      /* offload_param nvme: the slice of the gather in flight is read */
} unit_t;

/* A collective waiting for its turn (offload_param nvme): a gather of unit `unit` until its
 * slice is read, or a gradient bucket (unit -1) behind one. */
typedef struct queued {
    tr_msg_t *m;
    int unit;
} queued_t;

struct tr__fetcher {
    const tr__plan_t *eng;
    float *params;
    uint16_t *bf16; /* the model's bf16 copies (bf16 mixed precision), or NULL */
    int L;
    unit_t *u;
    /* per direction (0: a forward, 1: a backward): the layers that read parameters
     * (tr__layer_fetched), in the pass's order (a pass's positions), and for each layer the
     * units it reads (list[d][off[d][i] .. off[d][i + 1]): its own, and its tied tensor's
     * owner's; a checkpointed group's, whose backward runs its forward again) and their size */
    int F[2], *order[2], *off[2], *list[2];
    size_t *size[2];
    size_t lo, hi;          /* this rank's slice */
    size_t prefetch, limit; /* prefetch_bucket_size, max_live_parameters (elements) */
    size_t reuse;           /* max_reuse_distance */
    size_t live;            /* non-persistent elements gathered or in flight */
    size_t ahead;           /* elements fetched for layers the executor has not finished */
    uint64_t version, step;
    /* the pass */
    uint32_t id;
    int pass;       /* TR__PASS_*; 0: none */
    int next, done; /* positions (of the pass's F) fetched, and finished by the executor */
    bool *answered; /* per position: PARAM_READY sent */
    bool all;       /* a save waits for every layer */
    uint32_t all_id;
    tr__buckets_t buckets; /* the gradient buckets, packed here (see the top) */
    int offload;           /* plan.param_offload: where the slice lives */
    float *home;           /* offload_param cpu: the slice (hi - lo floats) */
    tr__fifo_t queue;      /* offload_param nvme: collectives (queued_t) in decision order */
};

static int dir(int pass)
{
    return pass == TR__PASS_BACKWARD;
}

static int layer_at(const struct tr__fetcher *f, int pass, int pos)
{
    return f->order[dir(pass)][pos];
}

/* The units layer i reads in `pass` (k of them, at *out). */
static int needs(const struct tr__fetcher *f, int pass, int i, const int **out)
{
    int d = dir(pass);
    *out = f->list[d] + f->off[d][i];
    return f->off[d][i + 1] - f->off[d][i];
}

static size_t layer_size(const struct tr__fetcher *f, int pass, int i)
{
    return f->size[dir(pass)][i];
}

static bool current(const struct tr__fetcher *f, const unit_t *u)
{
    return u->state != U_ABSENT && u->version == f->version;
}

/* A unit's pages outside this rank's slice go back to the kernel (all of them when the slice
 * lives elsewhere). */
static void release_pages(struct tr__fetcher *f, const unit_t *u)
{
    size_t keep = f->offload ? u->off : f->lo, keep_end = f->offload ? u->off : f->hi;
    tr__release_outside(f->params, f->bf16, u->off, u->off + u->count, keep, keep_end);
}

/* The part [*a, *b) of unit u in this rank's slice (empty: *a == *b). */
static void slice_of(const struct tr__fetcher *f, const unit_t *u, size_t *a, size_t *b)
{
    *a = u->off > f->lo ? u->off : f->lo;
    *b = u->off + u->count < f->hi ? u->off + u->count : f->hi;
    if (*b < *a) *b = *a;
}

/* offload_param nvme: asks the swapper to read parameters [a, b) of the slice into the same
 * range of the parameter buffer, for unit `unit`'s gather. */
static int read_slice(tr_ctx_t *ctx, struct tr__fetcher *f, size_t a, size_t b, int unit)
{
    const tr__plan_t *e = f->eng;
    tr_tensor_ref_t ref;
    int rc = tr_buffer_ref(e->rt, e->buf_params, a * sizeof(float), (b - a) * sizeof(float),
                           TR_DTYPE_F32, &ref);
    return rc < 0 ? rc
                  : tr__swap_ask(ctx, e->swapper, TR__SWAP_READ_PARAMS, a, (uint32_t)unit, ref,
                                 f->step);
}

/* Sends the queue's collectives from its head while they are ready. */
static int flush(tr_ctx_t *ctx, struct tr__fetcher *f)
{
    queued_t *h;
    while ((h = tr__fifo_front(&f->queue))) {
        if (h->unit >= 0 && !f->u[h->unit].loaded) return 0;
        int rc = tr_actor_send(ctx->rt, f->eng->comm, h->m);
        if (rc < 0) return rc; /* the message stays queued: destroy frees it */
        tr__fifo_pop(&f->queue);
    }
    return 0;
}

/* Queues collective m (unit -1: a bucket), taking it over unless it fails (no memory), and
 * sends what is ready (a failure to send fails the engine: the message stays queued, freed at
 * destroy). */
static int enqueue(tr_ctx_t *ctx, struct tr__fetcher *f, tr_msg_t *m, int unit)
{
    if (tr__fifo_push(&f->queue, &(queued_t){m, unit}) < 0) return TR_ENOMEM;
    int rc = flush(ctx, f);
    if (rc < 0)
        tr__engine_fail(f->eng, rc, "fetcher: cannot send a collective to the comm actor: %s",
                        tr_strerror(rc));
    return 0;
}

static int queue_bucket(tr_ctx_t *ctx, void *arg, tr_msg_t *m)
{
    return enqueue(ctx, arg, m, -1);
}

/* Drops a gathered copy (never one in flight: MPI is writing it). */
static void release(struct tr__fetcher *f, unit_t *u)
{
    if (u->state != U_LIVE) return;
    release_pages(f, u);
    if (!u->persistent) f->live -= u->count;
    u->state = U_ABSENT;
}

static int gather(tr_ctx_t *ctx, struct tr__fetcher *f, int i)
{
    const tr__plan_t *e = f->eng;
    unit_t *u = &f->u[i];
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_COMM_GATHER);
    if (!m) return TR_ENOMEM;
    tr_msg_comm_gather_t *g = TR_MSG_AS(m, comm_gather);
    g->count = tr__zero_slice(e->n_params, e->world);
    int rc = tr_buffer_ref(e->rt, e->buf_params, u->off * sizeof(float), u->count * sizeof(float),
                           TR_DTYPE_F32, &g->buf);
    m->step = f->step;
    size_t a, b;
    slice_of(f, u, &a, &b);
    if (rc == 0 && f->offload == TR_OFFLOAD_CPU) /* the slice into place first */
        memcpy(f->params + a, f->home + (a - f->lo), (b - a) * sizeof(float));
    if (rc == 0 && f->offload == TR_OFFLOAD_NVME) { /* the read, then the gather in turn */
        u->loaded = b == a;
        if (!u->loaded) rc = read_slice(ctx, f, a, b, i);
        if (rc == 0) rc = enqueue(ctx, f, m, i);
    } else if (rc == 0) {
        rc = tr_actor_send(ctx->rt, e->comm, m);
    }
    if (rc < 0) {
        tr_msg_free(ctx->rt, m);
        return rc;
    }
    if (!u->persistent && u->state == U_ABSENT) f->live += u->count;
    u->state = U_FLIGHT;
    u->version = f->version;
    return 0;
}

/* Elements of other layers fetched from position pos of `pass` on before unit t is used again
 * (through the next pass: a forward's backward, a backward's next forward), or SIZE_MAX when
 * neither uses it. */
static size_t reuse_distance(const struct tr__fetcher *f, int t, int pass, int pos)
{
    int next = pass == TR__PASS_FORWARD    ? TR__PASS_BACKWARD
               : pass == TR__PASS_BACKWARD ? TR__PASS_FORWARD
                                           : TR__PASS_FORWARD_ALONE;
    size_t d = 0;
    for (int round = 0; round < 2; round++) {
        int p = round ? next : pass;
        for (int k = round ? 0 : pos; k < f->F[dir(p)]; k++) {
            const int *n;
            int i = layer_at(f, p, k), c = needs(f, p, i, &n);
            for (int j = 0; j < c; j++)
                if (n[j] == t) return d;
            d += layer_size(f, p, i);
        }
    }
    return SIZE_MAX;
}

/* Room for `want` more live elements: idle copies (no layer of the pass holds them) are
 * dropped, those used again latest first. */
static void make_room(struct tr__fetcher *f, size_t want)
{
    while (f->live + want > f->limit) {
        int worst = -1;
        size_t far = 0;
        for (int i = 0; i < f->L; i++) {
            unit_t *u = &f->u[i];
            if (u->persistent || u->state != U_LIVE || u->in_use) continue;
            size_t d = reuse_distance(f, i, f->pass, f->next);
            if (worst < 0 || d > far) {
                worst = i;
                far = d;
            }
        }
        if (worst < 0) return;
        release(f, &f->u[worst]);
    }
}

/* Answers every fetched layer whose units are all whole. */
static int answer(tr_ctx_t *ctx, struct tr__fetcher *f)
{
    const tr__plan_t *e = f->eng;
    for (int p = f->done; f->pass && p < f->next; p++) {
        const int *n;
        int i = layer_at(f, f->pass, p), k = needs(f, f->pass, i, &n);
        bool whole = !f->answered[p];
        for (int j = 0; j < k && whole; j++)
            whole = f->u[n[j]].state == U_LIVE && current(f, &f->u[n[j]]);
        if (!whole) continue;
        f->answered[p] = true;
        tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_PARAM_READY);
        if (!m) return TR_ENOMEM;
        *TR_MSG_AS(m, param_ready) = (tr_msg_param_ready_t){.layer = (uint32_t)i, .id = f->id};
        m->step = f->step;
        int rc = tr_actor_send(ctx->rt, e->executor, m);
        if (rc < 0) {
            tr_msg_free(ctx->rt, m);
            return rc;
        }
    }
    if (f->all) {
        for (int i = 0; i < f->L; i++)
            if (f->u[i].count && !(f->u[i].state == U_LIVE && current(f, &f->u[i]))) return 0;
        f->all = false;
        tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_PARAM_READY);
        if (!m) return TR_ENOMEM;
        *TR_MSG_AS(m, param_ready) =
            (tr_msg_param_ready_t){.layer = (uint32_t)f->L, .id = f->all_id};
        int rc = tr_actor_send(ctx->rt, e->executor, m);
        if (rc < 0) tr_msg_free(ctx->rt, m);
        return rc;
    }
    return 0;
}

/* Fetches the pass's next layers while the windows allow (one layer always). */
static int pump(tr_ctx_t *ctx, struct tr__fetcher *f)
{
    while (f->pass && f->next < f->F[dir(f->pass)]) {
        const int *n;
        int i = layer_at(f, f->pass, f->next), k = needs(f, f->pass, i, &n);
        size_t size = layer_size(f, f->pass, i), fresh = 0;
        bool stale_flight = false; /* an older version's gather still writes there */
        for (int j = 0; j < k; j++) {
            const unit_t *u = &f->u[n[j]];
            if (!current(f, u) && !u->persistent) fresh += u->count;
            stale_flight |= u->state == U_FLIGHT && !current(f, u);
        }
        if (stale_flight) break; /* its COMM_GATHER answer pumps again */
        if (f->ahead && f->ahead + size > f->prefetch) break;
        if (fresh) make_room(f, fresh);
        if (fresh && f->ahead && f->live + fresh > f->limit) break;
        for (int j = 0; j < k; j++) {
            unit_t *u = &f->u[n[j]];
            u->in_use++;
            if (current(f, u)) continue;
            release(f, u); /* an older version's copy */
            int rc = gather(ctx, f, n[j]);
            if (rc < 0) return rc;
        }
        f->ahead += size;
        f->next++;
    }
    return answer(ctx, f);
}

/* Tells the executor that a restore's slice is stored (PARAM_READY, layer L + 1). */
static int restored(tr_ctx_t *ctx, struct tr__fetcher *f, uint32_t id)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_PARAM_READY);
    if (!m) return TR_ENOMEM;
    *TR_MSG_AS(m, param_ready) = (tr_msg_param_ready_t){.layer = (uint32_t)f->L + 1, .id = id};
    m->step = f->step;
    int rc = tr_actor_send(ctx->rt, f->eng->executor, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    return rc;
}

/* offload_param: a restore's parameters (r->src, the checkpoint's copy, which stays until the
 * executor answers the checkpointer) go where the slice lives: its home (cpu), at once, or the
 * swapper's file (nvme), answered when written. The parameter buffer is not involved, so no
 * release of its pages can meet the copy. */
static int store_restored(tr_ctx_t *ctx, struct tr__fetcher *f, const tr_msg_param_fetch_t *r)
{
    void *src = NULL;
    char why[256];
    if (tr_buffer_resolve(f->eng->rt, &r->src, &src, why, sizeof(why)) != 0 ||
        r->src.length < f->hi * sizeof(float)) {
        tr__engine_fail(f->eng, TR_EINVAL, "fetcher: the restored parameters: %s",
                        src ? "shorter than this rank's slice" : why);
        return TR_EINVAL;
    }
    if (f->offload == TR_OFFLOAD_CPU || f->hi == f->lo) {
        memcpy(f->home, (const float *)src + f->lo, (f->hi - f->lo) * sizeof(float));
        return restored(ctx, f, r->id);
    }
    tr_tensor_ref_t slice = r->src;
    slice.offset += f->lo * sizeof(float);
    slice.length = (f->hi - f->lo) * sizeof(float);
    return tr__swap_ask(ctx, f->eng->swapper, TR__SWAP_WRITE_PARAMS, f->lo, r->id, slice, f->step);
}

static int on_fetch(tr_ctx_t *ctx, struct tr__fetcher *f, tr_msg_t *msg)
{
    const tr_msg_param_fetch_t *r = TR_MSG_AS(msg, param_fetch);
    if (r->kind == TR__FETCH_PASS || r->kind == TR__FETCH_ALL) {
        f->step = msg->step;
        if (r->version != f->version) { /* the parameters moved: older copies are stale */
            f->version = r->version;
            for (int i = 0; i < f->L; i++)
                if (f->u[i].state == U_LIVE) release(f, &f->u[i]);
        }
    }
    switch (r->kind) {
    case TR__FETCH_PASS: /* a pass starts; an unfinished one (a failed layer) is dropped */
        for (int i = 0; i < f->L; i++)
            f->u[i].in_use = 0;
        f->pass = (int)r->pass;
        f->id = r->id;
        f->next = f->done = 0;
        f->ahead = 0;
        memset(f->answered, 0, (size_t)f->L * sizeof(bool));
        make_room(f, 0); /* what a save or a gather of every layer left beyond the limit */
        return pump(ctx, f);
    case TR__FETCH_DONE: { /* the executor is done with a layer of the pass */
        if (r->id != f->id || !f->pass || f->done >= f->next ||
            layer_at(f, f->pass, f->done) != (int)r->layer)
            return 0; /* of a pass dropped since */
        const int *n;
        int i = (int)r->layer, k = needs(f, f->pass, i, &n);
        f->ahead -= layer_size(f, f->pass, i);
        f->done++;
        for (int j = 0; j < k; j++) {
            unit_t *u = &f->u[n[j]];
            if (--u->in_use > 0 || u->persistent || u->state != U_LIVE) continue;
            if (reuse_distance(f, n[j], f->pass, f->done) > f->reuse) release(f, u);
        }
        if (f->done == f->F[dir(f->pass)]) f->pass = 0;
        return pump(ctx, f);
    }
    case TR__FETCH_ALL: /* a save: every layer whole, outside any window */
        f->all = true;
        f->all_id = r->id;
        for (int i = 0; i < f->L; i++) {
            unit_t *u = &f->u[i];
            if (!u->count || current(f, u) || u->state == U_FLIGHT) continue;
            release(f, u);
            int rc = gather(ctx, f, i);
            if (rc < 0) return rc;
        }
        return answer(ctx, f);
    case TR__FETCH_REWRITTEN: /* a restore (no pass runs): back to the slice */
        f->version = r->version;
        for (int i = 0; i < f->L; i++) {
            unit_t *u = &f->u[i];
            if (u->state == U_FLIGHT) continue; /* stale when it lands */
            if (u->state == U_LIVE && !u->persistent) f->live -= u->count;
            release_pages(f, u);
            u->state = U_ABSENT;
        }
        return f->offload ? store_restored(ctx, f, r) : 0;
    }
    tr__engine_fail(f->eng, TR_EINVAL, "fetcher: unknown request %u", r->kind);
    return TR_EINVAL;
}

static int on_gathered(tr_ctx_t *ctx, struct tr__fetcher *f, const tr_msg_comm_gather_t *g)
{
    if (g->rc < 0) return 0; /* the comm actor has failed the engine, naming the collective */
    size_t off = g->buf.offset / sizeof(float);
    int lo = 0, hi = f->L - 1; /* the units are in offset order; find the one at off */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (f->u[mid].off + f->u[mid].count <= off ||
            (f->u[mid].count == 0 && f->u[mid].off <= off))
            lo = mid + 1;
        else
            hi = mid;
    }
    unit_t *u = &f->u[lo];
    if (u->off != off || u->state != U_FLIGHT) {
        tr__engine_fail(f->eng, TR_EINVAL,
                        "fetcher: an all-gather of parameters [%zu, +%zu) nobody asked for", off,
                        (size_t)(g->buf.length / sizeof(float)));
        return TR_EINVAL;
    }
    u->state = U_LIVE; /* of its version: an older one's is dropped by the next pump */
    if (f->bf16)       /* bf16 mixed precision: the layer's products read bf16 copies */
        tr_half_from_float_array(f->bf16 + u->off, f->params + u->off, u->count, TR_HALF_BF16);
    return pump(ctx, f);
}

/* offload_param nvme: the swapper read a gather's slice into place (its turn in the queue may
 * have come), or wrote a restore's slice (the buffer's copy can go). */
static int on_swapped(tr_ctx_t *ctx, struct tr__fetcher *f, const tr_msg_swap_t *q)
{
    if (q->rc < 0) return 0; /* the swapper has failed the engine, naming the file */
    if (q->op == TR__SWAP_WRITE_PARAMS) return restored(ctx, f, q->tag);
    if (q->tag >= (uint32_t)f->L || f->u[q->tag].state != U_FLIGHT || f->u[q->tag].loaded) {
        tr__engine_fail(f->eng, TR_EINVAL,
                        "fetcher: a parameter read for layer %u nobody asked for", q->tag);
        return TR_EINVAL;
    }
    f->u[q->tag].loaded = true;
    return flush(ctx, f);
}

static int fetcher_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    struct tr__fetcher *f = ctx->state;
    int rc = 0;
    if (msg->type == TR_MSG_PARAM_FETCH) rc = on_fetch(ctx, f, msg);
    if (msg->type == TR_MSG_GRAD_READY)
        rc = tr__buckets_add(ctx, &f->buckets, TR_MSG_AS(msg, grad_ready), msg->step);
    if (msg->type == TR_MSG_COMM_GATHER) rc = on_gathered(ctx, f, TR_MSG_AS(msg, comm_gather));
    if (msg->type == TR_MSG_SWAP) rc = on_swapped(ctx, f, TR_MSG_AS(msg, swap));
    if (rc < 0)
        tr__engine_fail(f->eng, rc, "fetcher: cannot fetch parameters: %s", tr_strerror(rc));
    return 0;
}

static void free_fetcher(struct tr__fetcher *f)
{
    for (int d = 0; d < 2; d++) {
        free(f->order[d]);
        free(f->off[d]);
        free(f->list[d]);
        free(f->size[d]);
    }
    free(f->u);
    free(f->answered);
    tr__fifo_free(&f->queue);
    free(f);
}

/* The pass orders and what each layer reads (see the state). */
static int plan_passes(struct tr__fetcher *f, const tr_model_t *m)
{
    for (int d = 0; d < 2; d++) {
        size_t cap = 0;
        for (int i = 0; i < f->L; i++)
            cap += 2 * (size_t)(i - (d ? tr__backward_from(m, i) : i) + 1);
        f->order[d] = calloc((size_t)f->L, sizeof(int));
        f->off[d] = calloc((size_t)f->L + 1, sizeof(int));
        f->list[d] = calloc(cap ? cap : 1, sizeof(int));
        f->size[d] = calloc((size_t)f->L, sizeof(size_t));
        if (!f->order[d] || !f->off[d] || !f->list[d] || !f->size[d]) return TR_ENOMEM;
        int k = 0;
        for (int i = 0; i < f->L; i++) {
            f->off[d][i] = k;
            for (int j = d ? tr__backward_from(m, i) : i; j <= i; j++) {
                int own[2] = {j, tr__layer_tie(m, j)};
                for (int q = 0; q < 2; q++) {
                    int t = own[q], seen = 0;
                    for (int c = f->off[d][i]; c < k && !seen; c++)
                        seen = f->list[d][c] == t;
                    if (t < 0 || !f->u[t].count || seen) continue;
                    f->list[d][k++] = t;
                    f->size[d][i] += f->u[t].count;
                }
            }
        }
        f->off[d][f->L] = k;
        for (int i = 0; i < f->L; i++) {
            int at = d ? f->L - 1 - i : i; /* a backward's from the last */
            if (tr__layer_fetched(m, at, d)) f->order[d][f->F[d]++] = at;
        }
    }
    return 0;
}

static void free_state(tr_ctx_t *ctx, int reason)
{
    (void)reason;
    struct tr__fetcher *f = ctx->state;
    for (queued_t *h; (h = tr__fifo_front(&f->queue)); tr__fifo_pop(&f->queue))
        tr_msg_free(ctx->rt, h->m); /* a failed engine's, never sent */
    free_fetcher(f);
}

int tr__fetcher_spawn(const tr__plan_t *eng, tr_actor_t *self, char *err, size_t errlen)
{
    const tr_config_t *c = eng->cfg;
    const tr_model_t *m = eng->model;
    struct tr__fetcher *f = calloc(1, sizeof(*f));
    tr_buffer_info_t info;
    if (!f) return TR_ENOMEM;
    f->eng = eng;
    tr__buckets_init(&f->buckets, eng);
    tr__fifo_init(&f->queue, sizeof(queued_t));
    f->L = tr_model_num_layers(m);
    f->u = calloc((size_t)f->L, sizeof(*f->u));
    f->answered = calloc((size_t)f->L, sizeof(bool));
    int rc = f->u && f->answered ? tr_buffer_info(eng->rt, eng->buf_params, &info) : TR_ENOMEM;
    for (int i = 0; rc == 0 && i < f->L; i++) {
        f->u[i].off = tr_model_layer(m, i)->param_offset;
        f->u[i].count = tr_model_layer(m, i)->param_count;
    }
    if (rc == 0) rc = plan_passes(f, m);
    if (rc < 0) {
        free_fetcher(f);
        return rc;
    }
    f->params = info.base;
    if (eng->buf_params_bf16) {
        tr_buffer_info_t b16;
        if ((rc = tr_buffer_info(eng->rt, eng->buf_params_bf16, &b16)) < 0) {
            free_fetcher(f);
            return rc;
        }
        f->bf16 = b16.base;
    }
    tr__zero_owned(eng->n_params, eng->world, eng->rank, &f->lo, &f->hi);
    f->offload = eng->param_offload;
    if (f->offload == TR_OFFLOAD_CPU) {
        if ((rc = tr_buffer_info(eng->rt, eng->buf_param_home, &info)) < 0) {
            free_fetcher(f);
            return rc;
        }
        f->home = info.base;
    }
    if (f->offload == TR_OFFLOAD_NVME) { /* the buckets wait behind gathers in the queue */
        f->buckets.send = queue_bucket;
        f->buckets.send_arg = f;
    }
    f->prefetch = (size_t)c->zero.prefetch_bucket_size;
    f->limit = (size_t)c->zero.max_live_parameters;
    f->reuse = (size_t)c->zero.max_reuse_distance;
    size_t kept = 0, gathered = 0;
    int n_kept = 0;
    for (int i = 0; i < f->L; i++) {
        unit_t *u = &f->u[i];
        u->persistent = tr__persists(u->count, kept, c);
        if (u->persistent) { /* the initial parameters are whole: version 0's copy */
            u->state = U_LIVE;
            kept += u->count;
            n_kept++;
        } else { /* all but this rank's slice back to the kernel */
            release_pages(f, u);
            gathered += u->count;
        }
    }
    tr_actor_opts_t o = {.name = "fetcher",
                         .defer_stop = 1, /* a signal's stop: the step in flight needs it */
                         .supervisor = eng->supervisor,
                         .cleanup = free_state,
                         .lane_kind = TR_LANE_DATA};
    rc = tr_actor_spawn(eng->rt, fetcher_behaviour, f, &o, self);
    if (rc < 0) {
        free_fetcher(f);
        return tr__errf(err, errlen, rc, "fetcher: cannot start: %s", tr_strerror(rc));
    }
    if (eng->rank == 0)
        tr_log(TR_LOG_INFO,
               "fetcher: ZeRO stage 3: each rank keeps its slice of %zu parameters%s; %d "
               "layer(s) of %zu elements stay whole (param_persistence_threshold %lld), %zu "
               "elements are gathered layer by layer (prefetch_bucket_size %zu, "
               "max_live_parameters %zu, max_reuse_distance %zu)",
               eng->n_params,
               f->offload == TR_OFFLOAD_CPU    ? " in its own host buffer (offload_param cpu)"
               : f->offload == TR_OFFLOAD_NVME ? " in a swap file (offload_param nvme)"
                                               : "",
               n_kept, kept, (long long)c->zero.param_persistence_threshold, gathered, f->prefetch,
               f->limit, f->reuse);
    return 0;
}
