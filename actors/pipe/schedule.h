/* pipe_schedule.h: what the pipeline simulator (pipe_sim.c) and runner (pipe_run.c,
 * pipe_model.c) read of a schedule (pipe_schedule.c) beyond troupe/pipeline.h. */
#ifndef TR_ACTORS_PIPE_SCHEDULE_H
#define TR_ACTORS_PIPE_SCHEDULE_H

#include "troupe/pipeline.h"

/* Its kind, micro-batches, stages and stage; returns its number of instructions. */
int tr__pipe_schedule_shape(const tr_pipe_schedule_t *s, int *kind, int *M, int *S, int *stage);

/* Every instruction, step after step. */
const tr_pipe_instr_t *tr__pipe_schedule_all(const tr_pipe_schedule_t *s);

/* Stage s's activation buffers under a schedule of kind for M micro-batches on S stages
 * (tr_pipe_schedule_buffers without keeping the schedule); < 0 with err as
 * tr_pipe_schedule_create's. Any thread. */
int tr__pipe_stage_buffers(int kind, int M, int S, int s, char *err, size_t errlen);

#endif
