/* layers.c: the built-in layers as tr_layer_t: linear, GELU, LayerNorm, embedding,
 * cross-entropy and mean squared error, each a thin wrapper that maps a layer context onto
 * its kernel (kernels/cpu/ops.h; MSE is small enough to live here).
 *
 * Activation regions (floats, output first), N = B T, D = MSE's dim:
 *   linear (N, OC) | gelu (N, C) | layernorm (N, C) + mean (N) + rstd (N) |
 *   embedding (N, C) | crossentropy losses (N) + probs (N, V) | mse losses (N).
 */
#include "troupe/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "kernels/cpu/ops.h"
#include "troupe/error.h"

#define ROWS(ctx) ((size_t)(ctx)->B * (ctx)->T)

static size_t no_scratch(const tr_layer_t *l, int B, int T)
{
    return 0;
}

static size_t out_size(const tr_layer_t *l, int B, int T)
{
    return (size_t)B * T * l->out_dim;
}

static void free_state(tr_layer_t *l)
{
    free(l->state);
}

/* Allocates a layer and runs tr_layer_init; *state (if any) becomes the layer's. */
static int new_layer(tr_layer_t **out, const tr_layer_ops_t *ops, const char *name, int in_dim,
                     int out_dim, void *state)
{
    tr_layer_t *l = calloc(1, sizeof(*l));
    int err = l ? tr_layer_init(l, ops, name, in_dim, out_dim, state) : TR_ENOMEM;
    if (err) {
        free(l);
        free(state);
        return err;
    }
    *out = l;
    return 0;
}

/* Frees a half-built layer when err; for the last line of the create functions. */
static int finish(tr_layer_t **out, int err)
{
    if (err && *out) {
        tr__layer_free(*out);
        *out = NULL;
    }
    return err;
}

/* ---- linear: (N, C) -> (N, OC); weight (OC, C), bias (OC) ---------------------------------- */

static int linear_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    const float *bias = l->n_params == 2 ? c->params + l->params[1].offset : NULL;
    tr__linear_forward(c->out, c->in, c->params, c->params_bf16, bias, (int)ROWS(c), l->in_dim,
                       l->out_dim);
    return 0;
}

static int linear_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    float *dbias = l->n_params == 2 ? c->grads + l->params[1].offset : NULL;
    tr__linear_backward(c->din, c->grads, dbias, c->dout, c->in, c->params, c->params_bf16,
                        (int)ROWS(c), l->in_dim, l->out_dim);
    return 0;
}

/* zb's split: the input gradient now, the weight gradient later from the stashed dout. */
static size_t linear_stash(const tr_layer_t *l, int B, int T)
{
    return (size_t)B * T * (size_t)l->out_dim;
}

static int linear_backward_input(tr_layer_t *l, tr_layer_ctx_t *c)
{
    memcpy(c->stash, c->dout, ROWS(c) * (size_t)l->out_dim * sizeof(float));
    if (c->din)
        tr__linear_backward(c->din, NULL, NULL, c->dout, NULL, c->params, c->params_bf16,
                            (int)ROWS(c), l->in_dim, l->out_dim);
    return 0;
}

static int linear_backward_weight(tr_layer_t *l, tr_layer_ctx_t *c)
{
    float *dbias = l->n_params == 2 ? c->grads + l->params[1].offset : NULL;
    tr__linear_backward(NULL, c->grads, dbias, c->stash, c->in, NULL, c->params_bf16, (int)ROWS(c),
                        l->in_dim, l->out_dim);
    return 0;
}

static void linear_init(tr_layer_t *l, float *params, uint64_t *rng)
{
    tr_rng_fill_uniform(rng, params, l->param_count, 1.0f / sqrtf((float)l->in_dim)); // PyTorch's
}

static const tr_layer_ops_t linear_ops = {.kind = "linear",
                                          .act_size = out_size,
                                          .scratch_size = no_scratch,
                                          .forward = linear_forward,
                                          .backward = linear_backward,
                                          .init = linear_init,
                                          .stash_size = linear_stash,
                                          .backward_input = linear_backward_input,
                                          .backward_weight = linear_backward_weight};

int tr_layer_linear_create(tr_layer_t **out, const char *name, int C, int OC, int with_bias)
{
    if (C < 1 || OC < 1) return TR_EINVAL;
    int err = new_layer(out, &linear_ops, name, C, OC, NULL);
    if (err) return err;
    err = tr_layer_add_param(*out, "weight", 2, (int64_t[]){OC, C});
    if (!err && with_bias) err = tr_layer_add_param(*out, "bias", 1, (int64_t[]){OC});
    return finish(out, err);
}

