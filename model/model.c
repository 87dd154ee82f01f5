/* model.c: the generic model, a list of layers over three contiguous buffers.
 *
 * Parameters and gradients: one buffer each, carved layer after layer by the layers' size
 * tables (layer i owns [param_offset, param_offset + param_count)). Activations: one buffer
 * for a given (B, T), each layer's region starting with its output. Backward hands gradients
 * between layers through two ping-pong buffers (layer i reads dbuf[i % 2] and writes its
 * input's gradient into dbuf[(i + 1) % 2]), sized for the widest layer boundary, and shares
 * one scratch buffer sized for the hungriest layer. The batch is copied in at layer 0's
 * forward (tokens or x, and the targets the loss layer reads: integer or float y), after it
 * has been checked against the layers. Not thread-safe: one caller per model.
 */
#include "troupe/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/blas_internal.h"
#include "kernels/cpu/half.h"
#include "model/model_internal.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/parallel.h"
#include "troupe/error.h"
#include "base/errf.h"
#include "base/vmem.h"

struct tr_model {
    tr_layer_t **layers;
    int n;
    tr_device_t device;
    float *params, *grads; // (n_params) each, tr__vmem: pages are committed as written
    size_t n_params;
    uint16_t *params_bf16; // (n_params) bf16 copies, in bf16 mixed precision; else NULL
    // for the current (B, T)
    int B, T;
    float *acts; // (n_acts)
    size_t n_acts;
    size_t *act_off; // (n + 1) each layer's region (checkpointed: within its group's work area)
    int ckpt;        // activation checkpointing: layers per group (0: none)
    size_t *bnd_off; // checkpointed: group j's output (its last layer's), kept for the backward
    size_t work;     // checkpointed: where the work area starts in acts
    float *scratch;  // (n_scratch)
    size_t n_scratch;
    float *dbuf[2]; // (n_dbuf) each: gradients at layer boundaries
    size_t n_dbuf;
    int *tokens, *targets; // (B, T) copies of the batch
    float *x;              // (B, T, in_dim of layer 0) copy
    float *y;              // (B, T, y_dim of the loss layer) copy, when it reads float targets
    int has_targets;       // the batch had the targets the loss layer reads
    int training;
    float loss, loss_scale;
    int is_gpt2;
    tr_gpt2_config_t gpt2;
    char why[256]; // why the last failing call failed
};

/* ---- small helpers ----------------------------------------------------------------------- */

void tr__fill(float *x, size_t n, float value)
{
    for (size_t i = 0; i < n; i++)
        x[i] = value;
}

/* Records why a model call fails; returns err, for `return fail(...)`. */
__attribute__((format(printf, 3, 4))) static int fail(tr_model_t *m, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->why, sizeof(m->why), fmt, ap);
    va_end(ap);
    return err;
}

/* ---- layers ------------------------------------------------------------------------------ */

int tr__layer_check_targets(const tr_layer_t *loss, const int *targets, int B, int T, char *why,
                            size_t whylen)
{
    size_t N = (size_t)B * (size_t)T;
    for (size_t i = 0; loss->classes && i < N; i++)
        if (targets[i] != loss->ignore_index && (targets[i] < 0 || targets[i] >= loss->classes))
            return tr__errf(why, whylen, TR_EINVAL,
                            "batch: target %d at batch index %zu, position %zu is not a class of "
                            "the %d (expected 0 to %d, or %d to ignore the position; loss layer "
                            "'%s')",
                            targets[i], i / (size_t)T, i % (size_t)T, loss->classes,
                            loss->classes - 1, loss->ignore_index, loss->name);
    return 0;
}

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
    if (!layer || !name || !shape || ndim < 1 || ndim > TR_PARAM_MAX_DIMS ||
        strlen(name) >= TR_LAYER_NAME_MAX)
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
    p->no_decay = ndim < 2; // matrices decay, biases and norm weights do not (GPT-2's recipe)
    layer->param_count += p->numel;
    layer->n_params++;
    return 0;
}

int tr_layer_set_param_no_decay(tr_layer_t *layer, const char *name, int no_decay)
{
    if (!layer || !name) return TR_EINVAL;
    for (int i = 0; i < layer->n_params; i++)
        if (strcmp(layer->params[i].name, name) == 0) {
            layer->params[i].no_decay = no_decay != 0;
            return 0;
        }
    return TR_EINVAL;
}

