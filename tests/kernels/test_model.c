/* Models built from layers: GPT-2 and the MLP, end to end through tr_model_t.
 *
 * The whole-model gradient (every layer chained, GPT-2's tied embedding included) is checked
 * against central finite differences of the float loss (step 1e-2 on a few parameters of
 * every tensor: the largest-gradient entry and two random ones). In float the difference
 * quotient carries ~1e-4 of rounding noise, so the bound is |g - fd| <= 1e-3 + 2e-2 |fd|; the
 * per-layer checks in test_layers.c hold the kernels to ~1e-6. Also: backward reports each
 * layer's range once, last to first, and the ranges tile the gradient buffer; bad configs and
 * bad batches are errors whose tr_model_error names the field. The embedder's API: a regression
 * model with float targets (MSE) trains and checks out, a batch with the wrong kind of targets is
 * refused, layers see the training flag, the model owns its layers also on failure, and the
 * built-in models' weight-decay flags follow GPT-2's recipe (matrices decayed, vectors not).
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

#include "troupe/error.h"
#include "troupe/model.h"

static uint64_t rng_state = 7;

static int irand(int n)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (int)((rng_state >> 33) % (uint64_t)n);
}

static float loss_of(tr_model_t *m, const tr_batch_t *b)
{
    float loss;
    assert_int_equal(tr_model_forward(m, b, &loss), 0);
    return loss;
}

static void check_param(tr_model_t *m, const tr_batch_t *b, size_t i, const char *what)
{
    float *p = tr_model_params(m), g = tr_model_grads(m)[i], save = p[i], h = 1e-2f;
    p[i] = save + h;
    double lp = loss_of(m, b);
    p[i] = save - h;
    double lm = loss_of(m, b);
    p[i] = save;
    double fd = (lp - lm) / (2 * h);
    if (fabs(g - fd) > 1e-3 + 2e-2 * fabs(fd))
        fail_msg("%s[%zu]: backward %.6g, finite differences %.6g", what, i - 0, g, fd);
}

/* Forward + backward, then finite differences on 3 entries of every parameter tensor. */
static void check_model_gradient(tr_model_t *m, const tr_batch_t *b)
{
    tr_model_zero_grad(m);
    loss_of(m, b);
    assert_int_equal(tr_model_backward(m, NULL, NULL), 0);
    const float *g = tr_model_grads(m);
    for (int li = 0; li < tr_model_num_layers(m); li++) {
        tr_layer_t *l = tr_model_layer(m, li);
        for (int k = 0; k < l->n_params; k++) {
            size_t base = l->param_offset + l->params[k].offset, n = l->params[k].numel, top = 0;
            for (size_t j = 1; j < n; j++)
                if (fabsf(g[base + j]) > fabsf(g[base + top])) top = j;
            char what[80];
            snprintf(what, sizeof(what), "%s.%s", l->name, l->params[k].name);
            check_param(m, b, base + top, what);
            check_param(m, b, base + (size_t)irand((int)n), what);
            check_param(m, b, base + (size_t)irand((int)n), what);
        }
    }
}

static tr_model_t *tiny_gpt2(void)
{
    tr_gpt2_config_t cfg = {.max_seq_len = 8,
                            .vocab_size = 11,
                            .padded_vocab_size = 16,
                            .num_layers = 2,
                            .num_heads = 2,
                            .channels = 8};
    tr_model_t *m;
    char why[128];
    assert_int_equal(tr_model_gpt2_create(&m, &cfg, why, sizeof(why)), 0);
    tr_model_init_params(m, 1);
    // larger weights than GPT-2's init so every path carries a visible gradient
    float *p = tr_model_params(m);
    for (size_t i = 0; i < tr_model_num_params(m); i++)
        p[i] += (float)(irand(2001) - 1000) * 2e-4f;
    return m;
}

/* Activation checkpointing every k layers: the losses and gradients of two accumulated
 * micro-batches are bitwise those without it, with fewer activation floats, the backward
 * recomputing every layer outside the last group; an eval forward after it, and switching it
 * off again, work. */
