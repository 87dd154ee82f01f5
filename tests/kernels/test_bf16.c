/* bf16 mixed precision: the bf16 products against references, and a model's bf16 pass against
 * its fp32 pass.
 *
 * - tr__gemm_bf16, both ways (oneDNN's bf16 matmul, the emulation), every transpose, with and
 *   without accumulation, at sizes that are not multiples of anything, against a double
 *   product of the same bf16 values: each product of two bf16 values is exact, so the only
 *   error is fp32 accumulation, bounded by 1e-5 of the sum of |a||b| per element.
 * - The linear layer with a bf16 weight copy against its fp32 self: within bf16's rounding of
 *   both operands (2^-8 of the sum of |x||w| per element, with slack), forward and backward.
 * - Attention with bf16 products against its fp32 self: output and input gradient within 1% of
 *   the largest fp32 value (bf16 rounds q, k, v, the probabilities and the gradients by 2^-9
 *   relative: measured 0.3%), causal, and not bitwise fp32 (the bf16 path ran).
 * - A GPT-2 model's loss and gradients in bf16 against fp32 (bf16 tolerances stated below), a
 *   bf16 pass bitwise repeatable, and the bf16 copies following the parameters after
 *   tr_model_params_changed (a stale copy fails the check).
 */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/blas_internal.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/ops.h"
#include "troupe/error.h"
#include "troupe/model.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *frand_array(size_t n)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = frand();
    return p;
}

static uint16_t *bf16_rand(size_t n)
{
    uint16_t *p = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        p[i] = tr_bf16_from_float(frand());
    return p;
}

static double at(const uint16_t *m, int t, int r, int c, int ld)
{
    return tr_bf16_to_float(t ? m[(size_t)c * ld + r] : m[(size_t)r * ld + c]);
}

/* One product against the double reference; A, B stored with a leading dimension wider than
 * needed, so strides are exercised. */
static void check_gemm(int backend, int ta, int tb, float beta)
{
    enum { M = 37, N = 29, K = 70, PAD = 3 };
    int lda = (ta ? M : K) + PAD, ldb = (tb ? K : N) + PAD, ldc = N + PAD;
    uint16_t *A = bf16_rand((size_t)(ta ? K : M) * lda), *B = bf16_rand((size_t)(tb ? N : K) * ldb);
    float *Cm = malloc((size_t)M * ldc * sizeof(float)),
          *C0 = malloc((size_t)M * ldc * sizeof(float));
    for (int i = 0; i < M * ldc; i++)
        C0[i] = Cm[i] = frand();
    tr__gemm_bf16(backend, ta, tb, M, N, K, A, lda, B, ldb, beta, Cm, ldc);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double want = beta * (double)C0[i * ldc + j], mag = fabs(want);
            for (int k = 0; k < K; k++) {
                double p = at(A, ta, i, k, lda) * at(B, tb, k, j, ldb);
                want += p;
                mag += fabs(p);
            }
            double err = fabs(Cm[i * ldc + j] - want);
            if (err > 1e-5 * mag + 1e-30)
                fail_msg("%s ta %d tb %d beta %g: C[%d,%d] = %.9g, want %.9g (bound %.3g)",
                         tr__bf16_backend_name(backend), ta, tb, beta, i, j, Cm[i * ldc + j], want,
                         1e-5 * mag);
        }
    for (int i = 0; i < M; i++) /* the padding is not written */
        for (int j = N; j < ldc; j++)
            assert_true(Cm[i * ldc + j] == C0[i * ldc + j]);
    free(A);
    free(B);
    free(Cm);
    free(C0);
}

static void test_gemm_bf16_matches_double_reference(void **state)
{
    (void)state;
    for (int backend = 0; backend < 2; backend++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                check_gemm(backend, ta, tb, 0.0f);
                check_gemm(backend, ta, tb, 1.0f);
            }
}

/* |got - want| <= tol * sum_k |a_ik||b_kj| for each element, given the magnitudes. */
static void expect_close(const char *what, const float *got, const float *want, const double *mag,
                         size_t n, double tol)
{
    for (size_t i = 0; i < n; i++)
        if (fabs((double)got[i] - want[i]) > tol * mag[i] + 1e-6)
            fail_msg("%s[%zu]: bf16 %.7g, fp32 %.7g, bound %.3g", what, i, got[i], want[i],
                     tol * mag[i]);
}

