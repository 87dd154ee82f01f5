/* stage.c: a model cut into pipeline stages (troupe/model.h, "stages").
 *
 * A stage owns what one stage's thread writes: per slot, its layers' activations, its input
 * (the previous stage's output, or the batch's tokens or floats) and the batch's targets; one
 * scratch area and the two gradient buffers at layer boundaries (one backward at a time per
 * stage); and, when one of its layers uses a tensor tied to a layer outside the stage, a
 * gradient buffer of the model's size for that tensor's accumulation (added into the owner's
 * range at tr_model_stage_reduce_tied). Layers are called exactly as the model calls them
 * (model/model.c), so a stage's numbers are the model's.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "base/errf.h"
#include "troupe/error.h"

typedef struct slot {
    float *acts;  /* the stage's layers' regions, back to back; checkpointed: each group's
                   * output (the last is the stage's) */
    float *in;    /* the input: the previous stage's output, or the batch's x */
    float *stash; /* split backwards (zb): each splitting layer's stash, at stash_off */
    int *tokens, *targets;
    float *y;
    int has_targets;
} slot_t;

struct tr_model_stage {
    tr_model_t *m;
    int first, last, n_slots, B, T;
    size_t *off;  /* each layer's region within a slot's acts (last - first + 2);
                   * checkpointed: within its group's work area */
    int k;        /* activation checkpointing: layers per group from `first` (0: none) */
    size_t *keep; /* checkpointed: group g's output at keep[g] in a slot's acts */
    size_t slot_floats, work_floats;
    float *work; /* checkpointed: one group's activations at a time */
    slot_t *slots;
    float *scratch, *dbuf[2];
    float *tied;       /* model-sized gradients of tied tensors owned outside (NULL: none) */
    size_t *stash_off; /* each layer's stash within a slot's (NULL: no layer splits its
                        * backward, or checkpointed: the weights' part would need activations
                        * a recompute overwrites) */
    char why[256];
};

static tr_layer_t *layer(const tr_model_stage_t *s, int i)
{
    return tr_model_layer(s->m, i);
}

/* Checkpointed: the groups' outputs per slot, each group's layers in one shared work area.
 * Returns a slot's floats (0: no memory). */
static size_t checkpointed_layout(tr_model_stage_t *s)
{
    int n = s->last - s->first + 1, k = s->k, ng = (n + k - 1) / k;
    size_t N = (size_t)s->B * s->T, kept = 0, g = 0, most = 0;
    if (!(s->keep = calloc((size_t)ng + 1, sizeof(size_t)))) return 0;
    for (int j = 0; j < n; j++) {
        tr_layer_t *l = layer(s, s->first + j);
        if (j % k == 0) g = 0;
        s->off[j] = g;
        g += l->ops->act_size(l, s->B, s->T);
        most = g > most ? g : most;
        if (j % k == k - 1 || j == n - 1) {
            s->keep[j / k] = kept;
            kept += N * (size_t)l->out_dim;
        }
    }
    s->work = malloc((most ? most : 1) * sizeof(float));
    s->work_floats = most;
    return s->work ? (kept ? kept : 1) : 0;
}

static bool splits(const tr_layer_t *l)
{
    return l->ops->stash_size && l->ops->backward_input && l->ops->backward_weight;
}

static int ties_out(const tr_model_stage_t *s)
{
    for (int i = s->first; i <= s->last; i++) {
        const tr_layer_t *l = layer(s, i);
        if (l->tie_count && (l->tie_layer < s->first || l->tie_layer > s->last)) return 1;
    }
    return 0;
}

