/* schema.c: the one table of DeepSpeed's configuration as Troupe reads it. Each
 * section lists its keys with kind, field in tr_config_t, default and range; the walker in
 * config.c, the did-you-mean hints, the dump and docs/config.md all follow this table.
 * Defaults are DeepSpeed's documented ones (docs "config-json", runtime/config.py,
 * runtime/zero/config.py, runtime/lr_schedules.py); the "troupe" section is our own. */
#include "runtime/config/schema.h"

#include <float.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define OFF(f)                   offsetof(tr_config_t, f)
#define FIELD_(f)                #f
#define FIELD(f)                 FIELD_(f) /* f macro-expanded: OP(lr) is optimizer.params.lr */
#define N(a)                     (sizeof(a) / sizeof((a)[0]))
#define BIG                      9.2233720368547758e18 /* int64: no bound but the type's */
#define INF                      DBL_MAX               /* double: no bound but the type's */
#define IMAX                     TR__CFG_INT_MAX
#define SECTION(var, path, keys) static const tr__cfg_section_t var = {path, keys, N(keys)}

/* Leaf keys: a designator list that a state wrapper, ACT or NOEFF, turns into an entry, so a
 * leaf without a state does not compile. */
#define BOOL(n, f, d, doc_)                                                                        \
    .name = n, .kind = TR__K_BOOL, .offset = OFF(f), .field = FIELD(f), .def = d, .doc = doc_
#define INT(n, f, d, lo, hi, doc_)                                                                 \
    .name = n, .kind = TR__K_INT, .offset = OFF(f), .field = FIELD(f), .def = d, .min = lo,        \
    .max = hi, .doc = doc_
#define INTF(n, f, d, lo, hi, fl, doc_)                                                            \
    .name = n, .kind = TR__K_INT, .offset = OFF(f), .field = FIELD(f), .def = d, .min = lo,        \
    .max = hi, .flags = fl, .doc = doc_
#define DBL(n, f, d, lo, hi, doc_)                                                                 \
    .name = n, .kind = TR__K_DOUBLE, .offset = OFF(f), .field = FIELD(f), .def = d, .min = lo,     \
    .max = hi, .doc = doc_
#define DBLF(n, f, d, lo, hi, fl, doc_)                                                            \
    .name = n, .kind = TR__K_DOUBLE, .offset = OFF(f), .field = FIELD(f), .def = d, .min = lo,     \
    .max = hi, .flags = fl, .doc = doc_
#define STR(n, f, d, fl, doc_)                                                                     \
    .name = n, .kind = TR__K_STRING, .offset = OFF(f), .field = FIELD(f), .def_str = d,            \
    .flags = fl, .doc = doc_
#define ENUM(n, f, d, ch, fl, doc_)                                                                \
    .name = n, .kind = TR__K_ENUM, .offset = OFF(f), .field = FIELD(f), .def = d, .choices = ch,   \
    .flags = fl, .doc = doc_
#define PAIR(n, f, a, b, lo, hi, doc_)                                                             \
    .name = n, .kind = TR__K_PAIR, .offset = OFF(f), .field = FIELD(f), .def = a, .def2 = b,       \
    .min = lo, .max = hi, .doc = doc_
#define ACT(...)                                                                                   \
    {                                                                                              \
        __VA_ARGS__, .state = TR__S_ACTED                                                          \
    }
#define NOEFF(why_, ...)                                                                           \
    {                                                                                              \
        __VA_ARGS__, .state = TR__S_INERT, .why = why_                                             \
    }

/* Containers, aliases, and keys whose kind is their state. */
#define SECT(n, s, fl, doc_)                                                                       \
    {                                                                                              \
        .name = n, .kind = TR__K_SECTION, .sub = &s, .flags = fl, .doc = doc_                      \
    }
#define ALIAS(n, to)                                                                               \
    {                                                                                              \
        .name = n, .kind = TR__K_ALIAS, .alias_of = to, .doc = "alias of " to                      \
    }
#define DEPR(n, to)                                                                                \
    {                                                                                              \
        .name = n, .kind = TR__K_ALIAS, .alias_of = to, .flags = TR__F_DEPRECATED,                 \
        .doc = "deprecated name of " to                                                            \
    }
#define IGN(n, doc_)                                                                               \
    {                                                                                              \
        .name = n, .kind = TR__K_IGNORED, .doc = doc_, .state = TR__S_INERT                        \
    }
#define REJ(n, doc_)                                                                               \
    {                                                                                              \
        .name = n, .kind = TR__K_REJECT, .doc = doc_, .state = TR__S_REJECTED                      \
    }

/* Why a key has no effect yet (the warning's words). */
#define W_GATHER "the parameter partitions are all-gathered in place, in one operation"
#define W_OFFLOAD                                                                                  \
    "not built yet: only the optimizer's state is offloaded (offload_optimizer.device nvme)"
#define W_FP32   "the CPU kernels compute in fp32"
#define W_COMM   "nothing is communicated at world size 1"
#define W_CALLER "collectives are started by the comm actor, there is no caller to name"
#define W_GDS    "GPUDirect Storage needs a GPU; the aio engine reads and writes host memory"
#define W_PIPE   "this part of pipeline parallelism is not built yet"
#define W_ACT    "activation checkpointing is not built yet"

static const char *const devices[] = {"none", "cpu", "nvme", NULL};
static const char *const dtypes[] = {"fp32", "fp16", "bf16", NULL};
static const char *const optimizers[] = {"Adam",       "AdamW",       "SGD",        "Lamb", "Lion",
                                         "OneBitAdam", "ZeroOneAdam", "OneBitLamb", NULL};
static const char *const schedulers[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                         "OneCycle", "LRRangeTest",   NULL};
static const char *const warmup_types[] = {"log", "linear", NULL};
static const char *const log_levels[] = {"debug", "info", "warning", "error", "off", NULL};
static const char *const tag_validations[] = {"Ignore", "Warn", "Fail", NULL};

/* --- zero_optimization ------------------------------------------------------------------ */

