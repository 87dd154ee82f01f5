/* The configuration reader: DeepSpeed's batch rules and error texts, every section's
 * defaults, unknown/misplaced/deprecated/unsupported keys, "auto", duplicates, syntax errors,
 * origins, the getters and the dump. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe/config.h"

/* --- helpers ------------------------------------------------------------------------------ */

static tr_config_diag_t diag;

static int setup(void **state)
{
    tr_config_diag_init(&diag);
    return 0;
}

static int teardown(void **state)
{
    tr_config_diag_close(&diag);
    return 0;
}

static void print_diag(void)
{
    for (size_t i = 0; i < diag.count; i++)
        print_message("  | %s\n", diag.items[i].text);
}

static tr_config_t *ok_w(const char *json, int world)
{
    tr_config_t *cfg = NULL;
    int err = tr_config_from_string(json, strlen(json), "ds.json", world, &cfg, &diag);
    if (err) print_diag();
    assert_int_equal(err, 0);
    assert_non_null(cfg);
    return cfg;
}

static tr_config_t *ok(const char *json)
{
    return ok_w(json, 1);
}

static void fails_w(const char *json, int world)
{
    tr_config_t *cfg = (tr_config_t *)1;
    int err = tr_config_from_string(json, strlen(json), "ds.json", world, &cfg, &diag);
    if (err != TR_ECONFIG) print_diag();
    assert_int_equal(err, TR_ECONFIG);
    assert_null(cfg);
    assert_true(diag.n_errors > 0);
}

static void fails(const char *json)
{
    fails_w(json, 1);
}

/* The diagnostics hold exactly this line. */
static void has(const char *line)
{
    for (size_t i = 0; i < diag.count; i++)
        if (!strcmp(diag.items[i].text, line)) return;
    print_message("expected line: %s\ngot:\n", line);
    print_diag();
    fail();
}

/* --- the batch triple ---------------------------------------------------------------------- */

typedef struct batch_case {
    const char *json;
    int world;
    int64_t tb, mb, gas;
} batch_case_t;

static void test_config_batch_rules_match_deepspeed(void **state)
{
    static const batch_case_t cases[] = {
        /* all three given: nothing derived */
        {"{\"train_batch_size\":24,\"train_micro_batch_size_per_gpu\":3,"
         "\"gradient_accumulation_steps\":4}",
         2, 24, 3, 4},
        /* TB+MB: GAS = (TB // MB) // W */
        {"{\"train_batch_size\":64,\"train_micro_batch_size_per_gpu\":4}", 4, 64, 4, 4},
        /* TB+GAS: MB = (TB // W) // GAS */
        {"{\"train_batch_size\":64,\"gradient_accumulation_steps\":2}", 4, 64, 8, 2},
        /* MB+GAS: TB = MB * GAS * W */
        {"{\"train_micro_batch_size_per_gpu\":3,\"gradient_accumulation_steps\":5}", 3, 45, 3, 5},
        /* TB only: GAS = 1, MB = TB // W */
        {"{\"train_batch_size\":32}", 8, 32, 4, 1},
        /* MB only: TB = MB * W, GAS = 1 */
        {"{\"train_micro_batch_size_per_gpu\":6}", 5, 30, 6, 1},
        /* integral reals are integers */
        {"{\"train_batch_size\":1.6e1,\"train_micro_batch_size_per_gpu\":2e0}", 1, 16, 2, 8},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tr_config_t *c = ok_w(cases[i].json, cases[i].world);
        assert_int_equal(c->train_batch_size, cases[i].tb);
        assert_int_equal(c->train_micro_batch_size_per_gpu, cases[i].mb);
        assert_int_equal(c->gradient_accumulation_steps, cases[i].gas);
        assert_int_equal(c->world_size, cases[i].world);
        tr_config_destroy(c);
    }
}

static void test_config_batch_derived_values_are_marked(void **state)
{
    tr_config_t *c = ok_w("{\"train_batch_size\":64,\"train_micro_batch_size_per_gpu\":4}", 2);
    assert_int_equal(tr_config_origin(c, "train_batch_size"), TR_ORIGIN_GIVEN);
    assert_int_equal(tr_config_origin(c, "gradient_accumulation_steps"), TR_ORIGIN_DERIVED);
    tr_config_destroy(c);
}

