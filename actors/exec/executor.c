/* executor.c: the executor actor (pinned: it runs the model's forward and backward, blocking
 * its thread for the length of a micro-batch). It owns the model's buffers while it runs a
 * micro-batch, the validation set, the micro-step and sample counters and the data position
 * a checkpoint records.
 *
 * It keeps the loader's BATCH messages in a small queue (never more than `prefetch`, the
 * loader's credits see to that) and serves one client request at a time:
 *  - TRAIN: gradient_accumulation_steps micro-batches from the queue; in the last one, the
 *    boundary, each layer's backward is followed at once by a GRAD_READY for that layer's
 *    gradient range, so the bucketer and the communicator start while the layers below are
 *    still in backward. Then it waits for the optimizer's STEP_DONE, zeroes the gradients and
 *    answers with the step's statistics.
 *  - FORWARD / BACKWARD / STEP: the same, one call at a time, with the client's batches (staged
 *    in registered buffers and named by the request's tensor references).
 *  - EVAL: forward only over the validation set, from its start.
 *  - SAVE: starts the save chain (ENGINE_STATE to the optimizer) with its counters, and
 *    follows the save's writing on every rank (save_track.h) until latest names it;
 *  - WAIT: answered when the last save has finished on every rank, with its outcome.
 * The loss of each micro-batch is scaled by loss_scale / GAS before backward, so gradients
 * accumulate to the mean over the window (DeepSpeed's division by GAS). Every reply carries
 * the executor's view (global step, accumulation window) for the client.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/data/dataset.h"
#include "actors/engine/plan.h"
#include "actors/exec/ds_monitor.h"
#include "actors/exec/executor.h"
#include "actors/exec/save_track.h"
#include "troupe/pipeline.h"

typedef struct queued {
    uint32_t slot;
    tr__data_pos_t after; /* the stream position once this batch is consumed */
    void *in;             /* int tokens or float x */
    int *targets;
    float *y;
} queued_t;

/* Who waits for the backward in progress, and for the forward. */
enum { BW_NONE, BW_TRAIN, BW_CLIENT };
enum { FW_NONE, FW_TRAIN, FW_CLIENT, FW_EVAL };

/* What a COMM_SCALAR answers (its `what`). */
enum { SCALAR_STEP_LOSS = 1, SCALAR_EVAL_LOSS = 2 };

/* A rank that saw a signal adds STOP_MARK to its step's micro-batch count in the loss
 * all-reduce: the sum's multiple of it says how many did (the counts stay far below it, and
 * the sum is exact in a double). */
#define STOP_MARK 4294967296.0

/* Where the executor is in an accumulation window; win_next() holds every transition. A TRAIN
 * goes IDLE -> STEP_PENDING -> IDLE (its micro-batches before the boundary leave it IDLE);
 * the DeepSpeed-style calls go IDLE -> FORWARD (-> BACKWARD_WAITS) -> UNSTEPPED -> ... ->
 * FORWARD -> STEP_PENDING -> IDLE. A TRAIN whose micro-batch fails abandons its window (IDLE). */
typedef enum {
    WIN_IDLE,           /* nothing half done: the next call may start a micro-batch */
    WIN_FORWARD,        /* a forward is done, its backward not yet */
    WIN_BACKWARD_WAITS, /* ZeRO 2: that backward waits for grads_out to reach 0 */
    WIN_UNSTEPPED,      /* a backward's micro-batch (not the boundary) awaits tr_engine_step */
    WIN_STEP_PENDING,   /* the boundary's backward is done, STEP_DONE has not arrived */
} win_t;

typedef enum {
    EV_FORWARD_BEGIN,  /* a FORWARD starts: no micro-batch awaits its step any more */
    EV_FORWARD_DONE,   /* its forward succeeded */
    EV_BACKWARD_HELD,  /* a BACKWARD arrived while gradients are out for reduction */
    EV_BACKWARD_BEGIN, /* the forward's backward runs */
    EV_MICRO_DONE,     /* a micro-batch before the boundary is counted */
    EV_BOUNDARY_DONE,  /* the boundary's micro-batch is counted: the optimizer steps */
    EV_BACKWARD_REPLY, /* a BACKWARD is answered */
    EV_STEP_DONE,      /* the optimizer's STEP_DONE is handled: no micro-batch awaits a step */
    EV_STEPPED,        /* a STEP is answered at once, or a TRAIN starts */
    EV_ABANDONED,      /* a TRAIN's micro-batch failed: its window's gradients are zeroed */
} win_event_t;

/* The window's one transition function. An event that does not apply to the state leaves it
 * as it is (busy_reason keeps the client from sending those). The statistics of a step that
 * no STEP has reported yet (step_ready) are not part of the window: a client may start the
 * next window before it asks for them. */
static win_t win_next(win_t w, win_event_t ev)
{
    switch (ev) {
    case EV_FORWARD_BEGIN:
    case EV_STEPPED:
        return w == WIN_UNSTEPPED ? WIN_IDLE : w;
    case EV_FORWARD_DONE:
        return WIN_FORWARD;
    case EV_BACKWARD_HELD:
        return WIN_BACKWARD_WAITS;
    case EV_BACKWARD_BEGIN:
        return w == WIN_FORWARD || w == WIN_BACKWARD_WAITS ? WIN_IDLE : w;
    case EV_MICRO_DONE:
        return w == WIN_STEP_PENDING ? WIN_IDLE : w;
    case EV_BOUNDARY_DONE:
        return WIN_STEP_PENDING;
    case EV_BACKWARD_REPLY:
        return w == WIN_IDLE ? WIN_UNSTEPPED : w;
    case EV_STEP_DONE:
        return w == WIN_STEP_PENDING || w == WIN_UNSTEPPED ? WIN_IDLE : w;
    case EV_ABANDONED:
        return WIN_IDLE;
    }
    return w;
}

struct tr__exec {
    const tr__plan_t *eng;
    tr_model_t *model;
    tr__dataset_t *val;
    struct tr__dsmon *ds;
    queued_t q[TR__MAX_PREFETCH];
    int q_head, q_n;
    int req;         /* the client's request being served (0: none) */
    int want;        /* TRAIN: micro-batches still to run */
    int micro;       /* micro-batches done in the accumulation window */
    double loss_sum; /* over the window */
    uint64_t t_window, tokens_window;
    win_t win;              /* the accumulation window's state (win_next) */
    bool started;           /* the loader has been told to start */
    bool step_ready;        /* STEP_DONE arrived, `stats` not reported yet (DeepSpeed-style) */
    tr_msg_t *deferred_msg; /* a FORWARD that arrived while the step was pending (or NULL) */
    bool restoring;         /* offload_param: `restored` waits for the fetcher to store the slice */
    tr_msg_engine_state_t restored;
    tr_step_stats_t stats;
    tr_msg_step_done_t done; /* at world size > 1, a STEP_DONE waiting for the global loss */
    uint64_t grads_out;      /* ZeRO 2: gradient elements out for reduction, not yet freed */
    struct {                 /* the backward in progress (ZeRO 2 pauses it: backward_run) */
        int caller;          /* BW_NONE, BW_TRAIN (a TRAIN's batch `b`), BW_CLIENT */
        int next;            /* the next layer to go back through */
        bool boundary;
        int micro;         /* the window's micro-batch it belongs to */
        uint64_t step, t0; /* its step and when its backward began */
        uint64_t seg;      /* when it last started or went on after a wait */
        bool waiting;      /* paused (ZeRO 2, 3): the trace's span ended at the wait */
        float loss;        /* its forward's */
        queued_t b;        /* BW_TRAIN: the batch, given back to the loader once done */
    } bw;
    struct {          /* the forward in progress (ZeRO 3 pauses it: forward_run) */
        int caller;   /* FW_NONE, FW_TRAIN (then its backward), FW_CLIENT, FW_EVAL */
        int next;     /* the next layer to run */
        bool phantom; /* ZeRO 3 evaluation past this rank's batches: fetch, no compute */
        tr_batch_t batch;
        uint64_t t0, seg; /* when it began; when it last started or went on after a wait */
        bool waiting;     /* paused (ZeRO 3): the trace's span ended at the wait */
        float loss;
    } fw;
    struct { /* the EVAL in progress: its batches i, i + replicas, ... below n */
        uint32_t i, n, rounds, round;
        double sum, count;
    } ev;
    struct {                         /* ZeRO 3: what the fetcher has answered */
        uint32_t id;                 /* the pass asked for last */
        uint8_t *ready;              /* per layer: whole for that pass */
        int all;                     /* who waits for every layer: 0, TR__REQ_SAVE, _GATHER */
        tr_msg_engine_req_t request; /* that save's */
    } fetch;
    uint64_t version; /* of the parameters: every step and restore moves it (ZeRO 3) */
    bool grads_sent;  /* the window's gradients have gone (in part) to the bucketer */
    /* counters: global_steps and skipped_steps as the last STEP_DONE said */
    uint64_t global_steps, skipped_steps, global_samples, micro_steps;
    double loss_scale;       /* the next step's */
    uint32_t gen;            /* data generation: batches of older ones are dropped */
    tr__data_pos_t consumed; /* after the last batch trained on: what a save records */
    int *tokens, *targets;   /* the executor's copy of a client batch or an eval batch */
    float *x, *y;
    tr__save_track_t save; /* a background checkpoint save (see save_track.h) */
    uint64_t wait_t0;      /* since when a WAIT request waits for it to finish (0: none) */
    tr_pipe_model_t *pipe; /* pipeline.stages > 1: the stage actors a step runs through */
    bool pipe_watched;     /* its link reports its transfers to the comm actor's watchdog */
};

