/* comm.c: the comm actor. Each BUCKET is all-reduced (ZeRO 2: reduce-scattered) over the
 * data-parallel ranks by the backend and passed on to the optimizer as REDUCED once the
 * backend reports its completion, which arrives as a COMM_DONE message; several buckets may be
 * in flight at once. It also serves the scalar and vector all-reduces (losses, norms, Lamb's
 * sums) and ZeRO's parameter all-gather.
 *
 * Every collective is submitted with a header that every rank must agree on before its result
 * is delivered (comm_start.c): the header's exchange runs beside the collective, so a rank that
 * diverged is named on every rank and nothing computed by a mismatched collective is used. A
 * mismatched collective may then have been posted: should the backend fail it (MPI: a message
 * truncated) while exchanges are in flight, the error is held until they end, so that a
 * divergence is named as one rather than as MPI's error.
 *
 * A backend whose operations need progress (MPI: Open MPI moves a collective on only inside
 * its calls) makes the actor pinned; while anything is pending it sends itself COMM_POLL
 * messages, each running the backend's progress once. A poll after one that completed nothing
 * follows at once (a rank with a core of its own, once the step's backward is over: eager_polls)
 * or after a 1 us sleep while the youngest pending operation is younger than 20 ms
 * (MPI moves a collective on only inside its calls: a pause there is added to the collective's
 * time; a COMM_POLL then polls for up to 20 us), and after a 256 us sleep past that (pause_ns);
 * with nothing pending no poll is sent and the actor parks. The local backend completes at once
 * and needs none of this.
 *
 * Scaling follows DeepSpeed's allreduce_bucket: by default the bucket is divided by
 * gradient_predivide_factor before the sum and multiplied by predivide / world after it (a
 * mean over ranks, computed so that fp16 sums do not overflow); with prescale_gradients it
 * is divided by world before the sum. At world size 1 with the default factor both are
 * no-ops and are skipped.
 *
 * The watchdog: a collective pending past troupe.comm.timeout_s starts the diagnosis across
 * ranks of watchdog.c (rank 0 gathers every rank's table of pending operations over a control
 * channel and names the rank that diverged); the channel is moved on by a slow timer (TIMER,
 * every TR__WATCH_TICK_NS) so that a rank with nothing pending still answers. A group of one, or
 * a backend without point-to-point, has no channel: its watchdog fails the engine at once.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "actors/comm/comm_internal.h"
#include "base/errf.h"
#include "base/vmem.h"
#include "kernels/cpu/vec.h"
#include "runtime/config/agree.h"

/* comms_logger: one completed operation, and its verbose line on rank 0; the trace: its span
 * on the collectives lane. */
static void log_op(struct tr__comm *c, const char *op, double bytes, pending_t *p)
{
    uint64_t t_start = p->t_start;
    const tr_config_comms_logger_t *cl = &c->eng->cfg->comms_logger;
    if (p->lane >= 0) {
        tr_monitor_span(c->eng->mon,
                        &(tr_span_t){op, t_start, tr_now_ns(), p->step, 0,
                                     TR__LANE_COLLECTIVES - (uint32_t)p->lane, (uint64_t)bytes, 0});
        c->lanes_busy &= ~(1u << p->lane);
    }
    if (!c->log) return;
    bool profiled = cl->prof_all;
    for (int i = 0; !profiled && i < cl->prof_ops.count; i++)
        profiled = !strcmp(cl->prof_ops.items[i], op);
    if (!profiled) return;
    double ms = (double)(tr_now_ns() - t_start) / 1e6;
    tr_comms_log_add(c->log, op, bytes, ms);
    if (c->log_verbose && c->eng->rank == 0) {
        char line[256];
        tr_comms_line(op, ms, bytes, c->eng->world, line, sizeof(line));
        printf("%s\n", line);
        fflush(stdout);
    }
}

/* The backend's completion: a message to the comm actor (any thread), in the step the
 * operation was started for (its tag). */
static void op_done(void *arg, uint64_t req, uint64_t step, int rc)
{
    struct tr__comm *c = arg;
    tr_msg_t *m = tr_msg_new(c->rt, TR_MSG_COMM_DONE);
    if (m) {
        TR_MSG_AS(m, comm_done)->req = req;
        TR_MSG_AS(m, comm_done)->rc = rc;
        m->step = step;
    }
    if (!m || tr_actor_send(c->rt, c->self, m) < 0) {
        tr_msg_free(c->rt, m);
        tr__engine_fail(c->eng, TR_ENOMEM,
                        "comm: the completion of request %llu could not be delivered",
                        (unsigned long long)req);
    }
}

/* A completion on another communicator: the same message, marked with its channel. */
static void channel_done(struct tr__comm *c, uint32_t channel, uint64_t req, uint64_t tag, int rc)
{
    tr_msg_t *m = tr_msg_new(c->rt, TR_MSG_COMM_DONE);
    if (m) {
        TR_MSG_AS(m, comm_done)->req = req;
        TR_MSG_AS(m, comm_done)->rc = rc;
        TR_MSG_AS(m, comm_done)->channel = channel;
        m->step = tag;
    }
    if (!m || tr_actor_send(c->rt, c->self, m) < 0) {
        tr_msg_free(c->rt, m);
        tr__engine_fail(c->eng, TR_ENOMEM,
                        "comm: a completion on channel %u could not be "
                        "delivered",
                        channel);
    }
}

