/* ops: the CPU kernels of the layers, forward and backward, fp32.
 *
 * Shape letters, used in every comment below and in the kernel files:
 *   B batch, T time (sequence length), C channels, OC output channels, N = B * T rows,
 *   V vocabulary, Vp padded vocabulary (V rounded up; logits are (N, Vp), the loss only
 *   looks at the first V), NH heads, hs = C / NH head size, L layers.
 * Tensors are row-major and contiguous. Backward functions accumulate (+=) into every
 * gradient they produce, as llm.c does, so gradients of shared inputs simply add up; the
 * caller zeroes them when it wants a fresh gradient. Kernels use tr_parallel_for for their
 * own loops and kernels/cpu/gemm.c (OpenBLAS or oneDNN) for matrix products; they never
 * allocate, but for the bf16 products' per-thread arenas (linear.c, gemm_bf16.c), grown on
 * first use and kept.
 */
#ifndef TR_KERNELS_CPU_OPS_H
#define TR_KERNELS_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

/* linear.c: out = inp weight^T + bias. bias and dbias may be NULL; dinp or dweight may be NULL
 * (backward computes only the other: a split backward's two parts). weight_bf16, the weight's
 * bf16 copy (tr_layer_ctx_t.params_bf16) or NULL: when set, the products read it and the
 * activations and gradients rounded to bf16, accumulating in fp32 (bf16 mixed precision);
 * weight itself is then not read (it may be NULL in a backward that computes only dweight). */
void tr__linear_forward(float *out, const float *inp, const float *weight,
                        const uint16_t *weight_bf16, const float *bias, int N, int C, int OC);
void tr__linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, const uint16_t *weight_bf16, int N,
                         int C, int OC);
/* The forward with the passes after it done on each row block of out while the block is in
 * cache: residual (N, OC) added after the product (out = inp weight^T + bias + residual, the
 * sums in that order), and gelu_out (N, OC) = GELU(out). Either may be NULL. */
void tr__linear_forward_fused(float *out, float *gelu_out, const float *inp, const float *weight,
                              const uint16_t *weight_bf16, const float *bias, const float *residual,
                              int N, int C, int OC);
/* dinp (N, C) = dout (N, OC) weight (OC, C), written where tr__linear_backward adds (no zeroed
 * buffer needed); with gelu_pre (N, C), each row block is then multiplied by GELU'(gelu_pre)
 * while in cache: the gradient through the GELU whose input was gelu_pre. */
void tr__linear_backward_input(float *dinp, const float *dout, const float *weight,
                               const uint16_t *weight_bf16, const float *gelu_pre, int N, int C,
                               int OC);
/* bf16 mixed precision without memory for a product's rounded operands: that product runs in
 * fp32, and stderr says so once per process. */
void tr__bf16_fallback_warning(void);
/* Both parts in one call: dinp written as tr__linear_backward_input writes it, dweight and
 * dbias added to as tr__linear_backward adds; the same numbers as the two calls, with dout
 * rounded to bf16 once instead of twice in bf16 mixed precision. */
void tr__linear_backward_both(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, const uint16_t *weight_bf16,
                              const float *gelu_pre, int N, int C, int OC);

/* layernorm.c: out = (inp - mean) rstd weight + bias over C, eps 1e-5; mean, rstd (N) kept.
 * Backward: dinp NULL computes only dweight and dbias, dweight NULL only dinp. */
void tr__layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int N, int C);
void tr__layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int N, int C);

/* gelu.c: tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void tr__gelu_forward(float *out, const float *inp, size_t n);
void tr__gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* residual.c: the backward of out = a + b (whose forward is tr__linear_forward_fused's
 * residual): da += dout and db += dout; db may be NULL. */
void tr__residual_backward(float *da, float *db, const float *dout, size_t n);
/* x (n) = 0, over the thread pool. */
void tr__zero(float *x, size_t n);

/* embedding.c: out[b,t] = wte[tokens[b,t]] + wpe[t]. wpe may be NULL (no positions).
 * TR_EINVAL if a token is outside [0, V) (nothing is written then). */
int tr__embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe, int B,
                          int T, int C, int V);
void tr__embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, int B,
                            int T, int C);

/* attention.c: causal multi-head self-attention. inp (B, T, 3C) holds q, k, v; att
 * (B, NH, T, T) keeps the softmax for backward (upper triangle zero); out (B, T, C).
 * scratch holds B * NH * T * T floats. The backward writes dinp (B, T, 3C) (every element
 * once: no zeroed buffer needed). bf16: the products on bf16 operands with fp32 accumulation
 * (bf16 mixed precision), else fp32. */
void tr__attention_forward(float *out, float *att, const float *inp, int B, int T, int C, int NH,
                           int bf16);
void tr__attention_backward(float *dinp, float *scratch, const float *dout, const float *inp,
                            const float *att, int B, int T, int C, int NH, int bf16);

/* crossentropy.c: fused softmax + cross-entropy. logits (N, Vp) are replaced by the
 * probabilities (padding columns set to 0); losses (N) get -log p[target], 0 where the target
 * is ignore_index. *count receives the number of counted positions and *mean their mean loss.
 * TR_EINVAL if a target is neither ignore_index nor in [0, V). */
int tr__crossentropy_forward(float *losses, float *probs_logits, const int *targets, int N, int V,
                             int Vp, int ignore_index, float *mean, int *count);
/* dlogits (N, Vp) += (probs - onehot(target)) dloss; rows with ignore_index get nothing. */
void tr__crossentropy_backward(float *dlogits, const float *probs, const int *targets, int N, int V,
                               int Vp, int ignore_index, float dloss);

#endif
