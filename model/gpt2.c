/* gpt2.c: GPT-2 as a list of layers: embed, L transformer blocks, head.
 *
 * The math is llm.c's (train_gpt2.c): pre-LayerNorm blocks, GELU (tanh) MLP of width 4C,
 * causal attention, a final LayerNorm and logits over the padded vocabulary Vp with the
 * token embedding wte reused as the output projection (tied). Each block is one layer, so
 * its twelve tensors are one contiguous range, in llm.c's order within the block; model/llmc.c
 * maps llm.c's file order (each tensor for all L layers at once) onto these ranges.
 *
 * A block's activation region (N = B T; output first, then what backward needs):
 *   res3 (N, C) | ln1 (N, C) | ln1_mean, ln1_rstd (N) | qkv (N, 3C) | atty (N, C) |
 *   att (B, NH, T, T) | res2 (N, C) | ln2 (N, C) | ln2_mean, ln2_rstd (N) | fch (N, 4C) |
 *   fch_gelu (N, 4C)
 * The projections write straight into res2 / res3 and the residual is added in place, so
 * attproj and fcproj are never stored (backward does not need them).
 * The head's region: losses (N) | lnf (N, C) | lnf_mean, lnf_rstd (N) | probs (N, Vp).
 */
#include "troupe/model.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "kernels/cpu/ops.h"
#include "troupe/error.h"
#include "base/errf.h"

typedef struct {
    int C, NH, L;   // L for the init scale of the residual projections
    int V, Vp;      // head only
    size_t wte_off; // head only: where the tied wte starts in the model's buffer
    int count;      // head only: positions the last forward counted
} gpt2_state;

enum { LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB };

typedef struct {
    float *res3, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *res2, *ln2, *ln2_mean, *ln2_rstd,
        *fch, *fch_gelu;
} block_acts;

static void carve_block(block_acts *a, float *p, int B, int T, int C, int NH)
{
    size_t N = (size_t)B * T;
    float **slots[] = {&a->res3, &a->ln1, &a->ln1_mean, &a->ln1_rstd, &a->qkv, &a->atty,    &a->att,
                       &a->res2, &a->ln2, &a->ln2_mean, &a->ln2_rstd, &a->fch, &a->fch_gelu};
    size_t sizes[] = {N * C, N * C, N, N, N * 3 * C, N * C,    (size_t)B * NH * T * T,
                      N * C, N * C, N, N, N * 4 * C, N * 4 * C};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        *slots[i] = p;
        p += sizes[i];
    }
}

static size_t block_act_size(const tr_layer_t *l, int B, int T)
{
    const gpt2_state *s = l->state;
    return (size_t)B * T * (16 * (size_t)s->C + 4) + (size_t)B * s->NH * T * T;
}

/* The backward's stash, what its weight-gradient part reads (N C floats each, in this order):
 * dres3 (1) | dfch (4) | dres2 (1) | dqkv (3) | dln2 (1) | dln1 (1); kept per micro-batch
 * between a split backward's two parts (zb). */
#define STASH_NC 11

static size_t block_stash_size(const tr_layer_t *l, int B, int T)
{
    const gpt2_state *s = l->state;
    return (size_t)B * T * STASH_NC * s->C;
}

/* The input-gradient part's own temporaries: datty (N, C) | attention scratch (B, NH, T, T);
 * the whole backward also keeps the stash in its scratch. */
static size_t block_scratch_size(const tr_layer_t *l, int B, int T)
{
    const gpt2_state *s = l->state;
    return (size_t)B * T * (1 + STASH_NC) * s->C + (size_t)B * s->NH * T * T;
}

#define PARAM(c, l, i) ((c)->params + (l)->params[i].offset)
#define GRAD(c, l, i)  ((c)->grads + (l)->params[i].offset)
/* the weight's bf16 copy in bf16 mixed precision, else NULL (kernels/cpu/ops.h:
 * tr__linear_forward) */
#define PARAM_BF16(c, l, i) ((c)->params_bf16 ? (c)->params_bf16 + (l)->params[i].offset : NULL)

