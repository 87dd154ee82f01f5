/* link.c: the actor that carries a pipeline stage's transfers to and from the stages on
 * other ranks (a pipeline with across_ranks, run.c), through the comm layer's point-to-point
 * operations (MPI_Isend / MPI_Irecv with the MPI backend).
 *
 * A transfer travels as its PIPE_XFER message in canonical msgpack (tr_msg_encode), so it means
 * the same on any rank, in a frame of FRAME bytes whose first 4 hold the encoding's length (a
 * receive does not learn the length MPI received); the tag is the transfer's kind. When it
 * names a tensor (a reference into the sending stage's registered send area), the tensor's
 * bytes follow as a second message (tag: kind | PAYLOAD), which the receiving link lands in a
 * registered area of its own, slot micro-batch mod the slots the sender's schedule keeps, and
 * the reference is rewritten to name that slot: the stage resolves it as in one process. A
 * payload that is not the size of a slot (a header that does not match) is still received,
 * into scratch memory, so the sender's send completes; the stage's header check then fails
 * the run. The link posts one receive per direction at a time — activations from the previous
 * stage's rank, gradients from the next — as many as the stage's schedule expects, decodes
 * each and hands it to the local stage, whose own header check runs as in one process. Sends
 * are started as the stage makes them and their frames freed when done. Completions come from the
 * backend's progress, which the link drives while anything is pending (COMM_POLL to itself,
 * sleeping a little longer after each poll that completed nothing, up to 256 us). The link lives
 * as long as the pipeline: each START begins a batch's transfers, and the link reports to the
 * pipeline's runner (PIPE_DONE) once the stage has ended, every send is done and every
 * expected transfer has arrived. A failure (its own, or an abort frame from another rank) is
 * reported at once, and the local stage is told (an ABORT transfer) so that it stops waiting;
 * the ranks' streams are then out of step, and the pipeline runs no more batches.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "actors/pipe/link.h"
#include "base/errf.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/ranks.h"
#include "troupe/buffer.h"
#include "troupe/error.h"
#include "troupe/monitor.h"
#include "troupe/msg.h"
#include "troupe/runtime.h"

#define FRAME       256
#define MAX_OPS     4096
#define PAYLOAD     0x10         /* a tensor's tag: its kind | PAYLOAD */
#define MAX_PAYLOAD (1ull << 31) /* bytes; a header naming more is corrupt */

typedef struct op {
    uint64_t req; /* 0: free */
    int kind;     /* 1 activation, 2 gradient */
    bool recv;
    bool watched;   /* the watchdog was told it started (COMM_WATCH) */
    tr_msg_t *held; /* a receive: the decoded transfer whose tensor is being received */
    void *scratch;  /* ... into this, when it does not fit a slot */
    unsigned char frame[FRAME];
} op_t;

struct tr__pipe_link {
    tr_runtime_t *rt;
    tr_actor_t self, stage, runner;
    tr_comm_t *comm;
    int rank, world, me, stages, replicas; /* MPI's rank and world; this rank's stage */
    tr__pipe_link_area_t area[3];          /* by kind: where received tensors land */
    void *mem[3];
    uint64_t area_id[3];
    int expect0[3]; /* transfers of each kind a batch receives */
    int expect[3];  /* transfers of each kind still to arrive in this batch */
    bool posted[3]; /* a receive of that kind is pending */
    bool ended;     /* the stage has run its last instruction */
    bool reported;  /* the batch's PIPE_DONE is sent (or none is running) */
    bool aborts_posted, stop_after;
    unsigned long long batch;
    bool polling;
    int pending;
    op_t *ops;
    op_t abort_in[3];    /* the abort frames by the kind its sender sends (sender_of), posted at
                          * the start and cancelled at the end if none came */
    tr_actor_t watchdog; /* told of each transfer (COMM_WATCH); none: no one */
    int watched;         /* transfers it was told of that have not ended */
    char err[512];
    int rc;
};

