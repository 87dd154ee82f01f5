/* sgd.c: SGD as one element loop (see sgd.h), instantiated per ISA.
 *
 * The loop is written once as an always-inline function with restrict pointers; wrappers
 * with target attributes let the compiler vectorise it for AVX2 and AVX-512 (the file is
 * built with -ffp-contract=off, C11's default, so no FMA changes the bits). The scalar
 * wrapper is the portable fallback.
 */
#include "kernels/cpu/sgd.h"

#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel.h"
#include "troupe/error.h"

#define GRAIN     32768
#define VECTORISE optimize("tree-vectorize", "vect-cost-model=dynamic")

typedef struct job {
    float lr, mom, damp1, wd, gmul; /* damp1 = 1 − dampening */
    int nesterov, first;
    float *p, *buf;
    const float *g;
} job_t;

/* The loop for one combination of flags; callers pass constants so each combination
 * compiles to a branch-free loop the vectoriser accepts. */
__attribute__((always_inline)) static inline void
loop(const job_t *j, size_t b, size_t e, int use_wd, int use_mom, int first, int nesterov)
{
    float *restrict p = j->p, *restrict buf = j->buf;
    const float *restrict g = j->g;
    const float lr = j->lr, mom = j->mom, damp1 = j->damp1, wd = j->wd, gmul = j->gmul;
    for (size_t i = b; i < e; i++) {
        float d = g[i] * gmul;
        if (use_wd) d = d + wd * p[i];
        if (use_mom) {
            float bu = first ? d : buf[i] * mom + damp1 * d;
            buf[i] = bu;
            d = nesterov ? d + mom * bu : bu;
        }
        p[i] = p[i] + -lr * d;
    }
}

/* Picks the loop for the step's flags: five momentum modes, with or without decay. */
__attribute__((always_inline)) static inline void body_wd(const job_t *j, size_t b, size_t e,
                                                          int use_wd)
{
    if (j->mom == 0.0f)
        loop(j, b, e, use_wd, 0, 0, 0);
    else if (j->first)
        j->nesterov ? loop(j, b, e, use_wd, 1, 1, 1) : loop(j, b, e, use_wd, 1, 1, 0);
    else
        j->nesterov ? loop(j, b, e, use_wd, 1, 0, 1) : loop(j, b, e, use_wd, 1, 0, 0);
}

__attribute__((always_inline)) static inline void body(const job_t *j, size_t b, size_t e)
{
    if (j->wd != 0.0f)
        body_wd(j, b, e, 1);
    else
        body_wd(j, b, e, 0);
}

__attribute__((VECTORISE)) static void range_scalar(const job_t *j, size_t b, size_t e)
{
    body(j, b, e);
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512vl"), VECTORISE)) static void
range_avx512(const job_t *j, size_t b, size_t e)
{
    body(j, b, e);
}

__attribute__((target("avx2,fma,f16c"), VECTORISE)) static void range_avx2(const job_t *j, size_t b,
                                                                           size_t e)
{
    body(j, b, e);
}
#endif

TR__ISA_RANGE(range, job_t, range_scalar, range_avx2, range_avx512)

int tr_sgd_check(const tr_sgd_opts_t *o)
{
    if (!(o->lr >= 0.0f)) return TR_EINVAL;
    if (o->nesterov && (o->momentum <= 0.0f || o->dampening != 0.0f)) return TR_EINVAL;
    return 0;
}

void tr_sgd_update(const tr_sgd_opts_t *o, int first_step, float grad_mul, float *p, const float *g,
                   float *buf, size_t n)
{
    job_t j = {.lr = o->lr,
               .mom = o->momentum,
               .damp1 = 1.0f - o->dampening,
               .wd = o->weight_decay,
               .gmul = grad_mul,
               .nesterov = o->nesterov,
               .first = first_step,
               .p = p,
               .buf = buf,
               .g = g};
    tr_parallel_for(n, GRAIN, range, &j);
}