static void test_config_batch_errors_use_deepspeed_wording(void **state)
{
    fails("{\"train_batch_size\":10,\"train_micro_batch_size_per_gpu\":3,"
          "\"gradient_accumulation_steps\":3}");
    has("ds.json: Check batch related parameters. train_batch_size is not equal to "
        "micro_batch_per_gpu * gradient_acc_step * world_size 10 != 3 * 3 * 1");
    fails("{\"gradient_accumulation_steps\":3}");
    has("ds.json: Either train_batch_size or train_micro_batch_size_per_gpu needs to be "
        "provided");
    fails("{}");
    has("ds.json: Either train_batch_size or train_micro_batch_size_per_gpu needs to be "
        "provided");
    /* TB+MB with TB < MB * W: GAS floors to 0 */
    fails_w("{\"train_batch_size\":4,\"train_micro_batch_size_per_gpu\":4}", 2);
    has("ds.json: gradient_accumulation_steps: Gradient accumulation steps: 0 has to be greater "
        "than 0");
    fails("{\"train_batch_size\":-8}");
    has("ds.json: train_batch_size: Train batch size: -8 has to be greater than 0");
    fails("{\"train_micro_batch_size_per_gpu\":0}");
    has("ds.json: train_micro_batch_size_per_gpu: Micro batch size per gpu: 0 has to be greater "
        "than 0");
    fails("{\"train_batch_size\":8.5}");
    has("ds.json: train_batch_size: must be a positive integer or \"auto\", got 8.5");
    fails("{\"train_micro_batch_size_per_gpu\":4611686018427387904,"
          "\"gradient_accumulation_steps\":4}");
    has("ds.json: train_batch_size: train_micro_batch_size_per_gpu * gradient_accumulation_steps"
        " * world_size does not fit in 64 bits");
}

static void test_config_batch_auto_is_derived_or_explained(void **state)
{
    tr_config_t *c = ok_w("{\"train_batch_size\":\"auto\",\"train_micro_batch_size_per_gpu\":4,"
                          "\"gradient_accumulation_steps\":2}",
                          3);
    assert_int_equal(c->train_batch_size, 24);
    assert_int_equal(tr_config_origin(c, "train_batch_size"), TR_ORIGIN_AUTO);
    tr_config_destroy(c);
    c = ok("{\"train_batch_size\":32,\"train_micro_batch_size_per_gpu\":\"auto\","
           "\"gradient_accumulation_steps\":4}");
    assert_int_equal(c->train_micro_batch_size_per_gpu, 8);
    tr_config_destroy(c);
    fails_w("{\"train_batch_size\":\"auto\",\"train_micro_batch_size_per_gpu\":4}", 2);
    has("ds.json: train_batch_size: \"auto\" can be resolved only when the other two batch "
        "sizes are given; write 8 (what DeepSpeed derives from the keys given and world size 2)");
    fails("{\"train_batch_size\":\"auto\",\"train_micro_batch_size_per_gpu\":\"auto\"}");
    has("ds.json: train_micro_batch_size_per_gpu: \"auto\" can be resolved only when the other "
        "two batch sizes are given; write a positive integer");
}

static void test_config_world_size_must_be_positive(void **state)
{
    tr_config_t *c = NULL;
    assert_int_equal(tr_config_from_string("{}", 2, "ds.json", -1, &c, &diag), TR_EINVAL);
    assert_null(c);
    has("ds.json: world size must be >= 1, got -1");
}

/* A pipeline across ranks: the batch counts the data-parallel replicas (ranks / stages), as
 * DeepSpeed's does; ranks that are not a multiple of the stages are refused. */
static void test_config_pipeline_world_is_the_replicas(void **state)
{
    const char *json = "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": "
                       "4, \"pipeline\": {\"stages\": 2}}";
    tr_config_t *c = ok_w(json, 4);
    assert_int_equal(c->world_size, 2);
    assert_int_equal(c->ranks, 4);
    assert_int_equal(c->train_batch_size, 16);
    tr_config_destroy(c);
    c = ok_w(json, 1); /* one process: every stage in it */
    assert_int_equal(c->world_size, 1);
    tr_config_destroy(c);
    c = NULL;
    assert_int_equal(tr_config_from_string(json, strlen(json), "ds.json", 3, &c, &diag),
                     TR_ECONFIG);
    has("ds.json: pipeline.stages: 2 stages on 3 ranks: the ranks must be a multiple of the "
        "stages (one rank per stage of each data-parallel replica)");
}

/* World 0: the launcher's, from the environment; a torchrun launch is answered. */
static void test_config_world_size_from_the_launcher(void **state)
{
    const char *json =
        "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 3}";
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    tr_config_t *c = NULL;
    assert_int_equal(tr_config_from_string(json, strlen(json), "ds.json", 0, &c, &diag), 0);
    assert_int_equal(c->world_size, 4);
    assert_int_equal(c->train_batch_size, 24);
    tr_config_destroy(c);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_RANK");
    setenv("WORLD_SIZE", "2", 1);
    setenv("RANK", "0", 1);
    assert_int_equal(tr_config_from_string(json, strlen(json), "ds.json", 0, &c, &diag), TR_EINVAL);
    has("ds.json: world size: RANK/WORLD_SIZE (torchrun or the DeepSpeed launcher) say world "
        "size 2; Troupe's ranks talk over MPI: launch with `mpirun -np 2 ...` or `srun -n 2 ...`");
    unsetenv("WORLD_SIZE");
    unsetenv("RANK");
}

/* --- defaults ---------------------------------------------------------------------------- */

