/* engine.c: the embedding API (troupe/engine.h). It builds the runtime and the engine's
 * actors, and turns each call into a request message plus a wait.
 *
 * The caller's thread is a client outside the runtime (client.c): it fills the request's
 * inputs in the engine, sends an ENGINE_REQ and waits in its reply slot until an actor calls
 * tr__reply. A supervisor actor is linked to every engine actor: if one fails, the waiting
 * call gets the failure (never a hang) and the engine refuses further work with the same
 * explanation. The set-up checks are in setup_check.c.
 *
 * Tracing: the monitor comes from the config's troupe.trace (or opts.trace_dir) and is
 * attached to the runtime, which records every actor's messages; the engine adds the step
 * markers (where a step opens: see tr_engine_train_batch), its own lanes, the bucket-memory
 * counter (client.c) and, when an actor failed, the flight recorder's dump at destroy, once
 * the actors have stopped and no thread still records.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "actors/engine/client.h"
#include "actors/engine/engine_internal.h"
#include "actors/engine/memory_plan.h"
#include "actors/engine/setup_check.h"
#include "base/errf.h"
#include "base/file.h"
#include "base/vmem.h"
#include "model/model_internal.h"

/* --- explaining a refused call ------------------------------------------------------------ */

/* A call on a NULL engine: the thread's tr_last_error says so (there is no engine to hold the
 * text). */
static int no_engine(const char *fn)
{
    return tr__error(TR_EINVAL, "%s: eng is NULL; pass the engine tr_engine_create made", fn);
}

/* A refused call's explanation, in the engine's error (tr_engine_error) and the thread's
 * tr_last_error alike; returns rc. */
__attribute__((format(printf, 3, 4))) static int explain(tr_engine_t *eng, int rc, const char *fmt,
                                                         ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(eng->error, sizeof(eng->error), fmt, ap);
    va_end(ap);
    return tr__error(rc, "%s", eng->error);
}

/* A required pointer argument `arg` of `fn` that is NULL. */
static int null_arg(tr_engine_t *eng, const char *fn, const char *arg, const char *expected)
{
    return explain(eng, TR_EINVAL, "%s: %s is NULL; expected %s", fn, arg, expected);
}

/* Calls that send requests share the reply slot and the staging batch: one at a time. A call
 * made while another thread's runs is refused with TR_EBUSY; its explanation goes to this
 * thread's tr_last_error only, since the engine's error belongs to the running call. */
static int enter_call(tr_engine_t *eng, const char *fn)
{
    bool idle = false;
    if (atomic_compare_exchange_strong(&eng->in_call, &idle, true)) return 0;
    return tr__error(TR_EBUSY,
                     "%s: another call on this engine is still running (in another thread); "
                     "call the engine from one thread at a time",
                     fn);
}

static int leave_call(tr_engine_t *eng, int rc)
{
    atomic_store(&eng->in_call, false);
    return rc;
}

/* Copies s into a message's string field of capacity cap; a string that does not fit is an
 * error naming what it is, never a truncation. */
static int set_str(tr_engine_t *eng, char *field, size_t cap, const char *s, const char *what)
{
    size_t n = s ? strlen(s) : 0;
    if (n >= cap)
        return tr__errf(eng->error, sizeof(eng->error), TR_ENAMETOOLONG,
                        "%s: %zu bytes, longer than the %zu the engine accepts", what, n, cap - 1);
    memcpy(field, s ? s : "", n + 1);
    return 0;
}

/* Sends a request and waits for its reply (client.c). On success the reply's view becomes
 * the client's; on failure eng->error gets the explanation. */
static int call(tr_engine_t *eng, tr_actor_t to, tr_msg_t *m)
{
    return tr__client_call(eng->plan.client, eng->plan.rt, to, m, &eng->last, eng->error,
                           sizeof(eng->error));
}

/* A request with nothing but its kind and count. */
static int call_simple(tr_engine_t *eng, tr_actor_t to, tr__req_kind_t kind, uint32_t n)
{
    tr_msg_t *m = tr__request_new(eng->plan.rt, kind);
    if (!m) return tr__errf(eng->error, sizeof(eng->error), TR_ENOMEM, "engine: out of memory");
    TR_MSG_AS(m, engine_req)->n = n;
    return call(eng, to, m);
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
                         .rank = (unsigned)eng->plan.rank,
                         .steps = {(uint32_t)c->troupe.trace.wait, (uint32_t)c->troupe.trace.warmup,
                                   (uint32_t)c->troupe.trace.active,
                                   (uint32_t)c->troupe.trace.repeat}};
    if (!t.enabled && !t.flight_recorder) return 0;
    if (t.enabled && (!dir || !*dir))
        return tr__errf(err, errlen, TR_ECONFIG,
                        "%s: troupe.trace.output_path: a folder is needed when "
                        "troupe.trace.enabled is true",
                        c->source);
    snprintf(eng->flight_path, sizeof(eng->flight_path), "%s%sflight_rank%d.json",
             dir && *dir ? dir : "", dir && *dir ? "/" : "", eng->plan.rank);
    int rc = tr_monitor_create(&t, &eng->plan.mon);
    if (rc == 0) {
        tr_monitor_lane_set(eng->plan.mon, TR__LANE_PASSES, "executor passes", TR_LANE_COMPUTE);
        tr_monitor_lane_set(eng->plan.mon, TR__LANE_CKPT_WAIT, "checkpoint wait", TR_LANE_CONTROL);
        for (uint32_t k = 0; k < TR__COLLECTIVE_LANES; k++) {
            char name[40];
            snprintf(name, sizeof(name), "collectives in flight %u", k + 1);
            tr_monitor_lane_set(eng->plan.mon, TR__LANE_COLLECTIVES - k, name, TR_LANE_COMM);
        }
    }
    if (rc == TR_EBUSY)
        snprintf(err, errlen,
                 "%s: troupe.trace: another engine in this process is tracing into "
                 "'%s' (rank %d); give this engine its own troupe.trace.output_path or trace_dir",
                 c->source, dir ? dir : "", eng->plan.rank);
    else if (rc < 0)
        snprintf(err, errlen, "%s: troupe.trace: cannot write traces into '%s': %s", c->source,
                 dir ? dir : "", tr_strerror(rc));
    return rc;
}