/* The slot buffers and the shared ones; sizes as the model's reserve() computes them. */
static int alloc_buffers(tr_model_stage_t *s)
{
    size_t N = (size_t)s->B * s->T, acts = 0, scratch, dbuf;
    int n = s->last - s->first + 1;
    if (!(s->off = calloc((size_t)n + 1, sizeof(size_t)))) return TR_ENOMEM;
    for (int k = 0; k < n; k++) {
        tr_layer_t *l = layer(s, s->first + k);
        s->off[k] = acts;
        acts += l->ops->act_size(l, s->B, s->T);
    }
    s->off[n] = acts;
    size_t stash = 0;
    if (!s->k && !(s->stash_off = calloc((size_t)n, sizeof(size_t)))) return TR_ENOMEM;
    for (int k = 0; s->stash_off && k < n; k++) {
        tr_layer_t *l = layer(s, s->first + k);
        s->stash_off[k] = stash;
        if (splits(l)) stash += l->ops->stash_size(l, s->B, s->T);
    }
    if (!stash) {
        free(s->stash_off);
        s->stash_off = NULL;
    }
    tr__model_pass_floats(s->m, s->first, s->last, s->B, s->T, &scratch, &dbuf);
    if (s->k && (acts = checkpointed_layout(s)) == 0) return TR_ENOMEM;
    tr_layer_t *first = layer(s, s->first), *last = layer(s, s->last);
    size_t in = N * (size_t)(first->in_dim ? first->in_dim : 1);
    size_t y = N * (size_t)(last->y_dim ? last->y_dim : 1);
    s->slot_floats = acts;
    s->slots = calloc((size_t)s->n_slots, sizeof(slot_t));
    if (!s->slots) return TR_ENOMEM;
    for (int k = 0; k < s->n_slots; k++) {
        slot_t *t = &s->slots[k];
        t->acts = malloc((acts ? acts : 1) * sizeof(float));
        t->in = malloc(in * sizeof(float));
        t->tokens = malloc(N * sizeof(int));
        t->targets = malloc(N * sizeof(int));
        t->y = malloc(y * sizeof(float));
        if (stash && !(t->stash = malloc(stash * sizeof(float)))) return TR_ENOMEM;
        if (!t->acts || !t->in || !t->tokens || !t->targets || !t->y) return TR_ENOMEM;
    }
    s->scratch = malloc(scratch * sizeof(float));
    s->dbuf[0] = malloc(dbuf * sizeof(float));
    s->dbuf[1] = malloc(dbuf * sizeof(float));
    if (ties_out(s) && !(s->tied = calloc(tr_model_num_params(s->m) + 1, sizeof(float))))
        return TR_ENOMEM;
    return s->scratch && s->dbuf[0] && s->dbuf[1] ? 0 : TR_ENOMEM;
}

int tr_model_stage_create(tr_model_stage_t **out, tr_model_t *model, int first, int last, int slots,
                          int B, int T, char *why, size_t why_len)
{
    *out = NULL;
    int n = model ? tr_model_num_layers(model) : 0;
    if (!model || first < 0 || last < first || last >= n)
        return tr__errf(why, why_len, TR_EINVAL, "stage: layers [%d, %d] of a model of %d layers",
                        first, last, n);
    if (slots < 1 || B < 1 || T < 1)
        return tr__errf(why, why_len, TR_EINVAL,
                        "stage: %d slots for B %d, T %d; each needs "
                        ">= 1",
                        slots, B, T);
    tr_model_stage_t *s = calloc(1, sizeof(*s));
    if (!s) return tr__errf(why, why_len, TR_ENOMEM, "stage: out of memory");
    *s = (tr_model_stage_t){.m = model,
                            .first = first,
                            .last = last,
                            .n_slots = slots,
                            .B = B,
                            .T = T,
                            .k = tr_model_checkpoint_interval(model)};
    if (s->k >= last - first + 1) s->k = 0; /* one group: nothing to keep apart */
    if (alloc_buffers(s) < 0) {
        tr_model_stage_destroy(s);
        return tr__errf(why, why_len, TR_ENOMEM,
                        "stage: no memory for %d slots of layers [%d, "
                        "%d] at B %d, T %d",
                        slots, first, last, B, T);
    }
    *out = s;
    return 0;
}

