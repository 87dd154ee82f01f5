/* optimizer_setup.c: the optimizer actor's set-up from the config (its kernels' options, the
 * learning-rate schedule, the loss scaler, ZeRO's partition, the registered moments and Lamb's
 * norms), its spawn and free, and the scalars a checkpoint keeps of it. Its behaviour is in
 * optimizer.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <msgpack.h>

#include "actors/optim/optimizer_internal.h"
#include "base/errf.h"
#include "runtime/msg/mpack.h"

/* --- set-up from the config ------------------------------------------------------------ */

static void schedule_from_config(tr__optim_t *o, const tr_config_t *c)
{
    const __typeof__(c->scheduler.params) *s = &c->scheduler.params;
    tr_lr_schedule_opts_t *d = &o->sched;
    tr_lr_schedule_opts_default(d, (tr_lr_schedule_type_t)(c->scheduler.type - 1));
    d->base_lr = o->base_lr;
    d->warmup_min_lr = s->warmup_min_lr;
    d->warmup_max_lr = s->warmup_max_lr;
    d->warmup_num_steps = s->warmup_num_steps;
    d->warmup_type = s->warmup_type == TR_CONFIG_WARMUP_LINEAR ? TR_WARMUP_LINEAR : TR_WARMUP_LOG;
    d->total_num_steps = s->total_num_steps;
    d->cos_min_ratio = s->cos_min_ratio;
    d->warmup_min_ratio = s->warmup_min_ratio;
    d->cycle_min_lr = s->cycle_min_lr;
    d->cycle_max_lr = s->cycle_max_lr;
    d->decay_lr_rate = s->decay_lr_rate;
    d->cycle_first_step_size = s->cycle_first_step_size;
    d->cycle_second_step_size = s->cycle_second_step_size ? s->cycle_second_step_size : -1;
    d->cycle_first_stair_count = s->cycle_first_stair_count;
    d->cycle_second_stair_count =
        tr_config_origin(c, "scheduler.params.cycle_second_stair_count") == TR_ORIGIN_GIVEN
            ? s->cycle_second_stair_count
            : -1;
    d->decay_step_size = s->decay_step_size;
    d->cycle_momentum = s->cycle_momentum;
    d->cycle_min_mom = s->cycle_min_mom;
    d->cycle_max_mom = s->cycle_max_mom;
    d->decay_mom_rate = s->decay_mom_rate;
    d->lr_range_test_min_lr = s->lr_range_test_min_lr;
    d->lr_range_test_step_size = s->lr_range_test_step_size;
    d->lr_range_test_step_rate = s->lr_range_test_step_rate;
    d->lr_range_test_staircase = s->lr_range_test_staircase;
    d->last_batch_iteration = s->last_batch_iteration;
    /* DeepSpeed's last_batch_iteration k: k + 1 scheduler steps were taken, so this run's
     * first step uses lr(k) as the uninterrupted run's would, and the next scheduler step
     * computes iteration k + 1 */
    o->sched_steps = s->last_batch_iteration + 1;
}

static void kernels_from_config(tr__optim_t *o, const tr_config_t *c)
{
    const __typeof__(c->optimizer.params) *p = &c->optimizer.params;
    o->adam = (tr_adam_opts_t){
        (float)p->lr,      (float)p->betas[0],     (float)p->betas[1],
        (float)p->eps,     (float)p->weight_decay, o->type == TR_OPTIMIZER_ADAMW || p->adam_w_mode,
        p->bias_correction};
    o->sgd = (tr_sgd_opts_t){(float)p->lr, (float)p->momentum, (float)p->dampening,
                             (float)p->weight_decay, p->nesterov};
    o->lamb = (tr_lamb_opts_t){(float)p->lr,        (float)p->betas[0],     (float)p->betas[1],
                               (float)p->eps,       (float)p->weight_decay, (float)p->max_coeff,
                               (float)p->min_coeff, p->bias_correction,     p->eps_inside_sqrt};
    o->lion = (tr_lion_opts_t){(float)p->lr, (float)p->betas[0], (float)p->betas[1],
                               (float)p->weight_decay};
    o->amsgrad =
        p->amsgrad && (o->runs_as == TR_OPTIMIZER_ADAM || o->runs_as == TR_OPTIMIZER_ADAMW);
}

