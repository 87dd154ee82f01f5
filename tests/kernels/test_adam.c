/* Adam/AdamW: the scalar path against a reference loop written from DeepSpeed's cpu_adam
 * (bitwise), the vector paths against the scalar one (within a tolerance for FMA), tails
 * and unaligned starts against the bulk (bitwise), half copies, threads, and one hand
 * computed step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/parallel.h"
#include "kernel_testing.h"

typedef struct arrays {
    float *p, *g, *m, *v;
    size_t n;
} arrays_t;

static arrays_t make_arrays(uint64_t seed, size_t n)
{
    uint64_t s = seed;
    arrays_t a = {.n = n};
    a.p = kt_random(&s, n, -1.0f, 1.0f);
    a.g = kt_random(&s, n, -1.0f, 1.0f);
    a.m = kt_random(&s, n, -0.1f, 0.1f);
    a.v = kt_random(&s, n, 0.0f, 0.01f);
    return a;
}

static arrays_t clone(arrays_t a)
{
    return (arrays_t){kt_copy(a.p, a.n), kt_copy(a.g, a.n), kt_copy(a.m, a.n), kt_copy(a.v, a.n),
                      a.n};
}

static void free_arrays(arrays_t a)
{
    free(a.p);
    free(a.g);
    free(a.m);
    free(a.v);
}

/* DeepSpeed's Step_1 element loop, written out plainly with its own coefficients. */
static void reference_step(const tr_adam_opts_t *o, int64_t t, float gmul, arrays_t a)
{
    double b1t = 1.0, b2t = 1.0;
    for (int64_t k = 0; k < t; k++) {
        b1t *= (double)o->beta1;
        b2t *= (double)o->beta2;
    }
    float step_size = o->bias_correction ? (float)(-(double)o->lr / (1.0 - b1t)) : -o->lr;
    float bc2 = o->bias_correction ? (float)(1.0 / sqrt(1.0 - b2t)) : 1.0f;
    float b1m = 1.0f - o->beta1, b2m = 1.0f - o->beta2, w_decay = -o->lr * o->weight_decay;
    for (size_t i = 0; i < a.n; i++) {
        float grad = a.g[i] * gmul, param = a.p[i], mom = a.m[i], var = a.v[i];
        if (o->weight_decay > 0 && !o->adamw_mode) grad = param * o->weight_decay + grad;
        mom = mom * o->beta1;
        mom = grad * b1m + mom;
        var = var * o->beta2;
        grad = grad * grad;
        var = grad * b2m + var;
        grad = sqrtf(var);
        grad = grad * bc2 + o->eps;
        grad = mom / grad;
        if (o->weight_decay > 0 && o->adamw_mode) param += w_decay * param;
        a.p[i] = grad * step_size + param;
        a.m[i] = mom;
        a.v[i] = var;
    }
}

static const tr_adam_opts_t configs[] = {
    {.lr = 1e-3f,
     .beta1 = 0.9f,
     .beta2 = 0.999f,
     .eps = 1e-8f,
     .weight_decay = 0.0f,
     .adamw_mode = 1,
     .bias_correction = 1},
    {.lr = 1e-2f,
     .beta1 = 0.9f,
     .beta2 = 0.999f,
     .eps = 1e-8f,
     .weight_decay = 0.01f,
     .adamw_mode = 1,
     .bias_correction = 1},
    {.lr = 3e-4f,
     .beta1 = 0.8f,
     .beta2 = 0.99f,
     .eps = 1e-6f,
     .weight_decay = 0.1f,
     .adamw_mode = 0,
     .bias_correction = 1},
    {.lr = 1e-3f,
     .beta1 = 0.95f,
     .beta2 = 0.98f,
     .eps = 1e-8f,
     .weight_decay = 0.05f,
     .adamw_mode = 1,
     .bias_correction = 0},
};
#define N_CONFIGS (sizeof(configs) / sizeof(configs[0]))
#define STEPS     5

/* Runs STEPS steps of the library on a (grad_mul 0.5 from the third step on). */
static void run_library(const tr_adam_opts_t *o, arrays_t a)
{
    tr_adam_state_t st;
    tr_adam_state_init(&st);
    for (int s = 0; s < STEPS; s++) {
        tr_adam_state_advance(o, &st);
        tr_adam_update(o, &st, s >= 2 ? 0.5f : 1.0f, a.p, a.g, a.m, a.v, a.n, NULL, TR_HALF_NONE);
    }
}

