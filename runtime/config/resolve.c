/* resolve.c: the rules that span keys, applied after the walk. The batch triple is
 * resolved exactly as DeepSpeed's DeepSpeedConfig._set_batch_related_parameters and checked
 * as _batch_assertion, with DeepSpeed's own wording; then precision (fp16 and bf16 exclude each
 * other; communication_data_type follows the precision), ZeRO's stage-dependent default of
 * overlap_comm, and the offload settings that need each other. */
#include "runtime/config/walk.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static const char *const batch_names[3] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                           "gradient_accumulation_steps"};

static bool given_in_file(tr__cfg_walk_t *w, const char *path)
{
    return json_object_get(w->origins, path) == NULL;
}

/* --- the batch triple -------------------------------------------------------------------- */

/* DeepSpeed's derivation; has[] says which of TB, MB, GAS are known. Every known value is
 * positive here, so C's division is Python's floor division. -1 when neither TB nor MB is
 * known; -2 when a product overflows. */
static int derive(int64_t b[3], const bool has[3], int64_t world)
{
    int64_t p;
    if (has[TR__TB] && has[TR__MB] && has[TR__GAS]) return 0;
    if (has[TR__TB] && has[TR__MB]) {
        b[TR__GAS] = (b[TR__TB] / b[TR__MB]) / world;
    } else if (has[TR__TB] && has[TR__GAS]) {
        b[TR__MB] = (b[TR__TB] / world) / b[TR__GAS];
    } else if (has[TR__MB] && has[TR__GAS]) {
        if (__builtin_mul_overflow(b[TR__MB], b[TR__GAS], &p) ||
            __builtin_mul_overflow(p, world, &b[TR__TB]))
            return -2;
    } else if (has[TR__TB]) {
        b[TR__GAS] = 1;
        b[TR__MB] = b[TR__TB] / world;
    } else if (has[TR__MB]) {
        if (__builtin_mul_overflow(b[TR__MB], world, &b[TR__TB])) return -2;
        b[TR__GAS] = 1;
    } else {
        return -1;
    }
    return 0;
}

/* "auto" is resolved only when the other two are given; otherwise say what to write. */
static bool batch_autos_ok(tr__cfg_walk_t *w)
{
    bool ok = true;
    for (int i = 0; i < 3; i++) {
        if (w->batch_state[i] != TR__BATCH_AUTO) continue;
        int others = 0;
        for (int j = 0; j < 3; j++)
            others += j != i && w->batch_state[j] == TR__BATCH_GIVEN;
        if (others == 2) continue;
        int64_t b[3] = {w->batch[0], w->batch[1], w->batch[2]};
        bool has[3];
        for (int j = 0; j < 3; j++)
            has[j] = w->batch_state[j] == TR__BATCH_GIVEN && b[j] > 0;
        if (derive(b, has, w->cfg->world_size) == 0 && b[i] > 0)
            tr__cfg_error(w, batch_names[i],
                          "\"auto\" can be resolved only when the other two "
                          "batch sizes are given; write %lld (what DeepSpeed derives from the "
                          "keys given and world size %lld)",
                          (long long)b[i], (long long)w->cfg->world_size);
        else
            tr__cfg_error(w, batch_names[i],
                          "\"auto\" can be resolved only when the other two "
                          "batch sizes are given; write a positive integer");
        ok = false;
    }
    return ok;
}

static bool batch_positive(tr__cfg_walk_t *w, const int64_t b[3])
{
    static const char *const what[3] = {"Train batch size", "Micro batch size per gpu",
                                        "Gradient accumulation steps"};
    bool ok = true;
    for (int i = 0; i < 3; i++)
        if (b[i] <= 0) {
            tr__cfg_error(w, batch_names[i], "%s: %lld has to be greater than 0", what[i],
                          (long long)b[i]);
            ok = false;
        }
    return ok;
}

/* The engine holds the micro-batch and the accumulation steps as C ints: a larger value is
 * an error, never a truncation. */
