/* examples/custom_model's user-written layers and the engine training them.
 *
 * The layers (examples/custom_model/layers.c: my_linear, my_tanh, my_mse) are checked one by
 * one against double-precision references and central differences, driven through their ops
 * with a hand-filled tr_layer_ctx_t; the whole 4 -> 32 -> 1 model likewise, and with the float
 * finite differences of docs/custom-layers.md. Then the engine trains it with float targets by
 * both loops (tr_engine_train_batch on a callback, tr_engine_forward/backward/step on
 * tr_engine_batch_t {.x, .y}): the validation MSE falls below 30% of the untrained model's,
 * the two loops give bit-identical parameters for identical batches, a checkpoint reloads, and
 * the dataset callbacks get x and y and no targets. And the engine refuses what does not fit
 * the model: an x_dim other than the first layer's in_dim, integer targets (y_dim 0) for a
 * float loss, a forward batch without y.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe.h"

#include "engine_testing.h"

#include "../../examples/custom_model/layers.h"
#include "../../examples/custom_model/task.h"

#define HIDDEN      32
#define VAL_BATCHES 8

static char tmpdir[256];

/* Gradients against double-precision central differences (step FD_H): |g - fd| <= GRAD_ABS +
 * GRAD_REL |fd|. The float layers round at ~6e-8 relative per operation; the references and
 * the differences are double, whose error at this step is below 1e-9. */
#define FD_H     1e-6
#define GRAD_ABS 2e-6
#define GRAD_REL 1e-4
/* A float forward against its double reference: |out - ref| <= OUT_TOL (1 + |ref|). */
#define OUT_TOL 1e-5

static int close_enough(double g, double fd)
{
    return fabs(g - fd) <= GRAD_ABS + GRAD_REL * fabs(fd);
}

/* --- double-precision references of the three layers --------------------------------------- */

/* A reference forward: the layer's output (N, out_dim) from params and in (N, in_dim); a loss
 * layer returns its mean loss (its output, the per-row losses, is not compared). */
typedef double (*ref_forward)(const tr_layer_t *l, const double *p, const double *in,
                              const double *y, size_t N, double *out);

static double linear_ref(const tr_layer_t *l, const double *p, const double *in, const double *y,
                         size_t N, double *out)
{
    size_t C = (size_t)l->in_dim, OC = (size_t)l->out_dim;
    const double *W = p, *b = p + l->params[1].offset;
    (void)y;
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) {
            double s = b[o];
            for (size_t i = 0; i < C; i++)
                s += W[o * C + i] * in[n * C + i];
            out[n * OC + o] = s;
        }
    return 0;
}

static double tanh_ref(const tr_layer_t *l, const double *p, const double *in, const double *y,
                       size_t N, double *out)
{
    (void)p;
    (void)y;
    for (size_t i = 0; i < N * (size_t)l->in_dim; i++)
        out[i] = tanh(in[i]);
    return 0;
}

static double mse_ref(const tr_layer_t *l, const double *p, const double *in, const double *y,
                      size_t N, double *out)
{
    size_t n = N * (size_t)l->in_dim;
    double s = 0;
    (void)p;
    (void)out;
    for (size_t i = 0; i < n; i++)
        s += (in[i] - y[i]) * (in[i] - y[i]);
    return s / (double)n;
}

/* --- one layer through its ops: forward, backward, and the references ---------------------- */

typedef struct {
    tr_layer_t *l;
    ref_forward ref;
    size_t N, n_in, n_out, n_p;
    double *p, *in, *y, *w, *tmp; /* double copies; w: the upstream weights, J = sum w out */
    float loss_scale;
} layer_check_t;

/* The objective backward differentiates: sum w out, or loss_scale x the loss of a loss layer. */
static double objective(layer_check_t *k)
{
    double loss = k->ref(k->l, k->p, k->in, k->y, k->N, k->tmp);
    if (k->l->is_loss) return k->loss_scale * loss;
    double J = 0;
    for (size_t i = 0; i < k->n_out; i++)
        J += k->w[i] * k->tmp[i];
    return J;
}

/* d objective / d x[i] by central differences in double. */
static double central_difference(layer_check_t *k, double *x, size_t i)
{
    double save = x[i];
    x[i] = save + FD_H;
    double jp = objective(k);
    x[i] = save - FD_H;
    double jm = objective(k);
    x[i] = save;
    return (jp - jm) / (2 * FD_H);
}

