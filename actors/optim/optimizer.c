/* optimizer.c: the optimizer actor (pinned: an update pass over every parameter blocks its
 * thread for a while).
 *
 * As each REDUCED bucket arrives it adds the bucket's squared norm (fp64, which also catches
 * Inf/NaN) while the executor is still in backward for the layers below. When the buckets
 * cover every parameter it runs DeepSpeed's step, in DeepSpeed's order:
 *   overflow check -> loss-scale update -> skip (counted, logged), or
 *   global norm -> one combined unscale-and-clip multiply -> optimizer -> scheduler step,
 * then sends STEP_DONE to the executor. Learning rates follow DeepSpeed: the first step uses
 * the optimizer's lr (OneCycle and LRRangeTest start from their minimum), each later one the
 * scheduler's lr at its current iteration.
 *
 * With offload_optimizer.device nvme the moments live in the swapper's file, and the update
 * runs sub-group by sub-group through the swapper before STEP_DONE (see "NVMe offload").
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "actors/optim/optimizer_internal.h"
#include "base/errf.h"
#include "base/vmem.h"
#include "kernels/cpu/gradnorm.h"
#include "runtime/msg/mpack.h"

static double loss_scale(const tr__optim_t *o)
{
    return o->fp16 ? tr_loss_scaler_scale(&o->scaler) : 1.0;
}

/* The scheduler's rate at its last_batch_iteration (sched_steps - 1). Before its first step
 * that is iteration -1, the value DeepSpeed's constructors write into the optimizer (0.19,
 * runtime/lr_schedules.py): warmup_min_lr for WarmupLR and WarmupDecayLR, 0 for
 * WarmupCosineLR, cycle_min_lr for OneCycle, lr_range_test_min_lr for LRRangeTest; so the
 * first step trains at it, not at the optimizer's lr. */
static double current_lr(const tr__optim_t *o)
{
    if (!o->has_schedule) return o->base_lr;
    return tr_lr_schedule_lr(&o->sched, o->sched_steps - 1);
}

/* Adam and Lamb beta1 follow OneCycle's momentum cycle when it has one, from the first step
 * (DeepSpeed's OneCycle sets the betas to cycle_min_mom when it is made). */
static void apply_momentum(tr__optim_t *o)
{
    double beta1;
    if (o->has_schedule && tr_lr_schedule_momentum(&o->sched, o->sched_steps - 1, &beta1) == 1) {
        o->adam.beta1 = (float)beta1;
        o->lamb.beta1 = (float)beta1;
    }
}

/* The betas the next step uses (DeepSpeed's get_mom() after a step): the config's, beta1
 * following OneCycle's momentum cycle when it has one; in double, as the config holds them. */
static void next_betas(const tr__optim_t *o, tr_msg_step_done_t *d)
{
    const double *b = o->eng->cfg->optimizer.params.betas;
    d->next_beta1 = b[0];
    d->next_beta2 = b[1];
    if (o->has_schedule) tr_lr_schedule_momentum(&o->sched, o->sched_steps - 1, &d->next_beta1);
}

/* The reduced gradient of flat parameter `at` (ZeRO 2 keeps only this rank's partition). */
static float *grad_at(const tr__optim_t *o, size_t at)
{
    return o->gpart ? o->gpart + (at - o->lo) : o->grads + at;
}

/* The parameters from flat element `at` on (this rank's slice; offload_param cpu keeps it in
 * its own home). */
static float *param_at(const tr__optim_t *o, size_t at)
{
    return o->home ? o->home + (at - o->lo) : o->params + at;
}

/* The moment arrays of the elements [at, at + n): m, v (Adam) and vmax (AMSGrad). */
typedef struct moments {
    float *m, *v, *vmax;
} moments_t;

/* Elements [at, at + n) of one decay range, for the elementwise optimizers (Adam, AdamW,
 * SGD, Lion), weight decay or not: their parameters at p, their gradients at g; s holds their
 * moments. */
static void update_piece(tr__optim_t *o, bool decay, size_t at, size_t n, float mul, float *p,
                         float *g, moments_t s)
{
    if (o->runs_as == TR_OPTIMIZER_SGD) {
        tr_sgd_opts_t so = o->sgd;
        so.weight_decay = decay ? so.weight_decay : 0.0f;
        tr_sgd_update(&so, o->st.step == 0, mul, p, g, s.m, n);
    } else if (o->runs_as == TR_OPTIMIZER_LION) {
        tr_lion_opts_t lo = o->lion;
        lo.weight_decay = decay ? lo.weight_decay : 0.0f;
        tr_lion_update(&lo, mul, p, g, s.m, n);
    } else if (o->amsgrad) {
        tr_adam_opts_t ao = o->adam;
        ao.weight_decay = decay ? ao.weight_decay : 0.0f;
        tr_adam_update_amsgrad(&ao, &o->st, mul, p, g, s.m, s.v, s.vmax, n);
    } else {
        tr_adam_opts_t ao = o->adam;
        ao.weight_decay = decay ? ao.weight_decay : 0.0f;
        tr_adam_update(&ao, &o->st, mul, p, g, s.m, s.v, n, NULL, TR_HALF_NONE);
    }
}

/* A whole range, its moments in the in-memory block. */
static void update_range(tr__optim_t *o, const decay_range_t *r, float mul)
{
    size_t k = r->at - o->lo;
    moments_t s = {o->m + k, o->v ? o->v + k : NULL, o->vmax ? o->vmax + k : NULL};
    update_piece(o, r->decay, r->at, r->n, mul, param_at(o, r->at), grad_at(o, r->at), s);
}

/* Lamb's options for tensor k of layer l: its own weight decay. */
static tr_lamb_opts_t lamb_opts(const tr__optim_t *o, const tr_layer_t *l, int k)
{
    tr_lamb_opts_t lo = o->lamb;
    lo.weight_decay = l->params[k].no_decay ? 0.0f : lo.weight_decay;
    return lo;
}

/* Calls fn for this rank's piece [a, b) of every parameter tensor (t: the tensor's number in
 * model order); stops at the first negative return. */
