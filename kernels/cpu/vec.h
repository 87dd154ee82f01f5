/* vec: the vectorised inner loops of the CPU kernels, with runtime dispatch.
 *
 * Each primitive exists three times: AVX-512 (avx512f), AVX2 (avx2 + fma) and scalar, all
 * built from one template (vec_impl.h) so the three compute the same thing. The best variant
 * this CPU supports is chosen on first use (__builtin_cpu_supports); TR_CPU_ISA=scalar|avx2|
 * avx512 in the environment, or tr__vec_set_isa(), forces one (tests compare them). Lengths
 * are arbitrary and pointers need no alignment: tails are handled with masked loads.
 * exp and tanh are polynomial approximations (Cephes expf: relative error ~2e-7).
 */
#ifndef TR_KERNELS_CPU_VEC_H
#define TR_KERNELS_CPU_VEC_H

#include <stddef.h>

typedef enum { TR__ISA_SCALAR = 0, TR__ISA_AVX2 = 1, TR__ISA_AVX512 = 2 } tr__isa_t;

typedef struct {
    float (*dot)(const float *a, const float *b, size_t n);
    float (*sum)(const float *x, size_t n);
    float (*max)(const float *x, size_t n);
    void (*axpy)(float a, const float *x, float *y, size_t n);         /* y += a x */
    void (*add)(float *out, const float *a, const float *b, size_t n); /* out = a + b */
    void (*acc)(float *y, const float *x, size_t n);                   /* y += x */
    void (*scale)(float *x, float s, size_t n);                        /* x *= s */
    float (*exp_sum)(float *out, const float *x, float m, size_t n);   /* out = e^(x-m); sum */
    float (*sqdev)(const float *x, float m, size_t n);                 /* sum (x-m)^2 */
    /* out = (x - m) s w + b */
    void (*ln_row)(float *out, const float *x, const float *w, const float *b, float m, float s,
                   size_t n);
    /* g = w dout, xh = (x - m) s: *sg = sum g, *sgx = sum g xh */
    void (*ln_bwd_sums)(const float *dout, const float *x, const float *w, float m, float s,
                        size_t n, float *sg, float *sgx);
    /* dx += s (g - a - xh c) */
    void (*ln_bwd_row)(float *dx, const float *dout, const float *x, const float *w, float m,
                       float s, float a, float c, size_t n);
    /* dw += xh dout; db += dout (any column range of a row) */
    void (*ln_bwd_params)(float *dw, float *db, const float *dout, const float *x, float m, float s,
                          size_t n);
    void (*gelu_fwd)(float *out, const float *x, size_t n);
    void (*gelu_bwd)(float *dx, const float *x, const float *dout, size_t n); /* dx += */
    void (*gelu_mul)(float *d, const float *x, size_t n);                     /* d = GELU'(x) d */
} tr__vec_ops_t;

/* The primitives for the selected ISA. Any thread. */
const tr__vec_ops_t *tr__vec(void);

/* The ISA tr__vec() uses. Any thread. */
tr__isa_t tr__vec_isa(void);

/* Forces an ISA (tests, benchmarks). TR_ENOTSUP if this CPU lacks it. Not while kernels run. */
int tr__vec_set_isa(tr__isa_t isa);

/* The best ISA this CPU supports, and a name for an ISA ("avx512"). Any thread. */
tr__isa_t tr__vec_best_isa(void);
const char *tr__vec_isa_name(tr__isa_t isa);

#endif