static int open_data(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    const tr_config_t *c = eng->cfg;
    int rc = 0;
    if (o->train.shards || o->train.batch)
        rc = tr__dataset_open(&eng->train, &o->train, &eng->plan, c->troupe.data.shuffle,
                              eng->plan.seed, err, errlen);
    const tr_dataset_t *v = o->val.shards || o->val.batch ? &o->val : &o->train;
    /* eval reads in order, from the start, the stream one process reads: rank r evaluates its
     * share of those batches (the executor's serve_eval), so the N batches of an evaluation are
     * the same at any world size */
    tr__plan_t whole = eng->plan;
    whole.replica = 0;
    whole.replicas = 1;
    if (rc == 0 && (v->shards || v->batch))
        rc = tr__dataset_open(&eng->val, v, &whole, false, eng->plan.seed, err, errlen);
    return rc;
}

/* Registers one buffer the actors name in messages. */
static int register_buffer(tr_engine_t *eng, const char *name, void *base, size_t bytes, int dtype,
                           int lifetime, uint64_t *id)
{
    tr_buffer_info_t info = {.base = base,
                             .bytes = bytes,
                             .dtype = (uint8_t)dtype,
                             .device_type = TR_DEVICE_CPU,
                             .lifetime = (uint8_t)lifetime};
    snprintf(info.name, sizeof(info.name), "%s", name);
    return tr_buffer_register(eng->plan.rt, &info, id);
}

/* The elements of tied tensors that layers [first, last] use and another layer owns: a
 * pipeline stage holds them beside its own range (and their gradients kept apart). */
static size_t tied_in(const tr_model_t *m, int first, int last)
{
    size_t n = 0;
    for (int i = first; i <= last; i++) {
        const tr_layer_t *l = tr_model_layer(m, i);
        if (l->tie_count && (l->tie_layer < first || l->tie_layer > last)) n += l->tie_count;
    }
    return n;
}

/* tr_engine_opts_t.init_params: the whole model's init, or with a pipeline across ranks its
 * values for the stage's layers and the tied tensors they use only (the rest is never
 * touched). */
/* ZeRO 3's init, layer by layer: a layer's bf16 copies, then (unless it persists) its
 * parameters outside this rank's slice back to the kernel, before the next layer is written.
 * With offload_param nvme (`stream`) it hands the layer's part of the slice to the swapper's
 * file as it is made and gives all of the layer's pages back (the persistent layers stay
 * whole), so the slice is never resident whole; that runs in spawn_actors, between the
 * swapper and the fetcher. */
typedef struct init3 {
    tr_engine_t *eng;
    size_t lo, hi, kept;
    bool stream;
    int rc;
    char *err;
    size_t errlen;
} init3_t;

static void init3_layer(void *arg, int i)
{
    init3_t *s = arg;
    tr_model_t *m = s->eng->model;
    const tr_layer_t *l = tr_model_layer(m, i);
    size_t a = l->param_offset, b = a + l->param_count;
    size_t x = a > s->lo ? a : s->lo, y = b < s->hi ? b : s->hi;
    float *p = tr_model_params(m);
    uint16_t *bf16 = (uint16_t *)tr__model_params_bf16(m);
    if (s->stream && s->rc == 0 && y > x)
        s->rc = tr__swapper_store_params(s->eng->sw, x, y - x, p + x, s->err, s->errlen);
    bool keep = tr__persists(l->param_count, s->kept, s->eng->cfg);
    if (keep || !s->stream) tr_model_params_changed_range(m, a, l->param_count);
    if (keep) {
        s->kept += l->param_count;
        return;
    }
    if (s->stream) {
        tr__vmem_release(p + a, (b - a) * sizeof(float));
        return;
    }
    tr__release_outside(p, bf16, a, b, s->lo, s->hi);
    if (bf16 && s->eng->plan.param_offload) /* the slice moves home: its copies are made anew */
        tr__vmem_release(bf16 + a, (b - a) * sizeof(uint16_t));
}

static int init_params_streamed(tr_engine_t *eng, char *err, size_t errlen)
{
    const tr__plan_t *p = &eng->plan;
    init3_t s = {.eng = eng, .stream = true, .err = err, .errlen = errlen};
    tr__zero_owned(p->n_params, p->world, p->rank, &s.lo, &s.hi);
    tr_model_init_params_each(eng->model, p->seed, init3_layer, &s);
    return s.rc;
}

