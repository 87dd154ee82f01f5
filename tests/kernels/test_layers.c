/* The layer kernels against independent double-precision references.
 *
 * For each op: a naive double forward written here (not shared with the library); the float
 * forward must match it; the float backward, fed dout = R (random), must match central finite
 * differences (step 1e-5, in double) of the objective sum(ref_forward(inputs) * R) with respect
 * to every input and parameter. The error measure is normwise: max |g - fd| / max |fd| over a
 * tensor, with the bound stated per op below. Every check runs for each ISA this CPU has
 * (scalar, AVX2, AVX-512), so all three kernel paths are held to the same bound.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec.h"
#include "troupe/error.h"
#include "troupe/model.h"

/* Sizes: B batch, T time, C channels, OC output channels, NH heads, V vocab, Vp padded. */
enum { B = 2, T = 5, C = 8, OC = 6, NH = 2, V = 7, Vp = 9, N = B * T };
#define FD_STEP 1e-5

/* Normwise relative error bounds of the backward, per op (float vs double FD). */
#define TOL_LINEAR       1e-6
#define TOL_LAYERNORM    2e-6
#define TOL_GELU         2e-6
#define TOL_RESIDUAL     5e-7
#define TOL_EMBEDDING    5e-7
#define TOL_ATTENTION    1e-6
#define TOL_CROSSENTROPY 1e-6
#define TOL_MSE          1e-6
/* float forward vs double forward */
#define TOL_FORWARD 1e-5

static uint64_t rng_state = 42;

static double urand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static double *drand_array(size_t n, double scale)
{
    double *x = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        x[i] = urand() * scale;
    return x;
}

static float *to_float(const double *x, size_t n)
{
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = (float)x[i];
    return f;
}

static double rel_error(const float *got, const double *want, size_t n)
{
    double worst = 0.0, scale = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY; /* fmax below would pass over a NaN */
        worst = fmax(worst, fabs((double)got[i] - want[i]));
        scale = fmax(scale, fabs(want[i]));
    }
    return worst / scale;
}

/* An op's double objective sum(ref(inputs) R); fd_grad perturbs x[0..n) in place. */
typedef double (*objective_fn)(void *ctx);

static double *fd_grad(objective_fn f, void *ctx, double *x, size_t n)
{
    double *g = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        double save = x[i];
        x[i] = save + FD_STEP;
        double lp = f(ctx);
        x[i] = save - FD_STEP;
        double lm = f(ctx);
        x[i] = save;
        g[i] = (lp - lm) / (2 * FD_STEP);
    }
    return g;
}

static void expect_grad(const char *what, objective_fn f, void *ctx, double *x, size_t n,
                        const float *analytic, double tol)
{
    double *fd = fd_grad(f, ctx, x, n);
    double err = rel_error(analytic, fd, n);
    print_message("%-22s %-7s relative error %.2e (bound %.0e)\n", what,
                  tr__vec_isa_name(tr__vec_isa()), err, tol);
    if (err > tol)
        fail_msg("%s (isa %s): backward vs finite differences: relative error %.3g > %.1g", what,
                 tr__vec_isa_name(tr__vec_isa()), err, tol);
    free(fd);
}

static void expect_forward(const char *what, const float *got, const double *want, size_t n)
{
    double err = rel_error(got, want, n);
    if (err > TOL_FORWARD)
        fail_msg("%s (isa %s): forward vs double reference: relative error %.3g", what,
                 tr__vec_isa_name(tr__vec_isa()), err);
}

static double dot_r(const double *out, const double *r, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += out[i] * r[i];
    return s;
}

/* Runs body once per ISA this CPU supports. */
#define FOR_EACH_ISA(isa)                                                                          \
    for (int isa = TR__ISA_SCALAR; isa <= (int)tr__vec_best_isa() && !tr__vec_set_isa(isa); isa++)

/* ---- linear --------------------------------------------------------------------------------- */

typedef struct {
    double *x, *w, *b, *r; // (N, C) (OC, C) (OC) (N, OC)
} lin_ctx;