static void test_model_checkpointing_is_bitwise_with_fewer_activations(void **state)
{
    tr_gpt2_config_t c = {.max_seq_len = 16,
                          .vocab_size = 60,
                          .padded_vocab_size = 64,
                          .num_layers = 5,
                          .num_heads = 4,
                          .channels = 32};
    int tokens[16], targets[16];
    for (int i = 0; i < 16; i++) {
        tokens[i] = (i * 7) % 60;
        targets[i] = (i * 11 + 3) % 60;
    }
    tr_batch_t b = {.B = 2, .T = 8, .tokens = tokens, .targets = targets};
    float *g0 = NULL, l0 = 0;
    size_t n = 0, acts0 = 0;
    for (int k = 0; k <= 7; k++) {
        tr_model_t *m;
        char why[256];
        assert_int_equal(tr_model_gpt2_create(&m, &c, why, sizeof(why)), 0);
        tr_model_init_params(m, 3);
        assert_int_equal(tr_model_set_checkpoint_interval(m, k), 0);
        float loss = 0;
        tr_model_zero_grad(m);
        for (int r = 0; r < 2; r++) {
            assert_int_equal(tr_model_forward(m, &b, &loss), 0);
            assert_int_equal(tr_model_backward(m, NULL, NULL), 0);
        }
        n = tr_model_num_params(m);
        size_t acts = tr_model_num_acts(m);
        assert_int_equal(acts, tr_model_acts_floats(m, 2, 8));
        if (k == 0) {
            g0 = malloc(n * sizeof(float));
            memcpy(g0, tr_model_grads(m), n * sizeof(float));
            l0 = loss;
            acts0 = acts;
        }
        printf("checkpoint every %d layers: %zu activation floats (%zu without), %zu layers "
               "recomputed\n",
               k, acts, acts0, tr_model_checkpoint_recomputed(m));
        assert_true(loss == l0);
        assert_memory_equal(tr_model_grads(m), g0, n * sizeof(float));
        if (k >= 1 && k < 7) assert_true(acts < acts0 && tr_model_checkpoint_recomputed(m) > 0);
        if (k >= 7) assert_int_equal(tr_model_checkpoint_recomputed(m), 0); /* one group */
        tr_model_set_training(m, 0);
        float eval = 0;
        assert_int_equal(tr_model_forward(m, &b, &eval), 0);
        assert_true(eval == loss); /* same parameters, same batch: the same loss */
        assert_int_equal(tr_model_set_checkpoint_interval(m, 0), 0);
        assert_int_equal(tr_model_forward(m, &b, &eval), 0);
        assert_int_equal(tr_model_num_acts(m), acts0);
        assert_int_equal(tr_model_set_checkpoint_interval(m, -1), TR_EINVAL);
        tr_model_destroy(m);
    }
    free(g0);
}

static void test_model_gpt2_gradient_matches_finite_differences(void **state)
{
    tr_model_t *m = tiny_gpt2();
    int tokens[2 * 6], targets[2 * 6];
    for (int i = 0; i < 12; i++) {
        tokens[i] = irand(11);
        targets[i] = i == 4 ? TR_IGNORE_INDEX : irand(11);
    }
    tr_batch_t b = {.B = 2, .T = 6, .tokens = tokens, .targets = targets};
    check_model_gradient(m, &b);
    // the padded rows of wte (tokens 11..15) never get a gradient
    tr_layer_t *embed = tr_model_layer(m, 0);
    assert_string_equal(embed->params[0].name, "wte");
    for (size_t i = 11 * 8; i < 16 * 8; i++)
        assert_true(tr_model_grads(m)[embed->param_offset + i] == 0.0f);
    tr_model_destroy(m);
}

