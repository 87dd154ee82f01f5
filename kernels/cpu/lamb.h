/* lamb: LAMB (layer-wise adaptive moments) with DeepSpeed's FusedLamb semantics; one call
 * is one tensor, which gets its own trust ratio. Per element (t from the Adam state):
 *   g = g · grad_mul
 *   m = β1·m + (1−β1)·g;   v = β2·v + (1−β2)·g²
 *   u = m / (√v + eps) + wd·p          (√(v + eps) when eps_inside_sqrt)
 * then per tensor: coeff = ‖p‖/‖u‖ clamped to [min_coeff, max_coeff], or 1 when either
 * norm is 0 (norms accumulated in double), and per element
 *   p = p − (step_size · coeff) · u,   step_size = lr·√(1−β2^t)/(1−β1^t)  (lr without
 *                                      bias correction), rounded to float
 * Two passes: m, v and the norms; then p. Every ISA gives the same bits (no FP
 * contraction; the norm sums run in a fixed order).
 */
#ifndef TR_KERNELS_CPU_LAMB_H
#define TR_KERNELS_CPU_LAMB_H

#include <stddef.h>

#include "kernels/cpu/adam.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_lamb_opts {
    float lr, beta1, beta2, eps, weight_decay;
    float max_coeff, min_coeff; /* DeepSpeed: 10.0 and 0.01 */
    int bias_correction;        /* DeepSpeed: 1 */
    int eps_inside_sqrt;        /* DeepSpeed: 0 */
} tr_lamb_opts_t;

/* Updates one tensor of n parameters with the Adam-style state st (advance it once per
 * step with tr_adam_state_advance, giving it beta1/beta2 through a tr_adam_opts_t).
 * Returns the trust ratio used, or 0 when there was no memory for the per-block norm
 * sums (then nothing was changed). The caller's thread, using the kernels' pool. */
float tr_lamb_update(const tr_lamb_opts_t *o, const tr_adam_state_t *st, float grad_mul, float *p,
                     const float *g, float *m, float *v, size_t n);

/* The same update in its two passes, for a tensor cut across ZeRO partitions: each rank runs
 * tr_lamb_moments on its piece (m, v, and the piece's sums of p² and u² in double), the sums
 * are added over the ranks, and tr_lamb_apply steps the piece with the tensor's ratio from
 * tr_lamb_trust_ratio. tr_lamb_moments returns -1 (nothing changed) when out of memory. */
int tr_lamb_moments(const tr_lamb_opts_t *o, float grad_mul, float *p, const float *g, float *m,
                    float *v, size_t n, double *wsq, double *usq);
float tr_lamb_trust_ratio(const tr_lamb_opts_t *o, double wsq, double usq);
void tr_lamb_apply(const tr_lamb_opts_t *o, const tr_adam_state_t *st, float coeff, float *p,
                   const float *m, const float *v, size_t n);

#ifdef __cplusplus
}
#endif
#endif
