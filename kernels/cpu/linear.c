/* linear.c: the fully connected layer, out = inp weight^T + bias, on oneDNN's (or OpenBLAS's)
 * sgemm (kernels/cpu/gemm.c says which).
 *
 * inp (N, C), weight (OC, C) as PyTorch and llm.c store it, bias (OC), out (N, OC).
 * Forward is one matrix product with the bias pre-broadcast into out; backward is two (into
 * the input, into the weight) and a column sum for the bias, split over column blocks. The
 * fused variants (ops.h) do the elementwise pass that follows a product (a residual add, a
 * GELU, a GELU's backward) on each row block right after the thread computes it, while the
 * block is in its cache, instead of as a pass of its own over the whole output.
 *
 * Threads: every product is split into row blocks of its output, one per pool thread, each a
 * single-threaded library call, so the kernels' thread pool is the only set of threads
 * working. Left multi-threaded, OpenBLAS's own threads spin (sched_yield) between calls and
 * fight the pool's threads for the cores during every non-GEMM op: measured on the GPT-2
 * benchmark, 17% of cycles went to sched_yield and a step took 590 ms instead of 522 ms.
 * So the first product sets OpenBLAS to one thread (process-wide: a program that wants
 * OpenBLAS threads for its own calls sets them back; the kernels set 1 again when they run).
 */
#include "kernels/cpu/ops.h"

#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/blas_internal.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec.h"

typedef struct {
    float *dbias;      // (OC)
    const float *dout; // (N, OC)
    int N, OC;
} bias_job;

#define BIAS_BLOCK 256

/* C (M, N) = op(A) op(B) + beta C, split over row blocks of C on the thread pool; each
 * block is one single-threaded call (tr__sgemm, or tr__gemm_bf16 on the bf16 copies Ah, Bh),
 * and what is fused into the product (gemm_fuse) is done on the block right after it, while
 * the block is in the thread's cache. */
typedef struct {
    const float *bias;     /* (N): copied into each of the block's rows of C first (then beta 1) */
    const float *residual; /* (M, N): added to C after the product */
    float *gelu_out;       /* (M, N): GELU(C), after the residual */
    const float *gelu_pre; /* (M, N): C multiplied by GELU'(gelu_pre) */
} gemm_fuse;

typedef struct {
    int ta, tb, M, N, K, lda, ldb, ldc;
    float beta;
    int backend; /* TR__GEMM_*, or TR__BF16_* when Ah and Bh are set */
    const float *A, *B;
    const uint16_t *Ah, *Bh;
    float *C;
    gemm_fuse f; /* its matrices have C's shape and row stride */
} gemm_job;

#define GEMM_ROWS 64

static void fused_after(const gemm_job *g, float *C, size_t row0, int rows)
{
    const tr__vec_ops_t *v = tr__vec();
    size_t off = row0 * (size_t)g->ldc;
    for (int r = 0; r < rows; r++, off += (size_t)g->ldc, C += g->ldc) {
        if (g->f.residual) v->acc(C, g->f.residual + off, (size_t)g->N);
        if (g->f.gelu_out) v->gelu_fwd(g->f.gelu_out + off, C, (size_t)g->N);
        if (g->f.gelu_pre) v->gelu_mul(C, g->f.gelu_pre + off, (size_t)g->N);
    }
}

static void gemm_rows(void *ctx, size_t begin, size_t end, int thread)
{
    const gemm_job *g = ctx;
    int m0 = (int)begin * GEMM_ROWS, m1 = (int)end * GEMM_ROWS < g->M ? (int)end * GEMM_ROWS : g->M;
    size_t a0 = g->ta ? (size_t)m0 : (size_t)m0 * g->lda;
    float *C = g->C + (size_t)m0 * g->ldc;
    /* the bias into the block's rows, in its cache just before the product adds to them */
    for (int r = 0; g->f.bias && r < m1 - m0; r++)
        memcpy(C + (size_t)r * g->ldc, g->f.bias, (size_t)g->N * sizeof(float));
    if (g->Ah)
        tr__gemm_bf16(g->backend, g->ta, g->tb, m1 - m0, g->N, g->K, g->Ah + a0, g->lda, g->Bh,
                      g->ldb, g->beta, C, g->ldc);
    else
        tr__sgemm(g->backend, g->ta, g->tb, m1 - m0, g->N, g->K, 1.0f, g->A + a0, g->lda, g->B,
                  g->ldb, g->beta, C, g->ldc);
    if (g->f.residual || g->f.gelu_out || g->f.gelu_pre) fused_after(g, C, (size_t)m0, m1 - m0);
}

