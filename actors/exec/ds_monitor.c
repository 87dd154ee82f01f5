/* ds_monitor.c: the engine's DeepSpeed outputs, byte for byte where DeepSpeed's are defined:
 * the wall_clock_breakdown timer lines, the throughput and progress lines (stdout, where
 * DeepSpeed's logger writes them, without its "[date][INFO][file:line]" prefix), and the
 * csv_monitor and tensorboard scalars, tagged as DeepSpeed tags them with global_samples as
 * the x value.
 *
 * Everything here runs on the executor's thread, which owns this state. The executor reports
 * the times of each micro-step's forward and backward; at the accumulation boundary the
 * optimizer's STEP_DONE carries the time the last reduced bucket arrived, its step's begin and
 * end, the counters and the next learning rate and loss scale, and the executor replays them
 * into the timers on receipt, so the timer group has a single user. The mapping of DeepSpeed's
 * timers: fwd            a micro-batch's forward bwd_inner      the layers' backward bwd_allreduce
 * at the boundary, from the end of backward to the last REDUCED bucket (the reduction not hidden
 * behind backward); zero-length otherwise bwd            bwd_inner + bwd_allreduce step the
 * optimizer's step at the boundary; zero-length otherwise (DeepSpeed calls engine.step() every
 * micro-step and it does nothing off a boundary) Lines and rows follow DeepSpeed's engine.step()
 * order: progress, throughput, lr and loss scale, micro timers, then at the boundary
 * elapsed_time_ms_* and (every steps_per_print steps) the global timers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "actors/engine/plan.h"
#include "actors/exec/ds_monitor.h"
#include "troupe/monitor.h"
#include "troupe/pipeline.h"

enum { FWD, BWD, BWD_INNER, BWD_ALLREDUCE, STEP, N_TIMERS };

static const char *const micro_names[N_TIMERS] = {TR_WALLTIMER_MICRO_NAMES};
static const char *const global_names[N_TIMERS] = {TR_WALLTIMER_GLOBAL_NAMES};
static const char *const elapsed_tags[N_TIMERS] = {TR_TAG_FORWARD_MS, TR_TAG_BACKWARD_MS,
                                                   TR_TAG_BACKWARD_INNER_MS,
                                                   TR_TAG_BACKWARD_ALLREDUCE_MS, TR_TAG_STEP_MS};

struct tr__dsmon {
    tr_walltimers_t *timers; /* NULL without wall_clock_breakdown */
    tr_throughput_t tput;
    tr_csv_monitor_t *csv; /* NULL without csv_monitor */
    tr_tb_writer_t *tb;    /* NULL without tensorboard */
    uint64_t spp, train_batch;
    bool fp16, scale_changed; /* fp16: the scale prints as an int until it first changes */
    double scale0;
    uint64_t bwd0, bwd1; /* the boundary micro-step's backward, finished at STEP_DONE */
    int optimizer_type;
    bool quiet;       /* not rank 0: DeepSpeed prints and writes its monitors on rank 0 only */
    bool pipelined;   /* pipeline.stages > 1: PipelineEngine's line at steps_per_print too */
    uint64_t t_print; /* its iter time counts from here */
};

/* DeepSpeed's lines go to stdout, as its logger's do, at the info level (troupe.log_level or
 * TROUPE_LOG_LEVEL above info silences them). */
static void print_line(const struct tr__dsmon *d, const char *line)
{
    if (d->quiet || tr_log_level() > TR_LOG_INFO) return;
    fputs(line, stdout);
    fputc('\n', stdout);
    fflush(stdout);
}

static double unix_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Timer `which`, micro and global, ran from t0 to t1. */
static void timed(struct tr__dsmon *d, int which, uint64_t t0, uint64_t t1)
{
    if (!d->timers) return;
    tr_walltimers_start(d->timers, micro_names[which], t0);
    tr_walltimers_stop(d->timers, micro_names[which], t1 > t0 ? t1 : t0);
    tr_walltimers_start(d->timers, global_names[which], t0);
    tr_walltimers_stop(d->timers, global_names[which], t1 > t0 ? t1 : t0);
}

static void log_timers(struct tr__dsmon *d, const char *const *names, uint64_t now)
{
    char buf[512];
    tr_walltimers_log_line(d->timers, 0, names, N_TIMERS, 1.0, 1, now, buf, sizeof(buf));
    print_line(d, buf);
}

