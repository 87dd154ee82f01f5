/* Helpers shared by the kernel tests: a seeded generator, random arrays, ISA loops and
 * tolerance checks that name the element that failed. */
#ifndef TR_TESTS_KERNELS_KERNEL_TESTING_H
#define TR_TESTS_KERNELS_KERNEL_TESTING_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/isa.h"

/* xorshift64*: reproducible across platforms, unlike rand(). */
static inline uint64_t kt_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* Uniform in [lo, hi). */
static inline float kt_uniform(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((kt_next(s) >> 40) * 0x1p-24);
}

static inline float *kt_random(uint64_t *s, size_t n, float lo, float hi)
{
    float *a = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        a[i] = kt_uniform(s, lo, hi);
    return a;
}

static inline float *kt_copy(const float *a, size_t n)
{
    float *b = malloc((n ? n : 1) * sizeof(float));
    memcpy(b, a, n * sizeof(float));
    return b;
}

/* Index of the first element where a and b differ bitwise, or n. */
static inline size_t kt_first_diff(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
    return n;
}

/* 1 when |a[i] − b[i]| <= rel·scale[i] + abs for all i; prints the first failure. */
static inline int kt_close(const char *what, const float *a, const float *b, const float *scale,
                           size_t n, double rel, double abs_tol)
{
    for (size_t i = 0; i < n; i++) {
        double s = scale ? fabs((double)scale[i]) : fabs((double)b[i]);
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= rel * s + abs_tol)) {
            printf("%s[%zu]: %.9g vs %.9g (diff %.3g, allowed %.3g)\n", what, i, a[i], b[i], d,
                   rel * s + abs_tol);
            return 0;
        }
    }
    return 1;
}

/* The vector ISAs this CPU has, highest first; returns how many (0 on a scalar-only CPU). */
static inline int kt_vector_isas(tr_isa_t out[2])
{
    int k = 0;
    for (int isa = tr__isa_best(); isa > TR_ISA_SCALAR; isa--)
        out[k++] = (tr_isa_t)isa;
    return k;
}

#endif