static void done_cb(void *arg, uint64_t req, uint64_t tag, int rc)
{
    tr__pipe_link_t *l = arg;
    tr_msg_t *m = tr_msg_new(l->rt, TR_MSG_COMM_DONE);
    if (!m) return; /* the poll's count of pending operations still ends the link */
    TR_MSG_AS(m, comm_done)->req = req;
    TR_MSG_AS(m, comm_done)->rc = rc;
    m->step = tag;
    if (tr_actor_send(l->rt, l->self, m) < 0) tr_msg_free(l->rt, m);
}

/* Tells the watchdog (when there is one) that transfer o started: to or from `peer`, the
 * micro-batch mb of `step`, its tensor's bytes of dtype dt or (dt < 0) the frame with its
 * header. A transfer it was not told of is only unwatched, so a message that cannot be sent is
 * let go. */
static void watch_start(tr__pipe_link_t *l, op_t *o, int peer, unsigned long long step, uint32_t mb,
                        uint64_t bytes, int dt)
{
    if (tr_actor_is_none(l->watchdog)) return;
    tr_msg_t *m = tr_msg_new(l->rt, TR_MSG_COMM_WATCH);
    if (!m) return;
    bool grad = o->kind == TR__PIPE_GRAD, tensor = dt >= 0;
    int peer_stage = o->recv ? (grad ? l->me + 1 : l->me - 1) : (grad ? l->me - 1 : l->me + 1);
    *TR_MSG_AS(m, comm_watch) =
        (tr_msg_comm_watch_t){.what = TR_COMM_WATCH_STARTED,
                              .id = o->req,
                              .recv = o->recv,
                              .tensor = tensor,
                              .grad = grad,
                              .peer = peer,
                              .stage = (uint32_t)l->me,
                              .peer_stage = (uint32_t)peer_stage,
                              .step = step,
                              .micro_batch = mb,
                              .bytes = bytes,
                              .dtype = (uint32_t)(tensor ? dt : TR_DTYPE_U8)};
    if (tr_actor_send(l->rt, l->watchdog, m) < 0) {
        tr_msg_free(l->rt, m);
        return;
    }
    o->watched = true;
    l->watched++;
}

/* Tells the watchdog that the transfer with id `req` ended (0: every one it was told of: a
 * failed batch abandons them). */
static void watch_end(tr__pipe_link_t *l, uint64_t req)
{
    if (tr_actor_is_none(l->watchdog) || !l->watched) return;
    tr_msg_t *m = tr_msg_new(l->rt, TR_MSG_COMM_WATCH);
    if (!m) return;
    *TR_MSG_AS(m, comm_watch) = (tr_msg_comm_watch_t){.what = TR_COMM_WATCH_ENDED, .id = req};
    if (tr_actor_send(l->rt, l->watchdog, m) < 0) tr_msg_free(l->rt, m);
    l->watched = req ? l->watched - 1 : 0;
    for (int i = 0; !req && i < MAX_OPS; i++)
        l->ops[i].watched = false;
}

/* The batch's report to the runner: done, or (l->rc) why not. Once per batch. */
static void report(tr__pipe_link_t *l)
{
    if (l->reported) return;
    l->reported = true;
    if (l->rc) watch_end(l, 0); /* its transfers are abandoned: no longer a wait */
    tr_msg_t *m = tr_msg_new(l->rt, TR_MSG_PIPE_DONE);
    if (m) {
        *TR_MSG_AS(m, pipe_done) = (tr_msg_pipe_done_t){
            .step = l->batch, .stage = (uint32_t)l->me, .link = 1, .rc = l->rc};
        snprintf(TR_MSG_AS(m, pipe_done)->why, sizeof(TR_MSG_AS(m, pipe_done)->why), "%s", l->err);
    }
    if (!m || tr_actor_send(l->rt, l->runner, m) < 0) {
        tr_msg_free(l->rt, m);
        tr_runtime_shutdown(l->rt, "a pipeline link cannot report to its runner");
    }
    if (l->stop_after) tr_actor_stop(l->rt, l->self);
}

