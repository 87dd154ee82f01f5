/* SGD against a reference loop written from torch.optim.SGD's single-tensor step, over
 * random tensors, for every ISA. The element loop has no FP contraction, so every path,
 * vectorised or not, must match the reference bitwise, odd lengths and unaligned starts
 * included. Plus a hand-computed momentum run and PyTorch's nesterov rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu/sgd.h"
#include "troupe/error.h"
#include "kernel_testing.h"

static void reference(const tr_sgd_opts_t *o, int first, float gmul, float *p, const float *g,
                      float *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float d = g[i] * gmul;
        if (o->weight_decay != 0.0f) d = d + o->weight_decay * p[i];
        if (o->momentum != 0.0f) {
            buf[i] = first ? d : buf[i] * o->momentum + (1.0f - o->dampening) * d;
            d = o->nesterov ? d + o->momentum * buf[i] : buf[i];
        }
        p[i] = p[i] + -o->lr * d;
    }
}

static const tr_sgd_opts_t configs[] = {
    {.lr = 0.1f},
    {.lr = 0.05f, .momentum = 0.9f},
    {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 1e-4f},
    {.lr = 0.01f, .momentum = 0.8f, .nesterov = 1, .weight_decay = 5e-4f},
};

static void test_sgd_every_isa_matches_reference_bitwise(void **state)
{
    size_t offsets[] = {0, 1, 3}, lengths[] = {1, 15, 17, 1003, 100003};
    for (int isa = TR_ISA_SCALAR; isa <= (int)tr__isa_best(); isa++) {
        tr__isa_set((tr_isa_t)isa);
        for (size_t c = 0; c < sizeof(configs) / sizeof(configs[0]); c++) {
            for (size_t k = 0; k < 5; k++) {
                size_t off = offsets[k % 3], n = lengths[k] + off;
                uint64_t s = 100 + c;
                float *p = kt_random(&s, n, -1, 1), *g = kt_random(&s, n, -1, 1);
                float *buf = kt_random(&s, n, -1, 1);
                float *rp = kt_copy(p, n), *rbuf = kt_copy(buf, n);
                for (int step = 0; step < 3; step++) {
                    tr_sgd_update(&configs[c], step == 0, 0.5f, p + off, g + off, buf + off,
                                  n - off);
                    reference(&configs[c], step == 0, 0.5f, rp + off, g + off, rbuf + off, n - off);
                }
                assert_int_equal(kt_first_diff(p, rp, n), n);
                assert_int_equal(kt_first_diff(buf, rbuf, n), n);
                free(p);
                free(g);
                free(buf);
                free(rp);
                free(rbuf);
            }
        }
    }
    tr__isa_set(tr__isa_best());
}

/* p = 1, g = 0.5, lr 0.1, momentum 0.9: buf 0.5 then 0.95; p 0.95 then 0.855. */
static void test_sgd_momentum_by_hand(void **state)
{
    tr_sgd_opts_t o = {.lr = 0.1f, .momentum = 0.9f};
    float p = 1.0f, g = 0.5f, buf = 123.0f;
    tr_sgd_update(&o, 1, 1.0f, &p, &g, &buf, 1);
    assert_float_equal(buf, 0.5f, 1e-7);
    assert_float_equal(p, 0.95f, 1e-7);
    tr_sgd_update(&o, 0, 1.0f, &p, &g, &buf, 1);
    assert_float_equal(buf, 0.95f, 1e-7);
    assert_float_equal(p, 0.855f, 1e-7);
}

static void test_sgd_check_follows_pytorch_nesterov_rule(void **state)
{
    tr_sgd_opts_t o = {.lr = 0.1f, .momentum = 0.9f, .nesterov = 1};
    assert_int_equal(tr_sgd_check(&o), 0);
    o.dampening = 0.1f;
    assert_int_equal(tr_sgd_check(&o), TR_EINVAL);
    o = (tr_sgd_opts_t){.lr = 0.1f, .nesterov = 1};
    assert_int_equal(tr_sgd_check(&o), TR_EINVAL);
    o = (tr_sgd_opts_t){.lr = -1.0f};
    assert_int_equal(tr_sgd_check(&o), TR_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_every_isa_matches_reference_bitwise),
        cmocka_unit_test(test_sgd_momentum_by_hand),
        cmocka_unit_test(test_sgd_check_follows_pytorch_nesterov_rule),
    };
    return cmocka_run_group_tests_name("sgd", tests, NULL, NULL);
}