static void test_config_top_and_zero_defaults(void **state)
{
    tr_config_t *c = ok("{\"train_batch_size\":1}");
    assert_int_equal(c->steps_per_print, 10);
    assert_true(c->gradient_clipping == 1.0);
    assert_false(c->wall_clock_breakdown);
    assert_false(c->prescale_gradients);
    assert_true(c->gradient_predivide_factor == 1.0);
    assert_int_equal(c->communication_data_type, TR_DTYPE_F32);
    assert_int_equal(tr_config_origin(c, "communication_data_type"), TR_ORIGIN_DERIVED);
    assert_int_equal(c->zero.stage, 0);
    assert_true(c->zero.contiguous_gradients && c->zero.reduce_scatter);
    assert_true(c->zero.allgather_partitions);
    assert_int_equal(c->zero.reduce_bucket_size, 500000000);
    assert_int_equal(c->zero.allgather_bucket_size, 500000000);
    assert_false(c->zero.overlap_comm);
    const tr_config_offload_optimizer_t *o = &c->zero.offload_optimizer;
    assert_int_equal(o->device, TR_OFFLOAD_NONE);
    assert_null(o->nvme_path);
    assert_int_equal(o->buffer_count, 4);
    assert_true(o->pin_memory);
    assert_false(o->pipeline_read || o->pipeline_write);
    assert_int_equal(c->zero.offload_param.buffer_count, 5);
    assert_int_equal(tr_config_origin(c, "zero_optimization.stage"), TR_ORIGIN_DEFAULT);
    assert_int_equal(tr_config_origin(c, "train_batch_size"), TR_ORIGIN_GIVEN);
    assert_int_equal(c->optimizer.type, TR_OPTIMIZER_NONE);
    assert_int_equal(c->scheduler.type, TR_SCHEDULER_NONE);
    tr_config_destroy(c);
}

static void test_config_overlap_comm_defaults_by_stage(void **state)
{
    tr_config_t *c = ok("{\"train_batch_size\":1,\"zero_optimization\":{\"stage\":3}}");
    assert_true(c->zero.overlap_comm);
    tr_config_destroy(c);
    c = ok("{\"train_batch_size\":1,\"zero_optimization\":{\"stage\":2}}");
    assert_false(c->zero.overlap_comm);
    tr_config_destroy(c);
    c = ok("{\"train_batch_size\":1,\"zero_optimization\":{\"stage\":3,\"overlap_comm\":false}}");
    assert_false(c->zero.overlap_comm);
    tr_config_destroy(c);
}

static void test_config_precision_defaults(void **state)
{
    tr_config_t *c = ok("{\"train_batch_size\":1,\"fp16\":{\"enabled\":true}}");
    assert_true(c->fp16.enabled);
    assert_true(c->fp16.loss_scale == 0);
    assert_int_equal(c->fp16.initial_scale_power, 16);
    assert_int_equal(c->fp16.loss_scale_window, 1000);
    assert_int_equal(c->fp16.hysteresis, 2);
    assert_false(c->fp16.consecutive_hysteresis);
    assert_true(c->fp16.min_loss_scale == 1);
    assert_false(c->bf16.enabled);
    assert_int_equal(c->communication_data_type, TR_DTYPE_F16);
    tr_config_destroy(c);
    c = ok("{\"train_batch_size\":1,\"bf16\":{\"enabled\":true}}");
    assert_int_equal(c->communication_data_type, TR_DTYPE_BF16);
    tr_config_destroy(c);
    fails("{\"train_batch_size\":1,\"bf16\":{\"enabled\":true},\"fp16\":{\"enabled\":true}}");
    has("ds.json: bf16: bfloat16 and fp16 modes cannot be simultaneously enabled (fp16.enabled "
        "and bf16.enabled are both true)");
    /* gradients accumulate in fp32: another accumulation type is refused, by name */
    c = ok("{\"train_batch_size\":1,\"bf16\":{\"enabled\":true},"
           "\"data_types\":{\"grad_accum_dtype\":\"FP32\"}}");
    assert_int_equal(c->data_types.grad_accum_dtype, TR_DTYPE_F32);
    tr_config_destroy(c);
    fails("{\"train_batch_size\":1,\"bf16\":{\"enabled\":true},"
          "\"data_types\":{\"grad_accum_dtype\":\"bf16\"}}");
    has("ds.json: data_types.grad_accum_dtype: Troupe accumulates gradients in fp32 only, got "
        "\"bf16\" (remove the key or set \"fp32\")");
}

