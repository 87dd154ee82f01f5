/* engine.c: the embedding API (troupe/engine.h). It builds the runtime and the engine's
 * actors, and turns each call into a request message plus a wait.
 *
 * The caller's thread is a client outside the runtime: it fills the request's inputs in the
 * engine, sends an ENGINE_REQ and sleeps on `cv` until an actor calls tr__engine_reply. A
 * supervisor actor is linked to every engine actor: if one fails, the waiting call gets the
 * failure (never a hang) and the engine refuses further work with the same explanation.
 *
 * Tracing: the monitor comes from the config's troupe.trace (or opts.trace_dir) and is
 * attached to the runtime, which records every actor's messages; the engine adds the step
 * markers (where a step opens: see step_begins), the bucket-memory counter and, when an actor
 * failed, the flight recorder's dump at destroy, once the actors have stopped and no thread
 * still records.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "actors/engine/engine_internal.h"
#include "base/file.h"
#include "runtime/comm/ranks.h"

void *tr__resolve(const tr_engine_t *eng, const tr_tensor_ref_t *ref, char *why, size_t whylen)
{
    void *p;
    return tr_buffer_resolve(eng->rt, ref, &p, why, whylen) == 0 ? p : NULL;
}

/* --- the client's reply slot ----------------------------------------------------------------- */

/* The explanation of rc, from fmt: never empty, and never ending in a bare ": ". Under mu. */
static void set_error(tr__client_t *c, int rc, const char *fmt, va_list ap)
{
    c->error[0] = '\0';
    if (fmt) vsnprintf(c->error, sizeof(c->error), fmt, ap);
    size_t n = strlen(c->error);
    if (n == 0 || c->error[n - 1] == ' ' || c->error[n - 1] == ':')
        snprintf(c->error + n, sizeof(c->error) - n, "%s%s (%s)", n ? " " : "engine: ",
                 tr_err_name(rc), tr_strerror(rc));
}

