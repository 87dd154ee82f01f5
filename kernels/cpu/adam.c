/* adam.c: one-pass Adam/AdamW over fp32 arrays (see adam.h for the exact formula).
 *
 * The per-step scalars are folded once into `coef_t`; the element loop then has three
 * bodies, scalar, AVX2 (8 lanes) and AVX-512 (16 lanes), chosen per call by tr__isa_get().
 * Vector bodies run unmasked over full vectors and handle the tail with masked loads and
 * stores (AVX-512) or maskload/maskstore (AVX2), so odd lengths and unaligned starts take
 * the same arithmetic as the bulk. Threads take contiguous tiles from tr_parallel_for.
 */
#include "kernels/cpu/adam.h"

#include <math.h>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel.h"

#define GRAIN 32768 /* elements per tile at least: 896 KiB of traffic */

typedef struct coef {
    float b1, b2, nb1, nb2; /* β1, β2, 1−β1, 1−β2 */
    float step_size, bc2, eps;
    float l2;    /* wd in L2 mode, else 0 */
    float decay; /* −lr·wd in AdamW mode, else 0 */
    float gmul;
} coef_t;

typedef struct job {
    coef_t c;
    float *p, *m, *v;
    float *vmax; /* AMSGrad's running maximum of v, or NULL */
    const float *g;
    uint16_t *copy;
    tr_half_kind_t kind;
} job_t;

void tr_adam_state_init(tr_adam_state_t *st)
{
    st->step = 0;
    st->beta1_pow = 1.0;
    st->beta2_pow = 1.0;
}

/* The bias corrections use the betas of this step raised to the step count, as torch's Adam
 * and DeepSpeed's CPU Adam (ops/csrc/includes/cpu_adam.h: pow(beta, step) again whenever the
 * betas change) do: OneCycle's momentum cycle changes beta1 every step, and a product of the
 * betas used so far would be another correction. A function of (beta, step) only, so a resumed
 * run computes it as the uninterrupted one did. */
void tr_adam_state_advance(const tr_adam_opts_t *o, tr_adam_state_t *st)
{
    st->step++;
    st->beta1_pow = pow((double)o->beta1, (double)st->step);
    st->beta2_pow = pow((double)o->beta2, (double)st->step);
}

static coef_t make_coef(const tr_adam_opts_t *o, const tr_adam_state_t *st, float grad_mul)
{
    coef_t c = {.b1 = o->beta1, .b2 = o->beta2, .eps = o->eps, .gmul = grad_mul};
    c.nb1 = 1.0f - o->beta1;
    c.nb2 = 1.0f - o->beta2;
    c.step_size = -o->lr;
    c.bc2 = 1.0f;
    if (o->bias_correction) {
        c.step_size = (float)(-(double)o->lr / (1.0 - st->beta1_pow));
        c.bc2 = (float)(1.0 / sqrt(1.0 - st->beta2_pow));
    }
    int wd = o->weight_decay > 0.0f;
    c.l2 = wd && !o->adamw_mode ? o->weight_decay : 0.0f;
    c.decay = wd && o->adamw_mode ? -o->lr * o->weight_decay : 0.0f;
    return c;
}

/* ---------------------------------------------------------------- scalar */

static void range_scalar(const job_t *j, size_t b, size_t e)
{
    const coef_t c = j->c;
    for (size_t i = b; i < e; i++) {
        float g = j->g[i] * c.gmul, p = j->p[i], m = j->m[i], v = j->v[i];
        if (c.l2 != 0.0f) g = p * c.l2 + g;
        m = m * c.b1;
        m = g * c.nb1 + m;
        v = v * c.b2;
        v = (g * g) * c.nb2 + v;
        float vd = v;
        if (j->vmax) {
            vd = fmaxf(j->vmax[i], v);
            j->vmax[i] = vd;
        }
        float upd = m / (sqrtf(vd) * c.bc2 + c.eps);
        if (c.decay != 0.0f) p = c.decay * p + p;
        p = upd * c.step_size + p;
        j->p[i] = p;
        j->m[i] = m;
        j->v[i] = v;
        if (j->kind == TR_HALF_FP16)
            j->copy[i] = tr_half_from_float(p);
        else if (j->kind == TR_HALF_BF16)
            j->copy[i] = tr_bf16_from_float(p);
    }
}

