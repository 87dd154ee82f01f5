/* Troupe's configuration: a DeepSpeed ds_config.json, read, resolved and validated exactly as
 * DeepSpeed does, into one typed struct that every later part (engine, ZeRO, swapper, monitor,
 * pipeline) reads directly: cfg->zero.stage, cfg->fp16.enabled, cfg->aio.block_size, ...
 *
 * Loading never stops at the first problem: every error and every warning goes into a
 * tr_config_diag_t, one formatted line each, "file: key.path: message" (syntax errors
 * "file:line:column: message"). Unknown keys are errors with a did-you-mean hint; keys that
 * DeepSpeed knows and Troupe does not implement are accepted with a warning naming them.
 *
 * Every field of tr_config_t also has an origin (given, default, derived, "auto"), which
 * tr_config_origin reports and tr_config_dump marks. docs/config.md lists every key.
 */
#ifndef TR_INCLUDE_TROUPE_CONFIG_H
#define TR_INCLUDE_TROUPE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "troupe/aio.h"
#include "troupe/error.h"
#include "troupe/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- diagnostics ----------------------------------------------------------------------- */

typedef enum {
    TR_CONFIG_ERROR,
    TR_CONFIG_WARNING,
    TR_CONFIG_NOTE, /* information: which default an "auto" became */
} tr_config_severity_t;

typedef struct tr_config_diag_entry {
    tr_config_severity_t severity;
    char *text; /* "file: key.path: message", no trailing newline */
} tr_config_diag_entry_t;

/* A list of diagnostics, in the order they were found. Caller-owned: _init, then _close. */
typedef struct tr_config_diag {
    tr_config_diag_entry_t *items;
    size_t count, cap;
    size_t n_errors, n_warnings;
} tr_config_diag_t;

/* Empties d. Any thread. */
void tr_config_diag_init(tr_config_diag_t *d);

/* Frees every line. NULL does nothing. The thread that owns d. */
void tr_config_diag_close(tr_config_diag_t *d);

/* --- the resolved configuration -------------------------------------------------------- */

typedef enum { TR_OFFLOAD_NONE, TR_OFFLOAD_CPU, TR_OFFLOAD_NVME } tr_config_device_t;
typedef enum {
    TR_OPTIMIZER_NONE, /* no "optimizer" section: the engine may not step */
    TR_OPTIMIZER_ADAM,
    TR_OPTIMIZER_ADAMW,
    TR_OPTIMIZER_SGD,
    TR_OPTIMIZER_LAMB,
    TR_OPTIMIZER_LION,
    TR_OPTIMIZER_ONEBIT_ADAM,   /* runs as Adam (no compressed communication yet) */
    TR_OPTIMIZER_ZERO_ONE_ADAM, /* runs as Adam */
    TR_OPTIMIZER_ONEBIT_LAMB,   /* runs as Lamb */
} tr_config_optimizer_type_t;
typedef enum {
    TR_SCHEDULER_NONE,
    TR_SCHEDULER_WARMUP_LR,
    TR_SCHEDULER_WARMUP_DECAY_LR,
    TR_SCHEDULER_WARMUP_COSINE_LR,
    TR_SCHEDULER_ONE_CYCLE,
    TR_SCHEDULER_LR_RANGE_TEST,
} tr_config_scheduler_type_t;
typedef enum { TR_CONFIG_WARMUP_LOG, TR_CONFIG_WARMUP_LINEAR } tr_config_warmup_type_t;
typedef enum { TR_TAG_IGNORE, TR_TAG_WARN, TR_TAG_FAIL } tr_config_tag_validation_t;

#define TR_CONFIG_MAX_LIST 32

typedef struct tr_config_strlist {
    int count;
    const char *items[TR_CONFIG_MAX_LIST];
} tr_config_strlist_t;