/* Plain SGD on one batch (the optimizers live elsewhere): a GPT-2 must memorise it. */
static void test_model_gpt2_learns_a_batch_with_sgd(void **state)
{
    tr_model_t *m = tiny_gpt2();
    int tokens[16], targets[16];
    for (int i = 0; i < 16; i++) {
        tokens[i] = irand(11);
        targets[i] = (tokens[i] * 3 + 1) % 11;
    }
    tr_batch_t b = {.B = 2, .T = 8, .tokens = tokens, .targets = targets};
    float first = 0, loss = 0;
    for (int step = 0; step < 60; step++) {
        tr_model_zero_grad(m);
        assert_int_equal(tr_model_forward(m, &b, &loss), 0);
        assert_int_equal(tr_model_backward(m, NULL, NULL), 0);
        float *p = tr_model_params(m), *g = tr_model_grads(m);
        for (size_t i = 0; i < tr_model_num_params(m); i++)
            p[i] -= 0.1f * g[i];
        if (step == 0) first = loss;
    }
    print_message("gpt2 sgd: loss %.3f -> %.3f\n", first, loss);
    assert_true(loss < 0.3f * first);
    tr_model_destroy(m);
}

static void test_model_mlp_gradient_matches_finite_differences(void **state)
{
    int widths[] = {5, 12, 7, 4};
    tr_model_t *m;
    assert_int_equal(tr_model_mlp_create(&m, widths, 4, NULL, 0), 0);
    assert_int_equal(tr_model_num_layers(m), 6); // fc0 gelu0 fc1 gelu1 fc2 loss
    tr_model_init_params(m, 3);
    float x[3 * 2 * 5];
    int targets[6] = {0, 3, 2, TR_IGNORE_INDEX, 1, 1};
    for (int i = 0; i < 30; i++)
        x[i] = (float)(irand(2001) - 1000) * 1e-3f;
    tr_batch_t b = {.B = 3, .T = 2, .x = x, .targets = targets};
    check_model_gradient(m, &b);
    tr_model_destroy(m);
}

/* A layer written the way a user would, with only the public header: y = x * scale, one
 * learned scale per channel. */
static size_t scale_acts(const tr_layer_t *l, int B, int T)
{
    return (size_t)B * T * l->out_dim;
}

static int scale_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    for (int r = 0; r < c->B * c->T; r++)
        for (int i = 0; i < l->out_dim; i++)
            c->out[r * l->out_dim + i] = c->in[r * l->in_dim + i] * c->params[i];
    return 0;
}

static int scale_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    for (int r = 0; r < c->B * c->T; r++)
        for (int i = 0; i < l->out_dim; i++) {
            float d = c->dout[r * l->out_dim + i];
            c->grads[i] += d * c->in[r * l->in_dim + i];
            if (c->din) c->din[r * l->in_dim + i] += d * c->params[i];
        }
    return 0;
}

static void scale_init(tr_layer_t *l, float *params, uint64_t *rng)
{
    for (int i = 0; i < l->out_dim; i++)
        params[i] = 0.5f + 0.1f * i;
}

static const tr_layer_ops_t scale_ops = {.kind = "scale",
                                         .act_size = scale_acts,
                                         .forward = scale_forward,
                                         .backward = scale_backward,
                                         .init = scale_init};

static void test_model_user_layer_joins_a_model(void **state)
{
    tr_layer_t *layers[3], *user = calloc(1, sizeof(*user));
    assert_int_equal(tr_layer_linear_create(&layers[0], "fc", 4, 5, 1), 0);
    assert_int_equal(tr_layer_init(user, &scale_ops, "myscale", 5, 5, NULL), 0);
    assert_int_equal(tr_layer_add_param(user, "scale", 1, (int64_t[]){5}), 0);
    layers[1] = user;
    assert_int_equal(tr_layer_crossentropy_create(&layers[2], "loss", 5, TR_IGNORE_INDEX), 0);
    tr_model_t *m;
    assert_int_equal(tr_model_create(&m, layers, 3, NULL, 0), 0);
    assert_int_equal(tr_model_num_params(m), 4 * 5 + 5 + 5);
    assert_int_equal(tr_model_layer(m, 1)->param_offset, 25); // after fc's weight and bias
    tr_model_init_params(m, 5);
    float x[2 * 3 * 4];
    int targets[6] = {0, 1, 2, 3, 4, 0};
    for (int i = 0; i < 24; i++)
        x[i] = (float)(irand(2001) - 1000) * 2e-3f;
    tr_batch_t b = {.B = 2, .T = 3, .x = x, .targets = targets};
    check_model_gradient(m, &b);
    tr_model_destroy(m);
    // a chain that does not fit is refused, and the layers are freed (ASan checks)
    assert_int_equal(tr_layer_linear_create(&layers[0], "fc", 4, 5, 1), 0);
    assert_int_equal(tr_layer_crossentropy_create(&layers[1], "loss", 6, TR_IGNORE_INDEX), 0);
    char why[160];
    assert_int_equal(tr_model_create(&m, layers, 2, why, sizeof(why)), TR_EINVAL);
    assert_non_null(strstr(why, "loss"));
}