static void test_linear_bf16_within_rounding_of_fp32(void **state)
{
    (void)state;
    enum { NR = 130, C = 96, OC = 72 };
    float *x = malloc(sizeof(float) * NR * C), *w = malloc(sizeof(float) * OC * C);
    float *dy = malloc(sizeof(float) * NR * OC), b[OC];
    for (int i = 0; i < NR * C; i++)
        x[i] = frand();
    for (int i = 0; i < OC * C; i++)
        w[i] = frand();
    for (int i = 0; i < NR * OC; i++)
        dy[i] = frand();
    for (int i = 0; i < OC; i++)
        b[i] = frand();
    uint16_t *wh = malloc(sizeof(uint16_t) * OC * C);
    tr_half_from_float_array(wh, w, (size_t)OC * C, TR_HALF_BF16);

    float *out = malloc(sizeof(float) * NR * OC), *out32 = malloc(sizeof(float) * NR * OC);
    double *mag = calloc((size_t)NR * C + (size_t)OC * C + NR * OC, sizeof(double));
    tr__linear_forward(out, x, w, wh, b, NR, C, OC);
    tr__linear_forward(out32, x, w, NULL, b, NR, C, OC);
    for (int n = 0; n < NR; n++)
        for (int o = 0; o < OC; o++)
            for (int c = 0; c < C; c++)
                mag[n * OC + o] += fabs(x[n * C + c] * w[o * C + c]);
    /* each operand rounds by at most 2^-9 relative: a product by 2^-8, plus fp32 sums */
    expect_close("forward", out, out32, mag, (size_t)NR * OC, 0x1p-8 * 1.01);

    float *dx = calloc((size_t)NR * C, sizeof(float)),
          *dx32 = calloc((size_t)NR * C, sizeof(float));
    float *dw = calloc((size_t)OC * C, sizeof(float)),
          *dw32 = calloc((size_t)OC * C, sizeof(float));
    float db[OC] = {0}, db32[OC] = {0};
    tr__linear_backward(dx, dw, db, dy, x, w, wh, NR, C, OC);
    tr__linear_backward(dx32, dw32, db32, dy, x, w, NULL, NR, C, OC);
    memset(mag, 0, sizeof(double) * ((size_t)NR * C + (size_t)OC * C));
    for (int n = 0; n < NR; n++)
        for (int c = 0; c < C; c++)
            for (int o = 0; o < OC; o++) {
                mag[n * C + c] += fabs(dy[n * OC + o] * w[o * C + c]);
                mag[(size_t)NR * C + o * C + c] += fabs(dy[n * OC + o] * x[n * C + c]);
            }
    expect_close("dinp", dx, dx32, mag, (size_t)NR * C, 0x1p-8 * 1.01);
    expect_close("dweight", dw, dw32, mag + (size_t)NR * C, (size_t)OC * C, 0x1p-8 * 1.01);
    for (int o = 0; o < OC; o++) /* the bias gradient is a sum of fp32 gradients: the same */
        assert_true(db[o] == db32[o]);
    free(x);
    free(w);
    free(dy);
    free(wh);
    free(out);
    free(out32);
    free(mag);
    free(dx);
    free(dx32);
    free(dw);
    free(dw32);
}

/* --- a GPT-2 model ------------------------------------------------------------------------ */

enum { MB = 2, MT = 16 };

static tr_model_t *gpt2(int bf16)
{
    tr_gpt2_config_t cfg = {.max_seq_len = MT,
                            .vocab_size = 50,
                            .padded_vocab_size = 64,
                            .num_layers = 2,
                            .num_heads = 4,
                            .channels = 64};
    tr_model_t *m;
    char why[200];
    assert_int_equal(tr_model_gpt2_create(&m, &cfg, why, sizeof(why)), 0);
    tr_model_init_params(m, 7);
    assert_int_equal(tr_model_set_bf16(m, bf16), 0);
    assert_int_equal(tr_model_bf16(m), bf16);
    return m;
}

static float pass(tr_model_t *m)
{
    int tokens[MB * MT], targets[MB * MT];
    for (int i = 0; i < MB * MT; i++) {
        tokens[i] = (i * 7 + 3) % 50;
        targets[i] = (i * 11 + 5) % 50;
    }
    tr_batch_t b = {.B = MB, .T = MT, .tokens = tokens, .targets = targets};
    float loss = 0;
    tr_model_zero_grad(m);
    assert_int_equal(tr_model_forward(m, &b, &loss), 0);
    assert_int_equal(tr_model_backward(m, NULL, NULL), 0);
    return loss;
}

