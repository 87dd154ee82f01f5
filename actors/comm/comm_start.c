/* comm_start.c: how the comm actor's collectives start. Each is submitted with a header that
 * is all-gathered on the headers' own communicator, posted just before the collective itself,
 * which starts at once on the backend, in the order submitted, so every rank posts the same
 * sequence. The two run side by side: the exchange costs a collective nothing on its critical
 * path (waiting for it before posting cost a 1 MiB all-reduce one more round of the ranks
 * meeting, ~30-100 us on 2 ranks and several times that with 2 ranks a core), and a result is
 * delivered only once every rank's header matched (comm.c), so a divergence is still named on
 * every rank before anything computed from a mismatched collective is used. Also the pending
 * table the operations live in, and the bucket-specific parts of a start (ZeRO 2's uneven
 * reduce-scatter, the 16-bit wire).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/comm/comm_internal.h"
#include "kernels/cpu/half.h"

/* --- the pending table -------------------------------------------------------------------- */

static size_t req_home(uint64_t req, size_t cap)
{
    return (size_t)((req * 0x9E3779B97F4A7C15ull) >> 20) & (2 * cap - 1); /* cap: a power of 2 */
}

static void req_insert(struct tr__comm *c, size_t idx)
{
    size_t mask = 2 * c->cap - 1, i = req_home(c->pending[idx].req, c->cap);
    while (c->by_req[i])
        i = (i + 1) & mask;
    c->by_req[i] = idx + 1;
}

/* Removes entry idx, shifting back the entries probed past it (linear probing's deletion). */
static void req_remove(struct tr__comm *c, size_t idx)
{
    size_t mask = 2 * c->cap - 1, i = req_home(c->pending[idx].req, c->cap);
    while (c->by_req[i] != idx + 1)
        i = (i + 1) & mask;
    for (size_t j = (i + 1) & mask; c->by_req[j]; j = (j + 1) & mask) {
        size_t home = req_home(c->pending[c->by_req[j] - 1].req, c->cap);
        bool movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            c->by_req[i] = c->by_req[j];
            i = j;
        }
    }
    c->by_req[i] = 0;
}

static bool started_req(const pending_t *p)
{
    return p->req && p->req != UINT64_MAX;
}

pending_t *tr__comm_pending_find(struct tr__comm *c, uint64_t req, bool hdr)
{
    if (!c->cap || !req || req == UINT64_MAX) return NULL;
    size_t mask = 2 * c->cap - 1;
    for (size_t i = req_home(req, c->cap); c->by_req[i]; i = (i + 1) & mask) {
        pending_t *p = &c->pending[c->by_req[i] - 1];
        if (p->req == req && (p->hdr != NULL) == hdr) return p;
    }
    return NULL;
}

/* Room for n more entries in the pending table (pointers into it stay valid until the next
 * call). Free entries are a stack and submitted ones are indexed by seq, so a step of many
 * buckets costs each of them O(1) here, not a scan of the table. */
static int pending_reserve(struct tr__comm *c, size_t n)
{
    if (c->n_free >= n) return 0;
    size_t cap = c->cap ? 2 * c->cap : 64;
    while (cap - c->cap + c->n_free < n)
        cap *= 2;
    pending_t *p = realloc(c->pending, cap * sizeof(*p));
    if (p) c->pending = p;
    size_t *f = p ? realloc(c->free_slots, cap * sizeof(*f)) : NULL;
    if (f) c->free_slots = f;
    size_t *s = f ? calloc(cap, sizeof(*s)) : NULL;
    size_t *r = s ? calloc(2 * cap, sizeof(*r)) : NULL;
    if (!r) {
        free(s);
        return TR_ENOMEM;
    }
    for (uint64_t q = c->started + 1; q <= c->seq && c->by_seq; q++) /* re-placed by seq % cap */
        s[q % cap] = c->by_seq[q % c->cap];
    free(c->by_seq);
    c->by_seq = s;
    memset(p + c->cap, 0, (cap - c->cap) * sizeof(*p));
    for (size_t i = cap; i > c->cap; i--) /* the lowest index on top */
        f[c->n_free++] = i - 1;
    free(c->by_req);
    c->by_req = r;
    c->cap = cap;
    for (size_t i = 0; i < cap; i++) /* rehashed for the new size */
        if (started_req(&p[i])) req_insert(c, i);
    return 0;
}

