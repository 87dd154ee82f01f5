/* layernorm.c: layer normalisation over the channels of each row, eps 1e-5 (GPT-2's).
 *
 * inp, out (N, C); weight, bias (C); mean, rstd (N) are kept for backward. Forward runs rows
 * in parallel. Backward also runs rows in parallel for the input gradient, but accumulates
 * dweight and dbias, which every row touches, in a second pass split over column blocks so
 * no two threads write the same float (no atomics, no per-thread copies).
 */
#include "kernels/cpu/ops.h"

#include <math.h>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec.h"

#define LN_EPS    1e-5f
#define COL_BLOCK 128

typedef struct {
    float *out, *mean, *rstd, *dinp, *dweight, *dbias;
    const float *inp, *weight, *bias, *dout, *cmean, *crstd;
    int N, C;
} ln_job;

static void forward_rows(void *ctx, size_t begin, size_t end, int thread)
{
    const ln_job *j = ctx;
    const tr__vec_ops_t *v = tr__vec();
    for (size_t r = begin; r < end; r++) {
        const float *x = j->inp + r * j->C; // (C)
        float m = v->sum(x, j->C) / j->C;
        float var = v->sqdev(x, m, j->C) / j->C;
        float s = 1.0f / sqrtf(var + LN_EPS);
        v->ln_row(j->out + r * j->C, x, j->weight, j->bias, m, s, j->C);
        j->mean[r] = m;
        j->rstd[r] = s;
    }
}

void tr__layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int N, int C)
{
    ln_job j = {.out = out,
                .mean = mean,
                .rstd = rstd,
                .inp = inp,
                .weight = weight,
                .bias = bias,
                .N = N,
                .C = C};
    tr_parallel_for(N, 16, forward_rows, &j);
}

// dinp += rstd (g - mean(g) - xhat mean(g xhat)), g = weight dout, per row
static void backward_rows(void *ctx, size_t begin, size_t end, int thread)
{
    const ln_job *j = ctx;
    const tr__vec_ops_t *v = tr__vec();
    for (size_t r = begin; r < end; r++) {
        size_t o = r * j->C;
        float m = j->cmean[r], s = j->crstd[r], sg, sgx;
        v->ln_bwd_sums(j->dout + o, j->inp + o, j->weight, m, s, j->C, &sg, &sgx);
        float a = sg / j->C, c = sgx / j->C;
        v->ln_bwd_row(j->dinp + o, j->dout + o, j->inp + o, j->weight, m, s, a, c, j->C);
    }
}

// dweight += sum_rows xhat dout, dbias += sum_rows dout, over one block of columns
static void backward_params(void *ctx, size_t begin, size_t end, int thread)
{
    const ln_job *j = ctx;
    const tr__vec_ops_t *v = tr__vec();
    for (size_t blk = begin; blk < end; blk++) {
        size_t c0 = blk * COL_BLOCK,
               len = (size_t)j->C - c0 < COL_BLOCK ? (size_t)j->C - c0 : COL_BLOCK;
        for (int r = 0; r < j->N; r++) {
            size_t o = (size_t)r * j->C + c0;
            v->ln_bwd_params(j->dweight + c0, j->dbias + c0, j->dout + o, j->inp + o, j->cmean[r],
                             j->crstd[r], len);
        }
    }
}

void tr__layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int N, int C)
{
    ln_job j = {.dinp = dinp,
                .dweight = dweight,
                .dbias = dbias,
                .inp = inp,
                .weight = weight,
                .dout = dout,
                .cmean = mean,
                .crstd = rstd,
                .N = N,
                .C = C};
    if (dinp) tr_parallel_for(N, 16, backward_rows, &j);
    if (dweight) tr_parallel_for(((size_t)C + COL_BLOCK - 1) / COL_BLOCK, 1, backward_params, &j);
}
