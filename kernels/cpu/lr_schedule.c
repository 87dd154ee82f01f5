/* lr_schedule.c: DeepSpeed's lr_schedules.py, evaluated in double in the same order of
 * operations, so a table produced by DeepSpeed matches to the last bit or nearly. */
#include "kernels/cpu/lr_schedule.h"

#include <math.h>

#include "base/errf.h"
#include "troupe/error.h"

void tr_lr_schedule_opts_default(tr_lr_schedule_opts_t *o, tr_lr_schedule_type_t type)
{
    *o = (tr_lr_schedule_opts_t){
        .type = type,
        .base_lr = 0.001,
        .warmup_min_lr = 0.0,
        .warmup_max_lr = 0.001,
        .warmup_num_steps = 1000,
        .warmup_type = TR_WARMUP_LOG,
        .total_num_steps = 0,
        .cos_min_ratio = 0.0001,
        .warmup_min_ratio = 0.0,
        .cycle_min_lr = NAN,
        .cycle_max_lr = NAN,
        .decay_lr_rate = 0.0,
        .cycle_first_step_size = 2000,
        .cycle_second_step_size = -1,
        .cycle_first_stair_count = 0,
        .cycle_second_stair_count = -1,
        .decay_step_size = 0,
        .cycle_momentum = 1,
        .cycle_min_mom = 0.8,
        .cycle_max_mom = 0.9,
        .decay_mom_rate = 0.0,
        .lr_range_test_min_lr = 0.001,
        .lr_range_test_step_size = 2000,
        .lr_range_test_step_rate = 1.0,
        .lr_range_test_staircase = 0,
        .last_batch_iteration = -1,
    };
}

static const char *invalid_param(const tr_lr_schedule_opts_t *o)
{
    switch (o->type) {
    case TR_LR_WARMUP_DECAY_LR:
    case TR_LR_WARMUP_COSINE_LR:
        if (o->total_num_steps <= 0) return "total_num_steps must be a positive integer";
        /* fall through */
    case TR_LR_WARMUP_LR:
        if (o->warmup_num_steps <= 0) return "warmup_num_steps must be a positive integer";
        if (o->warmup_type != TR_WARMUP_LOG && o->warmup_type != TR_WARMUP_LINEAR)
            return "warmup_type must be \"log\" or \"linear\"";
        return NULL;
    case TR_LR_ONE_CYCLE:
        if (isnan(o->cycle_min_lr) || isnan(o->cycle_max_lr))
            return "cycle_min_lr and cycle_max_lr are required";
        if (o->cycle_first_step_size <= 0 || o->cycle_second_step_size == 0 ||
            o->cycle_second_step_size < -1)
            return "cycle_first_step_size and cycle_second_step_size must be positive";
        if (o->cycle_first_stair_count < 0 || o->cycle_second_stair_count < -1 ||
            o->decay_step_size < 0)
            return "stair counts and decay_step_size must be >= 0";
        return NULL;
    case TR_LR_RANGE_TEST:
        if (o->lr_range_test_step_size <= 0)
            return "lr_range_test_step_size must be a positive integer";
        return NULL;
    }
    return "type must be WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or LRRangeTest";
}

int tr_lr_schedule_check(const tr_lr_schedule_opts_t *o, char *msg, size_t msg_size)
{
    const char *bad = invalid_param(o);
    if (!bad) return 0;
    return tr__errf(msg, msg_size, TR_EINVAL, "scheduler.params: %s", bad);
}

/* ---------------------------------------------------------------- warmup family */

static double warmup_steps(const tr_lr_schedule_opts_t *o)
{
    return o->warmup_num_steps < 2 ? 2.0 : (double)o->warmup_num_steps;
}

/* γ during warmup (it < W): log(it+1)/log(W) or it/W. */
static double warmup_gamma(const tr_lr_schedule_opts_t *o, int64_t it)
{
    double w = warmup_steps(o);
    if (o->warmup_type == TR_WARMUP_LINEAR) return (double)it / w;
    return (1.0 / log(w)) * log((double)it + 1.0);
}

static double warmup_lr(const tr_lr_schedule_opts_t *o, int64_t it)
{
    if (it < 0) return o->warmup_min_lr;
    double w = warmup_steps(o), gamma = 1.0;
    if ((double)it < w)
        gamma = warmup_gamma(o, it);
    else if (o->type == TR_LR_WARMUP_DECAY_LR)
        gamma = fmax(0.0,
                     (double)(o->total_num_steps - it) / fmax(1.0, (double)o->total_num_steps - w));
    return o->warmup_min_lr + (o->warmup_max_lr - o->warmup_min_lr) * gamma;
}

