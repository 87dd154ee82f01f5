/* executor.c: the executor actor (pinned: it runs the model's forward and backward, blocking
 * its thread for the length of a micro-batch).
 *
 * It keeps the loader's BATCH messages in a small queue (never more than `prefetch`, the
 * loader's credits see to that) and serves one client request at a time:
 *  - TRAIN: gradient_accumulation_steps micro-batches from the queue; in the last one, the
 *    boundary, each layer's backward is followed at once by a GRAD_READY for that layer's
 *    gradient range, so the bucketer and the communicator start while the layers below are
 *    still in backward. Then it waits for the optimizer's STEP_DONE, zeroes the gradients and
 *    answers with the step's statistics.
 *  - FORWARD / BACKWARD / STEP: the same, one call at a time, with the client's batches.
 *  - EVAL: forward only over the validation set, from its start.
 * The loss of each micro-batch is scaled by loss_scale / GAS before backward, so gradients
 * accumulate to the mean over the window (DeepSpeed's division by GAS).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/engine_internal.h"

typedef struct queued {
    uint32_t slot, gen;
    tr__data_pos_t after; /* the stream position once this batch is consumed */
    int *tokens;          /* or float x */
    int *targets;
} queued_t;

struct tr__exec {
    tr_engine_t *eng;
    queued_t q[TR__MAX_PREFETCH];
    int q_head, q_n;
    int req;         /* the client's request being served (0: none) */
    int want;        /* TRAIN: micro-batches still to run */
    int micro;       /* micro-batches done in the accumulation window */
    double loss_sum; /* over the window */
    uint64_t t_window, tokens_window;
    bool started;      /* the loader has been told to start */
    bool step_pending; /* boundary backward done, STEP_DONE not arrived */
    bool step_ready;   /* STEP_DONE arrived, not reported yet (DeepSpeed-style) */
    int deferred;      /* a FORWARD that arrived while the step was pending */
    tr_step_stats_t stats;
    bool have_forward;     /* DeepSpeed-style: forward done, backward not yet */
    int *tokens, *targets; /* the executor's copy of a client batch */
    float *x;
};

/* Gives a batch slot back to the loader. A credit that cannot be sent would leave the loader
 * one slot short for good, so it fails the engine; an earlier failure (rc_before) keeps its
 * own explanation. Returns rc_before, or the credit's failure. */
static int credit(tr_ctx_t *ctx, struct tr__exec *x, uint32_t slot, uint64_t step, int micro,
                  int rc_before)
{
    tr_engine_t *e = x->eng;
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_CREDIT);
    int rc = m ? 0 : TR_ENOMEM;
    if (m) {
        TR_MSG_AS(m, credit)->slot = slot;
        m->step = step; /* the batch's step: a trace puts the loader's refill in it */
        m->micro_step = (uint32_t)micro;
        rc = tr_actor_send(ctx->rt, e->loader, m);
        if (rc < 0) tr_msg_free(ctx->rt, m);
    }
    if (rc_before < 0) return rc_before;
    if (rc < 0)
        tr__engine_fail(e, rc, "executor: cannot return batch slot %u to the loader: %s", slot,
                        tr_strerror(rc));
    return rc;
}

static int grad_ready(tr_model_t *model, int layer, size_t offset, size_t count, void *arg)
{
    tr_ctx_t *ctx = arg;
    struct tr__exec *x = ctx->state;
    if (count == 0 && layer != 0) return 0;
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_GRAD_READY);
    if (!m) return 1;
    tr_msg_grad_ready_t *g = TR_MSG_AS(m, grad_ready);
    g->layer = (uint32_t)layer;
    g->offset = offset;
    g->count = count;
    g->last = layer == 0;
    m->step = x->eng->global_steps;
    m->micro_step = (uint32_t)x->micro;
    int rc = tr_actor_send(ctx->rt, x->eng->bucketer, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    return rc < 0;
}

/* Ends the request with an error naming the layer, the pass and the step. */
static int layer_failed(struct tr__exec *x, int layer, const char *pass, int rc)
{
    tr_engine_t *e = x->eng;
    tr__engine_reply(e, rc, "executor: step %llu, micro-step %d: layer %d '%s' %s failed: %s (%s)",
                     (unsigned long long)e->global_steps, x->micro, layer,
                     tr_model_layer(e->model, layer)->name, pass, tr_err_name(rc), tr_strerror(rc));
    return rc;
}

/* Forward over every layer; errors name the layer and the step. */
static int forward(struct tr__exec *x, const tr_batch_t *b, float *loss)
{
    tr_engine_t *e = x->eng;
    for (int i = 0; i < tr_model_num_layers(e->model); i++) {
        int rc = tr_model_layer_forward(e->model, i, b);
        if (rc < 0) return layer_failed(x, i, "forward", rc);
    }
    *loss = tr_model_loss(e->model);
    return 0;
}