/* ---- gelu: (N, C) -> (N, C) ----------------------------------------------------------------- */

static int gelu_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    tr__gelu_forward(c->out, c->in, ROWS(c) * l->in_dim);
    return 0;
}

static int gelu_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    if (c->din) tr__gelu_backward(c->din, c->in, c->dout, ROWS(c) * l->in_dim);
    return 0;
}

static const tr_layer_ops_t gelu_ops = {.kind = "gelu",
                                        .act_size = out_size,
                                        .scratch_size = no_scratch,
                                        .forward = gelu_forward,
                                        .backward = gelu_backward};

int tr_layer_gelu_create(tr_layer_t **out, const char *name, int C)
{
    return C < 1 ? TR_EINVAL : new_layer(out, &gelu_ops, name, C, C, NULL);
}

/* ---- layernorm: (N, C) -> (N, C); weight, bias (C) ------------------------------------------ */

static size_t layernorm_acts(const tr_layer_t *l, int B, int T)
{
    return (size_t)B * T * (l->out_dim + 2);
}

static int layernorm_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    size_t N = ROWS(c);
    float *mean = c->acts + N * l->out_dim, *rstd = mean + N; // (N) each
    tr__layernorm_forward(c->out, mean, rstd, c->in, c->params, c->params + l->in_dim, (int)N,
                          l->in_dim);
    return 0;
}

static int layernorm_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    size_t N = ROWS(c);
    const float *mean = c->acts + N * l->out_dim, *rstd = mean + N;
    float *din = c->din ? c->din : c->scratch; // the input's gradient is still computed
    tr__layernorm_backward(din, c->grads, c->grads + l->in_dim, c->dout, c->in, c->params, mean,
                           rstd, (int)N, l->in_dim);
    return 0;
}

static size_t layernorm_scratch(const tr_layer_t *l, int B, int T)
{
    return (size_t)B * T * l->in_dim;
}

static void layernorm_init(tr_layer_t *l, float *params, uint64_t *rng)
{
    tr__fill(params, l->in_dim, 1.0f);
    tr__fill(params + l->in_dim, l->in_dim, 0.0f);
}

static const tr_layer_ops_t layernorm_ops = {.kind = "layernorm",
                                             .act_size = layernorm_acts,
                                             .scratch_size = layernorm_scratch,
                                             .forward = layernorm_forward,
                                             .backward = layernorm_backward,
                                             .init = layernorm_init};

int tr_layer_layernorm_create(tr_layer_t **out, const char *name, int C)
{
    if (C < 1) return TR_EINVAL;
    int err = new_layer(out, &layernorm_ops, name, C, C, NULL);
    if (err) return err;
    err = tr_layer_add_param(*out, "weight", 1, (int64_t[]){C});
    if (!err) err = tr_layer_add_param(*out, "bias", 1, (int64_t[]){C});
    return finish(out, err);
}

/* ---- embedding: tokens (B, T) -> (B, T, C); wte (V, C), wpe (maxT, C) ------------------------ */

typedef struct {
    int V; // token ids must be below this (GPT-2: the real vocabulary, not the padded rows)
} emb_state;

static int embedding_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    const emb_state *s = l->state;
    int has_wpe = l->n_params == 2;
    if (has_wpe && c->T > l->params[1].shape[0]) return TR_EINVAL;
    return tr__embedding_forward(c->out, c->tokens, c->params,
                                 has_wpe ? c->params + l->params[1].offset : NULL, c->B, c->T,
                                 l->out_dim, s->V);
}

void tr__layer_embedding_limit(tr_layer_t *layer, int V)
{
    ((emb_state *)layer->state)->V = V;
}

static int embedding_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    float *dwpe = l->n_params == 2 ? c->grads + l->params[1].offset : NULL;
    tr__embedding_backward(c->grads, dwpe, c->dout, c->tokens, c->B, c->T, l->out_dim);
    return 0;
}

static void embedding_init(tr_layer_t *l, float *params, uint64_t *rng)
{
    tr_rng_fill_normal(rng, params, l->param_count, 0.02f);
}

static const tr_layer_ops_t embedding_ops = {.kind = "embedding",
                                             .act_size = out_size,
                                             .scratch_size = no_scratch,
                                             .forward = embedding_forward,
                                             .backward = embedding_backward,
                                             .init = embedding_init,
                                             .destroy = free_state};