/* The local stage is told that the pipeline failed (it fails too, and stops waiting). */
static void tell_stage(tr__pipe_link_t *l)
{
    tr_msg_t *m = tr_msg_new(l->rt, TR_MSG_PIPE_XFER);
    if (!m) return;
    *TR_MSG_AS(m, pipe_xfer) = (tr_msg_pipe_xfer_t){.kind = TR__PIPE_ABORT, .step = l->batch};
    if (tr_actor_send(l->rt, l->stage, m) < 0) tr_msg_free(l->rt, m);
}

static int failed(tr__pipe_link_t *l, int rc, const char *what)
{
    if (!l->rc) {
        l->rc = rc;
        snprintf(l->err, sizeof(l->err), "rank %d's pipeline link: %s: %s", l->rank, what,
                 l->comm && l->comm->error[0] ? l->comm->error : tr_strerror(rc));
    }
    tell_stage(l);
    report(l);
    return 0;
}

/* The rank of stage s in this rank's replica; -1 when there is no such stage. */
static int rank_of(const tr__pipe_link_t *l, int s)
{
    return s >= 0 && s < l->stages ? s * l->replicas + l->rank % l->replicas : -1;
}

/* The neighbour that sends this rank transfers of kind k: the previous stage's rank the
 * activations, the next one's the gradients. */
static int sender_of(const tr__pipe_link_t *l, int k)
{
    return rank_of(l, k == TR__PIPE_ACT ? l->me - 1 : l->me + 1);
}

static op_t *free_op(tr__pipe_link_t *l)
{
    for (int i = 0; i < MAX_OPS; i++)
        if (!l->ops[i].req) return &l->ops[i];
    return NULL;
}

static int poll_soon(tr_ctx_t *ctx, tr__pipe_link_t *l, uint32_t idle)
{
    if (l->polling) return 0;
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_COMM_POLL);
    if (!m) return failed(l, TR_ENOMEM, "out of message memory");
    TR_MSG_AS(m, comm_poll)->idle_polls = idle;
    if (tr_actor_send(ctx->rt, ctx->self, m) < 0) {
        tr_msg_free(ctx->rt, m);
        return 0;
    }
    l->polling = true;
    return 0;
}

/* Posts the next receive of kind k (TR__PIPE_ACT or TR__PIPE_GRAD, from sender_of(k)). */
static int post(tr_ctx_t *ctx, tr__pipe_link_t *l, int k)
{
    if (l->posted[k] || l->expect[k] <= 0) return 0;
    op_t *o = free_op(l);
    if (!o) return failed(l, TR_ENOMEM, "too many transfers in flight");
    *o = (op_t){.kind = k, .recv = true};
    l->comm->op_tag = 0;
    int rc = l->comm->ops->recv(l->comm, o->frame, FRAME, TR_DTYPE_U8, sender_of(l, k), k, &o->req);
    if (rc < 0) {
        o->req = 0;
        return failed(l, rc, "posting a receive");
    }
    /* the n-th of its kind in the step: the schedules send each kind in micro-batch order */
    watch_start(l, o, sender_of(l, k), l->batch, (uint32_t)(l->expect0[k] - l->expect[k]), FRAME,
                -1);
    l->posted[k] = true;
    l->pending++;
    return poll_soon(ctx, l, 0);
}

/* The abort frames' receives, one from each neighbour; not counted as pending. */
static void post_aborts(tr_ctx_t *ctx, tr__pipe_link_t *l)
{
    for (int k = TR__PIPE_ACT; k <= TR__PIPE_GRAD; k++) {
        int peer = sender_of(l, k);
        if (peer < 0) continue;
        l->comm->op_tag = 0;
        if (l->comm->ops->recv(l->comm, l->abort_in[k].frame, FRAME, TR_DTYPE_U8, peer,
                               TR__PIPE_ABORT, &l->abort_in[k].req) < 0)
            l->abort_in[k].req = 0;
    }
    poll_soon(ctx, l, 0);
}

