/* run.c: a pipeline schedule's S stages as pinned actors of the caller's runtime, and the
 * batches they run (troupe/pipeline.h, tr_pipe_*).
 *
 * tr_pipe_create spawns, once, a stage actor per stage this process runs (across ranks: its
 * own, and its link, link.c) and the pipeline's runner. Each stage owns its schedule, its
 * position in it, the transfers that arrived for it and its timings; nothing of it is read by
 * another thread.
 *
 * One batch, as messages. tr_pipe_run sends each stage a PIPE_XFER of kind start (from the
 * last stage to the first: a stage's start is then queued before any transfer of the batch a
 * neighbour can send it; across ranks the stage passes its start on to its link) and waits
 * on the runner. A start may name the batch's tensors (tr_pipe_run_batch): the stage resolves
 * the references through the buffer registry and hands the addresses to the start callback
 * before its first instruction; it never reads a pointer the caller left anywhere. A stage
 * runs instructions until a receive whose transfer has not arrived, and resumes when it does.
 * A transfer that arrives early is remembered (one bit per micro-batch and kind) until its
 * instruction. Every transfer's header is checked on arrival against the schedule: the kind
 * the link carries, the sending stage, this step, a micro-batch the stage still expects, the
 * dtype and the element count.
 * The last stage sends each loss to the runner (PIPE_LOSS); every stage ends its batch with a
 * PIPE_DONE to the runner: its end time and timings, or its failure and why. A stage that
 * fails tells its neighbours (PIPE_XFER of kind abort), which fail too, marked as caused by
 * another, so no stage waits forever; a stage that is not running a batch drops every
 * transfer (those of a failed batch, all queued before the next start). The runner counts the
 * reports and wakes the caller when the last is in; the result (the first stage's own
 * failure before a link's, before one caused by another) is assembled from the messages, and
 * the losses kept in the runner's own array, which the caller copies out once woken (no
 * actor writes into the caller's memory).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/pipe/link.h"
#include "actors/pipe/schedule.h"
#include "base/errf.h"
#include "runtime/comm/comm.h"
#include "troupe/buffer.h"
#include "troupe/error.h"
#include "troupe/monitor.h"
#include "troupe/msg.h"
#include "troupe/pipeline.h"
#include "troupe/runtime.h"
#include "troupe/types.h"

typedef struct stage {
    /* fixed at spawn */
    int s, S, M, fault;
    tr_pipe_exec_fn exec;
    tr_pipe_send_fn send_mem;
    tr_pipe_start_fn begin; /* the batch's tensors, resolved, to the caller's code */
    void *user;
    unsigned long long in_elems, out_elems; /* on the links to the previous and next stage */
    int dtype;
    tr_monitor_t *monitor;
    uint32_t lane; /* its actor's trace lane */
    tr_pipe_schedule_t *sch;
    tr_actor_t prev, next, runner;
    bool linked;         /* across ranks: prev and next are the link, told when the stage ends */
    uint64_t area_id[3]; /* by kind: its send area's registration (0: not yet) */
    void *area[3];
    /* the batch being run */
    bool running, stop_after; /* stop_after: a STOP came during the batch */
    unsigned long long batch; /* its step */
    int step, at, n;          /* the schedule's step, the instruction in it, its count */
    unsigned char *have;      /* [kind * M + mb]: a transfer arrived, its receive not yet run */
    unsigned char *taken;     /* the same, once its receive ran */
    const void **got;         /* [kind * M + mb]: the tensor a transfer brought (with send_mem) */
    uint64_t busy_ns, fwd_ns;
    uint64_t wait_since;             /* a receive has waited from then (0: not waiting) */
    uint64_t recv_ns[3], send_ns[3]; /* by kind: time waiting in receives, in sends */
    int held_rc;        /* its start failed, reported at the first message from prev (load) */
    char held_why[512]; /* and why */
} stage_t;

struct tr_pipe {
    tr_runtime_t *rt;
    int S, M;
    int lo, hi;            /* the stages this process runs: [lo, hi) (across ranks: its own) */
    tr__pipe_link_t *link; /* across ranks: the transfers' link to the other ranks */
    tr_actor_t link_id, runner;
    stage_t *st;
    tr_actor_t *ids;
    bool broken; /* across ranks, a batch failed: the ranks' streams are out of step */
    /* the batch being run: the caller sets it up, the runner fills it, under mu */
    pthread_mutex_t mu;
    pthread_cond_t done; /* signalled when waiting reaches 0 */
    int waiting;         /* reports still to come */
    bool stop_after;     /* the runner got a STOP during the batch */
    float *loss;         /* [M]: the last stage's PIPE_LOSS values, the caller's once it wakes */
    unsigned char *has_loss; /* [M]: which came */
    uint64_t end_ns, busy_ns;
    tr_pipe_run_result_t res;
    int rc, rc_rank; /* the chosen failure and its rank: 3 a stage's own, 2 a link's, 1 caused */
    char why[512];
};