static void test_config_io_monitor_pipeline_defaults(void **state)
{
    tr_config_t *c = ok("{\"train_batch_size\":1}");
    assert_int_equal(c->aio.block_size, 1048576);
    assert_int_equal(c->aio.queue_depth, 8);
    assert_int_equal(c->aio.intra_op_parallelism, 1);
    assert_false(c->aio.single_submit);
    assert_true(c->aio.overlap_events);
    const tr_config_monitor_t *m[2] = {&c->csv_monitor, &c->tensorboard};
    for (int i = 0; i < 2; i++) {
        assert_false(m[i]->enabled);
        assert_string_equal(m[i]->output_path, "");
        assert_string_equal(m[i]->job_name, "DeepSpeedJobName");
    }
    assert_false(c->comms_logger.enabled || c->comms_logger.verbose || c->comms_logger.debug);
    assert_true(c->comms_logger.prof_all);
    assert_int_equal(c->comms_logger.prof_ops.count, 0);
    assert_int_equal(c->pipeline.stages, 0);
    assert_string_equal(c->pipeline.partition, "best");
    assert_true(c->pipeline.pipe_partitioned && c->pipeline.grad_partitioned);
    assert_false(c->activation_checkpointing.partition_activations);
    assert_int_equal(c->activation_checkpointing.number_checkpoints, 0);
    assert_int_equal(c->checkpoint.tag_validation, TR_TAG_WARN);
    assert_false(c->troupe.trace.enabled);
    assert_true(c->troupe.trace.flight_recorder);
    assert_int_equal(c->troupe.trace.active, 0);
    assert_int_equal(c->troupe.runtime.workers, 0);
    assert_int_equal(c->troupe.runtime.slice_us, 100);
    assert_false(c->troupe.runtime.kernel_slice);
    assert_int_equal(c->troupe.runtime.inline_ns, 200);
    assert_int_equal(c->troupe.data.prefetch, 2);
    assert_true(c->troupe.data.shuffle);
    assert_int_equal(c->troupe.data.seed, 1234);
    tr_config_destroy(c);
}

static void test_config_sections_read_given_values(void **state)
{
    tr_config_t *c = ok("{\"train_batch_size\":1,\"comms_logger\":{\"enabled\":true,"
                        "\"prof_ops\":[\"all_reduce\",\"broadcast\"]},\"pipeline\":{\"stages\":"
                        "\"auto\",\"partition\":\"uniform\"},\"checkpoint\":{\"tag_validation\":"
                        "\"fail\"},\"tensorboard\":{\"enabled\":true,\"output_path\":\"tb\"}}");
    assert_true(c->comms_logger.enabled);
    assert_int_equal(c->comms_logger.prof_ops.count, 2);
    assert_string_equal(c->comms_logger.prof_ops.items[1], "broadcast");
    assert_int_equal(c->pipeline.stages, 0);
    assert_string_equal(c->pipeline.partition, "uniform");
    assert_int_equal(c->checkpoint.tag_validation, TR_TAG_FAIL);
    assert_true(c->tensorboard.enabled);
    assert_string_equal(c->tensorboard.output_path, "tb");
    tr_config_destroy(c);
}

static void test_config_optimizer_types_and_defaults(void **state)
{
    tr_config_t *c = ok("{\"train_batch_size\":1,\"optimizer\":{\"type\":\"adam\"}}");
    assert_int_equal(c->optimizer.type, TR_OPTIMIZER_ADAM);
    assert_true(c->optimizer.params.lr == 1e-3);
    assert_true(c->optimizer.params.betas[0] == 0.9 && c->optimizer.params.betas[1] == 0.999);
    assert_true(c->optimizer.params.eps == 1e-8);
    assert_true(c->optimizer.params.adam_w_mode);
    assert_true(c->optimizer.params.bias_correction);
    tr_config_destroy(c);
    c = ok("{\"train_batch_size\":1,\"optimizer\":{\"type\":\"SGD\",\"params\":{\"lr\":0.1,"
           "\"momentum\":0.9}}}");
    assert_int_equal(c->optimizer.type, TR_OPTIMIZER_SGD);
    assert_true(c->optimizer.params.momentum == 0.9);
    assert_false(c->optimizer.params.nesterov);
    tr_config_destroy(c);
    c = ok("{\"train_batch_size\":1,\"optimizer\":{\"type\":\"Lamb\"}}");
    assert_true(c->optimizer.params.max_coeff == 10.0 && c->optimizer.params.min_coeff == 0.01);
    tr_config_destroy(c);
    fails("{\"train_batch_size\":1,\"optimizer\":{\"type\":\"Adagrad\"}}");
    has("ds.json: optimizer.type: must be one of \"Adam\", \"AdamW\", \"SGD\", \"Lamb\", \"Lion\", "
        "\"OneBitAdam\", \"ZeroOneAdam\", \"OneBitLamb\" (any case), got \"Adagrad\"");
    fails("{\"train_batch_size\":1,\"optimizer\":{\"params\":{\"lr\":1}}}");
    has("ds.json: optimizer.type: missing; must be one of \"Adam\", \"AdamW\", \"SGD\", \"Lamb\", "
        "\"Lion\", \"OneBitAdam\", \"ZeroOneAdam\", \"OneBitLamb\" (any case)");
    fails("{\"train_batch_size\":1,\"optimizer\":{\"type\":\"AdamW\",\"params\":"
          "{\"max_grad_norm\":1.0}}}");
    has("ds.json: optimizer.params.max_grad_norm: is not supported as an optimizer parameter; "
        "use the top-level 'gradient_clipping' instead");
    fails("{\"train_batch_size\":1,\"optimizer\":{\"type\":\"SGD\",\"params\":{\"betas\":[0.9,"
          "0.99]}}}");
    has("ds.json: optimizer.params: unknown key 'betas' (not a parameter of this type)");
}