/* |got - want| <= tol max|want| for each element; true when some element differs at all */
static bool within_of_max(const char *what, const float *got, const float *want, size_t n,
                          double tol)
{
    double mx = 0;
    bool differs = false;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(want[i]));
    for (size_t i = 0; i < n; i++) {
        if (fabs((double)got[i] - want[i]) > tol * mx)
            fail_msg("%s[%zu]: bf16 %.7g, fp32 %.7g, bound %.3g", what, i, got[i], want[i],
                     tol * mx);
        differs |= got[i] != want[i];
    }
    return differs;
}

static void test_attention_bf16_within_rounding_of_fp32(void **state)
{
    (void)state;
    enum { AB = 2, AT = 37, NH = 3, HS = 16, AC = NH * HS, N = AB * AT };
    size_t n3 = (size_t)N * 3 * AC, n = (size_t)N * AC, na = (size_t)AB * NH * AT * AT;
    float *qkv = frand_array(n3), *dout = frand_array(n);
    float *out[2], *att[2], *dinp[2], *scratch[2];
    for (int k = 0; k < 2; k++) { /* 0: bf16, 1: fp32 */
        out[k] = malloc(n * sizeof(float));
        att[k] = malloc(na * sizeof(float));
        dinp[k] = malloc(n3 * sizeof(float));
        scratch[k] = malloc(na * sizeof(float));
        tr__attention_forward(out[k], att[k], qkv, AB, AT, AC, NH, k == 0);
        tr__attention_backward(dinp[k], scratch[k], dout, qkv, att[k], AB, AT, AC, NH, k == 0);
    }
    for (int bh = 0; bh < AB * NH; bh++) /* causal: no weight above the diagonal */
        for (int t = 0; t < AT; t++)
            for (int u = t + 1; u < AT; u++)
                assert_true(att[0][((size_t)bh * AT + t) * AT + u] == 0.0f);
    assert_true(within_of_max("attention out", out[0], out[1], n, 1e-2));
    assert_true(within_of_max("attention dinp", dinp[0], dinp[1], n3, 1e-2));
    for (int k = 0; k < 2; k++) {
        free(out[k]);
        free(att[k]);
        free(dinp[k]);
        free(scratch[k]);
    }
    free(qkv);
    free(dout);
}

static void test_gpt2_bf16_tracks_fp32(void **state)
{
    (void)state;
    tr_model_t *m16 = gpt2(1), *m32 = gpt2(0);
    float l16 = pass(m16), l32 = pass(m32);
    size_t n = tr_model_num_params(m16);
    const float *g16 = tr_model_grads(m16), *g32 = tr_model_grads(m32);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        diff += ((double)g16[i] - g32[i]) * ((double)g16[i] - g32[i]);
        norm += (double)g32[i] * g32[i];
    }
    printf("loss bf16 %.6f fp32 %.6f; gradient: normwise relative difference %.3g\n", l16, l32,
           sqrt(diff / norm));
    /* bf16 keeps 8 bits: the loss within 0.5%, the gradient within 3% normwise */
    assert_true(fabsf(l16 - l32) <= 5e-3f * l32);
    assert_true(sqrt(diff / norm) <= 3e-2);
    assert_true(l16 != l32); /* the bf16 path really ran */

    /* repeatable bitwise */
    float again = pass(m16);
    assert_true(again == l16);
    tr_model_destroy(m16);
    tr_model_destroy(m32);
}

static void test_bf16_copies_follow_the_parameters(void **state)
{
    (void)state;
    /* move a's parameters and tell it; a model given the same parameters before its bf16
     * copies were first made must compute the same */
    tr_model_t *a = gpt2(1);
    float *pa = tr_model_params(a);
    for (size_t i = 0; i < tr_model_num_params(a); i++)
        pa[i] *= 1.5f;
    tr_model_params_changed(a);
    tr_model_t *fresh = gpt2(0);
    float *pf = tr_model_params(fresh);
    for (size_t i = 0; i < tr_model_num_params(a); i++)
        pf[i] *= 1.5f;
    assert_int_equal(tr_model_set_bf16(fresh, 1), 0); /* copies made from the moved params */
    assert_true(pass(a) == pass(fresh));
    tr_model_destroy(a);
    tr_model_destroy(fresh);
}

int main(void)
{
    printf("bf16 products here: %s (AVX512-BF16 %s)\n", tr__bf16_backend_name(tr__bf16_backend()),
           tr_bf16_native() ? "present" : "absent");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_bf16_matches_double_reference),
        cmocka_unit_test(test_linear_bf16_within_rounding_of_fp32),
        cmocka_unit_test(test_attention_bf16_within_rounding_of_fp32),
        cmocka_unit_test(test_gpt2_bf16_tracks_fp32),
        cmocka_unit_test(test_bf16_copies_follow_the_parameters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