static const char *kind_name(int k)
{
    return k == TR__PIPE_ACT ? "activation" : k == TR__PIPE_GRAD ? "gradient" : "start";
}

/* The stage's PIPE_DONE, with its timings; rc < 0: its failure, why the message's text. */
static tr_msg_t *done_msg(tr_ctx_t *ctx, stage_t *g, int rc, bool caused, uint64_t end)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_PIPE_DONE);
    if (!m) return NULL;
    *TR_MSG_AS(m, pipe_done) = (tr_msg_pipe_done_t){.step = g->batch,
                                                    .stage = (uint32_t)g->s,
                                                    .rc = rc,
                                                    .caused = caused,
                                                    .end_ns = end,
                                                    .busy_ns = g->busy_ns,
                                                    .forward_ns = g->fwd_ns,
                                                    .recv_act_ns = g->recv_ns[TR__PIPE_ACT],
                                                    .recv_grad_ns = g->recv_ns[TR__PIPE_GRAD],
                                                    .send_act_ns = g->send_ns[TR__PIPE_ACT],
                                                    .send_grad_ns = g->send_ns[TR__PIPE_GRAD]};
    m->step = g->batch;
    return m;
}

/* Sends m to the runner; a report that cannot be sent would leave the caller waiting, so the
 * runtime stops instead. */
static void report(tr_ctx_t *ctx, stage_t *g, tr_msg_t *m)
{
    if (m && tr_actor_send(ctx->rt, g->runner, m) == 0) return;
    tr_msg_free(ctx->rt, m);
    tr_runtime_shutdown(ctx->rt, "a pipeline stage cannot report to its runner");
}

/* The batch ends on this stage: a STOP that came during it takes effect. */
static int batch_over(tr_ctx_t *ctx, stage_t *g)
{
    g->running = false;
    return g->stop_after ? tr_actor_stop(ctx->rt, ctx->self) : 0;
}

static void tell_abort(tr_ctx_t *ctx, stage_t *g, tr_actor_t to)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_PIPE_XFER);
    if (!m) return;
    *TR_MSG_AS(m, pipe_xfer) = (tr_msg_pipe_xfer_t){
        .kind = TR__PIPE_ABORT, .step = g->batch, .from_stage = (uint32_t)g->s};
    if (tr_actor_send(ctx->rt, to, m) < 0) tr_msg_free(ctx->rt, m);
}

/* The stage fails its batch: its neighbours but `from` (who told it) are told, so that none
 * waits for it, and the runner gets why. Returns 0 (the actor lives on for the next batch). */
static int fail(tr_ctx_t *ctx, stage_t *g, tr_actor_t from, bool caused, int rc, const char *fmt,
                ...) __attribute__((format(printf, 6, 7)));
static int fail(tr_ctx_t *ctx, stage_t *g, tr_actor_t from, bool caused, int rc, const char *fmt,
                ...)
{
    if (g->prev.id != ctx->self.id && g->prev.id != from.id) tell_abort(ctx, g, g->prev);
    if (g->next.id != ctx->self.id && g->next.id != g->prev.id && g->next.id != from.id)
        tell_abort(ctx, g, g->next);
    tr_msg_t *m = done_msg(ctx, g, rc, caused, 0);
    if (m) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(TR_MSG_AS(m, pipe_done)->why, sizeof(TR_MSG_AS(m, pipe_done)->why), fmt, ap);
        va_end(ap);
    }
    report(ctx, g, m);
    return batch_over(ctx, g);
}

/* The reference to the tensor send x sends, in the stage's registered send area for its kind
 * (registered at the kind's first send; owner: the stage). */