/* --- replies ----------------------------------------------------------------------------- */

/* A forward is done and its backward has not run. */
static bool have_forward(const struct tr__exec *x)
{
    return x->win == WIN_FORWARD || x->win == WIN_BACKWARD_WAITS;
}

static tr__reply_t view(const struct tr__exec *x)
{
    const tr__plan_t *e = x->eng;
    bool pending = x->win == WIN_STEP_PENDING;
    int pos = have_forward(x)            ? x->micro
              : pending || x->step_ready ? e->GAS - 1
              : x->win == WIN_UNSTEPPED  ? x->micro - 1
                                         : x->micro;
    return (tr__reply_t){.global_step = x->global_steps,
                         .window = x->micro + have_forward(x) + pending,
                         .micro_pos = pos};
}

/* Answers the client (rc >= 0) with r and the executor's view. */
static void reply_ok(struct tr__exec *x, int rc, tr__reply_t r)
{
    tr__reply_t v = view(x);
    r.global_step = v.global_step;
    r.window = v.window;
    r.micro_pos = v.micro_pos;
    tr__reply(x->eng, rc, &r, NULL);
}

/* --- messages out ------------------------------------------------------------------------- */

/* Gives a batch slot back to the loader. A credit that cannot be sent would leave the loader
 * one slot short for good, so it fails the engine; an earlier failure (rc_before) keeps its
 * own explanation. Returns rc_before, or the credit's failure. */
static int credit(tr_ctx_t *ctx, struct tr__exec *x, uint32_t slot, uint64_t step, int micro,
                  int rc_before)
{
    const tr__plan_t *e = x->eng;
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

static int grad_ready(tr_ctx_t *ctx, struct tr__exec *x, int layer, size_t offset, size_t count)
{
    if (count == 0 && layer != 0) return 0;
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_GRAD_READY);
    if (!m) return TR_ENOMEM;
    tr_msg_grad_ready_t *g = TR_MSG_AS(m, grad_ready);
    g->layer = (uint32_t)layer;
    g->offset = offset;
    g->count = count;
    g->last = layer == 0;
    m->step = x->global_steps;
    m->micro_step = (uint32_t)x->micro;
    /* ZeRO 3: the fetcher packs the buckets, in one stream with its all-gathers */
    int rc = tr_actor_send(ctx->rt, x->eng->zero == 3 ? x->eng->fetcher : x->eng->bucketer, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    x->grads_sent = true; /* even a failed send: the bucketer may hold earlier ranges */
    return rc;
}

/* ZeRO 3: asks the fetcher for something (a pass, a layer done, every layer, a rewrite). A
 * request that cannot go out fails the engine. */
static int ask_fetcher_src(tr_ctx_t *ctx, struct tr__exec *x, uint32_t kind, uint32_t pass,
                           int layer, tr_tensor_ref_t src)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_PARAM_FETCH);
    int rc = m ? 0 : TR_ENOMEM;
    if (m) {
        *TR_MSG_AS(m, param_fetch) = (tr_msg_param_fetch_t){.kind = kind,
                                                            .pass = pass,
                                                            .layer = (uint32_t)layer,
                                                            .id = x->fetch.id,
                                                            .version = x->version,
                                                            .src = src};
        m->step = x->global_steps;
        m->micro_step = (uint32_t)x->micro;
        if ((rc = tr_actor_send(ctx->rt, x->eng->fetcher, m)) < 0) tr_msg_free(ctx->rt, m);
    }
    if (rc < 0)
        tr__engine_fail(x->eng, rc, "executor: cannot ask the fetcher for parameters: %s",
                        tr_strerror(rc));
    return rc;
}

static int ask_fetcher(tr_ctx_t *ctx, struct tr__exec *x, uint32_t kind, uint32_t pass, int layer)
{
    return ask_fetcher_src(ctx, x, kind, pass, layer, (tr_tensor_ref_t){0});
}

/* A pass over the layers starts: at ZeRO 3 the fetcher gathers their parameters ahead. */
static int fetch_pass(tr_ctx_t *ctx, struct tr__exec *x, uint32_t pass)
{
    if (x->eng->zero != 3) return 0;
    x->fetch.id++;
    memset(x->fetch.ready, 0, (size_t)tr_model_num_layers(x->model));
    return ask_fetcher(ctx, x, TR__FETCH_PASS, pass, 0);
}

/* Layer i's parameters (its forward's, or its backward's) are whole (always, below ZeRO 3). */
static bool here(const struct tr__exec *x, int i, bool backward)
{
    return x->eng->zero != 3 || !tr__layer_fetched(x->model, i, backward) || x->fetch.ready[i];
}

/* The pass is done with layer i: the fetcher may release its parameters. */
static int fetch_done(tr_ctx_t *ctx, struct tr__exec *x, int i, bool backward)
{
    if (x->eng->zero != 3 || !tr__layer_fetched(x->model, i, backward)) return 0;
    return ask_fetcher(ctx, x, TR__FETCH_DONE, 0, i);
}

/* --- passes --------------------------------------------------------------------------------- */

/* A TRAIN's micro-batch failed (why: the layer's error). When none of the window's gradients
 * has left the executor, it is abandoned: the gradients its micro-batches accumulated are
 * zeroed and they are uncounted, so the next TRAIN starts a window of its own on the next
 * batches, as if the bad batch had never come. Otherwise it cannot be, and the engine fails
 * with the error: across ranks the others' collectives for this window have no match here
 * (with ZeRO 2, every micro-step's, whose reductions have already added this rank's earlier
 * micro-batches into the optimizer's partition); on one rank, a boundary whose backward handed
 * layers out (overlap_comm) before a lower one failed has put buckets in the bucketer and the
 * optimizer, which count them towards the step. */
static void train_failed(struct tr__exec *x, int rc, const char *why)
{
    const tr__plan_t *e = x->eng;
    if (e->world > 1 || e->zero >= 2 || x->grads_sent) {
        tr__engine_fail(e, rc, "%s", why);
        return;
    }
    tr_model_zero_grad(x->model);
    x->micro_steps -= (uint64_t)x->micro;
    x->global_samples -= (uint64_t)x->micro * (uint64_t)e->B * (uint64_t)e->replicas;
    x->micro = 0;
    x->loss_sum = 0;
    x->tokens_window = 0;
    x->win = win_next(x->win, EV_ABANDONED);
    tr__reply(e, rc, NULL, "%s", why);
}

/* Ends the request with an error naming the layer, the pass and the step (a TRAIN's:
 * train_failed). Across ranks, a failed pass whose collectives the other ranks go on with
 * fails the engine instead, as train_failed does: at ZeRO 3 any pass (the fetcher has asked
 * for gathers ahead), at ZeRO 2 a backward (its buckets are out). */
static int layer_failed(struct tr__exec *x, int layer, const char *pass, int rc)
{
    char why[1024];
    const char *model_why = tr_model_error(x->model); /* what the model knows: which target */
    snprintf(why, sizeof(why),
             "executor: step %llu, micro-step %d: layer %d '%s' %s failed: %s (%s)%s%s",
             (unsigned long long)x->global_steps, x->micro, layer,
             tr_model_layer(x->model, layer)->name, pass, tr_err_name(rc), tr_strerror(rc),
             model_why && model_why[0] ? ": " : "", model_why ? model_why : "");
    const tr__plan_t *e = x->eng;
    if (x->req == TR__REQ_TRAIN)
        train_failed(x, rc, why);
    else if (e->world > 1 && (e->zero == 3 || (e->zero == 2 && strcmp(pass, "backward") == 0)))
        tr__engine_fail(e, rc, "%s", why);
    else
        tr__reply(e, rc, NULL, "%s", why);
    return rc;
}

/* A forward or backward pass as a span of the trace's "executor passes" lane: the executor's
 * message span holds both, and the timeline shows where the gradients leave. */
static void pass_span(struct tr__exec *x, const char *name, uint64_t step, uint64_t t0, uint64_t t1)
{
    if (x->eng->mon)
        tr_monitor_span(x->eng->mon, &(tr_span_t){name, t0, t1, step, (uint32_t)x->micro,
                                                  TR__LANE_PASSES, 0, 0});
}

/* A pass pauses (for room in the gradient window, for parameters): its span so far ends here,
 * so the trace (and the summary's "comm hidden") shows the wait as no compute; the next
 * segment starts when it goes on (resumed). */
static void paused(struct tr__exec *x, const char *name, uint64_t *seg, bool *waiting)
{
    uint64_t now = tr_now_ns();
    if (!*waiting && now > *seg) pass_span(x, name, x->global_steps, *seg, now);
    *waiting = true;
}

static void resumed(uint64_t *seg, bool *waiting)
{
    if (*waiting) *seg = tr_now_ns();
    *waiting = false;
}

/* Starts a forward pass over the batch b at the first layer; forward_run goes through it. */
static int forward_begin(tr_ctx_t *ctx, struct tr__exec *x, int caller, const tr_batch_t *b,
                         uint32_t pass)
{
    x->fw.caller = caller;
    x->fw.next = 0;
    x->fw.phantom = false;
    x->fw.batch = *b;
    x->fw.t0 = x->fw.seg = tr_now_ns();
    x->fw.waiting = false;
    return fetch_pass(ctx, x, pass);
}