typedef struct {
    int calls, last_layer;
    size_t covered;
} order_log;

static int record(tr_model_t *m, int layer, size_t offset, size_t count, void *arg)
{
    order_log *log = arg;
    assert_true(layer == log->last_layer - 1); // last to first, each once
    assert_int_equal(offset + count, tr_model_num_params(m) - log->covered); // contiguous
    log->last_layer = layer;
    log->covered += count;
    log->calls++;
    return 0;
}

static void test_model_backward_reports_layers_last_to_first(void **state)
{
    tr_model_t *m = tiny_gpt2();
    int tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    tr_batch_t b = {.B = 1, .T = 8, .tokens = tokens, .targets = tokens};
    order_log log = {0, tr_model_num_layers(m), 0};
    assert_int_equal(tr_model_forward(m, &b, NULL), 0);
    assert_int_equal(tr_model_backward(m, record, &log), 0);
    assert_int_equal(log.calls, 4); // embed h0 h1 head
    assert_int_equal(log.covered, tr_model_num_params(m));
    assert_string_equal(tr_model_layer(m, 3)->name, "head");
    tr_model_destroy(m);
}

static void test_model_rejects_bad_configs_and_batches(void **state)
{
    tr_gpt2_config_t cfg = {
        .max_seq_len = 8, .vocab_size = 11, .num_layers = 1, .num_heads = 3, .channels = 8};
    tr_model_t *m = NULL;
    char why[160] = "";
    assert_int_equal(tr_model_gpt2_create(&m, &cfg, why, sizeof(why)), TR_EINVAL);
    assert_non_null(strstr(why, "num_heads"));
    cfg.num_heads = 2;
    assert_int_equal(tr_model_gpt2_create(&m, &cfg, why, sizeof(why)), 0);
    assert_int_equal(tr_model_gpt2_config(m)->padded_vocab_size, 128); // rounded up
    int tokens[9] = {0};
    tr_batch_t too_long = {.B = 1, .T = 9, .tokens = tokens, .targets = tokens};
    assert_int_equal(tr_model_forward(m, &too_long, NULL), TR_EINVAL);
    int bad_target[4] = {1, 2, 11, 3};
    tr_batch_t b = {.B = 1, .T = 4, .tokens = tokens, .targets = bad_target};
    assert_int_equal(tr_model_forward(m, &b, NULL), TR_EINVAL);
    int padded_token[4] = {1, 2, 3, 11}; // below Vp = 128 but not a real token (V = 11)
    tr_batch_t c = {.B = 1, .T = 4, .tokens = padded_token};
    assert_int_equal(tr_model_forward(m, &c, NULL), TR_EINVAL);
    tr_model_destroy(m);
    int widths[] = {4};
    assert_int_equal(tr_model_mlp_create(&m, widths, 1, why, sizeof(why)), TR_EINVAL);
    // no loss layer: forward works, backward has nothing to start from
    tr_layer_t *only[1];
    assert_int_equal(tr_layer_gelu_create(&only[0], "g", 3), 0);
    assert_int_equal(tr_model_create(&m, only, 1, NULL, 0), 0);
    float x[3] = {1, 2, 3};
    int t[1] = {0};
    tr_batch_t g = {.B = 1, .T = 1, .x = x, .targets = t};
    assert_int_equal(tr_model_forward(m, &g, NULL), 0);
    assert_int_equal(tr_model_backward(m, NULL, NULL), TR_EINVAL);
    assert_non_null(strstr(tr_model_error(m), "'g' is not a loss layer"));
    tr_batch_t no_x = {.B = 1, .T = 1};
    assert_int_equal(tr_model_forward(m, &no_x, NULL), TR_EINVAL);
    assert_non_null(strstr(tr_model_error(m), "batch.x is NULL"));
    tr_model_destroy(m);
    tr_model_destroy(NULL);
}