static void ref_linear(double *out, const double *x, const double *w, const double *b)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0.0;
            for (int c = 0; c < C; c++)
                s += x[n * C + c] * w[o * C + c];
            out[n * OC + o] = s;
        }
}

static double lin_objective(void *p)
{
    lin_ctx *c = p;
    double out[N * OC];
    ref_linear(out, c->x, c->w, c->b);
    return dot_r(out, c->r, N * OC);
}

static void check_linear(int with_bias)
{
    lin_ctx c = {drand_array(N * C, 1), drand_array(OC * C, 1),
                 with_bias ? drand_array(OC, 1) : NULL, drand_array(N * OC, 1)};
    float *x = to_float(c.x, N * C), *w = to_float(c.w, OC * C), *r = to_float(c.r, N * OC);
    float *b = with_bias ? to_float(c.b, OC) : NULL, out[N * OC];
    float dx[N * C] = {0}, dw[OC * C] = {0}, db[OC] = {0};
    double want[N * OC];
    tr__linear_forward(out, x, w, NULL, b, N, C, OC);
    ref_linear(want, c.x, c.w, c.b);
    expect_forward("linear", out, want, N * OC);
    tr__linear_backward(dx, dw, with_bias ? db : NULL, r, x, w, NULL, N, C, OC);
    expect_grad("linear dinp", lin_objective, &c, c.x, N * C, dx, TOL_LINEAR);
    expect_grad("linear dweight", lin_objective, &c, c.w, OC * C, dw, TOL_LINEAR);
    if (with_bias) expect_grad("linear dbias", lin_objective, &c, c.b, OC, db, TOL_LINEAR);
    free(c.x);
    free(c.w);
    free(c.b);
    free(c.r);
    free(x);
    free(w);
    free(r);
    free(b);
}

static void test_layers_linear_backward_matches_finite_differences(void **state)
{
    FOR_EACH_ISA(isa)
    {
        check_linear(1);
        check_linear(0);
    }
}

/* The fused linear passes (ops.h) against the separate ones they replace, bitwise: the forward
 * with a residual and a GELU after it, the input gradient written (not added) and through a
 * GELU. 200 rows: several row blocks and a short last one; 24 columns: a vector tail. Outputs
 * start as NaN, so a fused pass that adds to them, or skips a block, shows. */
static float *float_array(size_t n, double scale)
{
    double *d = drand_array(n, scale);
    float *f = to_float(d, n);
    free(d);
    return f;
}

static float *nan_array(size_t n)
{
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f[i] = NAN;
    return f;
}

static void test_layers_fused_linear_equals_separate_passes(void **state)
{
    enum { FN = 200, FC = 40, FOC = 24 };
    FOR_EACH_ISA(isa)
    {
        float *x = float_array(FN * FC, 1), *w = float_array(FOC * FC, 1);
        float *b = float_array(FOC, 1), *res = float_array(FN * FOC, 1);
        float *want = malloc(FN * FOC * sizeof(float)),
              *want_gelu = malloc(FN * FOC * sizeof(float));
        float *out = nan_array(FN * FOC), *out_gelu = nan_array(FN * FOC);
        tr__linear_forward(want, x, w, NULL, b, FN, FC, FOC);
        for (int i = 0; i < FN * FOC; i++)
            want[i] += res[i];
        tr__gelu_forward(want_gelu, want, FN * FOC);
        tr__linear_forward_fused(out, out_gelu, x, w, NULL, b, res, FN, FC, FOC);
        assert_memory_equal(out, want, FN * FOC * sizeof(float));
        assert_memory_equal(out_gelu, want_gelu, FN * FOC * sizeof(float));

        float *dy = float_array(FN * FOC, 1), *pre = float_array(FN * FC, 2);
        float *dprod = calloc(FN * FC, sizeof(float)), *dwant = calloc(FN * FC, sizeof(float));
        float *dx = nan_array(FN * FC), *dx_gelu = nan_array(FN * FC);
        tr__linear_backward(dprod, NULL, NULL, dy, NULL, w, NULL, FN, FC, FOC);
        tr__gelu_backward(dwant, pre, dprod, FN * FC);
        tr__linear_backward_input(dx, dy, w, NULL, NULL, FN, FC, FOC);
        tr__linear_backward_input(dx_gelu, dy, w, NULL, pre, FN, FC, FOC);
        assert_memory_equal(dx, dprod, FN * FC * sizeof(float));
        assert_memory_equal(dx_gelu, dwant, FN * FC * sizeof(float));
        free(x);
        free(w);
        free(b);
        free(res);
        free(want);
        free(want_gelu);
        free(out);
        free(out_gelu);
        free(dy);
        free(pre);
        free(dprod);
        free(dwant);
        free(dx);
        free(dx_gelu);
    }
}