static void reply_v(const tr_engine_t *eng, int rc, bool fail_engine, const tr__reply_t *r,
                    const char *fmt, va_list ap)
{
    tr__client_t *c = eng->client;
    pthread_mutex_lock(&c->mu);
    if (c->failed) {
        /* the first failure stands: what follows it (a peer that can no longer send to a
         * failed actor, a request it cut short) changes neither the code nor the text */
        c->rc = c->failed;
    } else {
        c->rc = rc;
        if (r) c->reply = *r;
        /* an actor failed between calls (the loader, ahead), or for good: keep why */
        if (rc < 0 && (fail_engine || !c->waiting)) c->failed = rc;
        if (rc < 0) set_error(c, rc, fmt, ap);
    }
    c->waiting = false;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void tr__reply(const tr_engine_t *eng, int rc, const tr__reply_t *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_v(eng, rc, false, r, fmt, ap);
    va_end(ap);
}

void tr__engine_fail(const tr_engine_t *eng, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_v(eng, rc, true, NULL, fmt, ap);
    va_end(ap);
}

tr_msg_t *tr__request_new(tr_runtime_t *rt, tr__req_kind_t kind)
{
    tr_msg_t *m = tr_msg_new(rt, TR_MSG_ENGINE_REQ);
    if (m) TR_MSG_AS(m, engine_req)->kind = kind;
    return m;
}

/* Copies s into a message's string field of capacity cap; a string that does not fit is an
 * error naming what it is, never a truncation. */
static int set_str(tr_engine_t *eng, char *field, size_t cap, const char *s, const char *what)
{
    size_t n = s ? strlen(s) : 0;
    if (n >= cap)
        return snprintf(eng->error, sizeof(eng->error),
                        "%s: %zu bytes, longer than the %zu the engine accepts", what, n, cap - 1),
               TR_ENAMETOOLONG;
    memcpy(field, s ? s : "", n + 1);
    return 0;
}

/* Sends a request and waits for its reply. On success the reply's view becomes the client's;
 * on failure eng->error gets the explanation. */
static int call(tr_engine_t *eng, tr_actor_t to, tr_msg_t *m)
{
    tr__client_t *c = eng->client;
    pthread_mutex_lock(&c->mu);
    int failed = c->failed; /* under mu: actors write it */
    if (!failed) {
        c->waiting = true;
        c->error[0] = '\0';
    }
    pthread_mutex_unlock(&c->mu);
    if (failed) {
        tr_msg_free(eng->rt, m);
        pthread_mutex_lock(&c->mu);
        snprintf(eng->error, sizeof(eng->error), "%s", c->error);
        pthread_mutex_unlock(&c->mu);
        return failed;
    }
    m->step = eng->last.global_step;
    int rc = tr_actor_send(eng->rt, to, m);
    if (rc < 0) {
        tr_msg_free(eng->rt, m);
        pthread_mutex_lock(&c->mu);
        c->waiting = false;
        pthread_mutex_unlock(&c->mu);
        return snprintf(eng->error, sizeof(eng->error), "engine: cannot send the request: %s",
                        tr_strerror(rc)),
               rc;
    }
    pthread_mutex_lock(&c->mu);
    while (c->waiting)
        pthread_cond_wait(&c->cv, &c->mu);
    rc = c->rc;
    if (rc >= 0) eng->last = c->reply;
    snprintf(eng->error, sizeof(eng->error), "%s", rc < 0 ? c->error : "");
    if (!c->failed) c->error[0] = '\0'; /* a later failure between calls brings its own */
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* A request with nothing but its kind and count. */
static int call_simple(tr_engine_t *eng, tr_actor_t to, tr__req_kind_t kind, uint32_t n)
{
    tr_msg_t *m = tr__request_new(eng->rt, kind);
    if (!m) return snprintf(eng->error, sizeof(eng->error), "engine: out of memory"), TR_ENOMEM;
    TR_MSG_AS(m, engine_req)->n = n;
    return call(eng, to, m);
}

/* A child's exit notice: a failure fails the engine (unless a peer merely stopped first
 * while destroy stops them all). Under mu. */
static void child_exited(tr__client_t *c, const tr_msg_exit_t *x)
{
    c->exits++;
    if (x->reason >= 0 ||
        (c->destroying && (x->reason == TR_ESTOPPED || x->reason == TR_ESHUTDOWN)))
        return;
    if (!c->failed) {
        c->failed = x->reason;
        if (!c->error[0])
            snprintf(c->error, sizeof(c->error), "actor '%s' failed handling '%s': %s (%s)",
                     x->name, tr_msg_type_name(x->msg_type), tr_err_name(x->reason),
                     tr_strerror(x->reason));
    }
    c->rc = c->failed;
    c->waiting = false;
    pthread_cond_broadcast(&c->cv);
}

/* The engine's supervisor: a failed actor fails the engine, and the waiting call learns why.
 * At destroy it stops itself once every child's exit notice has arrived, so none is lost. */
static int supervise(tr_ctx_t *ctx, tr_msg_t *msg)
{
    tr_engine_t *eng = ctx->state;
    tr__client_t *c = eng->client;
    pthread_mutex_lock(&c->mu);
    if (msg->type == TR_MSG_STOP && !c->destroying)
        atomic_store(&c->stop_requested, 1); /* a signal: finish the step, then stop */
    if (msg->type == TR_MSG_EXIT) child_exited(c, TR_MSG_AS(msg, exit));
    bool done = c->destroying && c->exits >= c->n_children;
    pthread_mutex_unlock(&c->mu);
    if (done) tr_actor_stop(ctx->rt, ctx->self);
    return 0;
}

void tr__engine_bucket_bytes(const tr_engine_t *eng, int64_t delta)
{
    /* relaxed: a gauge for the trace, ordered with nothing */
    uint64_t v =
        atomic_fetch_add_explicit(&eng->client->bucket_bytes, (uint64_t)delta,
                                  memory_order_relaxed) +
        (uint64_t)delta;
    if (tr_monitor_recording(eng->mon))
        tr_monitor_counter(eng->mon, -1, TR_COUNTER_BUCKET_BYTES, (double)v, tr_now_ns());
}

/* --- creating ---------------------------------------------------------------------------- */

/* The recorder, from troupe.trace, with opts.trace_dir turning tracing on into that folder.
 * None when tracing and the flight recorder are both off. */
static int create_monitor(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    const tr_config_t *c = eng->cfg;
    const char *dir = o->trace_dir ? o->trace_dir : c->troupe.trace.output_path;
    tr_trace_opts_t t = {.enabled = o->trace_dir || c->troupe.trace.enabled,
                         .output_path = dir,
                         .flight_recorder = c->troupe.trace.flight_recorder,
                         .rank = (unsigned)eng->rank,
                         .steps = {(uint32_t)c->troupe.trace.wait, (uint32_t)c->troupe.trace.warmup,
                                   (uint32_t)c->troupe.trace.active,
                                   (uint32_t)c->troupe.trace.repeat}};
    if (!t.enabled && !t.flight_recorder) return 0;
    if (t.enabled && (!dir || !*dir))
        return snprintf(err, errlen,
                        "%s: troupe.trace.output_path: a folder is needed when "
                        "troupe.trace.enabled is true",
                        c->source),
               TR_ECONFIG;
    snprintf(eng->flight_path, sizeof(eng->flight_path), "%s%sflight_rank%d.json",
             dir && *dir ? dir : "", dir && *dir ? "/" : "", eng->rank);
    int rc = tr_monitor_create(&t, &eng->mon);
    if (rc == 0) {
        tr_monitor_lane_set(eng->mon, TR__LANE_PASSES, "executor passes", TR_LANE_COMPUTE);
        tr_monitor_lane_set(eng->mon, TR__LANE_CKPT_WAIT, "checkpoint wait", TR_LANE_CONTROL);
        for (uint32_t k = 0; k < TR__COLLECTIVE_LANES; k++) {
            char name[40];
            snprintf(name, sizeof(name), "collectives in flight %u", k + 1);
            tr_monitor_lane_set(eng->mon, TR__LANE_COLLECTIVES - k, name, TR_LANE_COMM);
        }
    }
    if (rc == TR_EBUSY)
        snprintf(err, errlen, "%s: troupe.trace: another engine in this process is tracing into "
                 "'%s' (rank %d); give this engine its own troupe.trace.output_path or trace_dir",
                 c->source, dir ? dir : "", eng->rank);
    else if (rc < 0)
        snprintf(err, errlen, "%s: troupe.trace: cannot write traces into '%s': %s", c->source,
                 dir ? dir : "", tr_strerror(rc));
    return rc;
}

/* This process's rank and the world size: the caller's, or the launcher's environment. */
static int find_ranks(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    tr_ranks_t given = {.rank = o->rank, .world = o->world}, r;
    char why[384];
    int rc = tr_ranks_discover(o->world > 0 ? &given : NULL, &r, why, sizeof(why));
    if (rc < 0) return snprintf(err, errlen, "engine: %s", why), rc;
    eng->rank = r.rank;
    eng->world = r.world;
    if (r.world > 1)
        tr_log(TR_LOG_INFO, "engine: rank %d of %d (local rank %d, from %s)", r.rank, r.world,
               r.local_rank, r.source);
    return 0;
}

static int load_config(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    if (o->config) {
        eng->cfg = (tr_config_t *)o->config;
        if (eng->cfg->ranks != eng->world)
            return snprintf(err, errlen,
                            "%s: the config was resolved for world size %lld, but this process "
                            "is rank %d of %d (load it with that world size)",
                            eng->cfg->source, (long long)eng->cfg->ranks, eng->rank, eng->world),
                   TR_EINVAL;
        return 0;
    }
    if (!o->config_path)
        return snprintf(err, errlen, "engine: no config (config_path or config)"), TR_EINVAL;
    tr_config_diag_t d;
    tr_config_diag_init(&d);
    int rc = tr_config_load(o->config_path, eng->world, &eng->cfg, &d);
    size_t used = 0;
    for (size_t i = 0; i < d.count; i++) {
        if (d.items[i].severity == TR_CONFIG_WARNING)
            tr_log(TR_LOG_WARN, "%s", d.items[i].text);
        else if (d.items[i].severity == TR_CONFIG_ERROR && used < errlen)
            used += (size_t)snprintf(err + used, errlen - used, "%s%s", used ? "\n" : "",
                                     d.items[i].text);
    }
    tr_config_diag_close(&d);
    eng->own_cfg = rc == 0;
    return rc;
}

/* What the model's first layer reads and its loss layer wants, in words, for errors. */
static void describe_width(int width, const char *floats, const char *ints, char *out,
                           size_t len)
{
    if (width)
        snprintf(out, len, "%s of width %d", floats, width);
    else
        snprintf(out, len, "%s", ints);
}

/* The model's input and target widths against each dataset's: named, both sides. */
static int check_widths(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    const tr_dataset_t *sets[2] = {&o->train, &o->val};
    const char *names[2] = {"train", "val"};
    const tr_layer_t *first = tr_model_layer(eng->model, 0);
    const tr_layer_t *loss = tr_model_layer(eng->model, tr_model_num_layers(eng->model) - 1);
    char in[96], tg[96];
    describe_width(eng->x_dim, "floats", "token ids (x_dim must be 0)", in, sizeof(in));
    describe_width(eng->y_dim, "float targets", "integer targets (y_dim must be 0)", tg,
                   sizeof(tg));
    for (int i = 0; i < 2; i++) {
        const tr_dataset_t *d = sets[i];
        if (!d->shards && !d->batch) continue;
        if (d->x_dim != eng->x_dim)
            return snprintf(err, errlen,
                            "engine: %s dataset: x_dim %d, but the model's first layer '%s' "
                            "reads %s",
                            names[i], d->x_dim, first->name, in),
                   TR_EINVAL;
        if (d->y_dim != eng->y_dim)
            return snprintf(err, errlen,
                            "engine: %s dataset: y_dim %d, but the model's loss layer '%s' reads "
                            "%s",
                            names[i], d->y_dim, loss->name, tg),
                   TR_EINVAL;
    }
    return 0;
}

/* The ZeRO stage in effect and overlap_comm; the combinations DeepSpeed refuses, refused in
 * its words (at any world size: a config that runs on one rank runs on N). */
/* pipeline.stages > 1: the executor runs each step's micro-batches through stage actors, in
 * this process on one rank, else one stage per rank: world = stages x replicas, stage-major;
 * a step's micro-batches enter the pipeline together, so the loader keeps at least
 * gradient_accumulation_steps of them. */
static int check_pipeline(tr_engine_t *eng, char *err, size_t errlen)
{
    const tr_config_t *c = eng->cfg;
    int n = tr_model_num_layers(eng->model);
    eng->stages = c->pipeline.stages > 1 ? (int)c->pipeline.stages : 1;
    eng->replicas = eng->world, eng->replica = eng->rank;
    if (eng->stages == 1) return 0;
    if (eng->world > 1) /* a multiple of the stages: the config's resolution checked it */
        eng->replicas = eng->world / eng->stages, eng->replica = eng->rank % eng->replicas;
    if (eng->stages > n)
        return snprintf(err, errlen,
                        "%s: pipeline.stages %d: the model has %d layers, and each "
                        "stage needs one",
                        c->source, eng->stages, n),
               TR_ECONFIG;
    if (eng->GAS > TR__MAX_PREFETCH)
        return snprintf(err, errlen,
                        "%s: gradient_accumulation_steps %d: a pipelined step takes "
                        "at most %d micro-batches",
                        c->source, eng->GAS, TR__MAX_PREFETCH),
               TR_ECONFIG;
    if (eng->prefetch < eng->GAS) {
        tr_log(TR_LOG_INFO,
               "pipeline: troupe.data.prefetch raised from %d to %d "
               "(gradient_accumulation_steps: a step's micro-batches enter the pipeline "
               "together)",
               eng->prefetch, eng->GAS);
        eng->prefetch = eng->GAS;
    }
    return 0;
}

/* pipeline.activation_checkpoint_interval: the model keeps each group's output and recomputes
 * the group's forward in the backward. */
static int set_checkpointing(tr_engine_t *eng, char *err, size_t errlen)
{
    const tr_config_t *c = eng->cfg;
    int64_t k = c->pipeline.activation_checkpoint_interval;
    if (k <= 0) return 0;
    (void)err, (void)errlen;
    if (eng->stages > 1) { /* each stage counts its groups from its first layer */
        tr_model_set_checkpoint_interval(eng->model, (int)(k < 1 << 30 ? k : 1 << 30));
        if (eng->rank == 0)
            tr_log(TR_LOG_INFO,
                   "activation checkpointing every %lld layers of each pipeline "
                   "stage: a slot keeps each group's output, the backward recomputes the group",
                   (long long)k);
        return 0;
    }
    int n = tr_model_num_layers(eng->model);
    size_t full = tr_model_acts_floats(eng->model, eng->B, eng->T);
    tr_model_set_checkpoint_interval(eng->model, k < n ? (int)k : n);
    size_t kept = tr_model_acts_floats(eng->model, eng->B, eng->T);
    if (eng->rank == 0)
        tr_log(TR_LOG_INFO,
               "activation checkpointing every %lld layers: activations %.1f MiB "
               "instead of %.1f MiB (B %d, T %d); the backward runs the forward of %zu of %d "
               "layers again",
               (long long)k, (double)kept * 4 / 1048576.0, (double)full * 4 / 1048576.0, eng->B,
               eng->T, tr_model_checkpoint_recomputed(eng->model), n);
    return 0;
}

static int check_zero(tr_engine_t *eng, char *err, size_t errlen)
{
    const tr_config_t *c = eng->cfg;
    eng->zero = eng->world > 1 ? (int)(c->zero.stage < 2 ? c->zero.stage : 2) : 0;
    eng->overlap_comm = c->zero.overlap_comm;
    if (c->zero.stage >= 2 && c->zero.reduce_scatter && c->gradient_predivide_factor != 1.0)
        return snprintf(err, errlen, "%s: gradient_predivide_factor %g: != 1.0 is not yet "
                        "supported with ZeRO-%lld with reduce scatter enabled (DeepSpeed's rule; "
                        "set zero_optimization.reduce_scatter false, or the factor to 1)",
                        c->source, c->gradient_predivide_factor, (long long)c->zero.stage),
               TR_ECONFIG;
    if (c->zero.stage >= 2 && c->zero.reduce_scatter && c->prescale_gradients)
        return snprintf(err, errlen, "%s: prescale_gradients: pre-scale gradients is not yet "
                        "supported with ZeRO-%lld with reduce scatter enabled (DeepSpeed's rule; "
                        "set zero_optimization.reduce_scatter false, or prescale_gradients "
                        "false)", c->source, (long long)c->zero.stage),
               TR_ECONFIG;
    if (eng->world > 1 && c->zero.stage > 2)
        tr_log(TR_LOG_WARN, "%s: zero_optimization.stage 3: this build partitions optimizer "
               "states and gradients (stage 2); parameters stay whole on every rank for now",
               c->source);
    return 0;
}

/* bf16 mixed precision: the model's products on bf16 copies of its weights (made again after
 * every step, executor.c); said once per process where the CPU only emulates them. */
static int set_precision(tr_engine_t *eng, char *err, size_t errlen)
{
    static atomic_flag warned = ATOMIC_FLAG_INIT;
    int on = eng->cfg->bf16.enabled;
    if (tr_model_set_bf16(eng->model, on) < 0)
        return snprintf(err, errlen, "%s: bf16.enabled: no memory for the weights' bf16 copies",
                        eng->cfg->source),
               TR_ENOMEM;
    if (on && !tr_bf16_native() && !atomic_flag_test_and_set(&warned))
        tr_log(TR_LOG_WARN,
               "bf16.enabled: this CPU has no AVX512-BF16, so the bf16 matrix "
               "products are emulated (bf16 values multiplied in fp32): bf16's numerics, a little "
               "slower than fp32");
    return 0;
}

static int check_shapes(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    const tr_config_t *c = eng->cfg;
    eng->B = (int)c->train_micro_batch_size_per_gpu;
    eng->GAS = (int)c->gradient_accumulation_steps;
    eng->T = o->seq_len > 0 ? o->seq_len : 1;
    eng->x_dim = tr_model_layer(eng->model, 0)->in_dim;
    int targets = tr_model_targets(eng->model, &eng->y_dim);
    eng->prefetch = (int)c->troupe.data.prefetch;
    if (targets == TR_TARGETS_NONE)
        return snprintf(err, errlen, "engine: the model's last layer '%s' is not a loss layer "
                        "(tr_layer_set_loss)",
                        tr_model_layer(eng->model, tr_model_num_layers(eng->model) - 1)->name),
               TR_EINVAL;
    int rc = check_zero(eng, err, errlen);
    if (rc == 0) rc = check_pipeline(eng, err, errlen);
    if (rc == 0) rc = set_checkpointing(eng, err, errlen);
    if (rc < 0) return rc;
    if (eng->prefetch < 1 || eng->prefetch > TR__MAX_PREFETCH)
        return snprintf(err, errlen, "%s: troupe.data.prefetch: must be 1 to %d, got %d", c->source,
                        TR__MAX_PREFETCH, eng->prefetch),
               TR_ECONFIG;
    if ((rc = set_precision(eng, err, errlen)) < 0) return rc;
    const tr_gpt2_config_t *g = tr_model_gpt2_config(eng->model);
    if (g && eng->T > g->max_seq_len)
        return snprintf(err, errlen, "seq_len %d: the model's context is %d positions", eng->T,
                        g->max_seq_len),
               TR_EINVAL;
    if (c->fp16.enabled)
        eng->loss_scale0 = c->fp16.loss_scale > 0 ? c->fp16.loss_scale
                                                  : (double)(1ull << c->fp16.initial_scale_power);
    else
        eng->loss_scale0 = 1.0;
    return check_widths(eng, o, err, errlen);
}

static int open_data(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    const tr_config_t *c = eng->cfg;
    int rc = 0;
    if (o->train.shards || o->train.batch)
        rc = tr__dataset_open(&eng->train, &o->train, eng, c->troupe.data.shuffle, eng->seed, err,
                              errlen);
    const tr_dataset_t *v = o->val.shards || o->val.batch ? &o->val : &o->train;
    if (rc == 0 && (v->shards || v->batch)) /* eval reads in order, from the start */
        rc = tr__dataset_open(&eng->val, v, eng, false, eng->seed, err, errlen);
    return rc;
}

/* Registers one buffer the actors name in messages. */
static int register_buffer(tr_engine_t *eng, const char *name, void *base, size_t bytes,
                           int dtype, int lifetime, uint64_t *id)
{
    tr_buffer_info_t info = {.base = base,
                             .bytes = bytes,
                             .dtype = (uint8_t)dtype,
                             .device_type = TR_DEVICE_CPU,
                             .lifetime = (uint8_t)lifetime};
    snprintf(info.name, sizeof(info.name), "%s", name);
    return tr_buffer_register(eng->rt, &info, id);
}

/* Parameters and gradients (the executor's), and the client's staging batch. */
static int register_buffers(tr_engine_t *eng)
{
    size_t bt = (size_t)eng->B * (size_t)eng->T, np = eng->n_params * sizeof(float);
    size_t in = bt * (size_t)(eng->x_dim ? eng->x_dim : 1) * 4, ty = bt * (size_t)eng->y_dim * 4;
    size_t batch = in + (eng->y_dim ? ty : bt * sizeof(int)); /* one batch's arrays */
    eng->memory.params = eng->memory.grads = np;
    eng->memory.bf16_copies = tr_model_bf16(eng->model) ? eng->n_params * sizeof(uint16_t) : 0;
    eng->memory.batches = batch * (size_t)(1 + (eng->train ? eng->prefetch : 0));
    eng->stage_in = malloc(in);
    eng->stage_targets = malloc(bt * sizeof(int));
    eng->stage_y = malloc(ty ? ty : 4);
    if (!eng->stage_in || !eng->stage_targets || !eng->stage_y) return TR_ENOMEM;
    int rc = register_buffer(eng, "params", tr_model_params(eng->model), np, TR_DTYPE_F32,
                             TR_BUFFER_RUNTIME, &eng->buf_params);
    if (!rc)
        rc = register_buffer(eng, "grads", tr_model_grads(eng->model), np, TR_DTYPE_F32,
                             TR_BUFFER_RUNTIME, &eng->buf_grads);
    if (!rc)
        rc = register_buffer(eng, "client/inputs", eng->stage_in, in,
                             eng->x_dim ? TR_DTYPE_F32 : TR_DTYPE_I32, TR_BUFFER_REQUEST,
                             &eng->buf_stage_in);
    if (!rc)
        rc = register_buffer(eng, "client/targets", eng->stage_targets, bt * sizeof(int),
                             TR_DTYPE_I32, TR_BUFFER_REQUEST, &eng->buf_stage_targets);
    if (!rc && ty)
        rc = register_buffer(eng, "client/y", eng->stage_y, ty, TR_DTYPE_F32, TR_BUFFER_REQUEST,
                             &eng->buf_stage_y);
    return rc;
}

static int spawn_actors(tr_engine_t *eng, char *err, size_t errlen)
{
    tr_actor_opts_t so = {
        .name = "engine-supervisor", .defer_stop = 1, .lane_kind = TR_LANE_CONTROL};
    int rc = tr_actor_spawn(eng->rt, supervise, eng, &so, &eng->supervisor);
    if (!rc) rc = tr__optimizer_spawn(eng, err, errlen);
    if (!rc && tr__optimizer_swaps(eng)) rc = tr__swapper_spawn(eng, err, errlen);
    if (!rc) rc = tr__executor_spawn(eng, err, errlen);
    if (!rc) rc = tr__bucketer_spawn(eng);
    if (!rc) rc = tr__comm_spawn(eng, err, errlen);
    if (!rc) rc = tr__checkpointer_spawn(eng);
    if (!rc && eng->train) rc = tr__loader_spawn(eng);
    if (rc < 0 && !err[0]) /* the runtime's own explanation names the actor */
        snprintf(err, errlen, "engine: starting the actors: %s",
                 tr_last_error()[0] ? tr_last_error() : tr_strerror(rc));
    return rc;
}

/* Deterministic mode: the runtime's one worker is tr_runtime_run's caller, so a thread of
 * the engine's calls it for the engine's lifetime; it returns once destroy has stopped every
 * actor. */
static void *drive(void *arg)
{
    tr_engine_t *eng = arg;
    eng->driver_rc = tr_runtime_run(eng->rt);
    return NULL;
}

static int start_driver(tr_engine_t *eng, char *err, size_t errlen)
{
    int rc = -pthread_create(&eng->driver, NULL, drive, eng);
    if (rc < 0)
        return snprintf(err, errlen, "%s: troupe.runtime.deterministic: cannot start the "
                        "scheduler's thread: %s", eng->cfg->source, tr_strerror(rc)),
               rc;
    eng->driving = true;
    return 0;
}

static void log_memory(const tr_engine_t *eng)
{
    const tr_engine_memory_t *m = &eng->memory;
    double mib = 1048576.0;
    char bf16[64] = "";
    if (m->bf16_copies)
        snprintf(bf16, sizeof(bf16), ", bf16 weight copies %.1f MiB", m->bf16_copies / mib);
    tr_log(TR_LOG_INFO,
           "engine: memory on rank %d of %d (ZeRO stage %d): parameters %.1f MiB, "
           "gradients %.1f MiB (the backward's) + %.1f MiB (this rank's reduced partition), "
           "optimizer states %.1f MiB, communication buffers %.1f MiB, batches %.1f MiB%s; "
           "total %.1f MiB",
           eng->rank, eng->world, eng->zero, m->params / mib, m->grads / mib,
           m->grad_partition / mib, m->optimizer / mib, m->comm / mib, m->batches / mib, bf16,
           (double)(m->params + m->grads + m->grad_partition + m->optimizer + m->comm + m->batches +
                    m->bf16_copies) /
               mib);
}

static tr__client_t *client_new(void)
{
    tr__client_t *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    return c;
}

static int create(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    int rc = find_ranks(eng, o, err, errlen);
    if (!rc) rc = load_config(eng, o, err, errlen);
    if (!rc) tr_log_set_default_level(eng->cfg->troupe.log_level);
    if (!rc) {
        eng->seed = o->seed ? o->seed : (uint64_t)eng->cfg->troupe.data.seed;
        rc = check_shapes(eng, o, err, errlen);
    }
    if (!rc && o->init_params) tr_model_init_params(eng->model, eng->seed);
    if (!rc) rc = open_data(eng, o, err, errlen);
    if (!rc) rc = create_monitor(eng, o, err, errlen);
    if (!rc) {
        const tr_config_t *c = eng->cfg;
        tr_runtime_opts_t ro = {.n_workers = (unsigned)c->troupe.runtime.workers,
                                .deterministic = c->troupe.runtime.deterministic,
                                .seed = (uint64_t)c->troupe.runtime.seed,
                                .handle_signals = o->handle_signals,
                                .monitor = eng->mon,
                                .wire_check = c->troupe.runtime.wire_check,
                                .kernel_slice = c->troupe.runtime.kernel_slice,
                                .inline_ns = c->troupe.runtime.inline_ns};
        if (!ro.kernel_slice) ro.slice_us = (unsigned)c->troupe.runtime.slice_us;
        /* no flight_path: the engine dumps the ring itself at destroy (dump_flight) */
        rc = tr_runtime_init(&eng->rt, &ro);
        if (rc < 0)
            snprintf(err, errlen, "engine: cannot start the runtime (%u worker threads, %s): %s",
                     ro.n_workers, ro.n_workers ? "troupe.runtime.workers" : "one per core",
                     tr_last_error()[0] ? tr_last_error() : tr_strerror(rc));
    }
    if (!rc) rc = register_buffers(eng);
    if (!rc) rc = tr__dsmon_create(eng, err, errlen);
    if (!rc) rc = spawn_actors(eng, err, errlen);
    if (!rc && eng->cfg->troupe.runtime.deterministic) rc = start_driver(eng, err, errlen);
    if (!rc) log_memory(eng);
    if (rc < 0 && !err[0]) snprintf(err, errlen, "engine: %s", tr_strerror(rc));
    return rc;
}

int tr_engine_create(tr_engine_t **out, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    char scratch[8];
    if (!err) {
        err = scratch;
        errlen = sizeof(scratch);
    }
    err[0] = '\0';
    *out = NULL;
    if (!o || !o->model) {
        snprintf(err, errlen, "engine: no model");
        return TR_EINVAL;
    }
    tr_engine_t *eng = calloc(1, sizeof(*eng));
    if (eng) eng->client = client_new();
    if (!eng || !eng->client) {
        free(eng);
        tr_model_destroy(o->model);
        return snprintf(err, errlen, "engine: out of memory"), TR_ENOMEM;
    }
    eng->model = o->model;
    eng->n_params = tr_model_num_params(o->model);
    int rc = create(eng, o, err, errlen);
    if (rc < 0) {
        tr_engine_destroy(eng);
        return rc;
    }
    eng->created = true;
    *out = eng;
    return 0;
}

static void stop_one(tr_engine_t *eng, tr_actor_t a)
{
    if (!tr_actor_is_none(a)) tr_actor_stop(eng->rt, a);
}

/* Stops the actors; the supervisor stops itself after their exit notices (see supervise),
 * so a failure reported as the others stop still reaches it. */
static void stop_actors(tr_engine_t *eng)
{
    tr_actor_t all[] = {eng->loader, eng->executor,  eng->bucketer,
                        eng->comm,   eng->optimizer, eng->checkpointer, eng->swapper};
    size_t n = sizeof(all) / sizeof(all[0]);
    tr__client_t *c = eng->client;
    pthread_mutex_lock(&c->mu);
    c->destroying = true;
    c->n_children = 0;
    for (size_t i = 0; i < n; i++)
        c->n_children += !tr_actor_is_none(all[i]);
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < n; i++)
        stop_one(eng, all[i]);
    tr_msg_t *m = tr_actor_is_none(eng->supervisor) ? NULL : tr_msg_new(eng->rt, TR_MSG_STOP);
    if (m && tr_actor_send(eng->rt, eng->supervisor, m) < 0) /* wake it to count */
        tr_msg_free(eng->rt, m);
}

/* A failed engine's last spans per thread, written once every actor has stopped. */
static void dump_flight(tr_engine_t *eng)
{
    if (!eng->mon) return;
    char dir[sizeof(eng->flight_path)];
    snprintf(dir, sizeof(dir), "%s", eng->flight_path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        tr__mkdir_p(dir);
    }
    tr_monitor_flush(eng->mon);
    int rc = tr_monitor_flight_dump(eng->mon, eng->flight_path);
    if (rc == TR_EINVAL) return; /* troupe.trace.flight_recorder is off */
    if (rc < 0)
        tr_log(TR_LOG_ERROR, "flight recorder: cannot write %s: %s", eng->flight_path,
               tr_strerror(rc));
    else
        tr_log(TR_LOG_ERROR, "engine failed (%s); flight recorder written to %s",
               eng->client->error[0] ? eng->client->error : tr_runtime_failure(eng->rt),
               eng->flight_path);
}

void tr_engine_destroy(tr_engine_t *eng)
{
    if (!eng) return;
    if (eng->created && eng->last.window == 0) /* the last save's files and latest (a failure
                                                 * was logged then); not mid-window, where a
                                                 * wait's round could meet a step's collectives */
        tr_engine_wait_checkpoint(eng);
    if (eng->rt) {
        stop_actors(eng);
        int rc = 0;
        if (eng->driving) /* the driver's tr_runtime_run returns once every actor stopped */
            pthread_join(eng->driver, NULL), rc = eng->driver_rc;
        else
            rc = tr_runtime_run(eng->rt);
        if (rc == TR_EFAILED || eng->client->failed) dump_flight(eng);
        tr_runtime_close(eng->rt);
    }
    tr_monitor_destroy(eng->mon); /* after close: cleanups may still send */
    tr__dsmon_destroy(eng);
    tr__loader_free(eng);
    tr__executor_free(eng);
    tr__bucketer_free(eng);
    tr__comm_free(eng);
    tr__optimizer_free(eng);
    tr__swapper_free(eng);
    tr__checkpointer_free(eng);
    tr__dataset_close(eng->train);
    tr__dataset_close(eng->val);
    tr_model_destroy(eng->model);
    if (eng->own_cfg) tr_config_destroy(eng->cfg);
    free(eng->stage_in);
    free(eng->stage_targets);
    free(eng->stage_y);
    pthread_cond_destroy(&eng->client->cv);
    pthread_mutex_destroy(&eng->client->mu);
    free(eng->client);
    free(eng);
}

/* --- calls ------------------------------------------------------------------------------ */

static int refuse(tr_engine_t *eng, int rc, const char *what)
{
    snprintf(eng->error, sizeof(eng->error), "%s", what);
    return rc;
}

int tr_engine_train_batch(tr_engine_t *eng, tr_step_stats_t *stats)
{
    if (!eng->train)
        return refuse(eng, TR_EINVAL,
                      "tr_engine_train_batch: the engine was created without a train dataset");
    /* The step opens when its request is sent: the trace's step window moves (and the step
     * marker is written) first, so the request and everything it causes are classed with it.
     * (DeepSpeed-style, the executor does it at the window's first forward.) */
    tr_monitor_step(eng->mon, eng->last.global_step, tr_now_ns());
    int rc = call_simple(eng, eng->executor, TR__REQ_TRAIN, 0);
    if (rc == 0 && stats) *stats = eng->last.stats;
    return rc;
}

int tr_engine_eval(tr_engine_t *eng, int n_batches, float *loss)
{
    if (!eng->val || n_batches <= 0)
        return refuse(eng, TR_EINVAL, eng->val ? "tr_engine_eval: n_batches must be positive"
                                               : "tr_engine_eval: no dataset to evaluate on");
    int rc = call_simple(eng, eng->executor, TR__REQ_EVAL, (uint32_t)n_batches);
    if (rc == 0 && loss) *loss = eng->last.loss;
    return rc;
}

/* Copies the caller's batch into the registered staging buffers the request names. */
static int stage_batch(tr_engine_t *eng, const tr_engine_batch_t *b, tr_msg_engine_req_t *r)
{
    size_t bt = (size_t)eng->B * (size_t)eng->T;
    const void *in = eng->x_dim ? (const void *)b->x : (const void *)b->tokens;
    const void *tg = eng->y_dim ? (const void *)b->y : (const void *)b->targets;
    if (!in || !tg)
        return snprintf(eng->error, sizeof(eng->error),
                        "tr_engine_forward: the batch needs %s and %s (this model's first layer "
                        "reads %s, its loss layer %s targets)",
                        eng->x_dim ? "x" : "tokens", eng->y_dim ? "y" : "targets",
                        eng->x_dim ? "floats" : "token ids", eng->y_dim ? "float" : "integer"),
               TR_EINVAL;
    size_t in_bytes = bt * (size_t)(eng->x_dim ? eng->x_dim : 1) * 4;
    size_t tg_bytes = bt * (size_t)(eng->y_dim ? eng->y_dim : 1) * 4;
    memcpy(eng->stage_in, in, in_bytes);
    memcpy(eng->y_dim ? eng->stage_y : eng->stage_targets, tg, tg_bytes);
    tr_buffer_ref(eng->rt, eng->buf_stage_in, 0, in_bytes,
                  eng->x_dim ? TR_DTYPE_F32 : TR_DTYPE_I32, &r->inputs);
    if (eng->y_dim)
        tr_buffer_ref(eng->rt, eng->buf_stage_y, 0, tg_bytes, TR_DTYPE_F32, &r->y);
    else
        tr_buffer_ref(eng->rt, eng->buf_stage_targets, 0, tg_bytes, TR_DTYPE_I32, &r->targets);
    return 0;
}

int tr_engine_forward(tr_engine_t *eng, const tr_engine_batch_t *batch, float *loss)
{
    if (!batch) return refuse(eng, TR_EINVAL, "tr_engine_forward: no batch");
    tr_msg_t *m = tr__request_new(eng->rt, TR__REQ_FORWARD);
    if (!m) return refuse(eng, TR_ENOMEM, "tr_engine_forward: out of memory");
    int rc = stage_batch(eng, batch, TR_MSG_AS(m, engine_req));
    if (rc < 0) {
        tr_msg_free(eng->rt, m);
        return rc;
    }
    rc = call(eng, eng->executor, m);
    if (rc == 0 && loss) *loss = eng->last.loss;
    return rc;
}

int tr_engine_backward(tr_engine_t *eng)
{
    return call_simple(eng, eng->executor, TR__REQ_BACKWARD, 0);
}

int tr_engine_step(tr_engine_t *eng, tr_step_stats_t *stats)
{
    int rc = call_simple(eng, eng->executor, TR__REQ_STEP, 0);
    if (rc >= 0 && stats) *stats = eng->last.stats;
    return rc > 0 ? 0 : rc; /* 1: not a boundary, a no-op as in DeepSpeed */
}

int tr_engine_is_boundary(const tr_engine_t *eng)
{
    return eng->last.micro_pos == eng->GAS - 1;
}

/* A SAVE or LOAD request for dir/tag, refused in the middle of an accumulation window. */
static int checkpoint_call(tr_engine_t *eng, tr__req_kind_t kind, const char *dir,
                           const char *tag)
{
    const char *what = kind == TR__REQ_SAVE ? "save" : "load";
    if (!dir || !*dir)
        return snprintf(eng->error, sizeof(eng->error), "%s: no directory", what), TR_EINVAL;
    if (eng->last.window != 0)
        return snprintf(eng->error, sizeof(eng->error),
                        "%s: in the middle of an accumulation window; %s between steps", what,
                        what),
               TR_EINVAL;
    if (tag && (strchr(tag, '/') || !strcmp(tag, ".") || !strcmp(tag, "..")))
        return snprintf(eng->error, sizeof(eng->error), "%s: checkpoint tag '%.200s' is not a "
                        "directory name", what, tag),
               TR_EINVAL;
    tr_msg_t *m = tr__request_new(eng->rt, kind);
    if (!m) return refuse(eng, TR_ENOMEM, "checkpoint: out of memory");
    tr_msg_engine_req_t *r = TR_MSG_AS(m, engine_req);
    int rc = set_str(eng, r->dir, sizeof(r->dir), dir, kind == TR__REQ_SAVE ? "save: directory"
                                                                            : "load: directory");
    if (!rc) rc = set_str(eng, r->tag, sizeof(r->tag), tag, "checkpoint tag");
    if (rc < 0) {
        tr_msg_free(eng->rt, m);
        return rc;
    }
    return call(eng, kind == TR__REQ_SAVE ? eng->executor : eng->checkpointer, m);
}

int tr_engine_wait_checkpoint(tr_engine_t *eng)
{
    return call_simple(eng, eng->executor, TR__REQ_WAIT, 0);
}

/* A save or load begins once the last save has finished; its failure was logged when it
 * happened and is not this call's. */
static void settle_last_save(tr_engine_t *eng)
{
    tr_engine_wait_checkpoint(eng);
    eng->error[0] = '\0';
}

int tr_engine_save_checkpoint(tr_engine_t *eng, const char *dir, const char *tag)
{
    settle_last_save(eng);
    int rc = checkpoint_call(eng, TR__REQ_SAVE, dir, tag);
    if (rc < 0 || eng->cfg->checkpoint.writer_decoupled) return rc;
    return tr_engine_wait_checkpoint(eng); /* checkpoint.writer.decoupled false */
}

int tr_engine_load_checkpoint(tr_engine_t *eng, const char *dir, const char *tag)
{
    settle_last_save(eng);
    return checkpoint_call(eng, TR__REQ_LOAD, dir, tag);
}

const char *tr_engine_error(const tr_engine_t *eng)
{
    return eng->error;
}

tr_model_t *tr_engine_model(const tr_engine_t *eng)
{
    return eng->model;
}

const tr_config_t *tr_engine_config(const tr_engine_t *eng)
{
    return eng->cfg;
}

tr_runtime_t *tr_engine_runtime(const tr_engine_t *eng)
{
    return eng->rt;
}

int tr_engine_stop_requested(const tr_engine_t *eng)
{
    return atomic_load(&eng->client->stop_requested);
}

uint64_t tr_engine_global_step(const tr_engine_t *eng)
{
    return eng->last.global_step;
}

int tr_engine_rank(const tr_engine_t *eng)
{
    return eng->rank;
}

int tr_engine_world(const tr_engine_t *eng)
{
    return eng->world;
}

void tr_engine_memory(const tr_engine_t *eng, tr_engine_memory_t *out)
{
    *out = eng->memory;
}