static void control_done(void *arg, uint64_t req, uint64_t tag, int rc)
{
    channel_done(arg, 1, req, tag, rc);
}

static void header_done(void *arg, uint64_t req, uint64_t tag, int rc)
{
    channel_done(arg, 2, req, tag, rc);
}

static void scale(float *x, size_t n, float mul)
{
    if (mul != 1.0f) tr__vec()->scale(x, mul, n);
}

/* A bucket's floats [a, a + count) of the gradient buffer (data), ready for the wire: times
 * `pre` (the mean's share before the sum), then on a 16-bit wire converted into c->wire16. */
static void prepare_bucket(struct tr__comm *c, float *data, size_t a, size_t count, float pre)
{
    scale(data, count, pre);
    if (c->wire16) tr__comm_to_wire(c, data, a, count);
}

static int on_bucket(struct tr__comm *c, tr_msg_t *msg)
{
    if (c->broken) return 0; /* the engine has failed already: no more collectives */
    if (c->eng->rank == c->fault_silent && msg->step > 0) return 0; /* the test's silent rank */
    const tr__plan_t *e = c->eng;
    tr_msg_bucket_t *b = TR_MSG_AS(msg, bucket);
    char why[256];
    float *data = tr__resolve(e, &b->grads, why, sizeof(why));
    if (!data) {
        tr__engine_fail(e, TR_EINVAL, "comm: bucket %u: %s", b->bucket, why);
        return TR_EINVAL;
    }
    tr_tensor_ref_t grads = b->grads;
    if (e->rank == c->fault_count && grads.length > sizeof(float))
        grads.length -= sizeof(float); /* the test's diverged bucket: one float short */
    size_t count = grads.length / sizeof(float), a = grads.offset / sizeof(float);
    bool scatter = e->zero >= 2 && e->cfg->zero.reduce_scatter;
    pending_t op = {.bucket = b->bucket,
                    .step = msg->step,
                    .grads = grads,
                    .data = data,
                    .mine = count,
                    .mine_at = a,
                    .asker = TR_ACTOR_NONE};
    if (e->zero >= 2 && !scatter) { /* the all-reduce path: this rank's part of the sum */
        size_t *counts = tr__comm_bucket_parts(e, a, a + count, &op.mine, &op.mine_at);
        if (!counts) return TR_ENOMEM;
        free(counts);
    }
    c->tail =
        a == 0 && (int64_t)msg->micro_step + 1 >= e->GAS; /* the backward is over (eager_polls) */
    /* the values scaled (and on a 16-bit wire converted) before the collective starts */
    prepare_bucket(c, data, a, count, scatter ? 1.0f / (float)e->world : c->pre);
    return tr__comm_submit(c, op,
                           (header_t){.op = scatter ? TR__COLL_REDUCE_SCATTER : TR__COLL_ALL_REDUCE,
                                      .dtype = c->wire,
                                      .bytes = count * tr_dtype_size(c->wire),
                                      .step = msg->step,
                                      .micro_step = msg->micro_step,
                                      .bucket = b->bucket});
}

/* COMM_SCALAR: a few doubles all-reduced for an actor (a loss, a count). */
static int on_scalar(struct tr__comm *c, tr_msg_t *msg)
{
    if (c->broken) return 0;
    tr_msg_comm_scalar_t *s = TR_MSG_AS(msg, comm_scalar);
    if (s->n < 1 || s->n > 4 || s->op >= TR_REDUCE_COUNT_) {
        tr__engine_fail(c->eng, TR_EINVAL,
                        "comm: scalar all-reduce of %u values (op %u) from "
                        "actor %llx refused",
                        s->n, s->op, (unsigned long long)msg->sender.id);
        return TR_EINVAL;
    }
    double *vals = malloc(sizeof(s->values));
    if (!vals) return TR_ENOMEM;
    memcpy(vals, s->values, sizeof(s->values));
    pending_t op = {.step = msg->step, .asker = msg->sender, .scalar = *s, .vals = vals};
    return tr__comm_submit(c, op,
                           (header_t){.op = TR__COLL_SCALAR,
                                      .dtype = TR_DTYPE_F64,
                                      .bytes = s->n * sizeof(double),
                                      .step = msg->step,
                                      .micro_step = msg->micro_step,
                                      .bucket = s->what});
}

/* COMM_GATHER (ZeRO 1, 2: the optimizer's, the whole buffer; ZeRO 3: the fetcher's, a layer's
 * range): every rank's part of the range inside its slice of the parameters (tr__zero_owned)
 * all-gathered in place, in the parameter buffer. */
