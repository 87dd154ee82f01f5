/* setup_check.c: what is fixed before the first message, and the checks on it: this rank
 * and the world size, the config, the model's shapes against the config and the datasets,
 * the ZeRO stage, the pipeline, activation checkpointing and precision. Each check refuses
 * what it cannot run with an error naming the key, in DeepSpeed's words where it has them.
 * The caller's thread, inside tr_engine_create.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/engine/engine_internal.h"
#include "actors/engine/memory_plan.h"
#include "actors/engine/setup_check.h"
#include "runtime/comm/ranks.h"
#include "troupe/pipeline.h"

/* This process's rank and the world size: the caller's, or the launcher's environment. */
int tr__setup_ranks(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    tr_ranks_t given = {.rank = o->rank, .world = o->world}, r;
    char why[384];
    int rc = tr_ranks_discover(o->world > 0 ? &given : NULL, &r, why, sizeof(why));
    if (rc < 0) return tr__errf(err, errlen, rc, "engine: %s", why);
    eng->plan.rank = r.rank;
    eng->plan.world = r.world;
    if (r.world > 1)
        tr_log(TR_LOG_INFO, "engine: rank %d of %d (local rank %d, from %s)", r.rank, r.world,
               r.local_rank, r.source);
    return 0;
}

int tr__setup_config(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    if (o->config) {
        eng->cfg = (tr_config_t *)o->config;
        eng->plan.cfg = eng->cfg;
        if (eng->cfg->ranks != eng->plan.world)
            return tr__errf(err, errlen, TR_EINVAL,
                            "%s: the config was resolved for world size %lld, but this process "
                            "is rank %d of %d (load it with that world size)",
                            eng->cfg->source, (long long)eng->cfg->ranks, eng->plan.rank,
                            eng->plan.world);
        return 0;
    }
    if (!o->config_path)
        return tr__errf(err, errlen, TR_EINVAL, "engine: no config (config_path or config)");
    tr_config_diag_t d;
    tr_config_diag_init(&d);
    int rc = tr_config_load(o->config_path, eng->plan.world, &eng->cfg, &d);
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
    eng->plan.cfg = eng->cfg;
    return rc;
}

/* What the model's first layer reads and its loss layer wants, in words, for errors. */
static void describe_width(int width, const char *floats, const char *ints, char *out, size_t len)
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
    describe_width(eng->plan.x_dim, "floats", "token ids (x_dim must be 0)", in, sizeof(in));
    describe_width(eng->plan.y_dim, "float targets", "integer targets (y_dim must be 0)", tg,
                   sizeof(tg));
    for (int i = 0; i < 2; i++) {
        const tr_dataset_t *d = sets[i];
        if (!d->shards && !d->batch) continue;
        if (d->x_dim != eng->plan.x_dim)
            return tr__errf(err, errlen, TR_EINVAL,
                            "engine: %s dataset: x_dim %d, but the model's first layer '%s' "
                            "reads %s",
                            names[i], d->x_dim, first->name, in);
        if (d->y_dim != eng->plan.y_dim)
            return tr__errf(err, errlen, TR_EINVAL,
                            "engine: %s dataset: y_dim %d, but the model's loss layer '%s' reads "
                            "%s",
                            names[i], d->y_dim, loss->name, tg);
    }
    return 0;
}

/* A pipeline across ranks: this rank's stage (the executor cuts the model the same way,
 * actors/exec/executor.c) and the range of the flat buffers its layers hold. The gradients
 * are reduced by the pipeline (actors/pipe/model.c) in fp32. */
static int own_stage(tr_engine_t *eng, char *err, size_t errlen)
{
    tr__plan_t *p = &eng->plan;
    const tr_config_t *c = eng->cfg;
    if (c->communication_data_type != TR_DTYPE_F32 &&
        tr_config_origin(c, "communication_data_type") == TR_ORIGIN_GIVEN)
        return tr__errf(err, errlen, TR_ECONFIG,
                        "%s: communication_data_type: a pipeline across ranks reduces its "
                        "stages' gradients in fp32 only for now (remove the key, or set "
                        "\"fp32\")",
                        c->source);
    if (c->communication_data_type != TR_DTYPE_F32 && p->rank == 0)
        tr_log(TR_LOG_INFO,
               "pipeline: the stages' gradients are reduced in fp32 (communication_data_type, "
               "derived from the precision, applies to data parallelism without a pipeline)");
    const char *method = c->pipeline.partition && strcmp(c->pipeline.partition, "best")
                             ? c->pipeline.partition
                             : "parameters";
    int *bounds = malloc(sizeof(int) * (size_t)(p->stages + 1));
    if (!bounds) return tr__errf(err, errlen, TR_ENOMEM, "engine: out of memory");
    char why[512];
    int rc = tr_pipe_partition(eng->model, method, p->stages, bounds, why, sizeof(why));
    if (rc < 0) {
        free(bounds);
        return tr__errf(err, errlen, rc, "%s: pipeline.partition: %s", c->source, why);
    }
    p->stage = p->rank / p->replicas;
    p->stage_first = bounds[p->stage];
    p->stage_last = bounds[p->stage + 1] - 1;
    const tr_layer_t *first = tr_model_layer(eng->model, p->stage_first);
    const tr_layer_t *last = tr_model_layer(eng->model, p->stage_last);
    p->own_lo = first->param_offset;
    p->own_hi = last->param_offset + last->param_count;
    free(bounds);
    return 0;
}

