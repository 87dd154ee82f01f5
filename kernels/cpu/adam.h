/* adam: Adam and AdamW on fp32 parameters, with DeepSpeed's CPU-Adam semantics.
 *
 * For each element, in this order (DeepSpeed's cpu_adam Step_1; t is the step, from 1):
 *   g  = g · grad_mul                          (the combined unscale-and-clip factor, or 1)
 *   g  = g + wd·p                              (L2 mode, adamw_mode == 0, only if wd > 0)
 *   m  = β1·m + (1−β1)·g
 *   v  = β2·v + (1−β2)·g²
 *   p  = p − lr·wd·p                           (AdamW mode, only if wd > 0)
 *   p  = p + step_size · m / (√v · bc2 + eps)
 * with step_size = −lr / (1−β1^t) and bc2 = 1/√(1−β2^t) when bias_correction is on
 * (−lr and 1 when off), both computed in double from the state's β^t and rounded to float.
 * β^t is kept incrementally in double (β^t = β^(t−1)·β), as DeepSpeed does.
 *
 * Memory: one pass, reading p, g, m, v and writing p, m, v (28 bytes per parameter), plus an
 * optional fp16 or bf16 copy of the new p written in the same pass (2 bytes more).
 * All arrays (n,) fp32; the copy (n,) uint16. Multi-threaded over tiles with
 * tr_parallel_for; vectorised with FMA on AVX2 and AVX-512 (see isa.h). The scalar path
 * uses no FMA and follows the order above exactly; vector results differ from it only by
 * FMA contraction (one rounding instead of two in each multiply-add).
 */
#ifndef TR_KERNELS_CPU_ADAM_H
#define TR_KERNELS_CPU_ADAM_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/half.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_adam_opts {
    float lr, beta1, beta2, eps, weight_decay;
    int adamw_mode;      /* 1: decoupled weight decay (AdamW), 0: L2 (adds wd*p to g) */
    int bias_correction; /* 1 as DeepSpeed's default */
} tr_adam_opts_t;

typedef struct tr_adam_state {
    int64_t step;                /* steps taken; the next update uses this value */
    double beta1_pow, beta2_pow; /* β1^step, β2^step */
} tr_adam_state_t;

/* step 0, powers 1. Any thread. */
void tr_adam_state_init(tr_adam_state_t *st);

/* step += 1; β1^t, β2^t multiplied by β1, β2. The owner of st. */
void tr_adam_state_advance(const tr_adam_opts_t *o, tr_adam_state_t *st);

/* Updates n parameters with the state as it is (does not advance it), so several tensors
 * can share one step: advance once, then update each. grad_mul scales g first (pass 1.0f
 * for none). copy, when kind is TR_HALF_FP16 or TR_HALF_BF16, receives the new p rounded
 * to nearest even; it may be NULL with TR_HALF_NONE. g is only read. Arrays must not
 * overlap. The caller's thread, using the kernels' pool. */
void tr_adam_update(const tr_adam_opts_t *o, const tr_adam_state_t *st, float grad_mul, float *p,
                    const float *g, float *m, float *v, size_t n, uint16_t *copy,
                    tr_half_kind_t kind);

/* AMSGrad (PyTorch's amsgrad=True), otherwise as tr_adam_update without a copy: vmax (n,)
 * keeps the running maximum of v, and the denominator uses it:
 *   v̂ = max(v̂, v);  p = p + step_size · m / (√v̂ · bc2 + eps)
 * vmax starts at zero with the other moments. The caller's thread, using the kernels' pool. */
void tr_adam_update_amsgrad(const tr_adam_opts_t *o, const tr_adam_state_t *st, float grad_mul,
                            float *p, const float *g, float *m, float *v, float *vmax, size_t n);

/* Advances st by one step, then updates n parameters p (fp32) with gradients g and moments
 * m, v. Multi-threaded with tr_parallel_for. The caller's thread. */
void tr_adam_step(const tr_adam_opts_t *o, tr_adam_state_t *st, float *p, const float *g, float *m,
                  float *v, size_t n);

#ifdef __cplusplus
}
#endif
#endif