static void test_adam_scalar_matches_reference_bitwise(void **state)
{
    tr__isa_set(TR_ISA_SCALAR);
    for (size_t c = 0; c < N_CONFIGS; c++) {
        arrays_t lib = make_arrays(1 + c, 4099), ref = clone(lib);
        run_library(&configs[c], lib);
        for (int s = 0; s < STEPS; s++)
            reference_step(&configs[c], s + 1, s >= 2 ? 0.5f : 1.0f, ref);
        assert_int_equal(kt_first_diff(lib.p, ref.p, lib.n), lib.n);
        assert_int_equal(kt_first_diff(lib.m, ref.m, lib.n), lib.n);
        assert_int_equal(kt_first_diff(lib.v, ref.v, lib.n), lib.n);
        free_arrays(lib);
        free_arrays(ref);
    }
}

/* The vector paths contract a·b + c into one FMA (one rounding instead of two: a change of
 * at most 2^-24 relative to the larger of the two terms per operation). Over STEPS steps
 * that stays far below 1e-5 of each quantity's natural scale: max|g| (1) for m, max g² (1)
 * for v, and |p| + lr·STEPS for p. A wrong formula moves p by ~lr·(1 relative), 100x the
 * tolerance at least. */
static void test_adam_vector_matches_scalar_within_fma_tolerance(void **state)
{
    tr_isa_t isas[2];
    int k = kt_vector_isas(isas);
    for (int i = 0; i < k; i++) {
        for (size_t c = 0; c < N_CONFIGS; c++) {
            arrays_t sca = make_arrays(10 + c, 1000003), vec = clone(sca);
            tr__isa_set(TR_ISA_SCALAR);
            run_library(&configs[c], sca);
            tr__isa_set(isas[i]);
            run_library(&configs[c], vec);
            double p_abs = 1e-5 * configs[c].lr * STEPS;
            assert_true(kt_close("p", vec.p, sca.p, NULL, sca.n, 1e-5, p_abs));
            assert_true(kt_close("m", vec.m, sca.m, NULL, sca.n, 0.0, 1e-5));
            assert_true(kt_close("v", vec.v, sca.v, NULL, sca.n, 0.0, 1e-5));
            free_arrays(sca);
            free_arrays(vec);
        }
    }
    tr__isa_set(tr__isa_best());
}

/* Each element's result depends on that element only, so any sub-range, at any offset
 * (unaligned) and of any length (odd tails), must give the bits of the whole-array run;
 * the guard elements around the sub-range must stay untouched (masked tails write nothing
 * past the end), the half copy included. */
static void check_subranges(tr_half_kind_t kind)
{
    const tr_adam_opts_t *o = &configs[2];
    tr_adam_state_t st;
    tr_adam_state_init(&st);
    tr_adam_state_advance(o, &st);
    arrays_t whole = make_arrays(77, 200), orig = clone(whole);
    uint16_t whole_copy[200], copy[200];
    tr_adam_update(o, &st, 1.0f, whole.p, whole.g, whole.m, whole.v, 200, whole_copy, kind);
    for (size_t off = 0; off < 19; off++) {
        for (size_t len = 0; len <= 70; len++) {
            arrays_t a = clone(orig);
            memset(copy, 0xee, sizeof(copy));
            tr_adam_update(o, &st, 1.0f, a.p + off, a.g + off, a.m + off, a.v + off, len,
                           kind ? copy + off : NULL, kind);
            for (size_t i = 0; i < 200; i++) {
                int inside = i >= off && i < off + len;
                const arrays_t *want = inside ? &whole : &orig;
                assert_memory_equal(&a.p[i], &want->p[i], sizeof(float));
                assert_memory_equal(&a.m[i], &want->m[i], sizeof(float));
                assert_memory_equal(&a.v[i], &want->v[i], sizeof(float));
                if (kind) assert_int_equal(copy[i], inside ? whole_copy[i] : 0xeeee);
            }
            free_arrays(a);
        }
    }
    free_arrays(whole);
    free_arrays(orig);
}

static void test_adam_tails_and_unaligned_starts_match_bulk(void **state)
{
    for (int isa = TR_ISA_SCALAR; isa <= (int)tr__isa_best(); isa++) {
        tr__isa_set((tr_isa_t)isa);
        check_subranges(TR_HALF_NONE);
        check_subranges(TR_HALF_FP16);
        check_subranges(TR_HALF_BF16);
    }
    tr__isa_set(tr__isa_best());
}

