/* half.c: array conversions between fp32 and fp16/bf16, one pass, over the thread pool.
 *
 * The scalar rules live in half.h; the vector bodies here use the same rounding (F16C's
 * VCVTPS2PH for fp16, integer round-to-nearest-even for bf16), so every ISA writes the same
 * bits, which test_half checks.
 */
#include "kernels/cpu/half.h"

#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel.h"

#define GRAIN 16384

typedef struct job {
    uint16_t *h;
    float *f;
    const uint16_t *hin;
    const float *fin;
    tr_half_kind_t kind;
} job_t;

static void from_float_scalar(uint16_t *dst, const float *src, size_t n, tr_half_kind_t kind)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = kind == TR_HALF_BF16 ? tr_bf16_from_float(src[i]) : tr_half_from_float(src[i]);
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
from_float_avx512(uint16_t *dst, const float *src, size_t n, tr_half_kind_t kind)
{
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(k, src + i);
        __m256i h = kind == TR_HALF_BF16 ? tr__bf16_from_ps512(x) : tr__fp16_from_ps512(x);
        _mm256_mask_storeu_epi16(dst + i, k, h);
    }
}

__attribute__((target("avx2,fma,f16c"))) static void
from_float_avx2(uint16_t *dst, const float *src, size_t n, tr_half_kind_t kind)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(src + i);
        __m128i h = kind == TR_HALF_BF16 ? tr__bf16_from_ps256(x) : tr__fp16_from_ps256(x);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    from_float_scalar(dst + i, src + i, n - i, kind);
}
#endif

void tr__half_from_float_serial(uint16_t *dst, const float *src, size_t n, tr_half_kind_t kind)
{
#if defined(__x86_64__)
    switch (tr__isa_get()) {
    case TR_ISA_AVX512:
        from_float_avx512(dst, src, n, kind);
        return;
    case TR_ISA_AVX2:
        from_float_avx2(dst, src, n, kind);
        return;
    default:
        break;
    }
#endif
    from_float_scalar(dst, src, n, kind);
}

static void from_float_range(void *ctx, size_t begin, size_t end, int thread)
{
    job_t *j = ctx;
    tr__half_from_float_serial(j->h + begin, j->fin + begin, end - begin, j->kind);
}

static void to_float_range(void *ctx, size_t begin, size_t end, int thread)
{
    job_t *j = ctx;
    for (size_t i = begin; i < end; i++)
        j->f[i] =
            j->kind == TR_HALF_BF16 ? tr_bf16_to_float(j->hin[i]) : tr_half_to_float(j->hin[i]);
}

void tr_half_from_float_array(uint16_t *dst, const float *src, size_t n, tr_half_kind_t kind)
{
    job_t j = {.h = dst, .fin = src, .kind = kind};
    tr_parallel_for(n, GRAIN, from_float_range, &j);
}

void tr_half_to_float_array(float *dst, const uint16_t *src, size_t n, tr_half_kind_t kind)
{
    job_t j = {.f = dst, .hin = src, .kind = kind};
    tr_parallel_for(n, GRAIN, to_float_range, &j);
}