static double cosine_ratio(const tr_lr_schedule_opts_t *o, int64_t it)
{
    if (it < 0) return 0.0;
    double w = warmup_steps(o);
    if ((double)it < w)
        return o->warmup_min_ratio + warmup_gamma(o, it) * (1.0 - o->warmup_min_ratio);
    double real_last = (double)it - w + 1.0;
    double real_total = fmax(1.0, (double)o->total_num_steps - w);
    double q = fmin(1.0, real_last / real_total);
    double r = (1.0 + cos(M_PI * q)) / 2.0;
    return fmax(0.0, o->cos_min_ratio + (1.0 - o->cos_min_ratio) * r);
}

/* ---------------------------------------------------------------- OneCycle */

static double first_size(const tr_lr_schedule_opts_t *o)
{
    return (double)o->cycle_first_step_size;
}

static double second_size(const tr_lr_schedule_opts_t *o)
{
    return o->cycle_second_step_size < 0 ? first_size(o) : (double)o->cycle_second_step_size;
}

static double total_size(const tr_lr_schedule_opts_t *o)
{
    return first_size(o) + second_size(o);
}

/* The cycle's triangle in [0, 1], quantised to stairs when a stair count is set. */
static double scale_factor(const tr_lr_schedule_opts_t *o, int64_t it)
{
    double batch = (double)(it + 1), total = total_size(o), ratio = first_size(o) / total;
    double cycle = floor(1.0 + batch / total);
    double x = 1.0 + batch / total - cycle, s;
    int64_t stairs;
    if (x <= ratio) {
        s = x / ratio;
        stairs = o->cycle_first_stair_count;
    } else {
        s = (x - 1.0) / (ratio - 1.0);
        stairs = o->cycle_second_stair_count < 0 ? o->cycle_first_stair_count
                                                 : o->cycle_second_stair_count;
    }
    if (stairs > 0) {
        double ci = fmod(batch, total), pos;
        if (ci <= first_size(o))
            pos = ci * (double)stairs / first_size(o);
        else
            pos = (total - ci) * (double)stairs / second_size(o);
        s = floor(pos) / (double)stairs;
    }
    return s;
}

/* Batches past the cycle, or 0 while it lasts. */
static double decay_interval(const tr_lr_schedule_opts_t *o, int64_t it)
{
    return ((double)it - total_size(o) + 1.0) / (double)o->decay_step_size;
}

static double one_cycle_lr(const tr_lr_schedule_opts_t *o, int64_t it)
{
    if (it < 0) return o->cycle_min_lr;
    if ((double)it < total_size(o))
        return o->cycle_min_lr + (o->cycle_max_lr - o->cycle_min_lr) * scale_factor(o, it);
    if (o->decay_step_size == 0 || o->decay_lr_rate == 0.0) return o->cycle_min_lr;
    return o->cycle_min_lr / (1.0 + o->decay_lr_rate * decay_interval(o, it));
}

static double one_cycle_mom(const tr_lr_schedule_opts_t *o, int64_t it)
{
    if (it < 0) return o->cycle_min_mom;
    if ((double)it < total_size(o))
        return o->cycle_max_mom - (o->cycle_max_mom - o->cycle_min_mom) * scale_factor(o, it);
    if (o->decay_step_size == 0 || o->decay_mom_rate == 0.0) return o->cycle_max_mom;
    return o->cycle_max_mom * (1.0 + o->decay_mom_rate * decay_interval(o, it));
}

/* ---------------------------------------------------------------- LRRangeTest, API */

static double range_test_lr(const tr_lr_schedule_opts_t *o, int64_t it)
{
    double interval = (double)(it + 1) / (double)o->lr_range_test_step_size;
    if (o->lr_range_test_staircase) interval = floor(interval);
    return o->lr_range_test_min_lr * (1.0 + o->lr_range_test_step_rate * interval);
}

double tr_lr_schedule_lr(const tr_lr_schedule_opts_t *o, int64_t it)
{
    switch (o->type) {
    case TR_LR_WARMUP_LR:
    case TR_LR_WARMUP_DECAY_LR:
        return warmup_lr(o, it);
    case TR_LR_WARMUP_COSINE_LR:
        return o->base_lr * cosine_ratio(o, it);
    case TR_LR_ONE_CYCLE:
        return one_cycle_lr(o, it);
    case TR_LR_RANGE_TEST:
        return range_test_lr(o, it);
    }
    return NAN;
}

int tr_lr_schedule_momentum(const tr_lr_schedule_opts_t *o, int64_t it, double *beta1)
{
    if (o->type != TR_LR_ONE_CYCLE || !o->cycle_momentum) return 0;
    *beta1 = one_cycle_mom(o, it);
    return 1;
}