static int each_lamb_piece(tr__optim_t *o,
                           int (*fn)(tr__optim_t *, const tr_layer_t *, int k, int t, size_t a,
                                     size_t b, float mul),
                           float mul)
{
    const tr_model_t *model = o->eng->model;
    int t = 0, rc = 0;
    for (int i = 0; rc == 0 && i < tr_model_num_layers(model); i++) {
        tr_layer_t *l = tr_model_layer(model, i);
        for (int k = 0; rc == 0 && k < l->n_params; k++, t++) {
            size_t at = l->param_offset + l->params[k].offset, a = at > o->lo ? at : o->lo;
            size_t b = at + l->params[k].numel < o->hi ? at + l->params[k].numel : o->hi;
            rc = fn(o, l, k, t, a, b > a ? b : a, mul);
        }
    }
    return rc;
}

/* Pass 1 of Lamb on a piece: m, v and the piece's sums of p² and u² (0 for no piece). */
static int lamb_moments(tr__optim_t *o, const tr_layer_t *l, int k, int t, size_t a, size_t b,
                        float mul)
{
    double *sums = o->lamb_sums + 2 * t;
    sums[0] = sums[1] = 0.0;
    if (b == a) return 0;
    tr_lamb_opts_t lo = lamb_opts(o, l, k);
    return tr_lamb_moments(&lo, mul, param_at(o, a), grad_at(o, a), o->m + (a - o->lo),
                           o->v + (a - o->lo), b - a, &sums[0], &sums[1]) < 0
               ? TR_ENOMEM
               : 0;
}

/* Pass 2 on a piece, with the tensor's trust ratio from its sums over every rank's piece. */
static int lamb_apply(tr__optim_t *o, const tr_layer_t *l, int k, int t, size_t a, size_t b,
                      float mul)
{
    (void)mul;
    if (b == a) return 0;
    tr_lamb_opts_t lo = lamb_opts(o, l, k);
    float coeff = tr_lamb_trust_ratio(&lo, o->lamb_sums[2 * t], o->lamb_sums[2 * t + 1]);
    tr_lamb_apply(&lo, &o->st, coeff, param_at(o, a), o->m + (a - o->lo), o->v + (a - o->lo),
                  b - a);
    return 0;
}

/* Lamb: the trust ratio is per tensor, and so is its weight decay. With ZeRO the tensors are
 * cut across the ranks: the pieces' sums are added over the ranks (a COMM_REDUCE) before
 * pass 2, so the ratio is the whole tensor's. */
static int update_lamb(tr__optim_t *o, float mul)
{
    int rc = each_lamb_piece(o, lamb_moments, mul);
    if (rc < 0 || o->partitioned) return rc; /* pass 2 once the sums come back */
    return each_lamb_piece(o, lamb_apply, mul);
}

/* The update itself, with the combined unscale-and-clip factor. Weight decay skips the
 * tensors the model marks no_decay (biases, LayerNorm weights). */
static int update(tr__optim_t *o, float lr, float mul)
{
    int rc = 0;
    o->adam.lr = o->lamb.lr = o->sgd.lr = o->lion.lr = lr;
    if (o->runs_as != TR_OPTIMIZER_SGD && o->runs_as != TR_OPTIMIZER_LION)
        tr_adam_state_advance(&o->adam, &o->st); /* once per step, offloaded or not */
    if (o->swaps) { /* the sub-group pipeline updates the parameters (swap_step_group) */
        o->swap_step = true;
        o->swap_mul = mul;
        return 0;
    }
    if (o->runs_as == TR_OPTIMIZER_LAMB) rc = update_lamb(o, mul);
    for (int i = 0; o->runs_as != TR_OPTIMIZER_LAMB && i < o->n_ranges; i++)
        update_range(o, &o->ranges[i], mul);
    if (o->runs_as == TR_OPTIMIZER_SGD || o->runs_as == TR_OPTIMIZER_LION) o->st.step++;
    return rc;
}

/* The first parameter tensor, in model order, whose values hold Inf or NaN; -1 if none. */
static int nonfinite_param(const tr__optim_t *o, int *layer)
{
    const tr_model_t *model = o->eng->model;
    for (int i = 0; i < tr_model_num_layers(model); i++) {
        const tr_layer_t *l = tr_model_layer(model, i);
        for (int k = 0; k < l->n_params; k++) {
            if (!isfinite(tr_grad_sumsq(o->params + l->param_offset + l->params[k].offset,
                                        l->params[k].numel))) {
                *layer = i;
                return k;
            }
        }
    }
    return -1;
}

/* Says where the non-finite values are: a parameter that already holds them (a damaged file,
 * an earlier bad step), else the first layer in backward order (where they first appear)
 * whose gradients hold Inf or NaN, and how many do. */
static void name_nonfinite(const tr__optim_t *o, char *out, size_t len)
{
    const tr_model_t *model = o->eng->model;
    int first = -1, count = 0, n = tr_model_num_layers(model), pl = 0;
    int pk = nonfinite_param(o, &pl);
    if (o->gswap && pk < 0) { /* the gradients are on disk by now */
        snprintf(out, len,
                 "this rank's reduced gradients hold Inf or NaN (they were swapped to disk as "
                 "they came, so the layer is not named)");
        return;
    }
    for (int i = n - 1; i >= 0; i--) {
        const tr_layer_t *l = tr_model_layer(model, i);
        size_t a = l->param_offset, b = a + l->param_count;
        if (o->gpart) { /* ZeRO 2: the layer's part in this rank's partition */
            a = a > o->lo ? a : o->lo;
            b = b < o->hi ? b : o->hi;
        }
        if (b > a && !isfinite(tr_grad_sumsq(grad_at(o, a), b - a))) {
            count++;
            if (first < 0) first = i;
        }
    }
    if (pk >= 0)
        snprintf(out, len,
                 "layer %d '%s': parameter '%s' holds Inf or NaN before the step (a "
                 "damaged checkpoint or weights file?), so the gradients of %d of %d layers do",
                 pl, tr_model_layer(model, pl)->name, tr_model_layer(model, pl)->params[pk].name,
                 count, n);
    else if (first < 0)
        snprintf(out, len, "the gradient norm overflowed although every layer's is finite");
    else
        snprintf(out, len,
                 "layer %d '%s' is the first in backward order whose gradients hold "
                 "Inf or NaN (%d of %d layers do)",
                 first, tr_model_layer(model, first)->name, count, n);
}

/* DeepSpeed's step order. Fills d; returns a negative code (with d->error) only to stop
 * training. */
