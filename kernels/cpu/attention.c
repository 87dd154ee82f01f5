/* attention.c: causal multi-head self-attention, forward and backward.
 *
 * inp (B, T, 3C) holds for each position the query, key and value, each C = NH hs wide, head
 * h at channels [h hs, (h+1) hs). Position t attends to positions 0..t:
 *   att[b,h,t,t2] = softmax_t2(q_t . k_t2 / sqrt(hs)),  out[b,t,h] = sum_t2 att v_t2.
 * att (B, NH, T, T) is kept for backward; the softmax backward uses it directly
 * (dpre = att (datt - sum att datt)), so the pre-softmax scores are never stored.
 * Each (b, h) pair is a handful of (T, T, hs) matrix products, each a single-threaded call,
 * one pair per pool thread at a time: on a cached oneDNN matmul primitive where the linear
 * layers use oneDNN (AMD), else OpenBLAS (dnnl_sgemm's per-call set-up made it no faster than
 * OpenBLAS's Haswell kernels on this 2-vCPU AMD EPYC: 1.05 + 2.14 ms a layer, forward +
 * backward; the primitives 0.65 + 1.17). A pair's gradient rows are disjoint
 * from every other pair's, so threads never write the same float. The products run over the
 * full T x T square, twice the causal work, because one sgemm is still ~10x faster than the
 * triangle as dot products (measured: 9% of a GPT-2 step went to those dot/axpy loops).
 *
 * In bf16 mixed precision (bf16 set) the products take bf16 operands with fp32 accumulation
 * (tr__gemm_bf16: oneDNN's AVX512-BF16 kernels, or emulated), as the linear layers' do and as
 * PyTorch's autocast and DeepSpeed's bf16 run attention's matmuls: each pair's q, k, v (and
 * in backward its dout, att and the softmax's gradient) are rounded into the task's bf16
 * buffers first; the softmax, its scale and its backward stay fp32. On a 2-vCPU AMD EPYC with
 * AVX512-BF16 (GPT-2 B 8 T 128 C 384 NH 6, 2 threads), a layer's forward + backward took 1.04 +
 * 2.09 ms in fp32 (OpenBLAS's Haswell kernels) and 0.55 + 0.91 ms this way; the benchmark's bf16
 * step 8-12 ms less (2026-11-25).
 */
#include "kernels/cpu/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/blas_internal.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec.h"

typedef struct att_job att_job;

/* An fp32 product: on a cached oneDNN primitive where the linear layers use oneDNN (AMD:
 * gemm.c's table), else one OpenBLAS call. */