/* ---- layernorm ------------------------------------------------------------------------------ */

typedef struct {
    double *x, *w, *b, *r; // (N, C) (C) (C) (N, C)
} ln_ctx;

static void ref_layernorm(double *out, const double *x, const double *w, const double *b)
{
    for (int n = 0; n < N; n++) {
        const double *xr = x + n * C;
        double m = 0, v = 0;
        for (int i = 0; i < C; i++)
            m += xr[i] / C;
        for (int i = 0; i < C; i++)
            v += (xr[i] - m) * (xr[i] - m) / C;
        for (int i = 0; i < C; i++)
            out[n * C + i] = (xr[i] - m) / sqrt(v + 1e-5) * w[i] + b[i];
    }
}

static double ln_objective(void *p)
{
    ln_ctx *c = p;
    double out[N * C];
    ref_layernorm(out, c->x, c->w, c->b);
    return dot_r(out, c->r, N * C);
}

static void test_layers_layernorm_backward_matches_finite_differences(void **state)
{
    FOR_EACH_ISA(isa)
    {
        ln_ctx c = {drand_array(N * C, 2), drand_array(C, 1), drand_array(C, 1),
                    drand_array(N * C, 1)};
        float *x = to_float(c.x, N * C), *w = to_float(c.w, C), *b = to_float(c.b, C);
        float *r = to_float(c.r, N * C), out[N * C], mean[N], rstd[N];
        float dx[N * C] = {0}, dw[C] = {0}, db[C] = {0};
        double want[N * C];
        tr__layernorm_forward(out, mean, rstd, x, w, b, N, C);
        ref_layernorm(want, c.x, c.w, c.b);
        expect_forward("layernorm", out, want, N * C);
        tr__layernorm_backward(dx, dw, db, r, x, w, mean, rstd, N, C);
        expect_grad("layernorm dinp", ln_objective, &c, c.x, N * C, dx, TOL_LAYERNORM);
        expect_grad("layernorm dweight", ln_objective, &c, c.w, C, dw, TOL_LAYERNORM);
        expect_grad("layernorm dbias", ln_objective, &c, c.b, C, db, TOL_LAYERNORM);
        free(c.x);
        free(c.w);
        free(c.b);
        free(c.r);
        free(x);
        free(w);
        free(b);
        free(r);
    }
}

/* ---- gelu and residual ---------------------------------------------------------------------- */

#define NG 37 /* odd: exercises the vector tails */

typedef struct {
    double *x, *y, *r;
} ew_ctx;

static void ref_gelu(double *out, const double *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = 0.5 * x[i] * (1 + tanh(sqrt(2 / M_PI) * (x[i] + 0.044715 * pow(x[i], 3))));
}

static double gelu_objective(void *p)
{
    ew_ctx *c = p;
    double out[NG];
    ref_gelu(out, c->x, NG);
    return dot_r(out, c->r, NG);
}

static double residual_objective(void *p)
{
    ew_ctx *c = p;
    double out[NG];
    for (int i = 0; i < NG; i++)
        out[i] = c->x[i] + c->y[i];
    return dot_r(out, c->r, NG);
}