/* The forward pass from layer fw.next on; errors name the layer and the step. At ZeRO 3 a
 * layer runs only once the fetcher has said its parameters are whole (else the pass waits and
 * PARAM_READY resumes it), and the fetcher hears when the layer is done with them. 1: it
 * waits; 0: done (fw.loss); < 0: failed, reported. */
static int forward_run(tr_ctx_t *ctx, struct tr__exec *x)
{
    resumed(&x->fw.seg, &x->fw.waiting);
    for (; x->fw.next < tr_model_num_layers(x->model); x->fw.next++) {
        int i = x->fw.next;
        if (!here(x, i, false)) {
            if (x->fw.caller != FW_EVAL) paused(x, "forward", &x->fw.seg, &x->fw.waiting);
            return 1;
        }
        int rc = x->fw.phantom ? 0 : tr_model_layer_forward(x->model, i, &x->fw.batch);
        if (rc < 0) return layer_failed(x, i, "forward", rc);
        if ((rc = fetch_done(ctx, x, i, false)) < 0) return rc;
    }
    x->fw.loss = x->fw.phantom ? 0.0f : tr_model_loss(x->model);
    return 0;
}

/* Hands layer i's final gradient range to the bucketer. */
static int hand_out(tr_ctx_t *ctx, struct tr__exec *x, int i)
{
    tr_layer_t *l = tr_model_layer(x->model, i);
    int rc = grad_ready(ctx, x, i, l->param_offset, l->param_count);
    if (x->eng->zero >= 2) x->grads_out += l->param_count; /* out until GRADS_FREE */
    if (rc < 0)
        tr__engine_fail(x->eng, rc,
                        "executor: step %llu: cannot send layer %d's gradients to "
                        "the bucketer: %s",
                        (unsigned long long)x->global_steps, i, tr_strerror(rc));
    return rc;
}

/* Starts a micro-batch's backward pass at the last layer; backward_run goes through it. */
static int backward_begin(tr_ctx_t *ctx, struct tr__exec *x, int caller, bool boundary,
                          uint64_t step, uint64_t t0)
{
    x->bw.caller = caller;
    x->bw.next = tr_model_num_layers(x->model) - 1;
    x->bw.boundary = boundary;
    x->bw.micro = x->micro;
    x->bw.step = step;
    x->bw.t0 = x->bw.seg = t0;
    x->bw.waiting = false;
    tr_model_set_loss_scale(x->model, (float)(x->loss_scale / x->eng->GAS));
    return fetch_pass(ctx, x, TR__PASS_BACKWARD);
}

/* The backward pass from layer bw.next down. The gradients go out at the boundary: with
 * overlap_comm each layer's as soon as its backward is done, so the reduction of the last
 * layers runs while the first are still in backward; without it all of them once the
 * backward is over. ZeRO 2 reduces at every micro-step and never holds the whole gradient:
 * each layer's goes out as soon as it is done, and a layer starts only while what is out
 * (handed out, not yet freed by the optimizer) and its own range fit in grad_window; else
 * the pass waits, and the optimizer's GRADS_FREE resumes it (on_grads_free). At ZeRO 3 it
 * also waits for each layer's parameters, as forward_run does. 1: it waits; 0: done; < 0:
 * failed, reported. */
static int backward_run(tr_ctx_t *ctx, struct tr__exec *x)
{
    const tr__plan_t *e = x->eng;
    bool send = x->bw.boundary || e->zero >= 2, now = e->overlap_comm || e->zero >= 2;
    resumed(&x->bw.seg, &x->bw.waiting);
    for (; x->bw.next >= 0; x->bw.next--) {
        int i = x->bw.next;
        size_t own = tr_model_layer(x->model, i)->param_count;
        if (!here(x, i, true) ||
            (e->grad_window && x->grads_out && x->grads_out + own > e->grad_window)) {
            paused(x, "backward", &x->bw.seg, &x->bw.waiting);
            return 1;
        }
        int rc = tr_model_layer_backward(x->model, i);
        if (rc < 0) return layer_failed(x, i, "backward", rc);
        if ((rc = fetch_done(ctx, x, i, true)) < 0) return rc;
        if (send && now && (rc = hand_out(ctx, x, i)) < 0) return rc;
    }
    for (int i = tr_model_num_layers(x->model) - 1; send && !now && i >= 0; i--) {
        int rc = hand_out(ctx, x, i);
        if (rc < 0) return rc;
    }
    return 0;
}

/* A forward pass over [t0, t1) of step `step`: DeepSpeed's timers and the trace's span. */
static void forward_done(struct tr__exec *x, uint64_t step, uint64_t t0, uint64_t t1)
{
    tr__dsmon_forward(x->ds, t0, t1);
    pass_span(x, "forward", step, x->fw.seg, t1); /* since its last wait (ZeRO 3) */
}

/* A backward pass over [t0, t1): timers, span, and the micro-batch counted as done. */
/* A micro-batch is done: the window's and the run's counters (the boundary's marks the step
 * pending). */
static void micro_counted(struct tr__exec *x, bool boundary)
{
    const tr__plan_t *e = x->eng;
    x->micro++;
    x->tokens_window += (uint64_t)e->B * (uint64_t)e->T;
    x->micro_steps++;
    x->global_samples += (uint64_t)e->B * (uint64_t)e->replicas;
    x->win = win_next(x->win, boundary ? EV_BOUNDARY_DONE : EV_MICRO_DONE);
}

static void backward_done(struct tr__exec *x, uint64_t step, uint64_t t0, uint64_t t1,
                          bool boundary)
{
    tr__dsmon_backward(x->ds, t0, t1, boundary);
    pass_span(x, "backward", step, x->bw.seg, t1); /* since its last wait (ZeRO 2, 3) */
    micro_counted(x, boundary);
}

static tr_batch_t batch_of(const struct tr__exec *x, void *in, const int *targets, const float *y)
{
    const tr__plan_t *e = x->eng;
    return (tr_batch_t){.B = e->B,
                        .T = e->T,
                        .tokens = e->x_dim ? NULL : in,
                        .x = e->x_dim ? in : NULL,
                        .targets = targets,
                        .y = y,
                        .y_dim = e->y_dim};
}

/* The backward in progress is over (rc: 0, or its failure, already reported): a TRAIN's
 * micro-batch is counted; a client's BACKWARD is answered. */
static void backward_finished(struct tr__exec *x, int rc)
{
    int caller = x->bw.caller;
    x->bw.caller = BW_NONE;
    if (rc < 0) return;
    if (caller == BW_TRAIN) x->loss_sum += x->bw.loss;
    backward_done(x, x->bw.step, x->bw.t0, tr_now_ns(), x->bw.boundary);
    if (caller == BW_CLIENT) {
        x->win = win_next(x->win, EV_BACKWARD_REPLY);
        reply_ok(x, 0, (tr__reply_t){0});
    }
}

/* A TRAIN's forward is over (rc): its backward starts (at the boundary the gradients go out
 * layer by layer). 1: a pass waits (ZeRO 2, 3); else the micro-batch's outcome. */
static int train_forward_done(tr_ctx_t *ctx, struct tr__exec *x, int rc)
{
    if (rc < 0) return rc;
    uint64_t t1 = tr_now_ns();
    forward_done(x, x->bw.step, x->fw.t0, t1);
    x->bw.loss = x->fw.loss;
    rc = backward_begin(ctx, x, BW_TRAIN, x->micro == x->eng->GAS - 1, x->bw.step, t1);
    if (rc == 0) rc = backward_run(ctx, x);
    if (rc != 1) backward_finished(x, rc);
    return rc;
}

/* A TRAIN's micro-batch of step `step` from the queue: forward, then the backward. 1: a pass
 * waits for gradients to be freed (ZeRO 2) or parameters gathered (ZeRO 3); else its outcome,
 * the batch's slot to be given back (train_batch_done). */
static int micro_batch(tr_ctx_t *ctx, struct tr__exec *x, const queued_t *q, uint64_t step)
{
    tr_batch_t b = batch_of(x, q->in, q->targets, q->y);
    x->bw.b = *q;
    x->bw.micro = x->micro;
    x->bw.step = step;
    int rc = forward_begin(ctx, x, FW_TRAIN, &b, TR__PASS_FORWARD);
    if (rc == 0) rc = forward_run(ctx, x);
    if (rc == 1) return 1;
    x->fw.caller = FW_NONE;
    return train_forward_done(ctx, x, rc);
}

/* --- TRAIN ---------------------------------------------------------------------------------- */

/* Counts a pipelined step's micro-batches, as backward_done does one at a time. */
static void pipe_counted(struct tr__exec *x, const float *losses)
{
    for (int k = 0; k < x->eng->GAS; k++) {
        x->loss_sum += losses[k];
        micro_counted(x, k == x->eng->GAS - 1);
    }
}

/* A pipeline across ranks, after its batch: the stage's gradients reduced by the pipeline
 * (the tied ones between the two stages that hold them, the stage's range among its replicas:
 * DeepSpeed's mean, as the comm actor computes it over the replicas), then handed to the
 * optimizer as one reduced range. A reduction that fails leaves the ranks out of step: the
 * engine fails. */