static int backward(tr_ctx_t *ctx, struct tr__exec *x, bool boundary)
{
    tr_engine_t *e = x->eng;
    tr_model_set_loss_scale(e->model, (float)(tr__optimizer_loss_scale(e) / e->GAS));
    for (int i = tr_model_num_layers(e->model) - 1; i >= 0; i--) {
        int rc = tr_model_layer_backward(e->model, i);
        if (rc < 0) return layer_failed(x, i, "backward", rc);
        tr_layer_t *l = tr_model_layer(e->model, i);
        if (boundary && grad_ready(e->model, i, l->param_offset, l->param_count, ctx)) {
            tr__engine_reply(e, TR_ENOMEM, "executor: step %llu: cannot send layer %d's "
                             "gradients to the bucketer: out of message memory",
                             (unsigned long long)e->global_steps, i);
            return TR_ENOMEM;
        }
    }
    return 0;
}

/* A forward or backward pass as a span of the trace's "executor passes" lane: the executor's
 * message span holds both, and the timeline shows where the gradients leave. */
static void pass_span(struct tr__exec *x, const char *name, uint64_t step, uint64_t t0,
                      uint64_t t1)
{
    tr_engine_t *e = x->eng;
    if (e->mon)
        tr_monitor_span(e->mon, &(tr_span_t){name, t0, t1, step, (uint32_t)x->micro,
                                             TR__LANE_PASSES, 0, 0});
}

/* A forward pass over [t0, t1) of step `step`: DeepSpeed's timers and the trace's span. */
static void forward_done(struct tr__exec *x, uint64_t step, uint64_t t0, uint64_t t1)
{
    tr__dsmon_forward(x->eng, t0, t1);
    pass_span(x, "forward", step, t0, t1);
}

/* A backward pass over [t0, t1): timers, span, and the micro-batch counted as done. */
static void backward_done(struct tr__exec *x, uint64_t step, uint64_t t0, uint64_t t1,
                          bool boundary)
{
    tr_engine_t *e = x->eng;
    tr__dsmon_backward(e, t0, t1, boundary);
    pass_span(x, "backward", step, t0, t1);
    x->micro++;
    x->tokens_window += (uint64_t)e->B * (uint64_t)e->T;
    e->micro_steps++;
    e->global_samples += (uint64_t)e->B * (uint64_t)e->world;
    x->step_pending = boundary;
}

/* One micro-batch of step `step`: forward, backward; at the boundary the gradients go out
 * layer by layer. */
static int micro_batch(tr_ctx_t *ctx, struct tr__exec *x, const tr_batch_t *b, uint64_t step)
{
    tr_engine_t *e = x->eng;
    float loss;
    uint64_t t0 = tr_now_ns();
    int rc = forward(x, b, &loss);
    uint64_t t1 = tr_now_ns();
    if (rc == 0) {
        forward_done(x, step, t0, t1);
        bool boundary = x->micro == e->GAS - 1;
        rc = backward(ctx, x, boundary);
        if (rc == 0) {
            x->loss_sum += loss;
            backward_done(x, step, t1, tr_now_ns(), boundary);
        }
    }
    return rc;
}

static void finish_request_error(struct tr__exec *x)
{
    x->req = 0;
    x->want = 0;
}

/* Runs queued batches while a TRAIN wants them. */
static void run_train(tr_ctx_t *ctx, struct tr__exec *x)
{
    tr_engine_t *e = x->eng;
    while (x->req == TR__REQ_TRAIN && x->want > 0 && x->q_n > 0 && !x->step_pending) {
        queued_t b = x->q[x->q_head];
        x->q_head = (x->q_head + 1) % TR__MAX_PREFETCH;
        x->q_n--;
        tr_batch_t batch = {.B = e->B, .T = e->T, .targets = b.targets};
        if (e->x_dim)
            batch.x = (const float *)b.tokens;
        else
            batch.tokens = b.tokens;
        uint64_t step = e->global_steps; /* before the optimizer may count this step */
        int micro = x->micro;
        int rc = micro_batch(ctx, x, &batch, step);
        if (rc == 0) e->consumed = b.after;
        rc = credit(ctx, x, b.slot, step, micro, rc);
        if (rc < 0) {
            finish_request_error(x);
            return;
        }
        x->want--;
    }
}

static void on_batch(tr_ctx_t *ctx, struct tr__exec *x, tr_msg_t *msg)
{
    tr_engine_t *e = x->eng;
    tr_msg_batch_t *b = TR_MSG_AS(msg, batch);
    if (b->gen != atomic_load(&e->data_gen)) { /* from before a reseek: drop it */
        if (credit(ctx, x, b->slot, e->global_steps, x->micro, 0) < 0) finish_request_error(x);
        return;
    }
    int at = (x->q_head + x->q_n) % TR__MAX_PREFETCH;
    x->q[at] = (queued_t){b->slot,
                          b->gen,
                          {b->epoch, b->cursor, b->index + 1},
                          tr__engine_buffer(e, &b->tokens),
                          tr__engine_buffer(e, &b->targets)};
    x->q_n++;
    run_train(ctx, x);
}