/* A list of kernel calls, as llm.c's gpt2_forward reads. */
static int block_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    const gpt2_state *s = l->state;
    int B = c->B, T = c->T, C = s->C, N = B * T;
    block_acts a;
    carve_block(&a, c->acts, B, T, C, s->NH);
    tr__layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, c->in, PARAM(c, l, LN1W),
                          PARAM(c, l, LN1B), N, C);
    tr__linear_forward(a.qkv, a.ln1, PARAM(c, l, QKVW), PARAM_BF16(c, l, QKVW), PARAM(c, l, QKVB),
                       N, C, 3 * C);
    tr__attention_forward(a.atty, a.att, a.qkv, B, T, C, s->NH, c->params_bf16 != NULL);
    tr__linear_forward_fused(a.res2, NULL, a.atty, PARAM(c, l, ATTPROJW),
                             PARAM_BF16(c, l, ATTPROJW), PARAM(c, l, ATTPROJB), c->in, N, C, C);
    tr__layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, PARAM(c, l, LN2W),
                          PARAM(c, l, LN2B), N, C);
    tr__linear_forward_fused(a.fch, a.fch_gelu, a.ln2, PARAM(c, l, FCW), PARAM_BF16(c, l, FCW),
                             PARAM(c, l, FCB), NULL, N, C, 4 * C);
    tr__linear_forward_fused(a.res3, NULL, a.fch_gelu, PARAM(c, l, FCPROJW),
                             PARAM_BF16(c, l, FCPROJW), PARAM(c, l, FCPROJB), a.res2, N, 4 * C, C);
    return 0;
}

typedef struct {
    float *dres3, *dfch, *dres2, *dqkv, *dln2, *dln1;
} block_stash;

static block_stash carve_stash(float *p, size_t NC)
{
    return (block_stash){p, p + NC, p + 5 * NC, p + 6 * NC, p + 9 * NC, p + 10 * NC};
}

/* The forward list backwards: dout = d res3 = d fcproj; d res2 starts as dout (the residual's
 * pass-through) and the layernorm adds to it; every other gradient is written whole by the
 * product (or the attention) that makes it, so nothing is zeroed first. Input gradients only
 * (a split backward's first part: what the weights' part needs goes to the stash), or with
 * weights the linear layers' weight gradients too, each in the same call as its input
 * gradient (tr__linear_backward_both: in bf16 the gradient is rounded once, not again in
 * block_backward_w; the same sums, so the same bits: test_pipe_model). tmp: the scratch after
 * the stash. */
static void block_backward_in(tr_layer_t *l, tr_layer_ctx_t *c, block_stash d, float *tmp,
                              bool weights)
{
    const gpt2_state *s = l->state;
    int B = c->B, T = c->T, C = s->C, N = B * T;
    size_t NC = (size_t)N * C;
    block_acts a;
    carve_block(&a, c->acts, B, T, C, s->NH);
    float *datty = tmp, *att_scratch = datty + NC;
#define WGRAD(i) (weights ? GRAD(c, l, i) : NULL)
    memcpy(d.dres3, c->dout, NC * sizeof(float));
    memcpy(d.dres2, c->dout, NC * sizeof(float));
    /* d fch = (d res3 fcproj) GELU'(fch), the GELU's backward on each block of the product */
    tr__linear_backward_both(d.dfch, WGRAD(FCPROJW), WGRAD(FCPROJB), d.dres3, a.fch_gelu,
                             PARAM(c, l, FCPROJW), PARAM_BF16(c, l, FCPROJW), a.fch, N, 4 * C, C);
    tr__linear_backward_both(d.dln2, WGRAD(FCW), WGRAD(FCB), d.dfch, a.ln2, PARAM(c, l, FCW),
                             PARAM_BF16(c, l, FCW), NULL, N, C, 4 * C);
    tr__layernorm_backward(d.dres2, NULL, NULL, d.dln2, a.res2, PARAM(c, l, LN2W), a.ln2_mean,
                           a.ln2_rstd, N, C);
    tr__linear_backward_both(datty, WGRAD(ATTPROJW), WGRAD(ATTPROJB), d.dres2, a.atty,
                             PARAM(c, l, ATTPROJW), PARAM_BF16(c, l, ATTPROJW), NULL, N, C, C);
    tr__attention_backward(d.dqkv, att_scratch, datty, a.qkv, a.att, B, T, C, s->NH,
                           c->params_bf16 != NULL);
    tr__linear_backward_both(d.dln1, WGRAD(QKVW), WGRAD(QKVB), d.dqkv, a.ln1, PARAM(c, l, QKVW),
                             PARAM_BF16(c, l, QKVW), NULL, N, C, 3 * C);
#undef WGRAD
    if (!c->din) return; /* nothing before this layer: no input gradient */
    tr__residual_backward(c->din, NULL, d.dres2, NC);
    tr__layernorm_backward(c->din, NULL, NULL, d.dln1, c->in, PARAM(c, l, LN1W), a.ln1_mean,
                           a.ln1_rstd, N, C);
}

