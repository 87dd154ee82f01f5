/* comm.c: the comm actor. Each BUCKET is all-reduced (ZeRO 2: reduce-scattered) over the
 * data-parallel ranks by the backend and passed on to the optimizer as REDUCED once the
 * backend reports its completion, which arrives as a COMM_DONE message; several buckets may be
 * in flight at once. It also serves the scalar and vector all-reduces (losses, norms, Lamb's
 * sums) and ZeRO's parameter all-gather.
 *
 * Every collective is submitted with a header (operation, sequence, bytes, dtype, step,
 * micro-step, bucket) that is all-gathered first, on a communicator of its own; the collective
 * starts once every rank's header has arrived and matches, in the order submitted, so a rank
 * that diverged is named on every rank and no mismatched collective is ever posted.
 *
 * A backend whose operations need progress (MPI: Open MPI moves a collective on only inside
 * its calls) makes the actor pinned; while anything is pending it sends itself COMM_POLL
 * messages, each running the backend's progress once. A poll after one that completed nothing
 * sleeps first, an eighth of the youngest pending operation's age (1 to 256 us: backoff_ns), so
 * a short operation is noticed at once and a long one costs little CPU; with nothing pending
 * no poll is sent and the actor parks. The local
 * backend completes at once and needs none of this.
 *
 * Scaling follows DeepSpeed's allreduce_bucket: by default the bucket is divided by
 * gradient_predivide_factor before the sum and multiplied by predivide / world after it (a
 * mean over ranks, computed so that fp16 sums do not overflow); with prescale_gradients it
 * is divided by world before the sum. At world size 1 with the default factor both are
 * no-ops and are skipped.
 *
 * The watchdog: a collective pending past troupe.comm.timeout_s starts the diagnosis across
 * ranks of comm_watch.c (rank 0 gathers every rank's table of pending operations over a control
 * channel and names the rank that diverged); the channel is moved on by a slow timer (TIMER,
 * every TR__WATCH_TICK_NS) so that a rank with nothing pending still answers. A group of one, or
 * a backend without point-to-point, has no channel: its watchdog fails the engine at once.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "actors/comm_watch.h"
#include "actors/engine_internal.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/vec.h"
#include "monitor/comms_log.h"
#include "runtime/comm.h"

/* What a data entry of the pending table does once its header has been agreed. */
typedef enum { OP_BUCKET = 1, OP_SCALAR, OP_GATHER, OP_VECTOR } op_kind_t;

/* What every collective carries, exchanged (all-gathered, on a communicator of their own)
 * before it is started and compared on arrival: a rank that diverged is named at once, and
 * no mismatched collective is ever posted. */
typedef struct header {
    uint32_t op;      /* 1: a bucket's all-reduce, 2: a scalar all-reduce, 3: an all-gather,
                       * 4: a bucket's reduce-scatter, 5: a vector all-reduce */
    uint32_t dtype;
    uint64_t seq;     /* collectives this comm actor submitted, from 1 */
    uint64_t bytes;
    uint64_t step;
    uint32_t micro_step, bucket; /* a scalar all-reduce: its requester's `what` */
} header_t;

typedef struct pending {
    uint64_t req; /* 0: free; UINT64_MAX: not started yet */
    op_kind_t kind;              /* 0: a header exchange (hdr) */
    header_t head;               /* its header */
    bool agreed;                 /* every rank's header matched: it may start */
    void *ptr;                   /* a gather's or vector's buffer */
    uint32_t bucket;
    uint64_t step;
    tr_tensor_ref_t grads;       /* a bucket: its range of the gradient buffer */
    float *data;
    size_t mine, mine_at;        /* ZeRO 2: this rank's part of it (elements, flat index) */
    bool scatter;                /* ZeRO 2: reduce-scattered (the part is at the start) */
    tr_actor_t asker;            /* a COMM_SCALAR's requester (none for a bucket) */
    tr_msg_comm_scalar_t scalar; /* its request */
    double *vals;                /* its values, reduced in place (not in this table, which
                                  * may move while the operation is in flight) */
    uint64_t t_start;            /* for the comms logger and the watchdog */
    struct header *hdr;          /* a header exchange: every rank's, then ours (else NULL) */
    bool gather;                 /* a parameter all-gather for asker (ZeRO 1) */
    bool vector;                 /* a COMM_REDUCE's in-place all-reduce for asker */
    uint32_t reduce_op, what;    /* its reduction and the asker's tag */
    int lane;                    /* its trace lane (TR__LANE_COLLECTIVES - lane), -1: none */
    tr_tensor_ref_t buf;         /* its buffer: the parameters */
    tr__watch_op_t op;           /* its header, for the watchdog's table */
} pending_t;

