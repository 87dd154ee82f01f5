/* Gradient norm, overflow check and clipping: the sum of squares against a long double
 * reference on every ISA, bitwise equal for any thread count, Inf/NaN found wherever they
 * sit (tails included) while the largest finite floats are not, DeepSpeed's clip factor
 * on a table, and the scaling pass. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu/gradnorm.h"
#include "kernels/cpu/parallel.h"
#include "troupe/error.h"
#include "kernel_testing.h"

static long double reference_sumsq(const float *g, size_t n)
{
    long double s = 0.0L;
    for (size_t i = 0; i < n; i++)
        s += (long double)g[i] * g[i];
    return s;
}

/* A sum of n positive doubles has relative error below n·2^-53 in the worst case; with
 * blocks of 16384 and pairwise lanes it is far less. 1e-11 (n ≤ 1e6: bound 1.1e-10 worst,
 * observed ~1e-15) catches any missed element (≥ 1e-7 relative here). */
static void test_gradnorm_sumsq_matches_reference_on_every_isa(void **state)
{
    size_t sizes[] = {0, 1, 7, 15, 16, 17, 1000, 16384, 16385, 1000003};
    for (int isa = TR_ISA_SCALAR; isa <= (int)tr__isa_best(); isa++) {
        tr__isa_set((tr_isa_t)isa);
        for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
            uint64_t s = 3 + k;
            float *g = kt_random(&s, sizes[k], -2.0f, 2.0f);
            long double want = reference_sumsq(g, sizes[k]);
            double got = tr_grad_sumsq(g, sizes[k]);
            assert_true(fabsl(got - want) <= 1e-11L * want);
            free(g);
        }
    }
    tr__isa_set(tr__isa_best());
}

static void test_gradnorm_sumsq_is_identical_for_any_thread_count(void **state)
{
    uint64_t s = 11;
    size_t n = 777777;
    float *g = kt_random(&s, n, -1.0f, 1.0f);
    tr_parallel_set_threads(1);
    double one = tr_grad_sumsq(g, n);
    for (int t = 2; t <= 4; t++) {
        tr_parallel_set_threads(t);
        double many = tr_grad_sumsq(g, n);
        assert_memory_equal(&many, &one, sizeof(double));
    }
    tr_parallel_set_threads(0);
    tr_parallel_shutdown();
    free(g);
}

static void test_gradnorm_finds_inf_and_nan_anywhere(void **state)
{
    size_t n = 40000;
    size_t where[] = {0, 1, 15, 16, 16383, 16384, 39990, 39999};
    float bad[] = {INFINITY, -INFINITY, NAN};
    for (int isa = TR_ISA_SCALAR; isa <= (int)tr__isa_best(); isa++) {
        tr__isa_set((tr_isa_t)isa);
        uint64_t s = 5;
        float *g = kt_random(&s, n, -1.0f, 1.0f);
        double norm;
        assert_int_equal(tr_grad_norm_finish(tr_grad_sumsq(g, n), &norm), 0);
        for (size_t w = 0; w < sizeof(where) / sizeof(where[0]); w++) {
            for (size_t b = 0; b < 3; b++) {
                float keep = g[where[w]];
                g[where[w]] = bad[b];
                assert_int_equal(tr_grad_norm_finish(tr_grad_sumsq(g, n), &norm), TR_ENONFINITE);
                assert_true(isinf(norm));
                g[where[w]] = keep;
            }
        }
        /* the largest finite floats overflow fp32 squares but not double ones */
        g[3] = 3.4e38f;
        g[39999] = -3.4e38f;
        assert_int_equal(tr_grad_norm_finish(tr_grad_sumsq(g, n), &norm), 0);
        assert_float_equal(norm / (3.4e38 * sqrt(2.0)), 1.0, 1e-6);
        free(g);
    }
    tr__isa_set(tr__isa_best());
}

/* DeepSpeed: combined = scale · max(1, (norm/scale + 1e-6)/clip) when clip > 0. */
static void test_gradnorm_clip_mul_follows_deepspeed(void **state)
{
    struct {
        double norm, scale, clip, want;
    } rows[] = {
        {10.0, 1.0, 0.0, 1.0},               /* no clipping */
        {1024.0, 1024.0, 0.0, 1.0 / 1024},   /* unscale only */
        {0.5, 1.0, 1.0, 1.0},                /* below the clip */
        {4.0, 1.0, 1.0, 1.0 / (4.0 + 1e-6)}, /* clip to norm 1 */
        {4096.0, 1024.0, 2.0, 1.0 / (1024.0 * (4.0 + 1e-6) / 2.0)},
        {1.0, 1.0, 1.0, 1.0 / (1.0 + 1e-6)}, /* exactly at the clip: the 1e-6 tips it */
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        float got = tr_grad_clip_mul(rows[i].norm, rows[i].scale, rows[i].clip);
        assert_true(got == (float)rows[i].want);
    }
}

static void test_gradnorm_scale_multiplies_every_element(void **state)
{
    uint64_t s = 8;
    size_t n = 200003;
    float *g = kt_random(&s, n, -1.0f, 1.0f), *want = kt_copy(g, n);
    tr_grad_scale(g, n, 0.125f);
    for (size_t i = 0; i < n; i++)
        assert_true(g[i] == want[i] * 0.125f);
    free(g);
    free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradnorm_sumsq_matches_reference_on_every_isa),
        cmocka_unit_test(test_gradnorm_sumsq_is_identical_for_any_thread_count),
        cmocka_unit_test(test_gradnorm_finds_inf_and_nan_anywhere),
        cmocka_unit_test(test_gradnorm_clip_mul_follows_deepspeed),
        cmocka_unit_test(test_gradnorm_scale_multiplies_every_element),
    };
    return cmocka_run_group_tests_name("gradnorm", tests, NULL, NULL);
}
