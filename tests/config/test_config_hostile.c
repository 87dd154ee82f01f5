/* 100 malformed or hostile configuration inputs (truncated files, deep nesting, huge numbers,
 * wrong types, invalid UTF-8, NUL bytes, an empty file, a directory, ...). Each must give an
 * error naming the file, and never a crash or a leak (this test also runs under ASan). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "troupe/config.h"

#define MAX_INPUTS 128

typedef struct input {
    char *text;
    size_t len;
} input_t;

static input_t inputs[MAX_INPUTS];
static int n_inputs;

static void add(const char *text, size_t len)
{
    assert_true(n_inputs < MAX_INPUTS);
    inputs[n_inputs].text = malloc(len + 1);
    memcpy(inputs[n_inputs].text, text, len);
    inputs[n_inputs].text[len] = 0;
    inputs[n_inputs].len = len;
    n_inputs++;
}

static void add_str(const char *text)
{
    add(text, strlen(text));
}

static const char valid[] =
    "{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4,\n"
    " \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}},\n"
    " \"fp16\": {\"enabled\": true, \"loss_scale_window\": 500},\n"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4, \"betas\": [0.9, 0.95]}},\n"
    " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 10}}}\n";

/* 30: the valid config cut short at evenly spaced points. */
static void add_truncated(void)
{
    size_t len = strlen(valid) - 2; /* strictly before the closing brace */
    for (int i = 0; i < 30; i++)
        add(valid, len * (size_t)i / 30);
}

/* 6: nesting far deeper than any config (jansson's parser limit), closed and unclosed. */
static void add_deep(void)
{
    static const size_t depths[] = {3000, 100000};
    for (int d = 0; d < 2; d++) {
        size_t n = depths[d];
        char *b = malloc(2 * n + 64);
        size_t o = (size_t)sprintf(b, "{\"train_batch_size\": 1, \"fp16\": ");
        memset(b + o, '[', n);
        add(b, o + n); /* unclosed */
        memset(b + o + n, ']', n);
        b[o + 2 * n] = '}';
        add(b, o + 2 * n + 1); /* closed */
        o = (size_t)sprintf(b, "{\"a\":");
        for (size_t i = 0; i < n / 8; i++)
            memcpy(b + o + 5 * i, "{\"a\":", 5);
        add(b, o + 5 * (n / 8)); /* objects, unclosed */
        free(b);
    }
}

/* 10: numbers too large, too small or not integral where integers are needed. */
static void add_numbers(void)
{
    add_str("{\"train_batch_size\": 1e999}");
    add_str("{\"train_batch_size\": 99999999999999999999999999}");
    add_str("{\"train_batch_size\": -1e308}");
    add_str("{\"train_batch_size\": 1, \"zero_optimization\": {\"stage\": 1e18}}");
    add_str("{\"train_micro_batch_size_per_gpu\": 9223372036854775807, "
            "\"gradient_accumulation_steps\": 2}");
    add_str("{\"train_batch_size\": 1, \"fp16\": {\"loss_scale\": 1e308}}");
    add_str("{\"train_batch_size\": 1, \"fp16\": {\"initial_scale_power\": -9223372036854775808}}");
    add_str("{\"train_batch_size\": 1, \"aio\": {\"block_size\": 1.5}}");
    add_str("{\"train_batch_size\": 1e-320}");
    add_str("{\"train_batch_size\": 1, \"optimizer\": {\"type\": \"Adam\", \"params\": "
            "{\"lr\": -0.0, \"eps\": -1e-300}}}");
}

/* 27: a wrong type or value at each kind of key. */
static void add_wrong_types(void)
{
    static const char *const bodies[] = {
        "\"fp16\": {\"enabled\": \"true\"}",
        "\"fp16\": []",
        "\"zero_optimization\": 2",
        "\"zero_optimization\": {\"stage\": null}",
        "\"zero_optimization\": {\"stage\": true}",
        "\"optimizer\": {\"type\": 7}",
        "\"optimizer\": {\"type\": \"Adam\", \"params\": []}",
        "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": \"auto0\"}}",
        "\"scheduler\": \"WarmupLR\"",
        "\"scheduler\": {\"type\": null}",
        "\"aio\": {\"single_submit\": 0}",
        "\"csv_monitor\": {\"job_name\": 5}",
        "\"comms_logger\": {\"prof_ops\": \"all_reduce\"}",
        "\"checkpoint\": {\"tag_validation\": [\"Warn\"]}",
        "\"pipeline\": {\"stages\": \"four\"}",
        "\"steps_per_print\": {}",
        "\"gradient_clipping\": \"1.0\"",
        "\"troupe\": {\"trace\": {\"steps\": 3}}",
        "\"activation_checkpointing\": {\"number_checkpoints\": 0}",
        "\"bf16\": {\"enabled\": null}",
        "\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"CPU\"}}",
        "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9, \"x\"]}}",
        "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_type\": \"cos\"}}",
        "\"zero_optimization\": {\"cpu_offload\": \"yes\"}",
        "\"troupe\": {\"data\": {\"prefetch\": 1e6}}",
        "\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}",
        "\"dataloader_drop_last\": \"false\"",
    };
    char b[512];
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        snprintf(b, sizeof(b), "{\"train_batch_size\": 4, %s}", bodies[i]);
        add_str(b);
    }
}