static void test_layers_gelu_and_residual_backward_match_finite_differences(void **state)
{
    FOR_EACH_ISA(isa)
    {
        ew_ctx c = {drand_array(NG, 4), drand_array(NG, 1), drand_array(NG, 1)};
        float *x = to_float(c.x, NG), *y = to_float(c.y, NG), *r = to_float(c.r, NG);
        float out[NG], dx[NG] = {0}, dy[NG] = {0};
        double want[NG];
        tr__gelu_forward(out, x, NG);
        ref_gelu(want, c.x, NG);
        expect_forward("gelu", out, want, NG);
        tr__gelu_backward(dx, x, r, NG);
        expect_grad("gelu dinp", gelu_objective, &c, c.x, NG, dx, TOL_GELU);

        memset(dx, 0, sizeof(dx));
        tr__residual_backward(dx, dy, r, NG);
        expect_grad("residual da", residual_objective, &c, c.x, NG, dx, TOL_RESIDUAL);
        expect_grad("residual db", residual_objective, &c, c.y, NG, dy, TOL_RESIDUAL);
        free(c.x);
        free(c.y);
        free(c.r);
        free(x);
        free(y);
        free(r);
    }
}

/* ---- embedding ------------------------------------------------------------------------------ */

typedef struct {
    int tokens[N];
    double *wte, *wpe, *r; // (V, C) (T, C) (N, C)
} emb_ctx;

static double emb_objective(void *p)
{
    emb_ctx *c = p;
    double s = 0;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++)
            s += (c->wte[c->tokens[n] * C + i] + c->wpe[(n % T) * C + i]) * c->r[n * C + i];
    return s;
}

static void test_layers_embedding_backward_matches_finite_differences(void **state)
{
    emb_ctx c = {
        .wte = drand_array(V * C, 1), .wpe = drand_array(T * C, 1), .r = drand_array(N * C, 1)};
    for (int n = 0; n < N; n++)
        c.tokens[n] = n % 3; // repeated tokens: their gradients must add up
    float *wte = to_float(c.wte, V * C), *wpe = to_float(c.wpe, T * C), *r = to_float(c.r, N * C);
    float out[N * C], dwte[V * C] = {0}, dwpe[T * C] = {0};
    assert_int_equal(tr__embedding_forward(out, c.tokens, wte, wpe, B, T, C, V), 0);
    tr__embedding_backward(dwte, dwpe, r, c.tokens, B, T, C);
    expect_grad("embedding dwte", emb_objective, &c, c.wte, V * C, dwte, TOL_EMBEDDING);
    expect_grad("embedding dwpe", emb_objective, &c, c.wpe, T * C, dwpe, TOL_EMBEDDING);
    c.tokens[3] = V; // out of range: an error, not a crash
    assert_int_equal(tr__embedding_forward(out, c.tokens, wte, wpe, B, T, C, V), TR_EINVAL);
    free(c.wte);
    free(c.wpe);
    free(c.r);
    free(wte);
    free(wpe);
    free(r);
}

/* ---- attention: the naive scalar version, written from the definition ------------------------ */

typedef struct {
    double *qkv, *r; // (B, T, 3C) (B, T, C)
} att_ctx;

static void ref_attention(double *out, const double *qkv)
{
    int hs = C / NH;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + (b * T + t) * 3 * C + h * hs;
                double s[T], mx = -INFINITY, sum = 0;
                for (int u = 0; u <= t; u++) {
                    const double *k = qkv + (b * T + u) * 3 * C + C + h * hs;
                    s[u] = 0;
                    for (int i = 0; i < hs; i++)
                        s[u] += q[i] * k[i] / sqrt(hs);
                    mx = fmax(mx, s[u]);
                }
                for (int u = 0; u <= t; u++)
                    sum += (s[u] = exp(s[u] - mx));
                for (int i = 0; i < hs; i++) {
                    double o = 0;
                    for (int u = 0; u <= t; u++)
                        o += s[u] / sum * qkv[(b * T + u) * 3 * C + 2 * C + h * hs + i];
                    out[(b * T + t) * C + h * hs + i] = o;
                }
            }
}

static double att_objective(void *p)
{
    att_ctx *c = p;
    double out[N * C];
    ref_attention(out, c->qkv);
    return dot_r(out, c->r, N * C);
}