static int tensor_ref(tr_ctx_t *ctx, stage_t *g, const tr_pipe_instr_t *x, tr_tensor_ref_t *ref)
{
    int k = x->op == TR_PIPE_SEND_ACTIVATION ? TR__PIPE_ACT : TR__PIPE_GRAD;
    void *area = NULL;
    size_t bytes = 0, dts = tr_dtype_size(g->dtype);
    unsigned char *p = g->send_mem(g->user, g->s, x, &area, &bytes);
    uint64_t len = (k == TR__PIPE_ACT ? g->out_elems : g->in_elems) * dts;
    int rc = 0;
    if (!g->area_id[k] && area) {
        tr_buffer_info_t bi = {.base = area,
                               .bytes = bytes,
                               .dtype = (uint8_t)g->dtype,
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
                                 g->dtype, ref);
    if (rc < 0)
        fail(ctx, g, TR_ACTOR_NONE, false, rc,
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
    int rc = g->send_mem ? tensor_ref(ctx, g, x, &data) : 0;
    if (rc < 0) return rc;
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_PIPE_XFER);
    if (!m) {
        fail(ctx, g, TR_ACTOR_NONE, false, TR_ENOMEM, "stage %d: out of message memory", g->s);
        return TR_ENOMEM;
    }
    *TR_MSG_AS(m, pipe_xfer) = (tr_msg_pipe_xfer_t){
        .kind = (uint32_t)kind,
        .step = g->batch,
        .micro_batch = (uint32_t)mb,
        .from_stage = (uint32_t)g->s,
        .to_stage = (uint32_t)(kind == TR__PIPE_ACT ? g->s + 1 : g->s - 1),
        .dtype = (uint32_t)g->dtype,
        .elements = (kind == TR__PIPE_ACT ? g->out_elems : g->in_elems) + (g->fault != 0),
        .data = data};
    m->step = g->batch;
    rc = tr_actor_send(ctx->rt, kind == TR__PIPE_ACT ? g->next : g->prev, m);
    if (rc < 0) {
        tr_msg_free(ctx->rt, m);
        fail(ctx, g, TR_ACTOR_NONE, false, rc, "stage %d: cannot send the %s of micro-batch %d: %s",
             g->s, kind_name(kind), mb, tr_strerror(rc));
    }
    return rc;
}

static bool is_compute(int op)
{
    return op == TR_PIPE_FORWARD || op == TR_PIPE_BACKWARD || op == TR_PIPE_BACKWARD_INPUT ||
           op == TR_PIPE_BACKWARD_WEIGHT;
}

/* A compute or other local instruction: the exec callback, timed and traced; a forward's loss
 * to the runner. 1 done, < 0 failed. */
static int compute(tr_ctx_t *ctx, stage_t *g, const tr_pipe_instr_t *x)
{
    int M = g->M;
    int in = x->op == TR_PIPE_FORWARD                                       ? TR__PIPE_ACT
             : x->op == TR_PIPE_BACKWARD || x->op == TR_PIPE_BACKWARD_INPUT ? TR__PIPE_GRAD
                                                                            : 0;
    tr_pipe_report_t rep = {0};
    uint64_t t0 = tr_now_ns();
    int rc = g->exec(g->user, g->s, x, in ? g->got[in * M + x->micro_batch] : NULL, &rep);
    uint64_t t1 = tr_now_ns();
    if (is_compute(x->op)) g->busy_ns += t1 - t0;
    if (x->op == TR_PIPE_FORWARD) g->fwd_ns += t1 - t0;
    if (is_compute(x->op) && g->monitor)
        tr_monitor_span(g->monitor, &(tr_span_t){tr_pipe_op_name(x->op), t0, t1, g->batch,
                                                 (uint32_t)x->micro_batch, g->lane, 0, 0});
    if (rc < 0 && rep.why[0]) {
        fail(ctx, g, TR_ACTOR_NONE, false, rc, "%s", rep.why);
        return rc;
    }
    if (rc < 0) {
        fail(ctx, g, TR_ACTOR_NONE, false, rc,
             "stage %d: %s of micro-batch %d (step %d of its schedule) failed: %s", g->s,
             tr_pipe_op_name(x->op), x->micro_batch, g->step, tr_strerror(rc));
        return rc;
    }
    if (rep.has_loss) {
        tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_PIPE_LOSS);
        if (m)
            *TR_MSG_AS(m, pipe_loss) = (tr_msg_pipe_loss_t){
                .step = g->batch, .micro_batch = (uint32_t)x->micro_batch, .loss = rep.loss};
        report(ctx, g, m);
    }
    return 1;
}

/* Runs one instruction: 1 done, 0 waiting for a transfer, < 0 failed. */
static int execute(tr_ctx_t *ctx, stage_t *g, const tr_pipe_instr_t *x)
{
    int M = g->M;
    if (x->op == TR_PIPE_RECV_ACTIVATION || x->op == TR_PIPE_RECV_GRAD) {
        int k = x->op == TR_PIPE_RECV_ACTIVATION ? TR__PIPE_ACT : TR__PIPE_GRAD;
        if (!g->have[k * M + x->micro_batch]) {
            if (!g->wait_since) g->wait_since = tr_now_ns();
            return 0;
        }
        if (g->wait_since) {
            g->recv_ns[k] += tr_now_ns() - g->wait_since;
            g->wait_since = 0;
        }
        g->have[k * M + x->micro_batch] = 0;
        g->taken[k * M + x->micro_batch] = 1;
        return 1;
    }
    if (x->op == TR_PIPE_SEND_ACTIVATION || x->op == TR_PIPE_SEND_GRAD) {
        int k = x->op == TR_PIPE_SEND_ACTIVATION ? TR__PIPE_ACT : TR__PIPE_GRAD;
        uint64_t t0 = tr_now_ns();
        int rc = send_xfer(ctx, g, x);
        g->send_ns[k] += tr_now_ns() - t0;
        return rc < 0 ? rc : 1;
    }
    return compute(ctx, g, x);
}