static int init_params(tr_engine_t *eng)
{
    const tr__plan_t *p = &eng->plan;
    if (p->zero == 3) { /* the whole model is never resident (the fetcher keeps the rest so) */
        init3_t s = {.eng = eng};
        tr__zero_owned(p->n_params, p->world, p->rank, &s.lo, &s.hi);
        tr_model_init_params_each(eng->model, p->seed, init3_layer, &s);
        return 0;
    }
    if (p->stage < 0) {
        tr_model_init_params(eng->model, p->seed);
        return 0;
    }
    int n = tr_model_num_layers(eng->model);
    unsigned char *keep = calloc((size_t)n, 1);
    if (!keep) return TR_ENOMEM;
    for (int i = p->stage_first; i <= p->stage_last; i++) {
        const tr_layer_t *l = tr_model_layer(eng->model, i);
        keep[i] = 1;
        if (l->tie_count) keep[l->tie_layer] = 1;
    }
    int rc = tr_model_init_params_layers(eng->model, p->seed, keep);
    free(keep);
    /* a layer kept for a tensor tied from it was initialised whole: the rest of its
     * parameters (GPT-2's wpe beside wte) goes back to the kernel, never to be touched again */
    float *w = tr_model_params(eng->model);
    for (int i = p->stage_first; rc == 0 && i <= p->stage_last; i++) {
        const tr_layer_t *l = tr_model_layer(eng->model, i);
        if (!l->tie_count || (l->tie_layer >= p->stage_first && l->tie_layer <= p->stage_last))
            continue;
        const tr_layer_t *o = tr_model_layer(eng->model, l->tie_layer);
        size_t end = l->tie_offset + l->tie_count, o_end = o->param_offset + o->param_count;
        tr__vmem_release(w + o->param_offset, (l->tie_offset - o->param_offset) * sizeof(float));
        tr__vmem_release(w + end, (o_end - end) * sizeof(float));
    }
    return rc;
}

/* offload_param cpu: this rank's partition moves into its own host buffer (locked with
 * pin_memory, as DeepSpeed pins it; beyond RLIMIT_MEMLOCK unlocked, with a warning), which
 * the optimizer steps and the fetcher gathers from; the fetcher then hands the parameter
 * buffer's copy back to the kernel. */
static int make_param_home(tr_engine_t *eng)
{
    tr__plan_t *p = &eng->plan;
    size_t lo, hi;
    tr__zero_owned(p->n_params, p->world, p->rank, &lo, &hi);
    size_t bytes = (hi - lo) * sizeof(float);
    eng->param_home = tr__vmem_alloc(bytes ? bytes : sizeof(float));
    if (!eng->param_home) return TR_ENOMEM;
    eng->param_home_bytes = bytes ? bytes : sizeof(float);
    memcpy(eng->param_home, tr_model_params(eng->model) + lo, bytes);
    if (eng->cfg->zero.offload_param.pin_memory && bytes && mlock(eng->param_home, bytes) < 0)
        tr_log(TR_LOG_WARN,
               "engine: offload_param.pin_memory: cannot lock the %zu bytes of this rank's "
               "parameters in memory (%s; raise `ulimit -l`); they stay unlocked",
               bytes, strerror(errno));
    return register_buffer(eng, "params/home", eng->param_home, eng->param_home_bytes, TR_DTYPE_F32,
                           TR_BUFFER_RUNTIME, &p->buf_param_home);
}

/* Parameters and gradients (the executor's), and the client's staging batch. */
static int register_buffers(tr_engine_t *eng)
{
    tr__plan_t *p = &eng->plan;
    size_t bt = (size_t)p->B * (size_t)p->T, np = p->n_params * sizeof(float);
    size_t in = bt * (size_t)(p->x_dim ? p->x_dim : 1) * 4, ty = bt * (size_t)p->y_dim * 4;
    size_t batch = in + (p->y_dim ? ty : bt * sizeof(int)); /* one batch's arrays */
    size_t stage = p->own_hi - p->own_lo + tied_in(eng->model, p->stage_first, p->stage_last);
    eng->memory.params = eng->memory.grads = stage * sizeof(float); /* the stage's, or all */
    if (p->grad_window) /* ZeRO 2: the buckets in flight, and tied tensors written early */
        eng->memory.grads = (p->grad_window + tr__tied_floats(eng->model)) * sizeof(float);
    if (p->zero == 3) { /* the slice, the persistent layers, the fetcher's gathered window */
        size_t kept = 0, largest = 0;
        for (int i = 0; i < tr_model_num_layers(eng->model); i++) {
            size_t c = tr_model_layer(eng->model, i)->param_count, group = 0;
            kept += tr__persists(c, kept, eng->cfg) ? c : 0;
            for (int j = tr__backward_from(eng->model, i); j <= i; j++) /* what i's pass reads */
                group += tr_model_layer(eng->model, j)->param_count +
                         tr_model_layer(eng->model, j)->tie_count;
            largest = group > largest ? group : largest;
        }
        eng->memory.params =
            tr__zero3_params_of(p->n_params, p->world, kept, largest, eng->cfg) * sizeof(float);
    }
    eng->memory.bf16_copies = tr_model_bf16(eng->model) ? eng->memory.params / 2 : 0;
    eng->memory.batches = batch * (size_t)(1 + (eng->train ? p->prefetch : 0));
    eng->stage_in = malloc(in);
    eng->stage_targets = malloc(bt * sizeof(int));
    eng->stage_y = malloc(ty ? ty : 4);
    if (!eng->stage_in || !eng->stage_targets || !eng->stage_y) return TR_ENOMEM;
    int rc = register_buffer(eng, "params", tr_model_params(eng->model), np, TR_DTYPE_F32,
                             TR_BUFFER_RUNTIME, &p->buf_params);
    if (!rc)
        rc = register_buffer(eng, "grads", tr_model_grads(eng->model), np, TR_DTYPE_F32,
                             TR_BUFFER_RUNTIME, &p->buf_grads);
    if (!rc && p->param_offload == TR_OFFLOAD_CPU) rc = make_param_home(eng);
    if (!rc && tr_model_bf16(eng->model))
        rc = register_buffer(eng, "params_bf16", (void *)tr__model_params_bf16(eng->model),
                             p->n_params * sizeof(uint16_t), TR_DTYPE_BF16, TR_BUFFER_RUNTIME,
                             &p->buf_params_bf16);
    if (!rc)
        rc = register_buffer(eng, "client/inputs", eng->stage_in, in,
                             p->x_dim ? TR_DTYPE_F32 : TR_DTYPE_I32, TR_BUFFER_REQUEST,
                             &p->buf_stage_in);
    if (!rc)
        rc = register_buffer(eng, "client/targets", eng->stage_targets, bt * sizeof(int),
                             TR_DTYPE_I32, TR_BUFFER_REQUEST, &p->buf_stage_targets);
    if (!rc && ty)
        rc = register_buffer(eng, "client/y", eng->stage_y, ty, TR_DTYPE_F32, TR_BUFFER_REQUEST,
                             &p->buf_stage_y);
    return rc;
}