static void test_config_scheduler_types_and_defaults(void **state)
{
    tr_config_t *c = ok("{\"train_batch_size\":1,\"scheduler\":{\"type\":\"WarmupLR\"}}");
    assert_int_equal(c->scheduler.type, TR_SCHEDULER_WARMUP_LR);
    assert_true(c->scheduler.params.warmup_min_lr == 0);
    assert_true(c->scheduler.params.warmup_max_lr == 0.001);
    assert_int_equal(c->scheduler.params.warmup_num_steps, 1000);
    assert_int_equal(c->scheduler.params.warmup_type, TR_CONFIG_WARMUP_LOG);
    tr_config_destroy(c);
    c = ok("{\"train_batch_size\":1,\"scheduler\":{\"type\":\"WarmupCosineLR\",\"params\":"
           "{\"total_num_steps\":100}}}");
    assert_true(c->scheduler.params.cos_min_ratio == 0.0001);
    assert_true(c->scheduler.params.warmup_min_ratio == 0);
    tr_config_destroy(c);
    c = ok("{\"train_batch_size\":1,\"scheduler\":{\"type\":\"OneCycle\",\"params\":"
           "{\"cycle_min_lr\":0.001,\"cycle_max_lr\":0.01}}}");
    assert_int_equal(c->scheduler.params.cycle_first_step_size, 2000);
    assert_true(c->scheduler.params.cycle_momentum);
    assert_true(c->scheduler.params.cycle_min_mom == 0.8);
    assert_true(c->scheduler.params.cycle_max_mom == 0.9);
    tr_config_destroy(c);
    c = ok("{\"train_batch_size\":1,\"scheduler\":{\"type\":\"LRRangeTest\"}}");
    assert_true(c->scheduler.params.lr_range_test_min_lr == 1e-3);
    assert_int_equal(c->scheduler.params.lr_range_test_step_size, 2000);
    assert_true(c->scheduler.params.lr_range_test_step_rate == 1.0);
    tr_config_destroy(c);
    fails("{\"train_batch_size\":1,\"scheduler\":{\"type\":\"WarmupDecayLR\"}}");
    has("ds.json: scheduler.params.total_num_steps: missing; must be an integer >= 1");
    fails("{\"train_batch_size\":1,\"scheduler\":{\"type\":\"OneCycle\",\"params\":"
          "{\"cycle_min_lr\":0.001}}}");
    has("ds.json: scheduler.params.cycle_max_lr: missing; must be a number >= 0");
    fails("{\"train_batch_size\":1,\"scheduler\":{\"type\":\"warmuplr\"}}");
    has("ds.json: scheduler.type: must be one of \"WarmupLR\", \"WarmupDecayLR\", "
        "\"WarmupCosineLR\", \"OneCycle\", \"LRRangeTest\", got \"warmuplr\"");
}

/* --- keys: unknown, misplaced, deprecated, unsupported ------------------------------------ */

static void test_config_unknown_keys_get_hints(void **state)
{
    fails("{\"train_batch_size\":1,\"zero_optimization\":{\"offload_optimizer\":"
          "{\"nvme_pth\":\"/x\"}},\"zero_optimisation\":{},\"fp16\":{\"enabled\":true,"
          "\"xyzzy\":1}}");
    has("ds.json: zero_optimization.offload_optimizer: unknown key 'nvme_pth' (did you mean "
        "'nvme_path'?)");
    has("ds.json: unknown key 'zero_optimisation' (did you mean 'zero_optimization'?)");
    has("ds.json: fp16: unknown key 'xyzzy'");
    assert_int_equal(diag.n_errors, 3);
}

static void test_config_misplaced_keys_say_where_they_belong(void **state)
{
    fails("{\"train_batch_size\":1,\"zero_optimization\":{\"aio\":{}},\"stage\":2,"
          "\"fp16\":{\"nvme_path\":\"/x\"}}");
    has("ds.json: zero_optimization: unknown key 'aio' ('aio' is a top-level section: move it "
        "out of 'zero_optimization')");
    has("ds.json: unknown key 'stage' (it belongs in 'zero_optimization')");
    has("ds.json: fp16: unknown key 'nvme_path' (it belongs in "
        "'zero_optimization.offload_optimizer' or 'zero_optimization.offload_param')");
    /* too common a name to point anywhere */
    fails("{\"train_batch_size\":1,\"aio\":{\"enabled\":true}}");
    has("ds.json: aio: unknown key 'enabled'");
}

