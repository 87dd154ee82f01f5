/* model.c: the generic model, a list of layers over three contiguous buffers.
 *
 * Parameters and gradients: one buffer each, carved layer after layer by the layers' size
 * tables (layer i owns [param_offset, param_offset + param_count)). Activations: one buffer
 * for a given (B, T), each layer's region starting with its output. Backward hands gradients
 * between layers through two ping-pong buffers (layer i reads dbuf[i % 2] and writes its
 * input's gradient into dbuf[(i + 1) % 2]), sized for the widest layer boundary, and shares
 * one scratch buffer sized for the hungriest layer. Not thread-safe: one caller per model.
 */
#include "troupe/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/blas_internal.h"
#include "kernels/cpu/model_internal.h"
#include "kernels/cpu/parallel.h"
#include "troupe/error.h"

struct tr_model {
    tr_layer_t **layers;
    int n;
    tr_device_t device;
    float *params, *grads; // (n_params) each
    size_t n_params;
    // for the current (B, T)
    int B, T;
    float *acts; // (n_acts)
    size_t n_acts;
    size_t *act_off; // (n + 1) each layer's region
    float *scratch;  // (n_scratch)
    size_t n_scratch;
    float *dbuf[2]; // (n_dbuf) each: gradients at layer boundaries
    size_t n_dbuf;
    int *tokens, *targets; // (B, T) copies of the batch
    float *x;              // (B, T, in_dim of layer 0) copy
    int has_targets;
    float loss, loss_scale;
    int is_gpt2;
    tr_gpt2_config_t gpt2;
};

/* ---- random numbers and small helpers ---------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float tr__rand_uniform(uint64_t *rng)
{
    return (float)(splitmix64(rng) >> 40) / 16777216.0f;
}

void tr__rand_normal(float *x, size_t n, float std, uint64_t *rng)
{
    for (size_t i = 0; i < n; i += 2) {
        float u1 = 1.0f - tr__rand_uniform(rng), u2 = tr__rand_uniform(rng); // u1 in (0, 1]
        float r = sqrtf(-2.0f * logf(u1)) * std;
        x[i] = r * cosf(6.28318530718f * u2);
        if (i + 1 < n) x[i + 1] = r * sinf(6.28318530718f * u2);
    }
}

void tr__fill(float *x, size_t n, float value)
{
    for (size_t i = 0; i < n; i++)
        x[i] = value;
}

int tr__why(int err, char *why, size_t why_len, const char *fmt, ...)
{
    if (why && why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return err;
}

/* ---- layers ------------------------------------------------------------------------------ */

int tr_layer_init(tr_layer_t *layer, const tr_layer_ops_t *ops, const char *name, int in_dim,
                  int out_dim, void *state)
{
    if (!layer || !ops || !name || strlen(name) >= TR_LAYER_NAME_MAX || in_dim < 0 || out_dim < 1)
        return TR_EINVAL;
    memset(layer, 0, sizeof(*layer));
    layer->ops = ops;
    strcpy(layer->name, name);
    layer->in_dim = in_dim;
    layer->out_dim = out_dim;
    layer->state = state;
    return 0;
}

int tr_layer_add_param(tr_layer_t *layer, const char *name, int ndim, const int64_t *shape)
{
    if (ndim < 1 || ndim > TR_PARAM_MAX_DIMS || strlen(name) >= TR_LAYER_NAME_MAX)
        return TR_EINVAL;
    if (layer->n_params == TR_LAYER_MAX_PARAMS) return TR_ENOSPC;
    tr_param_info_t *p = &layer->params[layer->n_params];
    memset(p, 0, sizeof(*p));
    strcpy(p->name, name);
    p->ndim = ndim;
    p->numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0) return TR_EINVAL;
        p->shape[d] = shape[d];
        p->numel *= (size_t)shape[d];
    }
    p->offset = layer->param_count;
    layer->param_count += p->numel;
    layer->n_params++;
    return 0;
}

const tr_param_info_t *tr_layer_find_param(const tr_layer_t *layer, const char *name)
{
    for (int i = 0; i < layer->n_params; i++)
        if (strcmp(layer->params[i].name, name) == 0) return &layer->params[i];
    return NULL;
}

void tr__layer_free(tr_layer_t *layer)
{
    if (!layer) return;
    if (layer->ops && layer->ops->destroy) layer->ops->destroy(layer);
    free(layer);
}

/* ---- create / destroy -------------------------------------------------------------------- */

static void free_layers(tr_layer_t **layers, int n)
{
    for (int i = 0; i < n; i++)
        tr__layer_free(layers[i]);
}

static int check_chain(tr_layer_t **layers, int n, char *why, size_t why_len)
{
    if (n < 1) return tr__why(TR_EINVAL, why, why_len, "a model needs at least one layer");
    for (int i = 0; i < n; i++) {
        tr_layer_t *l = layers[i];
        if (!l || !l->ops || !l->ops->forward || !l->ops->backward || !l->ops->act_size)
            return tr__why(TR_EINVAL, why, why_len, "layer %d: missing ops", i);
        if (l->is_loss && i != n - 1)
            return tr__why(TR_EINVAL, why, why_len, "layer %d (%s): a loss layer must be last", i,
                           l->name);
        if (i > 0 && l->in_dim != layers[i - 1]->out_dim)
            return tr__why(TR_EINVAL, why, why_len,
                           "layer %d (%s) reads %d floats per position, layer %d (%s) writes %d", i,
                           l->name, l->in_dim, i - 1, layers[i - 1]->name, layers[i - 1]->out_dim);
    }
    return 0;
}

