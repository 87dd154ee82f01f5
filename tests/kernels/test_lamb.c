/* LAMB against a reference loop written from DeepSpeed's fused LAMB kernel, over random
 * tensors and for every ISA: bitwise, since the element loops have no FP contraction and
 * the norms are summed in double (the library's fixed blocks and the reference's one
 * running sum can differ in the last bits of a double; rounded to the float trust ratio
 * they agree on these seeds, and a real error would move p by ~lr). Plus the trust-ratio
 * clamps, the zero-norm rule, and identical bits for any thread count. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu/lamb.h"
#include "kernels/cpu/parallel.h"
#include "kernel_testing.h"

static float reference(const tr_lamb_opts_t *o, int64_t t, float gmul, float *p, const float *g,
                       float *m, float *v, size_t n)
{
    double w2 = 0.0, u2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gmul;
        m[i] = o->beta1 * m[i] + (1.0f - o->beta1) * gi;
        v[i] = o->beta2 * v[i] + (1.0f - o->beta2) * (gi * gi);
    }
    for (size_t i = 0; i < n; i++) {
        float den = o->eps_inside_sqrt ? sqrtf(v[i] + o->eps) : sqrtf(v[i]) + o->eps;
        double u = m[i] / den + o->weight_decay * p[i];
        w2 += (double)p[i] * p[i];
        u2 += u * u;
    }
    double coeff = 1.0;
    if (w2 > 0 && u2 > 0) coeff = fmin(fmax(sqrt(w2) / sqrt(u2), o->min_coeff), o->max_coeff);
    double step = o->lr;
    if (o->bias_correction)
        step = o->lr * sqrt(1.0 - pow(o->beta2, (double)t)) / (1.0 - pow(o->beta1, (double)t));
    float k = -((float)step * (float)coeff);
    for (size_t i = 0; i < n; i++) {
        float den = o->eps_inside_sqrt ? sqrtf(v[i] + o->eps) : sqrtf(v[i]) + o->eps;
        p[i] = p[i] + k * (m[i] / den + o->weight_decay * p[i]);
    }
    return (float)coeff;
}

static const tr_lamb_opts_t configs[] = {
    {.lr = 1e-3f,
     .beta1 = 0.9f,
     .beta2 = 0.999f,
     .eps = 1e-8f,
     .weight_decay = 0.01f,
     .max_coeff = 10.0f,
     .min_coeff = 0.01f,
     .bias_correction = 1},
    {.lr = 1e-2f,
     .beta1 = 0.8f,
     .beta2 = 0.99f,
     .eps = 1e-6f,
     .weight_decay = 0.0f,
     .max_coeff = 10.0f,
     .min_coeff = 0.01f,
     .bias_correction = 0,
     .eps_inside_sqrt = 1},
};

static void advance(const tr_lamb_opts_t *o, tr_adam_state_t *st)
{
    tr_adam_opts_t a = {.beta1 = o->beta1, .beta2 = o->beta2};
    tr_adam_state_advance(&a, st);
}

static void test_lamb_every_isa_matches_reference_bitwise(void **state)
{
    size_t lengths[] = {1, 17, 40001};
    for (int isa = TR_ISA_SCALAR; isa <= (int)tr__isa_best(); isa++) {
        tr__isa_set((tr_isa_t)isa);
        for (size_t c = 0; c < 2; c++) {
            for (size_t k = 0; k < 3; k++) {
                size_t n = lengths[k];
                uint64_t s = 200 + c + k;
                float *p = kt_random(&s, n, -1, 1), *g = kt_random(&s, n, -1, 1);
                float *m = kt_random(&s, n, -0.1f, 0.1f), *v = kt_random(&s, n, 0, 0.01f);
                float *rp = kt_copy(p, n), *rm = kt_copy(m, n), *rv = kt_copy(v, n);
                tr_adam_state_t st;
                tr_adam_state_init(&st);
                for (int step = 1; step <= 3; step++) {
                    advance(&configs[c], &st);
                    float got = tr_lamb_update(&configs[c], &st, 0.5f, p, g, m, v, n);
                    float want = reference(&configs[c], step, 0.5f, rp, g, rm, rv, n);
                    assert_true(got == want);
                }
                assert_int_equal(kt_first_diff(p, rp, n), n);
                assert_int_equal(kt_first_diff(m, rm, n), n);
                assert_int_equal(kt_first_diff(v, rv, n), n);
                free(p);
                free(g);
                free(m);
                free(v);
                free(rp);
                free(rm);
                free(rv);
            }
        }
    }
    tr__isa_set(tr__isa_best());
}

/* ‖p‖/‖u‖ is ~1000 with p = 100 and tiny gradients at step 1 (|u| = 1): clamped to 10;
 * with p = 1e-4 it is ~1e-4: clamped to 0.01; with p = 0 and no decay: 1. */
static void test_lamb_trust_ratio_clamps_and_zero_rule(void **state)
{
    tr_lamb_opts_t o = configs[0];
    o.weight_decay = 0.0f;
    float values[] = {100.0f, 1e-4f, 0.0f}, want[] = {10.0f, 0.01f, 1.0f};
    for (int k = 0; k < 3; k++) {
        float p[64], g[64], m[64] = {0}, v[64] = {0};
        for (int i = 0; i < 64; i++) {
            p[i] = values[k];
            g[i] = i % 2 ? 1e-3f : -1e-3f;
        }
        tr_adam_state_t st;
        tr_adam_state_init(&st);
        advance(&o, &st);
        assert_true(tr_lamb_update(&o, &st, 1.0f, p, g, m, v, 64) == want[k]);
    }
}

static void test_lamb_threads_give_identical_bits(void **state)
{
    size_t n = 100003;
    uint64_t s = 7;
    float *p0 = kt_random(&s, n, -1, 1), *g = kt_random(&s, n, -1, 1);
    float *results[3];
    for (int t = 1; t <= 3; t++) {
        tr_parallel_set_threads(t);
        float *p = kt_copy(p0, n), *m = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
        tr_adam_state_t st;
        tr_adam_state_init(&st);
        advance(&configs[0], &st);
        tr_lamb_update(&configs[0], &st, 1.0f, p, g, m, v, n);
        results[t - 1] = p;
        free(m);
        free(v);
    }
    assert_int_equal(kt_first_diff(results[1], results[0], n), n);
    assert_int_equal(kt_first_diff(results[2], results[0], n), n);
    tr_parallel_set_threads(0);
    tr_parallel_shutdown();
    free(p0);
    free(g);
    free(results[0]);
    free(results[1]);
    free(results[2]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lamb_every_isa_matches_reference_bitwise),
        cmocka_unit_test(test_lamb_trust_ratio_clamps_and_zero_rule),
        cmocka_unit_test(test_lamb_threads_give_identical_bits),
    };
    return cmocka_run_group_tests_name("lamb", tests, NULL, NULL);
}