static int stage_reduced(tr_ctx_t *ctx, struct tr__exec *x, uint64_t step)
{
    const tr__plan_t *e = x->eng;
    const tr_config_t *c = e->cfg;
    double R = e->replicas, f = c->gradient_predivide_factor;
    float pre = c->prescale_gradients ? (float)(1.0 / R) : (float)(1.0 / f);
    float post = c->prescale_gradients ? 1.0f : f != R ? (float)(f / R) : 1.0f;
    char why[512];
    int rc = tr_pipe_model_reduce_grads(x->pipe, pre, post, why, sizeof(why));
    if (rc < 0) {
        tr__engine_fail(e, rc, "executor: step %llu: %s", (unsigned long long)step, why);
        return rc;
    }
    size_t n = e->own_hi - e->own_lo;
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_REDUCED);
    if (!m) return TR_ENOMEM;
    tr_msg_reduced_t *r = TR_MSG_AS(m, reduced);
    r->at = r->first = e->own_lo;
    r->covers = n;
    m->step = step;
    rc = tr_buffer_ref(e->rt, e->buf_grads, e->own_lo * sizeof(float), n * sizeof(float),
                       TR_DTYPE_F32, &r->grads);
    tr__engine_bucket_bytes(e, (int64_t)(n * sizeof(float))); /* the optimizer takes it back */
    if (rc == 0) rc = tr_actor_send(ctx->rt, e->optimizer, m);
    if (rc < 0) {
        tr_msg_free(ctx->rt, m);
        tr__engine_bucket_bytes(e, -(int64_t)(n * sizeof(float)));
        tr__engine_fail(e, rc,
                        "executor: step %llu: cannot hand the stage's gradients to the "
                        "optimizer: %s",
                        (unsigned long long)step, tr_strerror(rc));
    }
    x->grads_sent = true;
    return rc;
}

/* pipeline.stages > 1: once a step's micro-batches are queued they run through the stage
 * actors together (tr_pipe_model_run: a start message to each stage; this thread waits for
 * the stages' reports), then every layer's gradients go out, as at a boundary without
 * overlap. */
static void run_pipelined(tr_ctx_t *ctx, struct tr__exec *x)
{
    const tr__plan_t *e = x->eng;
    int M = e->GAS, rc = 0;
    if (x->req != TR__REQ_TRAIN || x->want < M || x->q_n < M || x->win == WIN_STEP_PENDING) return;
    queued_t q[TR__MAX_PREFETCH];
    tr_batch_t b[TR__MAX_PREFETCH];
    float losses[TR__MAX_PREFETCH] = {0};
    for (int k = 0; k < M; k++) {
        q[k] = x->q[x->q_head];
        x->q_head = (x->q_head + 1) % TR__MAX_PREFETCH;
        x->q_n--;
        b[k] = batch_of(x, q[k].in, q[k].targets, q[k].y);
    }
    uint64_t step = x->global_steps, t0 = tr_now_ns();
    char why[1024];
    tr_model_set_loss_scale(x->model, (float)(x->loss_scale / M));
    tr_pipe_run_result_t r;
    if (!x->pipe_watched) /* the comm actor's watchdog watches the transfers across ranks */
        x->pipe_watched = tr_pipe_model_watch(x->pipe, e->comm) == 0;
    rc = tr_pipe_model_run(x->pipe, b, losses, step, &r, why, sizeof(why));
    if (rc == 0) { /* DeepSpeed's timers: the batch's wall time, split as the stages' compute */
        uint64_t t1 = tr_now_ns(), all = r.forward_ms + r.backward_ms > 0 ? t1 - t0 : 0;
        uint64_t mid =
            t0 +
            (all ? (uint64_t)((double)all * r.forward_ms / (r.forward_ms + r.backward_ms)) : 0);
        tr__dsmon_forward(x->ds, t0, mid);
        tr__dsmon_backward(x->ds, mid, t1, true);
        tr__dsmon_pipe(x->ds, &r, t1);
    }
    if (rc < 0) { /* the batch's partial gradients go: the next step starts from zero */
        tr_pipe_model_zero_grad(x->pipe);
        tr__reply(e, rc, NULL, "executor: step %llu: %s", (unsigned long long)step, why);
    }
    if (rc == 0) {
        pass_span(x, "pipeline", step, t0, tr_now_ns());
        pipe_counted(x, losses);
        x->consumed = q[M - 1].after;
        if (e->stage >= 0) rc = stage_reduced(ctx, x, step);
        for (int i = tr_model_num_layers(x->model) - 1; e->stage < 0 && rc == 0 && i >= 0; i--)
            rc = hand_out(ctx, x, i);
    }
    for (int k = 0; k < M; k++)
        rc = credit(ctx, x, q[k].slot, step, k, rc);
    if (rc < 0) {
        x->req = 0;
        x->want = 0;
        return;
    }
    x->want -= M;
}

/* A TRAIN's micro-batch (x->bw.b) is done, or failed (rc < 0): its slot goes back to the
 * loader and the stream position moves past it (a failed one is skipped with its window:
 * train_failed). < 0 ends the TRAIN. */
static int train_batch_done(tr_ctx_t *ctx, struct tr__exec *x, int rc)
{
    x->consumed = x->bw.b.after;
    rc = credit(ctx, x, x->bw.b.slot, x->bw.step, x->bw.micro, rc);
    if (rc < 0) {
        x->req = 0;
        x->want = 0;
        return rc;
    }
    x->want--;
    return 0;
}

/* Runs queued batches while a TRAIN wants them. */
static void run_train(tr_ctx_t *ctx, struct tr__exec *x)
{
    if (x->pipe) {
        run_pipelined(ctx, x);
        return;
    }
    while (x->req == TR__REQ_TRAIN && x->want > 0 && x->q_n > 0 && x->win != WIN_STEP_PENDING &&
           x->grads_out == 0 && x->fw.caller == FW_NONE && x->bw.caller == BW_NONE) {
        queued_t b = x->q[x->q_head];
        x->q_head = (x->q_head + 1) % TR__MAX_PREFETCH;
        x->q_n--;
        int rc = micro_batch(ctx, x, &b, x->global_steps);
        if (rc == 1) return; /* ZeRO 2, 3: GRADS_FREE or PARAM_READY goes on with it */
        if (train_batch_done(ctx, x, rc) < 0) return;
    }
}

/* Resolves a batch's references; an unresolvable one is an engine bug. */
static bool resolve_batch(const struct tr__exec *x, const tr_msg_batch_t *b, queued_t *q)
{
    char why[256];
    q->in = tr__resolve(x->eng, &b->tokens, why, sizeof(why));
    q->targets = b->targets.buffer_id ? tr__resolve(x->eng, &b->targets, why, sizeof(why)) : NULL;
    q->y = b->y.buffer_id ? tr__resolve(x->eng, &b->y, why, sizeof(why)) : NULL;
    if (q->in && (q->targets || q->y)) return true;
    tr__engine_fail(x->eng, TR_EINVAL, "executor: batch %llu from the loader: %s",
                    (unsigned long long)b->index, why);
    return false;
}

static void on_batch(tr_ctx_t *ctx, struct tr__exec *x, tr_msg_t *msg)
{
    tr_msg_batch_t *b = TR_MSG_AS(msg, batch);
    if (b->gen != x->gen) { /* from before a restore: drop it */
        if (credit(ctx, x, b->slot, x->global_steps, x->micro, 0) < 0) x->req = 0;
        return;
    }
    queued_t q = {.slot = b->slot, .after = {b->epoch, b->cursor, b->index + 1}};
    if (!resolve_batch(x, b, &q)) return;
    x->q[(x->q_head + x->q_n) % TR__MAX_PREFETCH] = q;
    x->q_n++;
    run_train(ctx, x);
}

/* --- the step ------------------------------------------------------------------------------ */

static void report_stats(struct tr__exec *x, const tr_msg_step_done_t *d, double loss)
{
    x->stats = (tr_step_stats_t){.global_step = d->global_step,
                                 .global_samples = x->global_samples,
                                 .skipped_steps = d->skipped_steps,
                                 .loss = (float)loss,
                                 .lr = d->lr,
                                 .grad_norm = d->grad_norm,
                                 .loss_scale = d->loss_scale,
                                 .skipped = d->skipped,
                                 .tokens = x->tokens_window * (uint64_t)x->eng->replicas,
                                 .step_ms = (tr_now_ns() - x->t_window) / 1e6};
    x->micro = 0;
    x->loss_sum = 0;
    x->tokens_window = 0;
    x->grads_sent = false;
    x->t_window = tr_now_ns();
}

static void serve_forward(tr_ctx_t *ctx, struct tr__exec *x, const tr_msg_engine_req_t *r);

/* The step is over: statistics (loss: the mean over the global batch), DeepSpeed's outputs,
 * the waiting call's reply, a FORWARD that waited for the parameters. */
