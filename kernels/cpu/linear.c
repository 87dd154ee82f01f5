/* linear.c: the fully connected layer, out = inp weight^T + bias, on oneDNN's (or OpenBLAS's)
 * sgemm (kernels/cpu/gemm.c says which).
 *
 * inp (N, C), weight (OC, C) as PyTorch and llm.c store it, bias (OC), out (N, OC).
 * Forward is one matrix product with the bias pre-broadcast into out; backward is two (into
 * the input, into the weight) and a column sum for the bias, split over column blocks.
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
#include <string.h>

#include "kernels/cpu/blas_internal.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec.h"

typedef struct {
    float *dbias;      // (OC)
    const float *dout; // (N, OC)
    int N, OC;
} bias_job;

#define BIAS_BLOCK 256

/* C (M, N) = alpha op(A) op(B) + beta C, split over row blocks of C on the thread pool; each
 * block is one single-threaded call (tr__sgemm). */
typedef struct {
    int ta, tb, M, N, K, lda, ldb, ldc;
    float alpha, beta;
    int backend; /* TR__GEMM_* */
    const float *A, *B;
    float *C;
} gemm_job;

#define GEMM_ROWS 64

static void gemm_rows(void *ctx, size_t begin, size_t end, int thread)
{
    const gemm_job *g = ctx;
    int m0 = (int)begin * GEMM_ROWS, m1 = (int)end * GEMM_ROWS < g->M ? (int)end * GEMM_ROWS : g->M;
    const float *A = g->ta ? g->A + m0 : g->A + (size_t)m0 * g->lda;
    tr__sgemm(g->backend, g->ta, g->tb, m1 - m0, g->N, g->K, g->alpha, A, g->lda, g->B, g->ldb,
              g->beta, g->C + (size_t)m0 * g->ldc, g->ldc);
}

static void gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc)
{
    gemm_job g = {ta, tb, M, N, K, lda, ldb, ldc, alpha, beta, tr__gemm_backend(), A, B, C};
    size_t blocks = ((size_t)M + GEMM_ROWS - 1) / GEMM_ROWS;
    int t = tr_parallel_threads();
    tr_parallel_for(blocks, (blocks + t - 1) / t, gemm_rows, &g);
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

void tr__linear_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                        int C, int OC)
{
    // out (N, OC) = inp (N, C) @ weight^T (C, OC) [+ bias (OC)]
    if (bias)
        for (int r = 0; r < N; r++)
            memcpy(out + (size_t)r * OC, bias, (size_t)OC * sizeof(float));
    gemm(0, 1, N, OC, C, 1.0f, inp, C, weight, C, bias ? 1.0f : 0.0f, out, OC);
}

void tr__linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int N, int C, int OC)
{
    // dinp (N, C) += dout (N, OC) @ weight (OC, C)
    if (dinp) gemm(0, 0, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    // dweight (OC, C) += dout^T (OC, N) @ inp (N, C)
    if (dweight) gemm(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) {
        bias_job j = {dbias, dout, N, OC};
        tr_parallel_for(((size_t)OC + BIAS_BLOCK - 1) / BIAS_BLOCK, 1, bias_columns, &j);
    }
}