static void test_layers_attention_matches_naive_and_finite_differences(void **state)
{
    FOR_EACH_ISA(isa)
    {
        att_ctx c = {drand_array(N * 3 * C, 1.5), drand_array(N * C, 1)};
        float *qkv = to_float(c.qkv, N * 3 * C), *r = to_float(c.r, N * C), out[N * C];
        float att[B * NH * T * T], dqkv[N * 3 * C], scratch[B * NH * T * T];
        for (int i = 0; i < N * 3 * C; i++) /* the backward writes every element: no zeroing */
            dqkv[i] = NAN;
        double want[N * C];
        tr__attention_forward(out, att, qkv, B, T, C, NH, 0);
        ref_attention(want, c.qkv);
        expect_forward("attention", out, want, N * C);
        for (int bh = 0; bh < B * NH; bh++) // causal: no weight above the diagonal
            for (int t = 0; t < T; t++)
                for (int u = t + 1; u < T; u++)
                    assert_true(att[(bh * T + t) * T + u] == 0.0f);
        tr__attention_backward(dqkv, scratch, r, qkv, att, B, T, C, NH, 0);
        expect_grad("attention dinp", att_objective, &c, c.qkv, N * 3 * C, dqkv, TOL_ATTENTION);
        free(c.qkv);
        free(c.r);
        free(qkv);
        free(r);
    }
}

/* ---- cross-entropy: padded vocab, ignored targets ------------------------------------------- */

typedef struct {
    double *logits; // (N, Vp)
    int targets[N];
} ce_ctx;

static double ref_mean_loss(const double *logits, const int *targets)
{
    double total = 0;
    int count = 0;
    for (int n = 0; n < N; n++) {
        if (targets[n] == -100) continue;
        const double *l = logits + n * Vp;
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++)
            mx = fmax(mx, l[v]);
        for (int v = 0; v < V; v++)
            sum += exp(l[v] - mx);
        total += log(sum) + mx - l[targets[n]];
        count++;
    }
    return total / count;
}

static double ce_objective(void *p)
{
    ce_ctx *c = p;
    return ref_mean_loss(c->logits, c->targets);
}

static void test_layers_crossentropy_matches_naive_and_finite_differences(void **state)
{
    FOR_EACH_ISA(isa)
    {
        ce_ctx c = {.logits = drand_array(N * Vp, 3)};
        for (int n = 0; n < N; n++)
            c.targets[n] = n % 4 == 1 ? -100 : (n * 5) % V;
        float *probs = to_float(c.logits, N * Vp), losses[N], mean, dlogits[N * Vp] = {0};
        int count;
        assert_int_equal(
            tr__crossentropy_forward(losses, probs, c.targets, N, V, Vp, -100, &mean, &count), 0);
        assert_int_equal(count, N - 3);
        assert_float_equal(mean, ref_mean_loss(c.logits, c.targets), 1e-5);
        for (int n = 0; n < N; n++)
            for (int v = V; v < Vp; v++)
                assert_true(probs[n * Vp + v] == 0.0f); // padding is never a prediction
        tr__crossentropy_backward(dlogits, probs, c.targets, N, V, Vp, -100, 1.0f / count);
        expect_grad("crossentropy dlogits", ce_objective, &c, c.logits, N * Vp, dlogits,
                    TOL_CROSSENTROPY);
        c.targets[0] = V; // a target in the padding is bad data
        assert_int_equal(
            tr__crossentropy_forward(losses, probs, c.targets, N, V, Vp, -100, &mean, &count),
            TR_EINVAL);
        free(c.logits);
        free(probs);
    }
}

/* ---- mse, through its tr_layer_t: mean over all N D of (in - y)^2 --------------------------- */

enum { D = 3 };

typedef struct {
    double *in, *y; // (N, D) each
    double scale;   // loss_scale
} mse_ctx;

static double ref_mse(const double *in, const double *y)
{
    double s = 0;
    for (int i = 0; i < N * D; i++)
        s += (in[i] - y[i]) * (in[i] - y[i]);
    return s / (N * D);
}

static double mse_objective(void *p)
{
    mse_ctx *c = p;
    return ref_mse(c->in, c->y) * c->scale;
}

/* The layer's forward and backward called as the model calls them: losses per position, the
 * mean loss, and din (accumulated into, scaled by loss_scale) against finite differences. */
