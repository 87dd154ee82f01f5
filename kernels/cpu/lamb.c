/* lamb.c: LAMB in two passes over the thread pool (see lamb.h).
 *
 * Pass 1, per BLOCK-element block: update m and v (a branch-free loop the compiler
 * vectorises per ISA), then sum p² and u² in double in index order into the block's slots.
 * The caller adds the slots in order, so the trust ratio has the same bits for any thread
 * count. Pass 2 recomputes u from the new m, v and the unchanged p and applies the step.
 */
#include "kernels/cpu/lamb.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel.h"

#define BLOCK 16384
/* (CMakeLists.txt builds this file with -fno-math-errno: sqrtf without errno, NaN for
 * v < 0 either way, lets the loops vectorise.) */
#define VECTORISE optimize("tree-vectorize", "vect-cost-model=dynamic")

typedef struct job {
    float b1, b2, nb1, nb2, eps, wd, gmul, step; /* step: −step_size·coeff in pass 2 */
    int inside;                                  /* eps inside the square root */
    float *p, *m, *v;
    const float *g;
    size_t n;
    double *wsq, *usq; /* (blocks,) */
} job_t;

/* u = m / (√v + eps) + wd·p, or with √(v + eps); `inside` is a constant at each use. */
__attribute__((always_inline)) static inline float update_of(float m, float v, float p, float eps,
                                                             float wd, int inside)
{
    float den = inside ? sqrtf(v + eps) : sqrtf(v) + eps;
    return m / den + wd * p;
}

__attribute__((always_inline)) static inline void moments(const job_t *j, size_t b, size_t e)
{
    float *restrict m = j->m, *restrict v = j->v;
    const float *restrict g = j->g;
    const float b1 = j->b1, b2 = j->b2, nb1 = j->nb1, nb2 = j->nb2, gmul = j->gmul;
    for (size_t i = b; i < e; i++) {
        float gi = g[i] * gmul;
        m[i] = b1 * m[i] + nb1 * gi;
        v[i] = b2 * v[i] + nb2 * (gi * gi);
    }
}

__attribute__((always_inline)) static inline void apply_eps(const job_t *j, size_t b, size_t e,
                                                            int inside)
{
    float *restrict p = j->p;
    const float *restrict m = j->m, *restrict v = j->v;
    const float step = j->step, eps = j->eps, wd = j->wd;
    for (size_t i = b; i < e; i++)
        p[i] = p[i] + step * update_of(m[i], v[i], p[i], eps, wd, inside);
}

__attribute__((always_inline)) static inline void apply(const job_t *j, size_t b, size_t e)
{
    if (j->inside)
        apply_eps(j, b, e, 1);
    else
        apply_eps(j, b, e, 0);
}

#define INSTANTIATE(name, ...)                                                                     \
    __attribute__((__VA_ARGS__)) static void moments_##name(const job_t *j, size_t b, size_t e)    \
    {                                                                                              \
        moments(j, b, e);                                                                          \
    }                                                                                              \
    __attribute__((__VA_ARGS__)) static void apply_##name(const job_t *j, size_t b, size_t e)      \
    {                                                                                              \
        apply(j, b, e);                                                                            \
    }
INSTANTIATE(scalar, VECTORISE)
#if defined(__x86_64__)
INSTANTIATE(avx512, target("avx512f,avx512bw,avx512vl"), VECTORISE)
INSTANTIATE(avx2, target("avx2,fma,f16c"), VECTORISE)
#endif

static void run(const job_t *j, size_t b, size_t e, int second_pass)
{
    void (*fn)(const job_t *, size_t, size_t) = second_pass ? apply_scalar : moments_scalar;
#if defined(__x86_64__)
    tr_isa_t isa = tr__isa_get();
    if (isa == TR_ISA_AVX512)
        fn = second_pass ? apply_avx512 : moments_avx512;
    else if (isa == TR_ISA_AVX2)
        fn = second_pass ? apply_avx2 : moments_avx2;
#endif
    fn(j, b, e);
}