/* Runs the stream until a receive waits or it ends (then the runner is told). */
static int advance(tr_ctx_t *ctx, stage_t *g)
{
    int steps = tr_pipe_schedule_steps(g->sch);
    while (g->step < steps) {
        const tr_pipe_instr_t *x = tr_pipe_schedule_step(g->sch, g->step, &g->n);
        if (g->at >= g->n) {
            g->step++;
            g->at = 0;
            continue;
        }
        int r = execute(ctx, g, &x[g->at]);
        if (r <= 0) return 0; /* waiting, or failed (and reported) */
        g->at++;
    }
    uint64_t end = tr_now_ns();
    if (g->linked) { /* the link reports once its transfers are done */
        tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_PIPE_XFER);
        if (m) TR_MSG_AS(m, pipe_xfer)->kind = TR__PIPE_END;
        if (m && tr_actor_send(ctx->rt, g->next, m) < 0) tr_msg_free(ctx->rt, m);
    }
    report(ctx, g, done_msg(ctx, g, 0, false, end));
    return batch_over(ctx, g);
}

/* The stage's start failed. Its previous neighbour may not have handled its own start yet
 * (starts go last stage first) and would drop an abort; so in one process a stage past the
 * first holds its failure until the first message from it (its first activation, or an
 * abort), and runs nothing meanwhile. Returns what fail returns, or 0 while held. */
static int fail_start(tr_ctx_t *ctx, stage_t *g, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail_start(tr_ctx_t *ctx, stage_t *g, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->held_why, sizeof(g->held_why), fmt, ap);
    va_end(ap);
    if (!g->linked && g->prev.id != ctx->self.id) {
        g->held_rc = rc;
        return 0;
    }
    return fail(ctx, g, TR_ACTOR_NONE, false, rc, "%s", g->held_why);
}

/* The tensors the start message names, resolved through the registry (which checks their
 * ranges), to the start callback. A failure is reported (fail_start) and ends the batch;
 * returns what fail_start returns. */
static int load(tr_ctx_t *ctx, stage_t *g, const tr_msg_pipe_xfer_t *t)
{
    const tr_tensor_ref_t *ref[TR_PIPE_BATCH_TENSORS] = {&t->data, &t->data2};
    void *at[TR_PIPE_BATCH_TENSORS] = {0};
    unsigned long long bytes[TR_PIPE_BATCH_TENSORS] = {0};
    for (int i = 0; i < TR_PIPE_BATCH_TENSORS; i++) {
        char why[256] = "";
        int rc =
            ref[i]->buffer_id ? tr_buffer_resolve(ctx->rt, ref[i], &at[i], why, sizeof(why)) : 0;
        if (rc < 0)
            return fail_start(ctx, g, rc,
                              "stage %d: the batch's tensor %d (step %llu) does not resolve: %s",
                              g->s, i, g->batch, why);
        bytes[i] = at[i] ? ref[i]->length : 0;
    }
    tr_pipe_report_t rep = {0};
    int rc = g->begin ? g->begin(g->user, g->s, at, bytes, &rep) : 0;
    if (rc < 0 && rep.why[0]) return fail_start(ctx, g, rc, "%s", rep.why);
    if (rc < 0)
        return fail_start(ctx, g, rc, "stage %d: its start of step %llu failed: %s", g->s, g->batch,
                          tr_strerror(rc));
    return 0;
}

/* A batch starts: the stream from its first instruction, nothing arrived yet; the tensors
 * the start names go to the start callback first. */
static int start(tr_ctx_t *ctx, stage_t *g, const tr_msg_pipe_xfer_t *t)
{
    unsigned long long step = t->step;
    size_t cells = 3 * (size_t)g->M;
    memset(g->have, 0, cells);
    memset(g->taken, 0, cells);
    memset(g->got, 0, cells * sizeof(*g->got));
    g->running = true;
    g->held_rc = 0;
    g->batch = step;
    g->step = g->at = 0;
    g->busy_ns = g->fwd_ns = g->wait_since = 0;
    memset(g->recv_ns, 0, sizeof(g->recv_ns));
    memset(g->send_ns, 0, sizeof(g->send_ns));
    if (g->linked) { /* the link's start, queued before any transfer of the batch */
        tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_PIPE_XFER);
        if (!m)
            return fail(ctx, g, TR_ACTOR_NONE, false, TR_ENOMEM, "stage %d: out of message memory",
                        g->s);
        *TR_MSG_AS(m, pipe_xfer) = (tr_msg_pipe_xfer_t){.kind = TR__PIPE_START, .step = step};
        if (tr_actor_send(ctx->rt, g->next, m) < 0) tr_msg_free(ctx->rt, m);
    }
    int rc = load(ctx, g, t);
    if (rc < 0 || !g->running || g->held_rc) return rc; /* failed: reported, or held */
    return advance(ctx, g);
}