static void test_adam_half_copy_is_rounded_param(void **state)
{
    const tr_adam_opts_t *o = &configs[1];
    for (int isa = TR_ISA_SCALAR; isa <= (int)tr__isa_best(); isa++) {
        tr__isa_set((tr_isa_t)isa);
        for (int kind = TR_HALF_FP16; kind <= TR_HALF_BF16; kind++) {
            tr_adam_state_t st;
            tr_adam_state_init(&st);
            tr_adam_state_advance(o, &st);
            arrays_t a = make_arrays(5, 10007);
            uint16_t *copy = malloc(a.n * sizeof(uint16_t));
            tr_adam_update(o, &st, 1.0f, a.p, a.g, a.m, a.v, a.n, copy, (tr_half_kind_t)kind);
            for (size_t i = 0; i < a.n; i++) {
                uint16_t want =
                    kind == TR_HALF_FP16 ? tr_half_from_float(a.p[i]) : tr_bf16_from_float(a.p[i]);
                assert_int_equal(copy[i], want);
            }
            free(copy);
            free_arrays(a);
        }
    }
    tr__isa_set(tr__isa_best());
}

/* Tiles are independent: 1, 2 and 3 threads write the same bits. */
static void test_adam_threads_give_identical_bits(void **state)
{
    arrays_t base = make_arrays(9, 300001), one = clone(base);
    tr_parallel_set_threads(1);
    run_library(&configs[1], one);
    for (int t = 2; t <= 3; t++) {
        arrays_t many = clone(base);
        tr_parallel_set_threads(t);
        run_library(&configs[1], many);
        assert_int_equal(kt_first_diff(many.p, one.p, one.n), one.n);
        assert_int_equal(kt_first_diff(many.v, one.v, one.n), one.n);
        free_arrays(many);
    }
    tr_parallel_set_threads(0);
    tr_parallel_shutdown();
    free_arrays(base);
    free_arrays(one);
}

/* By hand: from m = v = 0 the first bias-corrected step is p − lr·g/(|g| + eps'), i.e.
 * lr·sign(g) for |g| >> eps; AdamW first shrinks p by lr·wd·p. State: β^t after 3 steps. */
static void test_adam_first_step_moves_by_lr_and_state_tracks_powers(void **state)
{
    tr_adam_opts_t o = {.lr = 0.01f,
                        .beta1 = 0.9f,
                        .beta2 = 0.999f,
                        .eps = 1e-8f,
                        .weight_decay = 0.1f,
                        .adamw_mode = 1,
                        .bias_correction = 1};
    float p[3] = {1.0f, -2.0f, 0.5f}, g[3] = {0.3f, -4.0f, 1e-3f}, m[3] = {0}, v[3] = {0};
    tr_adam_state_t st;
    tr_adam_state_init(&st);
    tr_adam_step(&o, &st, p, g, m, v, 3);
    assert_float_equal(p[0], 1.0f * (1 - 0.001f) - 0.01f, 1e-6);
    assert_float_equal(p[1], -2.0f * (1 - 0.001f) + 0.01f, 1e-6);
    assert_float_equal(p[2], 0.5f * (1 - 0.001f) - 0.01f, 1e-6);
    assert_float_equal(m[1], -0.4f, 1e-6);
    assert_float_equal(v[1], 0.016f, 1e-6);
    tr_adam_step(&o, &st, p, g, m, v, 3);
    tr_adam_step(&o, &st, p, g, m, v, 3);
    assert_int_equal(st.step, 3);
    assert_true(st.beta1_pow == (double)0.9f * (double)0.9f * (double)0.9f);
    assert_float_equal(st.beta2_pow, pow(0.999, 3), 1e-7);
}

/* Betas that change from step to step (OneCycle's momentum cycle): each step's bias
 * corrections use that step's betas raised to the step count, as torch's Adam and DeepSpeed's
 * CPU Adam do, not the product of the betas used so far. */
static void test_adam_changing_betas_correct_with_this_steps_betas(void **state)
{
    (void)state;
    tr_adam_opts_t o = {.lr = 0.01f, .beta1 = 0.95f, .beta2 = 0.999f, .eps = 1e-8f};
    tr_adam_state_t st;
    tr_adam_state_init(&st);
    const float b1[4] = {0.95f, 0.93f, 0.9f, 0.85f}, b2[4] = {0.999f, 0.999f, 0.99f, 0.99f};
    for (int t = 1; t <= 4; t++) {
        o.beta1 = b1[t - 1];
        o.beta2 = b2[t - 1];
        tr_adam_state_advance(&o, &st);
        assert_int_equal(st.step, t);
        assert_true(st.beta1_pow == pow((double)b1[t - 1], t));
        assert_true(st.beta2_pow == pow((double)b2[t - 1], t));
    }
}

/* AMSGrad as PyTorch's Adam(amsgrad=True) computes it, in float, element by element:
 * v̂ = max(v̂, v); denominator √v̂ / √(1−β2^t) + eps. The gradients shrink step after step,
 * so v falls below its maximum and the AMSGrad denominator differs from Adam's. */