/* The actors. Each spawn reads the plan and returns what it made: its state (freed at
 * destroy), its address and what it fixed for the others (the swapper's layout) into the
 * plan, and its memory. None reads another's output at spawn, so their order is free but for
 * one: with offload_param nvme the swapper's spawn writes this rank's parameter slice to its
 * file, which the fetcher's spawn then hands back to the kernel, so the swapper comes first.
 * The order also gives the actors their trace lanes and registry ids as they always had. */
static int spawn_actors(tr_engine_t *eng, char *err, size_t errlen)
{
    tr__plan_t *p = &eng->plan;
    tr_engine_memory_t *mem = &eng->memory;
    tr_actor_opts_t so = {
        .name = "engine-supervisor", .defer_stop = 1, .lane_kind = TR_LANE_CONTROL};
    uint64_t swap_bytes = 0, optim_bytes = 0;
    int rc = tr_actor_spawn(p->rt, tr__client_supervise, p->client, &so, &p->supervisor);
    if (!rc)
        rc = tr__optimizer_spawn(p, &eng->op, &p->optimizer, &optim_bytes, &mem->grad_partition,
                                 err, errlen);
    if (!rc && (p->swaps || p->param_offload == TR_OFFLOAD_NVME)) {
        tr__swap_layout_t swap;
        rc = tr__swapper_spawn(p, &eng->sw, &p->swapper, eng->init_later, &swap, &swap_bytes, err,
                               errlen);
        if (!rc) p->swap = swap; /* the optimizer steps in it from its first message */
        if (!rc && eng->init_later) rc = init_params_streamed(eng, err, errlen);
    }
    mem->optimizer = p->swaps ? 0 : optim_bytes; /* swapped: the moments are on disk */
    mem->swap = swap_bytes;
    if (!rc)
        rc = tr__executor_spawn(p, eng->model, eng->val, eng->ds, &eng->ex, &p->executor, err,
                                errlen);
    if (!rc && p->zero < 3) rc = tr__bucketer_spawn(p, &p->bucketer);
    if (!rc && p->zero == 3) /* it packs the buckets too (fetcher.c says why) */
        rc = tr__fetcher_spawn(p, &p->fetcher, err, errlen);
    if (!rc) rc = tr__comm_spawn(p, &eng->cm, &p->comm, &mem->comm, err, errlen);
    /* MPI's nonblocking collectives work in copies of their buffers (Open MPI's libnbc), so a
     * bucket in flight costs its bytes twice until it completes: at ZeRO 0 and 1 every bucket
     * of a step may be in flight at once, at ZeRO 2 the backward's window bounds them. */
    if (!rc && p->world > 1)
        mem->comm += (p->grad_window ? p->grad_window : p->n_params) *
                     (p->cfg->communication_data_type == TR_DTYPE_F32 ? 4 : 2);
    if (!rc) rc = tr__checkpointer_spawn(p, &eng->ck, &p->checkpointer);
    if (!rc && eng->train) rc = tr__loader_spawn(p, eng->train, &eng->ld, &p->loader);
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
    eng->driver_rc = tr_runtime_run(eng->plan.rt);
    return NULL;
}

static int start_driver(tr_engine_t *eng, char *err, size_t errlen)
{
    int rc = -pthread_create(&eng->driver, NULL, drive, eng);
    if (rc < 0)
        return tr__errf(err, errlen, rc,
                        "%s: troupe.runtime.deterministic: cannot start the "
                        "scheduler's thread: %s",
                        eng->cfg->source, tr_strerror(rc));
    eng->driving = true;
    return 0;
}

/* The kinds where the engine's figures and the prediction differ, in bytes, into buf ("" when
 * none). */
static void memory_differences(const tr_engine_memory_t *have, const tr_engine_memory_t *want,
                               char *buf, size_t len)
{
    static const struct {
        const char *name;
        size_t at;
    } kinds[] = {{"parameters", offsetof(tr_engine_memory_t, params)},
                 {"gradients", offsetof(tr_engine_memory_t, grads)},
                 {"gradient partition", offsetof(tr_engine_memory_t, grad_partition)},
                 {"optimizer states", offsetof(tr_engine_memory_t, optimizer)},
                 {"swap buffers", offsetof(tr_engine_memory_t, swap)},
                 {"communication buffers", offsetof(tr_engine_memory_t, comm)},
                 {"batches", offsetof(tr_engine_memory_t, batches)},
                 {"bf16 weight copies", offsetof(tr_engine_memory_t, bf16_copies)}};
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]) && used < len; i++) {
        uint64_t h, w;
        memcpy(&h, (const char *)have + kinds[i].at, sizeof(h));
        memcpy(&w, (const char *)want + kinds[i].at, sizeof(w));
        if (h != w)
            used += (size_t)snprintf(buf + used, len - used, "%s%s %llu bytes, predicted %llu",
                                     used ? "; " : "", kinds[i].name, (unsigned long long)h,
                                     (unsigned long long)w);
    }
}