/* The layernorms' parameter gradients, from the stash and the activations. */
static void block_backward_ln(tr_layer_t *l, tr_layer_ctx_t *c, block_stash d, const block_acts *a)
{
    int N = c->B * c->T, C = ((const gpt2_state *)l->state)->C;
    tr__layernorm_backward(NULL, GRAD(c, l, LN2W), GRAD(c, l, LN2B), d.dln2, a->res2,
                           PARAM(c, l, LN2W), a->ln2_mean, a->ln2_rstd, N, C);
    tr__layernorm_backward(NULL, GRAD(c, l, LN1W), GRAD(c, l, LN1B), d.dln1, c->in,
                           PARAM(c, l, LN1W), a->ln1_mean, a->ln1_rstd, N, C);
}

/* The weight gradients, from the stash and the activations. */
static void block_backward_w(tr_layer_t *l, tr_layer_ctx_t *c, block_stash d)
{
    const gpt2_state *s = l->state;
    int B = c->B, T = c->T, C = s->C, N = B * T;
    block_acts a;
    carve_block(&a, c->acts, B, T, C, s->NH);
    tr__linear_backward(NULL, GRAD(c, l, FCPROJW), GRAD(c, l, FCPROJB), d.dres3, a.fch_gelu, NULL,
                        PARAM_BF16(c, l, FCPROJW), N, 4 * C, C);
    tr__linear_backward(NULL, GRAD(c, l, FCW), GRAD(c, l, FCB), d.dfch, a.ln2, NULL,
                        PARAM_BF16(c, l, FCW), N, C, 4 * C);
    tr__linear_backward(NULL, GRAD(c, l, ATTPROJW), GRAD(c, l, ATTPROJB), d.dres2, a.atty, NULL,
                        PARAM_BF16(c, l, ATTPROJW), N, C, C);
    tr__linear_backward(NULL, GRAD(c, l, QKVW), GRAD(c, l, QKVB), d.dqkv, a.ln1, NULL,
                        PARAM_BF16(c, l, QKVW), N, C, 3 * C);
    block_backward_ln(l, c, d, &a);
}

/* The whole backward: the input part with the linear layers' weight gradients taken alongside,
 * then the layernorms'; the stash in the scratch. */
static int block_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    const gpt2_state *s = l->state;
    size_t NC = (size_t)c->B * c->T * s->C;
    block_acts a;
    carve_block(&a, c->acts, c->B, c->T, s->C, s->NH);
    block_stash d = carve_stash(c->scratch, NC);
    block_backward_in(l, c, d, c->scratch + STASH_NC * NC, true);
    block_backward_ln(l, c, d, &a);
    return 0;
}

static int block_backward_input(tr_layer_t *l, tr_layer_ctx_t *c)
{
    const gpt2_state *s = l->state;
    block_backward_in(l, c, carve_stash(c->stash, (size_t)c->B * c->T * s->C), c->scratch, false);
    return 0;
}

static int block_backward_weight(tr_layer_t *l, tr_layer_ctx_t *c)
{
    const gpt2_state *s = l->state;
    block_backward_w(l, c, carve_stash(c->stash, (size_t)c->B * c->T * s->C));
    return 0;
}

/* GPT-2's init (as llm.c's PyTorch reference): weights N(0, 0.02), the two projections into
 * the residual stream N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm weights 1. */
static void block_init(tr_layer_t *l, float *params, uint64_t *rng)
{
    const gpt2_state *s = l->state;
    for (int i = 0; i < l->n_params; i++) {
        float *p = params + l->params[i].offset;
        size_t n = l->params[i].numel;
        if (i == LN1W || i == LN2W)
            tr__fill(p, n, 1.0f);
        else if (i == QKVW || i == FCW)
            tr_rng_fill_normal(rng, p, n, 0.02f);
        else if (i == ATTPROJW || i == FCPROJW)
            tr_rng_fill_normal(rng, p, n, 0.02f / sqrtf(2.0f * s->L));
        else
            tr__fill(p, n, 0.0f);
    }
}