static int on_gather(struct tr__comm *c, tr_msg_t *msg)
{
    if (c->broken) return 0;
    const tr__plan_t *e = c->eng;
    tr_msg_comm_gather_t *g = TR_MSG_AS(msg, comm_gather);
    if (e->rank == c->fault_gather_silent && msg->step > 0) return 0; /* the test's */
    char why[256];
    float *buf = tr__resolve(e, &g->buf, why, sizeof(why));
    size_t n = g->buf.length / sizeof(float);
    if (!buf || g->buf.buffer_id != e->buf_params || g->buf.offset % sizeof(float) ||
        g->count != tr__zero_slice(e->n_params, e->world)) {
        tr__engine_fail(e, TR_EINVAL, "comm: parameter all-gather: %s",
                        !buf ? why
                        : g->buf.buffer_id != e->buf_params || g->buf.offset % sizeof(float)
                            ? "not a range of the parameters"
                            : "the slices are not the ranks' partitions");
        return TR_EINVAL;
    }
    pending_t op = {.step = msg->step, .asker = msg->sender, .buf = g->buf, .ptr = buf};
    return tr__comm_submit(c, op,
                           (header_t){.op = TR__COLL_ALL_GATHER,
                                      .dtype = TR_DTYPE_F32,
                                      .bytes = n * sizeof(float),
                                      .step = msg->step});
}

/* COMM_REDUCE: a registered fp64 buffer all-reduced in place for the asker. */
static int on_reduce(struct tr__comm *c, tr_msg_t *msg)
{
    if (c->broken) return 0;
    const tr__plan_t *e = c->eng;
    tr_msg_comm_reduce_t *v = TR_MSG_AS(msg, comm_reduce);
    char why[256];
    double *buf = v->op < TR_REDUCE_COUNT_ ? tr__resolve(e, &v->buf, why, sizeof(why)) : NULL;
    if (!buf) {
        tr__engine_fail(e, TR_EINVAL, "comm: vector all-reduce (op %u): %s", v->op,
                        v->op < TR_REDUCE_COUNT_ ? why : "no such reduction");
        return TR_EINVAL;
    }
    pending_t op = {.step = msg->step,
                    .asker = msg->sender,
                    .buf = v->buf,
                    .ptr = buf,
                    .reduce_op = v->op,
                    .what = v->what};
    return tr__comm_submit(c, op,
                           (header_t){.op = TR__COLL_VECTOR,
                                      .dtype = TR_DTYPE_F64,
                                      .bytes = v->buf.length,
                                      .step = msg->step});
}

/* The result m goes back to whoever asked for p's operation, and p's entry is free again. */
static int answer(tr_ctx_t *ctx, pending_t *p, tr_msg_t *m)
{
    tr_actor_t to = p->asker;
    m->step = p->step;
    tr__comm_pending_free(ctx->state, p);
    int rc = tr_actor_send(ctx->rt, to, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    return rc;
}

static int reduce_done(tr_ctx_t *ctx, struct tr__comm *c, pending_t *p)
{
    log_op(c, "all_reduce", (double)p->buf.length, p);
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_COMM_REDUCE);
    if (!m) return TR_ENOMEM;
    *TR_MSG_AS(m, comm_reduce) =
        (tr_msg_comm_reduce_t){.buf = p->buf, .op = p->reduce_op, .what = p->what};
    return answer(ctx, p, m);
}

static int gather_done(tr_ctx_t *ctx, struct tr__comm *c, pending_t *p)
{
    log_op(c, "all_gather", (double)(p->buf.length / (uint64_t)c->eng->world), p);
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_COMM_GATHER);
    if (!m) return TR_ENOMEM;
    TR_MSG_AS(m, comm_gather)->buf = p->buf;
    TR_MSG_AS(m, comm_gather)->count = tr__zero_slice(c->eng->n_params, c->eng->world);
    return answer(ctx, p, m);
}

/* A scalar all-reduce finished: the result back to whoever asked. */
static int scalar_done(tr_ctx_t *ctx, struct tr__comm *c, pending_t *p)
{
    log_op(c, "all_reduce", (double)p->scalar.n * sizeof(double), p);
    memcpy(p->scalar.values, p->vals, sizeof(p->scalar.values));
    free(p->vals);
    p->vals = NULL;
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_COMM_SCALAR);
    if (!m) return TR_ENOMEM;
    *TR_MSG_AS(m, comm_scalar) = p->scalar;
    return answer(ctx, p, m);
}

static int bucket_done(tr_ctx_t *ctx, struct tr__comm *c, pending_t *p);

/* A collective that completed and whose header every rank agreed on: its result delivered. */
static int deliver(tr_ctx_t *ctx, struct tr__comm *c, pending_t *p)
{
    switch (p->head.op) {
    case TR__COLL_ALL_GATHER:
        return gather_done(ctx, c, p);
    case TR__COLL_VECTOR:
        return reduce_done(ctx, c, p);
    case TR__COLL_SCALAR:
        return scalar_done(ctx, c, p);
    case TR__COLL_ALL_REDUCE:
    case TR__COLL_REDUCE_SCATTER:
        break;
    case TR__COLL_PIPE_SEND:
    case TR__COLL_PIPE_RECV: /* the links' transfers are never in the pending table */
        return TR_EINVAL;
    }
    return bucket_done(ctx, c, p);
}

/* The backend's error, held while exchanges were in flight (on_poll), now that they have all
 * arrived and named no divergence. */
static void fail_held(struct tr__comm *c)
{
    tr__engine_fail(c->eng, c->held_rc, "comm: %s", c->held_why);
    c->held_rc = 0;
}