void tr_model_stage_destroy(tr_model_stage_t *s)
{
    if (!s) return;
    for (int k = 0; s->slots && k < s->n_slots; k++) {
        slot_t *t = &s->slots[k];
        free(t->acts);
        free(t->in);
        free(t->tokens);
        free(t->targets);
        free(t->y);
        free(t->stash);
    }
    free(s->slots);
    free(s->off);
    free(s->scratch);
    free(s->dbuf[0]);
    free(s->dbuf[1]);
    free(s->tied);
    free(s->stash_off);
    free(s->keep);
    free(s->work);
    free(s);
}

size_t tr_model_stage_input_floats(const tr_model_stage_t *s)
{
    return s->first == 0 ? 0 : (size_t)s->B * s->T * (size_t)layer(s, s->first)->in_dim;
}

size_t tr_model_stage_output_floats(const tr_model_stage_t *s)
{
    return (size_t)s->B * s->T * (size_t)layer(s, s->last)->out_dim;
}

size_t tr_model_stage_activation_floats(const tr_model_stage_t *s)
{
    return s->slot_floats * (size_t)s->n_slots + s->work_floats;
}

const char *tr_model_stage_error(const tr_model_stage_t *s)
{
    return s->why;
}

static int fail(tr_model_stage_t *s, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(tr_model_stage_t *s, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->why, sizeof(s->why), fmt, ap);
    va_end(ap);
    return rc;
}

/* The context for layer i on slot t (as the model's context() builds it). */
/* Layer first + j's region on slot t, its input, and (checkpointed) whether it ends a group. */
static float *stage_acts(const tr_model_stage_t *s, const slot_t *t, int j)
{
    return (s->k ? s->work : t->acts) + s->off[j];
}

static int ends_group(const tr_model_stage_t *s, int j)
{
    return s->k && (j % s->k == s->k - 1 || s->first + j == s->last);
}

static const float *stage_in(const tr_model_stage_t *s, const slot_t *t, int i)
{
    int j = i - s->first;
    if (j == 0) return t->in;
    if (s->k && j % s->k == 0) return t->acts + s->keep[j / s->k - 1];
    return stage_acts(s, t, j - 1);
}

static tr_layer_ctx_t context(tr_model_stage_t *s, slot_t *t, int i)
{
    tr_layer_t *l = layer(s, i), *last = tr_model_layer(s->m, tr_model_num_layers(s->m) - 1);
    int k = i - s->first, float_y = last->targets == TR_TARGETS_FLOAT;
    float *params = tr_model_params(s->m), *grads = tr_model_grads(s->m);
    const uint16_t *bf16 = tr__model_params_bf16(s->m);
    return (tr_layer_ctx_t){
        .B = s->B,
        .T = s->T,
        .tokens = t->tokens,
        .targets = t->has_targets && !float_y ? t->targets : NULL,
        .y = t->has_targets && float_y ? t->y : NULL,
        .y_dim = t->has_targets && float_y ? last->y_dim : 0,
        .training = tr_model_training(s->m),
        .in = stage_in(s, t, i),
        .acts = stage_acts(s, t, k),
        .out = stage_acts(s, t, k),
        .params = params + l->param_offset,
        .grads = grads + l->param_offset,
        .model_params = params,
        .model_grads =
            s->tied && l->tie_count && (l->tie_layer < s->first || l->tie_layer > s->last)
                ? s->tied
                : grads, /* a tie owned outside the stage accumulates apart */
        .scratch = s->scratch,
        .loss_scale = tr__model_loss_scale(s->m),
        .params_bf16 = bf16 ? bf16 + l->param_offset : NULL,
        .model_params_bf16 = bf16,
    };
}