static void test_config_deprecated_names_warn_and_apply(void **state)
{
    tr_config_t *c = ok("{\"train_batch_size\":1,\"aio\":{\"thread_count\":4},"
                        "\"zero_optimization\":{\"stage\":2,\"cpu_offload\":true},"
                        "\"bfloat16\":{\"enabled\":true}}");
    assert_int_equal(c->aio.intra_op_parallelism, 4);
    assert_int_equal(c->zero.offload_optimizer.device, TR_OFFLOAD_CPU);
    assert_true(c->bf16.enabled);
    has("ds.json: aio.thread_count: warning: deprecated name; write 'intra_op_parallelism' "
        "instead");
    has("ds.json: zero_optimization.cpu_offload: warning: deprecated; write "
        "\"offload_optimizer\": {\"device\": \"cpu\"} instead");
    has("ds.json: bfloat16: warning: deprecated name; write 'bf16' instead");
    size_t deprecated = 0;
    for (size_t i = 0; i < diag.count; i++)
        deprecated += strstr(diag.items[i].text, ": warning: deprecated") != NULL;
    assert_int_equal(deprecated, 3);
    tr_config_destroy(c);
    fails("{\"train_batch_size\":1,\"aio\":{\"thread_count\":4,\"intra_op_parallelism\":2}}");
    has("ds.json: aio: 'thread_count' and 'intra_op_parallelism' are the same setting; keep only "
        "'intra_op_parallelism'");
}

static void test_config_aliases_are_silent(void **state)
{
    tr_config_t *c = ok("{\"train_batch_size\":1,\"zero_optimization\":{\"stage\":3,"
                        "\"stage3_max_live_parameters\":3e8,"
                        "\"stage3_gather_16bit_weights_on_model_save\":true}}");
    assert_int_equal(c->zero.max_live_parameters, 300000000);
    assert_true(c->zero.gather_16bit_weights_on_model_save);
    for (size_t i = 0; i < diag.count; i++) /* ZeRO's own no-effect warnings name the key */
        assert_null(strstr(diag.items[i].text, "stage3_"));
    has("ds.json: zero_optimization.gather_16bit_weights_on_model_save: warning: accepted: a "
        "save at stage 3 gathers every layer: the model file always holds the whole fp32 "
        "weights; no effect yet");
    tr_config_destroy(c);
}

static void test_config_unsupported_sections_warn_once_each(void **state)
{
    static const char *const names[] = {
        "wandb",          "comet", "sparse_attention", "compression_training", "autotuning",
        "flops_profiler", "amp"};
    char json[1024] = "{\"train_batch_size\":1";
    for (size_t i = 0; i < 7; i++)
        snprintf(json + strlen(json), sizeof(json) - strlen(json), ",\"%s\":{\"enabled\":true}",
                 names[i]);
    strcat(json, "}");
    tr_config_t *c = ok(json);
    assert_int_equal(diag.n_warnings, 7);
    for (size_t i = 0; i < 7; i++) {
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "ds.json: %s: warning: not supported by Troupe", names[i]);
        assert_non_null(strstr(diag.items[i].text, prefix));
        assert_int_equal(tr_config_origin(c, names[i]), TR_ORIGIN_IGNORED);
    }
    has("ds.json: wandb: warning: not supported by Troupe (Weights & Biases monitor); ignored");
    tr_config_destroy(c);
    fails("{\"train_batch_size\":1,\"elasticity\":{\"enabled\":true}}");
    has("ds.json: elasticity: enabled, but Troupe does not support elastic training (an error "
        "when enabled: it changes the batch size); remove the section or set \"enabled\": false");
}

/* --- values ------------------------------------------------------------------------------- */

static void test_config_types_and_ranges_are_checked(void **state)
{
    fails("{\"train_batch_size\":1,\"zero_optimization\":{\"stage\":4,\"reduce_bucket_size\":"
          "5.5},\"fp16\":{\"enabled\":1},\"aio\":{\"queue_depth\":\"8\"},\"optimizer\":{\"type\":"
          "\"Adam\",\"params\":{\"betas\":[0.9]}},\"steps_per_print\":0,\"gradient_clipping\":"
          "-1,\"zero_optimization2\":1,\"bf16\":true,\"comms_logger\":{\"prof_ops\":[1]},"
          "\"troupe\":{\"runtime\":{\"slice_us\":50,\"inline_ns\":-2}}}");
    has("ds.json: zero_optimization.stage: must be 0, 1, 2 or 3, got 4");
    has("ds.json: troupe.runtime.slice_us: must be an integer between 100 and 100000, got 50");
    has("ds.json: troupe.runtime.inline_ns: must be an integer between -1 and 1000000000, got -2");
    has("ds.json: zero_optimization.reduce_bucket_size: must be an integer >= 0, got 5.5");
    has("ds.json: fp16.enabled: must be true or false, got 1");
    has("ds.json: aio.queue_depth: must be an integer between 1 and 65536, got \"8\"");
    has("ds.json: optimizer.params.betas: must be a list of two numbers between 0 and 1, got an "
        "array");
    has("ds.json: steps_per_print: must be an integer >= 1, got 0");
    has("ds.json: bf16: must be an object, got true");
    has("ds.json: comms_logger.prof_ops: must be a list of strings, got an array");
    assert_int_equal(diag.n_errors, 11);
}