/* A local stage's transfer: encoded into a frame and sent to the rank it names. */
static int send_out(tr_ctx_t *ctx, tr__pipe_link_t *l, const tr_msg_t *msg)
{
    const tr_msg_pipe_xfer_t *t = TR_MSG_AS((tr_msg_t *)msg, pipe_xfer);
    op_t *o = free_op(l);
    if (!o) return failed(l, TR_ENOMEM, "too many transfers in flight");
    *o = (op_t){.kind = (int)t->kind};
    size_t len;
    int rc = tr_msg_encode(msg, o->frame + 4, FRAME - 4, &len);
    if (rc < 0) return failed(l, rc, "encoding a transfer");
    o->frame[0] = (unsigned char)len;
    o->frame[1] = (unsigned char)(len >> 8);
    int to = rank_of(l, (int)t->to_stage);
    l->comm->op_tag = msg->step;
    rc = l->comm->ops->send(l->comm, o->frame, FRAME, TR_DTYPE_U8, to, o->kind, &o->req);
    if (rc < 0) {
        o->req = 0;
        return failed(l, rc, "sending a transfer");
    }
    watch_start(l, o, to, t->step, t->micro_batch, FRAME, -1);
    l->pending++;
    if (t->data.buffer_id) { /* the tensor's bytes, from the stage's registered send area */
        void *p = NULL;
        char why[256];
        if ((rc = tr_buffer_resolve(ctx->rt, &t->data, &p, why, sizeof(why))) < 0) {
            snprintf(l->err, sizeof(l->err), "%s", why);
            return failed(l, rc, "a stage's tensor");
        }
        op_t *d = free_op(l);
        if (!d) return failed(l, TR_ENOMEM, "too many transfers in flight");
        *d = (op_t){.kind = o->kind};
        rc = l->comm->ops->send(l->comm, p, (size_t)t->data.length, TR_DTYPE_U8, to,
                                o->kind | PAYLOAD, &d->req);
        if (rc < 0) {
            d->req = 0;
            return failed(l, rc, "sending a tensor");
        }
        watch_start(l, d, to, t->step, t->micro_batch, t->data.length, (int)t->data.dtype);
        l->pending++;
    }
    return poll_soon(ctx, l, 0);
}

/* A transfer's tensor: received into slot micro-batch mod slots of the kind's area, or into
 * scratch memory when its size is not a slot's (the stage's header check says why). */
static int post_payload(tr_ctx_t *ctx, tr__pipe_link_t *l, int k, tr_msg_t *m)
{
    tr_msg_pipe_xfer_t *t = TR_MSG_AS(m, pipe_xfer);
    const tr__pipe_link_area_t *a = &l->area[k];
    uint64_t len = t->data.length;
    int dt = (int)t->data.dtype; /* the reference is rewritten below */
    if (len > MAX_PAYLOAD) {
        tr_msg_free(ctx->rt, m);
        return failed(l, TR_EDECODE, "a transfer's header names a tensor of more than 2 GiB");
    }
    op_t *d = free_op(l);
    if (!d) {
        tr_msg_free(ctx->rt, m);
        return failed(l, TR_ENOMEM, "too many transfers in flight");
    }
    *d = (op_t){.kind = k, .recv = true, .held = m};
    void *dst;
    if (a->slots > 0 && len == a->slot_bytes) {
        uint64_t off = (uint64_t)(t->micro_batch % (uint32_t)a->slots) * a->slot_bytes;
        dst = (unsigned char *)l->mem[k] + off;
        tr_buffer_ref(ctx->rt, l->area_id[k], off, len, (int)t->data.dtype, &t->data);
    } else {
        dst = d->scratch = malloc(len ? len : 1);
        t->data = (tr_tensor_ref_t){0};
        if (!dst) {
            tr_msg_free(ctx->rt, m);
            return failed(l, TR_ENOMEM, "a tensor's scratch");
        }
    }
    l->comm->op_tag = 0;
    int rc = l->comm->ops->recv(l->comm, dst, (size_t)len, TR_DTYPE_U8, sender_of(l, k),
                                k | PAYLOAD, &d->req);
    if (rc < 0) {
        d->req = 0;
        return failed(l, rc, "posting a tensor's receive");
    }
    watch_start(l, d, sender_of(l, k), t->step, t->micro_batch, len, dt);
    l->pending++;
    return poll_soon(ctx, l, 0);
}

