/* pipe_run.c: one batch of a pipeline schedule executed by S stage actors (troupe/pipeline.h).
 *
 * Each stage is a pinned actor with its schedule's instruction stream and a position in it. A
 * PIPE_XFER of kind 0 (from the runner) starts it; it then runs instructions until a receive
 * whose transfer has not arrived, and resumes when it does. A transfer that arrives early is
 * remembered (one bit per micro-batch and kind) until its instruction. Every transfer's header
 * is checked on arrival against the schedule: the kind the link carries, the sending stage,
 * this step, a micro-batch the stage still expects, the dtype and the element count. A stage
 * that fails records why and shuts the runtime down, so no stage waits forever for a
 * neighbour that stopped.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/pipe/link.h"
#include "actors/pipe/schedule.h"
#include "base/errf.h"
#include "troupe.h"

/* Stage s's compute instructions as spans on a lane of their own ("stage s"), below the
 * runtime's and the engine's own lanes; the stage actors' runtime itself is not traced (its
 * actors' lanes would be the caller's runtime's slots). */
#define STAGE_LANE(s) (TR_RUNTIME_LANE_EXTERNAL - 16u - (uint32_t)(s))

typedef struct stage {
    const tr_pipe_run_opts_t *o;
    int s, fault;
    tr_pipe_schedule_t *sch;
    int step, at, n; /* the schedule's step, the instruction in it, its count */
    tr_actor_t prev, next;
    bool linked;          /* across ranks: prev and next are the link, told when the stage ends */
    unsigned char *have;  /* [kind * M + mb]: a transfer arrived, its receive not yet run */
    unsigned char *taken; /* the same, once its receive ran */
    const void **got;     /* [kind * M + mb]: the tensor a transfer brought (with send_mem) */
    uint64_t area_id[3];  /* by kind: its send area's registration (0: not yet) */
    void *area[3];
    uint64_t busy_ns, end_ns;
    uint64_t wait_since;             /* a receive has waited from then (0: not waiting) */
    uint64_t recv_ns[3], send_ns[3]; /* by kind: time waiting in receives, in sends */
    uint64_t fwd_ns;                 /* of busy_ns, in forwards */
    int rc;
    unsigned fail_seq; /* the order of its failure among the stages' (the first caused the rest) */
    atomic_uint *failures;
    char err[512];
} stage_t;

typedef struct run {
    atomic_uint failures; /* stages failed so far */
    int lo, hi;           /* the stages this process runs: [lo, hi) (across ranks: its own) */
    int rank, world;      /* across ranks: MPI's */
    tr__pipe_link_t *link; /* across ranks: the transfers' link to the other ranks */
    tr_actor_t link_id;
    tr_runtime_t *rt;
    stage_t *st;
    tr_actor_t *ids;
    int S;
} run_t;

static const char *kind_name(int k)
{
    return k == TR__PIPE_ACT ? "activation" : k == TR__PIPE_GRAD ? "gradient" : "start";
}

static int fail(tr_ctx_t *ctx, stage_t *g, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(tr_ctx_t *ctx, stage_t *g, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->err, sizeof(g->err), fmt, ap);
    va_end(ap);
    g->rc = rc;
    g->fail_seq = atomic_fetch_add(g->failures, 1u); /* before the shutdown it causes */
    tr_msg_t *m = g->linked ? tr_msg_new(ctx->rt, TR_MSG_PIPE_XFER) : NULL;
    if (m) TR_MSG_AS(m, pipe_xfer)->kind = TR__PIPE_ABORT; /* the link tells the other ranks */
    if (!m || tr_actor_send(ctx->rt, g->next, m) < 0) {
        tr_msg_free(ctx->rt, m);
        tr_runtime_shutdown(ctx->rt, "a pipeline stage failed");
    }
    return 0;
}

/* The elements on link l (between stages l and l + 1). */
static unsigned long long link_of(const tr_pipe_run_opts_t *o, int l)
{
    return o->links ? o->links[l] : o->link_elements;
}

