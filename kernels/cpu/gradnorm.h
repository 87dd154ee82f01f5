/* gradnorm: the global gradient L2 norm, the inf/nan check, and the unscale-and-clip factor.
 *
 * The optimizer's sequence is: overflow check → loss-scale update → skip, or global norm →
 * one combined unscale-and-clip multiply → optimizer → scheduler step. Norm and overflow
 * check are one pass: squares are summed in double, where a finite float's square (at most
 * ~1.2e77) can never overflow, so the sum is non-finite exactly when some gradient is Inf
 * or NaN. The unscale-and-clip multiply is then folded into the optimizer's own pass
 * (tr_adam_update's grad_mul), or done alone with tr_grad_scale. Two passes over the
 * gradients in all.
 */
#ifndef TR_KERNELS_CPU_GRADNORM_H
#define TR_KERNELS_CPU_GRADNORM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Σ g[i]² over n floats, accumulated in double; Inf or NaN anywhere makes it non-finite.
 * Sums fixed blocks, then the blocks in order, so the result is the same for any number of
 * threads (it differs between ISAs in the last bits only). Sum several tensors' results
 * for a global norm. The caller's thread, using the kernels' pool. */
double tr_grad_sumsq(const float *g, size_t n);

/* *norm = √sumsq, or TR_ENONFINITE (gradients overflowed; *norm = INFINITY). Any thread. */
int tr_grad_norm_finish(double sumsq, double *norm);

/* DeepSpeed's unscale_and_clip_grads as one factor. scaled_norm is the norm of the
 * gradients as they are (still multiplied by loss_scale); clip is gradient_clipping (0 for
 * none). Returns 1/combined, where combined = loss_scale, times
 * c = (scaled_norm/loss_scale + 1e-6)/clip when clip > 0 and c > 1. Any thread. */
float tr_grad_clip_mul(double scaled_norm, double loss_scale, double clip);

/* g[i] *= mul over n floats (when the optimizer cannot fold the factor in). The caller's
 * thread, using the kernels' pool. */
void tr_grad_scale(float *g, size_t n, float mul);

#ifdef __cplusplus
}
#endif
#endif