/* A transfer (and its tensor, if it has one) is in: handed to the stage; the next posted. */
static int deliver(tr_ctx_t *ctx, tr__pipe_link_t *l, int k, tr_msg_t *m)
{
    l->posted[k] = false;
    l->expect[k]--;
    if (tr_actor_send(ctx->rt, l->stage, m) < 0) tr_msg_free(ctx->rt, m);
    return post(ctx, l, k);
}

/* A receive completed: the transfer decoded and handed to the stage; the next one posted. */
static int arrived(tr_ctx_t *ctx, tr__pipe_link_t *l, op_t *o)
{
    if (o->held) { /* the tensor of a transfer decoded before */
        free(o->scratch);
        o->scratch = NULL;
        return deliver(ctx, l, o->kind, o->held);
    }
    size_t len = (size_t)o->frame[0] | (size_t)o->frame[1] << 8;
    tr_msg_t *m = NULL;
    char why[256];
    int rc = len <= FRAME - 4 ? tr_msg_decode(ctx->rt, o->frame + 4, len, &m, why, sizeof(why))
                              : TR_EDECODE;
    if (rc < 0 || m->type != TR_MSG_PIPE_XFER) {
        if (m) tr_msg_free(ctx->rt, m);
        return failed(l, rc < 0 ? rc : TR_EDECODE,
                      "a transfer from a neighbouring rank does "
                      "not decode as PIPE_XFER");
    }
    return TR_MSG_AS(m, pipe_xfer)->data.buffer_id ? post_payload(ctx, l, o->kind, m)
                                                   : deliver(ctx, l, o->kind, m);
}

static int maybe_done(tr_ctx_t *ctx, tr__pipe_link_t *l)
{
    (void)ctx;
    if (l->ended && l->pending == 0 && l->expect[TR__PIPE_ACT] <= 0 &&
        l->expect[TR__PIPE_GRAD] <= 0)
        report(l);
    return 0;
}

/* Sends the abort frame to the neighbours except `from` and waits (at most 2 s) until they
 * are out, then ends this rank's batch: the stage is told when another rank failed (from >=
 * 0; from -1: the stage itself failed and said so), and the runner gets the link's report. */