/* ---- float targets ------------------------------------------------------------------------ */

/* 4 -> 8 -> 2 regression with MSE: float x, float y. */
static tr_model_t *regression_mlp(void)
{
    tr_layer_t *layers[4];
    assert_int_equal(tr_layer_linear_create(&layers[0], "fc0", 4, 8, 1), 0);
    assert_int_equal(tr_layer_gelu_create(&layers[1], "gelu0", 8), 0);
    assert_int_equal(tr_layer_linear_create(&layers[2], "fc1", 8, 2, 1), 0);
    assert_int_equal(tr_layer_mse_create(&layers[3], "loss", 2), 0);
    tr_model_t *m;
    assert_int_equal(tr_model_create(&m, layers, 4, NULL, 0), 0);
    tr_model_init_params(m, 9);
    return m;
}

static void test_model_mse_regression_gradient_matches_finite_differences(void **state)
{
    tr_model_t *m = regression_mlp();
    int y_dim = -1;
    assert_int_equal(tr_model_targets(m, &y_dim), TR_TARGETS_FLOAT);
    assert_int_equal(y_dim, 2);
    float x[3 * 2 * 4], y[3 * 2 * 2];
    for (int i = 0; i < 24; i++)
        x[i] = (float)(irand(2001) - 1000) * 1e-3f;
    for (int i = 0; i < 12; i++)
        y[i] = (float)(irand(2001) - 1000) * 1e-3f;
    tr_batch_t b = {.B = 3, .T = 2, .x = x, .y = y, .y_dim = 2};
    check_model_gradient(m, &b);
    // the loss is the mean of (prediction - y)^2 over all B T y_dim floats
    float loss = loss_of(m, &b);
    const float *pred = tr_model_output(m, 2);
    double want = 0;
    for (int i = 0; i < 12; i++)
        want += ((double)pred[i] - y[i]) * ((double)pred[i] - y[i]) / 12;
    assert_float_equal(loss, want, 1e-6 * want);
    // and it learns: 1000 steps of SGD fit the 6 points
    for (int step = 0; step < 1000; step++) {
        tr_model_zero_grad(m);
        loss_of(m, &b);
        assert_int_equal(tr_model_backward(m, NULL, NULL), 0);
        float *p = tr_model_params(m), *g = tr_model_grads(m);
        for (size_t i = 0; i < tr_model_num_params(m); i++)
            p[i] -= 0.5f * g[i];
    }
    print_message("mse sgd: loss %.4f -> %.4f\n", loss, loss_of(m, &b));
    assert_true(loss_of(m, &b) < 0.05f * loss);
    tr_model_destroy(m);
}

