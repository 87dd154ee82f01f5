/* attention.c: causal multi-head self-attention, forward and backward.
 *
 * inp (B, T, 3C) holds for each position the query, key and value, each C = NH hs wide, head
 * h at channels [h hs, (h+1) hs). Position t attends to positions 0..t:
 *   att[b,h,t,t2] = softmax_t2(q_t . k_t2 / sqrt(hs)),  out[b,t,h] = sum_t2 att v_t2.
 * att (B, NH, T, T) is kept for backward; the softmax backward uses it directly
 * (dpre = att (datt - sum att datt)), so the pre-softmax scores are never stored.
 * Both directions split over (b, h) pairs: a pair's gradient rows are disjoint from every
 * other pair's, so threads never write the same float.
 */
#include "kernels/cpu/ops.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec.h"

typedef struct {
    float *out, *att, *dinp, *scratch;
    const float *inp, *dout, *catt;
    int B, T, C, NH;
} att_job;

static void forward_heads(void *ctx, size_t begin, size_t end, int thread)
{
    const att_job *j = ctx;
    const tr__vec_ops_t *v = tr__vec();
    int T = j->T, C = j->C, NH = j->NH, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (size_t bh = begin; bh < end; bh++) {
        int b = (int)bh / NH, h = (int)bh % NH;
        const float *qkv = j->inp + (size_t)b * T * 3 * C; // (T, 3C)
        for (int t = 0; t < T; t++) {
            const float *q = qkv + (size_t)t * 3 * C + h * hs;   // (hs)
            float *a = j->att + (bh * T + t) * (size_t)T;        // (T)
            for (int t2 = 0; t2 <= t; t2++)
                a[t2] = v->dot(q, qkv + (size_t)t2 * 3 * C + C + h * hs, hs) * scale;
            float m = v->max(a, t + 1);
            float sum = v->exp_sum(a, a, m, t + 1);
            v->scale(a, 1.0f / sum, t + 1);
            memset(a + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
            float *o = j->out + ((size_t)b * T + t) * C + h * hs; // (hs)
            memset(o, 0, (size_t)hs * sizeof(float));
            for (int t2 = 0; t2 <= t; t2++)
                v->axpy(a[t2], qkv + (size_t)t2 * 3 * C + 2 * C + h * hs, o, hs);
        }
    }
}

void tr__attention_forward(float *out, float *att, const float *inp, int B, int T, int C, int NH)
{
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
        const float *qkv = j->inp + (size_t)b * T * 3 * C; // (T, 3C)
        float *dqkv = j->dinp + (size_t)b * T * 3 * C;     // (T, 3C)
        float *da = j->scratch + bh * (size_t)T;           // (T)
        for (int t = 0; t < T; t++) {
            const float *a = j->catt + (bh * T + t) * (size_t)T;           // (T)
            const float *dout = j->dout + ((size_t)b * T + t) * C + h * hs; // (hs)
            // through out = sum att v: datt[t2] = dout . v_t2, dv_t2 += att dout
            float ada = 0.0f;
            for (int t2 = 0; t2 <= t; t2++) {
                da[t2] = v->dot(dout, qkv + (size_t)t2 * 3 * C + 2 * C + h * hs, hs);
                v->axpy(a[t2], dout, dqkv + (size_t)t2 * 3 * C + 2 * C + h * hs, hs);
                ada += a[t2] * da[t2];
            }
            // through the softmax, then the scaled q . k
            const float *q = qkv + (size_t)t * 3 * C + h * hs;
            float *dq = dqkv + (size_t)t * 3 * C + h * hs;
            for (int t2 = 0; t2 <= t; t2++) {
                float dpre = a[t2] * (da[t2] - ada) * scale;
                v->axpy(dpre, qkv + (size_t)t2 * 3 * C + C + h * hs, dq, hs);
                v->axpy(dpre, q, dqkv + (size_t)t2 * 3 * C + C + h * hs, hs);
            }
        }
    }
}

void tr__attention_backward(float *dinp, float *scratch, const float *dout, const float *inp,
                            const float *att, int B, int T, int C, int NH)
{
    att_job j = {.dinp = dinp, .scratch = scratch, .dout = dout, .inp = inp, .catt = att,
                 .B = B, .T = T, .C = C, .NH = NH};
    tr_parallel_for((size_t)B * NH, 1, backward_heads, &j);
}