/* The reference to the tensor send x sends, in the stage's registered send area for its kind
 * (registered at the kind's first send; owner: the stage). */
static int tensor_ref(tr_ctx_t *ctx, stage_t *g, const tr_pipe_instr_t *x, tr_tensor_ref_t *ref)
{
    int k = x->op == TR_PIPE_SEND_ACTIVATION ? TR__PIPE_ACT : TR__PIPE_GRAD;
    void *area = NULL;
    size_t bytes = 0, dts = tr_dtype_size(g->o->link_dtype);
    unsigned char *p = g->o->send_mem(g->o->user, g->s, x, &area, &bytes);
    uint64_t len = link_of(g->o, k == TR__PIPE_ACT ? g->s : g->s - 1) * dts;
    int rc = 0;
    if (!g->area_id[k] && area) {
        tr_buffer_info_t bi = {.base = area,
                               .bytes = bytes,
                               .dtype = (uint8_t)g->o->link_dtype,
                               .owner = ctx->self,
                               .lifetime = TR_BUFFER_RUNTIME};
        snprintf(bi.name, sizeof(bi.name), "stage%d/%s", g->s,
                 k == TR__PIPE_ACT ? "acts" : "grads");
        rc = tr_buffer_register(ctx->rt, &bi, &g->area_id[k]);
        g->area[k] = area;
    }
    if (rc == 0)
        rc = !p || area != g->area[k] || p < (unsigned char *)area
                 ? TR_EINVAL
                 : tr_buffer_ref(ctx->rt, g->area_id[k], (uint64_t)(p - (unsigned char *)area), len,
                                 g->o->link_dtype, ref);
    if (rc < 0)
        fail(ctx, g, rc,
             "stage %d: the %s of micro-batch %d: send_mem gave %s (%zu bytes of area; "
             "expected %llu bytes inside the area of its first send)",
             g->s, kind_name(k), x->micro_batch, p ? "a tensor outside its area" : "no tensor",
             bytes, (unsigned long long)len);
    return rc;
}

static int send_xfer(tr_ctx_t *ctx, stage_t *g, const tr_pipe_instr_t *x)
{
    int kind = x->op == TR_PIPE_SEND_ACTIVATION ? TR__PIPE_ACT : TR__PIPE_GRAD, mb = x->micro_batch;
    tr_tensor_ref_t data = {0};
    int rc = g->o->send_mem ? tensor_ref(ctx, g, x, &data) : 0;
    if (rc < 0) return rc;
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_PIPE_XFER);
    if (!m) return fail(ctx, g, TR_ENOMEM, "stage %d: out of message memory", g->s), TR_ENOMEM;
    *TR_MSG_AS(m, pipe_xfer) = (tr_msg_pipe_xfer_t){
        .kind = (uint32_t)kind,
        .step = g->o->step,
        .micro_batch = (uint32_t)mb,
        .from_stage = (uint32_t)g->s,
        .to_stage = (uint32_t)(kind == TR__PIPE_ACT ? g->s + 1 : g->s - 1),
        .dtype = (uint32_t)g->o->link_dtype,
        .elements = link_of(g->o, kind == TR__PIPE_ACT ? g->s : g->s - 1) + (g->fault != 0),
        .data = data};
    m->step = g->o->step;
    rc = tr_actor_send(ctx->rt, kind == TR__PIPE_ACT ? g->next : g->prev, m);
    if (rc < 0) {
        tr_msg_free(ctx->rt, m);
        fail(ctx, g, rc, "stage %d: cannot send the %s of micro-batch %d: %s", g->s,
             kind_name(kind), mb, tr_strerror(rc));
    }
    return rc;
}