static void test_model_refuses_targets_of_the_other_kind(void **state)
{
    tr_model_t *reg = regression_mlp(), *cls;
    int widths[] = {4, 3};
    assert_int_equal(tr_model_mlp_create(&cls, widths, 2, NULL, 0), 0);
    int y_dim = -1;
    assert_int_equal(tr_model_targets(cls, &y_dim), TR_TARGETS_INT);
    assert_int_equal(y_dim, 0);
    float x[2 * 4] = {0}, y[2 * 3] = {0};
    int targets[2] = {1, 2};
    // integer targets for a float loss, float targets for an integer loss: refused, named
    tr_batch_t b = {.B = 1, .T = 2, .x = x, .targets = targets};
    assert_int_equal(tr_model_forward(reg, &b, NULL), TR_EINVAL);
    assert_non_null(strstr(tr_model_error(reg), "'loss' reads float targets (batch.y, y_dim 2)"));
    assert_non_null(strstr(tr_model_error(reg), "batch.targets"));
    b = (tr_batch_t){.B = 1, .T = 2, .x = x, .y = y, .y_dim = 3};
    assert_int_equal(tr_model_forward(cls, &b, NULL), TR_EINVAL);
    assert_non_null(strstr(tr_model_error(cls), "'loss' reads integer targets (batch.targets)"));
    assert_non_null(strstr(tr_model_error(cls), "batch.y"));
    // a y_dim other than the loss layer's, or y without a y_dim
    assert_int_equal(tr_model_forward(reg, &b, NULL), TR_EINVAL);
    assert_non_null(strstr(tr_model_error(reg), "y_dim 3, but loss layer 'loss' reads 2"));
    b.y_dim = 0;
    assert_int_equal(tr_model_forward(reg, &b, NULL), TR_EINVAL);
    assert_non_null(strstr(tr_model_error(reg), "y_dim 0, need >= 1"));
    // no targets: forward predicts, backward is refused and says what it needs
    b = (tr_batch_t){.B = 1, .T = 2, .x = x};
    assert_int_equal(tr_model_forward(reg, &b, NULL), 0);
    assert_int_equal(tr_model_backward(reg, NULL, NULL), TR_EINVAL);
    assert_non_null(strstr(tr_model_error(reg), "float targets (batch.y)"));
    tr_model_destroy(reg);
    tr_model_destroy(cls);
}

/* A loss layer must be declared with tr_layer_set_loss; poking is_loss alone is refused. */
static void test_model_loss_layers_declare_their_targets(void **state)
{
    tr_layer_t *l;
    assert_int_equal(tr_layer_gelu_create(&l, "g", 3), 0);
    assert_int_equal(l->targets, TR_TARGETS_NONE);
    assert_int_equal(tr_layer_set_loss(l, TR_TARGETS_INT, 2), TR_EINVAL);   // int takes no y_dim
    assert_int_equal(tr_layer_set_loss(l, TR_TARGETS_FLOAT, 0), TR_EINVAL); // float needs one
    assert_int_equal(tr_layer_set_loss(l, TR_TARGETS_NONE, 0), TR_EINVAL);
    assert_int_equal(tr_layer_set_loss(l, 7, 1), TR_EINVAL);
    assert_false(l->is_loss);
    assert_int_equal(tr_layer_set_loss(l, TR_TARGETS_FLOAT, 3), 0);
    assert_true(l->is_loss);
    assert_int_equal(l->y_dim, 3);
    l->targets = TR_TARGETS_NONE; // as a layer that only poked is_loss = 1
    tr_model_t *m;
    char why[200] = "";
    assert_int_equal(tr_model_create(&m, &l, 1, why, sizeof(why)), TR_EINVAL);
    assert_non_null(strstr(why, "tr_layer_set_loss"));
}

/* ---- the training flag -------------------------------------------------------------------- */

typedef struct {
    int fwd, bwd; // ctx->training seen by the last forward / backward, -1 before
} seen_t;

static int spy_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    ((seen_t *)l->state)->fwd = c->training;
    memcpy(c->out, c->in, (size_t)c->B * c->T * l->in_dim * sizeof(float));
    return 0;
}

static int spy_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    ((seen_t *)l->state)->bwd = c->training;
    return 0;
}

static void free_spy_state(tr_layer_t *l)
{
    free(l->state);
}

static const tr_layer_ops_t spy_ops = {.kind = "spy",
                                       .act_size = scale_acts,
                                       .forward = spy_forward,
                                       .backward = spy_backward,
                                       .destroy = free_spy_state};