static bool batch_fits(tr__cfg_walk_t *w, const int64_t b[3])
{
    bool ok = true;
    for (int i = TR__MB; i <= TR__GAS; i++)
        if ((double)b[i] > TR__CFG_INT_MAX) {
            tr__cfg_error(w, batch_names[i], "%lld%s does not fit: the engine's limit is %.0f",
                          (long long)b[i], w->batch_state[i] == TR__BATCH_GIVEN ? "" : " (derived)",
                          TR__CFG_INT_MAX);
            ok = false;
        }
    return ok;
}

static void batch_store(tr__cfg_walk_t *w, const int64_t b[3])
{
    int64_t *f[3] = {&w->cfg->train_batch_size, &w->cfg->train_micro_batch_size_per_gpu,
                     &w->cfg->gradient_accumulation_steps};
    for (int i = 0; i < 3; i++) {
        *f[i] = b[i];
        tr__cfg_tree_set(w, batch_names[i], json_integer(b[i]));
        if (w->batch_state[i] == TR__BATCH_AUTO)
            tr__cfg_set_origin(w, batch_names[i], "auto");
        else if (w->batch_state[i] != TR__BATCH_GIVEN)
            tr__cfg_set_origin(w, batch_names[i], "derived");
    }
}

static void resolve_batch(tr__cfg_walk_t *w)
{
    int64_t b[3] = {w->batch[0], w->batch[1], w->batch[2]};
    bool has[3], bad = false;
    for (int i = 0; i < 3; i++) {
        has[i] = w->batch_state[i] == TR__BATCH_GIVEN;
        bad |= w->batch_state[i] == TR__BATCH_BAD;
    }
    if (!batch_autos_ok(w) || bad) return;
    if (!has[TR__TB] && !has[TR__MB] && w->batch_state[TR__TB] != TR__BATCH_AUTO &&
        w->batch_state[TR__MB] != TR__BATCH_AUTO) {
        tr__cfg_error(w, "",
                      "Either train_batch_size or train_micro_batch_size_per_gpu needs to "
                      "be provided");
        return;
    }
    for (int i = 0; i < 3; i++) /* DeepSpeed would divide by these: check them first */
        if (has[i] && b[i] <= 0) return (void)batch_positive(w, b);
    if (derive(b, has, w->cfg->world_size) == -2) {
        tr__cfg_error(w, "train_batch_size",
                      "train_micro_batch_size_per_gpu * "
                      "gradient_accumulation_steps * world_size does not fit in 64 bits");
        return;
    }
    if (!batch_positive(w, b) || !batch_fits(w, b)) return;
    int64_t p;
    if (__builtin_mul_overflow(b[TR__MB], b[TR__GAS], &p) ||
        __builtin_mul_overflow(p, w->cfg->world_size, &p) || p != b[TR__TB])
        tr__cfg_error(w, "",
                      "Check batch related parameters. train_batch_size is not equal to "
                      "micro_batch_per_gpu * gradient_acc_step * world_size %lld != %lld * %lld "
                      "* %lld",
                      (long long)b[0], (long long)b[1], (long long)b[2],
                      (long long)w->cfg->world_size);
    batch_store(w, b);
}

/* --- precision, ZeRO, offload ------------------------------------------------------------ */

/* DeepSpeedFP16Config._validate_dynamic_loss_scale_params, in its words; our loss scaler also
 * needs hysteresis >= 1 (DeepSpeed's would never shrink the scale below 1). */
