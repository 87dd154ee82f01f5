/* The `troupe` program's subcommands. Each takes the arguments after its name (argv[0] is
 * the subcommand) and returns the process exit status: 0 success, 2 bad usage or input. */
#ifndef TR_TOOLS_COMMANDS_H
#define TR_TOOLS_COMMANDS_H

#include "troupe/runtime.h"

/* Seconds on the monotonic clock (tr_now_ns), for the commands' timings. Any thread. */
static inline double tr__now_s(void)
{
    return (double)tr_now_ns() * 1e-9;
}

typedef struct tr_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} tr_command_t;

/* troupe config check|show FILE [--world-size N]: tools/cmd_config.c */
int tr_cmd_config(int argc, char **argv);
/* `troupe trace summary|plot|merge` (cmd_trace.c). */
int tr_cmd_trace(int argc, char **argv);
/* `troupe train --deepspeed_config FILE --steps N ...` (cmd_train.c; exit 1 when training
 * fails). */
int tr_cmd_train(int argc, char **argv);
int tr_cmd_launch(int argc, char **argv);
/* `troupe nvme-bench --dir D [aio flags] [--io-size N]` (cmd_nvme_bench.c; exit 1 when the
 * I/O fails). */
int tr_cmd_nvme_bench(int argc, char **argv);
/* `troupe nvme-tune --dir D [--io-size N] [--budget-s S]` (cmd_nvme_tune.c; exit 1 when the
 * I/O fails). */
int tr_cmd_nvme_tune(int argc, char **argv);
/* `troupe pipeline schedule|simulate --stages S --micro-batches M ...` (cmd_pipeline.c). */
int tr_cmd_pipeline(int argc, char **argv);
/* `troupe memory --deepspeed_config FILE [model flags] [--world-size N] [--budget SIZE]`
 * (cmd_memory.c; exit 1 when the config does not fit the budget). */
int tr_cmd_memory(int argc, char **argv);

#endif