static int on_done(tr_ctx_t *ctx, struct tr__comm *c, const tr_msg_comm_done_t *d)
{
    /* channel 2: a header exchange; 0: a data collective */
    pending_t *p = tr__comm_pending_find(c, d->req, d->channel == 2);
    if (!p || d->rc < 0) {
        int rc = d->rc < 0 ? d->rc : TR_EINVAL;
        tr__engine_fail(c->eng, rc, "comm: request %llu %s", (unsigned long long)d->req,
                        p ? tr_strerror(d->rc) : "completed but was never started");
        return rc;
    }
    if (p->hdr) { /* a mismatch fails the engine with the explanation; the actor stays */
        pending_t *ready;
        int rc = tr__comm_headers_arrived(c, p, &ready);
        if (rc == 0 && c->held_rc && c->exchanges == 0) fail_held(c);
        return rc == 0 && ready ? deliver(ctx, c, ready) : 0;
    }
    if (!p->agreed) { /* its header exchange has not ended yet: delivered when it does */
        p->ended = true;
        return 0;
    }
    return deliver(ctx, c, p);
}

/* A bucket's reduction finished: the reduced values (all of the bucket, or this rank's part of
 * it) to the optimizer. */
static int bucket_done(tr_ctx_t *ctx, struct tr__comm *c, pending_t *p)
{
    const tr__plan_t *e = c->eng;
    size_t count = p->grads.length / sizeof(float), a = p->grads.offset / sizeof(float);
    double bytes = (double)count * (double)tr_dtype_size(c->wire);
    bool scatter = p->head.op == TR__COLL_REDUCE_SCATTER;
    if (scatter)
        log_op(c, "reduce_scatter", bytes / e->world, p);
    else
        log_op(c, "all_reduce", bytes, p);
    if (c->wire16) { /* the reduced values (a reduce-scatter's: this rank's part, at the start);
                      * the bucket's wire pages then go back: only the buckets in flight cost */
        tr__comm_from_wire(c, p->data, a, scatter ? p->mine : count);
        tr__vmem_release(c->wire16 + a, count * sizeof(uint16_t));
    }
    if (!scatter) scale(p->data, count, c->post);
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_REDUCED);
    if (!m) return TR_ENOMEM;
    tr_msg_reduced_t *r = TR_MSG_AS(m, reduced);
    r->bucket = p->bucket;
    r->grads = p->grads;
    r->grads.offset = (scatter ? a : p->mine_at) * sizeof(float); /* where the values are */
    r->grads.length = p->mine * sizeof(float);
    r->at = p->mine_at;
    r->covers = count;
    r->first = a;
    m->step = p->step;
    tr__comm_pending_free(c, p);
    int rc = tr_actor_send(ctx->rt, e->optimizer, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    return rc;
}

/* Sends the next COMM_POLL (idle_polls: how many before it completed nothing). */
static int schedule_poll(tr_ctx_t *ctx, struct tr__comm *c, uint32_t idle_polls)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_COMM_POLL);
    if (!m) return TR_ENOMEM;
    TR_MSG_AS(m, comm_poll)->idle_polls = idle_polls;
    int rc = tr_actor_send(ctx->rt, ctx->self, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    c->polling = rc == 0;
    return rc;
}

/* Adds op, pending for age seconds, to t, kept oldest first (at most TR__WATCH_MAX_OPS: the
 * youngest is dropped). */
static void table_add(tr__watch_table_t *t, const tr__watch_op_t *op, double age)
{
    if (t->n == TR__WATCH_MAX_OPS && age <= t->ops[t->n - 1].pending_s) return;
    int at = t->n < TR__WATCH_MAX_OPS ? t->n++ : TR__WATCH_MAX_OPS - 1;
    t->ops[at] = *op;
    t->ops[at].pending_s = age;
    for (; at > 0 && t->ops[at - 1].pending_s < age; at--) {
        tr__watch_op_t older = t->ops[at];
        t->ops[at] = t->ops[at - 1];
        t->ops[at - 1] = older;
    }
}

/* This rank's table for the watchdog: the last collective started, and the pending
 * collectives and pipeline transfers, oldest first (at most TR__WATCH_MAX_OPS). */
static void my_table(const struct tr__comm *c, uint64_t now, tr__watch_table_t *t)
{
    *t = (tr__watch_table_t){.rank = c->eng->rank, .started = c->seq, .last = c->last};
    for (size_t i = 0; i < c->cap; i++) {
        const pending_t *p = &c->pending[i];
        if (!p->req || p->hdr) continue; /* a collective's header exchange: listed as it */
        tr__watch_op_t op = p->op;
        op.exchange = !p->agreed; /* still waiting for every rank's header */
        table_add(t, &op, (double)(now - p->t_start) / 1e9);
    }
    for (size_t i = 0; i < c->xfers_cap; i++)
        if (c->xfers[i].id)
            table_add(t, &c->xfers[i].op, (double)(now - c->xfers[i].t_start) / 1e9);
}

/* The link is told that the job ends (its batch fails, so that the executor waiting in the
 * pipeline returns). */