static void test_config_auto_inside_a_section_is_the_default(void **state)
{
    tr_config_t *c = ok("{\"train_batch_size\":1,\"zero_optimization\":{\"reduce_bucket_size\":"
                        "\"auto\"},\"optimizer\":{\"type\":\"AdamW\",\"params\":{\"lr\":\"auto\","
                        "\"betas\":\"auto\"}}}");
    assert_int_equal(c->zero.reduce_bucket_size, 500000000);
    assert_true(c->optimizer.params.lr == 1e-3);
    assert_int_equal(tr_config_origin(c, "optimizer.params.lr"), TR_ORIGIN_AUTO);
    has("ds.json: zero_optimization.reduce_bucket_size: note: \"auto\" means the default here: "
        "500000000");
    has("ds.json: optimizer.params.betas: note: \"auto\" means the default here: [0.9,0.999]");
    tr_config_destroy(c);
    fails("{\"train_batch_size\":1,\"gradient_clipping\":\"auto\"}");
    has("ds.json: gradient_clipping: \"auto\" cannot be resolved at the top level; write a number "
        "(DeepSpeed's default is 1.0)");
    fails("{\"train_batch_size\":1,\"scheduler\":{\"type\":\"WarmupDecayLR\",\"params\":"
          "{\"total_num_steps\":\"auto\"}}}");
    has("ds.json: scheduler.params.total_num_steps: \"auto\" has no default to stand for here; "
        "write an integer >= 1");
}

static void test_config_offload_needs_its_settings(void **state)
{
    fails("{\"train_batch_size\":1,\"zero_optimization\":{\"stage\":2,\"offload_optimizer\":"
          "{\"device\":\"nvme\"}}}");
    has("ds.json: zero_optimization.offload_optimizer: device is \"nvme\", so nvme_path must "
        "name a folder");
    tr_config_t *c = ok("{\"train_batch_size\":1,\"zero_optimization\":{\"stage\":1,"
                        "\"offload_param\":{\"device\":\"cpu\"}}}");
    has("ds.json: zero_optimization.offload_param: warning: has no effect at stage 1; parameters "
        "are offloaded only at stage 3");
    tr_config_destroy(c);
}

/* --- parsing ------------------------------------------------------------------------------ */

static void test_config_duplicate_keys_are_rejected(void **state)
{
    fails("{\"train_batch_size\":1,\n \"zero_optimization\":{\"stage\":1,\n  \"stage\":2}}");
    has("ds.json:3:9: duplicate object key near '\"stage\"'");
}

static void test_config_syntax_errors_give_line_and_column(void **state)
{
    fails("{\n  \"train_batch_size\": 1,\n  \"fp16\": {\"enabled\": true,}\n}");
    has("ds.json:3:28: string or '}' expected near '}'");
    fails("");
    has("ds.json:1:0: '[' or '{' expected near end of file");
    fails("[1, 2]");
    has("ds.json: the top level must be a JSON object, got an array");
}

static void test_config_files_that_cannot_be_read(void **state)
{
    tr_config_t *c = NULL;
    assert_int_equal(tr_config_load("/nonexistent/ds.json", 1, &c, &diag), TR_ENOENT);
    has("/nonexistent/ds.json: cannot open: No such file or directory");
    assert_int_equal(tr_config_load("/tmp", 1, &c, &diag), TR_EISDIR);
    has("/tmp: is a directory, expected a JSON file");
    assert_null(c);
    assert_int_equal(tr_config_load("/nonexistent", 1, &c, NULL), TR_ENOENT); /* no diag */
}

static void test_config_load_reads_a_file(void **state)
{
    char path[] = "/tmp/troupe-test-config-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\""
                       ": 3}";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    tr_config_t *c = NULL;
    assert_int_equal(tr_config_load(path, 2, &c, &diag), 0);
    assert_int_equal(c->train_batch_size, 12);
    assert_string_equal(c->source, path);
    tr_config_destroy(c);
    unlink(path);
}

/* A UTF-8 byte-order mark before the text (Windows editors write one) is skipped: issue 40,
 * it failed with "'[' or '{' expected near ''". */