/* Runs one instruction: 1 done, 0 waiting for a transfer, < 0 failed. */
static int execute(tr_ctx_t *ctx, stage_t *g, const tr_pipe_instr_t *x)
{
    int M = g->o->micro_batches;
    if (x->op == TR_PIPE_RECV_ACTIVATION || x->op == TR_PIPE_RECV_GRAD) {
        int k = x->op == TR_PIPE_RECV_ACTIVATION ? TR__PIPE_ACT : TR__PIPE_GRAD;
        if (!g->have[k * M + x->micro_batch]) {
            if (!g->wait_since) g->wait_since = tr_now_ns();
            return 0;
        }
        if (g->wait_since) g->recv_ns[k] += tr_now_ns() - g->wait_since, g->wait_since = 0;
        g->have[k * M + x->micro_batch] = 0, g->taken[k * M + x->micro_batch] = 1;
    }
    if (x->op == TR_PIPE_SEND_ACTIVATION || x->op == TR_PIPE_SEND_GRAD) {
        int k = x->op == TR_PIPE_SEND_ACTIVATION ? TR__PIPE_ACT : TR__PIPE_GRAD;
        uint64_t t0 = tr_now_ns();
        int rc = send_xfer(ctx, g, x);
        g->send_ns[k] += tr_now_ns() - t0;
        return rc < 0 ? rc : 1;
    }
    int in = x->op == TR_PIPE_FORWARD                                       ? TR__PIPE_ACT
             : x->op == TR_PIPE_BACKWARD || x->op == TR_PIPE_BACKWARD_INPUT ? TR__PIPE_GRAD
                                                                            : 0;
    uint64_t t0 = tr_now_ns();
    int rc = g->o->exec(g->o->user, g->s, x, in ? g->got[in * M + x->micro_batch] : NULL);
    bool compute = x->op == TR_PIPE_FORWARD || x->op == TR_PIPE_BACKWARD ||
                   x->op == TR_PIPE_BACKWARD_INPUT || x->op == TR_PIPE_BACKWARD_WEIGHT;
    uint64_t t1 = tr_now_ns();
    if (compute) g->busy_ns += t1 - t0;
    if (x->op == TR_PIPE_FORWARD) g->fwd_ns += t1 - t0;
    if (compute && g->o->monitor)
        tr_monitor_span(g->o->monitor,
                        &(tr_span_t){tr_pipe_op_name(x->op), t0, t1, g->o->step,
                                     (uint32_t)x->micro_batch, STAGE_LANE(g->s), 0, 0});
    if (rc < 0)
        return fail(ctx, g, rc,
                    "stage %d: %s of micro-batch %d (step %d of its schedule) "
                    "failed: %s",
                    g->s, tr_pipe_op_name(x->op), x->micro_batch, g->step, tr_strerror(rc)),
               rc;
    return 1;
}

/* Runs the stream until a receive waits or it ends (then the stage stops). */
static int advance(tr_ctx_t *ctx, stage_t *g)
{
    int steps = tr_pipe_schedule_steps(g->sch);
    while (g->step < steps && g->rc == 0) {
        const tr_pipe_instr_t *x = tr_pipe_schedule_step(g->sch, g->step, &g->n);
        if (g->at >= g->n) {
            g->step++, g->at = 0;
            continue;
        }
        int r = execute(ctx, g, &x[g->at]);
        if (r <= 0) return 0;
        g->at++;
    }
    if (g->rc == 0) g->end_ns = tr_now_ns();
    if (g->linked) { /* the link stops once its transfers are done */
        tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_PIPE_XFER);
        if (m) TR_MSG_AS(m, pipe_xfer)->kind = TR__PIPE_END;
        if (m && tr_actor_send(ctx->rt, g->next, m) < 0) tr_msg_free(ctx->rt, m);
    }
    return tr_actor_stop(ctx->rt, ctx->self);
}