/* A free entry; pending_reserve first. */
static pending_t *pending_slot(struct tr__comm *c)
{
    return c->n_free ? &c->pending[c->free_slots[--c->n_free]] : NULL;
}

void tr__comm_pending_free(struct tr__comm *c, pending_t *p)
{
    if (started_req(p)) req_remove(c, (size_t)(p - c->pending));
    *p = (pending_t){0};
    c->free_slots[c->n_free++] = (size_t)(p - c->pending);
}

/* The data operation submitted as collective `seq` (not started yet), or NULL. */
static pending_t *submitted(struct tr__comm *c, uint64_t seq)
{
    if (seq <= c->started || seq > c->seq || !c->cap) return NULL;
    pending_t *p = &c->pending[c->by_seq[seq % c->cap]];
    return p->req && !p->hdr && p->head.seq == seq ? p : NULL;
}

/* After the backend was asked to start p's operation (rc, req): records it as in flight, or
 * frees p and fails the engine naming `what` and the backend's reason. */
static int track(struct tr__comm *c, pending_t *p, int rc, uint64_t req, const char *what)
{
    if (rc < 0) {
        free(p->hdr);
        free(p->vals);
        tr__comm_pending_free(c, p);
        tr__engine_fail(c->eng, rc, "comm: %s on backend '%s' failed: %s", what, c->backend->name,
                        c->backend->error[0] ? c->backend->error : tr_strerror(rc));
        return rc;
    }
    p->req = req;
    if (started_req(p)) req_insert(c, (size_t)(p - c->pending));
    c->inflight++;
    p->lane = -1;
    for (int k = 0; !p->hdr && c->eng->mon && k < TR__COLLECTIVE_LANES && p->lane < 0; k++)
        if (!(c->lanes_busy & 1u << k)) c->lanes_busy |= 1u << (p->lane = k);
    return 0;
}

static tr__watch_op_t watch_op(const header_t *h, bool exchange)
{
    return (tr__watch_op_t){.op = h->op,
                            .dtype = h->dtype,
                            .seq = h->seq,
                            .bytes = h->bytes,
                            .step = h->step,
                            .micro_step = h->micro_step,
                            .bucket = h->bucket,
                            .exchange = exchange};
}

const char *tr__comm_op_name(tr__coll_op_t op)
{
    switch (op) {
    case TR__COLL_ALL_REDUCE:
        return "a bucket's all-reduce";
    case TR__COLL_SCALAR:
        return "a scalar all-reduce";
    case TR__COLL_ALL_GATHER:
        return "the parameter all-gather";
    case TR__COLL_REDUCE_SCATTER:
        return "a bucket's reduce-scatter";
    case TR__COLL_VECTOR:
        return "a vector all-reduce";
    case TR__COLL_PIPE_SEND:
        return "a pipeline send";
    case TR__COLL_PIPE_RECV:
        return "a pipeline receive";
    }
    return "an unknown collective";
}

void tr__comm_describe(const header_t *h, char *out, size_t len)
{
    tr__watch_op_t o = watch_op(h, false);
    tr__watch_describe(&o, out, len);
}

static int start(struct tr__comm *c, pending_t *p);

/* Starts, in the order submitted, every operation submitted and not started yet: all ranks
 * start the same sequence of collectives on the data communicator. */
static int start_submitted(struct tr__comm *c)
{
    pending_t *p;
    while (!c->broken && (p = submitted(c, c->started + 1)) && p->req == UINT64_MAX) {
        c->started++;
        int rc = start(c, p);
        if (rc < 0) return rc;
    }
    return 0;
}