int tr_model_create(tr_model_t **out, tr_layer_t **layers, int n, char *why, size_t why_len)
{
    tr__blas_warn_once(); // a model is where the library starts doing math
    int err = check_chain(layers, n, why, why_len);
    tr_model_t *m = err ? NULL : calloc(1, sizeof(*m));
    if (!err && !m) err = TR_ENOMEM;
    if (err) {
        free_layers(layers, n);
        return err;
    }
    m->layers = malloc((size_t)n * sizeof(*m->layers));
    m->n = n;
    m->loss_scale = 1.0f;
    for (int i = 0; i < n && m->layers; i++) {
        m->layers[i] = layers[i];
        layers[i]->param_offset = m->n_params;
        m->n_params += layers[i]->param_count;
    }
    m->params = calloc(m->n_params ? m->n_params : 1, sizeof(float));
    m->grads = calloc(m->n_params ? m->n_params : 1, sizeof(float));
    if (!m->layers || !m->params || !m->grads) {
        if (!m->layers) free_layers(layers, n), m->n = 0;
        tr_model_destroy(m);
        return TR_ENOMEM;
    }
    *out = m;
    return 0;
}

static void free_acts(tr_model_t *m)
{
    free(m->acts);
    free(m->act_off);
    free(m->scratch);
    free(m->dbuf[0]);
    free(m->dbuf[1]);
    free(m->tokens);
    free(m->targets);
    free(m->x);
    m->acts = m->scratch = m->dbuf[0] = m->dbuf[1] = m->x = NULL;
    m->act_off = NULL;
    m->tokens = m->targets = NULL;
    m->B = m->T = 0;
    m->n_acts = 0;
}

void tr_model_destroy(tr_model_t *model)
{
    if (!model) return;
    free_acts(model);
    free_layers(model->layers, model->n);
    free(model->layers);
    free(model->params);
    free(model->grads);
    free(model);
}

/* ---- activations for (B, T) -------------------------------------------------------------- */

static int reserve(tr_model_t *m, int B, int T)
{
    if (m->B == B && m->T == T) return 0;
    free_acts(m);
    size_t N = (size_t)B * T, n_acts = 0, n_scratch = 0, n_dbuf = 1;
    m->act_off = malloc((size_t)(m->n + 1) * sizeof(size_t));
    if (!m->act_off) return TR_ENOMEM;
    for (int i = 0; i < m->n; i++) {
        tr_layer_t *l = m->layers[i];
        m->act_off[i] = n_acts;
        n_acts += l->ops->act_size(l, B, T);
        size_t s = l->ops->scratch_size ? l->ops->scratch_size(l, B, T) : 0;
        n_scratch = s > n_scratch ? s : n_scratch;
        size_t d = N * (size_t)(l->in_dim > l->out_dim ? l->in_dim : l->out_dim);
        n_dbuf = d > n_dbuf ? d : n_dbuf;
    }
    m->act_off[m->n] = n_acts;
    m->acts = malloc((n_acts ? n_acts : 1) * sizeof(float));
    m->scratch = malloc((n_scratch ? n_scratch : 1) * sizeof(float));
    m->dbuf[0] = malloc(n_dbuf * sizeof(float));
    m->dbuf[1] = malloc(n_dbuf * sizeof(float));
    m->tokens = malloc(N * sizeof(int));
    m->targets = malloc(N * sizeof(int));
    m->x = malloc(N * (size_t)(m->layers[0]->in_dim ? m->layers[0]->in_dim : 1) * sizeof(float));
    if (!m->acts || !m->scratch || !m->dbuf[0] || !m->dbuf[1] || !m->tokens || !m->targets ||
        !m->x) {
        free_acts(m);
        return TR_ENOMEM;
    }
    m->n_acts = n_acts;
    m->n_scratch = n_scratch;
    m->n_dbuf = n_dbuf;
    m->B = B;
    m->T = T;
    return 0;
}

/* Copies the batch in (the model keeps it for backward). */
static int take_batch(tr_model_t *m, const tr_batch_t *b)
{
    tr_layer_t *first = m->layers[0];
    if (!b || b->B < 1 || b->T < 1) return TR_EINVAL;
    if (m->is_gpt2 && b->T > m->gpt2.max_seq_len) return TR_EINVAL;
    if (first->in_dim == 0 ? !b->tokens : !b->x) return TR_EINVAL;
    int err = reserve(m, b->B, b->T);
    if (err) return err;
    size_t N = (size_t)b->B * b->T;
    if (b->tokens) memcpy(m->tokens, b->tokens, N * sizeof(int));
    if (b->x) memcpy(m->x, b->x, N * (size_t)first->in_dim * sizeof(float));
    m->has_targets = b->targets != NULL;
    if (b->targets) memcpy(m->targets, b->targets, N * sizeof(int));
    return 0;
}

