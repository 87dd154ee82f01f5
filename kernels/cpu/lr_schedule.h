/* lr_schedule: DeepSpeed's learning-rate (and momentum) schedules as pure functions.
 *
 * lr(it) and momentum(it) depend only on the options and `it`, DeepSpeed's
 * last_batch_iteration: −1 before the first scheduler step, and k − 1 + the configured
 * last_batch_iteration + 1 after k steps. Resuming is therefore exact: store `it`.
 * At it = −1 the value is what DeepSpeed's constructor puts in the optimizer; from it = 0
 * on it is get_lr()/get_mom(). Formulas (it as a double unless said):
 *   WarmupLR:       min + (max − min)·γ, γ = log(it+1)/log(W) (log) or it/W (linear) while
 *                   it < W, then 1; W = max(2, warmup_num_steps)
 *   WarmupDecayLR:  as WarmupLR, then γ = max(0, (T − it) / max(1, T − W))
 *   WarmupCosineLR: base_lr·r; warmup r = rmin + γ·(1 − rmin); then with
 *                   q = min(1, (it − W + 1)/max(1, T − W)):
 *                   r = max(0, cmin + (1 − cmin)·(1 + cos πq)/2); r = 0 at it = −1
 *   OneCycle:       lr = min_lr + (max_lr − min_lr)·s, mom = max_mom − (max_mom − min_mom)·s
 *                   with s the triangle of the cycle (optionally in stairs) while
 *                   it < first + second; then lr = min_lr / (1 + rate·d/decay_step_size),
 *                   mom = max_mom·(1 + mom_rate·d/decay_step_size), d = it − total + 1
 *                   (no decay when decay_step_size or the rate is 0)
 *   LRRangeTest:    min_lr·(1 + step_rate·i), i = (it+1)/step_size, floored if staircase
 */
#ifndef TR_KERNELS_CPU_LR_SCHEDULE_H
#define TR_KERNELS_CPU_LR_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tr_lr_schedule_type {
    TR_LR_WARMUP_LR = 0,    /* "WarmupLR" */
    TR_LR_WARMUP_DECAY_LR,  /* "WarmupDecayLR" */
    TR_LR_WARMUP_COSINE_LR, /* "WarmupCosineLR" */
    TR_LR_ONE_CYCLE,        /* "OneCycle" */
    TR_LR_RANGE_TEST,       /* "LRRangeTest" */
} tr_lr_schedule_type_t;

typedef enum tr_warmup_type {
    TR_WARMUP_LOG = 0, /* "log" */
    TR_WARMUP_LINEAR,  /* "linear" */
} tr_warmup_type_t;

/* The "scheduler" section's params, with DeepSpeed's names. */
typedef struct tr_lr_schedule_opts {
    tr_lr_schedule_type_t type;
    double base_lr; /* the optimizer's lr: WarmupCosineLR scales it */
    /* WarmupLR, WarmupDecayLR, WarmupCosineLR */
    double warmup_min_lr, warmup_max_lr;
    int64_t warmup_num_steps;
    tr_warmup_type_t warmup_type;
    int64_t total_num_steps;
    double cos_min_ratio, warmup_min_ratio;
    /* OneCycle */
    double cycle_min_lr, cycle_max_lr, decay_lr_rate;
    int64_t cycle_first_step_size, cycle_second_step_size;     /* second −1: = first */
    int64_t cycle_first_stair_count, cycle_second_stair_count; /* second −1: = first */
    int64_t decay_step_size;
    int cycle_momentum;
    double cycle_min_mom, cycle_max_mom, decay_mom_rate;
    /* LRRangeTest */
    double lr_range_test_min_lr;
    int64_t lr_range_test_step_size;
    double lr_range_test_step_rate;
    int lr_range_test_staircase;
    /* all */
    int64_t last_batch_iteration; /* where a fresh run starts: −1 */
} tr_lr_schedule_opts_t;

/* DeepSpeed's defaults for `type` (total_num_steps 0, cycle_min_lr and cycle_max_lr unset
 * as NAN: those must be given). Any thread. */
void tr_lr_schedule_opts_default(tr_lr_schedule_opts_t *o, tr_lr_schedule_type_t type);

/* 0, or TR_EINVAL with msg (may be NULL) naming the first bad param and what it must be.
 * Any thread. */
int tr_lr_schedule_check(const tr_lr_schedule_opts_t *o, char *msg, size_t msg_size);

/* The learning rate at last_batch_iteration `it` (≥ −1). o must pass the check. Any
 * thread. */
double tr_lr_schedule_lr(const tr_lr_schedule_opts_t *o, int64_t it);

/* OneCycle with cycle_momentum: sets *beta1 to the momentum (Adam's β1) at `it` and
 * returns 1. Other schedules leave *beta1 alone and return 0. Any thread. */
int tr_lr_schedule_momentum(const tr_lr_schedule_opts_t *o, int64_t it, double *beta1);

#ifdef __cplusplus
}
#endif
#endif