static void tell_link(struct tr__comm *c)
{
    if (tr_actor_is_none(c->link)) return;
    tr_msg_t *m = tr_msg_new(c->rt, TR_MSG_COMM_WATCH);
    if (!m) return; /* the link's own failure, or the job's end, stops it */
    TR_MSG_AS(m, comm_watch)->what = TR_COMM_WATCH_END_JOB;
    if (tr_actor_send(c->rt, c->link, m) < 0) tr_msg_free(c->rt, m);
}

/* COMM_WATCH from a pipeline link: a transfer enters the table of watched ones, or leaves it
 * (id 0: all of them). */
static int on_watch(struct tr__comm *c, const tr_msg_t *msg)
{
    const tr_msg_comm_watch_t *w = TR_MSG_AS((tr_msg_t *)msg, comm_watch);
    if (w->what == TR_COMM_WATCH_ENDED) {
        for (size_t i = 0; i < c->xfers_cap; i++)
            if (c->xfers[i].id && (!w->id || c->xfers[i].id == w->id)) c->xfers[i].id = 0;
        return 0;
    }
    if (w->what != TR_COMM_WATCH_STARTED || !w->id) return 0;
    c->link = msg->sender;
    size_t at = 0;
    while (at < c->xfers_cap && c->xfers[at].id)
        at++;
    if (at == c->xfers_cap) {
        size_t cap = c->xfers_cap ? 2 * c->xfers_cap : 16;
        watched_t *x = realloc(c->xfers, cap * sizeof(*x));
        if (!x) return TR_ENOMEM;
        memset(x + c->xfers_cap, 0, (cap - c->xfers_cap) * sizeof(*x));
        c->xfers = x;
        c->xfers_cap = cap;
    }
    c->xfers[at] = (watched_t){.id = w->id,
                               .t_start = tr_now_ns(),
                               .op = {.op = w->recv ? TR__COLL_PIPE_RECV : TR__COLL_PIPE_SEND,
                                      .dtype = w->dtype,
                                      .bytes = w->bytes,
                                      .step = w->step,
                                      .micro_step = w->micro_batch,
                                      .peer = w->peer,
                                      .stage = w->stage,
                                      .peer_stage = w->peer_stage,
                                      .grad = w->grad,
                                      .tensor = w->tensor}};
    return 0;
}

/* The engine fails for the watchdog's reason (the diagnosis on rank 0), and the pipeline's
 * link its batch: collectives still pending then end the job at shutdown (the backend aborts
 * it), and so does the rank that ended the job itself (the rank it names may be stopped,
 * which would keep MPI_Finalize waiting). */
static void watch_fail(struct tr__comm *c, const char *why)
{
    tr__engine_fail(c->eng, TR_ETIMEDOUT, "%s", why);
    c->broken = true;
    c->backend->abort_job = tr__watch_ended_here(c->watch);
    tell_link(c);
}

/* The watchdog: when the oldest pending collective or pipeline transfer has waited past
 * troupe.comm.timeout_s, the diagnosis across ranks starts (watchdog.c), or with no control
 * channel the engine fails at once naming the operation; the backend then ends the job at
 * shutdown (its collectives cannot complete). */
static int watchdog(struct tr__comm *c)
{
    const pending_t *old = NULL;
    const watched_t *oldx = NULL;
    for (size_t i = 0; i < c->cap; i++)
        if (c->pending[i].req && (!old || c->pending[i].t_start < old->t_start))
            old = &c->pending[i];
    for (size_t i = 0; i < c->xfers_cap; i++)
        if (c->xfers[i].id && (!oldx || c->xfers[i].t_start < oldx->t_start)) oldx = &c->xfers[i];
    if (old && oldx && old->t_start <= oldx->t_start) oldx = NULL;
    uint64_t now = tr_now_ns(), t_start = oldx ? oldx->t_start : old ? old->t_start : now;
    if (!(old || oldx) || now - t_start < c->timeout_ns) return 0;
    if (c->watch) {
        tr__watch_table_t t;
        my_table(c, now, &t);
        tr__watch_alarm(c->watch, &t, now);
        return 0;
    }
    char what[320];
    if (oldx) {
        tr__watch_describe(&oldx->op, what, sizeof(what));
    } else if (old->hdr) { /* a header exchange: the collective it comes before */
        char d[200];
        tr__comm_describe(&old->hdr[c->eng->world], d, sizeof(d));
        snprintf(what, sizeof(what), "a header exchange (step %llu) before %s",
                 (unsigned long long)old->step, d);
    } else {
        snprintf(what, sizeof(what), "%s (step %llu)", tr__comm_op_name(old->head.op),
                 (unsigned long long)old->step);
    }
    tr__engine_fail(c->eng, TR_ETIMEDOUT,
                    "comm: rank %d: %s has been pending for %.1f s, past "
                    "troupe.comm.timeout_s %lld: another rank diverged, stopped or died; the job "
                    "ends on every rank",
                    c->eng->rank, what, (double)(now - t_start) / 1e9,
                    (long long)c->eng->cfg->troupe.comm.timeout_s);
    c->broken = true;
    tell_link(c);
    return TR_ETIMEDOUT;
}

/* The control channel's slow tick (TIMER): the watchdog, the channel's progress, and the next
 * tick. It runs whether or not anything is pending, so this rank always answers. */