static void test_layers_mse_matches_naive_and_finite_differences(void **state)
{
    tr_layer_t *l;
    assert_int_equal(tr_layer_mse_create(&l, "mse", D), 0);
    assert_true(l->is_loss);
    assert_int_equal(l->targets, TR_TARGETS_FLOAT);
    assert_int_equal(l->y_dim, D);
    assert_int_equal(l->out_dim, 1);
    assert_int_equal(l->ops->act_size(l, B, T), N);
    mse_ctx c = {drand_array(N * D, 2), drand_array(N * D, 2), 3.0};
    float *in = to_float(c.in, N * D), *y = to_float(c.y, N * D), losses[N], din[N * D];
    for (int i = 0; i < N * D; i++)
        din[i] = 0.5f; // backward accumulates: the prefill must survive
    tr_layer_ctx_t ctx = {.B = B,
                          .T = T,
                          .in = in,
                          .y = y,
                          .y_dim = D,
                          .acts = losses,
                          .out = losses,
                          .din = din,
                          .loss_scale = (float)c.scale,
                          .training = 1};
    assert_int_equal(l->ops->forward(l, &ctx), 0);
    assert_float_equal(ctx.loss, ref_mse(c.in, c.y), 1e-6 * ref_mse(c.in, c.y));
    for (int n = 0; n < N; n++) {
        double row = 0;
        for (int d = 0; d < D; d++)
            row += (c.in[n * D + d] - c.y[n * D + d]) * (c.in[n * D + d] - c.y[n * D + d]);
        assert_float_equal(losses[n], row / D, 1e-6 * (row / D) + 1e-7);
    }
    assert_int_equal(l->ops->backward(l, &ctx), 0);
    for (int i = 0; i < N * D; i++)
        din[i] -= 0.5f;
    expect_grad("mse din", mse_objective, &c, c.in, N * D, din, TOL_MSE);
    // without targets forward computes no loss; backward has nothing to start from
    ctx.y = NULL;
    ctx.loss = -1;
    assert_int_equal(l->ops->forward(l, &ctx), 0);
    assert_true(ctx.loss == -1.0f);
    assert_int_equal(l->ops->backward(l, &ctx), TR_EINVAL);
    tr_layer_t *bad = NULL;
    assert_int_equal(tr_layer_mse_create(&bad, "bad", 0), TR_EINVAL);
    assert_null(bad);
    free(l); // no state, no destroy: a model would free it the same way
    free(c.in);
    free(c.y);
    free(in);
    free(y);
}

/* ---- the vector primitives: every ISA equals scalar on odd lengths and unaligned tails ------- */

enum { N_VEC_OPS = 14 };

/* Runs primitive `op` on inputs in[0..3] (n floats each); array results go to out (and out2),
 * which the caller pre-fills (accumulating ops add to them); returns the scalar result. */
static float run_op(const tr__vec_ops_t *v, int op, float *out, float *out2, float *const *in,
                    size_t n)
{
    const float *a = in[0], *b = in[1], *c = in[2], *d = in[3];
    float r1 = 0, r2 = 0;
    switch (op) {
    case 0:
        return v->dot(a, b, n);
    case 1:
        return v->sum(a, n);
    case 2:
        return v->max(a, n);
    case 3:
        return v->sqdev(a, 0.3f, n);
    case 4:
        v->ln_bwd_sums(a, b, c, 0.2f, 1.3f, n, &r1, &r2);
        return r1 + 3 * r2;
    case 5:
        v->axpy(0.7f, a, out, n);
        return 0;
    case 6:
        v->add(out, a, b, n);
        return 0;
    case 7:
        v->acc(out, a, n);
        return 0;
    case 8:
        v->scale(out, 1.3f, n);
        return 0;
    case 9:
        return v->exp_sum(out, a, 1.0f, n);
    case 10:
        v->ln_row(out, a, b, c, 0.1f, 1.7f, n);
        return 0;
    case 11:
        v->ln_bwd_row(out, a, b, c, 0.1f, 1.7f, 0.3f, -0.2f, n);
        return 0;
    case 12:
        v->ln_bwd_params(out, out2, a, d, 0.1f, 1.7f, n);
        return 0;
    default:
        v->gelu_fwd(out, a, n);
        v->gelu_bwd(out2, a, b, n);
        return 0;
    }
}