static void finish_step(tr_ctx_t *ctx, struct tr__exec *x, const tr_msg_step_done_t *d, double loss)
{
    x->win = win_next(x->win, EV_STEP_DONE);
    x->global_steps = d->global_step;
    x->skipped_steps = d->skipped_steps;
    x->loss_scale = d->next_loss_scale;
    x->version++;         /* ZeRO 3: gathered copies are stale now */
    if (x->eng->zero < 3) /* (ZeRO 3: the fetcher makes a layer's as it gathers it) */
        tr_model_params_changed(x->model); /* the step wrote them: bf16 copies anew */
    if (x->eng->zero < 2 && x->pipe)       /* across ranks: the stage's gradients only */
        tr_pipe_model_zero_grad(x->pipe);
    else if (x->eng->zero < 2) /* ZeRO 2, 3: the optimizer zeroed each bucket as it took its part */
        tr_model_zero_grad(x->model);
    report_stats(x, d, loss);
    if (d->rc < 0) { /* the waiting call (a TRAIN, a STEP, a deferred FORWARD) gets it */
        x->req = 0;
        tr_msg_free(ctx->rt, x->deferred_msg); /* NULL: none */
        x->deferred_msg = NULL;
        tr__reply(x->eng, d->rc, NULL, "%s", d->error); /* the optimizer's explanation */
        return;
    }
    tr__dsmon_step(x->ds, &x->stats, d);
    if (x->req == TR__REQ_TRAIN || x->req == TR__REQ_STEP) {
        x->req = 0;
        reply_ok(x, 0, (tr__reply_t){.stats = x->stats});
    } else {
        x->step_ready = true;
    }
    if (x->deferred_msg) {
        tr_msg_t *m = x->deferred_msg;
        x->deferred_msg = NULL;
        serve_forward(ctx, x, TR_MSG_AS(m, engine_req));
        tr_msg_free(ctx->rt, m);
    }
}

/* Asks the comm actor to sum n (at most 4) values over the ranks; the answer comes as
 * COMM_SCALAR with `what`. A request that cannot go out fails the engine ("cannot ask
 * <about>"): the call waiting for the answer gets that. */
static void reduce_scalars(tr_ctx_t *ctx, struct tr__exec *x, uint32_t what, const double *v,
                           uint32_t n, const char *about)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_COMM_SCALAR);
    if (m) {
        tr_msg_comm_scalar_t *s = TR_MSG_AS(m, comm_scalar);
        *s = (tr_msg_comm_scalar_t){.op = 0, .n = n, .what = what};
        memcpy(s->values, v, n * sizeof(double));
        m->step = x->global_steps;
    }
    int rc = m ? tr_actor_send(ctx->rt, x->eng->comm, m) : TR_ENOMEM;
    if (rc < 0) {
        tr_msg_free(ctx->rt, m);
        tr__engine_fail(x->eng, rc, "executor: cannot ask %s: %s", about, tr_strerror(rc));
    }
}

static void on_step_done(tr_ctx_t *ctx, struct tr__exec *x, tr_msg_t *msg)
{
    tr_msg_step_done_t *d = TR_MSG_AS(msg, step_done);
    double micro = x->micro ? x->micro : 1;
    if (x->eng->stage >= 0 && d->rc >= 0) { /* across ranks: the stages' parameters whole again */
        char why[400];
        int rc =
            tr_pipe_model_sync_params(x->pipe, x->eng->optim_slice.partitioned, why, sizeof(why));
        if (rc < 0) {
            d->rc = rc;
            snprintf(d->error, sizeof(d->error), "executor: step %llu: %s",
                     (unsigned long long)d->global_step, why);
            tr__engine_fail(x->eng, rc, "%s", d->error);
        }
    }
    if (x->eng->world == 1 || d->rc < 0) {
        finish_step(ctx, x, d, x->loss_sum / micro);
        return;
    }
    x->done = *d; /* finished when the loss over every rank's micro-batches comes back */
    double v[4] = {x->loss_sum, micro}; /* and how far a background save is on every rank */
    if (x->pipe && tr_pipe_model_stage(x->pipe) >= 0 &&
        tr_pipe_model_stage(x->pipe) < x->eng->stages - 1)
        v[0] = v[1] = 0; /* across ranks the loss is the last stage's: the others add nothing */
    if (tr__client_stop_requested(x->eng->client)) v[1] += STOP_MARK;
    tr__save_values(&x->save, v + 2);
    reduce_scalars(ctx, x, SCALAR_STEP_LOSS, v, 4, "for the loss over the ranks");
}

/* --- DeepSpeed-style calls ----------------------------------------------------------------- */

/* Copies the client's staged batch (registered buffers named by the request) into the
 * executor's own arrays: the model reads them again in backward, after the reply. */
static int copy_client_batch(struct tr__exec *x, const tr_msg_engine_req_t *r)
{
    const tr__plan_t *e = x->eng;
    size_t bt = (size_t)e->B * (size_t)e->T;
    char why[256] = "";
    const void *in = tr__resolve(e, &r->inputs, why, sizeof(why));
    const void *t = r->targets.buffer_id ? tr__resolve(e, &r->targets, why, sizeof(why)) : NULL;
    const void *y = r->y.buffer_id ? tr__resolve(e, &r->y, why, sizeof(why)) : NULL;
    if (!in || (!t && !y)) {
        tr__reply(e, TR_EINVAL, NULL, "executor: forward: %s", why);
        return TR_EINVAL;
    }
    if (e->x_dim)
        memcpy(x->x, in, bt * (size_t)e->x_dim * sizeof(float));
    else
        memcpy(x->tokens, in, bt * sizeof(int));
    if (t) memcpy(x->targets, t, bt * sizeof(int));
    if (y) memcpy(x->y, y, bt * (size_t)e->y_dim * sizeof(float));
    return 0;
}

/* A client's forward is over (rc < 0: failed, reported): its loss is the reply. */
static void client_forward_done(struct tr__exec *x, int rc)
{
    x->fw.caller = FW_NONE;
    if (rc < 0) return;
    forward_done(x, x->global_steps, x->fw.t0, tr_now_ns());
    if (x->micro == 0) x->t_window = x->fw.t0;
    x->win = win_next(x->win, EV_FORWARD_DONE);
    x->loss_sum += x->fw.loss;
    reply_ok(x, 0, (tr__reply_t){.loss = x->fw.loss});
}

static void serve_forward(tr_ctx_t *ctx, struct tr__exec *x, const tr_msg_engine_req_t *r)
{
    const tr__plan_t *e = x->eng;
    if (copy_client_batch(x, r) < 0) return;
    tr_batch_t batch = batch_of(x, e->x_dim ? (void *)x->x : (void *)x->tokens,
                                e->y_dim ? NULL : x->targets, e->y_dim ? x->y : NULL);
    if (x->micro == 0) tr_monitor_step(e->mon, x->global_steps, tr_now_ns()); /* the window opens */
    x->win = win_next(x->win, EV_FORWARD_BEGIN);
    int rc = forward_begin(ctx, x, FW_CLIENT, &batch, TR__PASS_FORWARD);
    if (rc == 0) rc = forward_run(ctx, x);
    if (rc != 1) client_forward_done(x, rc); /* 1: ZeRO 3, PARAM_READY goes on */
}

static void serve_backward(tr_ctx_t *ctx, struct tr__exec *x)
{
    if (!have_forward(x)) {
        tr__reply(x->eng, TR_EINVAL, NULL, "tr_engine_backward: no forward to go back through");
        return;
    }
    if (x->grads_out) { /* ZeRO 2: the last micro-step's reductions still own the buffer */
        x->win = win_next(x->win, EV_BACKWARD_HELD);
        return;
    }
    x->win = win_next(x->win, EV_BACKWARD_BEGIN);
    int rc = backward_begin(ctx, x, BW_CLIENT, x->micro == x->eng->GAS - 1, x->global_steps,
                            tr_now_ns());
    if (rc == 0) rc = backward_run(ctx, x);
    if (rc != 1) backward_finished(x, rc); /* 1: ZeRO 2, 3: GRADS_FREE or PARAM_READY goes on */
}

static void serve_step(struct tr__exec *x)
{
    if (x->win == WIN_STEP_PENDING) {
        x->req = TR__REQ_STEP; /* answered at STEP_DONE */
        return;
    }
    bool ready = x->step_ready;
    x->step_ready = false;
    x->win = win_next(x->win, EV_STEPPED);
    /* 1: not a boundary, a no-op as in DeepSpeed */
    reply_ok(x, ready ? 0 : 1, (tr__reply_t){.stats = ready ? x->stats : (tr_step_stats_t){0}});
}

static void eval_run(tr_ctx_t *ctx, struct tr__exec *x);

/* A pass that waited (for room in the gradient window, ZeRO 2; for parameters, ZeRO 3) goes
 * on, and what waited for the pass after it. */
static void resume(tr_ctx_t *ctx, struct tr__exec *x)
{
    if (x->fw.caller == FW_EVAL) {
        eval_run(ctx, x); /* runs the forward, then the next batches */
        return;
    }
    if (x->fw.caller != FW_NONE) {
        int caller = x->fw.caller, rc = forward_run(ctx, x);
        if (rc == 1) return;
        if (caller == FW_CLIENT) {
            client_forward_done(x, rc);
            return;
        }
        x->fw.caller = FW_NONE;
        if ((rc = train_forward_done(ctx, x, rc)) == 1) return;
        if (train_batch_done(ctx, x, rc) == 0) run_train(ctx, x);
        return;
    }
    if (x->bw.caller != BW_NONE) {
        int caller = x->bw.caller, rc = backward_run(ctx, x);
        if (rc == 1) return;
        backward_finished(x, rc);
        if (caller == BW_TRAIN && train_batch_done(ctx, x, rc) == 0) run_train(ctx, x);
    }
}

/* ZeRO 2, 3: the optimizer has taken its part of a bucket and zeroed the bucket's range: a
 * backward waiting for room in its window goes on; once all are back, a waiting backward (or
 * the next micro-batch) may run. */