static const tr__cfg_key_t offload_optimizer_keys[] = {
    ACT(ENUM("device", zero.offload_optimizer.device, 0, devices, TR__F_NULLABLE,
             "where optimizer state lives: none or cpu (host memory), nvme (swap files)")),
    ACT(STR("nvme_path", zero.offload_optimizer.nvme_path, NULL, TR__F_NULLABLE,
            "folder for the swap files, nvme_path/troupe_swap/rank<R>/ (device nvme)")),
    ACT(INT("buffer_count", zero.offload_optimizer.buffer_count, 4, 0, BIG,
            "sub-group swap buffers when pipelined (device nvme); at least 1 + "
            "pipeline_read + pipeline_write")),
    ACT(BOOL("pin_memory", zero.offload_optimizer.pin_memory, 1,
             "page-locked swap buffers (device nvme)")),
    ACT(BOOL("pipeline_read", zero.offload_optimizer.pipeline_read, 0,
             "read the next sub-group while one is stepped (device nvme)")),
    ACT(BOOL("pipeline_write", zero.offload_optimizer.pipeline_write, 0,
             "write a sub-group back while the next is stepped (device nvme)")),
    NOEFF(W_OFFLOAD,
          BOOL("fast_init", zero.offload_optimizer.fast_init, 0, "fast optimizer init with NVMe")),
    NOEFF(W_OFFLOAD, DBL("ratio", zero.offload_optimizer.ratio, 1.0, 0.0, 1.0,
                         "share of state offloaded (stage 3)")),
    IGN("super_offload", "CPU offloading for Superchips"),
    IGN("cpuadam_cores_perc", "CPU Adam's share of the cores (super_offload)"),
};
SECTION(offload_optimizer_sec, "zero_optimization.offload_optimizer", offload_optimizer_keys);

static const tr__cfg_key_t offload_param_keys[] = {
    ACT(ENUM("device", zero.offload_param.device, 0, devices, TR__F_NULLABLE,
             "where this rank's parameter partition lives (stage 3, 2 ranks or more): none (the "
             "parameter buffer), cpu (its own host buffer), nvme (a swap file, "
             "nvme_path/troupe_swap/rank<R>/params.swp; needs offload_optimizer nvme); the "
             "parameter buffer then holds only the gathered layers")),
    ACT(STR("nvme_path", zero.offload_param.nvme_path, NULL, TR__F_NULLABLE,
            "folder for the parameter swap file (device nvme)")),
    ACT(INT("buffer_count", zero.offload_param.buffer_count, 5, 0, BIG,
            "parameter sub-groups the swapper caches (device nvme; 1 to 1024): a forward reads "
            "each once, the backward starts on what the forward left")),
    ACT(INT("buffer_size", zero.offload_param.buffer_size, 1e8, 0, BIG,
            "the most elements swapped at a time (device nvme): the sub-groups are at most this "
            "and sub_group_size")),
    ACT(INT("max_in_cpu", zero.offload_param.max_in_cpu, 1e9, 0, BIG,
            "the most parameter elements the swapper's cache holds (device nvme; at least one "
            "sub-group)")),
    ACT(BOOL("pin_memory", zero.offload_param.pin_memory, 1,
             "page-locked host buffers: the partition (cpu), the cache and the swap buffers "
             "(nvme, without offload_optimizer's)")),
};
SECTION(offload_param_sec, "zero_optimization.offload_param", offload_param_keys);