static void run_gemm(gemm_job *g)
{
    size_t blocks = ((size_t)g->M + GEMM_ROWS - 1) / GEMM_ROWS;
    int t = tr_parallel_threads();
    tr_parallel_for(blocks, (blocks + t - 1) / t, gemm_rows, g);
}

/* Ah and Bh set: the bf16 product of them (A and B unread); else the fp32 one of A and B. */
static void gemm(int ta, int tb, int M, int N, int K, const float *A, const uint16_t *Ah, int lda,
                 const float *B, const uint16_t *Bh, int ldb, float beta, float *C, int ldc,
                 gemm_fuse f)
{
    gemm_job g = {.ta = ta,
                  .tb = tb,
                  .M = M,
                  .N = N,
                  .K = K,
                  .lda = lda,
                  .ldb = ldb,
                  .ldc = ldc,
                  .beta = f.bias ? 1.0f : beta,
                  .backend = Ah ? tr__bf16_backend() : tr__gemm_backend(),
                  .A = A,
                  .B = B,
                  .Ah = Ah,
                  .Bh = Bh,
                  .C = C,
                  .f = f};
    run_gemm(&g);
}

/* bf16 products round their fp32 operands (activations, gradients) into the calling thread's
 * two arenas, grown on first use and kept for the thread's next calls. */
typedef struct {
    uint16_t *p[2];
    size_t cap[2];
} arena_t;

static pthread_key_t arena_key;
static pthread_once_t arena_once = PTHREAD_ONCE_INIT;
static _Thread_local arena_t *arena;

static void arena_free(void *p)
{
    arena_t *a = p;
    free(a->p[0]);
    free(a->p[1]);
    free(a);
}

static void arena_init(void)
{
    pthread_key_create(&arena_key, arena_free);
}

/* src (n floats) as bf16 in arena `which`; NULL without memory. */
static const uint16_t *to_bf16(int which, const float *src, size_t n)
{
    if (!arena) {
        pthread_once(&arena_once, arena_init);
        if (!(arena = calloc(1, sizeof(*arena)))) return NULL;
        pthread_setspecific(arena_key, arena);
    }
    if (n > arena->cap[which]) {
        uint16_t *p = realloc(arena->p[which], n * sizeof(uint16_t));
        if (!p) return NULL;
        arena->p[which] = p;
        arena->cap[which] = n;
    }
    tr_half_from_float_array(arena->p[which], src, n, TR_HALF_BF16);
    return arena->p[which];
}

/* Without memory for the rounded operands, the product runs in fp32 (said once). */
void tr__bf16_fallback_warning(void)
{
    static atomic_flag warned = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&warned))
        fprintf(stderr, "troupe: warning: no memory for bf16 operands; products run in fp32\n");
}

static void bias_columns(void *ctx, size_t begin, size_t end, int thread)
{
    const bias_job *j = ctx;
    const tr__vec_ops_t *v = tr__vec();
    for (size_t blk = begin; blk < end; blk++) {
        size_t j0 = blk * BIAS_BLOCK, len = (size_t)j->OC - j0;
        len = len < BIAS_BLOCK ? len : BIAS_BLOCK;
        for (int r = 0; r < j->N; r++)
            v->acc(j->dbias + j0, j->dout + (size_t)r * j->OC + j0, len);
    }
}