#if defined(__x86_64__)
/* ---------------------------------------------------------------- AVX-512 */
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* 16 elements at i, lanes outside k untouched. */
T512 __attribute__((always_inline)) static inline void body512(const job_t *j, size_t i,
                                                               __mmask16 k)
{
    const coef_t c = j->c;
    __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, j->g + i), _mm512_set1_ps(c.gmul));
    __m512 p = _mm512_maskz_loadu_ps(k, j->p + i);
    __m512 m = _mm512_maskz_loadu_ps(k, j->m + i);
    __m512 v = _mm512_maskz_loadu_ps(k, j->v + i);
    if (c.l2 != 0.0f) g = _mm512_fmadd_ps(p, _mm512_set1_ps(c.l2), g);
    m = _mm512_fmadd_ps(g, _mm512_set1_ps(c.nb1), _mm512_mul_ps(m, _mm512_set1_ps(c.b1)));
    v = _mm512_fmadd_ps(_mm512_mul_ps(g, g), _mm512_set1_ps(c.nb2),
                        _mm512_mul_ps(v, _mm512_set1_ps(c.b2)));
    __m512 vd = v;
    if (j->vmax) {
        vd = _mm512_max_ps(_mm512_maskz_loadu_ps(k, j->vmax + i), v);
        _mm512_mask_storeu_ps(j->vmax + i, k, vd);
    }
    __m512 den = _mm512_fmadd_ps(_mm512_sqrt_ps(vd), _mm512_set1_ps(c.bc2), _mm512_set1_ps(c.eps));
    __m512 upd = _mm512_div_ps(m, den);
    if (c.decay != 0.0f) p = _mm512_fmadd_ps(_mm512_set1_ps(c.decay), p, p);
    p = _mm512_fmadd_ps(upd, _mm512_set1_ps(c.step_size), p);
    _mm512_mask_storeu_ps(j->p + i, k, p);
    _mm512_mask_storeu_ps(j->m + i, k, m);
    _mm512_mask_storeu_ps(j->v + i, k, v);
    if (j->kind == TR_HALF_FP16)
        _mm256_mask_storeu_epi16(j->copy + i, k, tr__fp16_from_ps512(p));
    else if (j->kind == TR_HALF_BF16)
        _mm256_mask_storeu_epi16(j->copy + i, k, tr__bf16_from_ps512(p));
}

T512 static void range_avx512(const job_t *j, size_t b, size_t e)
{
    size_t i = b;
    for (; i + 16 <= e; i += 16)
        body512(j, i, 0xffff);
    if (i < e) body512(j, i, (__mmask16)((1u << (e - i)) - 1));
}

/* ---------------------------------------------------------------- AVX2 */
#define T256 __attribute__((target("avx2,fma,f16c")))

/* 8 elements at i; `mask` lanes (all ones or zero) select which exist. Whole vectors
 * (count 8) load and store plainly: AMD's VMASKMOVPS store is microcoded, tens of cycles. */
#define LOAD256(a) (count == 8 ? _mm256_loadu_ps(a) : _mm256_maskload_ps(a, mask))
#define STORE256(a, x)                                                                             \
    do {                                                                                           \
        if (count == 8)                                                                            \
            _mm256_storeu_ps(a, x);                                                                \
        else                                                                                       \
            _mm256_maskstore_ps(a, mask, x);                                                       \
    } while (0)
