/* loss_scaler: fp16 loss scaling as an explicit state machine, with DeepSpeed's rules.
 *
 * Static when loss_scale > 0: the scale never changes; an overflowing step is skipped.
 * Dynamic otherwise, starting at 2^initial_scale_power. After each step's overflow check:
 *   overflow, hysteresis exhausted (hysteresis == 1 or cur_hysteresis == 1):
 *       at min_loss_scale already → error TR_ENONFINITE, training must stop;
 *       else scale = max(scale / 2, min_loss_scale); skip the step
 *   overflow, hysteresis left:  cur_hysteresis −= 1; skip the step
 *   (either overflow: the window restarts at this iteration)
 *   no overflow: if consecutive_hysteresis, cur_hysteresis = hysteresis;
 *       stable = iter − last_overflow_iter − 1 (the good steps before this one);
 *       if stable > 0 and stable % loss_scale_window == 0: refill cur_hysteresis
 *       (when not consecutive) and scale *= 2
 *   iter += 1
 * which is DeepSpeed 0.19's DynamicLossScaler.update_scale, branch for branch: the scale
 * first doubles at the window + 1st step without overflow, then every window steps.
 */
#ifndef TR_KERNELS_CPU_LOSS_SCALER_H
#define TR_KERNELS_CPU_LOSS_SCALER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The "fp16" section's keys. */
typedef struct tr_loss_scaler_opts {
    double loss_scale;          /* > 0: static scale; 0: dynamic (default 0) */
    int initial_scale_power;    /* dynamic start 2^power (default 16) */
    int loss_scale_window;      /* good steps before doubling (default 1000) */
    int hysteresis;             /* overflows tolerated before halving (default 2) */
    int consecutive_hysteresis; /* refill hysteresis on every good step (default 0) */
    double min_loss_scale;      /* floor of the scale (default 1) */
} tr_loss_scaler_opts_t;

typedef struct tr_loss_scaler {
    tr_loss_scaler_opts_t opts;
    int dynamic;
    double cur_scale;
    int cur_hysteresis;
    int64_t cur_iter, last_overflow_iter; /* last_overflow_iter starts at −1 */
    char message[160];                    /* what the last update did, for the log */
} tr_loss_scaler_t;

/* DeepSpeed's defaults. Any thread. */
void tr_loss_scaler_opts_default(tr_loss_scaler_opts_t *o);

/* Starts a scaler; TR_EINVAL with s->message naming the field when loss_scale < 0,
 * initial_scale_power outside 0..127, loss_scale_window < 1, hysteresis < 1 or
 * min_loss_scale <= 0. The owner of s. */
int tr_loss_scaler_init(tr_loss_scaler_t *s, const tr_loss_scaler_opts_t *o);

/* One step's outcome. *skip = 1 when the step must be skipped (overflow). Returns 0, or
 * TR_ENONFINITE when the scale is already at min_loss_scale and overflows again: training
 * must stop; s->message says why and s is left as it was. The owner of s. */
int tr_loss_scaler_update(tr_loss_scaler_t *s, int overflow, int *skip);

/* The scale to multiply the next loss by. Any thread that owns s. */
double tr_loss_scaler_scale(const tr_loss_scaler_t *s);

#ifdef __cplusplus
}
#endif
#endif
