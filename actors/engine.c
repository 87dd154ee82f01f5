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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "actors/engine_internal.h"

tr_tensor_ref_t tr__grad_ref(tr_engine_t *eng, size_t offset, size_t count)
{
    tr_tensor_ref_t r = {.buffer_id = TR__BUF_GRADS,
                         .offset = offset * sizeof(float),
                         .length = count * sizeof(float),
                         .dtype = TR_DTYPE_F32,
                         .device_type = TR_DEVICE_CPU,
                         .ndim = 1};
    r.shape[0] = (int64_t)count;
    return r;
}

static void reply_v(tr_engine_t *eng, int rc, bool fail_engine, const char *fmt, va_list ap)
{
    pthread_mutex_lock(&eng->mu);
    eng->reply_rc = rc;
    /* an actor failed between calls (the loader, ahead), or for good: keep why */
    if (rc < 0 && (fail_engine || !eng->waiting) && !eng->failed)
        eng->failed = rc;
    if (rc < 0 && fmt)
        vsnprintf(eng->error, sizeof(eng->error), fmt, ap);
    eng->waiting = false;
    pthread_cond_broadcast(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
}

void tr__engine_reply(tr_engine_t *eng, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_v(eng, rc, false, fmt, ap);
    va_end(ap);
}

void tr__engine_fail(tr_engine_t *eng, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_v(eng, rc, true, fmt, ap);
    va_end(ap);
}

int tr__engine_request(tr_engine_t *eng, tr_actor_t to, tr__req_kind_t kind, uint32_t n,
                       const char *dir, const char *tag)
{
    tr_msg_t *m = tr_msg_new(eng->rt, TR_MSG_ENGINE_REQ);
    if (!m) return TR_ENOMEM;
    tr_msg_engine_req_t *r = TR_MSG_AS(m, engine_req);
    r->kind = kind;
    r->n = n;
    snprintf(r->dir, sizeof(r->dir), "%s", dir ? dir : "");
    snprintf(r->tag, sizeof(r->tag), "%s", tag ? tag : "");
    m->step = eng->global_steps;
    int rc = tr_actor_send(eng->rt, to, m);
    if (rc < 0) tr_msg_free(eng->rt, m);
    return rc;
}

/* Sends a request and waits for its reply. */
static int call(tr_engine_t *eng, tr_actor_t to, tr__req_kind_t kind, uint32_t n, const char *dir,
                const char *tag)
{
    pthread_mutex_lock(&eng->mu);
    int failed = eng->failed; /* under mu: actors write it */
    if (!failed) {
        eng->waiting = true;
        eng->error[0] = '\0';
    }
    pthread_mutex_unlock(&eng->mu);
    if (failed) return failed;
    int rc = tr__engine_request(eng, to, kind, n, dir, tag);
    if (rc < 0) return rc;
    pthread_mutex_lock(&eng->mu);
    while (eng->waiting)
        pthread_cond_wait(&eng->cv, &eng->mu);
    rc = eng->reply_rc;
    pthread_mutex_unlock(&eng->mu);
    return rc;
}

/* A child's exit notice: a failure fails the engine (unless a peer merely stopped first
 * while destroy stops them all). Under mu. */
static void child_exited(tr_engine_t *eng, const tr_msg_exit_t *x)
{
    eng->exits++;
    if (x->reason >= 0 ||
        (eng->destroying && (x->reason == TR_ESTOPPED || x->reason == TR_ESHUTDOWN)))
        return;
    if (!eng->failed) {
        eng->failed = x->reason;
        if (!eng->error[0])
            snprintf(eng->error, sizeof(eng->error), "actor '%s' failed handling '%s': %s (%s)",
                     x->name, tr_msg_type_name(x->msg_type), tr_err_name(x->reason),
                     tr_strerror(x->reason));
    }
    eng->reply_rc = x->reason;
    eng->waiting = false;
    pthread_cond_broadcast(&eng->cv);
}

/* The engine's supervisor: a failed actor fails the engine, and the waiting call learns why.
 * At destroy it stops itself once every child's exit notice has arrived, so none is lost. */
static int supervise(tr_ctx_t *ctx, tr_msg_t *msg)
{
    tr_engine_t *eng = ctx->state;
    pthread_mutex_lock(&eng->mu);
    if (msg->type == TR_MSG_STOP && !eng->destroying)
        atomic_store(&eng->stop_requested, 1); /* a signal: finish the step, then stop */
    if (msg->type == TR_MSG_EXIT) child_exited(eng, TR_MSG_AS(msg, exit));
    bool done = eng->destroying && eng->exits >= eng->n_children;
    pthread_mutex_unlock(&eng->mu);
    if (done) tr_actor_stop(ctx->rt, ctx->self);
    return 0;
}

void tr__engine_bucket_bytes(tr_engine_t *eng, int64_t delta)
{
    /* relaxed: a gauge for the trace, ordered with nothing */
    uint64_t v =
        atomic_fetch_add_explicit(&eng->bucket_bytes, (uint64_t)delta, memory_order_relaxed) +
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
    if (rc == 0)
        tr_monitor_lane_set(eng->mon, TR__LANE_PASSES, "executor passes", TR_LANE_COMPUTE);
    if (rc < 0)
        snprintf(err, errlen, "%s: troupe.trace: cannot write traces into '%s': %s", c->source,
                 dir ? dir : "", tr_strerror(rc));
    return rc;
}

static int load_config(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    if (o->config) {
        eng->cfg = (tr_config_t *)o->config;
        return 0;
    }
    if (!o->config_path)
        return snprintf(err, errlen, "engine: no config (config_path or config)"), TR_EINVAL;
    tr_config_diag_t d;
    tr_config_diag_init(&d);
    int rc = tr_config_load(o->config_path, 1, &eng->cfg, &d);
    size_t used = 0;
    for (size_t i = 0; i < d.count; i++) {
        if (d.items[i].severity == TR_CONFIG_WARNING)
            fprintf(stderr, "troupe: warning: %s\n", d.items[i].text);
        else if (d.items[i].severity == TR_CONFIG_ERROR && used < errlen)
            used += (size_t)snprintf(err + used, errlen - used, "%s%s", used ? "\n" : "",
                                     d.items[i].text);
    }
    tr_config_diag_close(&d);
    eng->own_cfg = rc == 0;
    return rc;
}

static int check_shapes(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    const tr_config_t *c = eng->cfg;
    eng->B = (int)c->train_micro_batch_size_per_gpu;
    eng->GAS = (int)c->gradient_accumulation_steps;
    eng->T = o->seq_len > 0 ? o->seq_len : 1;
    eng->x_dim = o->train.x_dim;
    eng->rank = 0;
    eng->world = (int)c->world_size;
    eng->prefetch = (int)c->troupe.data.prefetch;
    if (eng->world != 1)
        return snprintf(err, errlen,
                        "%s: world size %d: this build trains on one rank "
                        "(the local comm backend)",
                        c->source, eng->world),
               TR_ENOTSUP;
    if (eng->prefetch < 1 || eng->prefetch > TR__MAX_PREFETCH)
        return snprintf(err, errlen, "%s: troupe.data.prefetch: must be 1 to %d, got %d", c->source,
                        TR__MAX_PREFETCH, eng->prefetch),
               TR_ECONFIG;
    if (c->zero.offload_optimizer.device != TR_OFFLOAD_NONE ||
        c->zero.offload_param.device != TR_OFFLOAD_NONE)
        fprintf(stderr,
                "troupe: warning: %s: zero_optimization.offload_*: the swapper actor is not "
                "built yet; optimizer state and parameters stay in memory\n",
                c->source);
    if (c->bf16.enabled)
        fprintf(stderr,
                "troupe: warning: %s: bf16.enabled: the CPU kernels compute in fp32; bf16 "
                "changes nothing yet\n",
                c->source);
    const tr_gpt2_config_t *g = tr_model_gpt2_config(eng->model);
    if (g && eng->T > g->max_seq_len)
        return snprintf(err, errlen, "seq_len %d: the model's context is %d positions", eng->T,
                        g->max_seq_len),
               TR_EINVAL;
    return 0;
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

static int spawn_actors(tr_engine_t *eng, char *err, size_t errlen)
{
    tr_actor_opts_t so = {
        .name = "engine-supervisor", .defer_stop = 1, .lane_kind = TR_LANE_CONTROL};
    int rc = tr_actor_spawn(eng->rt, supervise, eng, &so, &eng->supervisor);
    if (!rc) rc = tr__optimizer_spawn(eng, err, errlen);
    if (!rc) rc = tr__executor_spawn(eng);
    if (!rc) rc = tr__bucketer_spawn(eng);
    if (!rc) rc = tr__comm_spawn(eng);
    if (!rc) rc = tr__checkpointer_spawn(eng);
    if (!rc && eng->train) rc = tr__loader_spawn(eng);
    if (rc < 0 && !err[0])
        snprintf(err, errlen, "engine: starting the actors: %s", tr_strerror(rc));
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
    if (!eng) {
        tr_model_destroy(o->model);
        return TR_ENOMEM;
    }
    eng->model = o->model;
    eng->n_params = tr_model_num_params(o->model);
    pthread_mutex_init(&eng->mu, NULL);
    pthread_cond_init(&eng->cv, NULL);
    int rc = load_config(eng, o, err, errlen);
    if (!rc) {
        eng->seed = o->seed ? o->seed : (uint64_t)eng->cfg->troupe.data.seed;
        rc = check_shapes(eng, o, err, errlen);
    }
    if (!rc && o->init_params) tr_model_init_params(eng->model, eng->seed);
    if (!rc) rc = open_data(eng, o, err, errlen);
    if (!rc) rc = create_monitor(eng, o, err, errlen);
    if (!rc) {
        tr_runtime_opts_t ro = {.n_workers = (unsigned)eng->cfg->troupe.runtime.workers,
                                .handle_signals = o->handle_signals,
                                .monitor = eng->mon};
        /* no flight_path: the engine dumps the ring itself at destroy (dump_flight) */
        rc = tr_runtime_init(&eng->rt, &ro);
    }
    if (!rc) {
        eng->buffers[TR__BUF_GRADS] = tr_model_grads(eng->model);
        rc = spawn_actors(eng, err, errlen);
    }
    if (!rc) rc = tr__dsmon_create(eng, err, errlen);
    if (rc < 0) {
        tr_engine_destroy(eng);
        return rc;
    }
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
                        eng->comm,   eng->optimizer, eng->checkpointer};
    size_t n = sizeof(all) / sizeof(all[0]);
    pthread_mutex_lock(&eng->mu);
    eng->destroying = true;
    eng->n_children = 0;
    for (size_t i = 0; i < n; i++)
        eng->n_children += !tr_actor_is_none(all[i]);
    pthread_mutex_unlock(&eng->mu);
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
    for (char *p = strchr(dir + 1, '/'); p; p = strchr(p + 1, '/')) { /* mkdir -p */
        *p = '\0';
        mkdir(dir, 0777);
        *p = '/';
    }
    tr_monitor_flush(eng->mon);
    int rc = tr_monitor_flight_dump(eng->mon, eng->flight_path);
    if (rc == TR_EINVAL) return; /* troupe.trace.flight_recorder is off */
    if (rc < 0)
        fprintf(stderr, "troupe: flight recorder: cannot write %s: %s\n", eng->flight_path,
                tr_strerror(rc));
    else
        fprintf(stderr, "troupe: engine failed (%s); flight recorder written to %s\n",
                eng->error[0] ? eng->error : tr_runtime_failure(eng->rt), eng->flight_path);
}

void tr_engine_destroy(tr_engine_t *eng)
{
    if (!eng) return;
    if (eng->rt) {
        stop_actors(eng);
        if (tr_runtime_run(eng->rt) == TR_EFAILED || eng->failed) dump_flight(eng);
        tr_runtime_close(eng->rt);
    }
    tr_monitor_destroy(eng->mon); /* after close: cleanups may still send */
    tr__dsmon_destroy(eng);
    tr__loader_free(eng);
    tr__executor_free(eng);
    tr__bucketer_free(eng);
    tr__comm_free(eng);
    tr__optimizer_free(eng);
    tr__checkpointer_free(eng);
    tr__dataset_close(eng->train);
    tr__dataset_close(eng->val);
    tr_model_destroy(eng->model);
    if (eng->own_cfg) tr_config_destroy(eng->cfg);
    pthread_cond_destroy(&eng->cv);
    pthread_mutex_destroy(&eng->mu);
    free(eng);
}

/* --- calls ------------------------------------------------------------------------------ */

/* A TRAIN request opens a step: the trace's step window moves (and the step marker is written)
 * before it is sent, so the request and everything it causes are classed with that step.
 * (DeepSpeed-style, the executor does it when it serves the window's first forward: only it
 * knows, since a forward may wait there for the previous step to finish.) */
static void step_begins(tr_engine_t *eng)
{
    tr_monitor_step(eng->mon, eng->global_steps, tr_now_ns());
}

int tr_engine_train_batch(tr_engine_t *eng, tr_step_stats_t *stats)
{
    if (!eng->train)
        return snprintf(eng->error, sizeof(eng->error),
                        "tr_engine_train_batch: the engine was created without a train dataset"),
               TR_EINVAL;
    step_begins(eng);
    int rc = call(eng, eng->executor, TR__REQ_TRAIN, 0, NULL, NULL);
    if (rc == 0 && stats) *stats = eng->reply_stats;
    return rc;
}

int tr_engine_eval(tr_engine_t *eng, int n_batches, float *loss)
{
    if (!eng->val || n_batches <= 0)
        return snprintf(eng->error, sizeof(eng->error), "tr_engine_eval: %s",
                        eng->val ? "n_batches must be positive" : "no dataset to evaluate on"),
               TR_EINVAL;
    int rc = call(eng, eng->executor, TR__REQ_EVAL, (uint32_t)n_batches, NULL, NULL);
    if (rc == 0 && loss) *loss = eng->reply_loss;
    return rc;
}

int tr_engine_forward(tr_engine_t *eng, const tr_engine_batch_t *batch, float *loss)
{
    eng->req_batch = batch; /* the executor opens the step at the window's first forward */
    int rc = call(eng, eng->executor, TR__REQ_FORWARD, 0, NULL, NULL);
    eng->req_batch = NULL;
    if (rc == 0 && loss) *loss = eng->reply_loss;
    return rc;
}

int tr_engine_backward(tr_engine_t *eng)
{
    return call(eng, eng->executor, TR__REQ_BACKWARD, 0, NULL, NULL);
}

int tr_engine_step(tr_engine_t *eng, tr_step_stats_t *stats)
{
    int rc = call(eng, eng->executor, TR__REQ_STEP, 0, NULL, NULL);
    if (rc == 0 && stats) *stats = eng->reply_stats;
    return rc > 0 ? 0 : rc; /* 1: not a boundary, a no-op as in DeepSpeed */
}

int tr_engine_is_boundary(const tr_engine_t *eng)
{
    return tr__executor_micro(eng) == eng->GAS - 1;
}

int tr_engine_save_checkpoint(tr_engine_t *eng, const char *dir, const char *tag)
{
    if (!dir || tr__executor_window(eng) != 0)
        return snprintf(eng->error, sizeof(eng->error), "save: %s",
                        dir ? "in the middle of an accumulation window; save after a step"
                            : "no directory"),
               TR_EINVAL;
    return call(eng, eng->checkpointer, TR__REQ_SAVE, 0, dir, tag);
}

int tr_engine_load_checkpoint(tr_engine_t *eng, const char *dir, const char *tag)
{
    if (!dir || tr__executor_window(eng) != 0)
        return snprintf(eng->error, sizeof(eng->error), "load: %s",
                        dir ? "in the middle of an accumulation window; load between steps"
                            : "no directory"),
               TR_EINVAL;
    int rc = call(eng, eng->checkpointer, TR__REQ_LOAD, 0, dir, tag);
    if (rc == 0 && eng->train) { /* continue the data stream where the checkpoint left it */
        atomic_fetch_add(&eng->data_gen, 1);
        rc = tr__engine_request(eng, eng->loader, TR__REQ_RESEEK, 0, NULL, NULL);
    }
    return rc;
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
    return atomic_load(&((tr_engine_t *)eng)->stop_requested);
}

uint64_t tr_engine_global_step(const tr_engine_t *eng)
{
    return eng->global_steps;
}