/* One scalar to every monitor that is on. */
static void scalar(struct tr__dsmon *d, const char *tag, double v, uint64_t samples)
{
    if (d->csv) tr_csv_monitor_write(d->csv, tag, v, samples);
    if (d->tb) tr_tb_writer_scalar(d->tb, tag, (float)v, (int64_t)samples, unix_now());
}

static void loss_scale(struct tr__dsmon *d, double scale, uint64_t samples)
{
    d->scale_changed = d->scale_changed || scale != d->scale0;
    if (d->csv && !d->scale_changed)
        tr_csv_monitor_write_int(d->csv, TR_TAG_LOSS_SCALE, (int64_t)scale, samples);
    else if (d->csv)
        tr_csv_monitor_write(d->csv, TR_TAG_LOSS_SCALE, scale, samples);
    if (d->tb)
        tr_tb_writer_scalar(d->tb, TR_TAG_LOSS_SCALE, (float)scale, (int64_t)samples, unix_now());
}

static int open_monitors(struct tr__dsmon *d, const tr_config_t *c, char *err, size_t errlen)
{
    int rc = 0;
    if (c->csv_monitor.enabled &&
        (rc = tr_csv_monitor_create(c->csv_monitor.output_path, c->csv_monitor.job_name, &d->csv)) <
            0)
        return tr__errf(err, errlen, rc,
                        "%s: csv_monitor: cannot use output_path '%s', job_name "
                        "'%s': %s",
                        c->source, c->csv_monitor.output_path, c->csv_monitor.job_name,
                        tr_strerror(rc));
    if (c->tensorboard.enabled &&
        (rc = tr_tb_writer_create(c->tensorboard.output_path, c->tensorboard.job_name, &d->tb)) < 0)
        return tr__errf(err, errlen, rc,
                        "%s: tensorboard: cannot use output_path '%s', job_name "
                        "'%s': %s",
                        c->source, c->tensorboard.output_path, c->tensorboard.job_name,
                        tr_strerror(rc));
    return 0;
}

int tr__dsmon_create(const tr__plan_t *eng, struct tr__dsmon **out, char *err, size_t errlen)
{
    const tr_config_t *c = eng->cfg;
    struct tr__dsmon *d = calloc(1, sizeof(*d));
    if (!d) return TR_ENOMEM;
    *out = d;
    d->spp = c->steps_per_print > 0 ? (uint64_t)c->steps_per_print : 10;
    d->train_batch = (uint64_t)c->train_batch_size;
    d->fp16 = c->fp16.enabled;
    d->scale0 = eng->loss_scale0;
    d->optimizer_type = c->optimizer.type;
    tr_throughput_init(&d->tput, d->train_batch, d->spp, 0);
    if (c->wall_clock_breakdown && tr_walltimers_create(&d->timers) < 0) return TR_ENOMEM;
    d->quiet = eng->rank != 0;
    d->pipelined = eng->stages > 1;
    d->t_print = tr_now_ns();
    return d->quiet ? 0 : open_monitors(d, c, err, errlen);
}

void tr__dsmon_destroy(struct tr__dsmon *d)
{
    if (!d) return;
    tr_walltimers_destroy(d->timers);
    tr_csv_monitor_destroy(d->csv);
    if (d->tb) tr_tb_writer_flush(d->tb);
    tr_tb_writer_destroy(d->tb);
    free(d);
}

void tr__dsmon_forward(struct tr__dsmon *d, uint64_t t0, uint64_t t1)
{
    tr_throughput_start(&d->tput, t0);
    timed(d, FWD, t0, t1);
}

/* The end of a micro-step: DeepSpeed's engine.step() from the throughput timer on. */
static void micro_end(struct tr__dsmon *d, bool boundary, uint64_t step0, uint64_t step1)
{
    char buf[512];
    if (tr_throughput_stop(&d->tput, boundary, step1, 0, 0, buf, sizeof(buf))) print_line(d, buf);
    timed(d, STEP, step0, step1);
    if (d->timers) log_timers(d, micro_names, step1);
}