static void report_stats(struct tr__exec *x, tr_msg_step_done_t *d)
{
    tr_engine_t *e = x->eng;
    x->stats = (tr_step_stats_t){.global_step = e->global_steps,
                                 .global_samples = e->global_samples,
                                 .skipped_steps = e->skipped_steps,
                                 .loss = (float)(x->loss_sum / (x->micro ? x->micro : 1)),
                                 .lr = d->lr,
                                 .grad_norm = d->grad_norm,
                                 .loss_scale = d->loss_scale,
                                 .skipped = d->skipped,
                                 .tokens = x->tokens_window,
                                 .step_ms = (tr_now_ns() - x->t_window) / 1e6};
    x->micro = 0;
    x->loss_sum = 0;
    x->tokens_window = 0;
    x->t_window = tr_now_ns();
}

static void copy_client_batch(struct tr__exec *x)
{
    tr_engine_t *e = x->eng;
    const tr_engine_batch_t *b = e->req_batch;
    size_t bt = (size_t)e->B * (size_t)e->T;
    if (e->x_dim)
        memcpy(x->x, b->x, bt * (size_t)e->x_dim * sizeof(float));
    else
        memcpy(x->tokens, b->tokens, bt * sizeof(int));
    memcpy(x->targets, b->targets, bt * sizeof(int));
}

static void serve_forward(tr_ctx_t *ctx, struct tr__exec *x)
{
    tr_engine_t *e = x->eng;
    if (!e->req_batch || (!e->req_batch->tokens && !e->req_batch->x) || !e->req_batch->targets) {
        tr__engine_reply(e, TR_EINVAL, "tr_engine_forward: the batch needs %s and targets",
                         e->x_dim ? "x" : "tokens");
        return;
    }
    copy_client_batch(x);
    tr_batch_t batch = {.B = e->B,
                        .T = e->T,
                        .tokens = e->x_dim ? NULL : x->tokens,
                        .x = e->x_dim ? x->x : NULL,
                        .targets = x->targets};
    float loss;
    uint64_t t0 = tr_now_ns();
    if (x->micro == 0) tr_monitor_step(e->mon, e->global_steps, t0); /* see step_begins */
    if (forward(x, &batch, &loss) < 0) return;
    forward_done(x, e->global_steps, t0, tr_now_ns());
    if (x->micro == 0) x->t_window = t0;
    x->have_forward = true;
    e->reply_loss = loss;
    x->loss_sum += loss;
    tr__engine_reply(e, 0, NULL);
}

static void serve_backward(tr_ctx_t *ctx, struct tr__exec *x)
{
    tr_engine_t *e = x->eng;
    if (!x->have_forward) {
        tr__engine_reply(e, TR_EINVAL, "tr_engine_backward: no forward to go back through");
        return;
    }
    x->have_forward = false;
    bool boundary = x->micro == e->GAS - 1;
    uint64_t step = e->global_steps, t0 = tr_now_ns();
    if (backward(ctx, x, boundary) < 0) return;
    backward_done(x, step, t0, tr_now_ns(), boundary);
    tr__engine_reply(e, 0, NULL);
}

static void on_step_done(tr_ctx_t *ctx, struct tr__exec *x, tr_msg_t *msg)
{
    tr_engine_t *e = x->eng;
    tr_msg_step_done_t *d = TR_MSG_AS(msg, step_done);
    x->step_pending = false;
    tr_model_zero_grad(e->model);
    report_stats(x, d);
    if (d->rc >= 0) tr__dsmon_step(e, &x->stats);
    if (d->rc < 0) {
        x->req = 0;
        tr__engine_reply(e, d->rc, "%s", e->error); /* the optimizer wrote the explanation */
        return;
    }
    if (x->req == TR__REQ_TRAIN || x->req == TR__REQ_STEP) {
        e->reply_stats = x->stats;
        x->req = 0;
        tr__engine_reply(e, 0, NULL);
    } else {
        x->step_ready = true;
    }
    if (x->deferred == TR__REQ_FORWARD) {
        x->deferred = 0;
        serve_forward(ctx, x);
    }
}