static int step(tr__optim_t *o, tr_msg_step_done_t *d)
{
    if (o->type == TR_OPTIMIZER_NONE) {
        return tr__errf(d->error, sizeof(d->error), TR_ECONFIG,
                        "optimizer: step requested but the config has no "
                        "\"optimizer\" section (%s)",
                        o->eng->cfg->source);
    }
    double scale = loss_scale(o);
    bool overflow = !isfinite(o->sumsq);
    int skip = 0;
    d->loss_scale = scale;
    if (o->fp16) {
        int rc = tr_loss_scaler_update(&o->scaler, overflow, &skip);
        if (rc < 0) {
            return tr__errf(d->error, sizeof(d->error), rc, "optimizer: step %llu: %s",
                            (unsigned long long)o->global_steps, o->scaler.message);
        }
    } else if (overflow) {
        char where[256];
        name_nonfinite(o, where, sizeof(where));
        return tr__errf(d->error, sizeof(d->error), TR_ENONFINITE,
                        "optimizer: step %llu: %s; without fp16 loss scaling to skip the step, "
                        "training stops before the parameters are corrupted (a learning rate too "
                        "high, or non-finite weights or inputs)",
                        (unsigned long long)o->global_steps, where);
    }
    o->global_steps++;
    if (skip) {
        o->skipped_steps++;
        d->skipped = 1;
        d->lr = current_lr(o);
        tr_log(TR_LOG_WARN, "optimizer: step %llu skipped: %s", (unsigned long long)o->global_steps,
               o->scaler.message);
        return 0;
    }
    double scaled_norm;
    tr_grad_norm_finish(o->sumsq, &scaled_norm);
    d->grad_norm = scaled_norm / scale;
    float mul = tr_grad_clip_mul(scaled_norm, scale, o->clip);
    d->lr = current_lr(o);
    apply_momentum(o);
    if (update(o, (float)d->lr, mul) < 0) {
        return tr__errf(d->error, sizeof(d->error), TR_ENOMEM,
                        "optimizer: step %llu: out of memory for Lamb's norms",
                        (unsigned long long)o->global_steps);
    }
    if (o->has_schedule) o->sched_steps++;
    return 0;
}

static int gather(tr_ctx_t *ctx, tr__optim_t *o, tr_msg_t *m);
static int lamb_reduce(tr_ctx_t *ctx, tr__optim_t *o, tr_msg_t *m);
static int send_or_free(tr_ctx_t *ctx, tr_actor_t to, tr_msg_t *m);
static int swap_begin(tr_ctx_t *ctx, tr__optim_t *o, int mode, tr_msg_t *held, float *stage);
static void save_stage_free(tr__optim_t *o);
static int swap_prefetch(tr_ctx_t *ctx, tr__optim_t *o);
static int swap_read_back(tr_ctx_t *ctx, tr__optim_t *o, size_t g, int b, float *buf);
enum { RUN_STEP = 1, RUN_SAVE, RUN_RESTORE, RUN_PREFETCH };

/* The step is taken (or skipped, or failed): STEP_DONE (m) to the executor, after the
 * parameter all-gather when partitioned (ZeRO 3 keeps them partitioned: the fetcher gathers
 * each layer when it is used). */
static int step_taken(tr_ctx_t *ctx, tr__optim_t *o, tr_msg_t *m)
{
    tr_msg_step_done_t *d = TR_MSG_AS(m, step_done);
    d->t_end = tr_now_ns();
    /* a pipeline across ranks gathers its stage's slices itself (tr_pipe_model_sync_params) */
    if (o->partitioned && o->eng->zero < 3 && o->eng->stage < 0 && d->rc >= 0 && !d->skipped)
        return gather(ctx, o, m);
    return send_or_free(ctx, o->eng->executor, m);
}

/* The parameters are updated: the reduced gradients are spent; STEP_DONE (m) follows
 * (partitioned Lamb: once its per-tensor sums are reduced over the ranks). */
static int step_end(tr_ctx_t *ctx, tr__optim_t *o, tr_msg_t *m)
{
    const tr_msg_step_done_t *d = TR_MSG_AS(m, step_done);
    if (o->gpart) memset(o->gpart, 0, (o->hi - o->lo) * sizeof(float));
    bool lamb_waits =
        o->partitioned && o->runs_as == TR_OPTIMIZER_LAMB && d->rc >= 0 && !d->skipped;
    return lamb_waits ? lamb_reduce(ctx, o, m) : step_taken(ctx, o, m);
}

/* Every gradient of the step is reduced: DeepSpeed's step, then step_end (offloaded: after
 * the sub-group pipeline has updated the parameters and written the state back). */
static int take_step(tr_ctx_t *ctx, tr__optim_t *o)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_STEP_DONE);
    if (!m) return TR_ENOMEM;
    tr_msg_step_done_t *d = TR_MSG_AS(m, step_done);
    m->step = o->global_steps; /* the step this completes: step() counts it */
    d->t_reduced = d->t_begin = tr_now_ns();
    d->rc = step(o, d);
    d->global_step = o->global_steps;
    d->skipped_steps = o->skipped_steps;
    d->next_lr = current_lr(o);
    next_betas(o, d);
    d->next_loss_scale = loss_scale(o);
    o->sumsq = 0;
    o->covered = 0;
    if (o->swap_step) { /* then step_end */
        o->swap_step = false;
        save_stage_free(o); /* a save's copy is written by now: the client waited for it */
        return swap_begin(ctx, o, RUN_STEP, m, NULL);
    }
    return step_end(ctx, o, m);
}

/* STEP_DONE (m) waits in o->held while the comm actor serves request r (its reference set
 * with rc): Lamb's norms, then (partitioned) the parameter all-gather, one after the other. */
static int ask_comm(tr_ctx_t *ctx, tr__optim_t *o, tr_msg_t *r, tr_msg_t *m, int rc,
                    const char *what)
{
    r->step = m->step;
    o->held = m;
    if (rc == 0) rc = tr_actor_send(ctx->rt, o->eng->comm, r);
    if (rc < 0) {
        tr_msg_free(ctx->rt, r);
        tr__engine_fail(o->eng, rc, "optimizer: cannot ask for %s: %s", what, tr_strerror(rc));
    }
    return rc;
}

/* The comm actor answered with rc: the STEP_DONE that waited, or NULL when the request failed
 * (the engine fails naming `what`). */