/* A transfer arrived: its header against what this stage's schedule expects. */
static int arrived(tr_ctx_t *ctx, stage_t *g, const tr_msg_pipe_xfer_t *t)
{
    int M = g->M, k = (int)t->kind;
    int from = k == TR__PIPE_ACT ? g->s - 1 : g->s + 1;
    int link_ok = (k == TR__PIPE_ACT && g->s > 0) || (k == TR__PIPE_GRAD && g->s < g->S - 1);
    unsigned long long want = !link_ok ? 0 : k == TR__PIPE_ACT ? g->in_elems : g->out_elems;
    const char *bad =
        !link_ok                        ? "a kind this link does not carry"
        : (int)t->from_stage != from    ? "another sender"
        : t->to_stage != (uint32_t)g->s ? "another receiver"
        : t->step != g->batch           ? "another step"
        : t->micro_batch >= (uint32_t)M ? "a micro-batch out of range"
        : g->have[k * M + (int)t->micro_batch] || g->taken[k * M + (int)t->micro_batch]
            ? "a micro-batch twice"
        : t->dtype != (uint32_t)g->dtype ? "another dtype"
        : t->elements != want            ? "another element count"
                                         : NULL;
    if (bad)
        return fail(ctx, g, TR_ACTOR_NONE, false, TR_EMISMATCH,
                    "stage %d received from stage %u %s %s of %llu "
                    "elements of %s for micro-batch %u of step %llu: %s; its schedule "
                    "expects %s from stage %d of %llu elements of %s for step %llu",
                    g->s, t->from_stage, k == TR__PIPE_ACT ? "an" : "a", kind_name(k),
                    (unsigned long long)t->elements, tr_dtype_name((int)t->dtype), t->micro_batch,
                    (unsigned long long)t->step, bad,
                    k == TR__PIPE_ACT ? "activations" : "gradients", from, want,
                    tr_dtype_name(g->dtype), g->batch);
    if (g->send_mem) { /* the tensor, through the registry, which checks its range */
        void *p = NULL;
        char why[256] = "no tensor";
        int rc = t->data.buffer_id && t->data.length == want * tr_dtype_size(g->dtype)
                     ? tr_buffer_resolve(ctx->rt, &t->data, &p, why, sizeof(why))
                     : TR_EMISMATCH;
        if (rc < 0)
            return fail(ctx, g, TR_ACTOR_NONE, false, rc,
                        "stage %d received from stage %u the %s of micro-batch %u (step %llu) "
                        "with a tensor of %llu bytes that does not resolve (%s); expected %llu",
                        g->s, t->from_stage, kind_name(k), t->micro_batch,
                        (unsigned long long)t->step, (unsigned long long)t->data.length, why,
                        want * (unsigned long long)tr_dtype_size(g->dtype));
        g->got[k * M + (int)t->micro_batch] = p;
    }
    g->have[k * M + (int)t->micro_batch] = 1;
    return advance(ctx, g);
}

static int stage_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    stage_t *g = ctx->state;
    if (msg->type == TR_MSG_STOP) { /* between batches at once, else after this one */
        g->stop_after = true;
        return g->running ? 0 : tr_actor_stop(ctx->rt, ctx->self);
    }
    if (msg->type != TR_MSG_PIPE_XFER) return 0;
    const tr_msg_pipe_xfer_t *t = TR_MSG_AS(msg, pipe_xfer);
    if (t->kind == TR__PIPE_START) return start(ctx, g, t);
    if (!g->running) return 0; /* a failed batch's late transfer */
    if (g->held_rc)            /* prev runs the batch now: the start's failure can be told */
        return fail(ctx, g, t->kind == TR__PIPE_ABORT ? msg->sender : TR_ACTOR_NONE, false,
                    g->held_rc, "%s", g->held_why);
    if (t->kind == TR__PIPE_ABORT)
        return fail(ctx, g, msg->sender, true, TR_EFAILED,
                    "stage %d stopped: %s failed (its error says why)", g->s,
                    g->linked ? "the pipeline on another rank" : "a neighbouring stage");
    return arrived(ctx, g, t);
}

/* --- the runner: the stages' reports, assembled for the caller ------------------------------ */

static void take_done(tr_pipe_t *p, const tr_msg_pipe_done_t *d)
{
    int rank = d->rc == 0 ? 0 : d->link ? 2 : d->caused ? 1 : 3;
    if (rank > p->rc_rank) { /* the first report of the most telling kind explains the batch */
        p->rc_rank = rank;
        p->rc = d->rc;
        snprintf(p->why, sizeof(p->why), "%s", d->why);
    }
    if (d->link) return;
    tr_pipe_run_result_t *r = &p->res;
    p->end_ns = d->end_ns > p->end_ns ? d->end_ns : p->end_ns;
    p->busy_ns += d->busy_ns;
    r->recv_input_ms += (double)d->recv_act_ns / 1e6;
    r->recv_grad_ms += (double)d->recv_grad_ns / 1e6;
    r->send_output_ms += (double)d->send_act_ns / 1e6;
    r->send_grad_ms += (double)d->send_grad_ns / 1e6;
    r->forward_ms += (double)d->forward_ns / 1e6;
    r->backward_ms += (double)(d->busy_ns - d->forward_ns) / 1e6;
}