/* Every primitive, every ISA vs scalar, on n floats at a misaligned offset; the float past
 * each output must survive (masked tails write nothing beyond n). */
static void compare_isas(size_t n, size_t offset)
{
    float *in[4], *out = malloc((n + offset + 1) * 4), *out2 = malloc((n + offset + 1) * 4);
    float ref[64], ref2[64];
    for (int k = 0; k < 4; k++) {
        in[k] = malloc((n + offset) * sizeof(float));
        for (size_t i = 0; i < n + offset; i++)
            in[k][i] = (float)urand() * 3.0f;
        in[k] += offset;
    }
    float *o = out + offset, *o2 = out2 + offset;
    for (int op = 0; op < N_VEC_OPS; op++) {
        memcpy(o, in[2], n * 4);
        memcpy(o2, in[3], n * 4);
        tr__vec_set_isa(TR__ISA_SCALAR);
        float want = run_op(tr__vec(), op, o, o2, in, n);
        memcpy(ref, o, n * 4);
        memcpy(ref2, o2, n * 4);
        for (int isa = TR__ISA_AVX2; isa <= (int)tr__vec_best_isa(); isa++) {
            memcpy(o, in[2], n * 4);
            memcpy(o2, in[3], n * 4);
            o[n] = o2[n] = 12345.0f;
            tr__vec_set_isa(isa);
            float got = run_op(tr__vec(), op, o, o2, in, n);
            if (fabsf(got - want) > 1e-5f * (float)n * (1 + fabsf(want)))
                fail_msg("op %d, n %zu, offset %zu, %s: %g, scalar %g", op, n, offset,
                         tr__vec_isa_name(isa), got, want);
            for (size_t i = 0; i < n; i++)
                if (fabsf(o[i] - ref[i]) > 2e-6f * (1 + fabsf(ref[i])) ||
                    fabsf(o2[i] - ref2[i]) > 2e-6f * (1 + fabsf(ref2[i])))
                    fail_msg("op %d, n %zu, offset %zu, %s: element %zu differs from scalar", op, n,
                             offset, tr__vec_isa_name(isa), i);
            assert_true(o[n] == 12345.0f && o2[n] == 12345.0f);
        }
    }
    for (int k = 0; k < 4; k++)
        free(in[k] - offset);
    free(out);
    free(out2);
}

static void test_layers_vector_paths_equal_scalar_on_odd_tails(void **state)
{
    for (size_t n = 1; n <= 64; n += (n < 20 ? 1 : 7))
        for (size_t offset = 0; offset < 3; offset++)
            compare_isas(n, offset);
    // the scalar exp approximation against libm
    tr__vec_set_isa(TR__ISA_SCALAR);
    float x[] = {-80.0f, -10.0f, -1.0f, -1e-3f, 0.0f}, y[5];
    tr__vec()->exp_sum(y, x, 0.0f, 5);
    for (int i = 0; i < 5; i++)
        assert_float_equal(y[i], expf(x[i]), 3e-7f * expf(x[i]));
    tr__vec_set_isa(tr__vec_best_isa());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layers_linear_backward_matches_finite_differences),
        cmocka_unit_test(test_layers_fused_linear_equals_separate_passes),
        cmocka_unit_test(test_layers_layernorm_backward_matches_finite_differences),
        cmocka_unit_test(test_layers_gelu_and_residual_backward_match_finite_differences),
        cmocka_unit_test(test_layers_embedding_backward_matches_finite_differences),
        cmocka_unit_test(test_layers_attention_matches_naive_and_finite_differences),
        cmocka_unit_test(test_layers_crossentropy_matches_naive_and_finite_differences),
        cmocka_unit_test(test_layers_mse_matches_naive_and_finite_differences),
        cmocka_unit_test(test_layers_vector_paths_equal_scalar_on_odd_tails),
    };
    return cmocka_run_group_tests_name("layers", tests, NULL, NULL);
}