static void on_grads_free(tr_ctx_t *ctx, struct tr__exec *x, const tr_msg_grads_free_t *f)
{
    if (f->count > x->grads_out) {
        tr__engine_fail(x->eng, TR_EINVAL, "executor: %llu gradient elements freed, %llu out",
                        (unsigned long long)f->count, (unsigned long long)x->grads_out);
        return;
    }
    x->grads_out -= f->count;
    if (x->fw.caller != FW_NONE || x->bw.caller != BW_NONE) {
        resume(ctx, x);
        return;
    }
    if (x->grads_out) return;
    if (x->win == WIN_BACKWARD_WAITS) serve_backward(ctx, x);
    run_train(ctx, x);
}

static void save_chain(tr_ctx_t *ctx, struct tr__exec *x, const tr_msg_engine_req_t *r);
static int restore_rest(tr_ctx_t *ctx, struct tr__exec *x, tr_msg_engine_state_t *s);

/* ZeRO 3: the fetcher has gathered a layer's parameters for the pass (or every layer, for the
 * save waiting). Answers to a pass given up since are dropped. */
static void on_param_ready(tr_ctx_t *ctx, struct tr__exec *x, const tr_msg_param_ready_t *p)
{
    int L = tr_model_num_layers(x->model);
    if (p->layer == (uint32_t)L + 1 && x->restoring) { /* the restored slice is stored */
        x->restoring = false;
        restore_rest(ctx, x, &x->restored);
        return;
    }
    if (p->id != x->fetch.id || p->layer > (uint32_t)L) return;
    if (p->layer == (uint32_t)L) {
        int all = x->fetch.all;
        x->fetch.all = 0;
        if (all == TR__REQ_SAVE) save_chain(ctx, x, &x->fetch.request);
        if (all == TR__REQ_GATHER) reply_ok(x, 0, (tr__reply_t){0});
        return;
    }
    x->fetch.ready[p->layer] = 1;
    resume(ctx, x);
}

/* --- EVAL ---------------------------------------------------------------------------------- */

/* The validation stream (one process's: engine.c's open_data) at its batch i. */
static void seek_val(struct tr__exec *x, uint64_t i)
{
    uint64_t per_epoch = tr__dataset_samples_per_epoch(x->val), s = i * (uint64_t)x->eng->B;
    tr__data_pos_t p = {.batch_index = i};
    if (per_epoch) { /* shards: sample s of the stream, which wraps at the epoch's end */
        p.epoch = s / per_epoch;
        p.cursor = s % per_epoch;
    }
    tr__dataset_seek(x->val, p);
}

/* A pipeline across ranks: an evaluation batch goes through the replica's stages (each rank
 * forwards its layers); a failure, which leaves the ranks out of step, fails the engine. */
static int pipe_eval(struct tr__exec *x, const tr_batch_t *b, float *loss, int *has_loss)
{
    char why[512];
    int rc = tr_pipe_model_eval(x->pipe, b, loss, has_loss, why, sizeof(why));
    if (rc < 0) tr__engine_fail(x->eng, rc, "eval: %s", why);
    return rc;
}

/* An evaluation of n batches: the first n of the validation stream at any world size, replica
 * r of R taking batches r, R + r, 2R + r, ... (the stages of a replica all take them); the
 * mean over the ranks is their losses' sum over their count, so one checkpoint gives the same
 * validation loss on 1, 2 or 3 ranks (up to the summation order). */
static void serve_eval(tr_ctx_t *ctx, struct tr__exec *x, uint32_t n)
{
    uint32_t R = (uint32_t)x->eng->replicas;
    memset(&x->ev, 0, sizeof(x->ev));
    x->ev.i = (uint32_t)x->eng->replica;
    x->ev.n = n;
    x->ev.rounds = (n + R - 1) / R; /* rank 0's batches: the most any rank has */
    tr_model_set_training(x->model, 0);
    eval_run(ctx, x);
}

/* The EVAL's forward passes from batch ev.i on, until one waits for parameters (ZeRO 3:
 * PARAM_READY calls it again). At ZeRO 3 every rank runs as many passes as rank 0 (the
 * gathers are collectives): past its own batches, a rank's pass only fetches. */
static void eval_run(tr_ctx_t *ctx, struct tr__exec *x)
{
    const tr__plan_t *e = x->eng;
    char err[512];
    for (;;) {
        if (x->fw.caller == FW_EVAL) {
            int rc = forward_run(ctx, x);
            if (rc == 1) return;
            x->fw.caller = FW_NONE;
            if (rc < 0) {
                tr_model_set_training(x->model, 1);
                return;
            }
            if (!x->fw.phantom) {
                x->ev.sum += x->fw.loss;
                x->ev.count++;
            }
            x->ev.i += (uint32_t)e->replicas;
            x->ev.round++;
        }
        bool mine = x->ev.i < x->ev.n, wrapped;
        if (!mine && (e->zero != 3 || x->ev.round >= x->ev.rounds)) break;
        if (mine) {
            seek_val(x, x->ev.i);
            int rc = tr__dataset_next(x->val, e->x_dim ? NULL : x->tokens, e->x_dim ? x->x : NULL,
                                      e->y_dim ? NULL : x->targets, e->y_dim ? x->y : NULL,
                                      &wrapped, err, sizeof(err));
            if (rc < 0) {
                tr_model_set_training(x->model, 1);
                if (e->zero == 3) /* the other ranks go on with this pass's gathers */
                    tr__engine_fail(e, rc, "eval: %s", err);
                else
                    tr__reply(e, rc, NULL, "eval: %s", err);
                return;
            }
        }
        tr_batch_t batch = batch_of(x, e->x_dim ? (void *)x->x : (void *)x->tokens,
                                    e->y_dim ? NULL : x->targets, e->y_dim ? x->y : NULL);
        if (e->stage >= 0) { /* across ranks: the batch goes through the replica's stages */
            float loss = 0;
            int has_loss = 0;
            if (pipe_eval(x, &batch, &loss, &has_loss) < 0) {
                tr_model_set_training(x->model, 1);
                return;
            }
            x->ev.sum += has_loss ? loss : 0; /* the loss is the last stage's */
            x->ev.count += has_loss;
            x->ev.i += (uint32_t)e->replicas;
            x->ev.round++;
            continue;
        }
        if (forward_begin(ctx, x, FW_EVAL, &batch, TR__PASS_FORWARD_ALONE) < 0) {
            x->fw.caller = FW_NONE;
            tr_model_set_training(x->model, 1);
            return;
        }
        x->fw.phantom = !mine;
    }
    tr_model_set_training(x->model, 1);
    if (e->world > 1) { /* the mean over every rank's batches: answered at COMM_SCALAR */
        reduce_scalars(ctx, x, SCALAR_EVAL_LOSS, (double[2]){x->ev.sum, x->ev.count}, 2,
                       "for the loss over the ranks");
        return;
    }
    reply_ok(x, 0, (tr__reply_t){.loss = x->ev.count ? (float)(x->ev.sum / x->ev.count) : 0.0f});
}

static int save_moved(tr_ctx_t *ctx, struct tr__exec *x, const double v[2]);

/* A sum over the ranks came back: the loss of a step (with a save's progress) or of an
 * evaluation, or a wait's round. */
static void on_scalar(tr_ctx_t *ctx, struct tr__exec *x, const tr_msg_comm_scalar_t *s)
{
    double count = s->values[1], stops = 0;
    if (s->what == SCALAR_STEP_LOSS) { /* some rank saw a signal: every rank stops after it */
        stops = floor(count / STOP_MARK);
        count -= stops * STOP_MARK;
    }
    double mean = count > 0 ? s->values[0] / count : 0.0;
    if (s->what == TR__SCALAR_CKPT_SAVE) {
        save_moved(ctx, x, s->values);
    } else if (s->what == SCALAR_STEP_LOSS) {
        if (stops > 0) tr__client_stop_agree(x->eng->client);
        if (save_moved(ctx, x, s->values + 2) == 0) finish_step(ctx, x, &x->done, mean);
    } else {
        reply_ok(x, 0, (tr__reply_t){.loss = (float)mean});
    }
}

/* --- checkpoints ----------------------------------------------------------------------------- */

/* A save: the chain executor -> optimizer -> checkpointer. At ZeRO 3 the fetcher first gathers
 * every layer, so the checkpointer copies whole parameters (save_chain follows its answer). */
static void serve_save(tr_ctx_t *ctx, struct tr__exec *x, const tr_msg_engine_req_t *r)
{
    if (x->eng->zero != 3) {
        save_chain(ctx, x, r);
        return;
    }
    x->fetch.id++;
    x->fetch.all = TR__REQ_SAVE;
    x->fetch.request = *r;
    ask_fetcher(ctx, x, TR__FETCH_ALL, 0, 0);
}

/* tr_engine_gather_params: at ZeRO 3 the fetcher gathers every layer; the reply follows its
 * answer (on_param_ready). A pipeline across ranks broadcasts every stage's. */
static void serve_gather(tr_ctx_t *ctx, struct tr__exec *x)
{
    if (x->eng->stage >= 0) { /* a pipeline across ranks: every stage's, broadcast */
        char why[512];
        int rc = tr_pipe_model_gather_params(x->pipe, why, sizeof(why));
        if (rc < 0) tr__engine_fail(x->eng, rc, "gather: %s", why); /* the ranks are out of step */
        if (rc == 0) reply_ok(x, 0, (tr__reply_t){0});
        return;
    }
    if (x->eng->zero != 3) {
        reply_ok(x, 0, (tr__reply_t){0});
        return;
    }
    x->fetch.id++;
    x->fetch.all = TR__REQ_GATHER;
    ask_fetcher(ctx, x, TR__FETCH_ALL, 0, 0);
}