int tr_layer_set_loss(tr_layer_t *layer, int targets, int y_dim)
{
    if (!layer) return TR_EINVAL;
    if (targets == TR_TARGETS_INT ? y_dim != 0 : targets != TR_TARGETS_FLOAT || y_dim < 1)
        return TR_EINVAL;
    layer->is_loss = 1;
    layer->targets = targets;
    layer->y_dim = y_dim;
    return 0;
}

int tr_layer_tie_param(tr_layer_t *layer, int owner, const char *param)
{
    if (!layer || !param || !*param || strlen(param) >= TR_LAYER_NAME_MAX || owner < 0)
        return TR_EINVAL;
    layer->tie_layer = owner;
    strcpy(layer->tie_param, param);
    return 0;
}

/* Each declared tie's range in the model's buffers. */
static int resolve_ties(tr_layer_t **layers, int n, char *why, size_t why_len)
{
    for (int i = 0; i < n; i++) {
        tr_layer_t *l = layers[i];
        if (!l->tie_param[0]) continue;
        const tr_param_info_t *p = l->tie_layer < n && l->tie_layer != i
                                       ? tr_layer_find_param(layers[l->tie_layer], l->tie_param)
                                       : NULL;
        if (!p)
            return tr__errf(why, why_len, TR_EINVAL,
                            "layer %d (%s): tied to parameter '%s' of "
                            "layer %d, which the model does not have",
                            i, l->name, l->tie_param, l->tie_layer);
        l->tie_offset = layers[l->tie_layer]->param_offset + p->offset;
        l->tie_count = p->numel;
    }
    return 0;
}

const tr_param_info_t *tr_layer_find_param(const tr_layer_t *layer, const char *name)
{
    for (int i = 0; i < layer->n_params; i++)
        if (strcmp(layer->params[i].name, name) == 0) return &layer->params[i];
    return NULL;
}