static void test_config_a_utf8_bom_is_skipped(void **state)
{
    tr_config_t *c = ok("\xEF\xBB\xBF{\"train_batch_size\": 8}");
    assert_int_equal(c->train_batch_size, 8);
    tr_config_destroy(c);
    char path[] = "/tmp/troupe-test-config-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "\xEF\xBB\xBF{\"train_micro_batch_size_per_gpu\": 2}\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(tr_config_load(path, 2, &c, &diag), 0);
    assert_int_equal(c->train_batch_size, 4);
    tr_config_destroy(c);
    unlink(path);
    /* a BOM and nothing else is an empty file; what follows a BOM keeps its line and column */
    fails("\xEF\xBB\xBF");
    has("ds.json:1:0: '[' or '{' expected near end of file");
    tr_config_diag_close(&diag);
    fails("\xEF\xBB\xBF{\n  \"train_batch_size\": 1,\n}");
    has("ds.json:3:1: string or '}' expected near '}'");
}

/* --- getters and dump --------------------------------------------------------------------- */

static void test_config_getters_read_the_resolved_tree(void **state)
{
    tr_config_t *c = ok("{\"train_batch_size\":8,\"zero_optimization\":{\"stage\":2}}");
    int64_t i;
    double d;
    bool b;
    const char *s;
    assert_int_equal(tr_config_get_int(c, "zero_optimization.stage", &i), 0);
    assert_int_equal(i, 2);
    assert_int_equal(tr_config_get_int(c, "zero_optimization.offload_optimizer.buffer_count", &i),
                     0);
    assert_int_equal(i, 4);
    assert_int_equal(tr_config_get_double(c, "gradient_clipping", &d), 0);
    assert_true(d == 1.0);
    assert_int_equal(tr_config_get_bool(c, "aio.overlap_events", &b), 0);
    assert_true(b);
    assert_int_equal(tr_config_get_string(c, "tensorboard.job_name", &s), 0);
    assert_string_equal(s, "DeepSpeedJobName");
    assert_int_equal(tr_config_get_int(c, "zero_optimization.nope", &i), TR_ENOENT);
    assert_int_equal(tr_config_get_bool(c, "zero_optimization.stage", &b), TR_EINVAL);
    assert_int_equal(tr_config_origin(c, "nope.nope"), TR_ORIGIN_UNKNOWN);
    tr_config_destroy(c);
    tr_config_destroy(NULL);
}

static void test_config_dump_marks_defaults_and_loads_back(void **state)
{
    tr_config_t *c = ok("{\"train_batch_size\":8,\"zero_optimization\":{\"stage\":2},"
                        "\"wandb\":{\"enabled\":false},\"optimizer\":{\"type\":\"adamw\"}}");
    char *marked = tr_config_dump(c, TR_CONFIG_DUMP_MARK);
    assert_non_null(strstr(marked, "    \"stage\": 2,\n"));
    assert_non_null(strstr(marked, "\"contiguous_gradients\": true,  // default\n"));
    assert_non_null(strstr(marked, "\"train_micro_batch_size_per_gpu\": 8,  // derived\n"));
    assert_non_null(strstr(marked, "\"wandb\": {\"enabled\":false}  // ignored\n"));
    assert_non_null(strstr(marked, "\"type\": \"AdamW\",\n"));
    char *plain = tr_config_dump(c, 0);
    assert_null(strstr(plain, "//"));
    tr_config_t *again = ok(plain);
    char *plain2 = tr_config_dump(again, 0);
    assert_string_equal(plain, plain2);
    assert_int_equal(again->zero.stage, 2);
    free(marked);
    free(plain);
    free(plain2);
    tr_config_destroy(c);
    tr_config_destroy(again);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_config_batch_rules_match_deepspeed),
        T(test_config_batch_derived_values_are_marked),
        T(test_config_batch_errors_use_deepspeed_wording),
        T(test_config_batch_auto_is_derived_or_explained),
        T(test_config_world_size_must_be_positive),
        T(test_config_world_size_from_the_launcher),
        T(test_config_pipeline_world_is_the_replicas),
        T(test_config_top_and_zero_defaults),
        T(test_config_overlap_comm_defaults_by_stage),
        T(test_config_precision_defaults),
        T(test_config_io_monitor_pipeline_defaults),
        T(test_config_sections_read_given_values),
        T(test_config_optimizer_types_and_defaults),
        T(test_config_scheduler_types_and_defaults),
        T(test_config_unknown_keys_get_hints),
        T(test_config_misplaced_keys_say_where_they_belong),
        T(test_config_deprecated_names_warn_and_apply),
        T(test_config_aliases_are_silent),
        T(test_config_unsupported_sections_warn_once_each),
        T(test_config_types_and_ranges_are_checked),
        T(test_config_auto_inside_a_section_is_the_default),
        T(test_config_offload_needs_its_settings),
        T(test_config_duplicate_keys_are_rejected),
        T(test_config_syntax_errors_give_line_and_column),
        T(test_config_files_that_cannot_be_read),
        T(test_config_load_reads_a_file),
        T(test_config_a_utf8_bom_is_skipped),
        T(test_config_getters_read_the_resolved_tree),
        T(test_config_dump_marks_defaults_and_loads_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