static int runner_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    tr_pipe_t *p = ctx->state;
    bool stop = false;
    pthread_mutex_lock(&p->mu);
    if (msg->type == TR_MSG_STOP) {
        p->stop_after = true;
        stop = p->waiting == 0;
    }
    if (msg->type == TR_MSG_PIPE_LOSS) {
        const tr_msg_pipe_loss_t *l = TR_MSG_AS(msg, pipe_loss);
        if (l->micro_batch < (uint32_t)p->M) {
            p->loss[l->micro_batch] = l->loss;
            p->has_loss[l->micro_batch] = 1;
        }
    }
    if (msg->type == TR_MSG_PIPE_DONE && p->waiting > 0) {
        take_done(p, TR_MSG_AS(msg, pipe_done));
        if (--p->waiting == 0) {
            pthread_cond_signal(&p->done); /* pairs with the wait in tr_pipe_run */
            stop = p->stop_after;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return stop ? tr_actor_stop(ctx->rt, ctx->self) : 0;
}

/* --- set-up --------------------------------------------------------------------------------- */

/* The elements on link l (between stages l and l + 1). */
static unsigned long long link_of(const tr_pipe_run_opts_t *o, int l)
{
    return o->links ? o->links[l] : o->link_elements;
}

static int check_opts(const tr_pipe_run_opts_t *o, char *err, size_t len)
{
    if (o && (o->stages < 1 || o->stages > 4096 || o->micro_batches < 1))
        return tr__errf(err, len, TR_EINVAL,
                        "pipeline run: %d stages, %d micro-batches; "
                        "expected 1 to 4096 stages and at least one micro-batch",
                        o->stages, o->micro_batches);
    if (!o || !o->exec) return tr__errf(err, len, TR_EINVAL, "pipeline run: no exec callback");
    for (int l = 0; l + 1 < o->stages; l++)
        if (link_of(o, l) == 0)
            return tr__errf(err, len, TR_EINVAL,
                            "pipeline run: link_elements is 0 (link %d); "
                            "expected the elements of an activation",
                            l);
    return 0;
}

/* Stage s's state (its actor is spawned by the caller). */
static int make_stage(tr_pipe_t *p, const tr_pipe_run_opts_t *o, int s, char *err, size_t len)
{
    const char *fault = getenv("TROUPE_FAULT_PIPE_STAGE");
    stage_t *g = &p->st[s];
    *g = (stage_t){.s = s,
                   .S = p->S,
                   .M = p->M,
                   .fault = fault && atoi(fault) == s && p->S > 1,
                   .exec = o->exec,
                   .send_mem = o->send_mem,
                   .begin = o->start,
                   .user = o->user,
                   .in_elems = s > 0 ? link_of(o, s - 1) : 0,
                   .out_elems = s + 1 < p->S ? link_of(o, s) : 0,
                   .dtype = o->link_dtype,
                   .monitor = o->monitor,
                   .runner = p->runner};
    size_t cells = 3 * (size_t)o->micro_batches;
    g->have = calloc(cells, 1);
    g->taken = calloc(cells, 1);
    g->got = calloc(cells, sizeof(*g->got));
    if (!g->have || !g->taken || !g->got)
        return tr__errf(err, len, TR_ENOMEM, "pipeline: out of memory");
    return tr_pipe_schedule_create(&g->sch, o->kind, o->micro_batches, o->stages, s, err, len);
}

static int spawn_stage(tr_pipe_t *p, int s, char *err, size_t len)
{
    stage_t *g = &p->st[s];
    char name[32];
    snprintf(name, sizeof(name), "stage%d", s);
    tr_actor_opts_t ao = {.name = name, .pinned = 1, .defer_stop = 1, .lane_kind = TR_LANE_COMPUTE};
    int rc = tr_actor_spawn(p->rt, stage_behaviour, g, &ao, &p->ids[s]);
    if (rc < 0)
        return tr__errf(err, len, rc, "pipeline: spawning stage %d: %s", s, tr_strerror(rc));
    uint32_t slot = (uint32_t)p->ids[s].id; /* an actor's lane is its slot (troupe/runtime.h) */
    g->lane = slot < TR_RUNTIME_LANE_EXTERNAL ? slot : TR_RUNTIME_LANE_OVERFLOW;
    snprintf(name, sizeof(name), "stage %d", s);
    if (g->monitor) tr_monitor_lane_set(g->monitor, g->lane, name, TR_LANE_COMPUTE);
    return 0;
}

/* Across ranks: the link that carries this rank's stage's transfers. */
static int spawn_link(tr_pipe_t *p, const tr_pipe_run_opts_t *o, int rank, int world, char *err,
                      size_t len)
{
    stage_t *g = &p->st[p->lo];
    int acts = 0, grads = 0, n;
    for (int k = 0; k < tr_pipe_schedule_steps(g->sch); k++) {
        const tr_pipe_instr_t *x = tr_pipe_schedule_step(g->sch, k, &n);
        for (int i = 0; i < n; i++) {
            acts += x[i].op == TR_PIPE_RECV_ACTIVATION;
            grads += x[i].op == TR_PIPE_RECV_GRAD;
        }
    }
    tr__pipe_link_spec_t sp = {.rank = rank,
                               .world = world,
                               .stage = p->lo,
                               .stages = p->S,
                               .replicas = o->replicas,
                               .stage_actor = p->ids[p->lo],
                               .runner = p->runner,
                               .expect_act = acts,
                               .expect_grad = grads,
                               .dtype = o->link_dtype};
    size_t dts = tr_dtype_size(o->link_dtype);
    if (o->send_mem && p->lo > 0) /* activations: slots as the sender keeps them */
        sp.act = (tr__pipe_link_area_t){
            tr__pipe_stage_buffers(o->kind, o->micro_batches, o->stages, p->lo - 1, NULL, 0),
            link_of(o, p->lo - 1) * dts};
    if (o->send_mem && p->lo + 1 < p->S) /* gradients: mod this stage's buffers */
        sp.grad = (tr__pipe_link_area_t){tr_pipe_schedule_buffers(g->sch), link_of(o, p->lo) * dts};
    int rc = sp.act.slots < 0 ? sp.act.slots
                              : tr__pipe_link_spawn(p->rt, &sp, &p->link_id, &p->link, err, len);
    if (rc < 0) return rc;
    g->linked = true;
    g->prev = g->next = p->link_id;
    return 0;
}

static int spawn(tr_pipe_t *p, const tr_pipe_run_opts_t *o, int rank, int world, char *err,
                 size_t len)
{
    tr_actor_opts_t ro = {.name = "pipe-runner", .defer_stop = 1};
    int rc = tr_actor_spawn(p->rt, runner_behaviour, p, &ro, &p->runner);
    if (rc < 0) return tr__errf(err, len, rc, "pipeline: spawning its runner: %s", tr_strerror(rc));
    for (int s = p->lo; rc == 0 && s < p->hi; s++)
        rc = make_stage(p, o, s, err, len);
    for (int s = p->lo; rc == 0 && s < p->hi; s++)
        rc = spawn_stage(p, s, err, len);
    if (rc == 0 && o->across_ranks) rc = spawn_link(p, o, rank, world, err, len);
    for (int s = p->lo; rc == 0 && s < p->hi && !p->st[s].linked; s++) {
        p->st[s].prev = s > 0 ? p->ids[s - 1] : p->ids[s];
        p->st[s].next = s + 1 < p->S ? p->ids[s + 1] : p->ids[s];
    }
    return rc; /* prev and next are set before the first start, which publishes them */
}

int tr_pipe_create(tr_pipe_t **out, tr_runtime_t *rt, const tr_pipe_run_opts_t *o, char *err,
                   size_t errlen)
{
    *out = NULL;
    int rc = check_opts(o, err, errlen), rank = 0, world = 1, me = 0;
    if (rc == 0 && o->across_ranks) /* this process runs the stage of its rank */
        rc = tr__pipe_rank_stage(o->stages, o->replicas > 0 ? o->replicas : 1, &rank, &world, &me,
                                 err, errlen);
    if (rc < 0) return rc;
    tr_pipe_t *p = calloc(1, sizeof(*p));
    if (!p) return tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    *p = (tr_pipe_t){.rt = rt,
                     .S = o->stages,
                     .M = o->micro_batches,
                     .lo = o->across_ranks ? me : 0,
                     .hi = o->across_ranks ? me + 1 : o->stages};
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->done, NULL);
    p->st = calloc((size_t)p->S, sizeof(*p->st));
    p->ids = calloc((size_t)p->S, sizeof(*p->ids));
    p->loss = calloc((size_t)p->M, sizeof(*p->loss));
    p->has_loss = calloc((size_t)p->M, 1);
    rc = p->st && p->ids && p->loss && p->has_loss
             ? spawn(p, o, rank, world, err, errlen)
             : tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    if (rc < 0) {
        p->broken = true; /* the actors spawned so far stop with the runtime */
        tr_runtime_shutdown(rt, "pipeline set-up failed");
    }
    *out = p;
    return rc;
}