static int on_tick(tr_ctx_t *ctx, struct tr__comm *c)
{
    if (!c->broken) watchdog(c);
    tr__watch_table_t t;
    uint64_t now = tr_now_ns();
    my_table(c, now, &t);
    char why[1024];
    if (tr__watch_tick(c->watch, &t, now, why, sizeof(why))) watch_fail(c, why);
    uint64_t id;
    return tr_timer_start(ctx->rt, ctx->self, 0, TR__WATCH_TICK_NS, 0, &id);
}

/* A control-channel operation completed. */
static int on_control_done(struct tr__comm *c, const tr_msg_comm_done_t *d)
{
    tr__watch_table_t t;
    uint64_t now = tr_now_ns();
    my_table(c, now, &t);
    char why[1024];
    if (tr__watch_done(c->watch, d->req, d->rc, &t, now, why, sizeof(why))) watch_fail(c, why);
    return 0;
}

/* TROUPE_FAULT_KILL_RANK / _STEP (tests): this rank dies mid-step, as a crashed process would,
 * when the step's first bucket reaches the comm actor. */
static void inject_kill(const struct tr__comm *c, const tr_msg_t *msg)
{
    if (c->eng->rank != c->fault_kill || msg->step != c->fault_kill_step) return;
    tr_log(TR_LOG_ERROR,
           "comm: rank %d: TROUPE_FAULT_KILL_RANK: killing this process "
           "(SIGKILL) in step %llu",
           c->eng->rank, (unsigned long long)msg->step);
    raise(SIGKILL);
}

/* Operations younger than YOUNG_NS are polled every SHORT_NS (in practice every few us), in
 * passes of up to PASS_NS; older ones every LONG_NS, a pass each. */
#define YOUNG_NS 20000000ull
#define PASS_NS  20000ull
#define SHORT_NS 1000L
#define LONG_NS  256000L

/* How long the comm actor sleeps between polls that complete nothing, from the age of the
 * youngest operation in flight: none while it is young on an eager comm actor in the step's
 * tail (eager_polls), else as follows. Open MPI moves a collective on only inside its calls and a
 * collective needs several of them (each step of its algorithm, each handshake of a large
 * message), so a pause between polls is added to the collective's time at each: the earlier
 * backoff (an eighth of the operation's age, and Linux's default 50 us timer slack on every
 * sleep) cost a 1-4 MiB all-reduce 15-25% against MPI_Test in a loop. Hence SHORT_NS until
 * YOUNG_NS, then LONG_NS (a long collective, or a rank waiting for a late one: at most ~4000
 * polls a second, and under 2% of a collective that long per step of it). A sleep, neither
 * sched_yield nor spinning: on a core shared with other processes a yielding thread hands its
 * core over for a whole time slice (measured at load 8 on 2 cores: a 1 MiB all-reduce took 4.9
 * ms yielding, 1.2 ms sleeping 1 us, 1.1 ms spinning), and a spinning one holds it from the
 * rank it waits for when two ranks share a core (4 ranks on 2 cores: a 4 MiB all-reduce took
 * ~20 ms spinning its first 2 ms, 13-18 ms sleeping), while one that sleeps is woken promptly.
 * The comm actor's thread takes a timer slack of 1 us (timer_slack) so that a 1 us sleep lasts
 * a few us, not 50. */
static long pause_ns(const struct tr__comm *c)
{
    uint64_t now = tr_now_ns(), youngest = UINT64_MAX;
    for (size_t i = 0; i < c->cap; i++)
        if (c->pending[i].req && now - c->pending[i].t_start < youngest)
            youngest = now - c->pending[i].t_start;
    return youngest >= YOUNG_NS ? LONG_NS : c->eager && c->tail ? 0 : SHORT_NS;
}

/* Whether young operations may be polled without a pause, in the step's tail (c->tail: from
 * the bucket of the step's last micro-step that starts the gradients, the backward's last,
 * until another bucket comes): no other rank of the job shares this rank's cores (the
 * launcher's ranks on this node, or else all of them, at most the CPUs online) and no ZeRO 3
 * all-gathers run ahead of the executor. Then the executor waits for the step (the optimizer
 * may still step buckets already reduced, sharing the core with the polls), and the comm actor
 * polls as a program calling MPI_Test in a loop does: a sleep between polls waits for the timer
 * (~9 us here for a 1 us sleep) and, on a core that other processes also want, for the
 * scheduler to hand the core back (2 ranks on 2 cores beside another job's 2 busy ranks: a bare
 * 1 MiB MPI_Iallreduce took a median 0.86 ms polled in a loop, 1.6 ms with 1 us sleeps, 3.6 ms
 * with sched_yield). A bucket that leaves during the backward (ZeRO 2, overlap_comm) is polled
 * with sleeps, so that the polls do not take half of the core the backward runs on; and with
 * ranks sharing a core a spinning poll would hold the core from the rank it waits for (Open MPI
 * itself yields inside its progress when it knows the node oversubscribed): the sleeps stay. */
static bool eager_polls(const tr__plan_t *e)
{
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"};
    long node = e->world;
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]) && node == e->world; i++) {
        const char *v = getenv(vars[i]);
        char *end;
        long n = v ? strtol(v, &end, 10) : 0;
        if (v && *v && !*end && n > 0) node = n;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return e->zero < 3 && cpus > 0 && node <= cpus;
}