/* The kinds the model lays out at its first forward (the activations) come from the
 * prediction; the others are what the actors made. A warning names the kinds where the
 * prediction (memory_plan.c, what tr_engine_create checked and `troupe memory` prints)
 * differs: a kind the estimator no longer follows. */
static void log_memory(tr_engine_t *eng)
{
    const tr__plan_t *p = &eng->plan;
    tr_memory_model_t m;
    tr_engine_memory_t want;
    char line[512];
    int rc = tr_memory_model_of(&m, eng->model, p->B, p->T);
    if (rc == 0)
        rc = tr_engine_memory_predict(eng->cfg, &m, p->rank, eng->train != NULL, &want, NULL, 0);
    tr_memory_model_close(&m);
    if (rc == 0) eng->memory.activations = want.activations;
    tr_engine_memory_format(&eng->memory, line, sizeof(line));
    char stage[96] = "";
    if (p->stage >= 0)
        snprintf(stage, sizeof(stage), ", pipeline stage %d of %d: layers %d to %d", p->stage,
                 p->stages, p->stage_first, p->stage_last);
    tr_log(TR_LOG_INFO, "engine: memory on rank %d of %d (ZeRO stage %d%s): %s", p->rank, p->world,
           p->zero, stage, line);
    /* a pipeline across ranks holds its stage's, which the estimator does not cut yet */
    if (rc == 0 && p->stage < 0) memory_differences(&eng->memory, &want, line, sizeof(line));
    if (rc == 0 && p->stage < 0 && line[0])
        tr_log(TR_LOG_WARN, "engine: memory on rank %d differs from its prediction: %s", p->rank,
               line);
}

static int create(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    int rc = tr__setup_ranks(eng, o, err, errlen);
    if (!rc) rc = tr__setup_config(eng, o, err, errlen);
    if (!rc) tr_log_set_default_level(eng->cfg->troupe.log_level);
    if (!rc) {
        eng->plan.seed = o->seed ? o->seed : (uint64_t)eng->cfg->troupe.data.seed;
        rc = tr__setup_shapes(eng, o, err, errlen);
    }
    eng->init_later = o->init_params && eng->plan.zero == 3 &&
                      eng->plan.param_offload == TR_OFFLOAD_NVME; /* spawn_actors */
    if (!rc && o->init_params && !eng->init_later && (rc = init_params(eng)) < 0)
        snprintf(err, errlen, "engine: initialising the parameters: %s", tr_strerror(rc));
    if (!rc) rc = open_data(eng, o, err, errlen);
    if (!rc) rc = create_monitor(eng, o, err, errlen);
    if (!rc) {
        const tr_config_t *c = eng->cfg;
        tr_runtime_opts_t ro = {.n_workers = (unsigned)c->troupe.runtime.workers,
                                .deterministic = c->troupe.runtime.deterministic,
                                .seed = (uint64_t)c->troupe.runtime.seed,
                                .handle_signals = o->handle_signals,
                                .monitor = eng->plan.mon,
                                .wire_check = c->troupe.runtime.wire_check,
                                .kernel_slice = c->troupe.runtime.kernel_slice,
                                .inline_ns = c->troupe.runtime.inline_ns};
        if (!ro.kernel_slice) ro.slice_us = (unsigned)c->troupe.runtime.slice_us;
        /* no flight_path: the engine dumps the ring itself at destroy (dump_flight) */
        rc = tr_runtime_init(&eng->plan.rt, &ro);
        if (rc < 0)
            snprintf(err, errlen, "engine: cannot start the runtime (%u worker threads, %s): %s",
                     ro.n_workers, ro.n_workers ? "troupe.runtime.workers" : "one per core",
                     tr_last_error()[0] ? tr_last_error() : tr_strerror(rc));
    }
    if (!rc) rc = register_buffers(eng);
    if (!rc) rc = tr__dsmon_create(&eng->plan, &eng->ds, err, errlen);
    if (!rc) rc = spawn_actors(eng, err, errlen);
    if (!rc && eng->cfg->troupe.runtime.deterministic) rc = start_driver(eng, err, errlen);
    if (!rc) log_memory(eng);
    if (rc < 0 && !err[0]) snprintf(err, errlen, "engine: %s", tr_strerror(rc));
    return rc;
}

/* create's failure: the text in err and, for a caller that passed no err, the thread's
 * tr_last_error. */
static int create_failed(int rc, const char *err)
{
    return tr__error(rc, "%s", err);
}

int tr_engine_create(tr_engine_t **out, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    char scratch[256];
    if (!err || !errlen) {
        err = scratch;
        errlen = sizeof(scratch);
    }
    err[0] = '\0';
    if (!out || !o || !o->model) {
        if (o && !out) tr_model_destroy(o->model); /* the engine's, also on failure */
        const char *why = !out ? "out is NULL; expected the address of a tr_engine_t * to set"
                          : !o ? "opts is NULL; expected the engine's options"
                               : "opts->model is NULL; expected the model to train";
        tr__errf(err, errlen, TR_EINVAL, "tr_engine_create: %s", why);
        return create_failed(TR_EINVAL, err);
    }
    *out = NULL;
    tr_engine_t *eng = calloc(1, sizeof(*eng));
    if (eng) eng->plan.client = tr__client_create();
    if (!eng || !eng->plan.client) {
        free(eng);
        tr_model_destroy(o->model);
        tr__errf(err, errlen, TR_ENOMEM, "engine: out of memory");
        return create_failed(TR_ENOMEM, err);
    }
    eng->model = o->model;
    eng->plan.model = o->model;
    eng->plan.n_params = tr_model_num_params(o->model);
    int rc = create(eng, o, err, errlen);
    if (rc < 0) {
        tr_engine_destroy(eng);
        return create_failed(rc, err);
    }
    eng->created = true;
    *out = eng;
    return 0;
}