/* The parameters in model order, cut into runs of equal no_decay. */
static int decay_ranges(tr__optim_t *o)
{
    const tr_model_t *model = o->eng->model;
    int cap = 0;
    for (int i = 0; i < tr_model_num_layers(model); i++)
        cap += tr_model_layer(model, i)->n_params;
    o->ranges = calloc((size_t)(cap ? cap : 1), sizeof(*o->ranges));
    if (!o->ranges) return TR_ENOMEM;
    for (int i = 0; i < tr_model_num_layers(model); i++) {
        const tr_layer_t *l = tr_model_layer(model, i);
        for (int k = 0; k < l->n_params; k++) {
            decay_range_t r = {l->param_offset + l->params[k].offset, l->params[k].numel,
                               !l->params[k].no_decay};
            size_t lo = r.at > o->lo ? r.at : o->lo, hi = r.at + r.n < o->hi ? r.at + r.n : o->hi;
            if (lo >= hi) continue; /* outside this rank's slice */
            r.at = lo;
            r.n = hi - lo;
            decay_range_t *last = o->n_ranges ? &o->ranges[o->n_ranges - 1] : NULL;
            if (last && last->decay == r.decay && last->at + last->n == r.at)
                last->n += r.n;
            else
                o->ranges[o->n_ranges++] = r;
        }
    }
    return 0;
}

static int scaler_from_config(tr__optim_t *o, const tr_config_t *c, char *err, size_t errlen)
{
    tr_loss_scaler_opts_t so;
    tr_loss_scaler_opts_default(&so);
    so.loss_scale = c->fp16.loss_scale;
    so.initial_scale_power = (int)c->fp16.initial_scale_power;
    so.loss_scale_window = (int)c->fp16.loss_scale_window;
    so.hysteresis = (int)c->fp16.hysteresis;
    so.consecutive_hysteresis = c->fp16.consecutive_hysteresis;
    so.min_loss_scale = c->fp16.min_loss_scale;
    int rc = tr_loss_scaler_init(&o->scaler, &so);
    if (rc < 0) snprintf(err, errlen, "%s: fp16: %s", c->source, o->scaler.message);
    return rc;
}

/* ZeRO stage >= 1 on more than one rank: rank r updates (and keeps optimizer state for) its
 * partition of the flat parameters (tr__zero_owned); after each step the partitions are
 * all-gathered so every rank holds all parameters again. Stage 2 also keeps the reduced
 * gradients of its partition only. Otherwise a rank updates all. */
static int partition(tr__optim_t *o)
{
    const tr__plan_t *e = o->eng;
    size_t n = e->n_params;
    o->lo = e->optim_slice.lo; /* the plan's (actors/engine/setup_check.c) */
    o->hi = e->optim_slice.hi;
    o->partitioned = e->optim_slice.partitioned;
    o->slice = n;
    if (e->stage >= 0) { /* a pipeline across ranks: the stage's range, or a part of it */
        tr_log(TR_LOG_INFO,
               "optimizer: pipeline stage %d: rank %d updates parameters [%zu, %zu) of its "
               "stage's [%zu, %zu)%s; optimizer state %.1f MiB on this rank",
               e->stage, e->rank, o->lo, o->hi, e->own_lo, e->own_hi,
               e->zero >= 1 && e->replicas > 1 ? " (ZeRO 1 among the stage's replicas)" : "",
               (double)o->n_arrays * (double)(o->hi - o->lo) * 4 / 1048576.0);
        return 0;
    }
    if (!o->partitioned) return 0;
    o->slice = tr__zero_slice(n, e->world);
    o->gswap = e->swap_grads;
    tr__fifo_init(&o->gputs, sizeof(struct tr__gput));
    if (e->zero >= 2 && !o->gswap &&
        !(o->gpart = calloc(o->hi - o->lo ? o->hi - o->lo : 1, sizeof(float))))
        return TR_ENOMEM;
    tr_log(TR_LOG_INFO,
           "optimizer: ZeRO stage %d: rank %d updates parameters [%zu, %zu) of "
           "%zu; optimizer state %.1f MiB on this rank (%.1f MiB unpartitioned)%s",
           e->zero, e->rank, o->lo, o->hi, n,
           (double)o->n_arrays * (double)(o->hi - o->lo) * 4 / 1048576.0,
           (double)o->n_arrays * (double)n * 4 / 1048576.0,
           e->zero >= 2 ? "; it keeps the reduced gradients of these parameters only" : "");
    return 0;
}