static tr_msg_t *answered(tr_ctx_t *ctx, tr__optim_t *o, int rc, const char *what)
{
    tr_msg_t *m = o->held;
    o->held = NULL;
    if (m && rc < 0) {
        tr_msg_free(ctx->rt, m);
        tr__engine_fail(o->eng, rc, "optimizer: %s failed: %s", what, tr_strerror(rc));
        return NULL;
    }
    return m;
}

/* Partitioned Lamb: the pieces' sums all-reduced over the ranks (COMM_REDUCE, in place). */
static int lamb_reduce(tr_ctx_t *ctx, tr__optim_t *o, tr_msg_t *m)
{
    const tr__plan_t *e = o->eng;
    tr_msg_t *r = tr_msg_new(ctx->rt, TR_MSG_COMM_REDUCE);
    if (!r) {
        tr_msg_free(ctx->rt, m);
        return TR_ENOMEM;
    }
    tr_buffer_info_t info;
    int rc = tr_buffer_info(e->rt, o->lamb_sums_id, &info);
    if (rc == 0)
        rc = tr_buffer_ref(e->rt, o->lamb_sums_id, 0, info.bytes, TR_DTYPE_F64,
                           &TR_MSG_AS(r, comm_reduce)->buf);
    return ask_comm(ctx, o, r, m, rc, "Lamb's norms over the ranks");
}

/* The sums are whole-tensor sums now: pass 2 with each tensor's trust ratio. */
static int on_lamb_sums(tr_ctx_t *ctx, tr__optim_t *o, const tr_msg_comm_reduce_t *v)
{
    tr_msg_t *m = answered(ctx, o, v->rc, "Lamb's norms over the ranks");
    if (!m) return v->rc < 0 ? 0 : TR_EINVAL; /* TR_EINVAL: nothing waited, an engine bug */
    each_lamb_piece(o, lamb_apply, 1.0f);
    return step_taken(ctx, o, m);
}

/* Asks the comm actor for a one-value all-reduce (op 0: sum, 1: max) of `what`. */
static int reduce_scalar(tr_ctx_t *ctx, tr__optim_t *o, uint32_t op, uint32_t what, double v)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_COMM_SCALAR);
    if (!m) return TR_ENOMEM;
    *TR_MSG_AS(m, comm_scalar) =
        (tr_msg_comm_scalar_t){.op = op, .n = 1, .what = what, .values = {v}};
    m->step = o->global_steps;
    int rc = tr_actor_send(ctx->rt, o->eng->comm, m);
    if (rc < 0) {
        tr_msg_free(ctx->rt, m);
        tr__engine_fail(o->eng, rc,
                        "optimizer: cannot ask for the gradient norm over the ranks: "
                        "%s",
                        tr_strerror(rc));
    }
    return rc;
}

enum { SCALAR_OVERFLOW = 1, SCALAR_SUMSQ = 2 };

/* ZeRO 2: each rank holds the squared norm of its partition only; the overflow flag is
 * all-reduced with MAX and the squared norm with SUM before the step (DeepSpeed's order). */
static int reduce_norm(tr_ctx_t *ctx, tr__optim_t *o)
{
    double local = o->gswap ? o->gsumsq : tr_grad_sumsq(o->gpart, o->hi - o->lo);
    o->gsumsq = 0;
    bool overflow = !isfinite(local);
    o->norm_waits = 2;
    o->overflow_any = false;
    int rc = reduce_scalar(ctx, o, 1, SCALAR_OVERFLOW, overflow ? 1.0 : 0.0);
    return rc < 0 ? rc : reduce_scalar(ctx, o, 0, SCALAR_SUMSQ, overflow ? 0.0 : local);
}

/* A pipeline across ranks: each rank holds its stage's reduced gradients, the same on every
 * replica of the stage, so the norm is the sum over the stages of one replica's (the tied
 * gradient counted once, on the stage that owns it); the overflow flag as at ZeRO 2. */
static int reduce_stage_norms(tr_ctx_t *ctx, tr__optim_t *o)
{
    double local = o->eng->replica == 0 ? o->sumsq : 0.0;
    bool overflow = !isfinite(o->sumsq);
    o->norm_waits = 2;
    o->overflow_any = false;
    int rc = reduce_scalar(ctx, o, 1, SCALAR_OVERFLOW, overflow ? 1.0 : 0.0);
    return rc < 0 ? rc : reduce_scalar(ctx, o, 0, SCALAR_SUMSQ, overflow ? 0.0 : local);
}

static int on_norm(tr_ctx_t *ctx, tr__optim_t *o, const tr_msg_comm_scalar_t *s)
{
    if (s->what == SCALAR_OVERFLOW) o->overflow_any = s->values[0] > 0;
    if (s->what == SCALAR_SUMSQ) o->sumsq = s->values[0];
    if (--o->norm_waits > 0) return 0;
    if (o->overflow_any) o->sumsq = INFINITY;
    return take_step(ctx, o);
}

static int free_grads(tr_ctx_t *ctx, tr__optim_t *o, size_t first, size_t covers);

/* ZeRO 2: this rank's part of a reduced bucket is added to its partition; the bucket's range
 * of the gradient buffer is zeroed, its pages handed back to the kernel (the gradient costs
 * memory only while its buckets are in flight), and the range given back to the executor,
 * whose backward writes further layers (or the next micro-step) against that credit. */
static int take_part(tr_ctx_t *ctx, tr__optim_t *o, const tr_msg_reduced_t *r, const float *g)
{
    size_t count = r->grads.length / sizeof(float);
    float *acc = o->gpart + (r->at - o->lo);
    for (size_t i = 0; i < count; i++)
        acc[i] += g[i];
    return free_grads(ctx, o, r->first, r->covers);
}

/* The gradient buffer's [first, first + covers) is spent: its pages go back to the kernel, and
 * the range back to the executor. */
static int free_grads(tr_ctx_t *ctx, tr__optim_t *o, size_t first, size_t covers)
{
    tr__vmem_release(o->grads + first, covers * sizeof(float));
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_GRADS_FREE);
    if (!m) return TR_ENOMEM;
    TR_MSG_AS(m, grads_free)->count = covers;
    m->step = o->global_steps;
    int rc = tr_actor_send(ctx->rt, o->eng->executor, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    return rc;
}

/* plan.swap_grads: the bucket's range of the gradient buffer goes back once the swapper has
 * its part (its answer to put_grads, in order). */