/* pipeline.stages > 1: the executor runs each step's micro-batches through stage actors, in
 * this process on one rank, else one stage per rank: world = stages x replicas, stage-major;
 * a step's micro-batches enter the pipeline together, so the loader keeps at least
 * gradient_accumulation_steps of them. */
static int check_pipeline(tr_engine_t *eng, char *err, size_t errlen)
{
    const tr_config_t *c = eng->cfg;
    int n = tr_model_num_layers(eng->model);
    eng->plan.stages = c->pipeline.stages > 1 ? (int)c->pipeline.stages : 1;
    eng->plan.replicas = eng->plan.world;
    eng->plan.replica = eng->plan.rank;
    eng->plan.stage = -1;
    eng->plan.stage_first = 0;
    eng->plan.stage_last = n - 1;
    eng->plan.own_lo = 0;
    eng->plan.own_hi = eng->plan.n_params;
    if (eng->plan.stages == 1) return 0;
    if (eng->plan.world > 1) { /* a multiple of the stages: the config's resolution checked it */
        eng->plan.replicas = eng->plan.world / eng->plan.stages;
        eng->plan.replica = eng->plan.rank % eng->plan.replicas;
    }
    if (eng->plan.stages > n)
        return tr__errf(err, errlen, TR_ECONFIG,
                        "%s: pipeline.stages %d: the model has %d layers, and each "
                        "stage needs one",
                        c->source, eng->plan.stages, n);
    if (eng->plan.world > 1) {
        int rc = own_stage(eng, err, errlen);
        if (rc < 0) return rc;
    }
    if (eng->plan.GAS > TR__MAX_PREFETCH)
        return tr__errf(err, errlen, TR_ECONFIG,
                        "%s: gradient_accumulation_steps %d: a pipelined step takes "
                        "at most %d micro-batches",
                        c->source, eng->plan.GAS, TR__MAX_PREFETCH);
    if (eng->plan.prefetch < eng->plan.GAS) {
        tr_log(TR_LOG_INFO,
               "pipeline: troupe.data.prefetch raised from %d to %d "
               "(gradient_accumulation_steps: a step's micro-batches enter the pipeline "
               "together)",
               eng->plan.prefetch, eng->plan.GAS);
        eng->plan.prefetch = eng->plan.GAS;
    }
    return 0;
}

/* pipeline.activation_checkpoint_interval: the model keeps each group's output and recomputes
 * the group's forward in the backward. */
static int set_checkpointing(tr_engine_t *eng, char *err, size_t errlen)
{
    const tr__plan_t *p = &eng->plan;
    const tr_config_t *c = eng->cfg;
    int64_t k = c->pipeline.activation_checkpoint_interval;
    if (k <= 0) return 0;
    (void)err;
    (void)errlen;
    if (p->stages > 1) { /* each stage counts its groups from its first layer */
        tr_model_set_checkpoint_interval(eng->model, (int)(k < 1 << 30 ? k : 1 << 30));
        if (p->rank == 0)
            tr_log(TR_LOG_INFO,
                   "activation checkpointing every %lld layers of each pipeline "
                   "stage: a slot keeps each group's output, the backward recomputes the group",
                   (long long)k);
        return 0;
    }
    int n = tr_model_num_layers(eng->model);
    size_t full = tr_model_acts_floats(eng->model, p->B, p->T);
    tr_model_set_checkpoint_interval(eng->model, k < n ? (int)k : n);
    size_t kept = tr_model_acts_floats(eng->model, p->B, p->T);
    if (p->rank == 0)
        tr_log(TR_LOG_INFO,
               "activation checkpointing every %lld layers: activations %.1f MiB "
               "instead of %.1f MiB (B %d, T %d); the backward runs the forward of %zu of %d "
               "layers again",
               (long long)k, (double)kept * 4 / 1048576.0, (double)full * 4 / 1048576.0, p->B, p->T,
               tr_model_checkpoint_recomputed(eng->model), n);
    return 0;
}