/* 8: invalid UTF-8 and NUL bytes, in keys and in values. */
static void add_bad_bytes(void)
{
    static const char *const bad[] = {"\xff", "\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf8\x88\x80"};
    char b[128];
    for (int i = 0; i < 5; i++) {
        int n = snprintf(b, sizeof(b), "{\"train_batch_size\": 1, \"k%s\": 1}", bad[i]);
        add(b, (size_t)n);
    }
    add("{\"train_batch_size\": 1,\0 \"fp16\": {}}", 36);
    add_str("{\"train_batch_size\": 1, \"csv_monitor\": {\"job_name\": \"a\\u0000b\"}}");
    add_str("{\"train_batch_size\": 1, \"a\\u0000\": 1}");
}

/* 14: empty, blank, non-object tops, and odd keys. */
static void add_odd(void)
{
    add("", 0);
    add_str("   \n\t  ");
    add_str("\"train_batch_size\"");
    add_str("42");
    add_str("null");
    add_str("{}");
    add_str("\xef\xbb\xbf{\"train_batch_size\": 1}");
    add_str("{\"train_batch_size\": 1} {\"train_batch_size\": 2}");
    add_str("{\"train_batch_size\": 1, \"\\n\\u001b[31m\": 1}");
    add_str("{\"train_batch_size\": 1, \"\": {}}");
    add_str("{\"train_batch_size\": 1, \"fp16\": {\"enabled\": true, \"enabled\": false}}");
    add_str("{'train_batch_size': 1}");
    add_str("{\"train_batch_size\": 1, /* comment */ \"fp16\": {}}");
    add_str("{\"train_batch_size\": NaN}");
}

/* 3: very long keys and very many keys. */
static void add_large(void)
{
    size_t n = 200000;
    char *b = malloc(n + 64);
    size_t o = (size_t)sprintf(b, "{\"train_batch_size\": 1, \"");
    memset(b + o, 'x', n);
    o += n;
    o += (size_t)sprintf(b + o, "\": 1}");
    add(b, o);
    free(b);
    b = malloc(20 * 10000 + 64);
    o = (size_t)sprintf(b, "{\"train_batch_size\": 1");
    for (int i = 0; i < 10000; i++)
        o += (size_t)sprintf(b + o, ", \"k%d\": %d", i, i);
    b[o++] = '}';
    add(b, o);
    o = (size_t)sprintf(b, "{\"train_batch_size\": 1, \"comms_logger\": {\"prof_ops\": [");
    for (int i = 0; i < 40; i++)
        o += (size_t)sprintf(b + o, "%s\"op%d\"", i ? "," : "", i);
    o += (size_t)sprintf(b + o, "]}}");
    add(b, o);
    free(b);
}

static int setup(void **state)
{
    add_truncated();
    add_deep();
    add_numbers();
    add_wrong_types();
    add_bad_bytes();
    add_odd();
    add_large();
    return 0;
}

static int teardown(void **state)
{
    for (int i = 0; i < n_inputs; i++)
        free(inputs[i].text);
    return 0;
}

static void expect_error(int i, int err, tr_config_t *cfg, const tr_config_diag_t *d,
                         const char *name)
{
    if (err == 0 || cfg || d->n_errors == 0) {
        print_message("input %d was accepted:\n%.200s\n", i, i >= 0 ? inputs[i].text : name);
        fail();
    }
    for (size_t j = 0; j < d->count; j++)
        if (strncmp(d->items[j].text, name, strlen(name))) {
            print_message("input %d: a line does not name the file: %s\n", i, d->items[j].text);
            fail();
        }
}

static void test_config_hostile_inputs_are_errors(void **state)
{
    assert_int_equal(n_inputs, 98);
    for (int i = 0; i < n_inputs; i++) {
        tr_config_diag_t d;
        tr_config_diag_init(&d);
        tr_config_t *cfg = NULL;
        int err = tr_config_from_string(inputs[i].text, inputs[i].len, "hostile.json", 2, &cfg, &d);
        expect_error(i, err, cfg, &d, "hostile.json");
        tr_config_destroy(cfg);
        tr_config_diag_close(&d);
    }
}

static void test_config_hostile_paths_are_errors(void **state)
{
    static const char *const paths[] = {"/", "/nonexistent/dir/ds.json"};
    for (int i = 0; i < 2; i++) { /* inputs 99 and 100: a directory, a missing file */
        tr_config_diag_t d;
        tr_config_diag_init(&d);
        tr_config_t *cfg = NULL;
        int err = tr_config_load(paths[i], 1, &cfg, &d);
        expect_error(-1, err, cfg, &d, paths[i]);
        tr_config_diag_close(&d);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_hostile_inputs_are_errors),
        cmocka_unit_test(test_config_hostile_paths_are_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
