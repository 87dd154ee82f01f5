/* gradnorm.c: sum of squares in double (norm and overflow check in one pass), the
 * unscale-and-clip factor, and a plain scaling pass.
 *
 * Determinism: the array is cut into BLOCK-element blocks; each block's sum is written to
 * its own slot by whichever thread takes it, and the slots are added in index order by the
 * caller, so the thread count never changes the bits.
 */
#include "kernels/cpu/gradnorm.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel.h"
#include "troupe/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define BLOCK        16384
#define STACK_BLOCKS 64

typedef struct job {
    const float *g;
    float *gw;
    size_t n;
    float mul;
    double *partial; /* (blocks,) */
} job_t;

static double sumsq_scalar(const float *g, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * (double)g[i];
    return s;
}

#if defined(__x86_64__)
/* Two 8-lane double accumulators; the masked tail adds zeros. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static double sumsq_avx512(const float *g,
                                                                                size_t n)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(k, g + i);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
        __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
        __m512d hi = _mm512_cvtps_pd(upper);
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
}

__attribute__((target("avx2,fma,f16c"))) static double sumsq_avx2(const float *g, size_t n)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
        __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(a0, a1));
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]) + sumsq_scalar(g + i, n - i);
}
#endif

static double sumsq_block(const float *g, size_t n)
{
#if defined(__x86_64__)
    switch (tr__isa_get()) {
    case TR_ISA_AVX512:
        return sumsq_avx512(g, n);
    case TR_ISA_AVX2:
        return sumsq_avx2(g, n);
    default:
        break;
    }
#endif
    return sumsq_scalar(g, n);
}

/* Blocks [b, e). */
static void sumsq_blocks(void *ctx, size_t b, size_t e, int thread)
{
    job_t *j = ctx;
    for (size_t k = b; k < e; k++) {
        size_t first = k * BLOCK, len = j->n - first < BLOCK ? j->n - first : BLOCK;
        j->partial[k] = sumsq_block(j->g + first, len);
    }
}

double tr_grad_sumsq(const float *g, size_t n)
{
    size_t blocks = (n + BLOCK - 1) / BLOCK;
    double stack[STACK_BLOCKS];
    double *partial = blocks <= STACK_BLOCKS ? stack : malloc(blocks * sizeof(double));
    double sum = 0.0;
    if (!partial) { /* no memory for the slots: the same blocks, one thread */
        for (size_t k = 0; k < blocks; k++)
            sum += sumsq_block(g + k * BLOCK, n - k * BLOCK < BLOCK ? n - k * BLOCK : BLOCK);
        return sum;
    }
    job_t j = {.g = g, .n = n, .partial = partial};
    tr_parallel_for(blocks, 1, sumsq_blocks, &j);
    for (size_t k = 0; k < blocks; k++)
        sum += partial[k];
    if (partial != stack) free(partial);
    return sum;
}

int tr_grad_norm_finish(double sumsq, double *norm)
{
    if (!isfinite(sumsq)) {
        *norm = INFINITY;
        return TR_ENONFINITE;
    }
    *norm = sqrt(sumsq);
    return 0;
}

float tr_grad_clip_mul(double scaled_norm, double loss_scale, double clip)
{
    double combined = loss_scale;
    if (clip > 0.0) {
        double c = (scaled_norm / loss_scale + 1e-6) / clip;
        if (c > 1.0) combined = c * loss_scale;
    }
    return (float)(1.0 / combined);
}

static void scale_range(void *ctx, size_t b, size_t e, int thread)
{
    job_t *j = ctx;
    for (size_t i = b; i < e; i++) /* memory-bound: plain C (SSE2 at -O2) suffices */
        j->gw[i] *= j->mul;
}

void tr_grad_scale(float *g, size_t n, float mul)
{
    job_t j = {.gw = g, .n = n, .mul = mul};
    tr_parallel_for(n, 65536, scale_range, &j);
}