/* offload_optimizer {"device": "cpu", "pin_memory": true}: the state is locked in host memory
 * (mlock), as DeepSpeed pins it; beyond RLIMIT_MEMLOCK it stays unlocked, with one warning. */
static void lock_moments(tr__optim_t *o, size_t bytes)
{
    const tr_config_offload_optimizer_t *oo = &o->eng->cfg->zero.offload_optimizer;
    if (oo->device != TR_OFFLOAD_CPU || !oo->pin_memory || !bytes) return;
    if (mlock(o->m, bytes) == 0) {
        o->locked_bytes = bytes;
        return;
    }
    tr_log(TR_LOG_WARN,
           "optimizer: offload_optimizer.pin_memory: cannot lock the %zu bytes of "
           "optimizer state in memory (%s; raise `ulimit -l`); it stays unlocked",
           bytes, strerror(errno));
}

/* Allocates the moment arrays as one block (m, then v) and registers it: a checkpoint saves
 * and restores it through a reference. */
static int register_moments(tr__optim_t *o)
{
    size_t S = o->hi - o->lo, bytes = (size_t)o->n_arrays * S * sizeof(float);
    if (!o->n_arrays || o->swaps) return 0; /* offloaded: the swapper's file holds them */
    if (!(o->m = calloc(1, bytes ? bytes : 1))) return TR_ENOMEM;
    /* m always; v for Adam and Lamb; vmax for AMSGrad (see tr__optimizer_array_names) */
    bool second = o->runs_as != TR_OPTIMIZER_SGD && o->runs_as != TR_OPTIMIZER_LION;
    o->v = second ? o->m + S : NULL;
    o->vmax = o->amsgrad ? o->m + (size_t)(o->n_arrays - 1) * S : NULL;
    lock_moments(o, bytes);
    return tr__optimizer_register(o, "optimizer/moments", o->m, bytes, TR_DTYPE_F32,
                                  TR_BUFFER_RUNTIME, &o->moments_id);
}

int tr__optimizer_register(tr__optim_t *o, const char *name, void *base, size_t bytes, int dtype,
                           int lifetime, uint64_t *id)
{
    tr_buffer_info_t info = {.base = base,
                             .bytes = bytes,
                             .dtype = (uint8_t)dtype,
                             .device_type = TR_DEVICE_CPU,
                             .owner = o->eng->optimizer,
                             .lifetime = (uint8_t)lifetime};
    snprintf(info.name, sizeof(info.name), "%s", name);
    return tr_buffer_register(o->eng->rt, &info, id);
}

/* Lamb: two doubles per parameter tensor, registered (partitioned, the comm actor all-reduces
 * them in place). */
static int register_lamb_sums(tr__optim_t *o)
{
    const tr__plan_t *e = o->eng;
    size_t tensors = 0;
    for (int i = 0; i < tr_model_num_layers(e->model); i++)
        tensors += (size_t)tr_model_layer(e->model, i)->n_params;
    size_t bytes = 2 * (tensors ? tensors : 1) * sizeof(double);
    if (!(o->lamb_sums = calloc(1, bytes))) return TR_ENOMEM;
    return tr__optimizer_register(o, "optimizer/lamb_norms", o->lamb_sums, bytes, TR_DTYPE_F64,
                                  TR_BUFFER_RUNTIME, &o->lamb_sums_id);
}

