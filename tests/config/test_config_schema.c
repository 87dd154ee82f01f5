/* The schema table itself: every key has a state (acted upon, no effect yet with a reason,
 * rejected), and the loader honours each state; values DeepSpeed accepts are accepted (a
 * Hugging Face ZeRO-3 config with reduce_bucket_size 0); integers that do not fit where the
 * engine puts them are refused; messages print the bounds really checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/config/schema.h"

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

static void has(const char *line)
{
    for (size_t i = 0; i < diag.count; i++)
        if (!strcmp(diag.items[i].text, line)) return;
    print_message("expected line: %s\ngot:\n", line);
    for (size_t i = 0; i < diag.count; i++)
        print_message("  | %s\n", diag.items[i].text);
    fail();
}

static tr_config_t *load(const char *json, int expect_rc)
{
    tr_config_t *cfg = NULL;
    int rc = tr_config_from_string(json, strlen(json), "ds.json", 1, &cfg, &diag);
    if (rc != expect_rc)
        for (size_t i = 0; i < diag.count; i++)
            print_message("  | %s\n", diag.items[i].text);
    assert_int_equal(rc, expect_rc);
    return cfg;
}

/* --- every key has a state ------------------------------------------------------------- */

static int unclassified;

static void check_key(const tr__cfg_section_t *sec, const tr__cfg_key_t *k)
{
    bool ok;
    switch (k->kind) {
    case TR__K_SECTION:
        ok = k->sub != NULL;
        break;
    case TR__K_VARIANT:
        ok = k->variants != NULL;
        break;
    case TR__K_ALIAS:
        ok = tr__cfg_find(sec, k->alias_of) != NULL;
        break;
    case TR__K_IGNORED:
        ok = k->state == TR__S_INERT;
        break;
    case TR__K_REJECT:
        ok = k->state == TR__S_REJECTED;
        break;
    default:
        ok = k->state == TR__S_ACTED || (k->state == TR__S_INERT && k->why && k->why[0]);
    }
    if (!ok) {
        print_message("%s%s%s: no state (or an inert key without a reason)\n", sec->name,
                      sec->name[0] ? "." : "", k->name);
        unclassified++;
    }
}

static int walk(const tr__cfg_section_t *sec)
{
    int keys = 0;
    for (size_t i = 0; i < sec->n_keys; i++) {
        const tr__cfg_key_t *k = &sec->keys[i];
        check_key(sec, k);
        keys++;
        if (k->kind == TR__K_SECTION) keys += walk(k->sub);
        for (int v = 1; k->kind == TR__K_VARIANT && k->variants[v]; v++)
            keys += walk(k->variants[v]);
    }
    return keys;
}

static void test_config_schema_every_key_has_a_state(void **state)
{
    unclassified = 0;
    int keys = walk(&tr__cfg_top);
    assert_true(keys > 200);
    assert_int_equal(unclassified, 0);
}

/* The keys issue 10 found read and dropped: each is now acted upon, or warns when given. */
static void test_config_schema_inert_keys_warn_with_their_reason(void **state)
{
    tr_config_t *c = load("{\"train_batch_size\": 1, \"zero_optimization\": {\"stage\": 1},"
                          " \"pipeline\": {\"stages\": 2, \"pipe_partitioned\": false},"
                          " \"activation_checkpointing\": {\"partition_activations\": true}}",
                          0);
    has("ds.json: pipeline.pipe_partitioned: warning: accepted: this part of pipeline "
        "parallelism is not built yet; no effect yet");
    has("ds.json: activation_checkpointing.partition_activations: warning: accepted: "
        "activation checkpointing is not built yet; no effect yet");
    assert_int_equal(diag.n_warnings, 2); /* zero_optimization.stage, pipeline.stages: acted */
    tr_config_destroy(c);
    tr_config_diag_close(&diag);
    c = load("{\"train_batch_size\": 1, \"troupe\": {\"runtime\": {\"deterministic\": true}}}", 0);
    assert_int_equal(diag.n_warnings, 0); /* acted upon: the engine runs the seeded scheduler */
    tr_config_destroy(c);
    /* the defaults written out lose nothing: no warning */
    tr_config_diag_close(&diag);
    c = load("{\"train_batch_size\": 1, \"zero_optimization\": {\"stage\": 0, "
             "\"contiguous_gradients\": true}, \"pipeline\": {\"stages\": \"auto\"}}",
             0);
    assert_int_equal(diag.n_warnings, 0);
    tr_config_destroy(c);
}

