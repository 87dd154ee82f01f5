/* llm.c's file formats: a checkpoint written by hand in llm.c's order lands in the right
 * place of Troupe's per-layer layout, save/load round-trips bit-exactly, token shards
 * round-trip, and every kind of bad file is an error that names the file and the field.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe/error.h"
#include "troupe/io.h"
#include "troupe/model.h"

/* A tiny config: maxT 4, V 10, Vp 12, L 2, NH 2, C 4. */
enum { MAXT = 4, V = 10, VP = 12, L = 2, NH = 2, C = 4 };

static char dir[] = "/tmp/test_llmc_XXXXXX";

static int setup(void **state)
{
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd);
}

static const char *file(const char *name)
{
    static char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return path;
}

static size_t total_floats(void)
{
    return (size_t)VP * C + MAXT * C + L * (12 * C * C + 13 * C) + 2 * C;
}

/* Writes a header (with one field overridden) and n floats 0, 1, 2, ... */
static void write_checkpoint(const char *path, int field, int value, size_t n)
{
    int32_t h[256] = {20240326, 3, MAXT, V, L, NH, C, VP};
    if (field >= 0) h[field] = value;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(h, 4, 256, f);
    for (size_t i = 0; i < n; i++) {
        float x = (float)i;
        fwrite(&x, 4, 1, f);
    }
    fclose(f);
}

static const float *param(tr_model_t *m, int layer, const char *name)
{
    tr_layer_t *l = tr_model_layer(m, layer);
    const tr_param_info_t *p = tr_layer_find_param(l, name);
    assert_non_null(p);
    return tr_model_params(m) + l->param_offset + p->offset;
}

static void test_llmc_checkpoint_order_maps_to_layers(void **state)
{
    const char *path = file("order.bin");
    write_checkpoint(path, -1, 0, total_floats());
    tr_model_t *m;
    char why[256];
    assert_int_equal(tr_llmc_gpt2_load(path, &m, why, sizeof(why)), 0);
    const tr_gpt2_config_t *g = tr_model_gpt2_config(m);
    assert_int_equal(g->padded_vocab_size, VP);
    assert_int_equal(g->num_layers, L);
    // llm.c's offsets: wte 0, wpe VP C, ln1w (L, C) next, then ln1b (L, C), qkvw (L, 3C, C)
    size_t wpe = VP * C, ln1w = wpe + MAXT * C, ln1b = ln1w + L * C, qkvw = ln1b + L * C;
    assert_true(param(m, 0, "wte")[5] == 5.0f);
    assert_true(param(m, 0, "wpe")[0] == (float)wpe);
    assert_true(param(m, 1, "ln1w")[0] == (float)ln1w);       // block 0
    assert_true(param(m, 2, "ln1w")[0] == (float)(ln1w + C)); // block 1
    assert_true(param(m, 2, "ln1b")[3] == (float)(ln1b + C + 3));
    assert_true(param(m, 2, "qkvw")[7] == (float)(qkvw + 3 * C * C + 7));
    size_t lnfw = total_floats() - 2 * C;
    assert_true(param(m, L + 1, "lnfw")[1] == (float)(lnfw + 1));
    assert_true(param(m, L + 1, "lnfb")[C - 1] == (float)(total_floats() - 1));
    tr_model_destroy(m);
}

static void test_llmc_checkpoint_save_load_round_trips(void **state)
{
    tr_gpt2_config_t cfg = {MAXT, V, VP, L, NH, C};
    tr_model_t *a, *b;
    assert_int_equal(tr_model_gpt2_create(&a, &cfg, NULL, 0), 0);
    tr_model_init_params(a, 9);
    assert_int_equal(tr_llmc_gpt2_save(a, file("rt.bin"), NULL, 0), 0);
    assert_int_equal(tr_llmc_gpt2_load(file("rt.bin"), &b, NULL, 0), 0);
    assert_int_equal(tr_model_num_params(a), tr_model_num_params(b));
    assert_memory_equal(tr_model_params(a), tr_model_params(b),
                        tr_model_num_params(a) * sizeof(float));
    // a model of another shape refuses the file
    cfg.channels = 8;
    tr_model_t *c;
    char why[256];
    assert_int_equal(tr_model_gpt2_create(&c, &cfg, NULL, 0), 0);
    assert_int_equal(tr_llmc_gpt2_load_into(c, file("rt.bin"), why, sizeof(why)), TR_EMISMATCH);
    tr_model_destroy(a);
    tr_model_destroy(b);
    tr_model_destroy(c);
}