int tr__optimizer_spawn(const tr__plan_t *eng, tr__optim_t **state, tr_actor_t *self,
                        uint64_t *state_bytes, uint64_t *grad_bytes, char *err, size_t errlen)
{
    const tr_config_t *c = eng->cfg;
    tr__optim_t *o = calloc(1, sizeof(*o));
    if (!o) return TR_ENOMEM;
    *state = o;
    o->eng = eng;
    o->type = c->optimizer.type;
    o->runs_as = tr_config_optimizer_runs_as(o->type);
    o->base_lr = c->optimizer.params.lr;
    o->clip = c->gradient_clipping;
    kernels_from_config(o, c);
    tr_adam_state_init(&o->st);
    o->has_schedule = c->scheduler.type != TR_SCHEDULER_NONE;
    if (o->has_schedule) {
        schedule_from_config(o, c);
        char why[256];
        if (tr_lr_schedule_check(&o->sched, why, sizeof(why)) < 0) {
            return tr__errf(err, errlen, TR_ECONFIG, "%s: scheduler: %s", c->source, why);
        }
    }
    o->fp16 = c->fp16.enabled;
    if (o->fp16 && scaler_from_config(o, c, err, errlen) < 0) return TR_ECONFIG;
    o->n_arrays = eng->n_arrays;
    o->swaps = eng->swaps;
    if (o->swaps && o->runs_as == TR_OPTIMIZER_LAMB) {
        return tr__errf(err, errlen, TR_ECONFIG,
                        "%s: zero_optimization.offload_optimizer.device \"nvme\" with a Lamb "
                        "optimizer: Lamb needs each whole tensor's norms before it updates any of "
                        "it, which the sub-group pipeline does not do yet; use Adam, AdamW, SGD or "
                        "Lion, or keep the state in memory (device \"cpu\" or \"none\")",
                        c->source);
    }
    int rc0 = partition(o);
    if (rc0 < 0) return rc0;
    /* without an "optimizer" section (evaluation only) there is no state: a step fails */
    if (o->type != TR_OPTIMIZER_NONE && decay_ranges(o) < 0) return TR_ENOMEM;
    tr_actor_opts_t ao = {.name = "optimizer",
                          .pinned = 1,
                          .defer_stop = 1,
                          .supervisor = eng->supervisor,
                          .lane_kind = TR_LANE_COMPUTE};
    int rc = tr_actor_spawn(eng->rt, tr__optimizer_behaviour, o, &ao, self);
    tr_buffer_info_t info;
    if (rc == 0 && (rc = tr_buffer_info(eng->rt, eng->buf_params, &info)) == 0)
        o->params = info.base;
    if (rc == 0 && (rc = tr_buffer_info(eng->rt, eng->buf_grads, &info)) == 0) o->grads = info.base;
    if (rc == 0 && eng->param_offload == TR_OFFLOAD_CPU &&
        (rc = tr_buffer_info(eng->rt, eng->buf_param_home, &info)) == 0)
        o->home = info.base;
    if (rc == 0) rc = register_moments(o);
    if (rc == 0 && o->runs_as == TR_OPTIMIZER_LAMB) rc = register_lamb_sums(o);
    *state_bytes = (uint64_t)o->n_arrays * (o->hi - o->lo) * sizeof(float);
    *grad_bytes = o->gpart ? (uint64_t)(o->hi - o->lo) * sizeof(float) : 0;
    return rc;
}

void tr__optimizer_free(tr__optim_t *o)
{
    if (!o) return;
    if (o->locked_bytes) munlock(o->m, o->locked_bytes);
    free(o->m); /* v and vmax are inside m's block */
    free(o->save_stage);
    free(o->gpart);
    tr__fifo_free(&o->gputs);
    free(o->lamb_sums);
    free(o->ranges);
    free(o);
}

/* --- checkpoint state ------------------------------------------------------------------ */

int tr__optimizer_array_names(const tr_config_t *c, const char **names, int max)
{
    int runs_as = tr_config_optimizer_runs_as(c->optimizer.type), n = 0;
    bool amsgrad = c->optimizer.params.amsgrad &&
                   (runs_as == TR_OPTIMIZER_ADAM || runs_as == TR_OPTIMIZER_ADAMW);
    if (c->optimizer.type == TR_OPTIMIZER_NONE) return 0;
    if (n < max) names[n++] = runs_as == TR_OPTIMIZER_SGD ? "momentum_buffer" : "exp_avg";
    if (n < max && runs_as != TR_OPTIMIZER_SGD && runs_as != TR_OPTIMIZER_LION)
        names[n++] = "exp_avg_sq";
    if (n < max && amsgrad) names[n++] = "max_exp_avg_sq";
    return n;
}