/* Once, on the comm actor's own thread (it is pinned): sleeps of 1 us there last a few us. */
static void timer_slack(struct tr__comm *c)
{
    if (c->slack_set) return;
    c->slack_set = true;
#ifdef __linux__
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL); /* else the default 50 us */
#endif
}

/* One progress pass: the backend's progress, after the pause when the previous pass completed
 * nothing, and while nothing completes again after each pause for up to PASS_NS (SHORT_NS
 * pauses; a LONG_NS pause makes a pass of one). Polls again while anything is pending. A pass
 * is one message, so the comm actor still sees its other messages (a new bucket) within
 * PASS_NS, and its trace holds a span per pass, not one per test. */
static int on_poll(tr_ctx_t *ctx, struct tr__comm *c, uint32_t idle_polls)
{
    c->polling = false;
    if (watchdog(c) < 0) return 0; /* the engine has failed; polling stops */
    long pause = pause_ns(c);
    uint64_t until = pause <= SHORT_NS ? tr_now_ns() + PASS_NS : 0;
    bool progressed;
    int left;
    for (int tests = 0;; tests++) {
        if ((tests || idle_polls) && pause) {
            timer_slack(c);
            nanosleep(&(struct timespec){0, pause}, NULL);
        }
        left = c->held_rc ? 0 : c->backend->ops->progress(c->backend);
        if (left < 0 && c->exchanges > 0) { /* held until the exchanges say whether the ranks
                                             * diverged (fail_held); nothing more starts */
            c->held_rc = left;
            snprintf(c->held_why, sizeof(c->held_why), "%s", c->backend->error);
            c->broken = true;
            left = 0;
        }
        int hl = left >= 0 && c->headers ? c->headers->ops->progress(c->headers) : 0;
        if (left < 0 || hl < 0) {
            tr__engine_fail(c->eng, left < 0 ? left : hl, "comm: %s",
                            left < 0 ? c->backend->error : c->headers->error);
            return left < 0 ? left : hl;
        }
        left += hl;
        progressed = left < c->inflight; /* the completions sent their COMM_DONE */
        c->inflight = left;
        if (progressed || left == 0 || tr_now_ns() >= until) break;
    }
    return left > 0 ? schedule_poll(ctx, c, progressed ? 0 : idle_polls + 1) : 0;
}

static int comm_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    struct tr__comm *c = ctx->state;
    int rc = 0;
    if (msg->type == TR_MSG_TIMER && c->watch) return on_tick(ctx, c);
    if (msg->type == TR_MSG_COMM_DONE && TR_MSG_AS(msg, comm_done)->channel == 1)
        return on_control_done(c, TR_MSG_AS(msg, comm_done));
    if (msg->type == TR_MSG_COMM_WATCH) return on_watch(c, msg);
    if (msg->type == TR_MSG_BUCKET && c->fault_kill >= 0) inject_kill(c, msg);
    if (msg->type == TR_MSG_COMM_GATHER) rc = on_gather(c, msg);
    if (msg->type == TR_MSG_BUCKET) rc = on_bucket(c, msg);
    if (msg->type == TR_MSG_COMM_REDUCE) rc = on_reduce(c, msg);
    if (msg->type == TR_MSG_COMM_SCALAR) rc = on_scalar(c, msg);
    if (msg->type == TR_MSG_COMM_DONE) rc = on_done(ctx, c, TR_MSG_AS(msg, comm_done));
    if (msg->type == TR_MSG_COMM_POLL)
        return on_poll(ctx, c, TR_MSG_AS(msg, comm_poll)->idle_polls);
    /* anything started (a header's agreement starts its collective): poll until it ends */
    if (rc == 0 && c->inflight > 0 && c->backend->ops->progress && !c->polling)
        rc = schedule_poll(ctx, c, 0);
    return rc;
}

/* The tests' injected faults (docs/engine.md). */
static void faults_from_env(struct tr__comm *c)
{
    const char *fault = getenv("TROUPE_FAULT_HEADER_RANK");
    c->fault_rank = fault ? atoi(fault) : -1;
    fault = getenv("TROUPE_FAULT_COUNT_RANK");
    c->fault_count = fault ? atoi(fault) : -1;
    fault = getenv("TROUPE_FAULT_SILENT_RANK");
    c->fault_silent = fault ? atoi(fault) : -1;
    fault = getenv("TROUPE_FAULT_SILENT_GATHER_RANK");
    c->fault_gather_silent = fault ? atoi(fault) : -1;
    fault = getenv("TROUPE_FAULT_KILL_RANK");
    c->fault_kill = fault ? atoi(fault) : -1;
    fault = getenv("TROUPE_FAULT_KILL_STEP");
    c->fault_kill_step = fault ? strtoull(fault, NULL, 10) : 1;
}

/* Before the first step, on more than one rank: every rank's resolved config is the same
 * (runtime/config/agree.h), else every rank fails with the keys that differ. */
