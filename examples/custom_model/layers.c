/* layers.c: a linear layer, a tanh and an MSE loss written by a user (see layers.h).
 *
 * Each layer is a tr_layer_t filled with tr_layer_init and tr_layer_add_param, plus a table of
 * ops: act_size (floats kept between forward and backward, output first), forward, backward
 * (which ADDS into ctx->grads and ctx->din), init (draws from the model's rng with
 * troupe/rng.h) and destroy. Shapes: N = B T rows of in_dim floats in, out_dim floats out.
 */
#include "layers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define ROWS(c) ((size_t)(c)->B * (size_t)(c)->T)

/* Every layer keeps just its output: (B, T, out_dim). */
static size_t out_size(const tr_layer_t *l, int B, int T)
{
    return (size_t)B * (size_t)T * (size_t)l->out_dim;
}

/* A calloc'ed layer set up with ops; *out untouched and nothing allocated on failure. */
static int new_layer(tr_layer_t **out, const tr_layer_ops_t *ops, const char *name, int in_dim,
                     int out_dim)
{
    tr_layer_t *l = calloc(1, sizeof(*l));
    if (!l) return TR_ENOMEM;
    int err = tr_layer_init(l, ops, name, in_dim, out_dim, NULL);
    if (err) {
        free(l);
        return err;
    }
    *out = l;
    return 0;
}

/* ---- linear: out (N, OC) = in (N, C) W^T + b ----------------------------------------------- */

static int linear_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    size_t C = (size_t)l->in_dim, OC = (size_t)l->out_dim;
    const float *W = c->params, *b = c->params + l->params[1].offset; // (OC, C), (OC)
    for (size_t n = 0; n < ROWS(c); n++)
        for (size_t o = 0; o < OC; o++) {
            float s = b[o];
            for (size_t i = 0; i < C; i++)
                s += W[o * C + i] * c->in[n * C + i];
            c->out[n * OC + o] = s;
        }
    return 0;
}

/* dW += dout^T in, db += sum over rows of dout, din += dout W (din NULL for layer 0). */
static int linear_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    size_t C = (size_t)l->in_dim, OC = (size_t)l->out_dim;
    const float *W = c->params;
    float *dW = c->grads, *db = c->grads + l->params[1].offset;
    for (size_t n = 0; n < ROWS(c); n++)
        for (size_t o = 0; o < OC; o++) {
            float d = c->dout[n * OC + o];
            db[o] += d;
            for (size_t i = 0; i < C; i++) {
                dW[o * C + i] += d * c->in[n * C + i];
                if (c->din) c->din[n * C + i] += d * W[o * C + i];
            }
        }
    return 0;
}

/* W and b uniform in +-1/sqrt(C), W first: the order the model's rng is drawn in. */
static void linear_init(tr_layer_t *l, float *params, uint64_t *rng)
{
    float bound = 1.0f / sqrtf((float)l->in_dim);
    tr_rng_fill_uniform(rng, params, l->params[0].numel, bound);
    tr_rng_fill_uniform(rng, params + l->params[1].offset, l->params[1].numel, bound);
}

static const tr_layer_ops_t linear_ops = {
    .kind = "my_linear",
    .act_size = out_size,
    .forward = linear_forward,
    .backward = linear_backward,
    .init = linear_init,
};

int my_linear_create(tr_layer_t **out, const char *name, int C, int OC)
{
    tr_layer_t *l;
    int err = new_layer(&l, &linear_ops, name, C, OC);
    if (err) return err;
    if ((err = tr_layer_add_param(l, "weight", 2, (int64_t[]){OC, C})) < 0 ||
        (err = tr_layer_add_param(l, "bias", 1, (int64_t[]){OC})) < 0) {
        free(l); // no state to destroy
        return err;
    }
    *out = l; // weight decayed (a matrix), bias not (a vector): tr_layer_add_param's rule
    return 0;
}

/* ---- tanh: out (N, C) = tanh(in) ------------------------------------------------------------- */

static int tanh_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    size_t n = ROWS(c) * (size_t)l->in_dim;
    for (size_t i = 0; i < n; i++)
        c->out[i] = tanhf(c->in[i]);
    return 0;
}

/* din += dout (1 - out^2): the kept output is all backward needs. */
static int tanh_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    size_t n = ROWS(c) * (size_t)l->in_dim;
    if (!c->din) return 0;
    for (size_t i = 0; i < n; i++)
        c->din[i] += c->dout[i] * (1.0f - c->out[i] * c->out[i]);
    return 0;
}

static const tr_layer_ops_t tanh_ops = {
    .kind = "my_tanh",
    .act_size = out_size,
    .forward = tanh_forward,
    .backward = tanh_backward,
};

int my_tanh_create(tr_layer_t **out, const char *name, int C)
{
    return new_layer(out, &tanh_ops, name, C, C);
}

/* ---- mse: predictions (N, D) and y (N, D) -> losses (N) ---------------------------------- */

/* losses[n] = mean over D of (in - y)^2, loss = mean over N D, summed in double. Without y
 * (a prediction-only forward) there is nothing to compare: losses 0, no loss. */
static int mse_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    size_t D = (size_t)l->in_dim;
    double total = 0;
    for (size_t n = 0; n < ROWS(c); n++) {
        double row = 0;
        for (size_t d = 0; c->y && d < D; d++) {
            double e = (double)c->in[n * D + d] - (double)c->y[n * D + d];
            row += e * e;
        }
        c->out[n] = (float)(row / (double)D);
        total += row;
    }
    if (c->y) c->loss = (float)(total / (double)(ROWS(c) * D));
    return 0;
}

/* The loss layer starts the chain (dout is NULL): din += 2 (in - y) / (N D) * loss_scale. */
static int mse_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    size_t n = ROWS(c) * (size_t)l->in_dim;
    if (!c->y) return TR_EINVAL; // the model refuses this before; a layer checks anyway
    if (!c->din) return 0;
    float k = 2.0f * c->loss_scale / (float)n;
    for (size_t i = 0; i < n; i++)
        c->din[i] += k * (c->in[i] - c->y[i]);
    return 0;
}

static const tr_layer_ops_t mse_ops = {
    .kind = "my_mse",
    .act_size = out_size,
    .forward = mse_forward,
    .backward = mse_backward,
};

int my_mse_create(tr_layer_t **out, const char *name, int D)
{
    tr_layer_t *l;
    int err = new_layer(&l, &mse_ops, name, D, 1);
    if (err) return err;
    if ((err = tr_layer_set_loss(l, TR_TARGETS_FLOAT, D)) < 0) { // D floats of y per position
        free(l);
        return err;
    }
    *out = l;
    return 0;
}

/* ---- the model --------------------------------------------------------------------------- */

int my_mlp_create(tr_model_t **out, int C, int H, char *why, size_t why_len)
{
    tr_layer_t *l[4] = {0};
    int err = my_linear_create(&l[0], "fc0", C, H);
    if (!err) err = my_tanh_create(&l[1], "tanh0", H);
    if (!err) err = my_linear_create(&l[2], "fc1", H, 1);
    if (!err) err = my_mse_create(&l[3], "loss", 1);
    if (err) { // the layers made so far are still ours (none has state to destroy)
        for (int i = 0; i < 4; i++)
            free(l[i]);
        snprintf(why, why_len, "my_mlp_create(%d, %d): %s", C, H, tr_strerror(err));
        return err;
    }
    return tr_model_create(out, l, 4, why, why_len); // the model owns the layers from here
}