/* A transfer arrived: its header against what this stage's schedule expects. */
static int arrived(tr_ctx_t *ctx, stage_t *g, const tr_msg_pipe_xfer_t *t)
{
    int M = g->o->micro_batches, k = (int)t->kind;
    int from = k == TR__PIPE_ACT ? g->s - 1 : g->s + 1;
    int link_ok =
        (k == TR__PIPE_ACT && g->s > 0) || (k == TR__PIPE_GRAD && g->s < g->o->stages - 1);
    unsigned long long want = link_ok ? link_of(g->o, k == TR__PIPE_ACT ? g->s - 1 : g->s) : 0;
    const char *bad =
        !link_ok                        ? "a kind this link does not carry"
        : (int)t->from_stage != from    ? "another sender"
        : t->to_stage != (uint32_t)g->s ? "another receiver"
        : t->step != g->o->step         ? "another step"
        : t->micro_batch >= (uint32_t)M ? "a micro-batch out of range"
        : g->have[k * M + (int)t->micro_batch] || g->taken[k * M + (int)t->micro_batch]
            ? "a micro-batch twice"
        : t->dtype != (uint32_t)g->o->link_dtype ? "another dtype"
        : t->elements != want                    ? "another element count"
                                                 : NULL;
    if (bad)
        return fail(ctx, g, TR_EMISMATCH,
                    "stage %d received from stage %u %s %s of %llu "
                    "elements (dtype %u) for micro-batch %u of step %llu: %s; its schedule "
                    "expects %s from stage %d of %llu elements (dtype %d) for step %llu",
                    g->s, t->from_stage, k == TR__PIPE_ACT ? "an" : "a", kind_name(k),
                    (unsigned long long)t->elements, t->dtype, t->micro_batch,
                    (unsigned long long)t->step, bad,
                    k == TR__PIPE_ACT ? "activations" : "gradients", from, want, g->o->link_dtype,
                    (unsigned long long)g->o->step);
    if (g->o->send_mem) { /* the tensor, through the registry, which checks its range */
        void *p = NULL;
        char why[256] = "no tensor";
        int rc = t->data.buffer_id && t->data.length == want * tr_dtype_size(g->o->link_dtype)
                     ? tr_buffer_resolve(ctx->rt, &t->data, &p, why, sizeof(why))
                     : TR_EMISMATCH;
        if (rc < 0)
            return fail(ctx, g, rc,
                        "stage %d received from stage %u the %s of micro-batch %u (step %llu) "
                        "with a tensor of %llu bytes that does not resolve (%s); expected %llu",
                        g->s, t->from_stage, kind_name(k), t->micro_batch,
                        (unsigned long long)t->step, (unsigned long long)t->data.length, why,
                        want * (unsigned long long)tr_dtype_size(g->o->link_dtype));
        g->got[k * M + (int)t->micro_batch] = p;
    }
    g->have[k * M + (int)t->micro_batch] = 1;
    return advance(ctx, g);
}

static int stage_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    stage_t *g = ctx->state;
    if (msg->type != TR_MSG_PIPE_XFER || g->rc) return 0;
    const tr_msg_pipe_xfer_t *t = TR_MSG_AS(msg, pipe_xfer);
    return t->kind == TR__PIPE_START ? advance(ctx, g) : arrived(ctx, g, t);
}

static int check_opts(const tr_pipe_run_opts_t *o, char *err, size_t len)
{
    if (!o || !o->exec) return tr__errf(err, len, TR_EINVAL, "pipeline run: no exec callback");
    for (int l = 0; l + 1 < o->stages; l++)
        if (link_of(o, l) == 0)
            return tr__errf(err, len, TR_EINVAL,
                            "pipeline run: link_elements is 0 (link %d); "
                            "expected the elements of an activation",
                            l);
    return 0;
}