/* Pass 1 over blocks [kb, ke). */
static void pass1(void *ctx, size_t kb, size_t ke, int thread)
{
    const job_t *j = ctx;
    for (size_t k = kb; k < ke; k++) {
        size_t b = k * BLOCK, e = j->n - b < BLOCK ? j->n : b + BLOCK;
        run(j, b, e, 0);
        double w = 0.0, u = 0.0;
        for (size_t i = b; i < e; i++) {
            double ui = update_of(j->m[i], j->v[i], j->p[i], j->eps, j->wd, j->inside);
            w += (double)j->p[i] * (double)j->p[i];
            u += ui * ui;
        }
        j->wsq[k] = w;
        j->usq[k] = u;
    }
}

static void pass2(void *ctx, size_t b, size_t e, int thread)
{
    run(ctx, b, e, 1);
}

float tr_lamb_trust_ratio(const tr_lamb_opts_t *o, double wsq, double usq)
{
    double w = sqrt(wsq), u = sqrt(usq);
    if (w == 0.0 || u == 0.0) return 1.0f;
    double c = w / u;
    c = c > o->max_coeff ? o->max_coeff : c;
    c = c < o->min_coeff ? o->min_coeff : c;
    return (float)c;
}

static job_t job_of(const tr_lamb_opts_t *o, float grad_mul, float *p, const float *g, float *m,
                    float *v, size_t n)
{
    return (job_t){.b1 = o->beta1,
                   .b2 = o->beta2,
                   .nb1 = 1.0f - o->beta1,
                   .nb2 = 1.0f - o->beta2,
                   .eps = o->eps,
                   .wd = o->weight_decay,
                   .gmul = grad_mul,
                   .inside = o->eps_inside_sqrt,
                   .p = p,
                   .m = m,
                   .v = v,
                   .g = g,
                   .n = n};
}

int tr_lamb_moments(const tr_lamb_opts_t *o, float grad_mul, float *p, const float *g, float *m,
                    float *v, size_t n, double *wsq, double *usq)
{
    size_t blocks = (n + BLOCK - 1) / BLOCK;
    double *sums = calloc(2 * blocks + 2, sizeof(double));
    if (!sums) /* keeps the state as it is: an unusable step beats a wrong one */
        return -1;
    job_t j = job_of(o, grad_mul, p, g, m, v, n);
    j.wsq = sums;
    j.usq = sums + blocks;
    tr_parallel_for(blocks, 1, pass1, &j);
    double w = 0.0, u = 0.0;
    for (size_t k = 0; k < blocks; k++) {
        w += j.wsq[k];
        u += j.usq[k];
    }
    free(sums);
    *wsq = w;
    *usq = u;
    return 0;
}

void tr_lamb_apply(const tr_lamb_opts_t *o, const tr_adam_state_t *st, float coeff, float *p,
                   const float *m, const float *v, size_t n)
{
    double step_size = o->lr;
    if (o->bias_correction) step_size = o->lr * sqrt(1.0 - st->beta2_pow) / (1.0 - st->beta1_pow);
    job_t j = job_of(o, 1.0f, p, NULL, (float *)m, (float *)v, n); /* pass 2 writes p only */
    j.step = -((float)step_size * coeff);
    tr_parallel_for(n, BLOCK, pass2, &j);
}

float tr_lamb_update(const tr_lamb_opts_t *o, const tr_adam_state_t *st, float grad_mul, float *p,
                     const float *g, float *m, float *v, size_t n)
{
    double wsq, usq;
    if (tr_lamb_moments(o, grad_mul, p, g, m, v, n, &wsq, &usq) < 0) return 0.0f;
    float coeff = tr_lamb_trust_ratio(o, wsq, usq);
    tr_lamb_apply(o, st, coeff, p, m, v, n);
    return coeff;
}