/* Exchanges h, the header of the collective in entry `of`, on the headers' communicator (an
 * all-gather of every rank's). */
static int post_header(struct tr__comm *c, header_t h, size_t of)
{
    const tr__plan_t *e = c->eng;
    if (e->rank == c->fault_rank) h.bytes += 4; /* the test's injected divergence */
    pending_t *p = pending_slot(c);
    header_t *all = calloc((size_t)e->world + 1, sizeof(header_t));
    if (!p || !all) {
        free(all);
        return TR_ENOMEM;
    }
    all[e->world] = h;
    *p = (pending_t){.req = UINT64_MAX,
                     .head = h,
                     .step = h.step,
                     .asker = TR_ACTOR_NONE,
                     .hdr = all,
                     .of = of,
                     .t_start = tr_now_ns(),
                     .op = watch_op(&h, true)};
    c->headers->op_tag = h.step;
    uint64_t req = 0;
    int rc = c->headers->ops->all_gather(c->headers, &all[e->world], all, sizeof(header_t),
                                         TR_DTYPE_U8, &req);
    rc = track(c, p, rc, req, "exchanging a collective's header");
    if (rc == 0) c->exchanges++;
    return rc;
}

/* Records operation op under header h and starts it at once, its header's exchange (on more
 * than one rank) posted just before it; its result waits for the exchange (comm.c). */
int tr__comm_submit(struct tr__comm *c, pending_t op, header_t h)
{
    if (pending_reserve(c, 2) < 0) { /* before the seq is taken: no seq without an entry */
        free(op.vals);
        return TR_ENOMEM;
    }
    h.seq = ++c->seq;
    c->last = watch_op(&h, false);
    pending_t *p = pending_slot(c);
    op.req = UINT64_MAX;
    op.head = h;
    op.op = c->last;
    op.agreed = !c->headers;
    op.t_start = tr_now_ns();
    *p = op;
    size_t at = (size_t)(p - c->pending);
    c->by_seq[h.seq % c->cap] = at;
    int rc = c->headers ? post_header(c, h, at) : 0;
    return rc < 0 ? rc : start_submitted(c);
}

/* The headers arrived: every rank's must be ours; then the collective is agreed, and delivered
 * now if it has ended. */
int tr__comm_headers_arrived(struct tr__comm *c, pending_t *p, pending_t **ready)
{
    const tr__plan_t *e = c->eng;
    header_t *all = p->hdr, *mine = &all[e->world];
    int rc = 0;
    *ready = NULL;
    c->exchanges--;
    for (int r = 0; r < e->world && rc == 0; r++)
        if (memcmp(&all[r], mine, sizeof(header_t))) {
            char a[200], b[200];
            tr__comm_describe(&all[r], a, sizeof(a));
            tr__comm_describe(mine, b, sizeof(b));
            tr__engine_fail(e, TR_ECOMM,
                            "comm: the ranks diverged: rank %d is at %s; rank %d is at %s", r, a,
                            e->rank, b);
            rc = TR_ECOMM;
            c->broken = true;
        }
    uint64_t seq = mine->seq;
    pending_t *op = &c->pending[p->of]; /* unless its start failed (the engine has failed) */
    free(all);
    tr__comm_pending_free(c, p);
    if (rc < 0 || !op->req || op->hdr || op->head.seq != seq) return rc;
    op->agreed = true;
    if (op->ended) *ready = op;
    return 0;
}

/* ZeRO 2: the part of bucket [a, b) that each rank owns, as counts; this rank's part
 * (elements and flat index) in *mine, *mine_at. NULL: no memory. */
size_t *tr__comm_bucket_parts(const tr__plan_t *e, size_t a, size_t b, size_t *mine,
                              size_t *mine_at)
{
    size_t *counts = malloc((size_t)e->world * sizeof(size_t));
    for (int r = 0; counts && r < e->world; r++) {
        size_t lo, hi;
        tr__zero_owned(e->n_params, e->world, r, &lo, &hi);
        lo = lo > a ? lo : a;
        hi = hi < b ? hi : b;
        counts[r] = hi > lo ? hi - lo : 0;
        if (r == e->rank) {
            *mine = counts[r];
            *mine_at = counts[r] ? lo : a;
        }
    }
    return counts;
}