/* Runs the layer's forward and backward on B x T rows of random inputs (and targets, and
 * upstream gradients), with grads and din prefilled with 0.25 to see that backward adds;
 * checks the output against the reference and every parameter and input gradient against
 * central differences of it. Frees the layer. Returns the largest |g - fd|. */
static double check_layer(tr_layer_t *l, ref_forward ref, int B, int T, float loss_scale)
{
    layer_check_t k = {.l = l, .ref = ref, .N = (size_t)B * T, .loss_scale = loss_scale};
    k.n_in = k.N * (size_t)l->in_dim;
    k.n_out = k.N * (size_t)l->out_dim;
    k.n_p = l->param_count;
    size_t n_acts = l->ops->act_size(l, B, T), n_y = k.N * (size_t)l->y_dim;
    float *params = calloc(k.n_p + 1, 4), *grads = calloc(k.n_p + 1, 4), *in = calloc(k.n_in, 4);
    float *din = calloc(k.n_in, 4), *acts = calloc(n_acts, 4), *dout = calloc(k.n_out, 4);
    float *y = calloc(n_y + 1, 4);
    k.p = calloc(k.n_p + 1, 8);
    k.in = calloc(k.n_in, 8);
    k.y = calloc(n_y + 1, 8);
    k.w = calloc(k.n_out, 8);
    k.tmp = calloc(k.n_out, 8);
    uint64_t rng = 7;
    if (l->ops->init) l->ops->init(l, params, &rng);
    tr_rng_fill_normal(&rng, in, k.n_in, 1.0f);
    tr_rng_fill_normal(&rng, y, n_y, 1.0f);
    tr_rng_fill_normal(&rng, dout, k.n_out, 1.0f);
    for (size_t i = 0; i < k.n_p; i++) {
        grads[i] = 0.25f;
        k.p[i] = params[i];
    }
    for (size_t i = 0; i < k.n_in; i++) {
        din[i] = 0.25f;
        k.in[i] = in[i];
    }
    for (size_t i = 0; i < n_y; i++)
        k.y[i] = y[i];
    for (size_t i = 0; i < k.n_out; i++)
        k.w[i] = dout[i];
    tr_layer_ctx_t c = {.B = B,
                        .T = T,
                        .y = l->is_loss ? y : NULL,
                        .y_dim = l->y_dim,
                        .training = 1,
                        .in = in,
                        .acts = acts,
                        .out = acts,
                        .params = params,
                        .grads = grads,
                        .model_params = params,
                        .model_grads = grads,
                        .dout = l->is_loss ? NULL : dout,
                        .din = din,
                        .loss_scale = loss_scale};
    assert_int_equal(l->ops->forward(l, &c), 0);
    double loss = ref(l, k.p, k.in, k.y, k.N, k.tmp);
    if (l->is_loss)
        assert_true(fabs(c.loss - loss) <= OUT_TOL * (1 + fabs(loss)));
    else
        for (size_t i = 0; i < k.n_out; i++)
            assert_true(fabs(acts[i] - k.tmp[i]) <= OUT_TOL * (1 + fabs(k.tmp[i])));
    assert_int_equal(l->ops->backward(l, &c), 0);
    double worst = 0;
    for (size_t i = 0; i < k.n_p + k.n_in; i++) {
        int is_p = i < k.n_p;
        size_t j = is_p ? i : i - k.n_p;
        double g = (double)(is_p ? grads[j] : din[j]) - 0.25;
        double fd = central_difference(&k, is_p ? k.p : k.in, j);
        if (!close_enough(g, fd))
            fail_msg("%s: d/d%s[%zu]: backward %.9g, central difference %.9g", l->name,
                     is_p ? "param" : "in", j, g, fd);
        worst = fmax(worst, fabs(g - fd));
    }
    free(params);
    free(grads);
    free(in);
    free(din);
    free(acts);
    free(dout);
    free(y);
    free(k.p);
    free(k.in);
    free(k.y);
    free(k.w);
    free(k.tmp);
    if (l->ops->destroy) l->ops->destroy(l);
    free(l); /* never given to a model: ours to free */
    return worst;
}