static void free_state(tr_layer_t *l)
{
    free(l->state);
}

static const tr_layer_ops_t block_ops = {.kind = "gpt2_block",
                                         .act_size = block_act_size,
                                         .scratch_size = block_scratch_size,
                                         .forward = block_forward,
                                         .backward = block_backward,
                                         .init = block_init,
                                         .destroy = free_state,
                                         .stash_size = block_stash_size,
                                         .backward_input = block_backward_input,
                                         .backward_weight = block_backward_weight};

/* ---- head: final LayerNorm, logits = lnf wte^T over Vp, cross-entropy over V --------------- */

static size_t head_act_size(const tr_layer_t *l, int B, int T)
{
    const gpt2_state *s = l->state;
    return (size_t)B * T * (3 + (size_t)s->C + s->Vp);
}

/* dlogits (N, Vp) | dlnf (N, C) */
static size_t head_scratch_size(const tr_layer_t *l, int B, int T)
{
    const gpt2_state *s = l->state;
    return (size_t)B * T * ((size_t)s->Vp + s->C);
}

#define WTE_BF16(c, s) ((c)->model_params_bf16 ? (c)->model_params_bf16 + (s)->wte_off : NULL)

static int head_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    gpt2_state *s = l->state;
    int N = c->B * c->T, C = s->C;
    float *losses = c->acts, *lnf = losses + N, *mean = lnf + (size_t)N * C, *rstd = mean + N;
    float *probs = rstd + N; // (N, Vp): logits, then probabilities when there are targets
    tr__layernorm_forward(lnf, mean, rstd, c->in, c->params, c->params + C, N, C);
    tr__linear_forward(probs, lnf, c->model_params + s->wte_off, WTE_BF16(c, s), NULL, N, C, s->Vp);
    if (!c->targets) return 0;
    return tr__crossentropy_forward(losses, probs, c->targets, N, s->V, s->Vp, TR_IGNORE_INDEX,
                                    &c->loss, &s->count);
}

static int head_backward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    const gpt2_state *s = l->state;
    int N = c->B * c->T, C = s->C;
    float *lnf = c->acts + N, *mean = lnf + (size_t)N * C, *rstd = mean + N, *probs = rstd + N;
    float *dlogits = c->scratch, *dlnf = dlogits + (size_t)N * s->Vp;
    tr__zero(dlogits, (size_t)N * (s->Vp + C));
    if (s->count)
        tr__crossentropy_backward(dlogits, probs, c->targets, N, s->V, s->Vp, TR_IGNORE_INDEX,
                                  c->loss_scale / s->count);
    tr__linear_backward(dlnf, c->model_grads + s->wte_off, NULL, dlogits, lnf,
                        c->model_params + s->wte_off, WTE_BF16(c, s), N, C, s->Vp);
    float *din = c->din ? c->din : dlogits; // dlogits is spent by now
    tr__layernorm_backward(din, c->grads, c->grads + C, dlnf, c->in, c->params, mean, rstd, N, C);
    return 0;
}

static void head_init(tr_layer_t *l, float *params, uint64_t *rng)
{
    const gpt2_state *s = l->state;
    tr__fill(params, s->C, 1.0f);
    tr__fill(params + s->C, s->C, 0.0f);
}

static const tr_layer_ops_t head_ops = {.kind = "gpt2_head",
                                        .act_size = head_act_size,
                                        .scratch_size = head_scratch_size,
                                        .forward = head_forward,
                                        .backward = head_backward,
                                        .init = head_init,
                                        .destroy = free_state};

/* ---- the model ----------------------------------------------------------------------------- */

static int check_config(const tr_gpt2_config_t *g, char *why, size_t why_len)
{
    if (g->max_seq_len < 1 || g->vocab_size < 1 || g->num_layers < 1 || g->num_heads < 1 ||
        g->channels < 1)
        return tr__errf(why, why_len, TR_EINVAL,
                        "GPT-2 config: max_seq_len %d, vocab_size %d, num_layers %d, num_heads "
                        "%d, channels %d must all be >= 1",
                        g->max_seq_len, g->vocab_size, g->num_layers, g->num_heads, g->channels);
    if (g->channels % g->num_heads)
        return tr__errf(why, why_len, TR_EINVAL,
                        "GPT-2 config: channels %d is not a multiple of num_heads %d", g->channels,
                        g->num_heads);
    if (g->padded_vocab_size < g->vocab_size)
        return tr__errf(why, why_len, TR_EINVAL,
                        "GPT-2 config: padded_vocab_size %d < vocab_size %d", g->padded_vocab_size,
                        g->vocab_size);
    return 0;
}

