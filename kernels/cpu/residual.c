/* residual.c: the residual connection's backward (the gradient flows unchanged to both
 * inputs; db may be NULL when the caller routes b's gradient itself; the forward's add is done
 * on each block of the product before it: tr__linear_forward_fused). Elementwise over n floats,
 * split over the thread pool. And zeroing over the pool (tr__zero): the
 * backward's gradient buffers, 200+ MB a GPT-2 step, were one thread's memset while the
 * others waited.
 */
#include <string.h>

#include "kernels/cpu/ops.h"

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec.h"

#define CHUNK 8192

typedef struct {
    float *out, *out2;
    const float *a;
    size_t n;
} res_job;

static void backward_chunk(void *ctx, size_t begin, size_t end, int thread)
{
    const res_job *j = ctx;
    size_t lo = begin * CHUNK, hi = end * CHUNK < j->n ? end * CHUNK : j->n;
    tr__vec()->acc(j->out + lo, j->a + lo, hi - lo);
    if (j->out2) tr__vec()->acc(j->out2 + lo, j->a + lo, hi - lo);
}

void tr__residual_backward(float *da, float *db, const float *dout, size_t n)
{
    // da, db, dout (n)
    res_job j = {da, db, dout, n};
    tr_parallel_for((n + CHUNK - 1) / CHUNK, 1, backward_chunk, &j);
}

static void zero_chunk(void *ctx, size_t begin, size_t end, int thread)
{
    const res_job *j = ctx;
    size_t lo = begin * CHUNK, hi = end * CHUNK < j->n ? end * CHUNK : j->n;
    memset(j->out + lo, 0, (hi - lo) * sizeof(float));
}

void tr__zero(float *x, size_t n)
{
    res_job j = {x, NULL, NULL, n};
    tr_parallel_for((n + CHUNK - 1) / CHUNK, 8, zero_chunk, &j);
}
