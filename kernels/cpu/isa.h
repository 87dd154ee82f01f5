/* isa: which instruction set the CPU kernels use, chosen once at run time.
 *
 * Kernels are compiled for several targets in the same binary (scalar C, AVX2+FMA+F16C,
 * AVX-512 F/BW/VL) and pick one per call with tr__isa_get(). The choice is the best the
 * CPU supports, unless the environment variable TR_KERNELS_ISA (scalar|avx2|avx512) or
 * tr__isa_set() asks for a lower one, so tests can compare the paths on one machine.
 */
#ifndef TR_KERNELS_CPU_ISA_H
#define TR_KERNELS_CPU_ISA_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tr_isa {
    TR_ISA_SCALAR = 0, /* portable C, no FMA contraction */
    TR_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    TR_ISA_AVX512 = 2, /* AVX-512 F, BW, VL */
} tr_isa_t;

/* The instruction set kernels use now. Any thread. */
tr_isa_t tr__isa_get(void);

/* The best instruction set this CPU supports. Any thread. */
tr_isa_t tr__isa_best(void);

/* Forces kernels to `isa`, lowered to the best supported one; returns the one in effect.
 * Not while a kernel runs on another thread (it would switch mid-array). Any thread. */
tr_isa_t tr__isa_set(tr_isa_t isa);

/* "scalar", "avx2" or "avx512". */
const char *tr__isa_name(tr_isa_t isa);

/* Defines `static void NAME(void *ctx, size_t b, size_t e, int thread)`, a tr__parallel_for
 * range that runs SCALAR, AVX2 or AVX512 (each `void f(const JOB *, size_t b, size_t e)`)
 * by tr__isa_get(); off x86 only SCALAR exists. */
#if defined(__x86_64__)
#define TR__ISA_RANGE(NAME, JOB, SCALAR, AVX2, AVX512)                                             \
    static void NAME(void *ctx, size_t b, size_t e, int thread)                                    \
    {                                                                                              \
        const JOB *j = ctx;                                                                        \
        switch (tr__isa_get()) {                                                                   \
        case TR_ISA_AVX512:                                                                        \
            AVX512(j, b, e);                                                                       \
            return;                                                                                \
        case TR_ISA_AVX2:                                                                          \
            AVX2(j, b, e);                                                                         \
            return;                                                                                \
        default:                                                                                   \
            SCALAR(j, b, e);                                                                       \
            return;                                                                                \
        }                                                                                          \
    }
#else
#define TR__ISA_RANGE(NAME, JOB, SCALAR, AVX2, AVX512)                                             \
    static void NAME(void *ctx, size_t b, size_t e, int thread)                                    \
    {                                                                                              \
        SCALAR((const JOB *)ctx, b, e);                                                            \
    }
#endif

#ifdef __cplusplus
}
#endif
#endif
