/* The public RNG (troupe/rng.h) against splitmix64's published reference outputs, its draws'
 * distributions, and the built-in layers' initialisers recomputed with it.
 *
 * Reference: Vigna's splitmix64.c from seed 0 gives 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4,
 * 0x06c45d188009454f; from seed 1234567 (Java's SplittableRandom example) 6457827717110365317,
 * 3203168211198807973, 9817491932198370423. The built-in inits must equal what a user's init
 * gets from the same functions and the same state, so a user layer can reproduce them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "troupe/model.h"
#include "troupe/rng.h"

static void test_rng_next_matches_splitmix64_reference(void **state)
{
    uint64_t s = 0;
    assert_true(tr_rng_next(&s) == 0xe220a8397b1dcdafull);
    assert_true(tr_rng_next(&s) == 0x6e789e6aa1b965f4ull);
    assert_true(tr_rng_next(&s) == 0x06c45d188009454full);
    s = 1234567;
    assert_true(tr_rng_next(&s) == 6457827717110365317ull);
    assert_true(tr_rng_next(&s) == 3203168211198807973ull);
    assert_true(tr_rng_next(&s) == 9817491932198370423ull);
}

static void test_rng_uniform_is_the_top_24_bits(void **state)
{
    uint64_t a = 42, b = 42;
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        float u = tr_rng_uniform(&a);
        assert_true(u == (float)(tr_rng_next(&b) >> 40) * 0x1p-24f);
        assert_true(u >= 0.0f && u < 1.0f);
        sum += u;
    }
    assert_true(fabs(sum / 100000 - 0.5) < 0.005); // std of the mean: 0.29 / 316 = 0.001
}

/* Mean 0, variance 1, and the normal's tail mass beyond 2 sigma (4.55%). */
static void test_rng_normal_is_standard_normal(void **state)
{
    enum { n = 200000 };
    uint64_t s = 7;
    double sum = 0, sq = 0;
    int tail = 0;
    for (int i = 0; i < n; i++) {
        double x = tr_rng_normal(&s);
        assert_true(isfinite(x));
        sum += x;
        sq += x * x;
        tail += fabs(x) > 2.0;
    }
    double mean = sum / n, var = sq / n - mean * mean;
    print_message("normal: mean %.4f var %.4f tail %.4f\n", mean, var, (double)tail / n);
    assert_true(fabs(mean) < 0.01);
    assert_true(fabs(var - 1.0) < 0.02);
    assert_true(fabs((double)tail / n - 0.0455) < 0.003);
}

/* fill_normal uses both halves of a pair; its even entries are tr_rng_normal's draws. */
static void test_rng_fill_normal_pairs_are_rng_normal_draws(void **state)
{
    uint64_t a = 99, b = 99, c = 99;
    float x[7], u[5];
    tr_rng_fill_normal(&a, x, 7, 1.0f);
    for (int k = 0; k < 4; k++)
        assert_true(x[2 * k] == tr_rng_normal(&b));
    assert_true(a == b); // 7 values took 4 pairs
    tr_rng_fill_uniform(&c, u, 5, 0.25f);
    uint64_t d = 99;
    for (int i = 0; i < 5; i++)
        assert_true(u[i] == (2.0f * tr_rng_uniform(&d) - 1.0f) * 0.25f);
}

/* The MLP's linears and GPT-2's tensors, recomputed from the seed with the public API. */
static void test_rng_builtin_inits_draw_from_the_public_rng(void **state)
{
    int widths[] = {5, 7, 3};
    tr_model_t *m;
    assert_int_equal(tr_model_mlp_create(&m, widths, 3, NULL, 0), 0);
    tr_model_init_params(m, 11);
    uint64_t s = 11;
    float want[64];
    for (int li = 0; li < tr_model_num_layers(m); li++) {
        tr_layer_t *l = tr_model_layer(m, li);
        if (!l->param_count) continue;
        tr_rng_fill_uniform(&s, want, l->param_count, 1.0f / sqrtf((float)l->in_dim));
        assert_memory_equal(tr_model_params(m) + l->param_offset, want,
                            l->param_count * sizeof(float));
    }
    tr_model_destroy(m);

    tr_gpt2_config_t cfg = {
        .max_seq_len = 4, .vocab_size = 10, .num_layers = 1, .num_heads = 1, .channels = 4};
    assert_int_equal(tr_model_gpt2_create(&m, &cfg, NULL, 0), 0);
    tr_model_init_params(m, 5);
    tr_layer_t *embed = tr_model_layer(m, 0), *h0 = tr_model_layer(m, 1);
    float *emb = malloc(embed->param_count * sizeof(float)), qkvw[48];
    s = 5;
    tr_rng_fill_normal(&s, emb, embed->param_count, 0.02f); // wte then wpe, one fill
    assert_memory_equal(tr_model_params(m), emb, embed->param_count * sizeof(float));
    tr_rng_fill_normal(&s, qkvw, 48, 0.02f); // h0's first drawn tensor: qkvw (3C, C)
    const tr_param_info_t *p = tr_layer_find_param(h0, "qkvw");
    assert_memory_equal(tr_model_params(m) + h0->param_offset + p->offset, qkvw, sizeof(qkvw));
    free(emb);
    tr_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng_next_matches_splitmix64_reference),
        cmocka_unit_test(test_rng_uniform_is_the_top_24_bits),
        cmocka_unit_test(test_rng_normal_is_standard_normal),
        cmocka_unit_test(test_rng_fill_normal_pairs_are_rng_normal_draws),
        cmocka_unit_test(test_rng_builtin_inits_draw_from_the_public_rng),
    };
    return cmocka_run_group_tests_name("rng", tests, NULL, NULL);
}
