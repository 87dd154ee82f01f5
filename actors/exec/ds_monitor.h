/* ds_monitor.h: DeepSpeed's timer lines, throughput/progress lines, csv_monitor and tensorboard
 * scalars (ds_monitor.c). create/destroy on the client's thread; the rest on the executor's. */
#ifndef TR_ACTORS_EXEC_DS_MONITOR_H
#define TR_ACTORS_EXEC_DS_MONITOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/engine/plan.h"
#include "troupe/msg.h"

struct tr__dsmon;

int tr__dsmon_create(const tr__plan_t *eng, struct tr__dsmon **out, char *err, size_t errlen);
/* NULL does nothing. */
void tr__dsmon_destroy(struct tr__dsmon *d);
/* A pipelined step's transfer times, for DeepSpeed's pipeline timers (wall_clock_breakdown). */
struct tr_pipe_run_result;
void tr__dsmon_pipe(struct tr__dsmon *d, const struct tr_pipe_run_result *r, uint64_t now);
/* A training micro-batch's forward ran from t0 to t1. */
void tr__dsmon_forward(struct tr__dsmon *d, uint64_t t0, uint64_t t1);
/* Its backward ran from t0 to t1; off the boundary this ends the micro-step's outputs. */
void tr__dsmon_backward(struct tr__dsmon *d, uint64_t t0, uint64_t t1, bool boundary);
/* The boundary's STEP_DONE arrived: the step's outputs. */
void tr__dsmon_step(struct tr__dsmon *d, const tr_step_stats_t *st, const tr_msg_step_done_t *done);

#endif