static void resolve_fp16(tr__cfg_walk_t *w)
{
    const tr_config_fp16_t *f = &w->cfg->fp16;
    if (!f->enabled || f->loss_scale != 0) return;
    if (f->loss_scale_window <= 0)
        tr__cfg_error(w, "fp16.loss_scale_window",
                      "fp16.loss_scale_window must be > 0 when "
                      "dynamic loss scaling is enabled (loss_scale=0)");
    if (!(f->min_loss_scale > 0))
        tr__cfg_error(w, "fp16.min_loss_scale",
                      "fp16.min_loss_scale must be > 0 when dynamic "
                      "loss scaling is enabled (loss_scale=0)");
    if (f->hysteresis < 1)
        tr__cfg_error(w, "fp16.hysteresis",
                      "must be >= 1 when dynamic loss scaling is enabled "
                      "(loss_scale=0), got %lld",
                      (long long)f->hysteresis);
}

static void resolve_precision(tr__cfg_walk_t *w)
{
    tr_config_t *c = w->cfg;
    if (c->fp16.enabled && c->bf16.enabled)
        tr__cfg_error(w, "bf16",
                      "bfloat16 and fp16 modes cannot be simultaneously enabled "
                      "(fp16.enabled and bf16.enabled are both true)");
    resolve_fp16(w);
    static const char *const names[] = {"fp32", "fp16", "bf16"}; /* by tr_dtype_t */
    if (c->data_types.grad_accum_dtype != TR_DTYPE_F32)
        tr__cfg_error(w, "data_types.grad_accum_dtype",
                      "Troupe accumulates gradients in fp32 only, got \"%s\" (remove the key or "
                      "set \"fp32\")",
                      names[c->data_types.grad_accum_dtype]);
    if (given_in_file(w, "communication_data_type")) return;
    c->communication_data_type = c->fp16.enabled   ? TR_DTYPE_F16
                                 : c->bf16.enabled ? TR_DTYPE_BF16
                                                   : TR_DTYPE_F32;
    tr__cfg_tree_set(w, "communication_data_type", json_string(names[c->communication_data_type]));
    tr__cfg_set_origin(w, "communication_data_type", "derived");
}

static void check_nvme(tr__cfg_walk_t *w, const char *path, int device, const char *nvme_path)
{
    if (device == TR_OFFLOAD_NVME && (!nvme_path || !nvme_path[0]))
        tr__cfg_error(w, path, "device is \"nvme\", so nvme_path must name a folder");
}

static void resolve_zero(tr__cfg_walk_t *w)
{
    tr_config_zero_t *z = &w->cfg->zero;
    if (!given_in_file(w, "zero_optimization.overlap_comm")) {
        z->overlap_comm = z->stage == 3; /* DeepSpeed: off for stages 0-2, on for 3 */
        tr__cfg_tree_set(w, "zero_optimization.overlap_comm", json_boolean(z->overlap_comm));
    }
    if (z->reduce_bucket_size > 0 && z->reduce_bucket_size < TR_CONFIG_BUCKET_MIN) {
        tr__cfg_warn(w, "zero_optimization.reduce_bucket_size",
                     "%lld is below the floor of %d elements: buckets of %d elements are used "
                     "(one reduction per handful of elements costs more than it reduces)",
                     (long long)z->reduce_bucket_size, TR_CONFIG_BUCKET_MIN, TR_CONFIG_BUCKET_MIN);
        z->reduce_bucket_size = TR_CONFIG_BUCKET_MIN;
        tr__cfg_tree_set(w, "zero_optimization.reduce_bucket_size",
                         json_integer(TR_CONFIG_BUCKET_MIN));
    }
    check_nvme(w, "zero_optimization.offload_optimizer", z->offload_optimizer.device,
               z->offload_optimizer.nvme_path);
    check_nvme(w, "zero_optimization.offload_param", z->offload_param.device,
               z->offload_param.nvme_path);
    if (z->offload_optimizer.ratio < 1.0 && z->stage != 3)
        tr__cfg_error(w, "zero_optimization.offload_optimizer.ratio",
                      "Partial offloading only supported for ZeRO Stage 3.");
    if (w->cfg->fp16.fp16_master_weights_and_grads && z->stage == 0)
        tr__cfg_error(
            w, "fp16.fp16_master_weights_and_grads",
            "Fp16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3.");
    const char *sched = w->cfg->pipeline.schedule;
    if (sched && strcmp(sched, "1f1b") && strcmp(sched, "zb"))
        tr__cfg_error(w, "pipeline.schedule", "expected \"1f1b\" or \"zb\", got \"%s\"", sched);
    if (w->cfg->pipeline.stages > 1 && z->stage >= 2)
        tr__cfg_error(w, "zero_optimization.stage",
                      "ZeRO-2 and ZeRO-3 are incompatible with "
                      "pipeline parallelism (pipeline.stages %lld)",
                      (long long)w->cfg->pipeline.stages);
    if (z->offload_optimizer.device == TR_OFFLOAD_CPU && !z->offload_optimizer.pin_memory)
        tr__cfg_warn(w, "zero_optimization.offload_optimizer",
                     "device \"cpu\" without "
                     "pin_memory changes nothing: the optimizer runs on the CPU and its state is "
                     "in host memory already (pin_memory true locks it there)");
    if (z->offload_param.device != TR_OFFLOAD_NONE && z->stage != 3)
        tr__cfg_warn(w, "zero_optimization.offload_param",
                     "has no effect at stage %lld; "
                     "parameters are offloaded only at stage 3",
                     (long long)z->stage);
}