static void reference_amsgrad(const tr_adam_opts_t *o, int steps, const float *g0, float *p,
                              size_t n)
{
    float *m = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
    float *vmax = calloc(n, sizeof(float));
    for (int t = 1; t <= steps; t++) {
        double bc1 = 1.0 - pow((double)o->beta1, t), bc2 = 1.0 - pow((double)o->beta2, t);
        for (size_t i = 0; i < n; i++) {
            float g = g0[i] / (float)(t * t);
            p[i] *= 1.0f - o->lr * o->weight_decay; /* AdamW */
            m[i] = o->beta1 * m[i] + (1.0f - o->beta1) * g;
            v[i] = o->beta2 * v[i] + (1.0f - o->beta2) * g * g;
            vmax[i] = fmaxf(vmax[i], v[i]);
            float den = (float)(sqrt((double)vmax[i]) / sqrt(bc2)) + o->eps;
            p[i] -= (float)(o->lr / bc1) * m[i] / den;
        }
    }
    free(m);
    free(v);
    free(vmax);
}

static void run_amsgrad(const tr_adam_opts_t *o, int steps, const float *g0, float *p, size_t n,
                        int amsgrad)
{
    float *m = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
    float *vmax = calloc(n, sizeof(float)), *g = malloc(n * sizeof(float));
    tr_adam_state_t st;
    tr_adam_state_init(&st);
    for (int t = 1; t <= steps; t++) {
        for (size_t i = 0; i < n; i++)
            g[i] = g0[i] / (float)(t * t);
        tr_adam_state_advance(o, &st);
        if (amsgrad)
            tr_adam_update_amsgrad(o, &st, 1.0f, p, g, m, v, vmax, n);
        else
            tr_adam_update(o, &st, 1.0f, p, g, m, v, n, NULL, TR_HALF_NONE);
    }
    for (size_t i = 0; amsgrad && i < n; i++) /* v̂ holds the first step's v, the largest */
        assert_true(vmax[i] >= v[i]);
    free(m);
    free(v);
    free(vmax);
    free(g);
}

static void test_adam_amsgrad_matches_pytorch_reference(void **state)
{
    const tr_adam_opts_t o = {.lr = 1e-2f,
                              .beta1 = 0.9f,
                              .beta2 = 0.99f,
                              .eps = 1e-8f,
                              .weight_decay = 0.01f,
                              .adamw_mode = 1,
                              .bias_correction = 1};
    const size_t n = 1037; /* tails on every path */
    const int steps = 6;
    uint64_t seed = 77;
    float *g0 = kt_random(&seed, n, -1.0f, 1.0f), *p0 = kt_random(&seed, n, -1.0f, 1.0f);
    float *ref = kt_copy(p0, n), *adam = kt_copy(p0, n);
    reference_amsgrad(&o, steps, g0, ref, n);
    tr__isa_set(TR_ISA_SCALAR);
    run_amsgrad(&o, steps, g0, adam, n, 0);
    tr_isa_t isas[3] = {TR_ISA_SCALAR};
    int k = 1 + kt_vector_isas(isas + 1);
    for (int i = 0; i < k; i++) {
        float *lib = kt_copy(p0, n);
        tr__isa_set(isas[i]);
        run_amsgrad(&o, steps, g0, lib, n, 1);
        /* float rounding of a different but equivalent order: 1e-5 of lr·steps */
        assert_true(kt_close("p", lib, ref, NULL, n, 1e-5, 1e-5 * o.lr * steps));
        size_t differ = 0; /* and AMSGrad is not Adam: most elements moved differently */
        for (size_t j = 0; j < n; j++)
            differ += fabsf(lib[j] - adam[j]) > 1e-4f * o.lr;
        assert_true(differ > n / 2);
        free(lib);
    }
    tr__isa_set(tr__isa_best());
    free(g0);
    free(p0);
    free(ref);
    free(adam);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adam_scalar_matches_reference_bitwise),
        cmocka_unit_test(test_adam_amsgrad_matches_pytorch_reference),
        cmocka_unit_test(test_adam_vector_matches_scalar_within_fma_tolerance),
        cmocka_unit_test(test_adam_tails_and_unaligned_starts_match_bulk),
        cmocka_unit_test(test_adam_half_copy_is_rounded_param),
        cmocka_unit_test(test_adam_threads_give_identical_bits),
        cmocka_unit_test(test_adam_first_step_moves_by_lr_and_state_tracks_powers),
        cmocka_unit_test(test_adam_changing_betas_correct_with_this_steps_betas),
    };
    return cmocka_run_group_tests_name("adam", tests, NULL, NULL);
}