T256 __attribute__((always_inline)) static inline void body256(const job_t *j, size_t i,
                                                               __m256i mask, size_t count)
{
    const coef_t c = j->c;
    __m256 g = _mm256_mul_ps(LOAD256(j->g + i), _mm256_set1_ps(c.gmul));
    __m256 p = LOAD256(j->p + i);
    __m256 m = LOAD256(j->m + i);
    __m256 v = LOAD256(j->v + i);
    if (c.l2 != 0.0f) g = _mm256_fmadd_ps(p, _mm256_set1_ps(c.l2), g);
    m = _mm256_fmadd_ps(g, _mm256_set1_ps(c.nb1), _mm256_mul_ps(m, _mm256_set1_ps(c.b1)));
    v = _mm256_fmadd_ps(_mm256_mul_ps(g, g), _mm256_set1_ps(c.nb2),
                        _mm256_mul_ps(v, _mm256_set1_ps(c.b2)));
    __m256 vd = v;
    if (j->vmax) {
        vd = _mm256_max_ps(LOAD256(j->vmax + i), v);
        STORE256(j->vmax + i, vd);
    }
    __m256 den = _mm256_fmadd_ps(_mm256_sqrt_ps(vd), _mm256_set1_ps(c.bc2), _mm256_set1_ps(c.eps));
    __m256 upd = _mm256_div_ps(m, den);
    if (c.decay != 0.0f) p = _mm256_fmadd_ps(_mm256_set1_ps(c.decay), p, p);
    p = _mm256_fmadd_ps(upd, _mm256_set1_ps(c.step_size), p);
    STORE256(j->p + i, p);
    STORE256(j->m + i, m);
    STORE256(j->v + i, v);
    if (j->kind == TR_HALF_NONE) return;
    __m128i h = j->kind == TR_HALF_FP16 ? tr__fp16_from_ps256(p) : tr__bf16_from_ps256(p);
    if (count == 8) {
        _mm_storeu_si128((__m128i *)(j->copy + i), h);
    } else {
        uint16_t tmp[8];
        _mm_storeu_si128((__m128i *)tmp, h);
        memcpy(j->copy + i, tmp, count * sizeof(uint16_t));
    }
}
#undef LOAD256
#undef STORE256

T256 static void range_avx2(const job_t *j, size_t b, size_t e)
{
    size_t i = b;
    for (; i + 8 <= e; i += 8)
        body256(j, i, _mm256_set1_epi32(-1), 8);
    if (i < e) {
        __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(e - i)), lane);
        body256(j, i, mask, e - i);
    }
}
#endif

TR__ISA_RANGE(range, job_t, range_scalar, range_avx2, range_avx512)

void tr_adam_update(const tr_adam_opts_t *o, const tr_adam_state_t *st, float grad_mul, float *p,
                    const float *g, float *m, float *v, size_t n, uint16_t *copy,
                    tr_half_kind_t kind)
{
    job_t j = {.c = make_coef(o, st, grad_mul),
               .p = p,
               .g = g,
               .m = m,
               .v = v,
               .copy = copy,
               .kind = copy ? kind : TR_HALF_NONE};
    tr_parallel_for(n, GRAIN, range, &j);
}

void tr_adam_update_amsgrad(const tr_adam_opts_t *o, const tr_adam_state_t *st, float grad_mul,
                            float *p, const float *g, float *m, float *v, float *vmax, size_t n)
{
    job_t j = {.c = make_coef(o, st, grad_mul),
               .p = p,
               .g = g,
               .m = m,
               .v = v,
               .vmax = vmax,
               .kind = TR_HALF_NONE};
    tr_parallel_for(n, GRAIN, range, &j);
}

void tr_adam_step(const tr_adam_opts_t *o, tr_adam_state_t *st, float *p, const float *g, float *m,
                  float *v, size_t n)
{
    tr_adam_state_advance(o, st);
    tr_adam_update(o, st, 1.0f, p, g, m, v, n, NULL, TR_HALF_NONE);
}