/* --- optimizer ------------------------------------------------------------------------- */

int tr_config_optimizer_runs_as(int type)
{
    switch (type) {
    case TR_OPTIMIZER_ONEBIT_ADAM:
    case TR_OPTIMIZER_ZERO_ONE_ADAM:
        return TR_OPTIMIZER_ADAM;
    case TR_OPTIMIZER_ONEBIT_LAMB:
        return TR_OPTIMIZER_LAMB;
    default:
        return type;
    }
}

/* The compressed-communication optimizers: DeepSpeed's engine refuses them with ZeRO (its
 * assertion texts); without ZeRO they run as their base optimizer, said in a warning. */
static void resolve_optimizer(tr__cfg_walk_t *w)
{
    static const char *const refusal[] = {"1bit-Adam is not compatible with ZeRO",
                                          "0/1 Adam is not compatible with ZeRO",
                                          "1bit-Lamb is not compatible with ZeRO"};
    static const char *const names[] = {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"};
    int t = w->cfg->optimizer.type;
    if (t < TR_OPTIMIZER_ONEBIT_ADAM || t > TR_OPTIMIZER_ONEBIT_LAMB) return;
    int i = t - TR_OPTIMIZER_ONEBIT_ADAM;
    if (w->cfg->zero.stage > 0)
        tr__cfg_error(w, "optimizer.type", "%s (zero_optimization.stage is %lld)", refusal[i],
                      (long long)w->cfg->zero.stage);
    else
        tr__cfg_warn(w, "optimizer.type",
                     "%s runs as %s: its compressed communication needs "
                     "world size > 1 and is not built yet",
                     names[i], t == TR_OPTIMIZER_ONEBIT_LAMB ? "Lamb" : "Adam");
}

/* A pipeline across ranks: DeepSpeed's batch counts the data-parallel replicas, not the ranks
 * (a replica's stages share its micro-batches). */
static void resolve_pipeline_world(tr__cfg_walk_t *w)
{
    int64_t S = w->cfg->pipeline.stages, n = w->cfg->ranks;
    if (S <= 1 || n <= 1) return;
    if (n % S)
        tr__cfg_error(w, "pipeline.stages",
                      "%lld stages on %lld ranks: the ranks must be a "
                      "multiple of the stages (one rank per stage of each data-parallel "
                      "replica)",
                      (long long)S, (long long)n);
    else
        w->cfg->world_size = n / S;
}

void tr__cfg_resolve(tr__cfg_walk_t *w)
{
    resolve_pipeline_world(w);
    resolve_batch(w);
    resolve_precision(w);
    resolve_zero(w);
    resolve_optimizer(w);
}