typedef struct tr_config_offload_optimizer {
    int device;            /* tr_config_device_t */
    const char *nvme_path; /* NULL when not given */
    int64_t buffer_count;
    bool pin_memory, pipeline_read, pipeline_write, fast_init;
    double ratio;
} tr_config_offload_optimizer_t;

typedef struct tr_config_offload_param {
    int device; /* tr_config_device_t */
    const char *nvme_path;
    int64_t buffer_count, buffer_size, max_in_cpu;
    bool pin_memory;
} tr_config_offload_param_t;

/* The smallest zero_optimization.reduce_bucket_size used: a smaller one but 0 (one bucket) is
 * raised to it, with a warning. */
#define TR_CONFIG_BUCKET_MIN 16

typedef struct tr_config_zero {
    int64_t stage;
    bool contiguous_gradients, reduce_scatter, allgather_partitions, overlap_comm;
    bool load_from_fp32_weights, elastic_checkpoint, round_robin_gradients;
    bool ignore_unused_parameters, gather_16bit_weights_on_model_save;
    int64_t reduce_bucket_size, allgather_bucket_size, sub_group_size;
    int64_t prefetch_bucket_size, param_persistence_threshold, model_persistence_threshold;
    int64_t max_live_parameters, max_reuse_distance;
    tr_config_offload_optimizer_t offload_optimizer;
    tr_config_offload_param_t offload_param;
} tr_config_zero_t;

typedef struct tr_config_fp16 {
    bool enabled, auto_cast, consecutive_hysteresis, fp16_master_weights_and_grads;
    double loss_scale; /* 0 = dynamic */
    int64_t initial_scale_power, loss_scale_window, hysteresis;
    double min_loss_scale;
} tr_config_fp16_t;

typedef struct tr_config_bf16 {
    bool enabled, immediate_grad_update;
} tr_config_bf16_t;

/* The optimizer that type runs as: OneBitAdam and ZeroOneAdam as TR_OPTIMIZER_ADAM, OneBitLamb
 * as TR_OPTIMIZER_LAMB (their compressed communication needs world size > 1); any other type
 * as itself. Any thread. */
int tr_config_optimizer_runs_as(int type);

/* One flat set of optimizer parameters; only those of the chosen type are meaningful. */
typedef struct tr_config_optimizer {
    int type; /* tr_config_optimizer_type_t */
    struct {
        double lr, eps, weight_decay;
        double betas[2];
        bool bias_correction, adam_w_mode, amsgrad, torch_adam; /* Adam, AdamW */
                                                                /* Lion: lr, betas, wd */
        double momentum, dampening;                             /* SGD */
        bool nesterov;
        double max_coeff, min_coeff; /* Lamb */
        bool eps_inside_sqrt;
    } params;
} tr_config_optimizer_t;

/* DeepSpeed's lr_schedules.py parameter names; only those of the chosen type are meaningful. */
typedef struct tr_config_scheduler {
    int type; /* tr_config_scheduler_type_t */
    struct {
        double warmup_min_lr, warmup_max_lr, warmup_min_ratio, cos_min_ratio;
        int64_t warmup_num_steps, total_num_steps;
        int warmup_type; /* tr_config_warmup_type_t */
        double cycle_min_lr, cycle_max_lr, decay_lr_rate;
        int64_t cycle_first_step_size, cycle_second_step_size; /* second: 0 = same as first */
        int64_t cycle_first_stair_count, cycle_second_stair_count, decay_step_size;
        bool cycle_momentum;
        double cycle_min_mom, cycle_max_mom, decay_mom_rate;
        double lr_range_test_min_lr, lr_range_test_step_rate;
        int64_t lr_range_test_step_size;
        bool lr_range_test_staircase;
        int64_t last_batch_iteration; /* -1 = start from the beginning */
    } params;
} tr_config_scheduler_t;

typedef struct tr_config_aio {
    int64_t block_size, queue_depth, intra_op_parallelism;
    bool single_submit, overlap_events, use_gds;
} tr_config_aio_t;