int tr__optimizer_state_pack(const tr__optim_t *o, void *pkv)
{
    msgpack_packer *pk = pkv;
    msgpack_pack_map(pk, 9);
    tr__mp_pack_kv_int(pk, "type", o->type);
    tr__mp_pack_kv_int(pk, "step", o->st.step);
    tr__mp_pack_kv_double(pk, "beta1_pow", o->st.beta1_pow);
    tr__mp_pack_kv_double(pk, "beta2_pow", o->st.beta2_pow);
    tr__mp_pack_str(pk, "beta1");
    msgpack_pack_float(pk, o->adam.beta1); /* single precision, as the config holds it */
    tr__mp_pack_kv_int(pk, "sched_steps", o->sched_steps);
    tr__mp_pack_kv_double(pk, "loss_scale", o->scaler.cur_scale);
    tr__mp_pack_kv_int(pk, "hysteresis", o->scaler.cur_hysteresis);
    tr__mp_pack_str(pk, "scaler_iters");
    msgpack_pack_array(pk, 2);
    msgpack_pack_int64(pk, o->scaler.cur_iter);
    msgpack_pack_int64(pk, o->scaler.last_overflow_iter);
    return 0;
}

static int get_num(const msgpack_object *map, const char *key, double *out, char *err,
                   size_t errlen)
{
    const msgpack_object *v = tr__mp_field(map, key);
    if (v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        *out = (double)v->via.u64;
    else if (v && v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        *out = (double)v->via.i64;
    else if (v && (v->type == MSGPACK_OBJECT_FLOAT64 || v->type == MSGPACK_OBJECT_FLOAT32))
        *out = v->via.f64;
    else {
        return tr__errf(err, errlen, TR_EFORMAT,
                        "optimizer state: field '%s': missing or not a number", key);
    }
    return 0;
}

int tr__optimizer_state_unpack(tr__optim_t *o, const void *objv, char *err, size_t errlen)
{
    const msgpack_object *obj = objv;
    double type, step, b1p, b2p, beta1, sched, scale, hyst;
    if (get_num(obj, "type", &type, err, errlen) || get_num(obj, "step", &step, err, errlen) ||
        get_num(obj, "beta1_pow", &b1p, err, errlen) ||
        get_num(obj, "beta2_pow", &b2p, err, errlen) ||
        get_num(obj, "beta1", &beta1, err, errlen) ||
        get_num(obj, "sched_steps", &sched, err, errlen) ||
        get_num(obj, "loss_scale", &scale, err, errlen) ||
        get_num(obj, "hysteresis", &hyst, err, errlen))
        return TR_EFORMAT;
    const msgpack_object *it = tr__mp_field(obj, "scaler_iters");
    if (!it || it->type != MSGPACK_OBJECT_ARRAY || it->via.array.size != 2) {
        return tr__errf(err, errlen, TR_EFORMAT,
                        "optimizer state: field 'scaler_iters': expected 2 integers");
    }
    if ((int)type != o->type) {
        return tr__errf(err, errlen, TR_EMISMATCH,
                        "optimizer state: saved with optimizer type %d, the config now "
                        "asks for type %d",
                        (int)type, o->type);
    }
    o->st.step = (int64_t)step;
    o->st.beta1_pow = b1p;
    o->st.beta2_pow = b2p;
    o->adam.beta1 = o->lamb.beta1 = (float)beta1;
    o->sched_steps = (int64_t)sched;
    if (o->fp16) {
        o->scaler.cur_scale = scale;
        o->scaler.cur_hysteresis = (int)hyst;
        o->scaler.cur_iter = it->via.array.ptr[0].via.i64;
        o->scaler.last_overflow_iter = it->via.array.ptr[1].via.i64;
    }
    return 0;
}
