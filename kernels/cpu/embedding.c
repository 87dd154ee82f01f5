/* embedding.c: token + position embedding, out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
 *
 * tokens (B, T), wte (V, C), wpe (maxT, C) with T <= maxT, out (B, T, C). Forward checks
 * every token first (a token comes from user data, so a bad one is an error, not a crash).
 * Backward is serial: the same token may appear at many positions and its gradient row
 * accumulates from all of them; it is a small share of a step (B T C adds).
 */
#include "kernels/cpu/ops.h"

#include <string.h>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec.h"
#include "troupe/error.h"

typedef struct {
    float *out;
    const int *tokens;
    const float *wte, *wpe;
    int T, C;
} emb_job;

static void forward_rows(void *ctx, size_t begin, size_t end, int thread)
{
    const emb_job *j = ctx;
    const tr__vec_ops_t *v = tr__vec();
    for (size_t r = begin; r < end; r++) {
        const float *te = j->wte + (size_t)j->tokens[r] * j->C; // (C)
        float *o = j->out + r * j->C;                           // (C)
        if (j->wpe)
            v->add(o, te, j->wpe + (r % j->T) * j->C, j->C);
        else
            memcpy(o, te, (size_t)j->C * sizeof(float));
    }
}

int tr__embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe, int B,
                          int T, int C, int V)
{
    for (size_t i = 0; i < (size_t)B * T; i++)
        if (tokens[i] < 0 || tokens[i] >= V) return TR_EINVAL;
    emb_job j = {out, tokens, wte, wpe, T, C};
    tr_parallel_for((size_t)B * T, 16, forward_rows, &j);
    return 0;
}

void tr__embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, int B,
                            int T, int C)
{
    const tr__vec_ops_t *v = tr__vec();
    for (size_t r = 0; r < (size_t)B * T; r++) {
        const float *d = dout + r * C; // (C)
        v->acc(dwte + (size_t)tokens[r] * C, d, C);
        if (dwpe) v->acc(dwpe + (r % T) * C, d, C);
    }
}
