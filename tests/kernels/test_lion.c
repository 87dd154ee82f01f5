/* Lion against a scalar reference written from the paper's update (as DeepSpeed's kernels
 * order it), over random tensors with odd lengths and unaligned starts, bitwise; a
 * hand-computed step; sign(0) = 0; weight decay applied as p·(1 − lr·wd). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu/lion.h"
#include "kernel_testing.h"

/* c = β1·m + (1−β1)·g; p = p·(1 − lr·wd) − lr·sign(c); m = β2·m + (1−β2)·g */
static void reference(const tr_lion_opts_t *o, float gmul, float *p, const float *g, float *m,
                      size_t n)
{
    float decay = 1.0f - o->lr * o->weight_decay;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gmul;
        float c = o->beta1 * m[i] + (1.0f - o->beta1) * gi;
        float s = c > 0 ? 1.0f : c < 0 ? -1.0f : 0.0f;
        p[i] = p[i] * decay - o->lr * s;
        m[i] = o->beta2 * m[i] + (1.0f - o->beta2) * gi;
    }
}

static const tr_lion_opts_t configs[] = {
    {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f},
    {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.99f, .weight_decay = 0.1f},
    {.lr = 3e-4f, .beta1 = 0.95f, .beta2 = 0.98f, .weight_decay = 1.0f},
};

static void test_lion_matches_reference_bitwise(void **state)
{
    size_t offsets[] = {0, 1, 3}, lengths[] = {1, 15, 17, 1003, 100003};
    for (size_t c = 0; c < sizeof(configs) / sizeof(configs[0]); c++) {
        for (size_t k = 0; k < 5; k++) {
            size_t off = offsets[k % 3], n = lengths[k] + off;
            uint64_t s = 200 + c;
            float *p = kt_random(&s, n, -1, 1), *g = kt_random(&s, n, -1, 1);
            float *m = kt_random(&s, n, -0.1f, 0.1f);
            float *rp = kt_copy(p, n), *rm = kt_copy(m, n);
            for (int step = 0; step < 3; step++) {
                tr_lion_update(&configs[c], step ? 0.5f : 1.0f, p + off, g + off, m + off, n - off);
                reference(&configs[c], step ? 0.5f : 1.0f, rp + off, g + off, rm + off, n - off);
            }
            assert_int_equal(kt_first_diff(p, rp, n), n);
            assert_int_equal(kt_first_diff(m, rm, n), n);
            free(p);
            free(g);
            free(m);
            free(rp);
            free(rm);
        }
    }
}

/* By hand, lr 0.1, β1 0.9, β2 0.99, wd 0.5 (decay 0.95):
 *   m 0,   g  2: c =  0.2 -> p 1 -> 0.95 - 0.1 = 0.85;  m = 0.02
 *   m 0,   g -2: c = -0.2 -> p 1 -> 0.95 + 0.1 = 1.05;  m = -0.02
 *   m 0,   g  0: c =  0   -> p 1 -> 0.95 (sign 0);      m = 0
 *   m 1,   g -9:                                        m = 0.99 - 0.09 = 0.9 */
static void test_lion_hand_computed_step(void **state)
{
    tr_lion_opts_t o = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.99f, .weight_decay = 0.5f};
    float p[4] = {1, 1, 1, 1}, g[4] = {2, -2, 0, -9}, m[4] = {0, 0, 0, 1};
    tr_lion_update(&o, 1.0f, p, g, m, 4);
    assert_float_equal(p[0], 0.85f, 1e-6f);
    assert_float_equal(p[1], 1.05f, 1e-6f);
    assert_float_equal(p[2], 0.95f, 1e-6f);
    assert_float_equal(m[0], 0.02f, 1e-7f);
    assert_float_equal(m[1], -0.02f, 1e-7f);
    assert_float_equal(m[2], 0.0f, 0.0f);
    assert_float_equal(m[3], 0.9f, 1e-6f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lion_matches_reference_bitwise),
        cmocka_unit_test(test_lion_hand_computed_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
