/* blas_internal: the pieces of the BLAS check that tests drive with made-up CPUs and cores. */
#ifndef TR_KERNELS_CPU_BLAS_INTERNAL_H
#define TR_KERNELS_CPU_BLAS_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "troupe/blas.h"

typedef struct {
    int cls;  /* 0 sse, 1 avx, 2 avx2 + fma, 3 avx512 (F BW VL DQ CD) */
    int bf16; /* AVX-512 BF16 */
    int amd;
} tr__blas_cpu_t;

/* This CPU's features. */
void tr__blas_cpu(tr__blas_cpu_t *cpu);

/* The vector class of an OpenBLAS core name (unknown names: 0). */
int tr__blas_core_class(const char *core);

/* Fills info for OpenBLAS having chosen core (with config) on cpu. */
void tr__blas_assess(tr_blas_info_t *info, const char *core, const char *config,
                     const tr__blas_cpu_t *cpu);

/* Sets OpenBLAS to one thread unless it already is: the kernels split matrix products over
 * their own pool (see kernels/cpu/linear.c). Call before a parallel region that calls BLAS. */
void tr__blas_one_thread(void);

/* gemm.c: the matrix-product libraries, and one single-threaded row-major product on one of
 * them. The linear layers use tr__gemm_backend(): by CPU (gemm.c's table), or TROUPE_GEMM. */
enum { TR__GEMM_OPENBLAS = 0, TR__GEMM_ONEDNN = 1 };
int tr__gemm_backend(void);
/* What an override variable names: 0 for name0, 1 for name1; dflt when unset, and dflt with a
 * warning on stderr when it names neither. */
int tr__gemm_choice(const char *var, const char *name0, const char *name1, int dflt);
const char *tr__gemm_backend_name(int backend);
void tr__sgemm(int backend, int ta, int tb, int M, int N, int K, float alpha, const float *A,
               int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* Holds oneDNN's OpenMP to one thread on the calling thread (once per thread). */
void tr__onednn_one_thread(void);

/* gemm_bf16.c: one single-threaded row-major product of bf16 matrices (uint16_t, the top half
 * of fp32) accumulated in fp32: C = op(A) op(B) + beta C. On oneDNN's bf16 matmul where the CPU
 * has AVX512-BF16 (tr_bf16_native), else emulated (widened to fp32); TROUPE_BF16_GEMM=onednn or
 * emulated overrides. Never fails: without memory it falls back to plain loops. */
enum { TR__BF16_EMULATED = 0, TR__BF16_ONEDNN = 1 };
int tr__bf16_backend(void);
const char *tr__bf16_backend_name(int backend);
void tr__gemm_bf16(int backend, int ta, int tb, int M, int N, int K, const uint16_t *A, int lda,
                   const uint16_t *B, int ldb, float beta, float *C, int ldc);
/* The same product of fp32 matrices on a cached oneDNN matmul primitive (per thread and shape,
 * as above): for many small products of a few shapes (attention's per head), where
 * dnnl_sgemm's per-call set-up costs. False when oneDNN cannot run it (the caller uses
 * tr__sgemm). */
bool tr__gemm_f32_onednn(int ta, int tb, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc);

/* Prints the warning to stderr, once per process, if OpenBLAS runs slow kernels: the library's
 * start-up warning when it is embedded in a program that cannot re-exec (tr_model_create
 * calls it). Any thread. */
void tr__blas_warn_once(void);

#endif