/* The ZeRO stage in effect and overlap_comm; the combinations DeepSpeed refuses, refused in
 * its words (at any world size: a config that runs on one rank runs on N). */
static int check_zero(tr_engine_t *eng, char *err, size_t errlen)
{
    const tr_config_t *c = eng->cfg;
    eng->plan.zero = eng->plan.world > 1 ? (int)c->zero.stage : 0;
    eng->plan.overlap_comm = c->zero.overlap_comm;
    if (c->zero.stage >= 2 && c->zero.reduce_scatter && c->gradient_predivide_factor != 1.0)
        return tr__errf(err, errlen, TR_ECONFIG,
                        "%s: gradient_predivide_factor %g: != 1.0 is not yet "
                        "supported with ZeRO-%lld with reduce scatter enabled (DeepSpeed's rule; "
                        "set zero_optimization.reduce_scatter false, or the factor to 1)",
                        c->source, c->gradient_predivide_factor, (long long)c->zero.stage);
    if (c->zero.stage >= 2 && c->zero.reduce_scatter && c->prescale_gradients)
        return tr__errf(err, errlen, TR_ECONFIG,
                        "%s: prescale_gradients: pre-scale gradients is not yet "
                        "supported with ZeRO-%lld with reduce scatter enabled (DeepSpeed's rule; "
                        "set zero_optimization.reduce_scatter false, or prescale_gradients "
                        "false)",
                        c->source, (long long)c->zero.stage);
    return 0;
}

/* bf16 mixed precision: the model's products on bf16 copies of its weights (made again after
 * every step, actors/exec/executor.c); said once per process where the CPU only emulates
 * them. */
static int set_precision(tr_engine_t *eng, char *err, size_t errlen)
{
    static atomic_flag warned = ATOMIC_FLAG_INIT;
    int on = eng->cfg->bf16.enabled;
    if (tr_model_set_bf16(eng->model, on) < 0)
        return tr__errf(err, errlen, TR_ENOMEM,
                        "%s: bf16.enabled: no memory for the weights' bf16 copies",
                        eng->cfg->source);
    if (on && !tr_bf16_native() && !atomic_flag_test_and_set(&warned))
        tr_log(TR_LOG_WARN,
               "bf16.enabled: this CPU has no AVX512-BF16, so the bf16 matrix "
               "products are emulated (bf16 values multiplied in fp32): bf16's numerics, a little "
               "slower than fp32");
    return 0;
}

/* What the optimizer keeps, fixed here so that every actor reads it from the plan: its moment
 * arrays, whether they live in the swapper's file, and its slice of the flat parameters
 * (ZeRO >= 1 on several ranks: this rank's partition, DeepSpeed's way; otherwise the whole,
 * identical on every rank; without an "optimizer" section there is no state to cut). */
static void set_optimizer_plan(tr__plan_t *p)
{
    const tr_config_t *c = p->cfg;
    p->n_arrays = tr__optimizer_array_names(c, p->array_names, 3);
    p->swaps = c->zero.offload_optimizer.device == TR_OFFLOAD_NVME && p->n_arrays > 0;
    p->optim_slice = (tr__optim_slice_t){0, p->n_params, false};
    if (p->stage >= 0 && c->optimizer.type != TR_OPTIMIZER_NONE) {
        /* a pipeline across ranks: the stage's range, cut at ZeRO 1 among its replicas; the
         * ranks' slices tile the model when they are disjoint (one replica, or ZeRO 1) */
        size_t n = p->own_hi - p->own_lo, lo = 0, hi = n;
        if (p->zero >= 1) tr__zero_owned(n, p->replicas, p->replica, &lo, &hi);
        p->optim_slice =
            (tr__optim_slice_t){p->own_lo + lo, p->own_lo + hi, p->zero >= 1 || p->replicas == 1};
        return;
    }
    if (p->zero < 1 || c->optimizer.type == TR_OPTIMIZER_NONE) return;
    tr__zero_owned(p->n_params, p->world, p->rank, &p->optim_slice.lo, &p->optim_slice.hi);
    p->optim_slice.partitioned = true;
}

/* zero_optimization.offload_param at stage 3: where this rank's partition lives. On one rank
 * ZeRO partitions nothing, so the parameters stay in memory (said once). On NVMe the optimizer
 * steps them sub-group by sub-group beside its own swapped state, so that must be swapped too. */