static int spawn(run_t *r, const tr_pipe_run_opts_t *o, char *err, size_t len)
{
    const char *fault = getenv("TROUPE_FAULT_PIPE_STAGE");
    tr_actor_t *ids = r->ids;
    for (int s = r->lo; s < r->hi; s++) {
        stage_t *g = &r->st[s];
        *g = (stage_t){.o = o,
                       .s = s,
                       .fault = fault && atoi(fault) == s && r->S > 1,
                       .failures = &r->failures};
        size_t cells = 3 * (size_t)o->micro_batches;
        g->have = calloc(cells, 1), g->taken = calloc(cells, 1);
        g->got = calloc(cells, sizeof(*g->got));
        if (!g->have || !g->taken || !g->got)
            return tr__errf(err, len, TR_ENOMEM, "pipeline run: out of memory");
        int rc =
            tr_pipe_schedule_create(&g->sch, o->kind, o->micro_batches, o->stages, s, err, len);
        if (rc < 0) return rc;
        char name[32];
        snprintf(name, sizeof(name), "stage %d", s);
        if (o->monitor && r->S < 4000)
            tr_monitor_lane_set(o->monitor, STAGE_LANE(s), name, TR_LANE_COMPUTE);
        snprintf(name, sizeof(name), "stage%d", s);
        tr_actor_opts_t ao = {.name = name, .pinned = 1, .lane_kind = TR_LANE_COMPUTE};
        rc = tr_actor_spawn(r->rt, stage_behaviour, g, &ao, &ids[s]);
        if (rc < 0)
            return tr__errf(err, len, rc, "pipeline run: spawning stage %d: %s", s,
                            tr_strerror(rc));
    }
    if (r->link_id.id == 0 && r->hi - r->lo < r->S) { /* across ranks: the link */
        stage_t *g = &r->st[r->lo];
        int acts = 0, grads = 0, n;
        for (int k = 0; k < tr_pipe_schedule_steps(g->sch); k++) {
            const tr_pipe_instr_t *x = tr_pipe_schedule_step(g->sch, k, &n);
            for (int i = 0; i < n; i++)
                acts += x[i].op == TR_PIPE_RECV_ACTIVATION, grads += x[i].op == TR_PIPE_RECV_GRAD;
        }
        tr__pipe_link_spec_t sp = {.rank = r->rank,
                                   .world = r->world,
                                   .stage = r->lo,
                                   .stages = r->S,
                                   .replicas = o->replicas,
                                   .stage_actor = ids[r->lo],
                                   .expect_act = acts,
                                   .expect_grad = grads,
                                   .dtype = o->link_dtype};
        size_t dts = tr_dtype_size(o->link_dtype);
        if (o->send_mem && r->lo > 0) /* activations: slots as the sender keeps them */
            sp.act = (tr__pipe_link_area_t){
                tr__pipe_stage_buffers(o->kind, o->micro_batches, o->stages, r->lo - 1, NULL, 0),
                link_of(o, r->lo - 1) * dts};
        if (o->send_mem && r->lo + 1 < r->S) /* gradients: mod this stage's buffers */
            sp.grad =
                (tr__pipe_link_area_t){tr_pipe_schedule_buffers(g->sch), link_of(o, r->lo) * dts};
        int rc = sp.act.slots < 0
                     ? sp.act.slots
                     : tr__pipe_link_spawn(r->rt, &sp, &r->link_id, &r->link, err, len);
        if (rc < 0) return rc;
        g->linked = true;
        g->prev = g->next = r->link_id;
    }
    for (int s = r->lo; s < r->hi && !r->st[s].linked; s++) {
        r->st[s].prev = s > 0 ? ids[s - 1] : ids[s];
        r->st[s].next = s + 1 < r->S ? ids[s + 1] : ids[s];
    }
    for (int s = r->lo; s <= r->hi; s++) { /* prev/next are set: now they may start */
        tr_actor_t to = s < r->hi ? ids[s] : r->link_id;
        if (s == r->hi && !r->link) break;
        tr_msg_t *m = tr_msg_new(r->rt, TR_MSG_PIPE_XFER);
        if (!m) return tr__errf(err, len, TR_ENOMEM, "pipeline run: out of message memory");
        *TR_MSG_AS(m, pipe_xfer) = (tr_msg_pipe_xfer_t){.kind = TR__PIPE_START, .step = o->step};
        if (tr_actor_send(r->rt, to, m) < 0) tr_msg_free(r->rt, m);
    }
    return 0;
}