static void test_custom_model_layers_match_finite_differences(void **state)
{
    tr_layer_t *lin, *th, *mse;
    assert_int_equal(my_linear_create(&lin, "fc", 3, 5), 0);
    assert_int_equal(my_tanh_create(&th, "tanh", 5), 0);
    assert_int_equal(my_mse_create(&mse, "loss", 2), 0);
    /* the size table and the loss declaration */
    assert_int_equal(lin->param_count, 5 * 3 + 5);
    assert_int_equal(tr_layer_find_param(lin, "weight")->no_decay, 0);
    assert_int_equal(tr_layer_find_param(lin, "bias")->no_decay, 1);
    assert_int_equal(th->param_count, 0);
    assert_true(mse->is_loss && mse->targets == TR_TARGETS_FLOAT && mse->y_dim == 2);
    double w_lin = check_layer(lin, linear_ref, 2, 3, 1.0f);
    double w_tanh = check_layer(th, tanh_ref, 2, 3, 1.0f);
    double w_mse = check_layer(mse, mse_ref, 2, 3, 1.0f); /* frees the layer */
    assert_int_equal(my_mse_create(&mse, "loss", 2), 0);
    double w_scaled = check_layer(mse, mse_ref, 2, 3, 0.125f); /* loss_scale multiplies */
    printf("layers: largest |backward - central difference|: linear %.2g, tanh %.2g, "
           "mse %.2g, mse x 0.125 %.2g (bound %.0e + %.0e |fd|)\n",
           w_lin, w_tanh, w_mse, w_scaled, GRAD_ABS, GRAD_REL);
    /* bad sizes are refused without leaking */
    tr_layer_t *bad = NULL;
    assert_int_equal(my_linear_create(&bad, "fc", 0, 5), TR_EINVAL);
    assert_int_equal(my_mse_create(&bad, "loss", 0), TR_EINVAL);
    assert_null(bad);
}

/* --- the whole model ------------------------------------------------------------------------ */

/* The model's loss in double from double parameters p (the model's layout). */
static double mlp_ref(const tr_model_t *m, const double *p, const float *x, const float *y, int N)
{
    const tr_layer_t *fc0 = tr_model_layer(m, 0), *fc1 = tr_model_layer(m, 2);
    const double *W0 = p + fc0->param_offset, *b0 = W0 + fc0->params[1].offset;
    const double *W1 = p + fc1->param_offset, *b1 = W1 + fc1->params[1].offset;
    double s = 0;
    for (int n = 0; n < N; n++) {
        double pred = b1[0];
        for (int j = 0; j < HIDDEN; j++) {
            double h = b0[j];
            for (int i = 0; i < MY_TASK_IN; i++)
                h += W0[j * MY_TASK_IN + i] * x[n * MY_TASK_IN + i];
            pred += W1[j] * tanh(h);
        }
        s += (pred - y[n]) * (pred - y[n]);
    }
    return s / N;
}

static void test_custom_model_gradient_matches_finite_differences(void **state)
{
    enum { B = 8 };
    tr_model_t *m;
    char why[256] = "";
    assert_int_equal(my_mlp_create(&m, MY_TASK_IN, HIDDEN, why, sizeof(why)), 0);
    int y_dim = 0;
    assert_int_equal(tr_model_targets(m, &y_dim), TR_TARGETS_FLOAT);
    assert_int_equal(y_dim, 1);
    tr_model_init_params(m, 3);
    float x[B * MY_TASK_IN], y[B], loss, lp, lm;
    uint64_t stream = MY_TASK_TRAIN;
    my_task_batch(&stream, 5, B, 1, NULL, x, NULL, y);
    tr_batch_t b = {.B = B, .T = 1, .x = x, .y = y, .y_dim = 1};
    tr_model_zero_grad(m);
    assert_int_equal(tr_model_forward(m, &b, &loss), 0);
    assert_int_equal(tr_model_backward(m, NULL, NULL), 0);
    size_t n = tr_model_num_params(m);
    assert_int_equal(n, HIDDEN * MY_TASK_IN + HIDDEN + HIDDEN + 1);
    float *p = tr_model_params(m), *g = malloc(n * 4);
    memcpy(g, tr_model_grads(m), n * 4);
    double *pd = calloc(n, 8), ref = 0, worst = 0, worst_f = 0;
    for (size_t i = 0; i < n; i++)
        pd[i] = p[i];
    ref = mlp_ref(m, pd, x, y, B);
    assert_true(fabs(loss - ref) <= OUT_TOL * (1 + ref));
    for (size_t i = 0; i < n; i++) {
        /* double: the reference's central difference, tight */
        double save = pd[i];
        pd[i] = save + FD_H;
        double jp = mlp_ref(m, pd, x, y, B);
        pd[i] = save - FD_H;
        double fd = (jp - mlp_ref(m, pd, x, y, B)) / (2 * FD_H);
        pd[i] = save;
        if (!close_enough(g[i], fd))
            fail_msg("model: d loss / d param[%zu]: backward %.9g, central difference %.9g", i,
                     (double)g[i], fd);
        worst = fmax(worst, fabs(g[i] - fd));
        /* float: the model's own forward, as docs/custom-layers.md shows; h = 1e-2 */
        float fs = p[i];
        p[i] = fs + 1e-2f;
        assert_int_equal(tr_model_forward(m, &b, &lp), 0);
        p[i] = fs - 1e-2f;
        assert_int_equal(tr_model_forward(m, &b, &lm), 0);
        p[i] = fs;
        double fdf = ((double)lp - lm) / (2 * 1e-2);
        if (fabs(g[i] - fdf) > 1e-3 + 2e-2 * fabs(fdf))
            fail_msg("model (float): d loss / d param[%zu]: backward %.6g, difference %.6g", i,
                     (double)g[i], fdf);
        worst_f = fmax(worst_f, fabs(g[i] - fdf));
    }
    printf("model: %zu parameters, largest |backward - central difference| %.2g in double, "
           "%.2g in float (h 1e-2, bound 1e-3 + 2e-2 |fd|)\n",
           n, worst, worst_f);
    free(g);
    free(pd);
    tr_model_destroy(m);
}

