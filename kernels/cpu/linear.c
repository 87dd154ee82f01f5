/* linear.c: the fully connected layer, out = inp weight^T + bias, on OpenBLAS sgemm.
 *
 * inp (N, C), weight (OC, C) as PyTorch and llm.c store it, bias (OC), out (N, OC).
 * Forward is one sgemm with the bias pre-broadcast into out; backward is two sgemms (into
 * the input, into the weight) and a column sum for the bias, split over column blocks.
 */
#include "kernels/cpu/ops.h"

#include <cblas.h>
#include <string.h>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec.h"

typedef struct {
    float *dbias;      // (OC)
    const float *dout; // (N, OC)
    int N, OC;
} bias_job;

#define BIAS_BLOCK 256

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

void tr__linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                        int N, int C, int OC)
{
    // out (N, OC) = inp (N, C) @ weight^T (C, OC) [+ bias (OC)]
    if (bias)
        for (int r = 0; r < N; r++)
            memcpy(out + (size_t)r * OC, bias, (size_t)OC * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C,
                bias ? 1.0f : 0.0f, out, OC);
}

void tr__linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int N, int C, int OC)
{
    // dinp (N, C) += dout (N, OC) @ weight (OC, C)
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight,
                    C, 1.0f, dinp, C);
    // dweight (OC, C) += dout^T (OC, N) @ inp (N, C)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                dweight, C);
    if (dbias) {
        bias_job j = {dbias, dout, N, OC};
        tr_parallel_for(((size_t)OC + BIAS_BLOCK - 1) / BIAS_BLOCK, 1, bias_columns, &j);
    }
}