static void test_model_layers_see_the_training_flag(void **state)
{
    tr_layer_t *layers[2], *spy = malloc(sizeof(*spy));
    seen_t *seen = malloc(sizeof(*seen));
    *seen = (seen_t){-1, -1};
    assert_int_equal(tr_layer_init(spy, &spy_ops, "spy", 2, 2, seen), 0);
    layers[0] = spy;
    assert_int_equal(tr_layer_mse_create(&layers[1], "loss", 2), 0);
    tr_model_t *m;
    assert_int_equal(tr_model_create(&m, layers, 2, NULL, 0), 0);
    float x[2] = {1, 2}, y[2] = {0, 0};
    tr_batch_t b = {.B = 1, .T = 1, .x = x, .y = y, .y_dim = 2};
    assert_int_equal(tr_model_training(m), 1); // a new model trains
    assert_int_equal(tr_model_forward(m, &b, NULL), 0);
    assert_int_equal(tr_model_backward(m, NULL, NULL), 0);
    assert_int_equal(seen->fwd, 1);
    assert_int_equal(seen->bwd, 1);
    tr_model_set_training(m, 0);
    assert_int_equal(tr_model_training(m), 0);
    assert_int_equal(tr_model_forward(m, &b, NULL), 0);
    assert_int_equal(seen->fwd, 0);
    assert_int_equal(tr_model_backward(m, NULL, NULL), 0);
    assert_int_equal(seen->bwd, 0);
    tr_model_set_training(m, 1);
    assert_int_equal(tr_model_forward(m, &b, NULL), 0);
    assert_int_equal(seen->fwd, 1);
    tr_model_destroy(m);
}

/* ---- ownership ---------------------------------------------------------------------------- */

static int destroyed;

static void count_destroy(tr_layer_t *l)
{
    destroyed++;
}

static const tr_layer_ops_t owned_ops = {.kind = "owned",
                                         .act_size = scale_acts,
                                         .forward = scale_forward,
                                         .backward = scale_backward,
                                         .destroy = count_destroy};

/* tr_model_create takes the layers, also when it fails; destroy runs ops->destroy, then free
 * (ASan checks the free). */
static void test_model_owns_its_layers_also_on_failure(void **state)
{
    tr_layer_t *layers[2];
    for (int i = 0; i < 2; i++) {
        layers[i] = calloc(1, sizeof(tr_layer_t));
        assert_int_equal(tr_layer_init(layers[i], &owned_ops, "owned", 3, 3, NULL), 0);
    }
    tr_model_t *m;
    destroyed = 0;
    assert_int_equal(tr_model_create(&m, layers, 2, NULL, 0), 0);
    assert_int_equal(destroyed, 0);
    tr_model_destroy(m);
    assert_int_equal(destroyed, 2);
    layers[0] = calloc(1, sizeof(tr_layer_t));
    layers[1] = calloc(1, sizeof(tr_layer_t));
    assert_int_equal(tr_layer_init(layers[0], &owned_ops, "a", 3, 3, NULL), 0);
    assert_int_equal(tr_layer_init(layers[1], &owned_ops, "b", 4, 4, NULL), 0); // 3 != 4
    destroyed = 0;
    char why[160];
    assert_int_equal(tr_model_create(&m, layers, 2, why, sizeof(why)), TR_EINVAL);
    assert_int_equal(destroyed, 2);
    assert_non_null(strstr(why, "layer 1 (b) reads 4 floats per position"));
}

/* ---- per-parameter weight decay ----------------------------------------------------------- */

/* GPT-2 as llm.c's train_gpt2.cu decays: wte, wpe, qkvw, attprojw, fcw, fcprojw; never the
 * biases or the LayerNorm weights. The MLP: weights decayed, biases not. */
/* A pipeline stage's init: the kept layers get exactly the whole init's values (the random
 * state advanced past the layers before them), and no other layer's parameters are written. */
static void test_model_init_params_layers_is_the_whole_init_in_part(void **state)
{
    (void)state;
    tr_gpt2_config_t cfg = {
        .max_seq_len = 8, .vocab_size = 50, .num_layers = 4, .num_heads = 2, .channels = 16};
    tr_model_t *whole, *part;
    char why[256];
    assert_int_equal(tr_model_gpt2_create(&whole, &cfg, why, sizeof(why)), 0);
    assert_int_equal(tr_model_gpt2_create(&part, &cfg, why, sizeof(why)), 0);
    tr_model_init_params(whole, 77);
    int n = tr_model_num_layers(part);          /* embed, h0..h3, head */
    unsigned char keep[6] = {1, 0, 0, 1, 1, 0}; /* the embedding (tied) and h2, h3 */
    assert_int_equal(n, 6);
    const float *pw = tr_model_params(whole);
    float *pp = tr_model_params(part);
    for (size_t i = 0; i < tr_model_num_params(part); i++)
        pp[i] = NAN; /* what no init may touch */
    assert_int_equal(tr_model_init_params_layers(part, 77, keep), 0);
    for (int i = 0; i < n; i++) {
        const tr_layer_t *l = tr_model_layer(part, i);
        for (size_t k = l->param_offset; k < l->param_offset + l->param_count; k++)
            if (keep[i])
                assert_memory_equal(&pp[k], &pw[k], sizeof(float));
            else
                assert_true(isnan(pp[k]));
    }
    tr_model_destroy(whole);
    tr_model_destroy(part);
}