static void expect_bad(const char *path, const char *field)
{
    tr_model_t *m = NULL;
    char why[256] = "";
    assert_int_equal(tr_llmc_gpt2_load(path, &m, why, sizeof(why)), TR_EFORMAT);
    assert_null(m);
    if (!strstr(why, path) || !strstr(why, field))
        fail_msg("message '%s' should name %s and %s", why, path, field);
}

static void test_llmc_bad_checkpoints_name_file_and_field(void **state)
{
    write_checkpoint(file("magic.bin"), 0, 1234, total_floats());
    expect_bad(file("magic.bin"), "magic");
    write_checkpoint(file("version.bin"), 1, 5, total_floats());
    expect_bad(file("version.bin"), "version");
    write_checkpoint(file("heads.bin"), 5, 3, total_floats());
    expect_bad(file("heads.bin"), "num_heads");
    write_checkpoint(file("vp.bin"), 7, 0, total_floats());
    expect_bad(file("vp.bin"), "padded_vocab_size");
    write_checkpoint(file("short.bin"), -1, 0, total_floats() - 1);
    expect_bad(file("short.bin"), "truncated");
    write_checkpoint(file("long.bin"), -1, 0, total_floats() + 1);
    expect_bad(file("long.bin"), "trailing");
    FILE *f = fopen(file("tiny.bin"), "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    expect_bad(file("tiny.bin"), "header");
    char why[256];
    tr_model_t *m;
    assert_int_equal(tr_llmc_gpt2_load(file("missing.bin"), &m, why, sizeof(why)), TR_ENOENT);
}

static void test_llmc_tokens_round_trip_and_reject_bad_shards(void **state)
{
    uint16_t tokens[1001];
    for (int i = 0; i < 1001; i++)
        tokens[i] = (uint16_t)(i * 37 % 50257);
    assert_int_equal(tr_llmc_tokens_save(file("tok.bin"), tokens, 1001, NULL, 0), 0);
    uint16_t *back;
    size_t n;
    assert_int_equal(tr_llmc_tokens_load(file("tok.bin"), &back, &n, NULL, 0), 0);
    assert_int_equal(n, 1001);
    assert_memory_equal(back, tokens, sizeof(tokens));
    free(back);
    // truncate by one token: the header promises more than the file has
    assert_int_equal(truncate(file("tok.bin"), 1024 + 2 * 1000), 0);
    char why[256];
    assert_int_equal(tr_llmc_tokens_load(file("tok.bin"), &back, &n, why, sizeof(why)), TR_EFORMAT);
    assert_non_null(strstr(why, "truncated"));
    // a checkpoint is not a token shard
    write_checkpoint(file("ck.bin"), -1, 0, 3);
    assert_int_equal(tr_llmc_tokens_load(file("ck.bin"), &back, &n, why, sizeof(why)), TR_EFORMAT);
    assert_non_null(strstr(why, "magic"));
}

/* A directory is named as one, not reported as a "truncated header" (fopen opens it). */
static void test_llmc_directory_is_named_as_one(void **state)
{
    char why[256] = "";
    tr_model_t *m = NULL;
    assert_int_equal(tr_llmc_gpt2_load(dir, &m, why, sizeof(why)), TR_EISDIR);
    assert_null(m);
    if (!strstr(why, dir) || !strstr(why, "is a directory") || strstr(why, "truncated"))
        fail_msg("message '%s' should say %s is a directory", why, dir);
    uint16_t *t;
    size_t n;
    assert_int_equal(tr_llmc_tokens_load(dir, &t, &n, why, sizeof(why)), TR_EISDIR);
    assert_non_null(strstr(why, "is a directory"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llmc_checkpoint_order_maps_to_layers),
        cmocka_unit_test(test_llmc_checkpoint_save_load_round_trips),
        cmocka_unit_test(test_llmc_bad_checkpoints_name_file_and_field),
        cmocka_unit_test(test_llmc_tokens_round_trip_and_reject_bad_shards),
        cmocka_unit_test(test_llmc_directory_is_named_as_one),
    };
    return cmocka_run_group_tests_name("llmc", tests, setup, teardown);
}
