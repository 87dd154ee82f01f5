/* sgd: stochastic gradient descent with momentum, dampening, Nesterov and weight decay,
 * with PyTorch's torch.optim.SGD semantics. Per element, in this order:
 *   d = g · grad_mul + wd·p                     (wd term only if weight_decay != 0)
 *   momentum != 0:  buf = d on the first step, else buf = momentum·buf + (1 − dampening)·d
 *                   d = d + momentum·buf (nesterov) or d = buf
 *   p = p − lr·d
 * Arrays (n,) fp32; buf may be NULL when momentum is 0. One pass; the element loop is
 * compiled for every ISA of isa.h without FP contraction, so all ISAs give the same bits.
 */
#ifndef TR_KERNELS_CPU_SGD_H
#define TR_KERNELS_CPU_SGD_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_sgd_opts {
    float lr, momentum, dampening, weight_decay;
    int nesterov;
} tr_sgd_opts_t;

/* 0, or TR_EINVAL when nesterov is set without momentum > 0 and dampening == 0 (PyTorch's
 * rule) or lr < 0. Any thread. */
int tr_sgd_check(const tr_sgd_opts_t *o);

/* One step over n parameters. first_step: the momentum buffer is not yet initialised (it
 * is set to d). The caller's thread, using the kernels' pool. */
void tr_sgd_update(const tr_sgd_opts_t *o, int first_step, float grad_mul, float *p, const float *g,
                   float *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
