/* gpt_stages.c: the byte-level GPT of `make demo` trained through S pipeline stages in one
 * process (tr_pipe_model: a stage actor per stage, DeepSpeed's 1F1B schedule, M micro-batches
 * per step), with AdamW written here on the model's parameter and gradient buffers (the
 * pipeline computes the gradients; the update is the caller's). Public API only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <troupe.h>

#include "gpt_stages.h"

typedef struct adamw {
    float *m, *v;
    size_t n;
    int t;
} adamw_t;

static void adamw_step(adamw_t *a, float *p, const float *g, float lr, float scale)
{
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.01f;
    a->t++;
    float c1 = 1 - powf(b1, (float)a->t), c2 = 1 - powf(b2, (float)a->t);
    for (size_t i = 0; i < a->n; i++) {
        float gi = g[i] * scale;
        a->m[i] = b1 * a->m[i] + (1 - b1) * gi;
        a->v[i] = b2 * a->v[i] + (1 - b2) * gi * gi;
        p[i] -= lr * (a->m[i] / c1 / (sqrtf(a->v[i] / c2) + eps) + wd * p[i]);
    }
}

/* M micro-batches of B x T tokens from the shard at *cursor (wrapping), targets shifted by one. */
static void next_batches(const uint16_t *tok, size_t count, size_t *cursor, int M, int B, int T,
                         int *tokens, int *targets, tr_batch_t *b)
{
    for (int k = 0; k < M; k++) {
        for (int i = 0; i < B * T; i++) {
            if (*cursor + 1 >= count) *cursor = 0;
            tokens[k * B * T + i] = tok[*cursor];
            targets[k * B * T + i] = tok[*cursor + 1];
            (*cursor)++;
        }
        b[k] = (tr_batch_t){
            .B = B, .T = T, .tokens = tokens + k * B * T, .targets = targets + k * B * T};
    }
}

static int train_steps(const gpt_stages_opts_t *o, tr_model_t *model, tr_pipe_model_t *pm,
                       const uint16_t *tok, size_t count)
{
    int M = o->micro_batches, B = o->B, T = o->T, rc = 0;
    int *tokens = malloc(sizeof(int) * (size_t)(M * B * T));
    int *targets = malloc(sizeof(int) * (size_t)(M * B * T));
    tr_batch_t *b = malloc(sizeof(tr_batch_t) * (size_t)M);
    float *losses = malloc(sizeof(float) * (size_t)M);
    size_t n = tr_model_num_params(model), cursor = 0;
    adamw_t a = {calloc(n, sizeof(float)), calloc(n, sizeof(float)), n, 0};
    if (!tokens || !targets || !b || !losses || !a.m || !a.v) rc = TR_ENOMEM;
    double first = 0, last = 0, ms = 0;
    for (int step = 0; rc == 0 && step < o->steps; step++) {
        next_batches(tok, count, &cursor, M, B, T, tokens, targets, b);
        tr_model_zero_grad(model);
        char err[1024];
        tr_pipe_run_result_t r;
        if ((rc = tr_pipe_model_run(pm, b, losses, (unsigned long long)step, NULL, &r, err,
                                    sizeof(err))) < 0) {
            fprintf(stderr, "pipeline_demo: step %d: %s\n", step + 1, err);
            break;
        }
        double loss = 0;
        for (int k = 0; k < M; k++)
            loss += losses[k] / M;
        adamw_step(&a, tr_model_params(model), tr_model_grads(model), o->lr, 1.0f / (float)M);
        if (step == 0) first = loss;
        last = loss, ms += r.makespan_ms;
        if ((step + 1) % 10 == 0 || step == 0 || step + 1 == o->steps)
            printf("gpt: step %d/%d loss %.4f (%.0f ms through %d stages)\n", step + 1, o->steps,
                   loss, r.makespan_ms, o->stages);
    }
    if (rc == 0)
        printf("gpt: trained through %d stage actors (1F1B, %d micro-batches per step): loss "
               "%.4f -> %.4f (uniform: ln 256 = 5.55), %.0f ms per step\n",
               o->stages, M, first, last, ms / o->steps);
    free(tokens), free(targets), free(b), free(losses), free(a.m), free(a.v);
    return rc;
}

int gpt_stages_train(const gpt_stages_opts_t *o)
{
    uint16_t *tok = NULL;
    size_t count = 0;
    char why[512];
    if (tr_llmc_tokens_load(o->data, &tok, &count, why, sizeof(why)) < 0) {
        fprintf(stderr, "pipeline_demo: --train-data: %s\n", why);
        return 2;
    }
    tr_gpt2_config_t c = {.max_seq_len = o->T,
                          .vocab_size = 256,
                          .padded_vocab_size = 256,
                          .num_layers = o->layers,
                          .num_heads = 4,
                          .channels = o->channels};
    tr_model_t *model = NULL;
    tr_pipe_model_t *pm = NULL;
    int bounds[65], rc = tr_model_gpt2_create(&model, &c, why, sizeof(why));
    if (rc == 0) tr_model_init_params(model, 1234);
    if (rc == 0) rc = tr_pipe_partition(model, "parameters", o->stages, bounds, why, sizeof(why));
    if (rc == 0)
        rc = tr_pipe_model_create(&pm, model, bounds, o->stages, TR_PIPE_TRAIN_1F1B,
                                  o->micro_batches, o->B, o->T, why, sizeof(why));
    if (rc < 0) fprintf(stderr, "pipeline_demo: %s\n", why);
    for (int s = 0; rc == 0 && s < o->stages; s++) {
        size_t params = 0;
        for (int i = bounds[s]; i < bounds[s + 1]; i++)
            params += tr_model_layer(model, i)->param_count;
        printf("gpt: stage %d: layers %d to %d (%s .. %s), %zu parameters\n", s, bounds[s],
               bounds[s + 1] - 1, tr_model_layer(model, bounds[s])->name,
               tr_model_layer(model, bounds[s + 1] - 1)->name, params);
    }
    if (rc == 0) rc = train_steps(o, model, pm, tok, count);
    tr_pipe_model_destroy(pm);
    tr_model_destroy(model);
    free(tok);
    return rc < 0 ? 1 : 0;
}