int tr_layer_embedding_create(tr_layer_t **out, const char *name, int V, int maxT, int C)
{
    if (V < 1 || C < 1 || maxT < 0) return TR_EINVAL;
    emb_state *s = malloc(sizeof(*s));
    if (!s) return TR_ENOMEM;
    s->V = V;
    int err = new_layer(out, &embedding_ops, name, 0, C, s);
    if (err) return err;
    err = tr_layer_add_param(*out, "wte", 2, (int64_t[]){V, C});
    if (!err && maxT > 0) err = tr_layer_add_param(*out, "wpe", 2, (int64_t[]){maxT, C});
    return finish(out, err);
}

/* ---- crossentropy: logits (N, V) + targets -> losses (N) ------------------------------------ */

typedef struct {
    int ignore_index;
    int count; // positions counted by the last forward
} ce_state;

static size_t crossentropy_acts(const tr_layer_t *l, int B, int T)
{
    return (size_t)B * T * (1 + l->in_dim);
}

static int crossentropy_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    ce_state *s = l->state;
    size_t N = ROWS(c);
    float *probs = c->acts + N; // (N, V)
    memcpy(probs, c->in, N * l->in_dim * sizeof(float));
    if (!c->targets) return 0;
    return tr__crossentropy_forward(c->out, probs, c->targets, (int)N, l->in_dim, l->in_dim,
                                    s->ignore_index, &c->loss, &s->count);
}

static int crossentropy_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    ce_state *s = l->state;
    size_t N = ROWS(c);
    if (c->din && s->count)
        tr__crossentropy_backward(c->din, c->acts + N, c->targets, (int)N, l->in_dim, l->in_dim,
                                  s->ignore_index, c->loss_scale / s->count);
    return 0;
}

static const tr_layer_ops_t crossentropy_ops = {.kind = "crossentropy",
                                                .act_size = crossentropy_acts,
                                                .scratch_size = no_scratch,
                                                .forward = crossentropy_forward,
                                                .backward = crossentropy_backward,
                                                .destroy = free_state};

int tr_layer_crossentropy_create(tr_layer_t **out, const char *name, int V, int ignore_index)
{
    ce_state *s = V < 1 ? NULL : calloc(1, sizeof(*s));
    if (!s) return V < 1 ? TR_EINVAL : TR_ENOMEM;
    s->ignore_index = ignore_index;
    int err = new_layer(out, &crossentropy_ops, name, V, 1, s);
    if (!err) {
        tr_layer_set_loss(*out, TR_TARGETS_INT, 0);
        (*out)->classes = V;
        (*out)->ignore_index = ignore_index;
    }
    return err;
}

/* ---- mse: predictions (N, D) + float targets y (N, D) -> losses (N) ------------------------- */

/* losses[n] = mean over D of (in - y)^2; loss = the mean over all N D (sums in double). */
static int mse_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    size_t N = ROWS(c), D = (size_t)l->in_dim;
    if (!c->y) { // no targets: nothing to compare against, the prediction is the input
        memset(c->out, 0, N * sizeof(float));
        return 0;
    }
    double total = 0;
    for (size_t n = 0; n < N; n++) {
        const float *in = c->in + n * D, *y = c->y + n * D;
        double row = 0;
        for (size_t d = 0; d < D; d++) {
            double e = (double)in[d] - (double)y[d];
            row += e * e;
        }
        c->out[n] = (float)(row / (double)D);
        total += row;
    }
    c->loss = (float)(total / (double)(N * D));
    return 0;
}

/* din += 2 (in - y) / (N D) * loss_scale */
static int mse_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    size_t n = ROWS(c) * (size_t)l->in_dim;
    if (!c->y) return TR_EINVAL;
    if (!c->din) return 0; // the input is the batch: nothing needs its gradient
    float k = 2.0f * c->loss_scale / (float)n;
    for (size_t i = 0; i < n; i++)
        c->din[i] += k * (c->in[i] - c->y[i]);
    return 0;
}

static const tr_layer_ops_t mse_ops = {.kind = "mse",
                                       .act_size = out_size,
                                       .scratch_size = no_scratch,
                                       .forward = mse_forward,
                                       .backward = mse_backward};

int tr_layer_mse_create(tr_layer_t **out, const char *name, int dim)
{
    if (dim < 1) return TR_EINVAL;
    int err = new_layer(out, &mse_ops, name, dim, 1, NULL);
    if (!err) tr_layer_set_loss(*out, TR_TARGETS_FLOAT, dim);
    return err;
}