static int grads_put(tr_ctx_t *ctx, tr__optim_t *o)
{
    struct tr__gput *q = tr__fifo_front(&o->gputs);
    if (!q) {
        tr__engine_fail(o->eng, TR_EINVAL, "optimizer: a gradient write nobody asked for");
        return TR_EINVAL;
    }
    struct tr__gput p = *q;
    tr__fifo_pop(&o->gputs);
    return free_grads(ctx, o, p.first, p.covers);
}

/* plan.swap_grads (one micro-step): this rank's part of a reduced bucket (count floats) goes
 * to the swapper's gradient file, its squared norm into this step's; the gradient buffer's
 * range waits for the swapper's answer. */
static int put_grads(tr_ctx_t *ctx, tr__optim_t *o, const tr_msg_reduced_t *r, size_t count)
{
    const tr__plan_t *e = o->eng;
    char why[256];
    const float *g = count ? tr__resolve(e, &r->grads, why, sizeof(why)) : NULL;
    if (count && g) o->gsumsq += tr_grad_sumsq(g, count);
    if (!count) return free_grads(ctx, o, r->first, r->covers);
    if (tr__fifo_push(&o->gputs, &(struct tr__gput){r->first, r->covers}) < 0) return TR_ENOMEM;
    /* on failure the engine fails: the queued range stays out */
    return tr__swap_ask(ctx, e->swapper, TR__SWAP_PUT_GRADS, r->at, 0, r->grads, o->global_steps);
}

static int on_reduced(tr_ctx_t *ctx, tr__optim_t *o, tr_msg_t *msg)
{
    const tr__plan_t *e = o->eng;
    tr_msg_reduced_t *r = TR_MSG_AS(msg, reduced);
    size_t count = r->grads.length / sizeof(float);
    char why[256];
    const float *g = count ? tr__resolve(e, &r->grads, why, sizeof(why)) : o->grads;
    bool part = o->gpart || o->gswap;
    bool inside = r->first + r->covers <= e->n_params &&
                  (!part || !count || (r->at >= o->lo && r->at + count <= o->hi));
    if (!g || !inside) {
        tr__engine_fail(e, TR_EINVAL, "optimizer: bucket %u: %s", r->bucket,
                        g ? "its reduced part lies outside this rank's partition" : why);
        return TR_EINVAL;
    }
    tr__engine_bucket_bytes(e, -(int64_t)(r->covers * sizeof(float)));
    int prc = o->swaps && !o->run.mode ? swap_prefetch(ctx, o) : 0;
    if (prc < 0) return prc;
    o->covered += r->covers;
    if (o->gswap) {
        int rc = put_grads(ctx, o, r, count);
        if (rc < 0 || o->covered < (size_t)e->GAS * e->n_params) return rc;
        return reduce_norm(ctx, o);
    }
    if (!o->gpart) {
        o->sumsq += tr_grad_sumsq(g, count);
        if (o->covered < e->own_hi - e->own_lo) return 0;
        return e->stage >= 0 ? reduce_stage_norms(ctx, o) : take_step(ctx, o);
    }
    int rc = take_part(ctx, o, r, g);
    if (rc < 0 || o->covered < (size_t)e->GAS * e->n_params) return rc;
    return reduce_norm(ctx, o);
}

/* ZeRO 1, 2: the comm actor all-gathers every rank's updated slice in place, in the parameter
 * buffer; STEP_DONE (m) waits until the parameters are whole again. */
static int gather(tr_ctx_t *ctx, tr__optim_t *o, tr_msg_t *m)
{
    const tr__plan_t *e = o->eng;
    tr_msg_t *g = tr_msg_new(ctx->rt, TR_MSG_COMM_GATHER);
    if (!g) {
        tr_msg_free(ctx->rt, m);
        return TR_ENOMEM;
    }
    tr_msg_comm_gather_t *b = TR_MSG_AS(g, comm_gather);
    b->count = o->slice;
    int rc =
        tr_buffer_ref(e->rt, e->buf_params, 0, e->n_params * sizeof(float), TR_DTYPE_F32, &b->buf);
    return ask_comm(ctx, o, g, m, rc, "the parameter all-gather");
}

/* The slices are all-gathered: the parameters are whole on every rank; the step is done. */
static int on_gathered(tr_ctx_t *ctx, tr__optim_t *o, const tr_msg_comm_gather_t *b)
{
    tr_msg_t *m = answered(ctx, o, b->rc, "the parameter all-gather");
    if (!m) return b->rc < 0 ? 0 : TR_EINVAL; /* TR_EINVAL: nothing waited, an engine bug */
    return send_or_free(ctx, o->eng->executor, m);
}

/* A copy of an ENGINE_STATE, to send on (NULL: no memory). */
static tr_msg_t *state_copy(tr_ctx_t *ctx, const tr_msg_engine_state_t *s, uint64_t step)
{
    tr_msg_t *m = tr_msg_alloc(ctx->rt, TR_MSG_ENGINE_STATE, sizeof(*s));
    if (!m) return NULL;
    memcpy(tr_msg_body(m), s, sizeof(*s));
    m->step = step;
    return m;
}

