/* train_data.c: what `troupe train` feeds and draws from a model besides token shards — the
 * built-in synthetic task an MLP trains on, and sampling text from a trained GPT-2. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* A float uniform in [0, 1) from 53 bits of h. */
static double unit(uint64_t h)
{
    return (double)(h >> 11) / (double)(1ull << 53);
}

/* Sample s: x (in floats) and its class. */
static void task_sample(const mlp_task_t *t, uint64_t s, float *x, int *target)
{
    float best = -INFINITY;
    for (int i = 0; i < t->in; i++)
        x[i] = (float)(unit(mix(s * (uint64_t)t->in + (uint64_t)i + 1)) * 2.0 - 1.0);
    for (int c = 0; c < t->classes; c++) {
        float v = 0;
        for (int i = 0; i < t->in; i++)
            v += x[i] * (float)((i * 7 + c * 3) % 5 - 2);
        if (v > best) {
            best = v;
            *target = c;
        }
    }
}

int train_mlp_batch(void *user, uint64_t index, int B, int T, int *tokens, float *x, int *targets,
                    float *y)
{
    const mlp_task_t *t = user;
    uint64_t first = t->offset + index * (uint64_t)B * (uint64_t)T;
    for (int b = 0; b < B * T; b++)
        task_sample(t, first + (uint64_t)b, x + (size_t)b * (size_t)t->in, &targets[b]);
    return 0;
}

/* --- sampling ---------------------------------------------------------------------------- */

/* A token drawn from softmax(logits[0..V)) with coin in [0, 1). */
static int draw(const float *logits, int V, double coin)
{
    float mx = logits[0];
    for (int v = 1; v < V; v++)
        mx = fmaxf(mx, logits[v]);
    double sum = 0;
    for (int v = 0; v < V; v++)
        sum += exp((double)(logits[v] - mx));
    double acc = 0, target = coin * sum;
    for (int v = 0; v < V; v++) {
        acc += exp((double)(logits[v] - mx));
        if (acc > target) return v;
    }
    return V - 1;
}

/* A private copy of the model, so sampling never touches the engine's activations. */
static int copy_gpt2(const tr_model_t *model, tr_model_t **out)
{
    const tr_gpt2_config_t *g = tr_model_gpt2_config(model);
    if (!g) return TR_EINVAL;
    int rc = tr_model_gpt2_create(out, g, NULL, 0);
    if (rc == 0)
        memcpy(tr_model_params(*out), tr_model_params(model),
               tr_model_num_params(model) * sizeof(float));
    return rc;
}

/* The window is the last T tokens; later positions hold 0 and, attention being causal, do
 * not change the logits at position len - 1. One forward per token, as llm.c samples. */
int train_sample(const tr_model_t *model, const int *prompt, int n_prompt, int n, uint64_t seed,
                 int *out)
{
    tr_model_t *m;
    int rc = copy_gpt2(model, &m);
    if (rc < 0) return rc;
    const tr_gpt2_config_t *g = tr_model_gpt2_config(m);
    int T = g->max_seq_len, len = 0, Vp = g->padded_vocab_size;
    int *win = calloc((size_t)T, sizeof(int));
    if (!win) {
        tr_model_destroy(m);
        return TR_ENOMEM;
    }
    for (int i = n_prompt > T ? n_prompt - T : 0; i < n_prompt; i++)
        win[len++] = prompt[i];
    if (len == 0) win[len++] = 10 % g->vocab_size;
    uint64_t rng = seed;
    for (int i = 0; i < n && rc == 0; i++) {
        tr_batch_t b = {.B = 1, .T = T, .tokens = win};
        rc = tr_model_forward(m, &b, NULL);
        if (rc < 0) break;
        const float *logits = tr_model_gpt2_logits(m) + (size_t)(len - 1) * (size_t)Vp;
        out[i] = draw(logits, g->vocab_size, unit(tr_rng_next(&rng)));
        if (len == T) {
            memmove(win, win + 1, (size_t)(T - 1) * sizeof(int));
            len--;
        }
        win[len++] = out[i];
    }
    free(win);
    tr_model_destroy(m);
    return rc;
}