static const tr__cfg_key_t *find_path(const char *section_path, const char *name)
{
    const tr__cfg_section_t *sec = &tr__cfg_top;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", section_path);
    for (char *part = strtok(buf, "."); part; part = strtok(NULL, ".")) {
        const tr__cfg_key_t *k = tr__cfg_find(sec, part);
        assert_non_null(k);
        sec = k->kind == TR__K_SECTION ? k->sub : k->variants[1]; /* params: the first type */
    }
    return tr__cfg_find(sec, name);
}

static void test_config_schema_dropped_keys_are_now_acted_upon(void **state)
{
    static const char *const acted[][2] = {
        {"optimizer.params", "amsgrad"},   {"scheduler.params", "last_batch_iteration"},
        {"troupe.data", "seed"},           {"", "prescale_gradients"},
        {"", "gradient_predivide_factor"},
    };
    for (size_t i = 0; i < sizeof(acted) / sizeof(acted[0]); i++) {
        const tr__cfg_key_t *k = find_path(acted[i][0], acted[i][1]);
        assert_non_null(k);
        assert_int_equal(k->state, TR__S_ACTED);
    }
}

/* --- DeepSpeed's ranges ---------------------------------------------------------------- */

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *b = calloc(1, 1 << 16);
    size_t n = fread(b, 1, (1 << 16) - 1, f);
    fclose(f);
    b[n] = 0;
    return b;
}

/* The ZeRO-3 config of Hugging Face's DeepSpeed integration docs, filled in as the Trainer
 * does, with reduce_bucket_size 0: rejected before this issue. */
static void test_config_schema_hf_zero3_config_is_accepted(void **state)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/examples/configs/hf_zero3_reduce_bucket_0.json", TR_SRC);
    char *json = read_file(path);
    tr_config_t *c = load(json, 0);
    assert_int_equal(c->zero.reduce_bucket_size, 0);
    assert_int_equal(c->zero.stage, 3);
    assert_int_equal(c->zero.offload_param.device, TR_OFFLOAD_CPU);
    tr_config_destroy(c);
    free(json);
}

static void test_config_schema_values_deepspeed_accepts(void **state)
{
    tr_config_t *c = load("{\"train_batch_size\": 1, \"zero_optimization\": {"
                          "\"reduce_bucket_size\": 0, \"allgather_bucket_size\": 0, "
                          "\"sub_group_size\": 0, \"offload_optimizer\": {\"buffer_count\": 0},"
                          " \"offload_param\": {\"buffer_count\": 0, \"buffer_size\": 0}},"
                          " \"gradient_clipping\": -1, \"optimizer\": {\"type\": \"Adam\","
                          " \"params\": {\"lr\": 1e308}}, \"communication_data_type\": \"BF16\","
                          " \"fp16\": {\"loss_scale_window\": 0, \"min_loss_scale\": 0}}",
                          0);
    assert_true(c->optimizer.params.lr == 1e308);
    assert_true(c->gradient_clipping == -1);
    assert_int_equal(c->communication_data_type, TR_DTYPE_BF16);
    tr_config_destroy(c);
}

/* --- integers that do not fit, and the bounds messages print --------------------------- */

static void test_config_schema_integers_never_truncate(void **state)
{
    assert_null(load("{\"train_micro_batch_size_per_gpu\": 4294967300}", TR_ECONFIG));
    has("ds.json: train_micro_batch_size_per_gpu: 4294967300 does not fit: the engine's limit "
        "is 2147483647");
    tr_config_diag_close(&diag);
    assert_null(load("{\"train_batch_size\": 8589934592, \"train_micro_batch_size_per_gpu\": 1}",
                     TR_ECONFIG));
    has("ds.json: gradient_accumulation_steps: 8589934592 (derived) does not fit: the engine's "
        "limit is 2147483647");
    tr_config_diag_close(&diag);
    assert_null(load("{\"train_batch_size\": 1, \"fp16\": {\"hysteresis\": 4294967298}, "
                     "\"troupe\": {\"trace\": {\"steps\": {\"wait\": 4294967296}}, \"data\": "
                     "{\"prefetch\": 65}}}",
                     TR_ECONFIG));
    has("ds.json: fp16.hysteresis: must be an integer between -2147483648 and 2147483647, got "
        "4294967298");
    has("ds.json: troupe.trace.steps.wait: must be an integer between 0 and 4294967295, got "
        "4294967296");
    has("ds.json: troupe.data.prefetch: must be an integer between 1 and 64, got 65");
    tr_config_diag_close(&diag);
    tr_config_t *c = load("{\"train_micro_batch_size_per_gpu\": 2147483647}", 0);
    assert_int_equal(c->train_micro_batch_size_per_gpu, 2147483647);
    tr_config_destroy(c);
}