struct tr__comm {
    const tr_engine_t *eng;
    tr_runtime_t *rt;
    tr_actor_t self;
    tr_comm_t *backend;
    tr_comm_t *headers; /* the header exchanges' own communicator (NULL: a group of one) */
    uint64_t started;   /* collectives started on the backend (in seq order) */
    float pre, post; /* multipliers before and after the sum (1: none) */
    tr_dtype_t wire; /* communication_data_type on more than one rank: F32, F16 or BF16 */
    uint16_t *wire16; /* a 16-bit wire's copy of the gradients, indexed as the gradient buffer
                       * (buckets are disjoint ranges: no two in flight share any of it) */
    bool polling;    /* a COMM_POLL is on its way */
    int inflight;    /* operations the backend holds, as of the last start or progress */
    pending_t *pending; /* operations in flight (grows; a step's buckets at most) */
    size_t cap;
    tr_comms_log_t *log; /* comms_logger (NULL: off) */
    bool log_verbose;
    uint64_t seq;        /* collectives submitted */
    unsigned lanes_busy; /* trace lanes held by collectives in flight (bit k: lane k) */
    uint64_t timeout_ns; /* troupe.comm.timeout_s */
    bool broken;         /* the ranks diverged or a collective failed: start nothing more */
    int fault_rank;      /* TROUPE_FAULT_HEADER_RANK: this rank sends a wrong header (tests) */
    int fault_silent;    /* TROUPE_FAULT_SILENT_RANK: this rank stops posting after step 0 */
    int fault_kill;      /* TROUPE_FAULT_KILL_RANK: this rank kills itself (SIGKILL) ... */
    uint64_t fault_kill_step; /* ... on the first bucket of TROUPE_FAULT_KILL_STEP */
    tr__watch_op_t last; /* the last collective's header (seq == seq) */
    tr__watch_t *watch;  /* the diagnosis across ranks (NULL: a group of one) */
};

/* After the backend was asked to start p's operation (rc, req): records it as in flight, or
 * frees p and fails the engine naming `what` and the backend's reason. */
static int track(struct tr__comm *c, pending_t *p, int rc, uint64_t req, const char *what)
{
    if (rc < 0) {
        free(p->hdr), free(p->vals);
        *p = (pending_t){0};
        tr__engine_fail(c->eng, rc, "comm: %s on backend '%s' failed: %s", what,
                        c->backend->name, c->backend->error[0] ? c->backend->error
                                                                : tr_strerror(rc));
        return rc;
    }
    p->req = req;
    c->inflight++;
    p->lane = -1;
    for (int k = 0; !p->hdr && c->eng->mon && k < TR__COLLECTIVE_LANES && p->lane < 0; k++)
        if (!(c->lanes_busy & 1u << k)) c->lanes_busy |= 1u << (p->lane = k);
    return 0;
}

static tr__watch_op_t watch_op(const header_t *h, bool exchange)
{
    return (tr__watch_op_t){.op = h->op, .dtype = h->dtype, .seq = h->seq, .bytes = h->bytes,
                            .step = h->step, .micro_step = h->micro_step, .bucket = h->bucket,
                            .exchange = exchange};
}

static void describe(const header_t *h, char *out, size_t len)
{
    tr__watch_op_t o = watch_op(h, false);
    tr__watch_describe(&o, out, len);
}

/* Room for n more entries in the pending table (pointers into it stay valid until the next
 * call). */
static int pending_reserve(struct tr__comm *c, size_t n)
{
    size_t free_slots = 0;
    for (size_t i = 0; i < c->cap; i++)
        free_slots += !c->pending[i].req;
    if (free_slots >= n) return 0;
    size_t cap = c->cap ? 2 * c->cap : 64;
    while (cap - c->cap + free_slots < n)
        cap *= 2;
    pending_t *p = realloc(c->pending, cap * sizeof(*p));
    if (!p) return TR_ENOMEM;
    memset(p + c->cap, 0, (cap - c->cap) * sizeof(*p));
    c->pending = p;
    c->cap = cap;
    return 0;
}

/* A free entry; pending_reserve first. */
static pending_t *pending_slot(struct tr__comm *c)
{
    for (size_t i = 0; i < c->cap; i++)
        if (!c->pending[i].req) return &c->pending[i];
    return NULL;
}

/* The data operation submitted as collective `seq` (not started yet), or NULL. */
static pending_t *submitted(struct tr__comm *c, uint64_t seq)
{
    for (size_t i = 0; i < c->cap; i++)
        if (c->pending[i].req && c->pending[i].kind && c->pending[i].head.seq == seq)
            return &c->pending[i];
    return NULL;
}

static int start(struct tr__comm *c, pending_t *p);

/* Starts, in the order submitted, every operation whose header every rank agreed on: all ranks
 * start the same sequence of collectives on the data communicator. */