static void send_stop(tr_pipe_t *p, tr_actor_t to)
{
    tr_msg_t *m = tr_actor_is_none(to) ? NULL : tr_msg_new(p->rt, TR_MSG_STOP);
    if (!m) return;
    snprintf(TR_MSG_AS(m, stop)->reason, sizeof(TR_MSG_AS(m, stop)->reason), "pipeline over");
    if (tr_actor_send(p->rt, to, m) < 0) tr_msg_free(p->rt, m); /* stopped already */
}

void tr_pipe_stop(tr_pipe_t *p)
{
    if (!p) return;
    for (int s = p->lo; p->ids && s < p->hi; s++)
        send_stop(p, p->ids[s]);
    send_stop(p, p->link_id);
    send_stop(p, p->runner);
}

int tr_pipe_watch(tr_pipe_t *p, tr_actor_t watchdog)
{
    if (!p->link) return 0; /* in one process no transfer can wait on another rank */
    tr_msg_t *m = tr_msg_new(p->rt, TR_MSG_COMM_WATCH);
    if (!m) return TR_ENOMEM;
    *TR_MSG_AS(m, comm_watch) = (tr_msg_comm_watch_t){.what = TR_COMM_WATCH_BY, .actor = watchdog};
    int rc = tr_actor_send(p->rt, p->link_id, m);
    if (rc < 0) tr_msg_free(p->rt, m);
    return rc;
}