/* --- the engine ----------------------------------------------------------------------------- */

static uint64_t train_stream = MY_TASK_TRAIN, val_stream = MY_TASK_VAL;

/* my_task_batch, counting calls that got a pointer the model does not read (tokens, targets)
 * or lacked one it does (x, y): engine.h says the other is NULL */
typedef struct {
    uint64_t stream;
    int calls, bad, tokens; /* tokens: calls given a tokens buffer */
} strict_t;

static int strict_batch(void *user, uint64_t index, int B, int T, int *tokens, float *x,
                        int *targets, float *y)
{
    strict_t *s = user;
    s->calls++;
    s->bad += targets != NULL || !x || !y;
    s->tokens += tokens != NULL;
    return x && y ? my_task_batch(&s->stream, index, B, T, NULL, x, NULL, y) : TR_EINVAL;
}

static tr_config_t *config(int mb, int gas)
{
    char json[512];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, "
             "\"weight_decay\": 0.01}}, \"gradient_clipping\": 1.0, \"steps_per_print\": 1000,"
             " \"troupe\": {\"runtime\": {\"workers\": 2}}}",
             mb, gas);
    return test_config(json, "custom.json");
}

/* tr_engine_create on the custom model with these datasets; returns its code, err filled. */
static int try_engine(tr_engine_t **eng, const tr_config_t *cfg, tr_dataset_t train,
                      tr_dataset_t val, char *err, size_t errlen)
{
    tr_model_t *m;
    assert_int_equal(my_mlp_create(&m, MY_TASK_IN, HIDDEN, err, errlen), 0);
    tr_engine_opts_t o = {.config = cfg,
                          .model = m,
                          .seq_len = 1,
                          .seed = 42,
                          .init_params = 1,
                          .train = train,
                          .val = val};
    return tr_engine_create(eng, &o, err, errlen);
}

static tr_engine_t *engine(const tr_config_t *cfg)
{
    tr_engine_t *eng;
    char err[512] = "";
    tr_dataset_t train = {.batch = my_task_batch,
                          .user = &train_stream,
                          .x_dim = MY_TASK_IN,
                          .y_dim = 1},
                 val = {
                     .batch = my_task_batch, .user = &val_stream, .x_dim = MY_TASK_IN, .y_dim = 1};
    int rc = try_engine(&eng, cfg, train, val, err, sizeof(err));
    if (rc) fail_msg("engine: %s", err);
    return eng;
}

static float val_mse(tr_engine_t *eng)
{
    float v;
    int rc = tr_engine_eval(eng, VAL_BATCHES, &v);
    if (rc) fail_msg("eval: %s", tr_engine_error(eng));
    return v;
}

