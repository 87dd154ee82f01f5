/* crossentropy.c: softmax and cross-entropy fused, with an ignore index and padded vocab.
 *
 * logits (N, Vp): only the first V columns are real tokens; the padding columns (GPT-2's
 * vocabulary rounded up for faster matrix products) get probability 0. The probabilities
 * overwrite the logits in place, so the (N, Vp) buffer exists once. A target equal to
 * ignore_index contributes no loss and no gradient; the mean is over counted positions.
 */
#include "kernels/cpu/ops.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec.h"
#include "troupe/error.h"

typedef struct {
    float *probs, *losses;
    const float *cprobs;
    const int *targets;
    int V, Vp, ignore;
    float dloss;
    float *dlogits;
} ce_job;

static void forward_rows(void *ctx, size_t begin, size_t end, int thread)
{
    const ce_job *j = ctx;
    const tr__vec_ops_t *v = tr__vec();
    for (size_t r = begin; r < end; r++) {
        float *p = j->probs + r * j->Vp; // (Vp)
        int tg = j->targets[r];
        float logit = tg == j->ignore ? 0.0f : p[tg];
        float m = v->max(p, j->V);
        float sum = v->exp_sum(p, p, m, j->V);
        v->scale(p, 1.0f / sum, j->V);
        memset(p + j->V, 0, (size_t)(j->Vp - j->V) * sizeof(float));
        // -log p[tg] from the logit itself: finite even when p[tg] underflows to 0
        j->losses[r] = tg == j->ignore ? 0.0f : logf(sum) + m - logit;
    }
}

int tr__crossentropy_forward(float *losses, float *probs_logits, const int *targets, int N, int V,
                             int Vp, int ignore_index, float *mean, int *count)
{
    int n = 0;
    for (int r = 0; r < N; r++) {
        if (targets[r] == ignore_index) continue;
        if (targets[r] < 0 || targets[r] >= V) return TR_EINVAL;
        n++;
    }
    ce_job j = {.probs = probs_logits,
                .losses = losses,
                .targets = targets,
                .V = V,
                .Vp = Vp,
                .ignore = ignore_index};
    tr_parallel_for(N, 4, forward_rows, &j);
    double total = 0.0;
    for (int r = 0; r < N; r++)
        total += losses[r];
    *count = n;
    *mean = n ? (float)(total / n) : 0.0f;
    return 0;
}

static void backward_rows(void *ctx, size_t begin, size_t end, int thread)
{
    const ce_job *j = ctx;
    const tr__vec_ops_t *v = tr__vec();
    for (size_t r = begin; r < end; r++) {
        int tg = j->targets[r];
        if (tg == j->ignore) continue;
        float *d = j->dlogits + r * j->Vp; // (Vp), padding columns stay untouched
        v->axpy(j->dloss, j->cprobs + r * j->Vp, d, j->V);
        d[tg] -= j->dloss;
    }
}

void tr__crossentropy_backward(float *dlogits, const float *probs, const int *targets, int N, int V,
                               int Vp, int ignore_index, float dloss)
{
    ce_job j = {.cprobs = probs,
                .targets = targets,
                .V = V,
                .Vp = Vp,
                .ignore = ignore_index,
                .dloss = dloss,
                .dlogits = dlogits};
    tr_parallel_for(N, 4, backward_rows, &j);
}
