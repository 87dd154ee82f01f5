/* vec.c: instantiates the vector primitives of vec_impl.h for scalar, AVX2 and AVX-512, and
 * picks one at run time.
 *
 * The AVX variants are compiled under `#pragma GCC target`, so the library itself needs no
 * global -mavx flags and runs on any x86-64; they are only called when __builtin_cpu_supports
 * says the CPU has the instructions. The selected table is published once with a relaxed
 * atomic pointer: every table is a constant, so any thread seeing any pointer is safe.
 */
#include "kernels/cpu/vec.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "troupe/error.h"

/* ---- scalar: W = 1 ------------------------------------------------------------------------ */

static inline float s_exp2i(float k)
{
    union {
        unsigned u;
        float f;
    } v = {.u = (unsigned)((int)k + 127) << 23};
    return v.f;
}

#define W               1
#define VT              float
#define P(name)         scalar_##name
#define LD(p)           (*(p))
#define ST(p, v)        (*(p) = (v))
#define LDT(p, k, fill) ((void)(k), (void)(fill), *(p))
#define STT(p, v, k)    ((void)(k), *(p) = (v))
#define SET1(x)         (x)
#define ADD(a, b)       ((a) + (b))
#define SUB(a, b)       ((a) - (b))
#define MUL(a, b)       ((a) * (b))
#define DIV(a, b)       ((a) / (b))
#define FMA(a, b, c)    ((a) * (b) + (c))
#define VMAX(a, b)      fmaxf(a, b)
#define VMIN(a, b)      fminf(a, b)
#define HSUM(v)         (v)
#define HMAX(v)         (v)
#define EXP2I(v)        s_exp2i(v)
#define ROUND(v)        rintf(v)
#define ABS(v)          fabsf(v)
#define COPYSIGN(m, s)  copysignf(m, s)
#include "kernels/cpu/vec_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TR_VEC_X86 1

/* ---- AVX2 + FMA: W = 8 -------------------------------------------------------------------- */
#pragma GCC push_options
#pragma GCC target("avx2,fma")

static inline __m256i a2_mask(size_t k)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline __m256 a2_ldt(const float *p, size_t k, float fill)
{
    __m256i m = a2_mask(k);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
}
static inline float a2_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float a2_hmax(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline __m256 a2_exp2i(__m256 k)
{
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
static inline __m256 a2_abs(__m256 v)
{
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}
static inline __m256 a2_copysign(__m256 m, __m256 s)
{
    __m256 sign = _mm256_set1_ps(-0.0f);
    return _mm256_or_ps(_mm256_andnot_ps(sign, m), _mm256_and_ps(sign, s));
}

#define W               8
#define VT              __m256
#define P(name)         avx2_##name
#define LD(p)           _mm256_loadu_ps(p)
#define ST(p, v)        _mm256_storeu_ps(p, v)
#define LDT(p, k, fill) a2_ldt(p, k, fill)
#define STT(p, v, k)    _mm256_maskstore_ps(p, a2_mask(k), v)
#define SET1(x)         _mm256_set1_ps(x)
#define ADD             _mm256_add_ps
#define SUB             _mm256_sub_ps
#define MUL             _mm256_mul_ps
#define DIV             _mm256_div_ps
#define FMA             _mm256_fmadd_ps
#define VMAX            _mm256_max_ps
#define VMIN            _mm256_min_ps
#define HSUM            a2_hsum
#define HMAX            a2_hmax
#define EXP2I           a2_exp2i
#define ROUND(v)        _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define ABS             a2_abs
#define COPYSIGN        a2_copysign
#include "kernels/cpu/vec_impl.h"
#pragma GCC pop_options

/* ---- AVX-512F: W = 16 --------------------------------------------------------------------- */
#pragma GCC push_options
#pragma GCC target("avx512f")

static inline __mmask16 a5_mask(size_t k)
{
    return (__mmask16)((1u << k) - 1u);
}
static inline __m512 a5_exp2i(__m512 k)
{
    __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
}
static inline __m512 a5_abs(__m512 v)
{
    return _mm512_castsi512_ps(
        _mm512_and_epi32(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
}
static inline __m512 a5_copysign(__m512 m, __m512 s)
{
    __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512i mag = _mm512_andnot_epi32(sign, _mm512_castps_si512(m));
    return _mm512_castsi512_ps(
        _mm512_or_epi32(mag, _mm512_and_epi32(sign, _mm512_castps_si512(s))));
}

#define W               16
#define VT              __m512
#define P(name)         avx512_##name
#define LD(p)           _mm512_loadu_ps(p)
#define ST(p, v)        _mm512_storeu_ps(p, v)
#define LDT(p, k, fill) _mm512_mask_loadu_ps(_mm512_set1_ps(fill), a5_mask(k), p)
#define STT(p, v, k)    _mm512_mask_storeu_ps(p, a5_mask(k), v)
#define SET1(x)         _mm512_set1_ps(x)
#define ADD             _mm512_add_ps
#define SUB             _mm512_sub_ps
#define MUL             _mm512_mul_ps
#define DIV             _mm512_div_ps
#define FMA             _mm512_fmadd_ps
#define VMAX            _mm512_max_ps
#define VMIN            _mm512_min_ps
#define HSUM            _mm512_reduce_add_ps
#define HMAX            _mm512_reduce_max_ps
#define EXP2I           a5_exp2i
#define ROUND(v)        _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define ABS             a5_abs
#define COPYSIGN        a5_copysign
#include "kernels/cpu/vec_impl.h"
#pragma GCC pop_options
#endif /* x86 */

/* ---- dispatch ----------------------------------------------------------------------------- */

static _Atomic(const tr__vec_ops_t *) selected;
static _Atomic int selected_isa = -1;

tr__isa_t tr__vec_best_isa(void)
{
#ifdef TR_VEC_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return TR__ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return TR__ISA_AVX2;
#endif
    return TR__ISA_SCALAR;
}

const char *tr__vec_isa_name(tr__isa_t isa)
{
    static const char *names[] = {"scalar", "avx2", "avx512"};
    return isa >= 0 && isa <= TR__ISA_AVX512 ? names[isa] : "unknown";
}

static const tr__vec_ops_t *table(tr__isa_t isa)
{
#ifdef TR_VEC_X86
    if (isa == TR__ISA_AVX512) return &avx512_ops;
    if (isa == TR__ISA_AVX2) return &avx2_ops;
#endif
    return &scalar_ops;
}

int tr__vec_set_isa(tr__isa_t isa)
{
    if (isa < TR__ISA_SCALAR || isa > tr__vec_best_isa()) return TR_ENOTSUP;
    atomic_store_explicit(&selected_isa, (int)isa, memory_order_relaxed);
    atomic_store_explicit(&selected, table(isa), memory_order_relaxed);
    return 0;
}

static void select_default(void)
{
    tr__isa_t isa = tr__vec_best_isa();
    const char *env = getenv("TR_CPU_ISA");
    for (int i = TR__ISA_SCALAR; env && i <= TR__ISA_AVX512; i++)
        if (strcmp(env, tr__vec_isa_name(i)) == 0 && i <= (int)isa) isa = i;
    tr__vec_set_isa(isa);
}

const tr__vec_ops_t *tr__vec(void)
{
    const tr__vec_ops_t *ops = atomic_load_explicit(&selected, memory_order_relaxed);
    if (!ops) {
        select_default();
        ops = atomic_load_explicit(&selected, memory_order_relaxed);
    }
    return ops;
}

tr__isa_t tr__vec_isa(void)
{
    tr__vec();
    return atomic_load_explicit(&selected_isa, memory_order_relaxed);
}