static void stop_one(tr_engine_t *eng, tr_actor_t a)
{
    if (!tr_actor_is_none(a)) tr_actor_stop(eng->plan.rt, a);
}

/* Stops the actors; the supervisor stops itself after their exit notices (see
 * tr__client_supervise), so a failure reported as the others stop still reaches it. */
static void stop_actors(tr_engine_t *eng)
{
    const tr__plan_t *p = &eng->plan;
    tr_actor_t all[] = {p->loader,    p->executor,     p->bucketer, p->comm,
                        p->optimizer, p->checkpointer, p->swapper,  p->fetcher};
    size_t n = sizeof(all) / sizeof(all[0]);
    int n_children = 0;
    for (size_t i = 0; i < n; i++)
        n_children += !tr_actor_is_none(all[i]);
    tr__client_destroying(p->client, n_children);
    for (size_t i = 0; i < n; i++)
        stop_one(eng, all[i]);
    tr_msg_t *m = tr_actor_is_none(p->supervisor) ? NULL : tr_msg_new(p->rt, TR_MSG_STOP);
    if (m && tr_actor_send(p->rt, p->supervisor, m) < 0) /* wake it to count */
        tr_msg_free(p->rt, m);
}

/* A failed engine's last spans per thread, written once every actor has stopped. */
static void dump_flight(tr_engine_t *eng)
{
    if (!eng->plan.mon) return;
    char dir[sizeof(eng->flight_path)];
    snprintf(dir, sizeof(dir), "%s", eng->flight_path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        tr__mkdir_p(dir);
    }
    tr_monitor_flush(eng->plan.mon);
    int rc = tr_monitor_flight_dump(eng->plan.mon, eng->flight_path);
    if (rc == TR_EINVAL) return; /* troupe.trace.flight_recorder is off */
    if (rc < 0)
        tr_log(TR_LOG_ERROR, "flight recorder: cannot write %s: %s", eng->flight_path,
               tr_strerror(rc));
    else
        tr_log(TR_LOG_ERROR, "engine failed (%s); flight recorder written to %s",
               tr__client_error(eng->plan.client)[0] ? tr__client_error(eng->plan.client)
                                                     : tr_runtime_failure(eng->plan.rt),
               eng->flight_path);
}

static int wait_checkpoint(tr_engine_t *eng);

void tr_engine_destroy(tr_engine_t *eng)
{
    if (!eng) return;
    if (eng->created && eng->last.window == 0) /* the last save's files and latest (a failure
                                                * was logged then); not mid-window, where a
                                                * wait's round could meet a step's collectives */
        wait_checkpoint(eng);
    if (eng->plan.rt) {
        stop_actors(eng);
        int rc = 0;
        if (eng->driving) { /* the driver's tr_runtime_run returns once every actor stopped */
            pthread_join(eng->driver, NULL);
            rc = eng->driver_rc;
        } else {
            rc = tr_runtime_run(eng->plan.rt);
        }
        if (rc == TR_EFAILED || tr__client_failed(eng->plan.client)) dump_flight(eng);
        tr_runtime_close(eng->plan.rt);
    }
    tr_monitor_destroy(eng->plan.mon); /* after close: cleanups may still send */
    tr__dsmon_destroy(eng->ds);
    tr__loader_free(eng->ld);
    tr__executor_free(eng->ex);
    tr__comm_free(eng->cm);
    tr__optimizer_free(eng->op);
    tr__swapper_free(eng->sw);
    if (eng->param_home) tr__vmem_free(eng->param_home, eng->param_home_bytes);
    tr__checkpointer_free(eng->ck);
    tr__dataset_close(eng->train);
    tr__dataset_close(eng->val);
    tr_model_destroy(eng->model);
    if (eng->own_cfg) tr_config_destroy(eng->cfg);
    free(eng->stage_in);
    free(eng->stage_targets);
    free(eng->stage_y);
    tr__client_destroy(eng->plan.client);
    free(eng);
}

/* --- calls ------------------------------------------------------------------------------ */

static int refuse(tr_engine_t *eng, int rc, const char *what)
{
    return explain(eng, rc, "%s", what);
}

static int train_batch(tr_engine_t *eng, tr_step_stats_t *stats)
{
    if (!eng->train)
        return refuse(eng, TR_EINVAL,
                      "tr_engine_train_batch: the engine was created without a train dataset");
    /* The step opens when its request is sent: the trace's step window moves (and the step
     * marker is written) first, so the request and everything it causes are classed with it.
     * (DeepSpeed-style, the executor does it at the window's first forward.) */
    tr_monitor_step(eng->plan.mon, eng->last.global_step, tr_now_ns());
    int rc = call_simple(eng, eng->plan.executor, TR__REQ_TRAIN, 0);
    if (rc == 0 && stats) *stats = eng->last.stats;
    return rc;
}

int tr_engine_train_batch(tr_engine_t *eng, tr_step_stats_t *stats)
{
    if (!eng) return no_engine("tr_engine_train_batch");
    int rc = enter_call(eng, "tr_engine_train_batch");
    if (rc < 0) return rc;
    return leave_call(eng, train_batch(eng, stats));
}

/* The checks and calls below run inside enter_call/leave_call: they write the engine's error,
 * which belongs to the one running call. */
static int eval(tr_engine_t *eng, int n_batches, float *loss)
{
    if (!loss) return null_arg(eng, "tr_engine_eval", "loss", "a float to receive the mean loss");
    if (!eng->val || n_batches <= 0)
        return explain(eng, TR_EINVAL, "%s",
                       eng->val ? "tr_engine_eval: n_batches must be positive"
                                : "tr_engine_eval: no dataset to evaluate on");
    int rc = call_simple(eng, eng->plan.executor, TR__REQ_EVAL, (uint32_t)n_batches);
    if (rc == 0) *loss = eng->last.loss;
    return rc;
}