static void save_chain(tr_ctx_t *ctx, struct tr__exec *x, const tr_msg_engine_req_t *r)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_ENGINE_STATE);
    if (!m) {
        tr__reply(x->eng, TR_ENOMEM, NULL, "save: out of message memory");
        return;
    }
    tr_msg_engine_state_t *s = TR_MSG_AS(m, engine_state);
    s->kind = TR__STATE_SAVE;
    memcpy(s->dir, r->dir, sizeof(s->dir));
    memcpy(s->tag, r->tag, sizeof(s->tag));
    s->global_samples = x->global_samples;
    s->micro_steps = x->micro_steps;
    s->epoch = x->consumed.epoch; /* not the loader's: it has prefetched past it */
    s->cursor = x->consumed.cursor;
    s->batch_index = x->consumed.batch_index;
    m->step = x->global_steps;
    int rc = tr_actor_send(ctx->rt, x->eng->optimizer, m);
    if (rc < 0) {
        tr_msg_free(ctx->rt, m);
        tr__reply(x->eng, rc, NULL, "save: %s", tr_strerror(rc));
        return;
    }
    tr__save_begin(&x->save, r->dir, r->tag, x->global_steps);
}

/* A WAIT's round: every rank's part of the phase is over, so one round moves it on. */
static void save_round(tr_ctx_t *ctx, struct tr__exec *x)
{
    double v[2];
    tr__save_values(&x->save, v);
    reduce_scalars(ctx, x, TR__SCALAR_CKPT_SAVE, v, 2, "the ranks how far the checkpoint save is");
}

/* The save's outcome to a waiting WAIT (and forgotten: it is reported once). */
static void save_answer(struct tr__exec *x)
{
    if (x->wait_t0 && x->eng->mon) /* the caller was held up: the trace says */
        tr_monitor_span(x->eng->mon, &(tr_span_t){"checkpoint wait", x->wait_t0, tr_now_ns(),
                                                  x->global_steps, 0, TR__LANE_CKPT_WAIT, 0, 0});
    x->wait_t0 = 0;
    int rc = x->save.outcome;
    x->save.outcome = 0;
    if (rc < 0)
        tr__reply(x->eng, rc, NULL, "%s", x->save.outcome_why);
    else
        reply_ok(x, 0, (tr__reply_t){0});
}

/* An ENGINE_STATE of `kind` (LATEST, DISCARD) for the save to this rank's checkpointer. */
static void ask_checkpointer(tr_ctx_t *ctx, struct tr__exec *x, int kind, const char *what)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_ENGINE_STATE);
    if (m) {
        TR_MSG_AS(m, engine_state)->kind = kind;
        m->step = x->save.step;
    }
    if (!m || tr_actor_send(ctx->rt, x->eng->checkpointer, m) < 0) {
        tr_msg_free(ctx->rt, m);
        tr__engine_fail(x->eng, TR_ENOMEM, "executor: cannot %s", what);
    }
}

/* Every rank's progress (v: the sums; on one rank this rank's own): the next phase, the end,
 * or another round for a waiting WAIT. TR_EFAILED when the ranks are not all in the save:
 * the engine has failed (the waiting call gets it). */
static int save_moved(tr_ctx_t *ctx, struct tr__exec *x, const double v[2])
{
    const tr__plan_t *e = x->eng;
    int r = tr__save_advance(&x->save, e->rank, e->world, v);
    if (r == TR_EFAILED) {
        tr__engine_fail(e, TR_EFAILED, "%s", x->save.outcome_why);
        return r;
    }
    if (r == TR__SAVE_LATEST) {
        ask_checkpointer(ctx, x, TR__STATE_LATEST, "ask for latest to be written");
        return 0;
    }
    if (r == 1 && x->save.discard) { /* before the next save's SAVE reaches the checkpointer */
        x->save.discard = false;
        ask_checkpointer(ctx, x, TR__STATE_DISCARD, "ask for a failed save's files to go");
    }
    if (!x->wait_t0) return 0; /* no WAIT to answer */
    if (x->save.phase == TR__SAVE_NONE)
        save_answer(x);
    else if (e->world > 1 && tr__save_local_done(&x->save))
        save_round(ctx, x);
    return 0;
}

/* WRITTEN: this rank's checkpointer ended its part of the phase. */
static void save_reported(tr_ctx_t *ctx, struct tr__exec *x, const tr_msg_engine_state_t *s)
{
    tr__save_reported(&x->save, s->rc, s->error, s->tag);
    if (x->eng->world == 1) {
        double v[2];
        tr__save_values(&x->save, v);
        save_moved(ctx, x, v);
    } else if (x->wait_t0) {
        save_round(ctx, x);
    }
}

/* WAIT: answered when the last save has finished on every rank. */
static void serve_wait(tr_ctx_t *ctx, struct tr__exec *x)
{
    if (x->save.phase == TR__SAVE_NONE) {
        save_answer(x);
        return;
    }
    x->wait_t0 = tr_now_ns(); /* CLOCK_MONOTONIC: never 0 */
    if (x->eng->world > 1 && tr__save_local_done(&x->save)) save_round(ctx, x);
}

/* The restored parameters into the model: all of them, or with a pipeline across ranks the
 * stage's layers and the tied tensors they use only (the rest stays untouched). */
static void restore_params(struct tr__exec *x, const float *params)
{
    const tr__plan_t *e = x->eng;
    float *p = tr_model_params(x->model);
    if (e->zero == 3) { /* this rank's slice only; the fetcher gathers the rest when used */
        size_t lo, hi;
        tr__zero_owned(e->n_params, e->world, e->rank, &lo, &hi);
        memcpy(p + lo, params + lo, (hi - lo) * sizeof(float));
        return;
    }
    memcpy(p + e->own_lo, params + e->own_lo, (e->own_hi - e->own_lo) * sizeof(float));
    for (int i = e->stage_first; e->stage >= 0 && i <= e->stage_last; i++) {
        const tr_layer_t *l = tr_model_layer(x->model, i);
        if (l->tie_count && (l->tie_layer < e->stage_first || l->tie_layer > e->stage_last))
            memcpy(p + l->tie_offset, params + l->tie_offset, l->tie_count * sizeof(float));
    }
    if (e->zero < 3) tr_model_params_changed(x->model); /* ZeRO 3: the fetcher's, per layer */
}

/* A restore's executor part: parameters, counters, data position; then the loader moves and
 * the checkpointer hears that the restore is complete. */
static int restore(tr_ctx_t *ctx, struct tr__exec *x, tr_msg_t *msg)
{
    const tr__plan_t *e = x->eng;
    tr_msg_engine_state_t *s = TR_MSG_AS(msg, engine_state);
    char why[256];
    const float *params = tr__resolve(e, &s->params, why, sizeof(why));
    if (!params) {
        tr__engine_fail(e, TR_EINVAL, "load: executor: %s", why);
        return 0;
    }
    x->version++; /* ZeRO 3: the fetcher keeps this rank's slice of what was loaded */
    if (e->zero == 3 && e->param_offload) { /* it stores the slice from the checkpoint's copy,
                                             * which the checkpointer keeps until RESTORED */
        x->restored = *s;
        x->restoring = true;
        ask_fetcher_src(ctx, x, TR__FETCH_REWRITTEN, 0, 0, s->params); /* fails the engine */
        return 0;
    }
    restore_params(x, params);
    if (e->zero == 3 && ask_fetcher(ctx, x, TR__FETCH_REWRITTEN, 0, 0) < 0) return 0;
    return restore_rest(ctx, x, s);
}

/* The rest of a restore, once the parameters are in: counters, data position; then the loader
 * moves and the checkpointer hears that the restore is complete. */