static int start_agreed(struct tr__comm *c)
{
    pending_t *p;
    while (!c->broken && (p = submitted(c, c->started + 1)) && p->agreed &&
           p->req == UINT64_MAX) {
        c->started++;
        int rc = start(c, p);
        if (rc < 0) return rc;
    }
    return 0;
}

/* Exchanges h on the headers' communicator (an all-gather of every rank's). */
static int post_header(struct tr__comm *c, header_t h)
{
    const tr_engine_t *e = c->eng;
    if (e->rank == c->fault_rank) h.bytes += 4; /* the test's injected divergence */
    pending_t *p = pending_slot(c);
    header_t *all = calloc((size_t)e->world + 1, sizeof(header_t));
    if (!p || !all) return free(all), TR_ENOMEM;
    all[e->world] = h;
    *p = (pending_t){.req = UINT64_MAX, .head = h, .step = h.step, .asker = TR_ACTOR_NONE,
                     .hdr = all, .t_start = tr_now_ns(), .op = watch_op(&h, true)};
    c->headers->op_tag = h.step;
    uint64_t req = 0;
    int rc = c->headers->ops->all_gather(c->headers, &all[e->world], all, sizeof(header_t),
                                         TR_DTYPE_U8, &req);
    return track(c, p, rc, req, "exchanging a collective's header");
}

/* Records operation op under header h and starts it: at once in a group of one, else once
 * every rank's header has arrived and matches this one. A rank that diverged is then named
 * before any mismatched collective is posted (MPI could only fail it, or hang). */
static int submit(struct tr__comm *c, pending_t op, header_t h)
{
    h.seq = ++c->seq;
    c->last = watch_op(&h, false);
    if (pending_reserve(c, 2) < 0) return free(op.vals), TR_ENOMEM;
    pending_t *p = pending_slot(c);
    op.req = UINT64_MAX;
    op.head = h;
    op.op = c->last;
    op.agreed = !c->headers;
    op.t_start = tr_now_ns();
    *p = op;
    int rc = c->headers ? post_header(c, h) : 0;
    return rc < 0 ? rc : start_agreed(c);
}

/* The headers arrived: every rank's must be ours; then the collective may start. */
static int check_headers(struct tr__comm *c, pending_t *p)
{
    const tr_engine_t *e = c->eng;
    header_t *all = p->hdr, *mine = &all[e->world];
    int rc = 0;
    for (int r = 0; r < e->world && rc == 0; r++)
        if (memcmp(&all[r], mine, sizeof(header_t))) {
            char a[200], b[200];
            describe(&all[r], a, sizeof(a));
            describe(mine, b, sizeof(b));
            tr__engine_fail(e, TR_ECOMM,
                            "comm: the ranks diverged: rank %d is at %s; rank %d is at %s",
                            r, a, e->rank, b);
            rc = TR_ECOMM;
            c->broken = true;
        }
    uint64_t seq = mine->seq;
    free(all);
    *p = (pending_t){0};
    pending_t *op = rc < 0 ? NULL : submitted(c, seq);
    if (op) op->agreed = true;
    return rc < 0 ? rc : start_agreed(c);
}

/* comms_logger: one completed operation, and its verbose line on rank 0; the trace: its span
 * on the collectives lane. */