static int abort_all(tr_ctx_t *ctx, tr__pipe_link_t *l, int from)
{
    op_t out[2] = {{0}};
    int n = 0;
    for (int s = l->me - 1; s <= l->me + 1; s += 2) {
        int peer = rank_of(l, s);
        if (peer < 0 || peer == from) continue;
        l->comm->op_tag = 0;
        if (l->comm->ops->send(l->comm, out[n].frame, FRAME, TR_DTYPE_U8, peer, TR__PIPE_ABORT,
                               &out[n].req) == 0)
            n++;
    }
    for (int round = 0; n && round < 20000; round++) { /* the frames are tiny: soon out */
        int left = l->comm->ops->progress ? l->comm->ops->progress(l->comm) : 0;
        if (left <= 0) break;
        nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    if (from >= 0) tell_stage(l);
    if (!l->rc) { /* the local stage's failure explains the batch; the link is spent */
        l->rc = TR_EFAILED;
        snprintf(l->err, sizeof(l->err), "rank %d's stage failed", l->rank);
    }
    report(l);
    return 0;
}

static int on_done(tr_ctx_t *ctx, tr__pipe_link_t *l, const tr_msg_comm_done_t *d)
{
    for (int k = TR__PIPE_ACT; k <= TR__PIPE_GRAD;
         k++) /* a neighbour's stage failed: pass it on, fail here too */
        if (l->abort_in[k].req && l->abort_in[k].req == d->req) {
            l->abort_in[k].req = 0;
            int from = sender_of(l, k);
            if (!l->rc) {
                l->rc = TR_EFAILED;
                snprintf(l->err, sizeof(l->err),
                         "rank %d's stage stopped: the pipeline failed "
                         "on another rank (rank %d's neighbour %d told it; the failing rank's "
                         "error says why)",
                         l->rank, l->rank, from);
            }
            return abort_all(ctx, l, from);
        }
    for (int i = 0; i < MAX_OPS; i++) {
        op_t *o = &l->ops[i];
        if (o->req != d->req) continue;
        if (o->watched) watch_end(l, o->req);
        o->watched = false;
        o->req = 0;
        l->pending--;
        if (d->rc < 0) return failed(l, d->rc, o->recv ? "a receive" : "a send");
        return o->recv ? arrived(ctx, l, o) : 0;
    }
    return 0;
}

static int on_poll(tr_ctx_t *ctx, tr__pipe_link_t *l, uint32_t idle)
{
    l->polling = false;
    int left = l->comm->ops->progress ? l->comm->ops->progress(l->comm) : 0;
    if (left < 0) return failed(l, left, "progress");
    if (left == 0) return 0;
    if (idle > 0) { /* nothing completed last time: wait a little longer before the next */
        long us = idle < 8 ? 1L << idle : 256;
        nanosleep(&(struct timespec){0, us * 1000}, NULL);
    }
    return poll_soon(ctx, l, idle + 1 < 64 ? idle + 1 : 64);
}

/* A batch starts: its transfers are expected, the receives posted (the abort frames' once). A
 * link that failed reports its failure again at once. */
static void start(tr_ctx_t *ctx, tr__pipe_link_t *l, unsigned long long step)
{
    l->batch = step;
    l->reported = false;
    l->ended = false;
    if (l->rc) {
        tell_stage(l);
        report(l);
        return;
    }
    l->expect[TR__PIPE_ACT] = l->expect0[TR__PIPE_ACT];
    l->expect[TR__PIPE_GRAD] = l->expect0[TR__PIPE_GRAD];
    if (!l->aborts_posted) post_aborts(ctx, l);
    l->aborts_posted = true;
    post(ctx, l, TR__PIPE_ACT);
    post(ctx, l, TR__PIPE_GRAD);
}

/* COMM_WATCH: the watchdog to tell of the transfers from now on; or the watchdog ended the
 * job: the batch fails at once (the stage is told, so that the pipeline's caller returns) and
 * so does every later one. */
static int on_watch(tr__pipe_link_t *l, const tr_msg_comm_watch_t *w)
{
    if (w->what == TR_COMM_WATCH_BY) l->watchdog = w->actor;
    if (w->what != TR_COMM_WATCH_END_JOB || l->rc) return 0;
    l->rc = TR_ETIMEDOUT;
    snprintf(l->err, sizeof(l->err),
             "rank %d's pipeline link: stopped: the comm watchdog ended the job (its diagnosis "
             "names the rank that stopped or diverged)",
             l->rank);
    if (l->reported) return 0; /* between batches: the next start fails at once */
    tell_stage(l);
    report(l);
    return 0;
}

static int link_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    tr__pipe_link_t *l = ctx->state;
    int rc = 0;
    if (msg->type == TR_MSG_COMM_DONE) rc = on_done(ctx, l, TR_MSG_AS(msg, comm_done));
    if (msg->type == TR_MSG_COMM_POLL) rc = on_poll(ctx, l, TR_MSG_AS(msg, comm_poll)->idle_polls);
    if (msg->type == TR_MSG_STOP) { /* between batches at once, else after this one */
        l->stop_after = true;
        if (l->reported) return tr_actor_stop(ctx->rt, ctx->self);
    }
    if (msg->type == TR_MSG_COMM_WATCH) return on_watch(l, TR_MSG_AS(msg, comm_watch));
    if (msg->type == TR_MSG_PIPE_XFER) {
        const tr_msg_pipe_xfer_t *t = TR_MSG_AS(msg, pipe_xfer);
        if (t->kind == TR__PIPE_START) {
            start(ctx, l, t->step);
            return 0;
        }
        if (l->reported) return 0; /* a failed batch's late word from the stage */
        if (t->kind == TR__PIPE_END)
            l->ended = true;
        else if (t->kind == TR__PIPE_ABORT)
            rc = abort_all(ctx, l, -1);
        else
            rc = send_out(ctx, l, msg);
    }
    return rc < 0 ? rc : maybe_done(ctx, l);
}