/* The batch's part this stage reads: tokens or x (first stage), targets (the loss's). */
static int take(tr_model_stage_t *s, slot_t *t, const tr_batch_t *b, const float *in)
{
    size_t N = (size_t)s->B * s->T;
    tr_layer_t *first = layer(s, s->first), *last = layer(s, s->last);
    if (s->first > 0) {
        if (!in)
            return fail(s, TR_EINVAL, "stage [%d, %d]: no input activation", s->first, s->last);
        memcpy(t->in, in, tr_model_stage_input_floats(s) * sizeof(float));
        if (b && b->tokens) /* layers past the first may read them too, as in the model */
            memcpy(t->tokens, b->tokens, N * sizeof(int));
    } else if (!b || b->B != s->B || b->T != s->T || (first->in_dim ? !b->x : !b->tokens)) {
        return fail(s, TR_EINVAL, "stage [%d, %d]: the batch needs B %d, T %d and %s", s->first,
                    s->last, s->B, s->T, first->in_dim ? "x" : "tokens");
    } else if (first->in_dim) {
        memcpy(t->in, b->x, N * (size_t)first->in_dim * sizeof(float));
    } else {
        memcpy(t->tokens, b->tokens, N * sizeof(int));
    }
    t->has_targets = 0;
    if (!last->is_loss || !b) return 0;
    if (last->targets == TR_TARGETS_FLOAT && b->y) {
        memcpy(t->y, b->y, N * (size_t)last->y_dim * sizeof(float));
        t->has_targets = 1;
    }
    if (last->targets == TR_TARGETS_INT && b->targets) {
        if (tr__layer_check_targets(last, b->targets, s->B, s->T, s->why, sizeof(s->why)) < 0)
            return TR_EINVAL;
        memcpy(t->targets, b->targets, N * sizeof(int));
        t->has_targets = 1;
    }
    return 0;
}

/* Forward of layers [a, b] on slot t; keep: a group's output goes to the slot (checkpointed;
 * a recompute leaves it as it is). */
static int forward_layers(tr_model_stage_t *s, slot_t *t, int a, int b, bool keep, float *loss)
{
    size_t N = (size_t)s->B * s->T;
    for (int i = a; i <= b; i++) {
        tr_layer_t *l = layer(s, i);
        tr_layer_ctx_t c = context(s, t, i);
        int rc = l->ops->forward(l, &c);
        if (rc < 0)
            return fail(s, rc, "layer %d '%s': forward returned %s (%s)", i, l->name,
                        tr_err_name(rc), tr_strerror(rc));
        if (l->is_loss && loss) *loss = c.loss;
        int j = i - s->first;
        if (keep && ends_group(s, j))
            memcpy(t->acts + s->keep[j / s->k], c.out, N * (size_t)l->out_dim * sizeof(float));
    }
    return 0;
}

int tr_model_stage_forward(tr_model_stage_t *s, int slot, const tr_batch_t *batch, const float *in,
                           float *loss)
{
    if (slot < 0 || slot >= s->n_slots)
        return fail(s, TR_EINVAL, "stage [%d, %d]: slot %d of %d", s->first, s->last, slot,
                    s->n_slots);
    slot_t *t = &s->slots[slot];
    int rc = take(s, t, batch, in);
    return rc < 0 ? rc : forward_layers(s, t, s->first, s->last, true, loss);
}

const float *tr_model_stage_output(const tr_model_stage_t *s, int slot)
{
    if (slot < 0 || slot >= s->n_slots) return NULL;
    int j = s->last - s->first;
    return s->k ? s->slots[slot].acts + s->keep[j / s->k] : s->slots[slot].acts + s->off[j];
}

/* A backward of slot's micro-batch: whole (BACKWARD), or a split backward's input part (every
 * layer that does not split runs whole in it) or its weight part. */
enum { WHOLE, INPUT, WEIGHT };