static void test_config_schema_messages_print_the_real_bounds(void **state)
{
    assert_null(load("{\"train_batch_size\": 1, \"optimizer\": {\"type\": \"Adam\", \"params\":"
                     " {\"lr\": -1}}, \"gradient_predivide_factor\": 0}",
                     TR_ECONFIG));
    has("ds.json: optimizer.params.lr: must be a number >= 0, got -1");
    has("ds.json: gradient_predivide_factor: must be a number > 0, got 0");
    tr_config_diag_close(&diag);
    tr_config_t *c = load("{\"train_batch_size\": 1, \"gradient_predivide_factor\": 1e-310}", 0);
    tr_config_destroy(c);
}

/* --- the 1-bit optimizers -------------------------------------------------------------- */

static void test_config_schema_onebit_optimizers_run_as_their_base(void **state)
{
    static const char *const names[] = {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"};
    static const char *const refusals[] = {"1bit-Adam", "0/1 Adam", "1bit-Lamb"};
    for (int i = 0; i < 3; i++) {
        char json[256], line[256];
        snprintf(json, sizeof(json),
                 "{\"train_batch_size\": 1, \"optimizer\": {\"type\": "
                 "\"%s\", \"params\": {\"lr\": 0.01}}}",
                 names[i]);
        tr_config_t *c = load(json, 0);
        assert_int_equal(tr_config_optimizer_runs_as(c->optimizer.type),
                         i == 2 ? TR_OPTIMIZER_LAMB : TR_OPTIMIZER_ADAM);
        snprintf(line, sizeof(line),
                 "ds.json: optimizer.type: warning: %s runs as %s: its "
                 "compressed communication needs world size > 1 and is not built yet",
                 names[i], i == 2 ? "Lamb" : "Adam");
        has(line);
        tr_config_destroy(c);
        tr_config_diag_close(&diag);
        snprintf(json, sizeof(json),
                 "{\"train_batch_size\": 1, \"zero_optimization\": "
                 "{\"stage\": 2}, \"optimizer\": {\"type\": \"%s\"}}",
                 names[i]);
        assert_null(load(json, TR_ECONFIG));
        snprintf(line, sizeof(line),
                 "ds.json: optimizer.type: %s is not compatible with ZeRO "
                 "(zero_optimization.stage is 2)",
                 refusals[i]);
        has(line);
        tr_config_diag_close(&diag);
    }
    tr_config_t *c = load("{\"train_batch_size\": 1, \"optimizer\": {\"type\": \"lion\", "
                          "\"params\": {\"lr\": 1e-4, \"betas\": [0.9, 0.99], "
                          "\"weight_decay\": 0.1}}}",
                          0);
    assert_int_equal(c->optimizer.type, TR_OPTIMIZER_LION);
    assert_true(c->optimizer.params.betas[1] == 0.99 && c->optimizer.params.weight_decay == 0.1);
    assert_int_equal(diag.n_warnings, 0);
    tr_config_destroy(c);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_config_schema_every_key_has_a_state),
        T(test_config_schema_inert_keys_warn_with_their_reason),
        T(test_config_schema_dropped_keys_are_now_acted_upon),
        T(test_config_schema_hf_zero3_config_is_accepted),
        T(test_config_schema_values_deepspeed_accepts),
        T(test_config_schema_integers_never_truncate),
        T(test_config_schema_messages_print_the_real_bounds),
        T(test_config_schema_onebit_optimizers_run_as_their_base),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