int tr__pipe_link_spawn(tr_runtime_t *rt, const tr__pipe_link_spec_t *sp, tr_actor_t *out,
                        tr__pipe_link_t **state, char *err, size_t errlen)
{
    tr__pipe_link_t *l = calloc(1, sizeof(*l));
    if (!l || !(l->ops = calloc(MAX_OPS, sizeof(op_t)))) {
        free(l);
        return tr__errf(err, errlen, TR_ENOMEM, "pipeline link: out of memory");
    }
    *l = (tr__pipe_link_t){
        .rt = rt,
        .stage = sp->stage_actor,
        .runner = sp->runner,
        .reported = true,
        .rank = sp->rank,
        .world = sp->world,
        .me = sp->stage,
        .stages = sp->stages,
        .replicas = sp->replicas > 0 ? sp->replicas : 1,
        .watchdog = TR_ACTOR_NONE,
        .area = {[TR__PIPE_ACT] = sp->act, [TR__PIPE_GRAD] = sp->grad},
        .expect0 = {[TR__PIPE_ACT] = sp->expect_act, [TR__PIPE_GRAD] = sp->expect_grad},
        .ops = l->ops};
    *state = l;
    char why[256] = "";
    int rc = tr_comm_create("mpi", sp->rank, sp->world, done_cb, l, &l->comm, why, sizeof(why));
    if (rc < 0) return tr__errf(err, errlen, rc, "pipeline across ranks: the MPI backend: %s", why);
    tr_actor_opts_t o = {
        .name = "pipe-link", .pinned = 1, .defer_stop = 1, .lane_kind = TR_LANE_COMM};
    rc = tr_actor_spawn(rt, link_behaviour, l, &o, out);
    if (rc < 0) return tr__errf(err, errlen, rc, "pipeline link: spawn: %s", tr_strerror(rc));
    l->self = *out;
    for (int k = TR__PIPE_ACT; k <= TR__PIPE_GRAD; k++) { /* where received tensors land */
        uint64_t bytes = (uint64_t)l->area[k].slots * l->area[k].slot_bytes;
        if (!bytes) continue;
        tr_buffer_info_t bi = {.bytes = bytes, .dtype = (uint8_t)sp->dtype, .owner = l->self};
        snprintf(bi.name, sizeof(bi.name), "pipe-link/%s", k == TR__PIPE_ACT ? "acts" : "grads");
        rc = tr_buffer_alloc_host(rt, &bi, &l->mem[k], &l->area_id[k]);
        if (rc == TR_ENOMEM) return tr__errf(err, errlen, rc, "pipeline link: out of memory");
        if (rc < 0)
            return tr__errf(err, errlen, rc, "pipeline link: registering: %s", tr_strerror(rc));
    }
    return 0;
}

void tr__pipe_link_free(tr__pipe_link_t *l)
{
    if (!l) return;
    tr_comm_destroy(l->comm);
    for (int i = 0; i < MAX_OPS; i++)
        free(l->ops[i].scratch);
    free(l->mem[TR__PIPE_ACT]);
    free(l->mem[TR__PIPE_GRAD]);
    free(l->ops);
    free(l);
}

int tr__pipe_rank_stage(int stages, int replicas, int *rank, int *world, int *stage, char *err,
                        size_t errlen)
{
    tr_ranks_t rk;
    char why[256];
    int rc = tr_ranks_discover(NULL, &rk, why, sizeof(why));
    if (rc < 0) return tr__errf(err, errlen, rc, "pipeline across ranks: %s", why);
    if (rk.world != stages * replicas)
        return tr__errf(err, errlen, TR_EINVAL,
                        "pipeline across ranks: %d stages x %d replicas on %d ranks (%s); "
                        "run one rank per stage and replica",
                        stages, replicas, rk.world, rk.source);
    *rank = rk.rank, *world = rk.world, *stage = rk.rank / replicas;
    return 0;
}