static int set_param_offload(tr__plan_t *p, char *err, size_t errlen)
{
    const tr_config_t *c = p->cfg;
    int device = c->zero.offload_param.device;
    p->param_offload = TR_OFFLOAD_NONE;
    if (device == TR_OFFLOAD_NONE || c->zero.stage != 3) return 0; /* the config warned */
    if (p->world == 1) {
        tr_log(TR_LOG_WARN,
               "%s: zero_optimization.offload_param: on one rank ZeRO partitions nothing, so the "
               "parameters stay in memory; it takes effect from 2 ranks",
               c->source);
        return 0;
    }
    if (device == TR_OFFLOAD_NVME && !p->swaps && c->optimizer.type != TR_OPTIMIZER_NONE)
        return tr__errf(err, errlen, TR_ECONFIG,
                        "%s: zero_optimization.offload_param.device is \"nvme\", which needs "
                        "the optimizer's state on NVMe too (offload_optimizer.device \"nvme\", "
                        "and an optimizer that keeps state): the step updates the swapped "
                        "parameters sub-group by sub-group as it swaps its state; offload_param "
                        "\"cpu\" works with any optimizer",
                        c->source);
    p->param_offload = device;
    p->swap_grads = device == TR_OFFLOAD_NVME && p->swaps && p->GAS == 1;
    if (device == TR_OFFLOAD_NVME && p->swaps && p->GAS > 1 && p->rank == 0)
        tr_log(TR_LOG_INFO,
               "%s: offload_param nvme with gradient_accumulation_steps %d: the reduced gradient "
               "partition stays in memory, where the micro-steps add into it (with one "
               "micro-step per step it goes to the swap files)",
               c->source, p->GAS);
    return 0;
}

int tr__setup_shapes(tr_engine_t *eng, const tr_engine_opts_t *o, char *err, size_t errlen)
{
    const tr_config_t *c = eng->cfg;
    eng->plan.B = (int)c->train_micro_batch_size_per_gpu;
    eng->plan.GAS = (int)c->gradient_accumulation_steps;
    eng->plan.T = o->seq_len > 0 ? o->seq_len : 1;
    eng->plan.x_dim = tr_model_layer(eng->model, 0)->in_dim;
    int targets = tr_model_targets(eng->model, &eng->plan.y_dim);
    eng->plan.prefetch = (int)c->troupe.data.prefetch;
    if (targets == TR_TARGETS_NONE)
        return tr__errf(err, errlen, TR_EINVAL,
                        "engine: the model's last layer '%s' is not a loss layer "
                        "(tr_layer_set_loss)",
                        tr_model_layer(eng->model, tr_model_num_layers(eng->model) - 1)->name);
    int rc = check_zero(eng, err, errlen);
    if (rc == 0) rc = check_pipeline(eng, err, errlen);
    if (rc == 0) rc = set_checkpointing(eng, err, errlen);
    if (rc < 0) return rc;
    if (eng->plan.prefetch < 1 || eng->plan.prefetch > TR__MAX_PREFETCH)
        return tr__errf(err, errlen, TR_ECONFIG,
                        "%s: troupe.data.prefetch: must be 1 to %d, got %d", c->source,
                        TR__MAX_PREFETCH, eng->plan.prefetch);
    /* before the first big allocation (the bf16 copies, the parameters' initialisation, the
     * actors), with rank 0's figures (the largest partition) so that every rank refuses alike */
    bool training = o->train.shards || o->train.batch;
    rc = tr__memory_check(c, eng->model, eng->plan.B, eng->plan.T, 0, training, err, errlen);
    if (rc < 0) return rc;
    if ((rc = set_precision(eng, err, errlen)) < 0) return rc;
    const tr_gpt2_config_t *g = tr_model_gpt2_config(eng->model);
    if (g && eng->plan.T > g->max_seq_len)
        return tr__errf(err, errlen, TR_EINVAL, "seq_len %d: the model's context is %d positions",
                        eng->plan.T, g->max_seq_len);
    if (c->fp16.enabled)
        eng->plan.loss_scale0 = c->fp16.loss_scale > 0
                                    ? c->fp16.loss_scale
                                    : (double)(1ull << c->fp16.initial_scale_power);
    else
        eng->plan.loss_scale0 = 1.0;
    set_optimizer_plan(&eng->plan);
    if ((rc = set_param_offload(&eng->plan, err, errlen)) < 0) return rc;
    eng->plan.grad_window =
        eng->plan.zero >= 2
            ? tr__grad_window(eng->model, c->zero.reduce_bucket_size, c->zero.overlap_comm)
            : 0;
    return check_widths(eng, o, err, errlen);
}