int tr_engine_eval(tr_engine_t *eng, int n_batches, float *loss)
{
    if (!eng) return no_engine("tr_engine_eval");
    int rc = enter_call(eng, "tr_engine_eval");
    if (rc < 0) return rc;
    return leave_call(eng, eval(eng, n_batches, loss));
}

/* Copies the caller's batch into the registered staging buffers the request names. */
static int stage_batch(tr_engine_t *eng, const tr_engine_batch_t *b, tr_msg_engine_req_t *r)
{
    const tr__plan_t *p = &eng->plan;
    size_t bt = (size_t)p->B * (size_t)p->T;
    const void *in = p->x_dim ? (const void *)b->x : (const void *)b->tokens;
    const void *tg = p->y_dim ? (const void *)b->y : (const void *)b->targets;
    if (!in || !tg)
        return tr__errf(eng->error, sizeof(eng->error), TR_EINVAL,
                        "tr_engine_forward: the batch needs %s and %s (this model's first layer "
                        "reads %s, its loss layer %s targets)",
                        p->x_dim ? "x" : "tokens", p->y_dim ? "y" : "targets",
                        p->x_dim ? "floats" : "token ids", p->y_dim ? "float" : "integer");
    size_t in_bytes = bt * (size_t)(p->x_dim ? p->x_dim : 1) * 4;
    size_t tg_bytes = bt * (size_t)(p->y_dim ? p->y_dim : 1) * 4;
    memcpy(eng->stage_in, in, in_bytes);
    memcpy(p->y_dim ? eng->stage_y : eng->stage_targets, tg, tg_bytes);
    tr_buffer_ref(p->rt, p->buf_stage_in, 0, in_bytes, p->x_dim ? TR_DTYPE_F32 : TR_DTYPE_I32,
                  &r->inputs);
    if (p->y_dim)
        tr_buffer_ref(p->rt, p->buf_stage_y, 0, tg_bytes, TR_DTYPE_F32, &r->y);
    else
        tr_buffer_ref(p->rt, p->buf_stage_targets, 0, tg_bytes, TR_DTYPE_I32, &r->targets);
    return 0;
}

static int forward(tr_engine_t *eng, const tr_engine_batch_t *batch, float *loss)
{
    if (!batch)
        return null_arg(eng, "tr_engine_forward", "batch", "a micro-batch (tr_engine_batch_t)");
    if (!loss)
        return null_arg(eng, "tr_engine_forward", "loss", "a float to receive the batch's loss");
    tr_msg_t *m = tr__request_new(eng->plan.rt, TR__REQ_FORWARD);
    if (!m) return refuse(eng, TR_ENOMEM, "tr_engine_forward: out of memory");
    int rc = stage_batch(eng, batch, TR_MSG_AS(m, engine_req));
    if (rc < 0) {
        tr_msg_free(eng->plan.rt, m);
        return tr__error(rc, "%s", eng->error);
    }
    rc = call(eng, eng->plan.executor, m);
    if (rc == 0) *loss = eng->last.loss;
    return rc;
}

int tr_engine_forward(tr_engine_t *eng, const tr_engine_batch_t *batch, float *loss)
{
    if (!eng) return no_engine("tr_engine_forward");
    int rc = enter_call(eng, "tr_engine_forward");
    if (rc < 0) return rc;
    return leave_call(eng, forward(eng, batch, loss));
}

int tr_engine_backward(tr_engine_t *eng)
{
    if (!eng) return no_engine("tr_engine_backward");
    int rc = enter_call(eng, "tr_engine_backward");
    if (rc < 0) return rc;
    return leave_call(eng, call_simple(eng, eng->plan.executor, TR__REQ_BACKWARD, 0));
}

int tr_engine_step(tr_engine_t *eng, tr_step_stats_t *stats)
{
    if (!eng) return no_engine("tr_engine_step");
    int rc = enter_call(eng, "tr_engine_step");
    if (rc < 0) return rc;
    rc = call_simple(eng, eng->plan.executor, TR__REQ_STEP, 0);
    if (rc >= 0 && stats) *stats = eng->last.stats;
    return leave_call(eng, rc > 0 ? 0 : rc); /* 1: not a boundary, a no-op as in DeepSpeed */
}

int tr_engine_is_boundary(const tr_engine_t *eng)
{
    if (!eng) return no_engine("tr_engine_is_boundary");
    return eng->last.micro_pos == eng->plan.GAS - 1;
}

/* A SAVE or LOAD request for dir/tag, refused in the middle of an accumulation window. */
static int checkpoint_call(tr_engine_t *eng, tr__req_kind_t kind, const char *dir, const char *tag)
{
    const char *what = kind == TR__REQ_SAVE ? "save" : "load";
    if (eng->last.window != 0)
        return tr__errf(eng->error, sizeof(eng->error), TR_EINVAL,
                        "%s: in the middle of an accumulation window; %s between steps", what,
                        what);
    tr_msg_t *m = tr__request_new(eng->plan.rt, kind);
    if (!m) return refuse(eng, TR_ENOMEM, "checkpoint: out of memory");
    tr_msg_engine_req_t *r = TR_MSG_AS(m, engine_req);
    int rc = set_str(eng, r->dir, sizeof(r->dir), dir,
                     kind == TR__REQ_SAVE ? "save: directory" : "load: directory");
    if (!rc) rc = set_str(eng, r->tag, sizeof(r->tag), tag, "checkpoint tag");
    if (rc < 0) {
        tr_msg_free(eng->plan.rt, m);
        return rc;
    }
    return call(eng, kind == TR__REQ_SAVE ? eng->plan.executor : eng->plan.checkpointer, m);
}

