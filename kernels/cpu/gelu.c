/* gelu.c: GELU with the tanh approximation (GPT-2's), elementwise over n floats.
 *
 * The vector primitives do the math (vec.h: tanh from a polynomial exp); this file splits
 * the range over the thread pool in cache-sized chunks.
 */
#include "kernels/cpu/ops.h"

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec.h"

#define CHUNK 4096

typedef struct {
    float *out;
    const float *inp, *dout;
    size_t n;
} gelu_job;

static void forward_chunk(void *ctx, size_t begin, size_t end, int thread)
{
    const gelu_job *j = ctx;
    size_t lo = begin * CHUNK, hi = end * CHUNK < j->n ? end * CHUNK : j->n;
    tr__vec()->gelu_fwd(j->out + lo, j->inp + lo, hi - lo);
}

void tr__gelu_forward(float *out, const float *inp, size_t n)
{
    // out, inp (n)
    gelu_job j = {out, inp, NULL, n};
    tr_parallel_for((n + CHUNK - 1) / CHUNK, 1, forward_chunk, &j);
}

static void backward_chunk(void *ctx, size_t begin, size_t end, int thread)
{
    const gelu_job *j = ctx;
    size_t lo = begin * CHUNK, hi = end * CHUNK < j->n ? end * CHUNK : j->n;
    tr__vec()->gelu_bwd(j->out + lo, j->inp + lo, j->dout + lo, hi - lo);
}

void tr__gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    // dinp, inp, dout (n)
    gelu_job j = {dinp, inp, dout, n};
    tr_parallel_for((n + CHUNK - 1) / CHUNK, 1, backward_chunk, &j);
}