void tr__dsmon_backward(struct tr__dsmon *d, uint64_t t0, uint64_t t1, bool boundary)
{
    if (boundary) { /* finished by tr__dsmon_step, once the reduction is known */
        d->bwd0 = t0;
        d->bwd1 = t1;
        return;
    }
    timed(d, BWD_INNER, t0, t1);
    timed(d, BWD_ALLREDUCE, t1, t1);
    timed(d, BWD, t0, t1);
    micro_end(d, false, t1, t1);
}

static void progress(struct tr__dsmon *d, const tr_msg_step_done_t *done)
{
    double lr = done->next_lr;
    const double mom[1][2] = {{done->next_beta1, done->next_beta2}};
    /* DeepSpeed prints the betas of every optimizer that has them (all but SGD) */
    size_t n_mom = d->optimizer_type != TR_OPTIMIZER_SGD && d->optimizer_type != TR_OPTIMIZER_NONE;
    char buf[512];
    tr_progress_line(0, done->global_step, done->skipped_steps, &lr, 1, mom, n_mom, buf,
                     sizeof(buf));
    print_line(d, buf);
}

static const char *const pipe_names[] = {"pipe_send_output", "pipe_send_grad", "pipe_recv_input",
                                         "pipe_recv_grad"};

/* DeepSpeed's pipeline timers: each adds the step's time, as a start and stop that far apart. */
void tr__dsmon_pipe(struct tr__dsmon *d, const tr_pipe_run_result_t *r, uint64_t now)
{
    const double ms[4] = {r->send_output_ms, r->send_grad_ms, r->recv_input_ms, r->recv_grad_ms};
    for (int i = 0; d->timers && i < 4; i++) {
        tr_walltimers_start(d->timers, pipe_names[i], now - (uint64_t)(ms[i] * 1e6));
        tr_walltimers_stop(d->timers, pipe_names[i], now);
    }
}

/* DeepSpeed's PipelineEngine.train_batch line: the mean time of the last steps_per_print
 * steps and the samples per second it gives. */
static void pipe_line(struct tr__dsmon *d, uint64_t steps, double loss, uint64_t now)
{
    double iter = (double)(now - d->t_print) / 1e9 / (double)d->spp;
    char buf[256];
    snprintf(buf, sizeof(buf), "steps: %llu loss: %0.4f iter time (s): %0.3f samples/sec: %0.3f",
             (unsigned long long)steps, loss, iter, iter > 0 ? (double)d->train_batch / iter : 0.0);
    d->t_print = now;
    print_line(d, buf);
}

void tr__dsmon_step(struct tr__dsmon *d, const tr_step_stats_t *st, const tr_msg_step_done_t *done)
{
    uint64_t samples = st->global_samples;
    uint64_t steps = done->global_step;
    /* DeepSpeed writes the loss in backward, before the step counts its samples */
    scalar(d, TR_TAG_TRAIN_LOSS, st->loss, samples - d->train_batch);
    uint64_t reduced = done->t_reduced > d->bwd1 ? done->t_reduced : d->bwd1;
    timed(d, BWD_INNER, d->bwd0, d->bwd1);
    timed(d, BWD_ALLREDUCE, d->bwd1, reduced);
    timed(d, BWD, d->bwd0, reduced);
    if (steps % d->spp == 0) progress(d, done);
    if (d->pipelined && steps % d->spp == 0) pipe_line(d, steps, st->loss, done->t_end);
    if (d->pipelined && d->timers && steps % d->spp == 0) { /* after train_batch's line */
        char line[512];
        tr_walltimers_log_line(d->timers, 0, pipe_names, 4, 1.0, 1, done->t_end, line,
                               sizeof(line));
        print_line(d, line);
    }
    char buf[512];
    if (tr_throughput_stop(&d->tput, 1, done->t_end, 0, 0, buf, sizeof(buf))) print_line(d, buf);
    scalar(d, TR_TAG_LR, done->next_lr, samples);
    if (d->fp16) loss_scale(d, done->next_loss_scale, samples);
    timed(d, STEP, done->t_begin, done->t_end);
    if (!d->timers) return;
    log_timers(d, micro_names, done->t_end);
    for (int i = 0; i < N_TIMERS; i++)
        scalar(d, elapsed_tags[i],
               tr_walltimers_elapsed_ms(d->timers, global_names[i], 0, done->t_end), samples);
    if (steps % d->spp == 0) log_timers(d, global_names, done->t_end);
}