/* Fills o from a resolved config's `aio` section (cfg->aio), whose ranges the config loader
 * has checked; a config without the section gives tr_aio_options_default's values.
 * runtime/config/aio_options.c. Any thread. */
void tr_aio_options_from_config(const tr_config_aio_t *c, tr_aio_options_t *o);

typedef struct tr_config_monitor {
    bool enabled;
    const char *output_path, *job_name;
} tr_config_monitor_t;

typedef struct tr_config_comms_logger {
    bool enabled, verbose, prof_all, debug;
    tr_config_strlist_t prof_ops;
} tr_config_comms_logger_t;

/* The most pipeline.stages: what a pipeline schedule is built for (TR_PIPE_MAX_STAGES). */
#define TR_CONFIG_MAX_STAGES 4096

typedef struct tr_config_pipeline {
    int64_t stages; /* 0 = "auto" */
    const char *partition;
    const char *schedule; /* "1f1b" or "zb" (Troupe's key) */
    bool seed_layers, pipe_partitioned, grad_partitioned;
    int64_t activation_checkpoint_interval;
} tr_config_pipeline_t;

typedef struct tr_config_activation_checkpointing {
    bool partition_activations, contiguous_memory_optimization, cpu_checkpointing;
    bool synchronize_checkpoint_boundary, profile;
    int64_t number_checkpoints; /* 0 = not given */
} tr_config_activation_checkpointing_t;

typedef struct tr_config_checkpoint {
    int tag_validation; /* tr_config_tag_validation_t */
    bool load_universal, use_node_local_storage, parallel_write_pipeline_stage;
    bool writer_decoupled; /* checkpoint.writer.decoupled: saves written in the background */
} tr_config_checkpoint_t;

/* Troupe's own extension section, "troupe". */
typedef struct tr_config_troupe {
    struct {
        bool enabled, flight_recorder;
        const char *output_path;
        int64_t wait, warmup, active, repeat; /* "steps": active 0 = every step */
    } trace;
    struct {
        int64_t workers; /* 0 = online cores */
        bool deterministic;
        int64_t seed;
        bool wire_check;   /* every message crosses its msgpack form (tr_runtime_opts_t) */
        int64_t slice_us;  /* the runtime's threads' time slice (tr_runtime_opts_t) */
        bool kernel_slice; /* ... or the kernel's default */
        int64_t inline_ns; /* a stream's cheap receiver runs inline (tr_runtime_opts_t) */
    } runtime;
    struct {
        int64_t prefetch, seed;
        bool shuffle;
    } data;
    struct {
        const char *backend; /* a registered comm backend; "auto": local at world size 1 */
        int64_t timeout_s;   /* a collective pending longer fails the job (the watchdog) */
    } comm;
    int log_level;     /* TR_LOG_DEBUG..TR_LOG_OFF (troupe/log.h); TROUPE_LOG_LEVEL overrides it */
    bool memory_check; /* tr_engine_create refuses what is predicted not to fit this machine */
} tr_config_troupe_t;

typedef struct tr_config {
    const char *source; /* the file name used in diagnostics */
    int64_t world_size; /* data-parallel world size used to resolve the batch: the ranks, or
                         * with pipeline.stages > 1 on several ranks, ranks / stages */
    int64_t ranks;      /* the world size it was loaded for */
    int64_t train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps;
    int64_t steps_per_print;
    double gradient_clipping, gradient_predivide_factor;
    bool wall_clock_breakdown, prescale_gradients, memory_breakdown, dump_state;
    bool sparse_gradients, zero_allow_untested_optimizer, dataloader_drop_last;
    int communication_data_type; /* tr_dtype_t (F32, F16, BF16); derived from the precision */
    tr_config_zero_t zero;
    tr_config_fp16_t fp16;
    tr_config_bf16_t bf16;
    struct {
        int grad_accum_dtype; /* tr_dtype_t: only F32 (the default) is accepted */
    } data_types;
    tr_config_optimizer_t optimizer;
    tr_config_scheduler_t scheduler;
    tr_config_aio_t aio;
    tr_config_monitor_t csv_monitor, tensorboard;
    tr_config_comms_logger_t comms_logger;
    tr_config_pipeline_t pipeline;
    tr_config_activation_checkpointing_t activation_checkpointing;
    tr_config_checkpoint_t checkpoint;
    tr_config_troupe_t troupe;
    struct tr__config_priv *priv_; /* resolved JSON tree and origins; private */
} tr_config_t;

