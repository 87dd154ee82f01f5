/* lion.c: one-pass Lion over fp32 arrays (see lion.h for the exact formula). The per-call
 * scalars are folded once; threads take contiguous tiles from tr_parallel_for. */
#include "kernels/cpu/lion.h"

#include "kernels/cpu/parallel.h"

#define GRAIN 32768 /* elements per tile at least: 640 KiB of traffic */

typedef struct job {
    float b1, nb1, b2, nb2; /* β1, 1−β1, β2, 1−β2 */
    float lr, decay;        /* lr, 1 − lr·wd */
    float gmul;
    float *p, *m;
    const float *g;
} job_t;

static void range(void *arg, size_t b, size_t e, int thread)
{
    (void)thread;
    const job_t *j = arg;
    float *restrict p = j->p, *restrict m = j->m;
    const float *restrict g = j->g;
    for (size_t i = b; i < e; i++) {
        float gi = g[i] * j->gmul;
        float c = j->b1 * m[i] + j->nb1 * gi;
        float sign = (float)(c > 0.0f) - (float)(c < 0.0f);
        p[i] = p[i] * j->decay - j->lr * sign;
        m[i] = j->b2 * m[i] + j->nb2 * gi;
    }
}

void tr_lion_update(const tr_lion_opts_t *o, float grad_mul, float *p, const float *g, float *m,
                    size_t n)
{
    job_t j = {.b1 = o->beta1,
               .nb1 = 1.0f - o->beta1,
               .b2 = o->beta2,
               .nb2 = 1.0f - o->beta2,
               .lr = o->lr,
               .decay = 1.0f - o->lr * o->weight_decay,
               .gmul = grad_mul,
               .p = p,
               .m = m,
               .g = g};
    tr_parallel_for(n, GRAIN, range, &j);
}