static int collect(run_t *r, uint64_t t0, tr_pipe_run_result_t *out, char *err, size_t len)
{
    *out = (tr_pipe_run_result_t){0};
    uint64_t end = t0, busy = 0;
    const stage_t *first = NULL; /* the stage that failed first, not those it stopped */
    for (int s = r->lo; s < r->hi; s++)
        if (r->st[s].rc && (!first || r->st[s].fail_seq < first->fail_seq)) first = &r->st[s];
    if (first) return tr__errf(err, len, first->rc, "pipeline run: %s", first->err);
    int link_rc;
    const char *link_err = tr__pipe_link_error(r->link, &link_rc);
    if (link_rc) return tr__errf(err, len, link_rc, "pipeline run: %s", link_err);
    for (int s = r->lo; s < r->hi; s++) {
        const stage_t *g = &r->st[s];
        if (!g->end_ns)
            return tr__errf(err, len, TR_EFAILED,
                            "pipeline run: stage %d stopped before the "
                            "end of its schedule",
                            s);
        end = g->end_ns > end ? g->end_ns : end;
        busy += g->busy_ns;
        out->recv_input_ms += (double)g->recv_ns[TR__PIPE_ACT] / 1e6;
        out->recv_grad_ms += (double)g->recv_ns[TR__PIPE_GRAD] / 1e6;
        out->send_output_ms += (double)g->send_ns[TR__PIPE_ACT] / 1e6;
        out->send_grad_ms += (double)g->send_ns[TR__PIPE_GRAD] / 1e6;
        out->forward_ms += (double)g->fwd_ns / 1e6;
        out->backward_ms += (double)(g->busy_ns - g->fwd_ns) / 1e6;
    }
    out->makespan_ms = (double)(end - t0) / 1e6;
    out->busy_ms = (double)busy / 1e6;
    out->bubble = end > t0 ? 1 - (double)busy / ((double)(r->hi - r->lo) * (double)(end - t0))
                           : 0; /* across ranks: this stage's idle share */
    out->theory = (double)(r->S - 1) / (r->st[r->lo].o->micro_batches + r->S - 1);
    return 0;
}

int tr_pipe_run(const tr_pipe_run_opts_t *o, tr_pipe_run_result_t *out, char *err, size_t errlen)
{
    if (o && (o->stages < 1 || o->stages > 4096 || o->micro_batches < 1))
        return tr__errf(err, errlen, TR_EINVAL,
                        "pipeline run: %d stages, %d micro-batches; "
                        "expected 1 to 4096 stages and at least one micro-batch",
                        o->stages, o->micro_batches);
    int rc = check_opts(o, err, errlen);
    if (rc < 0) return rc;
    run_t r = {.S = o->stages, .lo = 0, .hi = o->stages};
    if (o->across_ranks) { /* this process runs the stage of its rank */
        rc = tr__pipe_rank_stage(o->stages, o->replicas > 0 ? o->replicas : 1, &r.rank, &r.world,
                                 &r.lo, err, errlen);
        if (rc < 0) return rc;
        r.hi = r.lo + 1;
    }
    tr_runtime_opts_t ro = {.n_workers = 1};
    if ((rc = tr_runtime_init(&r.rt, &ro)) < 0)
        return tr__errf(err, errlen, rc, "pipeline run: cannot start a runtime: %s",
                        tr_strerror(rc));
    r.st = calloc((size_t)r.S, sizeof(*r.st));
    r.ids = calloc((size_t)r.S, sizeof(*r.ids));
    uint64_t t0 = tr_now_ns();
    rc = r.st && r.ids ? spawn(&r, o, err, errlen)
                       : tr__errf(err, errlen, TR_ENOMEM, "pipeline run: out of memory");
    if (rc < 0) tr_runtime_shutdown(r.rt, "pipeline set-up failed");
    int run_rc = tr_runtime_run(r.rt);
    if (rc == 0 && run_rc < 0)
        rc = tr__errf(err, errlen, run_rc, "pipeline run: %s", tr_runtime_failure(r.rt));
    if (rc == 0) rc = collect(&r, t0, out, err, errlen);
    tr_runtime_close(r.rt);
    tr__pipe_link_free(r.link);
    for (int s = 0; r.st && s < r.S; s++) {
        tr_pipe_schedule_destroy(r.st[s].sch);
        free(r.st[s].have), free(r.st[s].taken), free(r.st[s].got);
    }
    free(r.st);
    free(r.ids);
    return rc;
}