static int backward(tr_model_stage_t *s, int slot, const float *dout, const float **din, int part)
{
    if (din) *din = NULL;
    if (slot < 0 || slot >= s->n_slots)
        return fail(s, TR_EINVAL, "stage [%d, %d]: slot %d of %d", s->first, s->last, slot,
                    s->n_slots);
    slot_t *t = &s->slots[slot];
    tr_layer_t *last = layer(s, s->last);
    if (part != WEIGHT && (last->is_loss ? !t->has_targets : !dout))
        return fail(s, TR_EINVAL, "stage [%d, %d]: backward needs %s", s->first, s->last,
                    last->is_loss ? "a forward with targets" : "the gradient of its output");
    size_t N = (size_t)s->B * s->T;
    for (int i = s->last; i >= s->first; i--) {
        tr_layer_t *l = layer(s, i);
        int j = i - s->first;
        bool split = s->stash_off && splits(l) && part != WHOLE;
        if (part == WEIGHT && !split) continue; /* it ran whole in the input part */
        if (ends_group(s, j)) { /* checkpointed: the group again, from its kept input */
            int rc = forward_layers(s, t, s->first + j / s->k * s->k, i, false, NULL);
            if (rc < 0) return rc;
        }
        tr_layer_ctx_t c = context(s, t, i);
        c.stash = split ? t->stash + s->stash_off[j] : NULL;
        int (*fn)(tr_layer_t *, tr_layer_ctx_t *) = part == WEIGHT ? l->ops->backward_weight
                                                    : split        ? l->ops->backward_input
                                                                   : l->ops->backward;
        if (part != WEIGHT) {
            c.dout = l->is_loss ? NULL : i == s->last ? dout : s->dbuf[i % 2];
            c.din = i > 0 ? s->dbuf[(i + 1) % 2] : NULL;
            if (c.din) memset(c.din, 0, N * (size_t)l->in_dim * sizeof(float));
        }
        int rc = fn(l, &c);
        if (rc < 0)
            return fail(s, rc, "layer %d '%s': backward%s returned %s (%s)", i, l->name,
                        part == WEIGHT ? "_weight"
                        : split        ? "_input"
                                       : "",
                        tr_err_name(rc), tr_strerror(rc));
        if (i == s->first && din) *din = c.din;
    }
    return 0;
}

int tr_model_stage_backward(tr_model_stage_t *s, int slot, const float *dout, const float **din)
{
    return backward(s, slot, dout, din, WHOLE);
}

int tr_model_stage_backward_input(tr_model_stage_t *s, int slot, const float *dout,
                                  const float **din)
{
    return backward(s, slot, dout, din, INPUT);
}

int tr_model_stage_backward_weight(tr_model_stage_t *s, int slot)
{
    return backward(s, slot, NULL, NULL, WEIGHT);
}

int tr_model_stage_splits(const tr_model_stage_t *s)
{
    return s->stash_off != NULL;
}

/* Only the tied ranges are ever written: the rest of the model-sized area stays untouched
 * (no memory behind it). */
void tr_model_stage_zero_tied(tr_model_stage_t *s)
{
    if (!s->tied) return;
    for (int i = s->first; i <= s->last; i++) {
        const tr_layer_t *l = layer(s, i);
        if (l->tie_count && (l->tie_layer < s->first || l->tie_layer > s->last))
            memset(s->tied + l->tie_offset, 0, l->tie_count * sizeof(float));
    }
}

float *tr_model_stage_tied(tr_model_stage_t *s)
{
    return s->tied;
}

void tr_model_stage_reduce_tied(tr_model_stage_t *s)
{
    if (!s->tied) return;
    float *grads = tr_model_grads(s->m);
    for (int i = s->first; i <= s->last; i++) {
        const tr_layer_t *l = layer(s, i);
        if (!l->tie_count || (l->tie_layer >= s->first && l->tie_layer <= s->last)) continue;
        for (size_t k = l->tie_offset; k < l->tie_offset + l->tie_count; k++) {
            grads[k] += s->tied[k];
            s->tied[k] = 0;
        }
    }
}
