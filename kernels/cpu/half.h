/* half: fp32 <-> fp16 (IEEE binary16) and bf16 conversion, round to nearest even.
 *
 * Rules shared by every path, scalar and vector: fp32 -> half rounds to nearest, ties to
 * even; values beyond the format's range become ±Inf; subnormal fp16 results are kept (not
 * flushed); NaN stays NaN, quiet, keeping the top bits of its payload (as F16C's
 * VCVTPS2PH does). bf16 is the top half of the fp32 bits after rounding, so bf16 subnormals
 * and infinities follow from fp32's. The scalar functions are inline so kernels can use them
 * on their tails; the vector helpers are for the kernels' AVX2 and AVX-512 bodies.
 */
#ifndef TR_KERNELS_CPU_HALF_H
#define TR_KERNELS_CPU_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a kernel writes beside its fp32 result: nothing, an fp16 copy or a bf16 copy. */
typedef enum tr_half_kind {
    TR_HALF_NONE = 0,
    TR_HALF_FP16 = 1,
    TR_HALF_BF16 = 2,
} tr_half_kind_t;

static inline uint32_t tr__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float tr__f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* fp32 -> bf16: add 0x7fff plus the lowest kept bit, then truncate (ties go to even). */
static inline uint16_t tr_bf16_from_float(float f)
{
    uint32_t u = tr__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* NaN: set the quiet bit */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float tr_bf16_to_float(uint16_t h)
{
    return tr__f32_from_bits((uint32_t)h << 16);
}

/* fp32 -> fp16. Normal results: rebias the exponent and round the 13 dropped mantissa bits
 * with +0xfff plus the lowest kept bit (a carry into the exponent reaches Inf correctly).
 * Subnormal results: adding 0.5 (2^-1) aligns the 10 mantissa bits at the bottom of a
 * float's mantissa, and the FPU's own round-to-nearest-even does the rounding. */
static inline uint16_t tr_half_from_float(float f)
{
    uint32_t u = tr__f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    if (u >= 0x47800000u) { /* >= 65536, Inf or NaN */
        if (u > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
        return (uint16_t)(sign | 0x7c00u);
    }
    if (u < 0x38800000u) { /* below 2^-14: fp16 subnormal or zero */
        float denorm = tr__f32_from_bits(u) + 0.5f;
        return (uint16_t)(sign | (tr__f32_bits(denorm) - 0x3f000000u));
    }
    uint32_t odd = (u >> 13) & 1u;
    u += 0xc8000fffu + odd; /* (15 - 127) << 23, plus rounding; wraps modulo 2^32 */
    return (uint16_t)(sign | (u >> 13));
}

static inline float tr_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in fp32 */
        float mag = (float)mant * 0x1p-24f;
        return tr__f32_from_bits(sign | tr__f32_bits(mag));
    }
    if (exp == 31) return tr__f32_from_bits(sign | 0x7f800000u | (mant << 13));
    return tr__f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* Converts n floats to `kind` (FP16 or BF16) into dst, with the current ISA, over the
 * kernels' thread pool. Any thread. */
void tr_half_from_float_array(uint16_t *dst, const float *src, size_t n, tr_half_kind_t kind);

/* The same on the calling thread alone (inside a task of the thread pool). */
void tr__half_from_float_serial(uint16_t *dst, const float *src, size_t n, tr_half_kind_t kind);

/* Converts n halves of `kind` to floats. Any thread. */
void tr_half_to_float_array(float *dst, const uint16_t *src, size_t n, tr_half_kind_t kind);

#ifdef __cplusplus
}
#endif

/* ---- vector helpers for kernels (x86-64 only; each inlines into a caller of its target) */
#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline __m256i
tr__bf16_from_ps512(__m512 x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i round = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, round), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline __m256i
tr__fp16_from_ps512(__m512 x)
{
    return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m128i
tr__bf16_from_ps256(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i round = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, round), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m128i
tr__fp16_from_ps256(__m256 x)
{
    return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
#endif

#endif