static const tr__cfg_key_t zero_keys[] = {
    {.name = "stage",
     .kind = TR__K_INT,
     .offset = OFF(zero.stage),
     .field = "zero.stage",
     .def = 0,
     .min = 0,
     .max = 3,
     .expect = "0, 1, 2 or 3",
     .doc = "ZeRO stage: on more than one rank, 1 partitions the optimizer states, 2 the "
            "gradients too (reduce-scattered at every micro-step), 3 the parameters too (each "
            "layer all-gathered by the fetcher when used)",
     .state = TR__S_ACTED},
    NOEFF(
        "buckets are views of the one flat gradient buffer: always contiguous",
        BOOL("contiguous_gradients", zero.contiguous_gradients, 1, "copy gradients to one buffer")),
    ACT(BOOL("reduce_scatter", zero.reduce_scatter, 1,
             "stage 2: reduce-scatter each bucket (else all-reduce it and keep this rank's part)")),
    ACT(INT("reduce_bucket_size", zero.reduce_bucket_size, 5e8, 0, BIG,
            "gradient elements per bucket; 0 = one bucket; 1 to 15 are raised to 16 "
            "(TR_CONFIG_BUCKET_MIN), with a warning")),
    NOEFF(W_GATHER,
          BOOL("allgather_partitions", zero.allgather_partitions, 1, "all-gather, not broadcast")),
    NOEFF(W_GATHER, INT("allgather_bucket_size", zero.allgather_bucket_size, 5e8, 0, BIG,
                        "elements per all-gather")),
    {.name = "overlap_comm",
     .kind = TR__K_BOOL,
     .offset = OFF(zero.overlap_comm),
     .field = "zero.overlap_comm",
     .flags = TR__F_DERIVED,
     .doc = "reduce each bucket while the backward goes on (else after it; default: stage == 3)",
     .state = TR__S_ACTED},
    NOEFF("the master weights are the fp32 parameters themselves",
          BOOL("load_from_fp32_weights", zero.load_from_fp32_weights, 1,
               "initialise fp32 master weights from the checkpoint")),
    NOEFF("a checkpoint is read at any world size (the checkpointer re-partitions)",
          BOOL("elastic_checkpoint", zero.elastic_checkpoint, 0, "checkpoints across world sizes")),
    SECT("offload_optimizer", offload_optimizer_sec, 0, "ZeRO-Offload of optimizer state"),
    SECT("offload_param", offload_param_sec, 0, "ZeRO-Infinity offload of parameters"),
    DEPR("cpu_offload", "offload_optimizer"),
    DEPR("cpu_offload_params", "offload_param"),
    DEPR("cpu_offload_param", "offload_param"),
    ACT(INT("sub_group_size", zero.sub_group_size, 1e9, 0, BIG,
            "elements per optimizer sub-group: the unit swapped with offload_optimizer "
            "device nvme (in memory the partition is stepped in one pass)")),
    ACT(INT("prefetch_bucket_size", zero.prefetch_bucket_size, 5e7, 0, BIG,
            "stage 3: parameter elements the fetcher gathers ahead of the layer running (at "
            "least one layer)")),
    ACT(INT("param_persistence_threshold", zero.param_persistence_threshold, 1e5, 0, BIG,
            "stage 3: a layer with at most this many parameters stays whole on every rank")),
    ACT(INT("model_persistence_threshold", zero.model_persistence_threshold, BIG, 0, BIG,
            "stage 3: at most this many elements stay whole in all")),
    ACT(INT("max_live_parameters", zero.max_live_parameters, 1e9, 0, BIG,
            "stage 3: gathered parameter elements held at once (at least one layer)")),
    ACT(INT("max_reuse_distance", zero.max_reuse_distance, 1e9, 0, BIG,
            "stage 3: a used layer is kept when it is used again within this many elements "
            "of other layers' fetches")),
    NOEFF("a save at stage 3 gathers every layer: the model file always holds the whole "
          "fp32 weights",
          BOOL("gather_16bit_weights_on_model_save", zero.gather_16bit_weights_on_model_save, 0,
               "stage 3: save consolidated 16-bit weights")),
    NOEFF("every layer of a model gives gradients for all its parameters",
          BOOL("ignore_unused_parameters", zero.ignore_unused_parameters, 1,
               "tolerate parameters without gradients")),
    NOEFF(W_OFFLOAD,
          BOOL("round_robin_gradients", zero.round_robin_gradients, 0, "stage 1/2 offload")),
    ALIAS("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
    ALIAS("stage3_param_persistence_threshold", "param_persistence_threshold"),
    ALIAS("stage3_model_persistence_threshold", "model_persistence_threshold"),
    ALIAS("stage3_max_live_parameters", "max_live_parameters"),
    ALIAS("stage3_max_reuse_distance", "max_reuse_distance"),
    ALIAS("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save"),
    DEPR("stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save"),
    IGN("cpu_offload_use_pin_memory", "deprecated; use offload_optimizer.pin_memory"),
    IGN("legacy_stage1", "DeepSpeed's old stage 1 implementation"),
    IGN("use_multi_rank_bucket_allreduce", "a DeepSpeed all-reduce variant"),
    IGN("zero_hpz_partition_size", "ZeRO++ hierarchical partitioning"),
    IGN("zero_quantized_weights", "ZeRO++ quantized weights"),
    IGN("zero_quantized_nontrainable_weights", "ZeRO++ quantized weights"),
    IGN("zero_quantized_gradients", "ZeRO++ quantized gradients"),
    IGN("zeropp_loco_param", "LoCo-ZeRO++"),
    IGN("mics_shard_size", "MiCS sharding"),
    IGN("mics_hierarchical_params_gather", "MiCS sharding"),
    IGN("memory_efficient_linear", "a PyTorch module replacement"),
    IGN("pipeline_loading_checkpoint", "stage 3 checkpoint loading"),
    IGN("override_module_apply", "a PyTorch module hook"),
    IGN("module_granularity_threshold", "stage 3 module fetching"),
    IGN("stage3_module_granularity_threshold", "stage 3 module fetching"),
    IGN("use_all_reduce_for_fetch_params", "stage 3 parameter fetching"),
    IGN("stage3_use_all_reduce_for_fetch_params", "stage 3 parameter fetching"),
    IGN("allgather_sequential", "stage 3 all-gather"),
    IGN("stage3_allgather_sequential", "stage 3 all-gather"),
    IGN("log_trace_cache_warnings", "stage 3 trace cache"),
    IGN("enable_sanity_checks", "DeepSpeed's internal checks"),
    IGN("save_muon_momentum_buffer_in_memory", "the Muon optimizer"),
    IGN("leaf_module", "stage 3 leaf modules"),
    IGN("zenflow", "ZenFlow"),
};
SECTION(zero_sec, "zero_optimization", zero_keys);

/* --- precision -------------------------------------------------------------------------- */

static const tr__cfg_key_t fp16_keys[] = {
    ACT(BOOL("enabled", fp16.enabled, 0, "fp16 mixed precision: loss scaling")),
    NOEFF(W_FP32, BOOL("auto_cast", fp16.auto_cast, 0, "cast inputs to fp16")),
    ACT(DBL("loss_scale", fp16.loss_scale, 0, 0, INF, "static loss scale; 0 = dynamic")),
    ACT(INT("initial_scale_power", fp16.initial_scale_power, 16, 0, 63,
            "dynamic scaling starts at 2^power")),
    ACT(INT("loss_scale_window", fp16.loss_scale_window, 1000, -IMAX - 1, IMAX,
            "the scale doubles at the window + 1st step without overflow, then every window steps, "
            "as in DeepSpeed 0.19 (> 0 when dynamic)")),
    ACT(INT("hysteresis", fp16.hysteresis, 2, -IMAX - 1, IMAX,
            "overflows tolerated before shrinking (>= 1 when dynamic)")),
    ACT(BOOL("consecutive_hysteresis", fp16.consecutive_hysteresis, 0,
             "refill hysteresis after a good step")),
    ACT(DBL("min_loss_scale", fp16.min_loss_scale, 1, -INF, INF,
            "floor of the dynamic scale (> 0 when dynamic)")),
    NOEFF(W_FP32, BOOL("fp16_master_weights_and_grads", fp16.fp16_master_weights_and_grads, 0,
                       "keep master weights in fp16 (ZeRO stage 1, 2 or 3)")),
};
SECTION(fp16_sec, "fp16", fp16_keys);

static const tr__cfg_key_t bf16_keys[] = {
    ACT(BOOL("enabled", bf16.enabled, 0,
             "bf16 mixed precision: fp32 parameters, gradients and optimizer states; the linear "
             "layers' matrix products on bf16 copies of weights and inputs, and attention's on "
             "bf16 operands, accumulated in fp32 (emulated, with a warning, on CPUs without "
             "AVX512-BF16)")),
    ACT(BOOL("immediate_grad_update", bf16.immediate_grad_update, 0,
             "accumulate gradients into fp32 at once; Troupe always does (each layer's backward "
             "adds into the fp32 gradients), so both values act the same")),
    IGN("check_grad_overflow", "bf16 overflow checks"),
    IGN("bf16_master_weights_and_grads", "bf16 master weights (ZeRO)"),
    IGN("bf16_optimizer_states", "bf16 optimizer states (ZeRO)"),
};
SECTION(bf16_sec, "bf16", bf16_keys);

static const tr__cfg_key_t data_types_keys[] = {
    ACT(ENUM("grad_accum_dtype", data_types.grad_accum_dtype, TR_DTYPE_F32, dtypes, TR__F_NOCASE,
             "the gradients' accumulation type across micro-batches: fp32 (Troupe accumulates "
             "in fp32 in every precision; fp16 and bf16 are refused)")),
};
SECTION(data_types_sec, "data_types", data_types_keys);

/* --- optimizer -------------------------------------------------------------------------- */

#define OP(f) optimizer.params.f
#define MAX_GRAD_NORM                                                                              \
    REJ("max_grad_norm", "is not supported as an optimizer parameter; use the top-level "          \
                         "'gradient_clipping' instead")
#define LR ACT(DBL("lr", OP(lr), 1e-3, 0, INF, "learning rate"))
#define WD ACT(DBL("weight_decay", OP(weight_decay), 0, 0, INF, "weight decay"))
#define ADAM_KEYS                                                                                  \
    LR, ACT(PAIR("betas", OP(betas), 0.9, 0.999, 0, 1, "moment decay rates")),                     \
        ACT(DBL("eps", OP(eps), 1e-8, 0, INF, "denominator term")), WD,                            \
        ACT(BOOL("bias_correction", OP(bias_correction), 1, "Adam bias correction")),              \
        ACT(BOOL("adam_w_mode", OP(adam_w_mode), 1, "decoupled weight decay")),                    \
        ACT(BOOL("amsgrad", OP(amsgrad), 0, "AMSGrad: the maximum of v in the denominator")),      \
        NOEFF("Troupe's Adam computes the same maths",                                             \
              BOOL("torch_adam", OP(torch_adam), 0, "PyTorch's Adam")),                            \
        MAX_GRAD_NORM
#define LAMB_KEYS                                                                                  \
    LR, ACT(PAIR("betas", OP(betas), 0.9, 0.999, 0, 1, "moment decay rates")),                     \
        ACT(DBL("eps", OP(eps), 1e-8, 0, INF, "denominator term")), WD,                            \
        ACT(BOOL("bias_correction", OP(bias_correction), 1, "bias correction")),                   \
        ACT(DBL("max_coeff", OP(max_coeff), 10.0, 0, INF, "trust ratio ceiling")),                 \
        ACT(DBL("min_coeff", OP(min_coeff), 0.01, 0, INF, "trust ratio floor")),                   \
        ACT(BOOL("eps_inside_sqrt", OP(eps_inside_sqrt), 0, "eps under the root")), MAX_GRAD_NORM
#define ONEBIT_KEYS                                                                                \
    IGN("freeze_step", "1-bit compression warm-up"),                                               \
        IGN("cuda_aware", "1-bit compression over CUDA-aware MPI"),                                \
        IGN("comm_backend_name", "1-bit compression backend")

static const tr__cfg_key_t adam_keys[] = {ADAM_KEYS};
SECTION(adam_sec, "optimizer.params", adam_keys);
static const tr__cfg_key_t adamw_keys[] = {ADAM_KEYS};
SECTION(adamw_sec, "optimizer.params", adamw_keys);

static const tr__cfg_key_t sgd_keys[] = {
    LR,
    ACT(DBL("momentum", OP(momentum), 0, 0, INF, "momentum factor")),
    ACT(DBL("dampening", OP(dampening), 0, 0, INF, "momentum dampening")),
    WD,
    ACT(BOOL("nesterov", OP(nesterov), 0, "Nesterov momentum")),
    MAX_GRAD_NORM,
};
SECTION(sgd_sec, "optimizer.params", sgd_keys);

static const tr__cfg_key_t lamb_keys[] = {LAMB_KEYS};
SECTION(lamb_sec, "optimizer.params", lamb_keys);

static const tr__cfg_key_t lion_keys[] = {
    LR,
    ACT(PAIR("betas", OP(betas), 0.9, 0.999, 0, 1, "update and moment decay rates")),
    WD,
    MAX_GRAD_NORM,
};
SECTION(lion_sec, "optimizer.params", lion_keys);

static const tr__cfg_key_t onebit_adam_keys[] = {ADAM_KEYS, ONEBIT_KEYS};
SECTION(onebit_adam_sec, "optimizer.params", onebit_adam_keys);
static const tr__cfg_key_t zero_one_adam_keys[] = {
    ADAM_KEYS,
    IGN("var_freeze_step", "0/1 Adam's variance freezing"),
    IGN("var_update_scaler", "0/1 Adam's variance updates"),
    IGN("local_step_scaler", "0/1 Adam's local steps"),
    IGN("local_step_clipper", "0/1 Adam's local steps"),
    IGN("cuda_aware", "1-bit compression over CUDA-aware MPI"),
    IGN("comm_backend_name", "1-bit compression backend"),
};
SECTION(zero_one_adam_sec, "optimizer.params", zero_one_adam_keys);
static const tr__cfg_key_t onebit_lamb_keys[] = {
    LAMB_KEYS,
    ONEBIT_KEYS,
    IGN("coeff_beta", "1-bit Lamb's scaling coefficient"),
    IGN("factor_max", "1-bit Lamb's scaling factor"),
    IGN("factor_min", "1-bit Lamb's scaling factor"),
    IGN("factor_threshold", "1-bit Lamb's scaling factor"),
};
SECTION(onebit_lamb_sec, "optimizer.params", onebit_lamb_keys);

static const tr__cfg_section_t *const optimizer_variants[] = {
    NULL,      &adam_sec,        &adamw_sec,         &sgd_sec,         &lamb_sec,
    &lion_sec, &onebit_adam_sec, &zero_one_adam_sec, &onebit_lamb_sec, NULL};

static const tr__cfg_key_t optimizer_keys[] = {
    ACT(ENUM("type", optimizer.type, 0, optimizers, TR__F_REQUIRED | TR__F_NOCASE | TR__F_ENUM1,
             "Adam, AdamW, SGD, Lamb, Lion; OneBitAdam, ZeroOneAdam, OneBitLamb run as Adam, "
             "Adam, Lamb (any case)")),
    {.name = "params",
     .kind = TR__K_VARIANT,
     .variants = optimizer_variants,
     .variant_of = OFF(optimizer.type),
     .doc = "the chosen optimizer's parameters"},
    IGN("legacy_fusion", "a DeepSpeed kernel choice"),
};
SECTION(optimizer_sec, "optimizer", optimizer_keys);

/* --- scheduler -------------------------------------------------------------------------- */

#define SP(f)        scheduler.params.f
#define WARMUP_STEPS /* DeepSpeed: "warmup_num_steps must be a positive integer, got 0" */         \
    {                                                                                              \
        INT("warmup_num_steps", SP(warmup_num_steps), 1000, 1, BIG, "warmup length"),              \
            .expect = "a positive integer", .state = TR__S_ACTED                                   \
    }
#define WARMUP_KEYS                                                                                \
    ACT(DBL("warmup_min_lr", SP(warmup_min_lr), 0, 0, INF, "learning rate at step 0")),            \
        ACT(DBL("warmup_max_lr", SP(warmup_max_lr), 1e-3, 0, INF, "learning rate after warmup")),  \
        WARMUP_STEPS,                                                                              \
        ACT(ENUM("warmup_type", SP(warmup_type), 0, warmup_types, 0, "log or linear"))
#define LAST_ITER                                                                                  \
    ACT(INT("last_batch_iteration", SP(last_batch_iteration), -1, -1, BIG,                         \
            "resume the schedule: k = k + 1 scheduler steps already taken; -1 = start"))
#define TOTAL_STEPS                                                                                \
    ACT(INTF("total_num_steps", SP(total_num_steps), 0, 1, BIG, TR__F_REQUIRED,                    \
             "steps of the whole run"))

static const tr__cfg_key_t warmup_lr_keys[] = {WARMUP_KEYS, LAST_ITER};
SECTION(warmup_lr_sec, "scheduler.params", warmup_lr_keys);
static const tr__cfg_key_t warmup_decay_keys[] = {TOTAL_STEPS, WARMUP_KEYS, LAST_ITER};
SECTION(warmup_decay_sec, "scheduler.params", warmup_decay_keys);

static const tr__cfg_key_t warmup_cosine_keys[] = {
    TOTAL_STEPS,
    ACT(DBL("warmup_min_ratio", SP(warmup_min_ratio), 0, 0, 1, "start, as a share of lr")),
    WARMUP_STEPS,
    ACT(DBL("cos_min_ratio", SP(cos_min_ratio), 1e-4, 0, 1, "end, as a share of lr")),
    ACT(ENUM("warmup_type", SP(warmup_type), 0, warmup_types, 0, "log or linear")),
    LAST_ITER,
};
SECTION(warmup_cosine_sec, "scheduler.params", warmup_cosine_keys);

static const tr__cfg_key_t one_cycle_keys[] = {
    ACT(DBLF("cycle_min_lr", SP(cycle_min_lr), 0, 0, INF, TR__F_REQUIRED, "lowest lr")),
    ACT(DBLF("cycle_max_lr", SP(cycle_max_lr), 0, 0, INF, TR__F_REQUIRED, "highest lr")),
    ACT(DBL("decay_lr_rate", SP(decay_lr_rate), 0, 0, INF, "decay after the cycle")),
    ACT(INT("cycle_first_step_size", SP(cycle_first_step_size), 2000, 1, BIG, "rising steps")),
    ACT(INTF("cycle_second_step_size", SP(cycle_second_step_size), 0, 1, BIG, TR__F_NULLABLE,
             "falling steps (null = same as first)")),
    ACT(INT("cycle_first_stair_count", SP(cycle_first_stair_count), 0, 0, BIG, "stairs rising")),
    ACT(INTF("cycle_second_stair_count", SP(cycle_second_stair_count), 0, 0, BIG, TR__F_NULLABLE,
             "stairs falling")),
    ACT(INT("decay_step_size", SP(decay_step_size), 0, 0, BIG, "steps per decay")),
    ACT(BOOL("cycle_momentum", SP(cycle_momentum), 1, "cycle momentum inversely to lr")),
    ACT(DBL("cycle_min_mom", SP(cycle_min_mom), 0.8, 0, 1, "lowest momentum")),
    ACT(DBL("cycle_max_mom", SP(cycle_max_mom), 0.9, 0, 1, "highest momentum")),
    ACT(DBL("decay_mom_rate", SP(decay_mom_rate), 0, 0, INF, "momentum decay after the cycle")),
    LAST_ITER,
};
SECTION(one_cycle_sec, "scheduler.params", one_cycle_keys);

static const tr__cfg_key_t lr_range_keys[] = {
    ACT(DBL("lr_range_test_min_lr", SP(lr_range_test_min_lr), 1e-3, 0, INF, "starting lr")),
    ACT(INT("lr_range_test_step_size", SP(lr_range_test_step_size), 2000, 1, BIG,
            "steps per increase")),
    ACT(DBL("lr_range_test_step_rate", SP(lr_range_test_step_rate), 1.0, 0, INF, "increase")),
    ACT(BOOL("lr_range_test_staircase", SP(lr_range_test_staircase), 0, "stairs, not a ramp")),
    LAST_ITER,
};
SECTION(lr_range_sec, "scheduler.params", lr_range_keys);

static const tr__cfg_section_t *const scheduler_variants[] = {
    NULL, &warmup_lr_sec, &warmup_decay_sec, &warmup_cosine_sec, &one_cycle_sec, &lr_range_sec,
    NULL};

static const tr__cfg_key_t scheduler_keys[] = {
    ACT(ENUM("type", scheduler.type, 0, schedulers, TR__F_REQUIRED | TR__F_ENUM1,
             "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or LRRangeTest")),
    {.name = "params",
     .kind = TR__K_VARIANT,
     .variants = scheduler_variants,
     .variant_of = OFF(scheduler.type),
     .doc = "the chosen schedule's parameters"},
};
SECTION(scheduler_sec, "scheduler", scheduler_keys);

/* --- I/O, monitors, pipeline, checkpoints ------------------------------------------------ */

static const tr__cfg_key_t aio_keys[] = {
    ACT(INT("block_size", aio.block_size, 1048576, 512, BIG,
            "bytes per request (a multiple of 512; of the O_DIRECT alignment for direct I/O)")),
    ACT(INT("queue_depth", aio.queue_depth, 8, 1, 65536, "requests in flight")),
    ACT(INT("intra_op_parallelism", aio.intra_op_parallelism, 1, 1, 1024, "I/O threads")),
    DEPR("thread_count", "intra_op_parallelism"),
    ACT(BOOL("single_submit", aio.single_submit, 0, "submit requests one at a time")),
    ACT(BOOL("overlap_events", aio.overlap_events, 1, "overlap submission and completion")),
    NOEFF(W_GDS, BOOL("use_gds", aio.use_gds, 0, "GPUDirect Storage")),
};
SECTION(aio_sec, "aio", aio_keys);

#define MONITOR_KEYS(m)                                                                            \
    ACT(BOOL("enabled", m.enabled, 0, "write this monitor's output")),                             \
        ACT(STR("output_path", m.output_path, "", 0, "output folder")),                            \
        ACT(STR("job_name", m.job_name, "DeepSpeedJobName", 0, "sub-folder name"))
static const tr__cfg_key_t csv_keys[] = {MONITOR_KEYS(csv_monitor)};
SECTION(csv_sec, "csv_monitor", csv_keys);
static const tr__cfg_key_t tensorboard_keys[] = {MONITOR_KEYS(tensorboard)};
SECTION(tensorboard_sec, "tensorboard", tensorboard_keys);

static const tr__cfg_key_t comms_keys[] = {
    ACT(BOOL("enabled", comms_logger.enabled, 0,
             "log collectives (false turns it off; DeepSpeed turns it on when the section is "
             "there): the summary table at the end")),
    ACT(BOOL("verbose", comms_logger.verbose, 0, "a line per collective (rank 0)")),
    ACT(BOOL("prof_all", comms_logger.prof_all, 1, "profile every operation")),
    NOEFF(W_CALLER, BOOL("debug", comms_logger.debug, 0, "add the caller's name")),
    {.name = "prof_ops",
     .kind = TR__K_STRLIST,
     .offset = OFF(comms_logger.prof_ops),
     .field = "comms_logger.prof_ops",
     .doc = "operations to profile when prof_all is false (all_reduce, ...)",
     .state = TR__S_ACTED},
};
SECTION(comms_sec, "comms_logger", comms_keys);

static const tr__cfg_key_t pipeline_keys[] = {
    {.name = "stages",
     .kind = TR__K_INT,
     .offset = OFF(pipeline.stages),
     .field = "pipeline.stages",
     .min = 1,
     .max = TR_CONFIG_MAX_STAGES,
     .flags = TR__F_AUTO_ZERO,
     .expect = "an integer between 1 and " FIELD(TR_CONFIG_MAX_STAGES) " or \"auto\"",
     .doc = "pipeline stages: stage actors in one process, or one rank each under mpirun "
            "(ranks = stages x data-parallel replicas); \"auto\" or 1: none",
     .state = TR__S_ACTED},
    ACT(STR("partition", pipeline.partition, "best", 0,
            "layer partitioning: parameters (= best), uniform, or type:REGEX")),
    ACT(STR("schedule", pipeline.schedule, "1f1b", 0,
            "1f1b (DeepSpeed's) or zb (weight gradients in the bubble; Troupe's)")),
    NOEFF(W_PIPE, BOOL("seed_layers", pipeline.seed_layers, 0, "seed each layer's init")),
    ACT(INT("activation_checkpoint_interval", pipeline.activation_checkpoint_interval, 0, 0, BIG,
            "activation checkpointing: layers per checkpointed group, recomputed in the "
            "backward (also without stages); 0 = none")),
    NOEFF(W_PIPE,
          BOOL("pipe_partitioned", pipeline.pipe_partitioned, 1, "partition activations sent")),
    NOEFF(W_PIPE,
          BOOL("grad_partitioned", pipeline.grad_partitioned, 1, "partition gradients sent")),
};
SECTION(pipeline_sec, "pipeline", pipeline_keys);

#define AC(f) activation_checkpointing.f
static const tr__cfg_key_t act_keys[] = {
    NOEFF(W_ACT,
          BOOL("partition_activations", AC(partition_activations), 0, "split across model ranks")),
    NOEFF(W_ACT, BOOL("contiguous_memory_optimization", AC(contiguous_memory_optimization), 0,
                      "copy checkpoints to one buffer")),
    NOEFF(W_ACT,
          BOOL("cpu_checkpointing", AC(cpu_checkpointing), 0, "keep checkpoints in CPU memory")),
    NOEFF(W_ACT, INTF("number_checkpoints", AC(number_checkpoints), 0, 1, BIG, TR__F_NULLABLE,
                      "checkpoints per pass (null = unknown)")),
    NOEFF(W_ACT, BOOL("synchronize_checkpoint_boundary", AC(synchronize_checkpoint_boundary), 0,
                      "synchronise at each boundary")),
    NOEFF(W_ACT, BOOL("profile", AC(profile), 0, "time forward and backward of checkpoints")),
};
SECTION(act_sec, "activation_checkpointing", act_keys);

static const tr__cfg_key_t parallel_write_keys[] = {
    NOEFF(W_PIPE, BOOL("pipeline_stage", checkpoint.parallel_write_pipeline_stage, 0,
                       "each stage writes its own part")),
};
SECTION(parallel_write_sec, "checkpoint.parallel_write", parallel_write_keys);

/* DeepSpeed's checkpoint writer: "decoupled" writes in the background (here: the
 * checkpointer's snapshot written through the aio engine while training goes on). */
static const tr__cfg_key_t writer_keys[] = {
    ACT(BOOL("decoupled", checkpoint.writer_decoupled, 1,
             "write in the background: a save copies the state and returns; latest moves "
             "once every file is durable (Troupe's default; false: the save returns then)")),
    IGN("type", "the writer's implementation (Troupe has one: the aio engine)"),
    IGN("io_buffer_size", "the fast writer's staging buffer (Troupe writes the whole snapshot)"),
    IGN("io_buffer_double", "double buffering of the fast writer's staging buffer"),
    IGN("show_statistics", "the fast writer's statistics (the trace has the checkpointer's spans)"),
    IGN("data_parallel", "which data-parallel ranks write (every rank writes its own files)"),
    IGN("io_multiplier", "the fast writer's I/O multiplier"),
};
SECTION(writer_sec, "checkpoint.writer", writer_keys);

static const tr__cfg_key_t checkpoint_keys[] = {
    NOEFF("one rank has no other tag to compare with",
          ENUM("tag_validation", checkpoint.tag_validation, 1, tag_validations, TR__F_NOCASE,
               "Ignore, Warn or Fail when ranks disagree on a tag")),
    NOEFF("universal checkpoints are not read yet",
          BOOL("load_universal", checkpoint.load_universal, 0, "load a universal checkpoint")),
    NOEFF("one rank writes every file",
          BOOL("use_node_local_storage", checkpoint.use_node_local_storage, 0,
               "each node writes locally")),
    SECT("parallel_write", parallel_write_sec, 0, "parallel checkpoint writing"),
    SECT("writer", writer_sec, 0, "how checkpoint files are written"),
};
SECTION(checkpoint_sec, "checkpoint", checkpoint_keys);

/* --- troupe: our own extension ------------------------------------------------------------ */

#define U32 4294967295.0 /* the monitor's step window is uint32_t */
static const tr__cfg_key_t trace_steps_keys[] = {
    ACT(INT("wait", troupe.trace.wait, 0, 0, U32, "steps skipped first")),
    ACT(INT("warmup", troupe.trace.warmup, 0, 0, U32, "steps traced but discarded")),
    ACT(INT("active", troupe.trace.active, 0, 0, U32, "steps recorded; 0 = every step")),
    ACT(INT("repeat", troupe.trace.repeat, 0, 0, U32, "cycles; 0 = forever")),
};
SECTION(trace_steps_sec, "troupe.trace.steps", trace_steps_keys);

static const tr__cfg_key_t trace_keys[] = {
    ACT(BOOL("enabled", troupe.trace.enabled, 0, "write a Perfetto trace")),
    ACT(STR("output_path", troupe.trace.output_path, "", 0, "trace file folder")),
    ACT(BOOL("flight_recorder", troupe.trace.flight_recorder, 1, "keep the last spans in memory")),
    SECT("steps", trace_steps_sec, 0, "which steps are traced"),
};
SECTION(trace_sec, "troupe.trace", trace_keys);

static const tr__cfg_key_t troupe_runtime_keys[] = {
    ACT(INT("workers", troupe.runtime.workers, 0, 0, 4096, "worker threads; 0 = online cores")),
    ACT(BOOL("deterministic", troupe.runtime.deterministic, 0,
             "one worker, seeded choice of the next actor: a replayable run (the engine's "
             "actors, pinned ones included, all run on that worker)")),
    ACT(INT("seed", troupe.runtime.seed, 0, 0, BIG,
            "deterministic mode's seed; 0 = pick one and print it")),
    ACT(BOOL("wire_check", troupe.runtime.wire_check, 0,
             "encode every message to msgpack at send and decode it at receive (a test "
             "mode: proves each message is self-contained; costs a copy per message)")),
    ACT(INT("slice_us", troupe.runtime.slice_us, 100, 100, 100000,
            "the time slice in microseconds the runtime's threads ask Linux 6.12 or later for: "
            "short, so that a worker woken on a busy core runs at once")),
    ACT(BOOL("kernel_slice", troupe.runtime.kernel_slice, 0,
             "the runtime's threads ask for no slice and keep the one they inherit (the "
             "kernel's default, unless the program chose another; slice_us is then ignored)")),
    ACT(INT("inline_ns", troupe.runtime.inline_ns, 200, -1, 1000000000,
            "a behaviour streaming 64 or more messages to an idle actor fed by it alone, and "
            "at most this many nanoseconds a message so far, runs that actor itself inside "
            "the send (the pair stays on one core); 0 = 200; -1 = never")),
};
SECTION(troupe_runtime_sec, "troupe.runtime", troupe_runtime_keys);

static const tr__cfg_key_t troupe_data_keys[] = {
    ACT(INT("prefetch", troupe.data.prefetch, 2, 1, 64, "batches loaded ahead")),
    ACT(BOOL("shuffle", troupe.data.shuffle, 1, "shuffle each epoch")),
    ACT(INT("seed", troupe.data.seed, 1234, 0, BIG,
            "shuffle and parameter-init seed (unless the engine is given one)")),
};
SECTION(troupe_data_sec, "troupe.data", troupe_data_keys);

static const tr__cfg_key_t troupe_comm_keys[] = {
    ACT(STR("backend", troupe.comm.backend, "auto", 0,
            "the comm backend by name: auto (local at world size 1, mpi above), local, mpi, or "
            "one a program registered")),
    ACT(INT("timeout_s", troupe.comm.timeout_s, 300, 1, 86400,
            "the watchdog: a collective (or a pipeline's transfer across ranks) pending longer "
            "than this many seconds makes rank 0 gather every rank's pending operations and "
            "name the rank that diverged or stopped; the job then ends on every rank instead "
            "of hanging")),
};
SECTION(troupe_comm_sec, "troupe.comm", troupe_comm_keys);

static const tr__cfg_key_t troupe_keys[] = {
    SECT("trace", trace_sec, 0, "actor timeline tracing"),
    SECT("runtime", troupe_runtime_sec, 0, "scheduler"),
    SECT("data", troupe_data_sec, 0, "data loader"),
    SECT("comm", troupe_comm_sec, 0, "communication between ranks"),
    ACT(ENUM("log_level", troupe.log_level, 1, log_levels, TR__F_NOCASE,
             "lines Troupe prints: debug, info (start-up summaries, DeepSpeed's progress and "
             "timer lines), warning, error or off; TROUPE_LOG_LEVEL overrides it")),
    ACT(BOOL("memory_check", troupe.memory_check, 1,
             "refuse at start a configuration whose predicted memory per rank (troupe memory), "
             "times the ranks on this node, exceeds what the machine has available; false "
             "starts anyway (swap, or memory freed meanwhile)")),
};
SECTION(troupe_sec, "troupe", troupe_keys);

/* --- the top ---------------------------------------------------------------------------- */

#define BATCH(n, f, doc_)                                                                          \
    {                                                                                              \
        .name = n, .kind = TR__K_INT, .offset = OFF(f), .field = FIELD(f), .min = -BIG,            \
        .max = BIG, .flags = TR__F_BATCH, .expect = "a positive integer or \"auto\"", .doc = doc_, \
        .state = TR__S_ACTED                                                                       \
    }

static const tr__cfg_key_t top_keys[] = {
    BATCH("train_batch_size", train_batch_size, "samples per optimizer step, all ranks"),
    BATCH("train_micro_batch_size_per_gpu", train_micro_batch_size_per_gpu,
          "samples per forward/backward on one rank (at most 2147483647)"),
    BATCH("gradient_accumulation_steps", gradient_accumulation_steps,
          "micro-batches per optimizer step (at most 2147483647)"),
    ACT(INT("steps_per_print", steps_per_print, 10, 1, BIG, "progress report period")),
    ACT(DBL("gradient_clipping", gradient_clipping, 1.0, -INF, INF,
            "global norm clip; <= 0 = off")),
    ACT(BOOL("prescale_gradients", prescale_gradients, 0, "scale before all-reduce")),
    ACT(DBLF("gradient_predivide_factor", gradient_predivide_factor, 1.0, 0, INF, TR__F_MIN_EXCL,
             "divide before all-reduce")),
    {.name = "communication_data_type",
     .kind = TR__K_ENUM,
     .offset = OFF(communication_data_type),
     .field = "communication_data_type",
     .choices = dtypes,
     .flags = TR__F_NULLABLE | TR__F_DERIVED | TR__F_NOCASE,
     .doc = "fp32, fp16 or bf16: the gradients' type on the wire on more than one rank "
            "(default: the training precision)",
     .state = TR__S_ACTED},
    ACT(BOOL("wall_clock_breakdown", wall_clock_breakdown, 0, "print forward/backward/step times")),
    NOEFF("memory use is not reported yet",
          BOOL("memory_breakdown", memory_breakdown, 0, "print memory use")),
    NOEFF("the state is not printed yet",
          BOOL("dump_state", dump_state, 0, "print the state after init")),
    NOEFF("no layer produces sparse gradients",
          BOOL("sparse_gradients", sparse_gradients, 0, "sparse embedding gradients")),
    NOEFF("the engine takes no client optimizer",
          BOOL("zero_allow_untested_optimizer", zero_allow_untested_optimizer, 0,
               "allow a client optimizer with ZeRO")),
    NOEFF("the loader draws whole batches from an endless stream",
          BOOL("dataloader_drop_last", dataloader_drop_last, 0, "drop the last partial batch")),
    SECT("zero_optimization", zero_sec, 0, "ZeRO"),
    SECT("fp16", fp16_sec, 0, "fp16 mixed precision"),
    SECT("bf16", bf16_sec, 0, "bfloat16 mixed precision"),
    SECT("data_types", data_types_sec, 0, "data types"),
    DEPR("bfloat16", "bf16"),
    SECT("optimizer", optimizer_sec, TR__F_OPTIONAL,
         "the optimizer (not needed when the engine never steps)"),
    SECT("scheduler", scheduler_sec, TR__F_OPTIONAL, "the learning-rate schedule"),
    SECT("aio", aio_sec, 0, "asynchronous NVMe I/O"),
    SECT("csv_monitor", csv_sec, 0, "CSV monitor"),
    SECT("tensorboard", tensorboard_sec, 0, "TensorBoard monitor"),
    SECT("comms_logger", comms_sec, 0, "collective logging"),
    SECT("pipeline", pipeline_sec, 0, "pipeline parallelism"),
    SECT("activation_checkpointing", act_sec, 0, "activation checkpointing"),
    SECT("checkpoint", checkpoint_sec, 0, "checkpoint saving and loading"),
    SECT("troupe", troupe_sec, 0, "Troupe's own settings"),
    IGN("wandb", "Weights & Biases monitor"),
    IGN("comet", "Comet monitor"),
    IGN("sparse_attention", "sparse attention kernels"),
    IGN("compression_training", "compression (quantization, pruning) training"),
    IGN("autotuning", "DeepSpeed's autotuner"),
    IGN("flops_profiler", "the FLOPS profiler"),
    IGN("amp", "NVIDIA Apex AMP"),
    IGN("data_efficiency", "curriculum and data routing"),
    IGN("curriculum_learning", "curriculum learning"),
    IGN("progressive_layer_drop", "progressive layer dropping"),
    IGN("quantize_training", "quantized training"),
    IGN("eigenvalue", "eigenvalue computation"),
    IGN("nebula", "Nebula checkpointing"),
    IGN("hybrid_engine", "the RLHF hybrid engine"),
    IGN("tensor_parallel", "automatic tensor parallelism"),
    IGN("zero_force_ds_cpu_optimizer", "DeepSpeed's CPU optimizer check"),
    IGN("seq_parallel_communication_data_type", "sequence parallelism"),
    IGN("gradient_allreduce_op", "the gradient all-reduce operation"),
    IGN("torch_autocast", "PyTorch autocast"),
    IGN("compile", "torch.compile and DeepCompile"),
    IGN("timers", "DeepSpeed's timers"),
    IGN("managed_gradient_accumulation", "DeepSpeed's managed accumulation"),
    IGN("use_data_before_expert_parallelism", "mixture-of-experts topology"),
    IGN("weight_quantization", "weight quantization"),
    IGN("expert_parallel", "mixture-of-experts parallelism"),
    IGN("disable_allgather", "DeepSpeed's all-gather switch"),
    IGN("graph_harvesting", "CUDA graph harvesting"),
    IGN("vocabulary_size", "DeepSpeed's tensor-core alignment warning"),
    {.name = "elasticity",
     .kind = TR__K_IGNORED,
     .flags = TR__F_IF_ENABLED,
     .doc = "elastic training (an error when enabled: it changes the batch size)",
     .state = TR__S_INERT},
};
const tr__cfg_section_t tr__cfg_top = {"", top_keys, N(top_keys)};

/* --- states ----------------------------------------------------------------------------- */

const char *tr__cfg_state_text(const tr__cfg_key_t *k, char *b, size_t n)
{
    if (k->kind == TR__K_IGNORED || k->kind == TR__K_REJECT || k->state != TR__S_INERT) return "";
    snprintf(b, n, "accepted: %s; no effect yet", k->why);
    return b;
}

/* --- lookups ---------------------------------------------------------------------------- */

const tr__cfg_key_t *tr__cfg_find(const tr__cfg_section_t *sec, const char *name)
{
    for (size_t i = 0; i < sec->n_keys; i++)
        if (!strcmp(sec->keys[i].name, name)) return &sec->keys[i];
    return NULL;
}

/* Collects into places (distinct dotted paths, at most TR__CFG_WHERE_MAX + 1) where a key
 * called name exists, skipping section not_in. */
static int where_in(const tr__cfg_section_t *sec, const char *name, const tr__cfg_section_t *not_in,
                    char places[][256], int found)
{
    const tr__cfg_key_t *k = sec != not_in ? tr__cfg_find(sec, name) : NULL;
    if (k && k->kind != TR__K_REJECT && k->kind != TR__K_ALIAS && found <= TR__CFG_WHERE_MAX) {
        char here[256];
        snprintf(here, sizeof(here), "%s%s%s", sec->name, sec->name[0] ? "." : "", name);
        bool seen = false; /* variants of one section share a path: count it once */
        for (int i = 0; i < found; i++)
            seen |= !strcmp(places[i], here);
        if (!seen) memcpy(places[found++], here, sizeof(here));
    }
    for (size_t i = 0; i < sec->n_keys; i++) {
        k = &sec->keys[i];
        if (k->kind == TR__K_SECTION) found = where_in(k->sub, name, not_in, places, found);
        for (int v = 1; k->kind == TR__K_VARIANT && k->variants[v]; v++)
            found = where_in(k->variants[v], name, not_in, places, found);
    }
    return found;
}

int tr__cfg_where(const char *name, const tr__cfg_section_t *not_in, char places[][256])
{
    return where_in(&tr__cfg_top, name, not_in, places, 0);
}

int tr__cfg_edit_distance(const char *a, const char *b)
{
    size_t la = strnlen(a, 255), lb = strnlen(b, 255);
    unsigned char row[256];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (unsigned char)j;
    for (size_t i = 1; i <= la; i++) {
        unsigned char diag = row[0];
        row[0] = (unsigned char)i;
        for (size_t j = 1; j <= lb; j++) {
            unsigned char up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = (unsigned char)best;
            diag = up;
        }
    }
    return row[lb];
}

const char *tr__cfg_closest(const tr__cfg_section_t *sec, const char *name)
{
    const char *best = NULL;
    int best_d = 1 << 30;
    for (size_t i = 0; i < sec->n_keys; i++) {
        const char *cand = sec->keys[i].name;
        int d = strcasecmp(cand, name) ? tr__cfg_edit_distance(cand, name) : 0;
        if (d < best_d) {
            best_d = d;
            best = cand;
        }
    }
    /* close enough: a third of the longer name, at least 2 edits */
    size_t len = strlen(name);
    int limit = (int)(len / 3 > 2 ? len / 3 : 2);
    return best_d <= limit ? best : NULL;
}