float tr__model_loss_scale(const tr_model_t *model)
{
    return model->loss_scale;
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
    if (n < 1) return tr__errf(why, why_len, TR_EINVAL, "a model needs at least one layer");
    for (int i = 0; i < n; i++) {
        tr_layer_t *l = layers[i];
        if (!l || !l->ops || !l->ops->forward || !l->ops->backward || !l->ops->act_size)
            return tr__errf(why, why_len, TR_EINVAL, "layer %d: missing ops", i);
        if (l->is_loss && i != n - 1)
            return tr__errf(why, why_len, TR_EINVAL, "layer %d (%s): a loss layer must be last", i,
                            l->name);
        if (l->is_loss != (l->targets == TR_TARGETS_INT || l->targets == TR_TARGETS_FLOAT))
            return tr__errf(why, why_len, TR_EINVAL,
                            "layer %d (%s): is_loss %d with targets %d: mark a loss layer with "
                            "tr_layer_set_loss (TR_TARGETS_INT or TR_TARGETS_FLOAT)",
                            i, l->name, l->is_loss, l->targets);
        if (i > 0 && l->in_dim != layers[i - 1]->out_dim)
            return tr__errf(why, why_len, TR_EINVAL,
                            "layer %d (%s) reads %d floats per position, layer %d (%s) writes %d",
                            i, l->name, l->in_dim, i - 1, layers[i - 1]->name,
                            layers[i - 1]->out_dim);
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
    m->training = 1;
    for (int i = 0; i < n && m->layers; i++) {
        m->layers[i] = layers[i];
        layers[i]->param_offset = m->n_params;
        m->n_params += layers[i]->param_count;
    }
    if (m->layers && (err = resolve_ties(m->layers, n, why, why_len)) < 0) {
        tr_model_destroy(m);
        return err;
    }
    m->params = tr__vmem_alloc(m->n_params * sizeof(float));
    m->grads = tr__vmem_alloc(m->n_params * sizeof(float));
    if (!m->layers || !m->params || !m->grads) {
        if (!m->layers) {
            free_layers(layers, n);
            m->n = 0;
        }
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
    free(m->bnd_off);
    m->bnd_off = NULL;
    free(m->scratch);
    free(m->dbuf[0]);
    free(m->dbuf[1]);
    free(m->tokens);
    free(m->targets);
    free(m->x);
    free(m->y);
    m->acts = m->scratch = m->dbuf[0] = m->dbuf[1] = m->x = m->y = NULL;
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
    tr__vmem_free(model->params, model->n_params * sizeof(float));
    tr__vmem_free(model->grads, model->n_params * sizeof(float));
    tr__vmem_free(model->params_bf16, model->n_params * sizeof(uint16_t));
    free(model);
}

/* ---- activations for (B, T) -------------------------------------------------------------- */

/* Where each layer's activations go, as offsets into acts: one region after another; or,
 * checkpointed every k layers, the outputs of every group but the last (kept for the
 * backward) and then one work area where each group's layers take their regions in turn (a
 * group is recomputed there before its backward). Returns the floats; act_off, bnd_off and
 * work may be NULL to count only (tr_model_acts_floats). */
static size_t layout(const tr_model_t *m, int B, int T, size_t *act_off, size_t *bnd_off,
                     size_t *work)
{
    size_t N = (size_t)B * T, total = 0, most = 0;
    int k = m->ckpt, G = k ? (m->n - 1) / k : 0; /* group G, the last, is not kept */
    for (int j = 0; j < G; j++) {
        if (bnd_off) bnd_off[j] = total;
        total += N * (size_t)m->layers[(j + 1) * k - 1]->out_dim;
    }
    if (work) *work = total;
    size_t g = 0; /* the offset within the group's work area */
    for (int i = 0; i < m->n; i++) {
        if (k && i % k == 0) g = 0;
        if (act_off) act_off[i] = k ? g : total;
        size_t a = m->layers[i]->ops->act_size(m->layers[i], B, T);
        if (k) {
            g += a;
            most = g > most ? g : most;
        } else {
            total += a;
        }
    }
    if (act_off) act_off[m->n] = k ? most : total;
    return k ? total + most : total;
}

void tr__model_pass_floats(const tr_model_t *m, int first, int last, int B, int T, size_t *scratch,
                           size_t *dbuf)
{
    size_t N = (size_t)B * T;
    *scratch = 1;
    *dbuf = 1;
    for (int i = first; i <= last; i++) {
        tr_layer_t *l = m->layers[i];
        size_t s = l->ops->scratch_size ? l->ops->scratch_size(l, B, T) : 0;
        *scratch = s > *scratch ? s : *scratch;
        size_t d = N * (size_t)(l->in_dim > l->out_dim ? l->in_dim : l->out_dim);
        *dbuf = d > *dbuf ? d : *dbuf;
    }
}

static int reserve(tr_model_t *m, int B, int T)
{
    if (m->B == B && m->T == T) return 0;
    free_acts(m);
    size_t N = (size_t)B * T, n_scratch, n_dbuf;
    int groups = m->ckpt ? (m->n - 1) / m->ckpt : 0;
    m->act_off = malloc((size_t)(m->n + 1) * sizeof(size_t));
    m->bnd_off = malloc((size_t)(groups + 1) * sizeof(size_t));
    if (!m->act_off || !m->bnd_off) {
        free_acts(m);
        return TR_ENOMEM;
    }
    size_t n_acts = layout(m, B, T, m->act_off, m->bnd_off, &m->work);
    tr__model_pass_floats(m, 0, m->n - 1, B, T, &n_scratch, &n_dbuf);
    m->acts = malloc((n_acts ? n_acts : 1) * sizeof(float));
    m->scratch = malloc(n_scratch * sizeof(float));
    m->dbuf[0] = malloc(n_dbuf * sizeof(float));
    m->dbuf[1] = malloc(n_dbuf * sizeof(float));
    m->tokens = malloc(N * sizeof(int));
    m->targets = malloc(N * sizeof(int));
    m->x = malloc(N * (size_t)(m->layers[0]->in_dim ? m->layers[0]->in_dim : 1) * sizeof(float));
    int y_dim = m->layers[m->n - 1]->y_dim;
    m->y = malloc(N * (size_t)(y_dim ? y_dim : 1) * sizeof(float));
    if (!m->acts || !m->scratch || !m->dbuf[0] || !m->dbuf[1] || !m->tokens || !m->targets ||
        !m->x || !m->y) {
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

/* Layer i's activation region, its input, and its output as it stays readable. */
static float *acts_of(const tr_model_t *m, int i)
{
    return m->acts + (m->ckpt ? m->work : 0) + m->act_off[i];
}

/* A kept group output: layer i ends a group other than the last (checkpointed). */
static int kept(const tr_model_t *m, int i)
{
    return m->ckpt && i % m->ckpt == m->ckpt - 1 && i / m->ckpt < (m->n - 1) / m->ckpt;
}

static const float *input_of(const tr_model_t *m, int i)
{
    if (i == 0) return m->x;
    if (m->ckpt && i % m->ckpt == 0) return m->acts + m->bnd_off[i / m->ckpt - 1];
    return acts_of(m, i - 1);
}

static const float *output_of(const tr_model_t *m, int i)
{
    return kept(m, i) ? m->acts + m->bnd_off[i / m->ckpt] : acts_of(m, i);
}

size_t tr_model_acts_floats(const tr_model_t *m, int B, int T)
{
    return layout(m, B, T, NULL, NULL, NULL);
}

int tr_model_set_checkpoint_interval(tr_model_t *model, int layers)
{
    if (layers < 0) return TR_EINVAL;
    model->ckpt = layers >= model->n ? 0 : layers; /* one group: nothing to recompute */
    free_acts(model); /* the next forward lays the activations out again */
    return 0;
}

int tr_model_checkpoint_interval(const tr_model_t *model)
{
    return model->ckpt;
}

size_t tr_model_checkpoint_recomputed(const tr_model_t *model)
{
    return model->ckpt ? (size_t)((model->n - 1) / model->ckpt * model->ckpt) : 0;
}

/* The batch's targets against what the loss layer reads: the other kind is refused, not
 * ignored. A model without a loss layer reads none and ignores them. */
static int check_targets(tr_model_t *m, const tr_batch_t *b)
{
    const tr_layer_t *loss = m->layers[m->n - 1];
    if (b->y && b->y_dim < 1)
        return fail(m, TR_EINVAL, "batch: y (float targets) given with y_dim %d, need >= 1",
                    b->y_dim);
    if (!loss->is_loss) return 0;
    if (loss->targets == TR_TARGETS_INT && b->y)
        return fail(m, TR_EINVAL,
                    "batch: loss layer '%s' reads integer targets (batch.targets); the batch "
                    "gives float targets (batch.y, y_dim %d)",
                    loss->name, b->y_dim);
    if (loss->targets == TR_TARGETS_FLOAT && b->targets)
        return fail(m, TR_EINVAL,
                    "batch: loss layer '%s' reads float targets (batch.y, y_dim %d); the batch "
                    "gives integer targets (batch.targets)",
                    loss->name, loss->y_dim);
    if (loss->targets == TR_TARGETS_INT && b->targets &&
        tr__layer_check_targets(loss, b->targets, b->B, b->T, m->why, sizeof(m->why)) < 0)
        return TR_EINVAL;
    if (loss->targets == TR_TARGETS_FLOAT && b->y && b->y_dim != loss->y_dim)
        return fail(m, TR_EINVAL,
                    "batch: y_dim %d, but loss layer '%s' reads %d floats per position", b->y_dim,
                    loss->name, loss->y_dim);
    return 0;
}

static int check_batch(tr_model_t *m, const tr_batch_t *b)
{
    tr_layer_t *first = m->layers[0];
    if (!b) return fail(m, TR_EINVAL, "batch: NULL");
    if (b->B < 1 || b->T < 1)
        return fail(m, TR_EINVAL, "batch: B %d, T %d, need both >= 1", b->B, b->T);
    if (m->is_gpt2 && b->T > m->gpt2.max_seq_len)
        return fail(m, TR_EINVAL, "batch: T %d is longer than the model's context (max_seq_len %d)",
                    b->T, m->gpt2.max_seq_len);
    if (first->in_dim == 0 && !b->tokens)
        return fail(m, TR_EINVAL, "batch: layer 0 '%s' reads token ids, batch.tokens is NULL",
                    first->name);
    if (first->in_dim > 0 && !b->x)
        return fail(m, TR_EINVAL,
                    "batch: layer 0 '%s' reads %d floats per position, batch.x is NULL",
                    first->name, first->in_dim);
    return check_targets(m, b);
}

/* Copies the batch in (the model keeps it for backward). */
static int take_batch(tr_model_t *m, const tr_batch_t *b)
{
    tr_layer_t *first = m->layers[0], *loss = m->layers[m->n - 1];
    int err = check_batch(m, b);
    if (err) return err;
    err = reserve(m, b->B, b->T);
    if (err) return fail(m, err, "batch: no memory for the activations of B %d, T %d", b->B, b->T);
    size_t N = (size_t)b->B * b->T;
    if (b->tokens) memcpy(m->tokens, b->tokens, N * sizeof(int));
    if (b->x) memcpy(m->x, b->x, N * (size_t)first->in_dim * sizeof(float));
    if (loss->targets == TR_TARGETS_FLOAT) {
        m->has_targets = b->y != NULL;
        if (b->y) memcpy(m->y, b->y, N * (size_t)loss->y_dim * sizeof(float));
    } else {
        m->has_targets = b->targets != NULL;
        if (b->targets) memcpy(m->targets, b->targets, N * sizeof(int));
    }
    return 0;
}

/* ---- forward / backward ------------------------------------------------------------------ */

static tr_layer_ctx_t context(tr_model_t *m, int i)
{
    tr_layer_t *l = m->layers[i];
    int float_y = m->layers[m->n - 1]->targets == TR_TARGETS_FLOAT; // what the batch gave
    tr_layer_ctx_t c = {
        .B = m->B,
        .T = m->T,
        .tokens = m->tokens,
        .targets = m->has_targets && !float_y ? m->targets : NULL,
        .y = m->has_targets && float_y ? m->y : NULL,
        .y_dim = m->has_targets && float_y ? m->layers[m->n - 1]->y_dim : 0,
        .training = m->training,
        .in = input_of(m, i),
        .acts = acts_of(m, i),
        .out = acts_of(m, i),
        .params = m->params + l->param_offset,
        .grads = m->grads + l->param_offset,
        .model_params = m->params,
        .model_grads = m->grads,
        .scratch = m->scratch,
        .loss_scale = m->loss_scale,
    };
    const uint16_t *bf16 = tr__model_params_bf16(m);
    if (bf16) {
        c.params_bf16 = bf16 + l->param_offset;
        c.model_params_bf16 = bf16;
    }
    return c;
}

/* Layer i's forward on the batch taken; a group's last layer (checkpointed) keeps its output
 * for the backward. */
static int run_forward(tr_model_t *m, int i)
{
    tr_layer_t *l = m->layers[i];
    tr_layer_ctx_t c = context(m, i);
    int err = l->ops->forward(l, &c);
    if (err)
        return fail(m, err, "layer %d '%s': forward returned %s (%s)", i, l->name, tr_err_name(err),
                    tr_strerror(err));
    if (l->is_loss) m->loss = c.loss;
    if (kept(m, i))
        memcpy(m->acts + m->bnd_off[i / m->ckpt], c.out,
               (size_t)m->B * m->T * (size_t)l->out_dim * sizeof(float));
    return 0;
}

int tr_model_layer_forward(tr_model_t *model, int layer, const tr_batch_t *batch)
{
    if (layer < 0 || layer >= model->n)
        return fail(model, TR_EINVAL, "forward: layer %d of a model of %d layers", layer, model->n);
    if (layer == 0) {
        int err = take_batch(model, batch);
        if (err) return err;
    } else if (!model->acts) {
        return fail(model, TR_EINVAL, "forward: layer %d before layer 0 took a batch", layer);
    }
    return run_forward(model, layer);
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
    tr_layer_t *last = model->layers[model->n - 1];
    if (layer < 0 || layer >= model->n)
        return fail(model, TR_EINVAL, "backward: layer %d of a model of %d layers", layer,
                    model->n);
    if (!last->is_loss)
        return fail(model, TR_EINVAL, "backward: the last layer '%s' is not a loss layer",
                    last->name);
    if (!model->acts || !model->has_targets)
        return fail(model, TR_EINVAL, "backward: needs a forward on a batch with %s first",
                    last->targets == TR_TARGETS_FLOAT ? "float targets (batch.y)"
                                                      : "targets (batch.targets)");
    if (kept(model, layer)) /* checkpointed: the group's forward again, from its kept input */
        for (int i = layer / model->ckpt * model->ckpt; i <= layer; i++) {
            int err = run_forward(model, i);
            if (err) return err;
        }
    tr_layer_t *l = model->layers[layer];
    tr_layer_ctx_t c = context(model, layer);
    c.dout = l->is_loss ? NULL : model->dbuf[layer % 2];
    if (layer > 0) {
        c.din = model->dbuf[(layer + 1) % 2];
        tr__zero(c.din, (size_t)model->B * model->T * l->in_dim);
    }
    int err = l->ops->backward(l, &c);
    return err ? fail(model, err, "layer %d '%s': backward returned %s (%s)", layer, l->name,
                      tr_err_name(err), tr_strerror(err))
               : 0;
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
    tr_model_init_params_each(model, seed, NULL, NULL);
    tr_model_params_changed(model);
}

void tr_model_init_params_each(tr_model_t *model, uint64_t seed, void (*done)(void *arg, int layer),
                               void *arg)
{
    uint64_t rng = seed;
    for (int i = 0; i < model->n; i++) {
        tr_layer_t *l = model->layers[i];
        if (l->ops->init) l->ops->init(l, model->params + l->param_offset, &rng);
        if (done) done(arg, i);
    }
}

void tr_model_params_changed_range(tr_model_t *model, size_t offset, size_t count)
{
    if (model->params_bf16 && offset <= model->n_params && count <= model->n_params - offset)
        tr_half_from_float_array(model->params_bf16 + offset, model->params + offset, count,
                                 TR_HALF_BF16);
}

int tr_model_init_params_layers(tr_model_t *model, uint64_t seed, const unsigned char *keep)
{
    int end = 0; /* one past the last kept layer: the layers after it do not run */
    size_t scratch_n = 0;
    for (int i = 0; i < model->n; i++)
        if (keep[i]) end = i + 1;
    for (int i = 0; i < end; i++)
        if (!keep[i] && model->layers[i]->param_count > scratch_n)
            scratch_n = model->layers[i]->param_count;
    float *scratch = scratch_n ? malloc(scratch_n * sizeof(float)) : NULL;
    if (scratch_n && !scratch) return TR_ENOMEM;
    uint64_t rng = seed; /* advanced by every layer before the last kept, as the whole init */
    for (int i = 0; i < end; i++) {
        tr_layer_t *l = model->layers[i];
        if (l->ops->init)
            l->ops->init(l, keep[i] ? model->params + l->param_offset : scratch, &rng);
    }
    free(scratch);
    tr_model_params_changed(model);
    return 0;
}

int tr_model_targets(const tr_model_t *model, int *y_dim)
{
    const tr_layer_t *last = model->layers[model->n - 1];
    if (y_dim) *y_dim = last->is_loss ? last->y_dim : 0;
    return last->is_loss ? last->targets : TR_TARGETS_NONE;
}

int tr_model_set_bf16(tr_model_t *model, int on)
{
    if (!on) {
        tr__vmem_free(model->params_bf16, model->n_params * sizeof(uint16_t));
        model->params_bf16 = NULL;
        return 0;
    }
    if (!model->params_bf16) { /* like the fp32 buffers: ZeRO 3 keeps only what it gathered */
        model->params_bf16 = tr__vmem_alloc(model->n_params * sizeof(uint16_t));
        if (!model->params_bf16) return TR_ENOMEM;
    }
    tr_model_params_changed(model);
    return 0;
}

int tr_model_bf16(const tr_model_t *model)
{
    return model->params_bf16 != NULL;
}

void tr_model_params_changed(tr_model_t *model)
{
    if (model->params_bf16)
        tr_half_from_float_array(model->params_bf16, model->params, model->n_params, TR_HALF_BF16);
}

const uint16_t *tr__model_params_bf16(const tr_model_t *model)
{
    return model->params_bf16;
}

void tr_model_set_training(tr_model_t *model, int training)
{
    model->training = training != 0;
}

int tr_model_training(const tr_model_t *model)
{
    return model->training;
}

const char *tr_model_error(const tr_model_t *model)
{
    return model->why;
}

float tr_model_loss(const tr_model_t *model)
{
    return model->loss;
}

void tr_model_zero_grad(tr_model_t *model)
{
    tr__zero(model->grads, model->n_params);
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
    return output_of(model, layer);
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