static void log_op(struct tr__comm *c, const char *op, double bytes, pending_t *p)
{
    uint64_t t_start = p->t_start;
    const tr_config_comms_logger_t *cl = &c->eng->cfg->comms_logger;
    if (p->lane >= 0) {
        tr_monitor_span(c->eng->mon, &(tr_span_t){op, t_start, tr_now_ns(), p->step, 0,
                                                  TR__LANE_COLLECTIVES - (uint32_t)p->lane,
                                                  (uint64_t)bytes, 0});
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
static void channel_done(struct tr__comm *c, uint32_t channel, uint64_t req, uint64_t tag,
                         int rc)
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
        tr__engine_fail(c->eng, TR_ENOMEM, "comm: a completion on channel %u could not be "
                        "delivered", channel);
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

/* ZeRO 2: the part of bucket [a, b) that each rank owns, as counts; this rank's part
 * (elements and flat index) in *mine, *mine_at. NULL: no memory. */
static size_t *bucket_parts(const tr_engine_t *e, size_t a, size_t b, size_t *mine,
                            size_t *mine_at)
{
    size_t *counts = malloc((size_t)e->world * sizeof(size_t));
    for (int r = 0; counts && r < e->world; r++) {
        size_t lo, hi;
        tr__zero_owned(e->n_params, e->world, r, &lo, &hi);
        lo = lo > a ? lo : a, hi = hi < b ? hi : b;
        counts[r] = hi > lo ? hi - lo : 0;
        if (r == e->rank) *mine = counts[r], *mine_at = counts[r] ? lo : a;
    }
    return counts;
}

/* Starts a bucket's reduction: a reduce-scatter (ZeRO 2; the rank's part lands at the bucket's
 * start), else an all-reduce (ZeRO 2 without reduce_scatter keeps its part of the sum). */
static int reduce_bucket(struct tr__comm *c, pending_t *p, size_t count, uint64_t *req)
{
    const tr_engine_t *e = c->eng;
    size_t a = p->grads.offset / sizeof(float);
    void *buf = c->wire16 ? (void *)(c->wire16 + a) : (void *)p->data;
    if (!p->scatter)
        return c->backend->ops->all_reduce(c->backend, buf, count, c->wire, TR_REDUCE_SUM, req);
    size_t *counts = bucket_parts(e, a, a + count, &p->mine, &p->mine_at);
    if (!counts) return TR_ENOMEM;
    int rc = c->backend->ops->reduce_scatter_v(c->backend, buf, counts, c->wire, req);
    free(counts); /* the backend keeps its own copy */
    return rc;
}

/* A 16-bit wire: the bucket's floats, scaled, to fp16 or bf16 (rounded to nearest even), and
 * back. Scalar loops: the kernels' pool belongs to the executor. */
static void to_wire(struct tr__comm *c, const float *x, size_t a, size_t n)
{
    uint16_t *w = c->wire16 + a;
    for (size_t i = 0; i < n; i++)
        w[i] = c->wire == TR_DTYPE_BF16 ? tr_bf16_from_float(x[i]) : tr_half_from_float(x[i]);
}

static void from_wire(const struct tr__comm *c, float *x, size_t a, size_t n)
{
    const uint16_t *w = c->wire16 + a;
    for (size_t i = 0; i < n; i++)
        x[i] = c->wire == TR_DTYPE_BF16 ? tr_bf16_to_float(w[i]) : tr_half_to_float(w[i]);
}

static int on_bucket(struct tr__comm *c, tr_msg_t *msg)
{
    if (c->broken) return 0; /* the engine has failed already: no more collectives */
    if (c->eng->rank == c->fault_silent && msg->step > 0) return 0; /* the test's silent rank */
    const tr_engine_t *e = c->eng;
    tr_msg_bucket_t *b = TR_MSG_AS(msg, bucket);
    char why[256];
    float *data = tr__resolve(e, &b->grads, why, sizeof(why));
    if (!data) {
        tr__engine_fail(e, TR_EINVAL, "comm: bucket %u: %s", b->bucket, why);
        return TR_EINVAL;
    }
    size_t count = b->grads.length / sizeof(float), a = b->grads.offset / sizeof(float);
    bool scatter = e->zero == 2 && e->cfg->zero.reduce_scatter;
    pending_t op = {.kind = OP_BUCKET, .bucket = b->bucket, .step = msg->step,
                    .grads = b->grads, .data = data, .mine = count, .mine_at = a,
                    .scatter = scatter, .asker = TR_ACTOR_NONE};
    if (e->zero == 2 && !scatter) { /* the all-reduce path: this rank's part of the sum */
        size_t *counts = bucket_parts(e, a, a + count, &op.mine, &op.mine_at);
        if (!counts) return TR_ENOMEM;
        free(counts);
    }
    scale(data, count, scatter ? 1.0f / (float)e->world : c->pre);
    if (c->wire16) to_wire(c, data, a, count);
    return submit(c, op, (header_t){.op = scatter ? 4 : 1, .dtype = c->wire,
                                    .bytes = count * tr_dtype_size(c->wire), .step = msg->step,
                                    .micro_step = msg->micro_step, .bucket = b->bucket});
}

/* COMM_SCALAR: a few doubles all-reduced for an actor (a loss, a count). */
static int on_scalar(struct tr__comm *c, tr_msg_t *msg)
{
    if (c->broken) return 0;
    tr_msg_comm_scalar_t *s = TR_MSG_AS(msg, comm_scalar);
    if (s->n < 1 || s->n > 4 || s->op >= TR_REDUCE_COUNT_) {
        tr__engine_fail(c->eng, TR_EINVAL, "comm: scalar all-reduce of %u values (op %u) from "
                        "actor %llx refused", s->n, s->op, (unsigned long long)msg->sender.id);
        return TR_EINVAL;
    }
    double *vals = malloc(sizeof(s->values));
    if (!vals) return TR_ENOMEM;
    memcpy(vals, s->values, sizeof(s->values));
    pending_t op = {.kind = OP_SCALAR, .step = msg->step, .asker = msg->sender, .scalar = *s,
                    .vals = vals};
    return submit(c, op, (header_t){.op = 2, .dtype = TR_DTYPE_F64,
                                    .bytes = s->n * sizeof(double), .step = msg->step,
                                    .micro_step = msg->micro_step, .bucket = s->what});
}

/* COMM_GATHER (ZeRO 1, 2): every rank's slice of the parameters (tr__zero_owned) all-gathered
 * in place, in the parameter buffer. */
static int on_gather(struct tr__comm *c, tr_msg_t *msg)
{
    if (c->broken) return 0;
    const tr_engine_t *e = c->eng;
    tr_msg_comm_gather_t *g = TR_MSG_AS(msg, comm_gather);
    char why[256];
    float *buf = tr__resolve(e, &g->buf, why, sizeof(why));
    size_t n = g->buf.length / sizeof(float);
    if (!buf || g->count != tr__zero_slice(n, e->world)) {
        tr__engine_fail(e, TR_EINVAL, "comm: parameter all-gather: %s",
                        buf ? "the slices do not cover the buffer" : why);
        return TR_EINVAL;
    }
    pending_t op = {.kind = OP_GATHER, .step = msg->step, .asker = msg->sender, .gather = true,
                    .buf = g->buf, .ptr = buf};
    return submit(c, op, (header_t){.op = 3, .dtype = TR_DTYPE_F32,
                                    .bytes = n * sizeof(float), .step = msg->step});
}

/* COMM_REDUCE: a registered fp64 buffer all-reduced in place for the asker. */
static int on_reduce(struct tr__comm *c, tr_msg_t *msg)
{
    if (c->broken) return 0;
    const tr_engine_t *e = c->eng;
    tr_msg_comm_reduce_t *v = TR_MSG_AS(msg, comm_reduce);
    char why[256];
    double *buf = v->op < TR_REDUCE_COUNT_ ? tr__resolve(e, &v->buf, why, sizeof(why)) : NULL;
    if (!buf) {
        tr__engine_fail(e, TR_EINVAL, "comm: vector all-reduce (op %u): %s", v->op,
                        v->op < TR_REDUCE_COUNT_ ? why : "no such reduction");
        return TR_EINVAL;
    }
    pending_t op = {.kind = OP_VECTOR, .step = msg->step, .asker = msg->sender, .vector = true,
                    .buf = v->buf, .ptr = buf, .reduce_op = v->op, .what = v->what};
    return submit(c, op, (header_t){.op = 5, .dtype = TR_DTYPE_F64, .bytes = v->buf.length,
                                    .step = msg->step});
}

/* Starts p's collective on the backend, now that every rank's header agreed. */
static int start(struct tr__comm *c, pending_t *p)
{
    const tr_engine_t *e = c->eng;
    const tr_comm_ops_t *ops = c->backend->ops;
    c->backend->op_tag = p->step;
    uint64_t req = 0;
    int rc = 0;
    const char *what = "a scalar all-reduce";
    if (p->kind == OP_BUCKET) {
        what = p->scatter ? "a bucket's reduce-scatter" : "a bucket's all-reduce";
        rc = reduce_bucket(c, p, p->grads.length / sizeof(float), &req);
    } else if (p->kind == OP_SCALAR) {
        rc = ops->all_reduce(c->backend, p->vals, p->scalar.n, TR_DTYPE_F64,
                             (tr_reduce_op_t)p->scalar.op, &req);
    } else if (p->kind == OP_VECTOR) {
        what = "a vector all-reduce";
        rc = ops->all_reduce(c->backend, p->ptr, p->buf.length / sizeof(double), TR_DTYPE_F64,
                             (tr_reduce_op_t)p->reduce_op, &req);
    } else {
        what = "the parameter all-gather";
        size_t n = p->buf.length / sizeof(float), S = tr__zero_slice(n, e->world);
        size_t *counts = malloc((size_t)e->world * sizeof(size_t));
        for (size_t r = 0; counts && r < (size_t)e->world; r++)
            counts[r] = r * S >= n ? 0 : (r + 1) * S <= n ? S : n - r * S;
        rc = counts ? ops->all_gather_v(c->backend, p->ptr, counts, TR_DTYPE_F32, &req)
                    : TR_ENOMEM;
        free(counts); /* the backend keeps its own copy */
    }
    return track(c, p, rc, req, what);
}

/* The result m goes back to whoever asked for p's operation, and p's entry is free again. */
static int answer(tr_ctx_t *ctx, pending_t *p, tr_msg_t *m)
{
    tr_actor_t to = p->asker;
    m->step = p->step;
    p->req = 0;
    int rc = tr_actor_send(ctx->rt, to, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    return rc;
}

static int reduce_done(tr_ctx_t *ctx, struct tr__comm *c, pending_t *p)
{
    log_op(c, "all_reduce", (double)p->buf.length, p);
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_COMM_REDUCE);
    if (!m) return TR_ENOMEM;
    *TR_MSG_AS(m, comm_reduce) = (tr_msg_comm_reduce_t){.buf = p->buf, .op = p->reduce_op,
                                                        .what = p->what};
    return answer(ctx, p, m);
}

static int gather_done(tr_ctx_t *ctx, struct tr__comm *c, pending_t *p)
{
    log_op(c, "all_gather", (double)(p->buf.length / (uint64_t)c->eng->world), p);
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_COMM_GATHER);
    if (!m) return TR_ENOMEM;
    TR_MSG_AS(m, comm_gather)->buf = p->buf;
    TR_MSG_AS(m, comm_gather)->count = tr__zero_slice(p->buf.length / sizeof(float),
                                                      c->eng->world);
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

static int on_done(tr_ctx_t *ctx, struct tr__comm *c, const tr_msg_comm_done_t *d)
{
    pending_t *p = NULL; /* channel 2: a header exchange; 0: a data collective */
    for (size_t i = 0; i < c->cap && !p; i++)
        if (c->pending[i].req == d->req && (c->pending[i].hdr != NULL) == (d->channel == 2))
            p = &c->pending[i];
    if (!p || d->rc < 0) {
        int rc = d->rc < 0 ? d->rc : TR_EINVAL;
        tr__engine_fail(c->eng, rc, "comm: request %llu %s", (unsigned long long)d->req,
                        p ? tr_strerror(d->rc) : "completed but was never started");
        return rc;
    }
    if (p->hdr) { /* a mismatch fails the engine with the explanation; the actor stays */
        check_headers(c, p);
        return 0;
    }

    if (p->gather) return gather_done(ctx, c, p);
    if (p->vector) return reduce_done(ctx, c, p);
    if (!tr_actor_is_none(p->asker)) return scalar_done(ctx, c, p);
    return bucket_done(ctx, c, p);
}

/* A bucket's reduction finished: the reduced values (all of the bucket, or this rank's part of
 * it) to the optimizer. */
static int bucket_done(tr_ctx_t *ctx, struct tr__comm *c, pending_t *p)
{
    const tr_engine_t *e = c->eng;
    size_t count = p->grads.length / sizeof(float), a = p->grads.offset / sizeof(float);
    double bytes = (double)count * (double)tr_dtype_size(c->wire);
    if (p->scatter)
        log_op(c, "reduce_scatter", bytes / e->world, p);
    else
        log_op(c, "all_reduce", bytes, p);
    if (c->wire16) /* the reduced values (a reduce-scatter's: this rank's part, at the start) */
        from_wire(c, p->data, a, p->scatter ? p->mine : count);
    if (!p->scatter) scale(p->data, count, c->post);
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_REDUCED);
    if (!m) return TR_ENOMEM;
    tr_msg_reduced_t *r = TR_MSG_AS(m, reduced);
    r->bucket = p->bucket;
    r->grads = p->grads;
    r->grads.offset = (p->scatter ? a : p->mine_at) * sizeof(float); /* where the values are */
    r->grads.length = p->mine * sizeof(float);
    r->at = p->mine_at;
    r->covers = count;
    r->first = a;
    m->step = p->step;
    p->req = 0;
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

/* This rank's table for the watchdog: the last collective started and the pending ones,
 * oldest first (at most TR__WATCH_MAX_OPS). */
static void my_table(const struct tr__comm *c, uint64_t now, tr__watch_table_t *t)
{
    *t = (tr__watch_table_t){.rank = c->eng->rank, .started = c->seq, .last = c->last};
    for (size_t i = 0; i < c->cap; i++) { /* insertion, oldest first, the youngest dropped */
        const pending_t *p = &c->pending[i];
        double age = (double)(now - p->t_start) / 1e9;
        if (!p->req || p->hdr || /* a collective's header exchange: listed as the collective */
            (t->n == TR__WATCH_MAX_OPS && age <= t->ops[t->n - 1].pending_s))
            continue;
        int at = t->n < TR__WATCH_MAX_OPS ? t->n++ : TR__WATCH_MAX_OPS - 1;
        t->ops[at] = p->op;
        t->ops[at].exchange = !p->agreed; /* still waiting for every rank's header */
        t->ops[at].pending_s = age;
        for (; at > 0 && t->ops[at - 1].pending_s < age; at--) {
            tr__watch_op_t older = t->ops[at];
            t->ops[at] = t->ops[at - 1], t->ops[at - 1] = older;
        }
    }
}

/* The engine fails for the watchdog's reason (the diagnosis on rank 0): collectives still
 * pending then end the job at shutdown (the backend aborts it). */
static void watch_fail(struct tr__comm *c, const char *why)
{
    tr__engine_fail(c->eng, TR_ETIMEDOUT, "%s", why);
    c->broken = true;
}

/* The watchdog: when the oldest pending collective has waited past troupe.comm.timeout_s,
 * the diagnosis across ranks starts (comm_watch.c), or with no control channel the engine
 * fails at once naming the collective; the backend then ends the job at shutdown (its
 * collectives cannot complete). */
static int watchdog(struct tr__comm *c)
{
    const pending_t *old = NULL;
    for (size_t i = 0; i < c->cap; i++)
        if (c->pending[i].req && (!old || c->pending[i].t_start < old->t_start))
            old = &c->pending[i];
    uint64_t now = tr_now_ns();
    if (!old || now - old->t_start < c->timeout_ns) return 0;
    if (c->watch) {
        tr__watch_table_t t;
        my_table(c, now, &t);
        tr__watch_alarm(c->watch, &t, now);
        return 0;
    }
    const char *what = old->hdr         ? "a header exchange"
                       : old->gather     ? "the parameter all-gather"
                       : old->vector     ? "a vector all-reduce"
                       : old->scatter    ? "a bucket's reduce-scatter"
                       : tr_actor_is_none(old->asker) ? "a bucket's all-reduce"
                                                      : "a scalar all-reduce";
    char before[200] = ""; /* a header exchange: the collective it comes before */
    if (old->hdr) {
        char d[160];
        describe(&old->hdr[c->eng->world], d, sizeof(d));
        snprintf(before, sizeof(before), " before %s", d);
    }
    tr__engine_fail(c->eng, TR_ETIMEDOUT,
                    "comm: rank %d: %s (step %llu)%s has been pending for %.1f s, past "
                    "troupe.comm.timeout_s %lld: another rank diverged, stopped or died; the job "
                    "ends on every rank",
                    c->eng->rank, what, (unsigned long long)old->step, before,
                    (double)(now - old->t_start) / 1e9,
                    (long long)c->eng->cfg->troupe.comm.timeout_s);
    c->broken = true;
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
    tr_log(TR_LOG_ERROR, "comm: rank %d: TROUPE_FAULT_KILL_RANK: killing this process "
           "(SIGKILL) in step %llu", c->eng->rank, (unsigned long long)msg->step);
    raise(SIGKILL);
}

/* The sleep before a poll after one that completed nothing: an eighth of the age of the
 * youngest operation in flight, from 1 to 256 us. A header exchange or a short collective is
 * noticed within microseconds of its end, a long one within 1/8 of its time, and a long wait
 * costs at most ~4000 polls a second. */
static long backoff_ns(const struct tr__comm *c)
{
    uint64_t now = tr_now_ns(), youngest = UINT64_MAX;
    for (size_t i = 0; i < c->cap; i++)
        if (c->pending[i].req && now - c->pending[i].t_start < youngest)
            youngest = now - c->pending[i].t_start;
    uint64_t ns = youngest == UINT64_MAX ? 256000 : youngest / 8;
    return ns < 1000 ? 1000 : ns > 256000 ? 256000 : (long)ns;
}

/* One progress pass; polls again while anything is pending, after a backoff sleep when the
 * previous pass completed nothing. */
static int on_poll(tr_ctx_t *ctx, struct tr__comm *c, uint32_t idle_polls)
{
    c->polling = false;
    if (watchdog(c) < 0) return 0; /* the engine has failed; polling stops */
    if (idle_polls) nanosleep(&(struct timespec){0, backoff_ns(c)}, NULL);
    int left = c->backend->ops->progress(c->backend);
    int hl = left >= 0 && c->headers ? c->headers->ops->progress(c->headers) : 0;
    if (left < 0 || hl < 0) {
        tr__engine_fail(c->eng, left < 0 ? left : hl, "comm: %s",
                        left < 0 ? c->backend->error : c->headers->error);
        return left < 0 ? left : hl;
    }
    left += hl;
    bool progressed = left < c->inflight; /* the completions sent their COMM_DONE */
    c->inflight = left;
    return left > 0 ? schedule_poll(ctx, c, progressed ? 0 : idle_polls + 1) : 0;
}

static int comm_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    struct tr__comm *c = ctx->state;
    int rc = 0;
    if (msg->type == TR_MSG_TIMER && c->watch) return on_tick(ctx, c);
    if (msg->type == TR_MSG_COMM_DONE && TR_MSG_AS(msg, comm_done)->channel == 1)
        return on_control_done(c, TR_MSG_AS(msg, comm_done));
    if (msg->type == TR_MSG_BUCKET && c->fault_kill >= 0) inject_kill(c, msg);
    if (msg->type == TR_MSG_COMM_GATHER) rc = on_gather(c, msg);
    if (msg->type == TR_MSG_BUCKET) rc = on_bucket(c, msg);
    if (msg->type == TR_MSG_COMM_REDUCE) rc = on_reduce(c, msg);
    if (msg->type == TR_MSG_COMM_SCALAR) rc = on_scalar(c, msg);
    if (msg->type == TR_MSG_COMM_DONE) rc = on_done(ctx, c, TR_MSG_AS(msg, comm_done));
    if (msg->type == TR_MSG_COMM_POLL) return on_poll(ctx, c, TR_MSG_AS(msg, comm_poll)->idle_polls);
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
    fault = getenv("TROUPE_FAULT_SILENT_RANK");
    c->fault_silent = fault ? atoi(fault) : -1;
    fault = getenv("TROUPE_FAULT_KILL_RANK");
    c->fault_kill = fault ? atoi(fault) : -1;
    fault = getenv("TROUPE_FAULT_KILL_STEP");
    c->fault_kill_step = fault ? strtoull(fault, NULL, 10) : 1;
}

/* The backend, and on more than one rank the headers' communicator and the watchdog's control
 * channel (groups split off it: every rank does this at create, in the same order). */
static int open_comms(struct tr__comm *c, char *err, size_t errlen)
{
    const tr_engine_t *eng = c->eng;
    const tr_config_t *cfg = eng->cfg;
    char why[256];
    const char *name = cfg->troupe.comm.backend;
    if (!name || !strcmp(name, "auto")) name = eng->world > 1 ? "mpi" : "local";
    int rc = tr_comm_create(name, eng->rank, eng->world, op_done, c, &c->backend, why,
                            sizeof(why));
    if (rc < 0) return snprintf(err, errlen, "%s: troupe.comm.backend: %s", cfg->source, why), rc;
    if (eng->world > 1) {
        rc = c->backend->ops->split
                 ? tr_comm_split(c->backend, 0, eng->rank, &c->headers, why, sizeof(why))
                 : (snprintf(why, sizeof(why), "backend '%s' has no groups", name), TR_ENOTSUP);
        if (rc < 0)
            return snprintf(err, errlen, "comm: the collective headers' communicator: %s", why),
                   rc;
        c->headers->done = header_done;
        c->headers->done_arg = c;
    }
    rc = tr__watch_create(c->backend, control_done, c, &c->watch, why, sizeof(why));
    if (rc < 0) return snprintf(err, errlen, "comm: the watchdog's control channel: %s", why), rc;
    return 0;
}

int tr__comm_spawn(tr_engine_t *eng, char *err, size_t errlen)
{
    struct tr__comm *c = calloc(1, sizeof(*c));
    if (!c) return TR_ENOMEM;
    eng->cm = c;
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
    if (cfg->comms_logger.enabled && tr_comms_log_create(eng->world, &c->log) < 0)
        return TR_ENOMEM;
    c->wire = eng->world > 1 ? (tr_dtype_t)cfg->communication_data_type : TR_DTYPE_F32;
    if (c->wire != TR_DTYPE_F32 && !(c->wire16 = malloc(eng->n_params * sizeof(uint16_t))))
        return TR_ENOMEM;
    eng->memory.comm = c->wire16 ? eng->n_params * sizeof(uint16_t) : 0;
    c->log_verbose = cfg->comms_logger.verbose;
    faults_from_env(c);
    c->timeout_ns = (uint64_t)cfg->troupe.comm.timeout_s * 1000000000ull;
    int rc = open_comms(c, err, errlen);
    if (rc < 0) return rc;
    tr_actor_opts_t o = {.name = "comm",
                         .pinned = c->backend->ops->progress != NULL, /* it polls and sleeps */
                         .defer_stop = 1,
                         .supervisor = eng->supervisor,
                         /* its handlers post and poll (and sleep between polls): the
                          * communication itself is on the collectives lanes */
                         .lane_kind = TR_LANE_CONTROL};
    rc = tr_actor_spawn(eng->rt, comm_behaviour, c, &o, &eng->comm);
    c->self = eng->comm; /* before any message: completions are addressed to it */
    uint64_t tick;
    if (rc == 0 && c->watch) rc = tr_timer_start(eng->rt, c->self, 0, TR__WATCH_TICK_NS, 0, &tick);
    return rc;
}

void tr__comm_free(tr_engine_t *eng)
{
    if (!eng->cm) return;
    if (eng->cm->log && eng->rank == 0 && tr_comms_log_count(eng->cm->log)) {
        tr_comms_log_summary(eng->cm->log, stdout); /* DeepSpeed's log_summary, at the end */
        fflush(stdout);
    }
    tr_comms_log_destroy(eng->cm->log);
    tr__watch_destroy(eng->cm->watch);
    tr_comm_destroy(eng->cm->headers);
    tr_comm_destroy(eng->cm->backend);
    for (size_t i = 0; i < eng->cm->cap; i++)
        free(eng->cm->pending[i].vals), free(eng->cm->pending[i].hdr);
    free(eng->cm->pending);
    free(eng->cm->wire16);
    free(eng->cm);
    eng->cm = NULL;
}
