/* loss_scaler.c: the dynamic (or static) fp16 loss scale, one transition per step. See
 * loss_scaler.h for the rules; update_dynamic reads as DeepSpeed's update_scale does. */
#include "kernels/cpu/loss_scaler.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "troupe/error.h"

#define SCALE_FACTOR 2.0 /* DeepSpeed's fixed scale_factor */

void tr_loss_scaler_opts_default(tr_loss_scaler_opts_t *o)
{
    *o = (tr_loss_scaler_opts_t){.loss_scale = 0.0,
                                 .initial_scale_power = 16,
                                 .loss_scale_window = 1000,
                                 .hysteresis = 2,
                                 .consecutive_hysteresis = 0,
                                 .min_loss_scale = 1.0};
}

/* The first bad field's name and what it must be, or NULL. */
static const char *invalid_field(const tr_loss_scaler_opts_t *o)
{
    if (!(o->loss_scale >= 0.0)) return "fp16.loss_scale must be >= 0 (0 selects dynamic scaling)";
    if (o->loss_scale > 0.0) return NULL;
    if (o->initial_scale_power < 0 || o->initial_scale_power > 127)
        return "fp16.initial_scale_power must be in 0..127";
    if (o->loss_scale_window < 1) return "fp16.loss_scale_window must be >= 1";
    if (o->hysteresis < 1) return "fp16.hysteresis must be >= 1";
    if (!(o->min_loss_scale > 0.0)) return "fp16.min_loss_scale must be > 0";
    return NULL;
}

int tr_loss_scaler_init(tr_loss_scaler_t *s, const tr_loss_scaler_opts_t *o)
{
    memset(s, 0, sizeof(*s));
    const char *bad = invalid_field(o);
    if (bad) {
        snprintf(s->message, sizeof(s->message), "%s", bad);
        return TR_EINVAL;
    }
    s->opts = *o;
    s->dynamic = o->loss_scale == 0.0;
    s->cur_scale = s->dynamic ? ldexp(1.0, o->initial_scale_power) : o->loss_scale;
    s->cur_hysteresis = o->hysteresis;
    s->last_overflow_iter = -1;
    return 0;
}

static int overflow_step(tr_loss_scaler_t *s)
{
    const tr_loss_scaler_opts_t *o = &s->opts;
    if (o->hysteresis == 1 || s->cur_hysteresis == 1) {
        if (s->cur_scale == o->min_loss_scale) {
            snprintf(s->message, sizeof(s->message),
                     "Current loss scale already at minimum (%g) - cannot decrease scale "
                     "anymore. Exiting run.",
                     s->cur_scale);
            return TR_ENONFINITE;
        }
        double next = fmax(s->cur_scale / SCALE_FACTOR, o->min_loss_scale);
        snprintf(s->message, sizeof(s->message),
                 "OVERFLOW! Skipping step. Attempted loss scale: %.0f, reducing to %.0f",
                 s->cur_scale, next);
        s->cur_scale = next;
    } else {
        snprintf(s->message, sizeof(s->message),
                 "OVERFLOW! Skipping step. Attempted loss scale: %.0f, but hysteresis is %d. "
                 "Reducing hysteresis to %d",
                 s->cur_scale, s->cur_hysteresis, s->cur_hysteresis - 1);
        s->cur_hysteresis--;
    }
    s->last_overflow_iter = s->cur_iter;
    return 0;
}

static void good_step(tr_loss_scaler_t *s)
{
    const tr_loss_scaler_opts_t *o = &s->opts;
    s->message[0] = '\0';
    if (o->consecutive_hysteresis) s->cur_hysteresis = o->hysteresis;
    /* DeepSpeed 0.19's stable interval: the good steps before this one since the last
     * overflow (runtime/fp16/loss_scaler.py:282-283), so the first doubling comes at the
     * window + 1st good step, the next ones every window steps */
    int64_t stable = s->cur_iter - s->last_overflow_iter - 1;
    if (stable > 0 && stable % o->loss_scale_window == 0) {
        if (!o->consecutive_hysteresis) s->cur_hysteresis = o->hysteresis;
        s->cur_scale *= SCALE_FACTOR;
    }
}

int tr_loss_scaler_update(tr_loss_scaler_t *s, int overflow, int *skip)
{
    *skip = overflow != 0;
    if (!s->dynamic) {
        if (overflow)
            snprintf(s->message, sizeof(s->message),
                     "OVERFLOW! Skipping step. Static loss scale: %g", s->cur_scale);
        else
            s->message[0] = '\0';
        return 0;
    }
    if (overflow) {
        int err = overflow_step(s);
        if (err) return err;
    } else {
        good_step(s);
    }
    s->cur_iter++;
    return 0;
}

double tr_loss_scaler_scale(const tr_loss_scaler_t *s)
{
    return s->cur_scale;
}