static void test_model_weight_decay_flags_follow_gpt2_recipe(void **state)
{
    tr_model_t *m = tiny_gpt2();
    static const char *decayed[] = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"};
    int n_decayed = 0, n_flagged = 0;
    for (int li = 0; li < tr_model_num_layers(m); li++) {
        tr_layer_t *l = tr_model_layer(m, li);
        for (int k = 0; k < l->n_params; k++) {
            int want_decay = 0;
            for (int d = 0; d < 6; d++)
                want_decay |= strcmp(l->params[k].name, decayed[d]) == 0;
            if (l->params[k].no_decay == want_decay)
                fail_msg("%s.%s: no_decay %d", l->name, l->params[k].name, l->params[k].no_decay);
            n_decayed += want_decay;
            n_flagged += !want_decay;
        }
    }
    assert_int_equal(n_decayed, 2 + 2 * 4); // wte wpe, 4 matrices in each of 2 blocks
    assert_int_equal(n_flagged, 2 * 8 + 2); // 8 vectors per block, lnfw lnfb
    tr_model_destroy(m);
    int widths[] = {5, 6, 2};
    assert_int_equal(tr_model_mlp_create(&m, widths, 3, NULL, 0), 0);
    for (int li = 0; li < tr_model_num_layers(m); li += 2) { // fc0, fc1
        tr_layer_t *l = tr_model_layer(m, li);
        assert_int_equal(tr_layer_find_param(l, "weight")->no_decay, 0);
        assert_int_equal(tr_layer_find_param(l, "bias")->no_decay, 1);
    }
    tr_model_destroy(m);
    // a user layer's flags are set by name
    tr_layer_t *l;
    assert_int_equal(tr_layer_linear_create(&l, "fc", 3, 3, 1), 0);
    assert_int_equal(tr_layer_set_param_no_decay(l, "weight", 1), 0);
    assert_int_equal(tr_layer_set_param_no_decay(l, "bias", 0), 0);
    assert_int_equal(tr_layer_find_param(l, "weight")->no_decay, 1);
    assert_int_equal(tr_layer_find_param(l, "bias")->no_decay, 0);
    assert_int_equal(tr_layer_set_param_no_decay(l, "gamma", 1), TR_EINVAL);
    free(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_gpt2_gradient_matches_finite_differences),
        cmocka_unit_test(test_model_gpt2_learns_a_batch_with_sgd),
        cmocka_unit_test(test_model_mlp_gradient_matches_finite_differences),
        cmocka_unit_test(test_model_user_layer_joins_a_model),
        cmocka_unit_test(test_model_backward_reports_layers_last_to_first),
        cmocka_unit_test(test_model_rejects_bad_configs_and_batches),
        cmocka_unit_test(test_model_mse_regression_gradient_matches_finite_differences),
        cmocka_unit_test(test_model_refuses_targets_of_the_other_kind),
        cmocka_unit_test(test_model_loss_layers_declare_their_targets),
        cmocka_unit_test(test_model_layers_see_the_training_flag),
        cmocka_unit_test(test_model_owns_its_layers_also_on_failure),
        cmocka_unit_test(test_model_weight_decay_flags_follow_gpt2_recipe),
        cmocka_unit_test(test_model_checkpointing_is_bitwise_with_fewer_activations),
        cmocka_unit_test(test_model_init_params_layers_is_the_whole_init_in_part),
    };
    return cmocka_run_group_tests_name("model", tests, NULL, NULL);
}