static int send_or_free(tr_ctx_t *ctx, tr_actor_t to, tr_msg_t *m)
{
    int rc = tr_actor_send(ctx->rt, to, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    return rc;
}

/* Sends an ENGINE_STATE on, as a copy of s. */
static int forward_state(tr_ctx_t *ctx, const tr_msg_engine_state_t *s, tr_actor_t to,
                         uint64_t step)
{
    tr_msg_t *m = state_copy(ctx, s, step);
    return m ? send_or_free(ctx, to, m) : TR_ENOMEM;
}

/* --- NVMe offload: the sub-group pipeline ----------------------------------------------
 *
 * A run (a step, a save or a restore) walks this rank's sub-groups in order over the
 * swapper's n_bufs buffers. Each buffer starts one sub-group: a read (RUN_RESTORE: the
 * buffer is filled from the checkpoint's arrays and written). When a read comes back the
 * sub-group is stepped and written back (RUN_STEP) or copied out (RUN_SAVE); when a buffer's
 * last request for its sub-group comes back, the buffer starts the next sub-group. The
 * swapper serves requests in order, so with three buffers it reads sub-group i + 1 and
 * writes i - 1 back while this actor steps i. The run ends when every sub-group is done;
 * then the held message (STEP_DONE, or the ENGINE_STATE) goes on. A swapper error has
 * already failed the engine: the run is dropped.
 *
 * Adam itself is too short to hide the reads behind, so between runs the buffers are filled
 * ahead of time (RUN_PREFETCH): as soon as a run ends, and at the first reduced bucket if
 * none did, each buffer reads one of the first n_bufs sub-groups while the executor runs
 * the next forward and backward. A step or a save that begins then takes the prefetch over:
 * the reads already back are handled at once, the others when they come. A restore waits
 * for the prefetch's reads and then overwrites the buffers. */

static size_t group_n(const tr__optim_t *o, size_t g)
{
    size_t a = o->lo + g * o->eng->swap.group, b = a + o->eng->swap.group;
    return (b < o->hi ? b : o->hi) - a;
}

static int swap_send(tr_ctx_t *ctx, tr__optim_t *o, uint32_t op, size_t g, int b)
{
    const tr__plan_t *e = o->eng;
    tr_tensor_ref_t ref;
    int rc = tr_buffer_ref(e->rt, e->swap.buf_ids[b], 0, e->swap.buf_bytes, TR_DTYPE_U8, &ref);
    if (rc == 0) rc = tr__swap_ask(ctx, e->swapper, op, g, (uint32_t)b, ref, o->global_steps);
    if (rc < 0) {
        tr__engine_fail(e, rc, "optimizer: cannot ask the swapper for sub-group %zu: %s", g,
                        tr_strerror(rc));
    }
    return rc;
}

/* Copies sub-group g between a swap buffer (n_arrays arrays of `group` floats) and the run's
 * block of whole arrays (n_arrays arrays of hi - lo floats). */
static void copy_group(const tr__optim_t *o, size_t g, float *buf, bool to_block)
{
    size_t S = o->hi - o->lo, G = o->eng->swap.group, n = group_n(o, g);
    for (int k = 0; k < o->n_arrays; k++) {
        float *blk = o->run.stage + (size_t)k * S + g * G, *sw = buf + (size_t)k * G;
        memcpy(to_block ? blk : sw, to_block ? sw : blk, n * sizeof(float));
    }
}

/* The step's update of sub-group g, its moments in buf (and its parameters after them, when
 * they are swapped too): each decay range's part in it. */
static void swap_step_group(tr__optim_t *o, size_t g, float *buf)
{
    size_t G = o->eng->swap.group, a = o->lo + g * G, b = a + group_n(o, g);
    const tr__swap_layout_t *l = &o->eng->swap;
    float *p = l->param_bytes ? (float *)((char *)buf + l->slot_bytes) : NULL;
    float *gr = l->grad_bytes ? (float *)((char *)buf + l->slot_bytes + l->param_bytes) : NULL;
    for (int i = 0; i < o->n_ranges; i++) {
        const decay_range_t *r = &o->ranges[i];
        size_t x = r->at > a ? r->at : a, y = r->at + r->n < b ? r->at + r->n : b;
        if (x >= y) continue;
        size_t k = x - a;
        moments_t s = {buf + k, o->n_arrays > 1 ? buf + G + k : NULL,
                       o->amsgrad ? buf + (size_t)(o->n_arrays - 1) * G + k : NULL};
        update_piece(o, r->decay, x, y - x, o->swap_mul, p ? p + k : param_at(o, x),
                     gr ? gr + k : grad_at(o, x), s);
    }
}

static int swap_start_group(tr_ctx_t *ctx, tr__optim_t *o, size_t g, int b)
{
    if (o->run.mode != RUN_RESTORE) return swap_send(ctx, o, TR__SWAP_READ, g, b);
    tr_buffer_info_t info;
    int rc = tr_buffer_info(o->eng->rt, o->eng->swap.buf_ids[b], &info);
    if (rc < 0) return rc;
    copy_group(o, g, info.base, false); /* the parameters are the fetcher's to write */
    return swap_send(ctx, o, TR__SWAP_WRITE_STATE, g, b);
}

/* Every sub-group of a step is stepped: the parameters are whole, STEP_DONE goes on while the
 * last write-backs are still in flight (they overlap the next forward; the next run waits for
 * them: swap_begin). */
static int swap_stepped(tr_ctx_t *ctx, tr__optim_t *o)
{
    tr_msg_t *m = o->run.held;
    o->run.held = NULL;
    if (o->runs_as == TR_OPTIMIZER_SGD || o->runs_as == TR_OPTIMIZER_LION)
        o->st.step++; /* as update() does in memory, after every element */
    return step_end(ctx, o, m);
}

/* Every sub-group is done: the held message goes on, then a run that waited starts. */
static int swap_end(tr_ctx_t *ctx, tr__optim_t *o)
{
    int rc = o->run.mode == RUN_STEP && o->run.held ? swap_stepped(ctx, o) : 0;
    tr_msg_t *m = o->run.held;
    int mode = o->run.mode;
    o->run = (struct swap_run){0};
    if (mode == RUN_SAVE) rc = send_or_free(ctx, o->eng->checkpointer, m);
    if (mode == RUN_RESTORE) rc = send_or_free(ctx, o->eng->executor, m);
    if (rc < 0) return rc;
    /* after a restore with the parameters swapped, not yet: the fetcher is writing the
     * restored ones to the file, and only the first reduced bucket comes surely after that */
    bool later = mode == RUN_PREFETCH || (mode == RUN_RESTORE && o->eng->swap.param_bytes);
    if (!o->queued.mode) return later ? 0 : swap_prefetch(ctx, o);
    mode = o->queued.mode;
    m = o->queued.held;
    float *stage = o->queued.stage;
    o->queued.mode = 0;
    o->queued.held = NULL;
    return swap_begin(ctx, o, mode, m, stage);
}

static void swap_drop(tr_ctx_t *ctx, tr__optim_t *o)
{
    if (o->run.held) tr_msg_free(ctx->rt, o->run.held);
    if (o->queued.held) tr_msg_free(ctx->rt, o->queued.held);
    o->run = (struct swap_run){0};
    o->queued.mode = 0;
    o->queued.held = NULL;
}

/* Every read the prefetch started is back (a buffer's bit per read). */
static bool prefetch_back(const tr__optim_t *o)
{
    return (size_t)__builtin_popcountll(o->run.ready) == o->run.next;
}

/* Reads the first n_bufs sub-groups ahead of the next run (see above). */
static int swap_prefetch(tr_ctx_t *ctx, tr__optim_t *o)
{
    const tr__swap_layout_t *l = &o->eng->swap;
    /* with the gradients swapped a sub-group is whole only once the backward is done: its
     * read must come after every PUT_GRADS, so the step reads it, none ahead */
    if (o->run.mode || l->n_groups == 0 || l->grad_bytes) return 0;
    o->run = (struct swap_run){.mode = RUN_PREFETCH};
    int rc = 0;
    for (int b = 0; rc == 0 && b < l->n_bufs && o->run.next < l->n_groups; b++) {
        o->run.group_of[b] = o->run.next;
        rc = swap_send(ctx, o, TR__SWAP_READ, o->run.next++, b);
    }
    if (rc < 0) swap_drop(ctx, o);
    return rc;
}

/* A step or a save takes the prefetch over: the reads already back are handled now. */
static int swap_adopt(tr_ctx_t *ctx, tr__optim_t *o, int mode, tr_msg_t *held, float *stage)
{
    o->run.mode = mode;
    o->run.held = held;
    o->run.stage = stage;
    uint64_t ready = o->run.ready;
    o->run.ready = 0;
    int rc = 0;
    for (int b = 0; rc == 0 && o->run.mode == mode && b < o->eng->swap.n_bufs; b++) {
        tr_buffer_info_t info;
        if (!(ready >> b & 1)) continue;
        rc = tr_buffer_info(o->eng->rt, o->eng->swap.buf_ids[b], &info);
        if (rc < 0)
            swap_drop(ctx, o);
        else
            rc = swap_read_back(ctx, o, o->run.group_of[b], b, info.base);
    }
    return rc;
}

/* The moments' part of a step, or a save's or restore's copy: held goes on at the end. While
 * the last run's write-backs are in flight the new run waits (the swapper serves requests in
 * order, but the buffers are still the writes'). */
static int swap_begin(tr_ctx_t *ctx, tr__optim_t *o, int mode, tr_msg_t *held, float *stage)
{
    const tr__swap_layout_t *l = &o->eng->swap;
    if (o->run.mode == RUN_PREFETCH && mode != RUN_RESTORE)
        return swap_adopt(ctx, o, mode, held, stage);
    if (o->run.mode == RUN_PREFETCH && prefetch_back(o))
        o->run = (struct swap_run){0}; /* a restore overwrites what was read ahead */
    if (o->run.mode) {
        if (o->queued.mode) { /* one run at a time waits: an engine bug otherwise */
            tr_msg_free(ctx->rt, held);
            tr__engine_fail(o->eng, TR_EINVAL,
                            "optimizer: a third swap run while two are "
                            "pending");
            return TR_EINVAL;
        }
        o->queued.mode = mode;
        o->queued.held = held;
        o->queued.stage = stage;
        return 0;
    }
    o->run = (struct swap_run){.mode = mode, .held = held, .stage = stage};
    if (l->n_groups == 0) return swap_end(ctx, o);
    int rc = 0;
    for (int b = 0; rc == 0 && b < l->n_bufs && o->run.next < l->n_groups; b++)
        rc = swap_start_group(ctx, o, o->run.next++, b);
    if (rc < 0) swap_drop(ctx, o);
    return rc;
}

/* Buffer b's last request for its sub-group is back: it starts the next one. */
static int swap_group_done(tr_ctx_t *ctx, tr__optim_t *o, int b)
{
    int rc = 0;
    o->run.done++;
    if (o->run.next < o->eng->swap.n_groups)
        rc = swap_start_group(ctx, o, o->run.next++, b);
    else if (o->run.done == o->eng->swap.n_groups)
        return swap_end(ctx, o);
    if (rc < 0) swap_drop(ctx, o);
    return rc;
}

/* Sub-group g's state is in buffer b (buf): stepped and written back (a step), copied out (a
 * save), or kept for the run that takes the prefetch over; a restore waiting for the
 * prefetch starts once every read is back. */
static int swap_read_back(tr_ctx_t *ctx, tr__optim_t *o, size_t g, int b, float *buf)
{
    const tr__swap_layout_t *l = &o->eng->swap;
    int rc = 0;
    if (o->run.mode == RUN_PREFETCH) {
        o->run.ready |= UINT64_C(1) << b;
        bool all_back = prefetch_back(o);
        if (!o->queued.mode || !all_back) return 0;
        o->run.mode = RUN_STEP; /* ends as a run with nothing held: the restore starts */
        o->run.held = NULL;
        return swap_end(ctx, o);
    }
    if (o->run.mode == RUN_SAVE) {
        copy_group(o, g, buf, true);
        return swap_group_done(ctx, o, b);
    }
    swap_step_group(o, g, buf);
    rc = swap_send(ctx, o, TR__SWAP_WRITE, g, b);
    if (rc == 0 && ++o->run.stepped == l->n_groups) rc = swap_stepped(ctx, o);
    if (rc < 0) swap_drop(ctx, o);
    return rc;
}

/* The swapper's answer for one sub-group of the run. */
static int on_swap(tr_ctx_t *ctx, tr__optim_t *o, const tr_msg_swap_t *q)
{
    const tr__plan_t *e = o->eng;
    char why[256];
    if (q->op == TR__SWAP_PUT_GRADS) return q->rc < 0 ? 0 : grads_put(ctx, o);
    if (!o->run.mode) return 0; /* the rest of a run dropped at a failure: the engine failed */
    float *buf = q->rc < 0 ? NULL : tr__resolve(e, &q->buf, why, sizeof(why));
    if (!buf) { /* the swapper has failed the engine; else this is an engine bug */
        if (q->rc >= 0)
            tr__engine_fail(e, TR_EINVAL, "optimizer: a swap reply for sub-group %llu: %s",
                            (unsigned long long)q->group, why);
        swap_drop(ctx, o);
        return 0;
    }
    if (q->op == TR__SWAP_READ) return swap_read_back(ctx, o, q->group, (int)q->tag, buf);
    return swap_group_done(ctx, o, (int)q->tag);
}

/* A save's block for the moments (m, v, vmax of this rank's partition), registered: the
 * checkpointer writes it. Made at the first save, freed at the next step. */
static int save_stage(tr__optim_t *o)
{
    size_t bytes = (size_t)o->n_arrays * (o->hi - o->lo) * sizeof(float);
    if (o->save_stage) return 0;
    if (!(o->save_stage = malloc(bytes ? bytes : 1))) return TR_ENOMEM;
    int rc = tr__optimizer_register(o, "optimizer/save_moments", o->save_stage, bytes, TR_DTYPE_F32,
                                    TR_BUFFER_REQUEST, &o->save_stage_id);
    if (rc < 0) {
        free(o->save_stage);
        o->save_stage = NULL;
    }
    return rc;
}

static void save_stage_free(tr__optim_t *o)
{
    if (!o->save_stage) return;
    tr_buffer_unregister(o->eng->rt, o->save_stage_id);
    free(o->save_stage);
    o->save_stage = NULL;
}

/* SAVE with the moments in the swap file: they are read back into a staging block, which
 * the ENGINE_STATE names, before it goes on to the checkpointer. */
/* The optimizer cannot take part in a save: the state goes on to the checkpointer with the
 * reason, which ends the save there like any of its own failures (on every rank at once). */
static int save_refused(tr_ctx_t *ctx, tr__optim_t *o, tr_msg_engine_state_t *s, int rc,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int save_refused(tr_ctx_t *ctx, tr__optim_t *o, tr_msg_engine_state_t *s, int rc,
                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->error, sizeof(s->error), fmt, ap);
    va_end(ap);
    s->rc = rc;
    s->moments = (tr_tensor_ref_t){0};
    return forward_state(ctx, s, o->eng->checkpointer, o->global_steps);
}

static int save_swapped(tr_ctx_t *ctx, tr__optim_t *o, tr_msg_engine_state_t *s, size_t bytes)
{
    int rc = getenv("TROUPE_FAULT_SAVE_NOMEM") ? TR_ENOMEM : save_stage(o); /* tests */
    if (rc == 0)
        rc = tr_buffer_ref(o->eng->rt, o->save_stage_id, 0, bytes, TR_DTYPE_F32, &s->moments);
    tr_msg_t *m = rc == 0 ? state_copy(ctx, s, o->global_steps) : NULL;
    if (!m)
        return save_refused(ctx, o, s, rc < 0 ? rc : TR_ENOMEM,
                            "no memory for a copy of the "
                            "offloaded optimizer state (%zu bytes)",
                            bytes);
    return swap_begin(ctx, o, RUN_SAVE, m, o->save_stage);
}

/* SAVE: adds the optimizer's counters and scalar state; on to the checkpointer. */
static int save_state(tr_ctx_t *ctx, tr__optim_t *o, tr_msg_engine_state_t *s)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    tr__optimizer_state_pack(o, &pk);
    if (sb.size > sizeof(s->optim.data)) {
        msgpack_sbuffer_destroy(&sb);
        return save_refused(ctx, o, s, TR_EOVERFLOW,
                            "the optimizer's state is larger than "
                            "%zu bytes",
                            sizeof(s->optim.data));
    }
    s->optim.len = (uint32_t)sb.size;
    memcpy(s->optim.data, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    s->global_step = o->global_steps;
    s->skipped_steps = o->skipped_steps;
    size_t bytes = (size_t)o->n_arrays * (o->hi - o->lo) * sizeof(float); /* this rank's slice */
    if (o->swaps) return save_swapped(ctx, o, s, bytes);
    if (o->n_arrays) tr_buffer_ref(o->eng->rt, o->moments_id, 0, bytes, TR_DTYPE_F32, &s->moments);
    return forward_state(ctx, s, o->eng->checkpointer, o->global_steps);
}

/* RESTORE: checks and takes the optimizer's part; on to the executor. A refusal goes back to
 * the checkpointer with nothing changed. */
static int restore_state(tr_ctx_t *ctx, tr__optim_t *o, tr_msg_engine_state_t *s)
{
    const tr__plan_t *e = o->eng;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    char why[256] = "";
    int rc = msgpack_unpack_next(&u, (const char *)s->optim.data, s->optim.len, NULL) ==
                     MSGPACK_UNPACK_SUCCESS
                 ? tr__optimizer_state_unpack(o, &u.data, why, sizeof(why))
                 : tr__errf(why, sizeof(why), TR_EFORMAT, "optimizer state: not msgpack");
    msgpack_unpacked_destroy(&u);
    const float *moments = NULL;
    size_t bytes = (size_t)o->n_arrays * (o->hi - o->lo) * sizeof(float); /* this rank's slice */
    if (rc == 0 && o->n_arrays && !(moments = tr__resolve(e, &s->moments, why, sizeof(why))))
        rc = TR_EINVAL;
    if (moments && s->moments.length != bytes)
        rc = tr__errf(why, sizeof(why), TR_EINVAL,
                      "optimizer: the restored moments hold %llu bytes, this rank's slice %zu",
                      (unsigned long long)s->moments.length, bytes);
    if (rc < 0) {
        s->kind = TR__STATE_RESTORED;
        s->rc = rc;
        snprintf(s->error, sizeof(s->error), "%s", why);
        return forward_state(ctx, s, e->checkpointer, o->global_steps);
    }
    o->global_steps = s->global_step;
    o->skipped_steps = s->skipped_steps;
    if (moments && o->swaps) { /* into the swap file, then on to the executor */
        tr_msg_t *m = state_copy(ctx, s, o->global_steps);
        if (!m) return TR_ENOMEM;
        /* read only: RUN_RESTORE copies out of it */
        return swap_begin(ctx, o, RUN_RESTORE, m, (float *)moments);
    }
    if (moments) memcpy(o->m, moments, bytes);
    return forward_state(ctx, s, e->executor, o->global_steps);
}

int tr__optimizer_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    tr__optim_t *o = ctx->state;
    if (msg->type == TR_MSG_REDUCED) return on_reduced(ctx, o, msg);
    if (msg->type == TR_MSG_COMM_GATHER) return on_gathered(ctx, o, TR_MSG_AS(msg, comm_gather));
    if (msg->type == TR_MSG_COMM_SCALAR) return on_norm(ctx, o, TR_MSG_AS(msg, comm_scalar));
    if (msg->type == TR_MSG_COMM_REDUCE) return on_lamb_sums(ctx, o, TR_MSG_AS(msg, comm_reduce));
    if (msg->type == TR_MSG_SWAP) return on_swap(ctx, o, TR_MSG_AS(msg, swap));
    if (msg->type != TR_MSG_ENGINE_STATE) return 0;
    tr_msg_engine_state_t *s = TR_MSG_AS(msg, engine_state);
    return s->kind == TR__STATE_SAVE ? save_state(ctx, o, s) : restore_state(ctx, o, s);
}