/* The arguments of a save or load (fn): a directory, and a tag that is one directory name. */
static int check_checkpoint_args(tr_engine_t *eng, const char *fn, const char *dir, const char *tag)
{
    if (!dir) return null_arg(eng, fn, "dir", "the checkpoints' directory");
    if (!*dir) return explain(eng, TR_EINVAL, "%s: dir is empty; expected a directory", fn);
    if (tag && (!*tag || strchr(tag, '/') || !strcmp(tag, ".") || !strcmp(tag, "..")))
        return explain(eng, TR_EINVAL,
                       "%s: tag '%.200s' is not a directory name; expected a name without '/', "
                       "other than '.' and '..' (or NULL for global_step<N>)",
                       fn, tag);
    return 0;
}

static int wait_checkpoint(tr_engine_t *eng)
{
    return call_simple(eng, eng->plan.executor, TR__REQ_WAIT, 0);
}

int tr_engine_gather_params(tr_engine_t *eng)
{
    if (!eng) return no_engine("tr_engine_gather_params");
    int rc = enter_call(eng, "tr_engine_gather_params");
    if (rc < 0) return rc;
    return leave_call(eng, call_simple(eng, eng->plan.executor, TR__REQ_GATHER, 0));
}

int tr_engine_wait_checkpoint(tr_engine_t *eng)
{
    if (!eng) return no_engine("tr_engine_wait_checkpoint");
    int rc = enter_call(eng, "tr_engine_wait_checkpoint");
    if (rc < 0) return rc;
    return leave_call(eng, wait_checkpoint(eng));
}

/* A save or load begins once the last save has finished; its failure was logged when it
 * happened and is not this call's. */
static void settle_last_save(tr_engine_t *eng)
{
    wait_checkpoint(eng);
    eng->error[0] = '\0';
}

static int save_checkpoint(tr_engine_t *eng, const char *dir, const char *tag)
{
    int rc = check_checkpoint_args(eng, "tr_engine_save_checkpoint", dir, tag);
    if (rc < 0) return rc;
    settle_last_save(eng);
    rc = checkpoint_call(eng, TR__REQ_SAVE, dir, tag);
    if (rc < 0 || eng->cfg->checkpoint.writer_decoupled) return rc;
    return wait_checkpoint(eng); /* checkpoint.writer.decoupled false */
}

int tr_engine_save_checkpoint(tr_engine_t *eng, const char *dir, const char *tag)
{
    if (!eng) return no_engine("tr_engine_save_checkpoint");
    int rc = enter_call(eng, "tr_engine_save_checkpoint");
    if (rc < 0) return rc;
    return leave_call(eng, save_checkpoint(eng, dir, tag));
}

static int load_checkpoint(tr_engine_t *eng, const char *dir, const char *tag)
{
    int rc = check_checkpoint_args(eng, "tr_engine_load_checkpoint", dir, tag);
    if (rc < 0) return rc;
    settle_last_save(eng);
    return checkpoint_call(eng, TR__REQ_LOAD, dir, tag);
}

int tr_engine_load_checkpoint(tr_engine_t *eng, const char *dir, const char *tag)
{
    if (!eng) return no_engine("tr_engine_load_checkpoint");
    int rc = enter_call(eng, "tr_engine_load_checkpoint");
    if (rc < 0) return rc;
    return leave_call(eng, load_checkpoint(eng, dir, tag));
}

const char *tr_engine_error(const tr_engine_t *eng)
{
    if (!eng) {
        no_engine("tr_engine_error");
        return "tr_engine_error: eng is NULL; pass the engine tr_engine_create made";
    }
    return eng->error;
}

const tr_model_t *tr_engine_model(const tr_engine_t *eng)
{
    if (!eng) {
        no_engine("tr_engine_model");
        return NULL;
    }
    return eng->model;
}

const tr_config_t *tr_engine_config(const tr_engine_t *eng)
{
    if (!eng) {
        no_engine("tr_engine_config");
        return NULL;
    }
    return eng->cfg;
}

tr_runtime_t *tr_engine_runtime(const tr_engine_t *eng)
{
    if (!eng) {
        no_engine("tr_engine_runtime");
        return NULL;
    }
    return eng->plan.rt;
}

int tr_engine_stop_requested(const tr_engine_t *eng)
{
    if (!eng) return no_engine("tr_engine_stop_requested");
    if (eng->plan.world > 1) /* the ranks' agreement (client.h), the same step on every rank */
        return tr__client_stop_agreed(eng->plan.client);
    return tr__client_stop_requested(eng->plan.client);
}

uint64_t tr_engine_global_step(const tr_engine_t *eng)
{
    if (!eng) {
        no_engine("tr_engine_global_step");
        return 0;
    }
    return eng->last.global_step;
}

int tr_engine_rank(const tr_engine_t *eng)
{
    if (!eng) return no_engine("tr_engine_rank");
    return eng->plan.rank;
}

int tr_engine_world(const tr_engine_t *eng)
{
    if (!eng) return no_engine("tr_engine_world");
    return eng->plan.world;
}

void tr_engine_memory(const tr_engine_t *eng, tr_engine_memory_t *out)
{
    if (!out) {
        tr__error(TR_EINVAL,
                  "tr_engine_memory: out is NULL; expected a tr_engine_memory_t to fill");
        return;
    }
    if (!eng) {
        memset(out, 0, sizeof(*out));
        no_engine("tr_engine_memory");
        return;
    }
    *out = eng->memory;
}