/* micro-batches of the train stream, DeepSpeed-style: forward {.x, .y}, backward, step */
static void own_loop(tr_engine_t *eng, int B, uint64_t first, int micro_batches)
{
    float *x = malloc((size_t)B * MY_TASK_IN * 4), *y = malloc((size_t)B * 4), loss;
    for (int i = 0; i < micro_batches; i++) {
        my_task_batch(&train_stream, first + (uint64_t)i, B, 1, NULL, x, NULL, y);
        tr_engine_batch_t b = {.x = x, .y = y};
        if (tr_engine_forward(eng, &b, &loss) || tr_engine_backward(eng) ||
            tr_engine_step(eng, NULL))
            fail_msg("micro-batch %d: %s", i, tr_engine_error(eng));
    }
    free(x);
    free(y);
}

static void test_custom_model_val_mse_falls_with_both_loops(void **state)
{
    tr_config_t *cfg = config(16, 2);
    tr_engine_t *eng = engine(cfg);
    float val0 = val_mse(eng);
    for (int i = 0; i < 200; i++)
        if (tr_engine_train_batch(eng, NULL)) fail_msg("train: %s", tr_engine_error(eng));
    float val_train_batch = val_mse(eng);
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/ckpt", tmpdir);
    assert_int_equal(tr_engine_save_checkpoint(eng, dir, NULL), 0);
    tr_engine_destroy(eng);

    eng = engine(cfg); /* the same untrained start, trained by its own loop */
    assert_true(val_mse(eng) == val0);
    own_loop(eng, 16, 5000, 400);
    assert_int_equal(tr_engine_global_step(eng), 200);
    float val_own = val_mse(eng);
    /* the checkpoint of the first: the user layers' parameters come back exactly */
    assert_int_equal(tr_engine_load_checkpoint(eng, dir, NULL), 0);
    float reloaded = val_mse(eng);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    printf("val MSE %.4f -> %.4f (tr_engine_train_batch), %.4f (forward/backward/step), "
           "reloaded %.4f; bound 30%% of the untrained\n",
           val0, val_train_batch, val_own, reloaded);
    assert_true(val_train_batch < 0.3f * val0);
    assert_true(val_own < 0.3f * val0);
    assert_true(reloaded == val_train_batch);
}

static void test_custom_model_loops_give_identical_parameters(void **state)
{
    tr_config_t *cfg = config(8, 2);
    tr_engine_t *a = engine(cfg), *b = engine(cfg);
    for (int s = 0; s < 10; s++) /* the loader draws batches 0, 1, 2, ... in order */
        if (tr_engine_train_batch(a, NULL)) fail_msg("train: %s", tr_engine_error(a));
    own_loop(b, 8, 0, 20); /* the same 20 micro-batches */
    const tr_model_t *ma = tr_engine_model(a), *mb = tr_engine_model(b);
    assert_int_equal(tr_engine_global_step(b), 10);
    assert_memory_equal(tr_model_params(ma), tr_model_params(mb),
                        tr_model_num_params(ma) * sizeof(float));
    assert_true(val_mse(a) == val_mse(b));
    tr_engine_destroy(a);
    tr_engine_destroy(b);
    tr_config_destroy(cfg);
}

/* --- what the engine refuses ---------------------------------------------------------------- */

static void expect_refused(const tr_config_t *cfg, tr_dataset_t train, tr_dataset_t val,
                           const char *want1, const char *want2)
{
    tr_engine_t *eng = NULL;
    char err[512] = "";
    assert_int_equal(try_engine(&eng, cfg, train, val, err, sizeof(err)), TR_EINVAL);
    printf("refused: %s\n", err);
    if (!strstr(err, want1) || !strstr(err, want2))
        fail_msg("error '%s' should name '%s' and '%s'", err, want1, want2);
}

static void test_custom_model_callbacks_get_x_and_y_only(void **state)
{
    tr_config_t *cfg = config(8, 1);
    strict_t tr = {.stream = MY_TASK_TRAIN}, va = {.stream = MY_TASK_VAL};
    tr_engine_t *eng;
    char err[512] = "";
    tr_dataset_t train = {.batch = strict_batch, .user = &tr, .x_dim = MY_TASK_IN, .y_dim = 1},
                 val = {.batch = strict_batch, .user = &va, .x_dim = MY_TASK_IN, .y_dim = 1};
    if (try_engine(&eng, cfg, train, val, err, sizeof(err))) fail_msg("engine: %s", err);
    float v;
    assert_int_equal(tr_engine_train_batch(eng, NULL), 0);
    assert_int_equal(tr_engine_eval(eng, 2, &v), 0);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    printf("train callback: %d calls, %d with targets set or x/y missing, %d with tokens; "
           "val: %d calls, %d, %d\n",
           tr.calls, tr.bad, tr.tokens, va.calls, va.bad, va.tokens);
    assert_true(tr.calls >= 1 && va.calls == 2);
    assert_int_equal(tr.bad, 0);
    assert_int_equal(tr.tokens, 0);
    assert_int_equal(va.bad, 0);
    assert_int_equal(va.tokens, 0); /* eval's callback gets x only, as the loader's does */
}