static void mm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B,
               int ldb, float *C, int ldc)
{
    if (tr__gemm_backend() == TR__GEMM_ONEDNN &&
        tr__gemm_f32_onednn(ta, tb, M, N, K, A, lda, B, ldb, 0.0f, C, ldc))
        return;
    tr__sgemm(TR__GEMM_OPENBLAS, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}
#define NT 0
#define TT 1

/* Row t of the scores, times scale, becomes the causal softmax over its first t + 1. */
static void causal_softmax(float *a, int T, float scale, const tr__vec_ops_t *v)
{
    for (int t = 0; t < T; t++, a += T) {
        v->scale(a, scale, t + 1);
        float m = v->max(a, t + 1);
        float sum = v->exp_sum(a, a, m, t + 1);
        v->scale(a, 1.0f / sum, t + 1);
        memset(a + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
    }
}

/* rows x cols of src (row stride ld) rounded to bf16 into dst, packed (row stride cols) */
static void rows_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld)
{
    for (int r = 0; r < rows; r++)
        tr__half_from_float_serial(dst + (size_t)r * cols, src + (size_t)r * ld, (size_t)cols,
                                   TR_HALF_BF16);
}

/* A task's bf16 operands for one pair at a time: four (T, hs) and two (T, T); NULL without
 * memory (its pairs then run in fp32, said once: tr__bf16_fallback_warning). */
typedef struct {
    uint16_t *x[4], *sq[2];
} bf16_bufs;

struct att_job {
    float *out, *att, *dinp, *scratch;
    const float *inp, *dout, *catt;
    int B, T, C, NH, bf16;
    void (*pair)(const att_job *j, size_t bh, const bf16_bufs *h); /* forward or backward */
};

static uint16_t *bf16_bufs_alloc(bf16_bufs *b, int T, int hs)
{
    size_t th = (size_t)T * hs, tt = (size_t)T * T;
    uint16_t *p = malloc((4 * th + 2 * tt) * sizeof(uint16_t));
    for (int i = 0; p && i < 4; i++)
        b->x[i] = p + i * th;
    if (p) {
        b->sq[0] = p + 4 * th;
        b->sq[1] = b->sq[0] + tt;
    }
    return p;
}

static void forward_pair(const att_job *j, size_t bh, const bf16_bufs *h)
{
    int T = j->T, C = j->C, NH = j->NH, hs = C / NH, b = (int)bh / NH, hd = (int)bh % NH;
    const float *q = j->inp + (size_t)b * T * 3 * C + hd * hs; // (T, hs), row stride 3C
    const float *k = q + C, *val = q + 2 * C;
    float *a = j->att + bh * T * (size_t)T;          // (T, T)
    float *o = j->out + (size_t)b * T * C + hd * hs; // (T, hs), row stride C
    float scale = 1.0f / sqrtf((float)hs);
    if (!h) {
        mm(NT, TT, T, T, hs, q, 3 * C, k, 3 * C, a, T);
        causal_softmax(a, T, scale, tr__vec());
        mm(NT, NT, T, hs, T, a, T, val, 3 * C, o, C);
        return;
    }
    int be = tr__bf16_backend();
    uint16_t *qh = h->x[0], *kh = h->x[1], *vh = h->x[2], *ah = h->sq[0];
    rows_bf16(qh, q, T, hs, 3 * C);
    rows_bf16(kh, k, T, hs, 3 * C);
    rows_bf16(vh, val, T, hs, 3 * C);
    tr__gemm_bf16(be, 0, 1, T, T, hs, qh, hs, kh, hs, 0.0f, a, T);
    causal_softmax(a, T, scale, tr__vec());
    tr__half_from_float_serial(ah, a, (size_t)T * T, TR_HALF_BF16);
    tr__gemm_bf16(be, 0, 0, T, hs, T, ah, T, vh, hs, 0.0f, o, C);
}

/* The pool's task: pairs begin..end, forward or backward, with the task's own bf16 buffers. */
static void heads(void *ctx, size_t begin, size_t end, int thread)
{
    const att_job *j = ctx;
    bf16_bufs h;
    uint16_t *mem = j->bf16 ? bf16_bufs_alloc(&h, j->T, j->C / j->NH) : NULL;
    if (j->bf16 && !mem) tr__bf16_fallback_warning();
    for (size_t bh = begin; bh < end; bh++)
        j->pair(j, bh, mem ? &h : NULL);
    free(mem);
}

void tr__attention_forward(float *out, float *att, const float *inp, int B, int T, int C, int NH,
                           int bf16)
{
    att_job j = {.out = out,
                 .att = att,
                 .inp = inp,
                 .B = B,
                 .T = T,
                 .C = C,
                 .NH = NH,
                 .bf16 = bf16,
                 .pair = forward_pair};
    tr_parallel_for((size_t)B * NH, 1, heads, &j);
}

/* da (T, T) = datt becomes dpre: through the softmax (att a) and the scale */
static void softmax_backward(float *da, const float *a, int T, float scale, const tr__vec_ops_t *v)
{
    for (int t = 0; t < T; t++) {
        float *d = da + (size_t)t * T;
        const float *p = a + (size_t)t * T;
        float ada = v->dot(p, d, t + 1);
        for (int t2 = 0; t2 <= t; t2++)
            d[t2] = p[t2] * (d[t2] - ada) * scale;
        memset(d + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
    }
}

static void backward_pair(const att_job *j, size_t bh, const bf16_bufs *h)
{
    int T = j->T, C = j->C, NH = j->NH, hs = C / NH, b = (int)bh / NH, hd = (int)bh % NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t base = (size_t)b * T * 3 * C + hd * hs;
    const float *q = j->inp + base, *k = q + C, *val = q + 2 * C; // (T, hs), stride 3C
    float *dq = j->dinp + base, *dk = dq + C, *dv = dq + 2 * C;   // (T, hs), stride 3C
    const float *a = j->catt + bh * T * (size_t)T;                // (T, T)
    const float *dout = j->dout + (size_t)b * T * C + hd * hs;    // (T, hs), stride C
    float *da = j->scratch + bh * T * (size_t)T;                  // (T, T)
    if (!h) {
        mm(NT, TT, T, T, hs, dout, C, val, 3 * C, da, T); // datt = dout v^T
        mm(TT, NT, T, hs, T, a, T, dout, C, dv, 3 * C);   // dv = att^T dout
        softmax_backward(da, a, T, scale, tr__vec());
        mm(NT, NT, T, hs, T, da, T, k, 3 * C, dq, 3 * C); // dq = dpre k
        mm(TT, NT, T, hs, T, da, T, q, 3 * C, dk, 3 * C); // dk = dpre^T q
        return;
    }
    int be = tr__bf16_backend();
    uint16_t *doh = h->x[0], *vh = h->x[1], *qh = h->x[2], *kh = h->x[3];
    uint16_t *ah = h->sq[0], *dah = h->sq[1];
    rows_bf16(doh, dout, T, hs, C);
    rows_bf16(vh, val, T, hs, 3 * C);
    tr__half_from_float_serial(ah, a, (size_t)T * T, TR_HALF_BF16);
    tr__gemm_bf16(be, 0, 1, T, T, hs, doh, hs, vh, hs, 0.0f, da, T);    // datt = dout v^T
    tr__gemm_bf16(be, 1, 0, T, hs, T, ah, T, doh, hs, 0.0f, dv, 3 * C); // dv = att^T dout
    softmax_backward(da, a, T, scale, tr__vec());
    tr__half_from_float_serial(dah, da, (size_t)T * T, TR_HALF_BF16);
    rows_bf16(qh, q, T, hs, 3 * C);
    rows_bf16(kh, k, T, hs, 3 * C);
    tr__gemm_bf16(be, 0, 0, T, hs, T, dah, T, kh, hs, 0.0f, dq, 3 * C); // dq = dpre k
    tr__gemm_bf16(be, 1, 0, T, hs, T, dah, T, qh, hs, 0.0f, dk, 3 * C); // dk = dpre^T q
}

void tr__attention_backward(float *dinp, float *scratch, const float *dout, const float *inp,
                            const float *att, int B, int T, int C, int NH, int bf16)
{
    att_job j = {.dinp = dinp,
                 .scratch = scratch,
                 .dout = dout,
                 .inp = inp,
                 .catt = att,
                 .B = B,
                 .T = T,
                 .C = C,
                 .NH = NH,
                 .bf16 = bf16,
                 .pair = backward_pair};
    tr_parallel_for((size_t)B * NH, 1, heads, &j);
}