static void serve_eval(tr_ctx_t *ctx, struct tr__exec *x, uint32_t n)
{
    tr_engine_t *e = x->eng;
    tr__data_pos_t start = {0};
    tr__dataset_seek(e->val, start); /* every eval measures the same batches */
    double sum = 0;
    char err[512];
    for (uint32_t i = 0; i < n; i++) {
        bool wrapped;
        int rc = tr__dataset_next(e->val, x->tokens, x->x, x->targets, &wrapped, err, sizeof(err));
        if (rc < 0) {
            tr__engine_reply(e, rc, "eval: %s", err);
            return;
        }
        tr_batch_t batch = {.B = e->B,
                            .T = e->T,
                            .tokens = e->x_dim ? NULL : x->tokens,
                            .x = e->x_dim ? x->x : NULL,
                            .targets = x->targets};
        float loss;
        if (forward(x, &batch, &loss) < 0) return;
        sum += loss;
    }
    e->reply_loss = n ? (float)(sum / n) : 0.0f;
    tr__engine_reply(e, 0, NULL);
}

static const char *busy_reason(struct tr__exec *x, int kind)
{
    if (x->have_forward && kind != TR__REQ_BACKWARD) return "a forward is waiting for its backward";
    if (kind == TR__REQ_TRAIN && x->micro > 0)
        return "the accumulation window was started with tr_engine_forward/backward; finish it "
               "with tr_engine_step";
    if (kind == TR__REQ_EVAL && x->step_pending)
        return "the optimizer step is pending; call tr_engine_step first";
    return NULL;
}

static void on_request(tr_ctx_t *ctx, struct tr__exec *x, tr_msg_t *msg)
{
    tr_engine_t *e = x->eng;
    tr_msg_engine_req_t *r = TR_MSG_AS(msg, engine_req);
    const char *busy = busy_reason(x, (int)r->kind);
    if (busy) {
        tr__engine_reply(e, TR_EBUSY, "%s", busy);
        return;
    }
    switch (r->kind) {
    case TR__REQ_TRAIN:
        x->req = TR__REQ_TRAIN;
        x->step_ready = false; /* a DeepSpeed-style step's statistics are not this one's */
        x->want = e->GAS;
        x->t_window = tr_now_ns();
        if (!x->started) {
            x->started = true;
            tr__engine_request(e, e->loader, TR__REQ_START, 0, NULL, NULL);
        }
        run_train(ctx, x);
        break;
    case TR__REQ_EVAL:
        serve_eval(ctx, x, r->n);
        break;
    case TR__REQ_FORWARD:
        if (x->step_pending)
            x->deferred = TR__REQ_FORWARD; /* parameters are being updated */
        else
            serve_forward(ctx, x);
        break;
    case TR__REQ_BACKWARD:
        serve_backward(ctx, x);
        break;
    case TR__REQ_STEP:
        if (x->step_pending) {
            x->req = TR__REQ_STEP;
        } else {
            e->reply_stats = x->step_ready ? x->stats : (tr_step_stats_t){0};
            tr__engine_reply(e, x->step_ready ? 0 : 1, NULL); /* 1: not a boundary */
            x->step_ready = false;
        }
        break;
    default:
        tr__engine_reply(e, TR_EINVAL, "executor: unknown request %u", r->kind);
    }
}

static int executor_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    struct tr__exec *x = ctx->state;
    switch (msg->type) {
    case TR_MSG_BATCH:
        on_batch(ctx, x, msg);
        break;
    case TR_MSG_STEP_DONE:
        on_step_done(ctx, x, msg);
        break;
    case TR_MSG_ENGINE_REQ:
        on_request(ctx, x, msg);
        break;
    default:
        break;
    }
    return 0;
}

int tr__executor_micro(const tr_engine_t *eng)
{
    return eng->ex->micro;
}

int tr__executor_window(const tr_engine_t *eng)
{
    const struct tr__exec *x = eng->ex;
    return x->micro + (x->have_forward ? 1 : 0) + (x->step_pending ? 1 : 0);
}

int tr__executor_spawn(tr_engine_t *eng)
{
    struct tr__exec *x = calloc(1, sizeof(*x));
    if (!x) return TR_ENOMEM;
    eng->ex = x;
    x->eng = eng;
    size_t bt = (size_t)eng->B * (size_t)eng->T;
    x->tokens = malloc(bt * sizeof(int));
    x->targets = malloc(bt * sizeof(int));
    x->x = malloc(bt * (size_t)(eng->x_dim ? eng->x_dim : 1) * sizeof(float));
    if (!x->tokens || !x->targets || !x->x) return TR_ENOMEM;
    tr_actor_opts_t o = {.name = "executor",
                         .pinned = 1,
                         .defer_stop = 1,
                         .supervisor = eng->supervisor,
                         .lane_kind = TR_LANE_COMPUTE};
    return tr_actor_spawn(eng->rt, executor_behaviour, x, &o, &eng->executor);
}

void tr__executor_free(tr_engine_t *eng)
{
    struct tr__exec *x = eng->ex;
    if (!x) return;
    free(x->tokens);
    free(x->targets);
    free(x->x);
    free(x);
    eng->ex = NULL;
}