static void test_custom_model_engine_refuses_x_dim_other_than_in_dim(void **state)
{
    tr_config_t *cfg = config(8, 1);
    tr_dataset_t ok = {
        .batch = my_task_batch, .user = &train_stream, .x_dim = MY_TASK_IN, .y_dim = 1};
    tr_dataset_t d = ok;
    d.x_dim = 3; /* too small: the model would read past each row */
    expect_refused(cfg, d, (tr_dataset_t){0}, "x_dim 3", "'fc0' reads floats of width 4");
    d.x_dim = 5; /* too large: it would train on misaligned rows */
    expect_refused(cfg, d, (tr_dataset_t){0}, "x_dim 5", "width 4");
    d.x_dim = 0; /* unset: token ids for a float-input model */
    expect_refused(cfg, d, (tr_dataset_t){0}, "x_dim 0", "width 4");
    expect_refused(cfg, ok, d, "val dataset: x_dim 0", "width 4");
    tr_config_destroy(cfg);
}

static void test_custom_model_engine_refuses_int_targets(void **state)
{
    tr_config_t *cfg = config(8, 1);
    tr_dataset_t d = {.batch = my_task_batch, .user = &train_stream, .x_dim = MY_TASK_IN};
    expect_refused(cfg, d, (tr_dataset_t){0}, "y_dim 0", "'loss' reads float targets");
    d.y_dim = 2;
    expect_refused(cfg, d, (tr_dataset_t){0}, "y_dim 2", "'loss'");
    expect_refused(cfg, d, (tr_dataset_t){0}, "y_dim 2", "float targets of width 1");
    tr_config_destroy(cfg);
}

static void test_custom_model_forward_without_y_is_refused(void **state)
{
    tr_config_t *cfg = config(8, 1);
    tr_engine_t *eng = engine(cfg);
    float x[8 * MY_TASK_IN], y[8], loss = -1;
    int targets[8] = {0};
    my_task_batch(&train_stream, 0, 8, 1, NULL, x, NULL, y);
    tr_engine_batch_t no_y = {.x = x}, int_targets = {.x = x, .targets = targets};
    assert_int_equal(tr_engine_forward(eng, &no_y, &loss), TR_EINVAL);
    printf("refused: %s\n", tr_engine_error(eng));
    assert_non_null(strstr(tr_engine_error(eng), "needs x and y"));
    assert_non_null(strstr(tr_engine_error(eng), "float targets"));
    assert_int_equal(tr_engine_forward(eng, &int_targets, &loss), TR_EINVAL);
    assert_non_null(strstr(tr_engine_error(eng), "needs x and y"));
    assert_int_equal(tr_engine_backward(eng), TR_EINVAL); /* nothing went forward */
    /* the refusals left the engine usable */
    tr_engine_batch_t good = {.x = x, .y = y};
    assert_int_equal(tr_engine_forward(eng, &good, &loss), 0);
    assert_true(loss > 0);
    assert_int_equal(tr_engine_backward(eng), 0);
    assert_int_equal(tr_engine_step(eng, NULL), 0);
    assert_int_equal(tr_engine_global_step(eng), 1);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

static int setup_dir(void **state)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/tr_custom_model_test.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_dir(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_custom_model_layers_match_finite_differences),
        cmocka_unit_test(test_custom_model_gradient_matches_finite_differences),
        cmocka_unit_test(test_custom_model_val_mse_falls_with_both_loops),
        cmocka_unit_test(test_custom_model_loops_give_identical_parameters),
        cmocka_unit_test(test_custom_model_callbacks_get_x_and_y_only),
        cmocka_unit_test(test_custom_model_engine_refuses_x_dim_other_than_in_dim),
        cmocka_unit_test(test_custom_model_engine_refuses_int_targets),
        cmocka_unit_test(test_custom_model_forward_without_y_is_refused),
    };
    return cmocka_run_group_tests_name("custom_model", tests, setup_dir, remove_dir);
}