static int make_layer(tr_layer_t **out, const tr_layer_ops_t *ops, const char *name, int in_dim,
                      int out_dim, const gpt2_state *proto)
{
    tr_layer_t *l = calloc(1, sizeof(*l));
    gpt2_state *s = malloc(sizeof(*s));
    if (!l || !s) {
        free(l);
        free(s);
        return TR_ENOMEM;
    }
    *s = *proto;
    tr_layer_init(l, ops, name, in_dim, out_dim, s);
    *out = l;
    return 0;
}

static int add_block_params(tr_layer_t *l, int C)
{
    static const char *names[] = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                                  "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw",  "fcprojb"};
    int64_t shapes[][2] = {{C}, {C}, {3 * C, C}, {3 * C}, {C, C},     {C},
                           {C}, {C}, {4 * C, C}, {4 * C}, {C, 4 * C}, {C}};
    int err = 0;
    for (int i = 0; i < 12 && !err; i++)
        err = tr_layer_add_param(l, names[i], shapes[i][1] ? 2 : 1, shapes[i]);
    return err;
}

/* The layer list: embed, h0..h{L-1}, head. On failure frees what it made. */
static int make_layers(tr_layer_t **layers, const tr_gpt2_config_t *g)
{
    int L = g->num_layers, C = g->channels, err;
    gpt2_state proto = {.C = C,
                        .NH = g->num_heads,
                        .L = L,
                        .V = g->vocab_size,
                        .Vp = g->padded_vocab_size,
                        .wte_off = 0};
    err = tr_layer_embedding_create(&layers[0], "embed", g->padded_vocab_size, g->max_seq_len, C);
    if (!err) tr__layer_embedding_limit(layers[0], g->vocab_size);
    for (int i = 0; i < L && !err; i++) {
        char name[TR_LAYER_NAME_MAX];
        snprintf(name, sizeof(name), "h%d", i);
        err = make_layer(&layers[1 + i], &block_ops, name, C, C, &proto);
        if (!err) err = add_block_params(layers[1 + i], C);
    }
    if (!err) err = make_layer(&layers[L + 1], &head_ops, "head", C, 1, &proto);
    if (!err) {
        err = tr_layer_add_param(layers[L + 1], "lnfw", 1, (int64_t[]){C});
        err = err ? err : tr_layer_add_param(layers[L + 1], "lnfb", 1, (int64_t[]){C});
        if (!err) tr_layer_set_loss(layers[L + 1], TR_TARGETS_INT, 0);
        layers[L + 1]->classes = proto.V;
        layers[L + 1]->ignore_index = TR_IGNORE_INDEX;
        if (!err) err = tr_layer_tie_param(layers[L + 1], 0, "wte"); /* the output projection */
    }
    if (err)
        for (int i = 0; i < L + 2; i++)
            tr__layer_free(layers[i]);
    return err;
}

int tr_model_gpt2_create(tr_model_t **out, const tr_gpt2_config_t *config, char *why,
                         size_t why_len)
{
    tr_gpt2_config_t g = *config;
    if (g.padded_vocab_size == 0) g.padded_vocab_size = (g.vocab_size + 127) / 128 * 128;
    int err = check_config(&g, why, why_len);
    if (err) return err;
    tr_layer_t **layers = calloc((size_t)g.num_layers + 2, sizeof(*layers));
    if (!layers) return TR_ENOMEM;
    err = make_layers(layers, &g);
    if (!err) err = tr_model_create(out, layers, g.num_layers + 2, why, why_len);
    free(layers);
    if (!err) tr__model_set_gpt2(*out, &g);
    return err;
}

const float *tr_model_gpt2_logits(const tr_model_t *model)
{
    const tr_gpt2_config_t *g = tr_model_gpt2_config(model);
    const float *head = g ? tr_model_output(model, g->num_layers + 1) : NULL;
    if (!head) return NULL;
    int B, T;
    tr_model_batch_shape(model, &B, &T);
    size_t N = (size_t)B * T;
    return head + N + N * g->channels + 2 * N; // past losses, lnf, lnf_mean, lnf_rstd
}
