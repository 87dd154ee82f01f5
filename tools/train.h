/* `troupe train`'s parts: its options (train_args.c), the built-in MLP task and text sampling
 * (train_data.c) and the run itself (cmd_train.c). Private to tools/. */
#ifndef TR_TOOLS_TRAIN_H
#define TR_TOOLS_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "troupe.h"

#define TRAIN_MAX_WIDTHS 16

typedef struct train_opts {
    const char *config, *model, *load_llmc, *export_llmc;
    const char *train_data, *val_data, *save_dir, *trace_dir;
    int vocab, context, channels, layers, heads; /* gpt2 dims; 0 = not given */
    int widths[TRAIN_MAX_WIDTHS], n_widths;      /* mlp */
    int seq_len;                                 /* 0 = not given */
    long steps, val_every, val_batches, save_every, sample, print_every;
    long keep_last; /* 0 = keep every tag */
    uint64_t seed;
    int resume, overwrite, help;
} train_opts_t;

/* Parses argv (argv[0] is "train") into o and checks what can be checked without opening
 * anything. Returns 0, or -1 after printing to stderr which flag is wrong and what was
 * expected. Sets o->help for --help (the caller prints train_usage). */
int train_args_parse(int argc, char **argv, train_opts_t *o);
/* As train_args_parse, for a command that reads train's flags only to describe the model and
 * the config (`troupe memory`): --steps and --train-data are not required, and messages name
 * cmd ("troupe memory"). */
int train_args_parse_model(const char *cmd, int argc, char **argv, train_opts_t *o);
/* The GPT-2 dimensions the flags give, the defaults for those not given (vocab 256, context
 * 64, channels 128, layers 4, heads 4); padded_vocab_size 0 (the model pads). */
void train_gpt2_config(const train_opts_t *o, tr_gpt2_config_t *g);
/* Prints every flag with its description. */
void train_usage(FILE *f);

/* What the run's save dir held before it: with --overwrite, the tags of an earlier run,
 * removed at this run's first save. */
typedef struct train_savedir {
    char **old_tags;
    size_t n_old;
} train_savedir_t;

/* Checks every path the run writes (--save-dir, --trace, --export-llmc) and refuses a
 * --save-dir holding checkpoints without --resume or --overwrite; fills sd. 0, or -1 after
 * printing which flag and path are unusable and why. Before anything is built. */
int train_outputs_check(const train_opts_t *o, train_savedir_t *sd);
/* After a successful save of saved_tag: removes an earlier run's tags (--overwrite, first save
 * only) and the tags beyond --keep-last N, never the one `latest` names. Prints what it
 * removed; a failure to remove is a warning. */
void train_savedir_saved(const train_opts_t *o, train_savedir_t *sd, const char *saved_tag);
void train_savedir_close(train_savedir_t *sd);

/* The built-in task an MLP trains on: x uniform in [-1, 1)^in, the class the argmax over c of
 * sum_i x_i * w(i, c) for a fixed integer table w in {-2..2}. Sample s of the train stream is
 * a pure function of s; the val stream uses other samples. */
typedef struct mlp_task {
    int in, classes;
    uint64_t offset; /* 0: train samples; TRAIN_VAL_OFFSET: val samples */
} mlp_task_t;
#define TRAIN_VAL_OFFSET (1ull << 40)

/* A tr_batch_cb over an mlp_task_t. Loader thread. */
int train_mlp_batch(void *user, uint64_t index, int B, int T, int *tokens, float *x, int *targets,
                    float *y);

/* Generates n tokens from a copy of a GPT-2 model's parameters, starting from prompt (may be
 * empty: token 10, a newline), sampling with temperature 1 from a splitmix64 seeded by seed.
 * Writes them to out (n ints). 0 or a negative TR_E* code. The caller's thread, between
 * engine calls. */
int train_sample(const tr_model_t *model, const int *prompt, int n_prompt, int n, uint64_t seed,
                 int *out);

#endif