void tr_pipe_destroy(tr_pipe_t *p)
{
    if (!p) return;
    tr__pipe_link_free(p->link);
    for (int s = 0; p->st && s < p->S; s++) {
        tr_pipe_schedule_destroy(p->st[s].sch);
        free(p->st[s].have);
        free(p->st[s].taken);
        free(p->st[s].got);
    }
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->st);
    free(p->ids);
    free(p->loss);
    free(p->has_loss);
    free(p);
}

/* --- one batch ------------------------------------------------------------------------------ */

/* A stage's start: the step, and the batch's tensors as references (none: zeroed). */
static int send_start(tr_pipe_t *p, tr_actor_t to, unsigned long long step,
                      const tr_pipe_batch_t *batch)
{
    tr_msg_t *m = tr_msg_new(p->rt, TR_MSG_PIPE_XFER);
    if (!m) return TR_ENOMEM;
    *TR_MSG_AS(m, pipe_xfer) =
        (tr_msg_pipe_xfer_t){.kind = TR__PIPE_START,
                             .step = step,
                             .data = batch ? batch->tensor[0] : (tr_tensor_ref_t){0},
                             .data2 = batch ? batch->tensor[1] : (tr_tensor_ref_t){0}};
    m->step = step;
    int rc = tr_actor_send(p->rt, to, m);
    if (rc < 0) tr_msg_free(p->rt, m);
    return rc;
}

int tr_pipe_run(tr_pipe_t *p, unsigned long long step, float *losses, tr_pipe_run_result_t *out,
                char *err, size_t errlen)
{
    return tr_pipe_run_batch(p, step, NULL, losses, out, err, errlen);
}

int tr_pipe_run_batch(tr_pipe_t *p, unsigned long long step, const tr_pipe_batch_t *batch,
                      float *losses, tr_pipe_run_result_t *out, char *err, size_t errlen)
{
    if (p->broken)
        return tr__errf(err, errlen, TR_EFAILED,
                        "pipeline run: step %llu: an earlier batch failed across ranks or the "
                        "set-up failed; this pipeline runs no more batches",
                        step);
    pthread_mutex_lock(&p->mu);
    p->waiting = (p->hi - p->lo) + (p->link != NULL);
    memset(p->has_loss, 0, (size_t)p->M);
    p->end_ns = p->busy_ns = 0;
    p->res = (tr_pipe_run_result_t){0};
    p->rc = p->rc_rank = 0;
    p->why[0] = '\0';
    pthread_mutex_unlock(&p->mu);
    uint64_t t0 = tr_now_ns();
    int rc = 0;
    for (int s = p->hi - 1; rc == 0 && s >= p->lo; s--) /* last first: see the top */
        rc = send_start(p, p->ids[s], step, batch);
    if (rc < 0) { /* the stages already started cannot be waited for reliably */
        p->broken = true;
        return tr__errf(err, errlen, rc, "pipeline run: cannot start step %llu: %s", step,
                        tr_strerror(rc));
    }
    pthread_mutex_lock(&p->mu);
    while (p->waiting > 0) /* pairs with the signal in runner_behaviour */
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    for (int mb = 0; losses && mb < p->M; mb++) /* the runner's copy, now the caller's */
        if (p->has_loss[mb]) losses[mb] = p->loss[mb];
    if (p->rc < 0) {
        if (p->link) p->broken = true;
        return tr__errf(err, errlen, p->rc, "pipeline run: %s", p->why);
    }
    *out = p->res;
    uint64_t end = p->end_ns > t0 ? p->end_ns : t0;
    out->makespan_ms = (double)(end - t0) / 1e6;
    out->busy_ms = (double)p->busy_ns / 1e6;
    out->bubble = end > t0 ? 1 - (double)p->busy_ns / ((double)(p->hi - p->lo) * (double)(end - t0))
                           : 0; /* across ranks: this stage's idle share */
    out->theory = (double)(p->S - 1) / (p->M + p->S - 1);
    return 0;
}