void tr__linear_forward_fused(float *out, float *gelu_out, const float *inp, const float *weight,
                              const uint16_t *weight_bf16, const float *bias, const float *residual,
                              int N, int C, int OC)
{
    // out (N, OC) = inp (N, C) @ weight^T (C, OC) [+ bias (OC), copied into out's rows first]
    // [+ residual (N, OC)]; gelu_out (N, OC) = GELU(out)
    const uint16_t *x = weight_bf16 ? to_bf16(0, inp, (size_t)N * C) : NULL;
    if (weight_bf16 && !x) tr__bf16_fallback_warning();
    gemm(0, 1, N, OC, C, inp, x, C, weight, x ? weight_bf16 : NULL, C, 0.0f, out, OC,
         (gemm_fuse){.bias = bias, .residual = residual, .gelu_out = gelu_out});
}

void tr__linear_forward(float *out, const float *inp, const float *weight,
                        const uint16_t *weight_bf16, const float *bias, int N, int C, int OC)
{
    tr__linear_forward_fused(out, NULL, inp, weight, weight_bf16, bias, NULL, N, C, OC);
}

/* dout rounded to bf16 for a product with weight_bf16 (NULL: fp32, said once without memory). */
static const uint16_t *dout_bf16(const float *dout, const uint16_t *weight_bf16, size_t n)
{
    if (!weight_bf16) return NULL;
    const uint16_t *dy = to_bf16(0, dout, n);
    if (!dy) tr__bf16_fallback_warning();
    return dy;
}

/* The backward's products: dinp (N, C) = dout weight (written, or added to with accumulate;
 * times GELU'(gelu_pre) when set), dweight (OC, C) += dout^T inp, dbias (OC) += column sums of
 * dout; each of dinp, dweight, dbias may be NULL. In bf16 the gradient is rounded once for
 * both products. */
static void backward(float *dinp, bool accumulate, const float *gelu_pre, float *dweight,
                     float *dbias, const float *dout, const float *inp, const float *weight,
                     const uint16_t *weight_bf16, int N, int C, int OC)
{
    const uint16_t *dy = dout_bf16(dout, weight_bf16, (size_t)N * OC), *x = NULL;
    /* without memory for inp's copy only the weight's product runs in fp32, as it would in a
     * split backward's weight part */
    const uint16_t *dyw = dy;
    if (dy && dweight && !(x = to_bf16(1, inp, (size_t)N * C))) {
        tr__bf16_fallback_warning();
        dyw = NULL;
    }
    // dinp (N, C) [+]= dout (N, OC) @ weight (OC, C) [* GELU'(gelu_pre (N, C))]
    if (dinp)
        gemm(0, 0, N, C, OC, dout, dy, OC, weight, dy ? weight_bf16 : NULL, C,
             accumulate ? 1.0f : 0.0f, dinp, C, (gemm_fuse){.gelu_pre = gelu_pre});
    // dweight (OC, C) += dout^T (OC, N) @ inp (N, C)
    if (dweight)
        gemm(1, 0, OC, C, N, dout, dyw, OC, inp, dyw ? x : NULL, C, 1.0f, dweight, C,
             (gemm_fuse){0});
    if (dbias) {
        bias_job j = {dbias, dout, N, OC};
        tr_parallel_for(((size_t)OC + BIAS_BLOCK - 1) / BIAS_BLOCK, 1, bias_columns, &j);
    }
}

void tr__linear_backward_input(float *dinp, const float *dout, const float *weight,
                               const uint16_t *weight_bf16, const float *gelu_pre, int N, int C,
                               int OC)
{
    backward(dinp, false, gelu_pre, NULL, NULL, dout, NULL, weight, weight_bf16, N, C, OC);
}

void tr__linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, const uint16_t *weight_bf16, int N,
                         int C, int OC)
{
    backward(dinp, true, NULL, dweight, dbias, dout, inp, weight, weight_bf16, N, C, OC);
}

void tr__linear_backward_both(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, const uint16_t *weight_bf16,
                              const float *gelu_pre, int N, int C, int OC)
{
    backward(dinp, false, gelu_pre, dweight, dbias, dout, inp, weight, weight_bf16, N, C, OC);
}