static int restore_rest(tr_ctx_t *ctx, struct tr__exec *x, tr_msg_engine_state_t *s)
{
    const tr__plan_t *e = x->eng;
    x->global_steps = s->global_step;
    x->skipped_steps = s->skipped_steps;
    x->global_samples = s->global_samples;
    x->micro_steps = s->micro_steps;
    x->consumed = (tr__data_pos_t){s->epoch, s->cursor, s->batch_index};
    x->gen++;
    for (; x->q_n > 0; x->q_n--, x->q_head = (x->q_head + 1) % TR__MAX_PREFETCH)
        if (credit(ctx, x, x->q[x->q_head].slot, x->global_steps, 0, 0) < 0) return 0;
    tr_msg_t *seek = tr_actor_is_none(e->loader) ? NULL : tr_msg_new(ctx->rt, TR_MSG_LOADER_SEEK);
    if (seek) {
        *TR_MSG_AS(seek, loader_seek) =
            (tr_msg_loader_seek_t){x->gen, s->epoch, s->cursor, s->batch_index};
        seek->step = x->global_steps;
        if (tr_actor_send(ctx->rt, e->loader, seek) < 0) tr_msg_free(ctx->rt, seek);
    }
    s->kind = TR__STATE_RESTORED; /* back to the checkpointer, which frees its staging */
    tr_msg_t *m = tr_msg_alloc(ctx->rt, TR_MSG_ENGINE_STATE, sizeof(*s));
    if (!m) return TR_ENOMEM;
    memcpy(tr_msg_body(m), s, sizeof(*s));
    m->step = x->global_steps;
    int rc = tr_actor_send(ctx->rt, e->checkpointer, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    return rc;
}

/* --- requests -------------------------------------------------------------------------------- */

static const char *busy_reason(struct tr__exec *x, int kind)
{
    if (x->pipe && (kind == TR__REQ_FORWARD || kind == TR__REQ_BACKWARD || kind == TR__REQ_STEP))
        return "the engine is pipelined (pipeline.stages > 1): only tr_engine_train_batch runs "
               "a step (as DeepSpeed's PipelineEngine allows only train_batch)";
    if (kind == TR__REQ_WAIT) /* its rounds must not meet a step's collectives */
        return x->micro || have_forward(x) || x->win == WIN_STEP_PENDING
                   ? "checkpoint wait: in the middle of an accumulation window; wait between "
                     "steps"
                   : NULL;
    if (have_forward(x) && kind != TR__REQ_BACKWARD) return "a forward is waiting for its backward";
    if (kind == TR__REQ_TRAIN && x->micro > 0)
        return "the accumulation window was started with tr_engine_forward/backward; finish it "
               "with tr_engine_step";
    if (kind == TR__REQ_EVAL && x->win == WIN_STEP_PENDING)
        return "the optimizer step is pending; call tr_engine_step first";
    if (kind == TR__REQ_GATHER && (x->micro || x->win == WIN_STEP_PENDING))
        return "tr_engine_gather_params: in the middle of an accumulation window; call it "
               "after a step";
    if (kind == TR__REQ_SAVE && (x->micro || x->win == WIN_STEP_PENDING))
        return "save: in the middle of an accumulation window; save after a step";
    if (kind == TR__REQ_SAVE && x->save.phase != TR__SAVE_NONE)
        return "save: the last save is still being written (tr_engine_wait_checkpoint)";
    return NULL;
}

static void serve_train(tr_ctx_t *ctx, struct tr__exec *x)
{
    x->req = TR__REQ_TRAIN;
    x->step_ready = false; /* a DeepSpeed-style step's statistics are not this one's */
    x->win = win_next(x->win, EV_STEPPED);
    x->want = x->eng->GAS;
    x->t_window = tr_now_ns();
    if (!x->started) {
        x->started = true;
        tr_msg_t *m = tr__request_new(ctx->rt, TR__REQ_START);
        if (m) m->step = x->global_steps; /* the first batches belong to this step */
        if (!m || tr_actor_send(ctx->rt, x->eng->loader, m) < 0) {
            tr_msg_free(ctx->rt, m);
            tr__engine_fail(x->eng, TR_ENOMEM, "executor: cannot start the loader");
            return;
        }
    }
    run_train(ctx, x);
}

static int on_request(tr_ctx_t *ctx, struct tr__exec *x, tr_msg_t *msg)
{
    tr_msg_engine_req_t *r = TR_MSG_AS(msg, engine_req);
    const char *busy = busy_reason(x, (int)r->kind);
    if (busy) {
        tr__reply(x->eng, TR_EBUSY, NULL, "%s", busy);
        return 0;
    }
    switch (r->kind) {
    case TR__REQ_TRAIN:
        serve_train(ctx, x);
        break;
    case TR__REQ_EVAL:
        serve_eval(ctx, x, r->n);
        break;
    case TR__REQ_FORWARD:
        if (x->win != WIN_STEP_PENDING) {
            serve_forward(ctx, x, r);
            break;
        }
        /* parameters are being updated: keep the request until STEP_DONE */
        if (!(x->deferred_msg = tr_msg_alloc(ctx->rt, TR_MSG_ENGINE_REQ, sizeof(*r))))
            return TR_ENOMEM;
        memcpy(tr_msg_body(x->deferred_msg), r, sizeof(*r));
        break;
    case TR__REQ_BACKWARD:
        serve_backward(ctx, x);
        break;
    case TR__REQ_STEP:
        serve_step(x);
        break;
    case TR__REQ_SAVE:
        serve_save(ctx, x, r);
        break;
    case TR__REQ_WAIT:
        serve_wait(ctx, x);
        break;
    case TR__REQ_GATHER:
        serve_gather(ctx, x);
        break;
    default:
        tr__reply(x->eng, TR_EINVAL, NULL, "executor: unknown request %u", r->kind);
    }
    return 0;
}

static int executor_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    struct tr__exec *x = ctx->state;
    switch (msg->type) {
    case TR_MSG_BATCH:
        on_batch(ctx, x, msg);
        return 0;
    case TR_MSG_STEP_DONE:
        on_step_done(ctx, x, msg);
        return 0;
    case TR_MSG_ENGINE_REQ:
        return on_request(ctx, x, msg);
    case TR_MSG_ENGINE_STATE:
        if (TR_MSG_AS(msg, engine_state)->kind != TR__STATE_WRITTEN) return restore(ctx, x, msg);
        save_reported(ctx, x, TR_MSG_AS(msg, engine_state));
        return 0;
    case TR_MSG_COMM_SCALAR:
        on_scalar(ctx, x, TR_MSG_AS(msg, comm_scalar));
        return 0;
    case TR_MSG_GRADS_FREE:
        on_grads_free(ctx, x, TR_MSG_AS(msg, grads_free));
        return 0;
    case TR_MSG_PARAM_READY:
        on_param_ready(ctx, x, TR_MSG_AS(msg, param_ready));
        return 0;
    default:
        return 0;
    }
}

/* pipeline.stages > 1: the model cut by pipeline.partition into stages that run
 * pipeline.schedule, spawned once as pinned actors of the engine's runtime; rank 0 says what
 * each stage holds. */
static int make_pipeline(struct tr__exec *x, const tr__plan_t *e, char *err, size_t errlen)
{
    const tr_config_t *c = e->cfg;
    int S = e->stages;
    int *bounds = malloc(sizeof(int) * (size_t)(S + 1));
    const char *method = c->pipeline.partition && strcmp(c->pipeline.partition, "best")
                             ? c->pipeline.partition
                             : "parameters";
    int kind = c->pipeline.schedule && !strcmp(c->pipeline.schedule, "zb") ? TR_PIPE_TRAIN_ZB
                                                                           : TR_PIPE_TRAIN_1F1B;
    int rc = bounds ? tr_pipe_partition(x->model, method, S, bounds, err, errlen) : TR_ENOMEM;
    if (rc == 0)
        rc = tr_pipe_model_create(&x->pipe, e->rt, x->model, bounds, S, kind, e->GAS, e->B, e->T,
                                  e->world > 1 ? e->replicas : 0, e->mon, err, errlen);
    if (rc == 0) tr_pipe_model_set_timeout(x->pipe, (double)c->troupe.comm.timeout_s);
    for (int s = 0; rc == 0 && s < S && e->rank == 0; s++) {
        size_t params = 0;
        for (int i = bounds[s]; i < bounds[s + 1]; i++)
            params += tr_model_layer(x->model, i)->param_count;
        tr_log(TR_LOG_INFO,
               "pipeline: stage %d of %d (%s, partition %s): layers %d to %d (%s .. "
               "%s), %zu parameters",
               s, S, kind == TR_PIPE_TRAIN_ZB ? "zb" : "1f1b", method, bounds[s], bounds[s + 1] - 1,
               tr_model_layer(x->model, bounds[s])->name,
               tr_model_layer(x->model, bounds[s + 1] - 1)->name, params);
    }
    free(bounds);
    return rc;
}

/* The executor has stopped: the stage actors it ran batches on stop too. */
static void executor_cleanup(tr_ctx_t *ctx, int reason)
{
    (void)reason;
    struct tr__exec *x = ctx->state;
    tr_pipe_model_stop(x->pipe);
}

int tr__executor_spawn(const tr__plan_t *eng, tr_model_t *model, tr__dataset_t *val,
                       struct tr__dsmon *ds, struct tr__exec **state, tr_actor_t *self, char *err,
                       size_t errlen)
{
    struct tr__exec *x = calloc(1, sizeof(*x));
    if (!x) return TR_ENOMEM;
    *state = x;
    x->eng = eng;
    x->model = model;
    x->val = val;
    x->ds = ds;
    x->loss_scale = eng->loss_scale0;
    size_t bt = (size_t)eng->B * (size_t)eng->T;
    x->tokens = malloc(bt * sizeof(int));
    x->targets = malloc(bt * sizeof(int));
    x->x = malloc(bt * (size_t)(eng->x_dim ? eng->x_dim : 1) * sizeof(float));
    x->y = malloc(bt * (size_t)(eng->y_dim ? eng->y_dim : 1) * sizeof(float));
    x->fetch.ready = calloc((size_t)tr_model_num_layers(model) + 1, 1);
    if (!x->tokens || !x->targets || !x->x || !x->y || !x->fetch.ready) return TR_ENOMEM;
    if (eng->stages > 1) {
        int rc = make_pipeline(x, eng, err, errlen);
        if (rc < 0) return rc;
    }
    tr_actor_opts_t o = {.name = "executor",
                         .pinned = 1,
                         .defer_stop = 1,
                         .supervisor = eng->supervisor,
                         .cleanup = executor_cleanup,
                         .lane_kind = TR_LANE_COMPUTE};
    int rc = tr_actor_spawn(eng->rt, executor_behaviour, x, &o, self);
    if (rc < 0) tr_pipe_model_stop(x->pipe); /* no cleanup will stop them */
    return rc;
}

void tr__executor_free(struct tr__exec *x)
{
    if (!x) return;
    tr_pipe_model_destroy(x->pipe);
    free(x->tokens);
    free(x->targets);
    free(x->x);
    free(x->y);
    free(x->fetch.ready);
    free(x);
}
