/* lion: the Lion optimizer (Chen et al. 2023, "Symbolic Discovery of Optimization
 * Algorithms"), as DeepSpeed's CPU and fused Lion compute it, on fp32 parameters.
 *
 * For each element, in this order:
 *   g = g · grad_mul                         (the combined unscale-and-clip factor, or 1)
 *   c = β1·m + (1−β1)·g
 *   p = p·(1 − lr·wd) − lr·sign(c)           (decoupled weight decay; sign(0) = 0)
 *   m = β2·m + (1−β2)·g
 * One state array, m (exp_avg); no step count, no bias correction. sign(0) is 0 as in the
 * paper and PyTorch's torch.sign (DeepSpeed's CPU kernel moves by −lr there instead).
 *
 * Memory: one pass reading p, g, m and writing p, m (20 bytes per parameter). Arrays (n,)
 * fp32. Multi-threaded over tiles with tr_parallel_for; the element loop is branch-free so
 * the compiler vectorises it.
 */
#ifndef TR_KERNELS_CPU_LION_H
#define TR_KERNELS_CPU_LION_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_lion_opts {
    float lr, beta1, beta2, weight_decay; /* DeepSpeed's defaults: 1e-3, 0.9, 0.999, 0 */
} tr_lion_opts_t;

/* Updates n parameters p with gradients g (only read) and momentum m. Arrays must not
 * overlap. The caller's thread, using the kernels' pool. */
void tr_lion_update(const tr_lion_opts_t *o, float grad_mul, float *p, const float *g, float *m,
                    size_t n);

#ifdef __cplusplus
}
#endif
#endif