/* ---- forward / backward ------------------------------------------------------------------ */

static tr_layer_ctx_t context(tr_model_t *m, int i)
{
    tr_layer_t *l = m->layers[i];
    tr_layer_ctx_t c = {
        .B = m->B,
        .T = m->T,
        .tokens = m->tokens,
        .targets = m->has_targets ? m->targets : NULL,
        .in = i == 0 ? m->x : m->acts + m->act_off[i - 1],
        .acts = m->acts + m->act_off[i],
        .out = m->acts + m->act_off[i],
        .params = m->params + l->param_offset,
        .grads = m->grads + l->param_offset,
        .model_params = m->params,
        .model_grads = m->grads,
        .scratch = m->scratch,
        .loss_scale = m->loss_scale,
    };
    return c;
}

int tr_model_layer_forward(tr_model_t *model, int layer, const tr_batch_t *batch)
{
    if (layer < 0 || layer >= model->n) return TR_EINVAL;
    if (layer == 0) {
        int err = take_batch(model, batch);
        if (err) return err;
    } else if (!model->acts) {
        return TR_EINVAL;
    }
    tr_layer_t *l = model->layers[layer];
    tr_layer_ctx_t c = context(model, layer);
    int err = l->ops->forward(l, &c);
    if (!err && l->is_loss) model->loss = c.loss;
    return err;
}

int tr_model_forward(tr_model_t *model, const tr_batch_t *batch, float *loss)
{
    for (int i = 0; i < model->n; i++) {
        int err = tr_model_layer_forward(model, i, batch);
        if (err) return err;
    }
    if (loss) *loss = model->loss;
    return 0;
}

int tr_model_layer_backward(tr_model_t *model, int layer)
{
    // backward starts from a loss: the last layer must be one, and the batch must have targets
    if (layer < 0 || layer >= model->n || !model->acts || !model->has_targets ||
        !model->layers[model->n - 1]->is_loss)
        return TR_EINVAL;
    tr_layer_t *l = model->layers[layer];
    tr_layer_ctx_t c = context(model, layer);
    c.dout = l->is_loss ? NULL : model->dbuf[layer % 2];
    if (layer > 0) {
        c.din = model->dbuf[(layer + 1) % 2];
        memset(c.din, 0, (size_t)model->B * model->T * l->in_dim * sizeof(float));
    }
    return l->ops->backward(l, &c);
}

int tr_model_backward(tr_model_t *model, tr_model_grad_cb cb, void *arg)
{
    for (int i = model->n - 1; i >= 0; i--) {
        int err = tr_model_layer_backward(model, i);
        if (err) return err;
        tr_layer_t *l = model->layers[i];
        if (cb && cb(model, i, l->param_offset, l->param_count, arg)) return TR_ECANCELED;
    }
    return 0;
}

void tr_model_init_params(tr_model_t *model, uint64_t seed)
{
    uint64_t rng = seed;
    for (int i = 0; i < model->n; i++) {
        tr_layer_t *l = model->layers[i];
        if (l->ops->init) l->ops->init(l, model->params + l->param_offset, &rng);
    }
}

float tr_model_loss(const tr_model_t *model)
{
    return model->loss;
}

void tr_kernels_set_threads(int n)
{
    tr_parallel_set_threads(n);
}

void tr_model_zero_grad(tr_model_t *model)
{
    memset(model->grads, 0, model->n_params * sizeof(float));
}

/* ---- introspection ----------------------------------------------------------------------- */

int tr_model_num_layers(const tr_model_t *model)
{
    return model->n;
}
float *tr_model_params(const tr_model_t *model)
{
    return model->params;
}
float *tr_model_grads(const tr_model_t *model)
{
    return model->grads;
}
size_t tr_model_num_params(const tr_model_t *model)
{
    return model->n_params;
}
size_t tr_model_num_acts(const tr_model_t *model)
{
    return model->n_acts;
}
tr_device_t tr_model_device(const tr_model_t *model)
{
    return model->device;
}
void tr_model_set_loss_scale(tr_model_t *model, float scale)
{
    model->loss_scale = scale;
}

void tr_model_batch_shape(const tr_model_t *model, int *B, int *T)
{
    *B = model->B;
    *T = model->T;
}

tr_layer_t *tr_model_layer(const tr_model_t *model, int i)
{
    return i >= 0 && i < model->n ? model->layers[i] : NULL;
}

const float *tr_model_output(const tr_model_t *model, int layer)
{
    if (layer < 0 || layer >= model->n || !model->acts) return NULL;
    return model->acts + model->act_off[layer];
}

const tr_gpt2_config_t *tr_model_gpt2_config(const tr_model_t *model)
{
    return model->is_gpt2 ? &model->gpt2 : NULL;
}

void tr__model_set_gpt2(tr_model_t *model, const tr_gpt2_config_t *config)
{
    model->is_gpt2 = 1;
    model->gpt2 = *config;
}
