/* troupe: the command-line front end. `troupe <command> [args]`; `troupe help` lists them. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "troupe/blas.h"
#include "troupe/runtime.h"

static int cmd_version(int argc, char **argv);
static int cmd_help(int argc, char **argv);

static const tr_command_t commands[] = {
    {"train", "train a GPT-2 or an MLP from a DeepSpeed config (troupe train --help)",
     tr_cmd_train},
    {"memory", "predict a config's memory per rank, by kind and for every ZeRO stage and offload",
     tr_cmd_memory},
    {"launch", "run a command on the ranks of a DeepSpeed hostfile, through mpirun", tr_cmd_launch},
    {"config", "check or show a DeepSpeed config as Troupe resolves it", tr_cmd_config},
    {"version", "print the version and the optional parts this build has", cmd_version},
    {"trace", "summarise, plot or merge trace files (troupe trace --help)", tr_cmd_trace},
    {"nvme-bench", "measure the aio engine's write and read GB/s in a directory",
     tr_cmd_nvme_bench},
    {"nvme-tune", "sweep the aio knobs in a directory; print the best `aio` section",
     tr_cmd_nvme_tune},
    {"pipeline", "print a pipeline stage's schedule, or simulate a schedule's bubble",
     tr_cmd_pipeline},
    {"help", "list the commands", cmd_help},
};
static const size_t n_commands = sizeof(commands) / sizeof(commands[0]);

static int cmd_version(int argc, char **argv)
{
    tr_build_info_t b;
    tr_build_info(&b);
    printf("troupe %s (mpi %s, cuda %s, nccl %s)\n", b.version, b.mpi ? "yes" : "no",
           b.cuda ? "yes" : "no", b.nccl ? "yes" : "no");
    return 0;
}

static int cmd_help(int argc, char **argv)
{
    printf("usage: troupe <command> [args]\n\ncommands:\n");
    for (size_t i = 0; i < n_commands; i++)
        printf("  %-10s %s\n", commands[i].name, commands[i].summary);
    printf("\n`troupe <command> --help` describes one command.\n");
    return 0;
}

int main(int argc, char **argv)
{
    tr_blas_reexec_if_needed(argc, argv); /* returns only when no re-exec was needed */
    if (argc < 2) {
        cmd_help(0, NULL);
        return 2;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h")) return cmd_help(0, NULL);
    if (!strcmp(name, "--version")) return cmd_version(0, NULL);
    for (size_t i = 0; i < n_commands; i++)
        if (!strcmp(commands[i].name, name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "troupe: unknown command '%s' (see `troupe help`)\n", name);
    return 2;
}
