/* attention.c: causal multi-head self-attention, forward and backward.
 *
 * inp (B, T, 3C) holds for each position the query, key and value, each C = NH hs wide, head
 * h at channels [h hs, (h+1) hs). Position t attends to positions 0..t:
 *   att[b,h,t,t2] = softmax_t2(q_t . k_t2 / sqrt(hs)),  out[b,t,h] = sum_t2 att v_t2.
 * att (B, NH, T, T) is kept for backward; the softmax backward uses it directly
 * (dpre = att (datt - sum att datt)), so the pre-softmax scores are never stored.
 * Each (b, h) pair is a handful of (T, T, hs) matrix products, done by single-threaded
 * OpenBLAS calls, one pair per pool thread at a time: a pair's gradient rows are disjoint
 * from every other pair's, so threads never write the same float. The products run over the
 * full T x T square, twice the causal work, because one sgemm is still ~10x faster than the
 * triangle as dot products (measured: 9% of a GPT-2 step went to those dot/axpy loops).
 */
#include "kernels/cpu/ops.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/blas_internal.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec.h"

typedef struct {
    float *out, *att, *dinp, *scratch;
    const float *inp, *dout, *catt;
    int B, T, C, NH;
} att_job;

#define MM(ta, tb, M, N, K, A, lda, B, ldb, beta, Cm, ldc)                                         \
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, Cm, ldc)
#define NT CblasNoTrans
#define TT CblasTrans

/* Row t of the scores (scaled already) becomes the causal softmax over its first t + 1. */
static void causal_softmax(float *a, int T, const tr__vec_ops_t *v)
{
    for (int t = 0; t < T; t++, a += T) {
        float m = v->max(a, t + 1);
        float sum = v->exp_sum(a, a, m, t + 1);
        v->scale(a, 1.0f / sum, t + 1);
        memset(a + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
    }
}

static void forward_heads(void *ctx, size_t begin, size_t end, int thread)
{
    const att_job *j = ctx;
    int T = j->T, C = j->C, NH = j->NH, hs = C / NH;
    for (size_t bh = begin; bh < end; bh++) {
        int b = (int)bh / NH, h = (int)bh % NH;
        const float *q = j->inp + (size_t)b * T * 3 * C + h * hs; // (T, hs), row stride 3C
        const float *k = q + C, *val = q + 2 * C;
        float *a = j->att + bh * T * (size_t)T;         // (T, T)
        float *o = j->out + (size_t)b * T * C + h * hs; // (T, hs), row stride C
        cblas_sgemm(CblasRowMajor, NT, TT, T, T, hs, 1.0f / sqrtf((float)hs), q, 3 * C, k, 3 * C,
                    0.0f, a, T);
        causal_softmax(a, T, tr__vec());
        MM(NT, NT, T, hs, T, a, T, val, 3 * C, 0.0f, o, C);
    }
}

void tr__attention_forward(float *out, float *att, const float *inp, int B, int T, int C, int NH)
{
    tr__blas_one_thread();
    att_job j = {.out = out, .att = att, .inp = inp, .B = B, .T = T, .C = C, .NH = NH};
    tr_parallel_for((size_t)B * NH, 1, forward_heads, &j);
}

static void backward_heads(void *ctx, size_t begin, size_t end, int thread)
{
    const att_job *j = ctx;
    const tr__vec_ops_t *v = tr__vec();
    int T = j->T, C = j->C, NH = j->NH, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (size_t bh = begin; bh < end; bh++) {
        int b = (int)bh / NH, h = (int)bh % NH;
        size_t base = (size_t)b * T * 3 * C + h * hs;
        const float *q = j->inp + base, *k = q + C, *val = q + 2 * C; // (T, hs), stride 3C
        float *dq = j->dinp + base, *dk = dq + C, *dv = dq + 2 * C;   // (T, hs), stride 3C
        const float *a = j->catt + bh * T * (size_t)T;                // (T, T)
        const float *dout = j->dout + (size_t)b * T * C + h * hs;     // (T, hs), stride C
        float *da = j->scratch + bh * T * (size_t)T;                  // (T, T)
        MM(NT, TT, T, T, hs, dout, C, val, 3 * C, 0.0f, da, T);       // datt = dout v^T
        MM(TT, NT, T, hs, T, a, T, dout, C, 0.0f, dv, 3 * C);         // dv = att^T dout
        for (int t = 0; t < T; t++) { // through the softmax and the scale: da becomes dpre
            float *d = da + (size_t)t * T;
            const float *p = a + (size_t)t * T;
            float ada = v->dot(p, d, t + 1);
            for (int t2 = 0; t2 <= t; t2++)
                d[t2] = p[t2] * (d[t2] - ada) * scale;
            memset(d + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
        }
        MM(NT, NT, T, hs, T, da, T, k, 3 * C, 0.0f, dq, 3 * C); // dq = dpre k
        MM(TT, NT, T, hs, T, da, T, q, 3 * C, 0.0f, dk, 3 * C); // dk = dpre^T q
    }
}

void tr__attention_backward(float *dinp, float *scratch, const float *dout, const float *inp,
                            const float *att, int B, int T, int C, int NH)
{
    tr__blas_one_thread();
    att_job j = {.dinp = dinp,
                 .scratch = scratch,
                 .dout = dout,
                 .inp = inp,
                 .catt = att,
                 .B = B,
                 .T = T,
                 .C = C,
                 .NH = NH};
    tr_parallel_for((size_t)B * NH, 1, backward_heads, &j);
}