typedef enum {
    TR_ORIGIN_UNKNOWN, /* no such key */
    TR_ORIGIN_GIVEN,   /* written in the file */
    TR_ORIGIN_DEFAULT, /* DeepSpeed's (or Troupe's) default */
    TR_ORIGIN_AUTO,    /* written as "auto" and resolved to the default or by derivation */
    TR_ORIGIN_DERIVED, /* computed from other keys (batch triple, communication_data_type) */
    TR_ORIGIN_IGNORED, /* a section DeepSpeed knows and Troupe does not implement (a warning) */
} tr_config_origin_t;

/* --- loading --------------------------------------------------------------------------- */

/* Reads, resolves and validates the DeepSpeed config at path for a data-parallel world of
 * `world` ranks (0: the launcher's, from the environment: mpirun, srun). On success *cfg is a new
 * config (free it with tr_config_destroy) and 0 is returned; warnings may still be in diag. On
 * failure *cfg is NULL and diag (when not NULL) holds every error found: TR_ECONFIG for a bad
 * config, TR_ENOENT/TR_EACCES/TR_EISDIR/... when the file cannot be read, TR_EINVAL when world < 0
 * or path is NULL, TR_ENOMEM. Any thread. */
int tr_config_load(const char *path, int world, tr_config_t **cfg, tr_config_diag_t *diag);

/* As tr_config_load, from len bytes of JSON text; name labels the diagnostics. Any thread. */
int tr_config_from_string(const char *json, size_t len, const char *name, int world,
                          tr_config_t **cfg, tr_config_diag_t *diag);

/* Frees cfg and every string it points to. NULL does nothing. Any thread, once. */
void tr_config_destroy(tr_config_t *cfg);

/* --- reading by key path --------------------------------------------------------------- */

/* The resolved value at a dotted path ("zero_optimization.offload_optimizer.buffer_count").
 * 0, or TR_ENOENT when there is no such key, TR_EINVAL when it has another type (an integer
 * reads as a double too). Strings point into cfg. Any thread. */
int tr_config_get_int(const tr_config_t *cfg, const char *path, int64_t *out);
int tr_config_get_double(const tr_config_t *cfg, const char *path, double *out);
int tr_config_get_bool(const tr_config_t *cfg, const char *path, bool *out);
int tr_config_get_string(const tr_config_t *cfg, const char *path, const char **out);

/* Where the value at path came from. Any thread. */
tr_config_origin_t tr_config_origin(const tr_config_t *cfg, const char *path);

/* --- dumping --------------------------------------------------------------------------- */

/* End each line whose value was not written in the file with "// default" (or auto, derived,
 * ignored). */
#define TR_CONFIG_DUMP_MARK 1u

/* The fully resolved config as indented JSON, every default filled in, keys in schema order.
 * With TR_CONFIG_DUMP_MARK the lines of values not written in the file carry a comment
 * (JSON with comments); without it the text is plain JSON that loads back to the same config.
 * Returns a malloc'd string the caller frees, or NULL when out of memory. Any thread. */
char *tr_config_dump(const tr_config_t *cfg, unsigned flags);

/* The key reference (docs/config.md's tables) as Markdown, generated from the schema: every
 * section, key, accepted values, default and meaning. A malloc'd string the caller frees, or
 * NULL when out of memory. Any thread. */
char *tr_config_reference(void);

#ifdef __cplusplus
}
#endif
#endif