/* Starts a bucket's reduction: a reduce-scatter (ZeRO 2; the rank's part lands at the bucket's
 * start), else an all-reduce (ZeRO 2 without reduce_scatter keeps its part of the sum). */
static int reduce_bucket(struct tr__comm *c, pending_t *p, size_t count, uint64_t *req)
{
    const tr__plan_t *e = c->eng;
    size_t a = p->grads.offset / sizeof(float);
    void *buf = c->wire16 ? (void *)(c->wire16 + a) : (void *)p->data;
    if (p->head.op != TR__COLL_REDUCE_SCATTER)
        return c->backend->ops->all_reduce(c->backend, buf, count, c->wire, TR_REDUCE_SUM, req);
    size_t *counts = tr__comm_bucket_parts(e, a, a + count, &p->mine, &p->mine_at);
    if (!counts) return TR_ENOMEM;
    int rc = c->backend->ops->reduce_scatter_v(c->backend, buf, counts, c->wire, req);
    free(counts); /* the backend keeps its own copy */
    return rc;
}

/* A 16-bit wire: the bucket's floats, scaled, to fp16 or bf16 (rounded to nearest even), and
 * back. Scalar loops: the kernels' pool belongs to the executor. */
void tr__comm_to_wire(struct tr__comm *c, const float *x, size_t a, size_t n)
{
    uint16_t *w = c->wire16 + a;
    for (size_t i = 0; i < n; i++)
        w[i] = c->wire == TR_DTYPE_BF16 ? tr_bf16_from_float(x[i]) : tr_half_from_float(x[i]);
}

void tr__comm_from_wire(const struct tr__comm *c, float *x, size_t a, size_t n)
{
    const uint16_t *w = c->wire16 + a;
    for (size_t i = 0; i < n; i++)
        x[i] = c->wire == TR_DTYPE_BF16 ? tr_bf16_to_float(w[i]) : tr_half_to_float(w[i]);
}

/* Starts p's collective on the backend. */
static int start(struct tr__comm *c, pending_t *p)
{
    const tr__plan_t *e = c->eng;
    const tr_comm_ops_t *ops = c->backend->ops;
    c->backend->op_tag = p->step;
    uint64_t req = 0;
    int rc = 0;
    switch (p->head.op) {
    case TR__COLL_ALL_REDUCE:
    case TR__COLL_REDUCE_SCATTER:
        rc = reduce_bucket(c, p, p->grads.length / sizeof(float), &req);
        break;
    case TR__COLL_SCALAR:
        rc = ops->all_reduce(c->backend, p->vals, p->scalar.n, TR_DTYPE_F64,
                             (tr_reduce_op_t)p->scalar.op, &req);
        break;
    case TR__COLL_VECTOR:
        rc = ops->all_reduce(c->backend, p->ptr, p->buf.length / sizeof(double), TR_DTYPE_F64,
                             (tr_reduce_op_t)p->reduce_op, &req);
        break;
    case TR__COLL_ALL_GATHER: { /* rank r's part: its slice within [a, b) */
        size_t a = p->buf.offset / sizeof(float), b = a + p->buf.length / sizeof(float);
        size_t mine, at;
        size_t *counts = tr__comm_bucket_parts(e, a, b, &mine, &at);
        rc = counts ? ops->all_gather_v(c->backend, p->ptr, counts, TR_DTYPE_F32, &req) : TR_ENOMEM;
        free(counts); /* the backend keeps its own copy */
        break;
    }
    case TR__COLL_PIPE_SEND:
    case TR__COLL_PIPE_RECV: /* the links' transfers: never submitted */
        rc = TR_EINVAL;
        break;
    }
    return track(c, p, rc, req, tr__comm_op_name(p->head.op));
}