static int agree_config(struct tr__comm *c, char *err, size_t errlen)
{
    const tr_config_t *cfg = c->eng->cfg;
    char why[2048] = "";
    if (c->eng->world < 2) return 0;
    int rc =
        tr__config_agree(cfg, c->backend, (double)cfg->troupe.comm.timeout_s, why, sizeof(why));
    return rc < 0 ? tr__errf(err, errlen, rc, "%s: %s", cfg->source, why) : 0;
}

/* The backend, and on more than one rank the headers' communicator and the watchdog's control
 * channel (groups split off it: every rank does this at create, in the same order). */
static int open_comms(struct tr__comm *c, char *err, size_t errlen)
{
    const tr__plan_t *eng = c->eng;
    const tr_config_t *cfg = eng->cfg;
    char why[256];
    const char *name = cfg->troupe.comm.backend;
    if (!name || !strcmp(name, "auto")) name = eng->world > 1 ? "mpi" : "local";
    int rc = tr_comm_create(name, eng->rank, eng->world, op_done, c, &c->backend, why, sizeof(why));
    if (rc < 0) return tr__errf(err, errlen, rc, "%s: troupe.comm.backend: %s", cfg->source, why);
    if (eng->world > 1) {
        rc = c->backend->ops->split
                 ? tr_comm_split(c->backend, 0, eng->rank, &c->headers, why, sizeof(why))
                 : tr__errf(why, sizeof(why), TR_ENOTSUP, "backend '%s' has no groups", name);
        if (rc < 0)
            return tr__errf(err, errlen, rc, "comm: the collective headers' communicator: %s", why);
        c->headers->done = header_done;
        c->headers->done_arg = c;
    }
    rc = tr__watch_create(c->backend, control_done, c, &c->watch, why, sizeof(why));
    if (rc < 0) return tr__errf(err, errlen, rc, "comm: the watchdog's control channel: %s", why);
    return agree_config(c, err, errlen);
}

int tr__comm_spawn(const tr__plan_t *eng, struct tr__comm **state, tr_actor_t *self,
                   uint64_t *comm_bytes, char *err, size_t errlen)
{
    struct tr__comm *c = calloc(1, sizeof(*c));
    if (!c) return TR_ENOMEM;
    *state = c;
    c->eng = eng;
    c->rt = eng->rt;
    const tr_config_t *cfg = eng->cfg;
    double world = eng->world, pre = cfg->gradient_predivide_factor;
    if (cfg->prescale_gradients) {
        c->pre = (float)(1.0 / world);
        c->post = 1.0f;
    } else {
        c->pre = (float)(1.0 / pre);
        c->post = pre != world ? (float)(pre / world) : 1.0f;
    }
    if (cfg->comms_logger.enabled && tr_comms_log_create(eng->world, &c->log) < 0) return TR_ENOMEM;
    c->wire = eng->world > 1 ? (tr_dtype_t)cfg->communication_data_type : TR_DTYPE_F32;
    if (c->wire != TR_DTYPE_F32 && !(c->wire16 = tr__vmem_alloc(eng->n_params * sizeof(uint16_t))))
        return TR_ENOMEM;
    /* mapped whole, resident only for the buckets in flight: at ZeRO 2 and 3 the backward's
     * window, else every bucket of a step at once */
    size_t flight = eng->grad_window ? eng->grad_window : eng->n_params;
    *comm_bytes = c->wire16 ? flight * sizeof(uint16_t) : 0;
    c->log_verbose = cfg->comms_logger.verbose;
    faults_from_env(c);
    c->timeout_ns = (uint64_t)cfg->troupe.comm.timeout_s * 1000000000ull;
    c->eager = eager_polls(eng);
    int rc = open_comms(c, err, errlen);
    if (rc < 0) return rc;
    tr_actor_opts_t o = {.name = "comm",
                         .pinned = c->backend->ops->progress != NULL, /* it polls and sleeps */
                         .defer_stop = 1,
                         .supervisor = eng->supervisor,
                         /* its handlers post and poll (and sleep between polls): the
                          * communication itself is on the collectives lanes */
                         .lane_kind = TR_LANE_CONTROL};
    rc = tr_actor_spawn(eng->rt, comm_behaviour, c, &o, self);
    c->self = *self; /* before any message: completions are addressed to it */
    uint64_t tick;
    if (rc == 0 && c->watch) rc = tr_timer_start(eng->rt, c->self, 0, TR__WATCH_TICK_NS, 0, &tick);
    return rc;
}

void tr__comm_free(struct tr__comm *c)
{
    if (!c) return;
    if (c->log && c->eng->rank == 0 && tr_comms_log_count(c->log)) {
        tr_comms_log_summary(c->log, stdout); /* DeepSpeed's log_summary, at the end */
        fflush(stdout);
    }
    tr_comms_log_destroy(c->log);
    tr__watch_destroy(c->watch);
    tr_comm_destroy(c->headers);
    tr_comm_destroy(c->backend);
    for (size_t i = 0; i < c->cap; i++) {
        free(c->pending[i].vals);
        free(c->pending[i].hdr);
    }
    free(c->pending);
    free(c->xfers);
    free(c->free_slots);
    free(c->by_seq);
    free(c->by_req);
    if (c->wire16) tr__vmem_free(c->wire16, c->eng->n_params * sizeof(uint16_t));
    free(c);
}
