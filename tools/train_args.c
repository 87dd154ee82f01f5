/* train_args.c: `troupe train`'s flags. One table names every flag, its argument, where it
 * goes in train_opts_t, its bounds and its help line; the parser and --help both read it.
 * Flags take their value as `--flag V` or `--flag=V`. A trailing `--local_rank=N` (what
 * DeepSpeed's launcher appends) is accepted and ignored: this build trains one rank. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

typedef enum { F_STR, F_INT, F_LONG, F_U64, F_SWITCH, F_WIDTHS, F_IGNORE } flag_kind_t;

typedef struct flag {
    const char *name, *arg;
    flag_kind_t kind;
    size_t offset;
    long min, max;
    const char *help;
} flag_t;

/* The command whose flags these are, for messages, and whether it only describes the model
 * and config (troupe memory: the run's own requirements, --steps and --train-data, are not
 * asked for). Set by the entry points; the tools are single-threaded. */
static const char *prog = "troupe train";
static int model_only;

#define O(field) offsetof(train_opts_t, field)
static const flag_t flags[] = {
    {"--deepspeed_config", "FILE", F_STR, O(config), 0, 0,
     "DeepSpeed JSON config (batch sizes, optimizer, scheduler, monitors); required"},
    {"--model", "gpt2|mlp", F_STR, O(model), 0, 0, "the model to train (default gpt2)"},
    {"--vocab", "V", F_INT, O(vocab), 2, 65536, "gpt2: vocabulary size (default 256, bytes)"},
    {"--context", "T", F_INT, O(context), 1, 1 << 20, "gpt2: context length (default 64)"},
    {"--channels", "C", F_INT, O(channels), 1, 1 << 16, "gpt2: channels (default 128)"},
    {"--layers", "L", F_INT, O(layers), 1, 1024, "gpt2: transformer blocks (default 4)"},
    {"--heads", "NH", F_INT, O(heads), 1, 1024, "gpt2: attention heads (default 4)"},
    {"--widths", "A,B,...", F_WIDTHS, O(widths), 1, 1 << 16,
     "mlp: layer widths, inputs first, classes last (default 16,32,4)"},
    {"--load-llmc", "FILE", F_STR, O(load_llmc), 0, 0,
     "gpt2: start from an llm.c checkpoint; its dims are used (dims flags must agree)"},
    {"--export-llmc", "FILE", F_STR, O(export_llmc), 0, 0,
     "gpt2: write the trained model as an llm.c checkpoint at the end"},
    {"--train-data", "GLOB", F_STR, O(train_data), 0, 0,
     "gpt2: llm.c token shards to train on (quote the glob); required for gpt2"},
    {"--val-data", "GLOB", F_STR, O(val_data), 0, 0,
     "gpt2: token shards to validate on (default: the train shards)"},
    {"--val-every", "N", F_LONG, O(val_every), 0, 1L << 40,
     "measure the validation loss every N steps (default 0: only at the end)"},
    {"--val-batches", "K", F_LONG, O(val_batches), 1, 1L << 30,
     "micro-batches per validation (default 8): the first K of the validation data, the "
     "same ones on any number of ranks (the ranks split them)"},
    {"--seq-len", "T", F_INT, O(seq_len), 1, 1 << 20,
     "gpt2: positions per training sequence (default: the context length)"},
    {"--steps", "N", F_LONG, O(steps), 0, 1L << 40,
     "train until the global step is N (a resumed run continues to N); required"},
    {"--save-dir", "DIR", F_STR, O(save_dir), 0, 0,
     "save checkpoints here (DIR/global_stepN/, DIR/latest), always at the end; if DIR holds "
     "checkpoints: --resume or --overwrite"},
    {"--save-every", "N", F_LONG, O(save_every), 0, 1L << 40,
     "also save every N steps (needs --save-dir); each save is written in the background "
     "while training goes on (checkpoint.writer.decoupled) and reported as saved once latest "
     "names it, at the next save or at the end; a failed save is reported, its tag removed, "
     "and training goes on (latest keeps the last good save)"},
    {"--keep-last", "N", F_LONG, O(keep_last), 1, 1L << 30,
     "after each save keep the N newest global_step tags (and always the one latest names)"},
    {"--resume", NULL, F_SWITCH, O(resume), 0, 0,
     "continue from the checkpoint DIR/latest names (needs --save-dir)"},
    {"--overwrite", NULL, F_SWITCH, O(overwrite), 0, 0,
     "start at step 0 in a --save-dir holding checkpoints; they are removed at the first save"},
    {"--seed", "S", F_U64, O(seed), 0, 0, "data order and initialisation (default: the config's)"},
    {"--sample", "N", F_LONG, O(sample), 0, 1 << 20,
     "gpt2: print N generated tokens at the end (bytes as text when the vocab is 256)"},
    {"--trace", "DIR", F_STR, O(trace_dir), 0, 0, "write the actors' timelines to DIR"},
    {"--print-every", "N", F_LONG, O(print_every), 1, 1L << 40,
     "without a terminal: a line every N steps (default: the config's steps_per_print)"},
    {"--local_rank", "N", F_IGNORE, 0, 0, 1 << 20,
     "accepted and ignored (DeepSpeed's launcher appends it)"},
    {"--help", NULL, F_SWITCH, O(help), 0, 0, "this text"},
};
#undef O
static const size_t n_flags = sizeof(flags) / sizeof(flags[0]);

void train_usage(FILE *f)
{
    fprintf(f, "usage: troupe train --deepspeed_config FILE --steps N [--model gpt2|mlp] [flags]\n"
               "\nTrains a model with Troupe's engine. Every output path and every token of the\n"
               "shards is checked before the first step. The checkpoint (--save-dir) and the\n"
               "export (--export-llmc) are written at the end even when the validation fails.\n"
               "Exit status: 0 done (also after SIGINT, which finishes the step and saves when\n"
               "--save-dir is set; under mpirun send SIGUSR1 to mpirun, which forwards it to\n"
               "every rank, as SIGINT to mpirun aborts the job), 1 training, a validation or the\n"
               "last checkpoint save failed (an earlier failed save does not stop the run), or\n"
               "memory ran out, 2 a bad flag, file, config or checkpoint (--resume).\n"
               "Data-parallel: `mpirun -np N troupe train ...` or `troupe launch ... train ...`;\n"
               "the ranks come from the launcher and rank 0 prints. The config's\n"
               "zero_optimization.stage (0-2) and overlap_comm say what is partitioned and\n"
               "when the gradients travel; each rank's memory is logged at start (`troupe\n"
               "memory` with the same flags predicts it before a run, and a config predicted\n"
               "not to fit this machine is refused at start, naming the knobs). A rank that\n"
               "diverges or hangs is named (troupe.comm.timeout_s); every rank needs the same\n"
               "config (checked before step 1: the keys that differ are named), and every rank\n"
               "ends with the same exit status. Every rank writes its part\n"
               "of a checkpoint (with ZeRO stage >= 1 its optimizer partition); --resume works\n"
               "with another number of ranks than the save's (the optimizer state is split\n"
               "anew; keep train_batch_size the same so the data stream continues).\n"
               "Pipeline: the config's \"pipeline\": {\"stages\": S} runs each step's\n"
               "micro-batches through S stages (1f1b or zb): in one process as S actors, or\n"
               "under mpirun -np S*D one stage per rank, D data-parallel replicas (stage-major;\n"
               "train_batch_size counts the D replicas, as DeepSpeed's does).\n\n");
    for (size_t i = 0; i < n_flags; i++) {
        char left[48];
        snprintf(left, sizeof(left), "%s%s%s", flags[i].name, flags[i].arg ? " " : "",
                 flags[i].arg ? flags[i].arg : "");
        fprintf(f, "  %-26s %s\n", left, flags[i].help);
    }
    fprintf(f, "\nmlp: trains on a built-in synthetic task (inputs uniform in [-1, 1), the class\n"
               "the argmax of a fixed integer projection), since token shards are for token\n"
               "models. gpt2: trains from scratch unless --load-llmc or --resume.\n");
}

static const flag_t *find_flag(const char *a, size_t len)
{
    for (size_t i = 0; i < n_flags; i++)
        if (strlen(flags[i].name) == len && !strncmp(flags[i].name, a, len)) return &flags[i];
    return NULL;
}

static int parse_long(const flag_t *f, const char *v, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < f->min || x > f->max) {
        fprintf(stderr, "%s: %s: expected an integer from %ld to %ld, got '%s'\n", prog, f->name,
                f->min, f->max, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_u64(const flag_t *f, const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-') {
        fprintf(stderr, "%s: %s: expected a non-negative integer, got '%s'\n", prog, f->name, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* One width of --widths: item i (1-based) of the list v, text [tok, tok+len). */
static int parse_width(const flag_t *f, const char *v, int i, const char *tok, size_t len, int *out)
{
    char item[32], *end;
    if (len == 0 || len >= sizeof(item)) {
        fprintf(stderr,
                "%s: %s: width %d is %s in '%s'; expected comma-separated "
                "integers from %ld to %ld\n",
                prog, f->name, i, len ? "too long" : "empty", v, f->min, f->max);
        return -1;
    }
    memcpy(item, tok, len);
    item[len] = '\0';
    errno = 0;
    long x = strtol(item, &end, 10);
    if (errno || item[0] < '0' || item[0] > '9' || *end || x < f->min || x > f->max) {
        fprintf(stderr,
                "%s: %s: width %d is '%s' in '%s'; expected an integer from "
                "%ld to %ld\n",
                prog, f->name, i, item, v, f->min, f->max);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* "A,B,...": 2 to TRAIN_MAX_WIDTHS integers; an empty item ("16,,4", "16,4,") is an error,
 * never skipped. One line on stderr names what is wrong. */
static int parse_widths(const flag_t *f, const char *v, train_opts_t *o)
{
    o->n_widths = 0;
    for (const char *tok = v;; tok++) {
        const char *comma = strchr(tok, ',');
        size_t len = comma ? (size_t)(comma - tok) : strlen(tok);
        if (o->n_widths == TRAIN_MAX_WIDTHS) {
            fprintf(stderr, "%s: %s: at most %d widths, got more in '%s'\n", prog, f->name,
                    TRAIN_MAX_WIDTHS, v);
            return -1;
        }
        if (parse_width(f, v, o->n_widths + 1, tok, len, &o->widths[o->n_widths]) < 0) return -1;
        o->n_widths++;
        if (!comma) break;
        tok = comma;
    }
    if (o->n_widths < 2) {
        fprintf(stderr,
                "%s: %s: expected at least 2 widths (inputs,classes), got "
                "'%s'\n",
                prog, f->name, v);
        return -1;
    }
    return 0;
}

static int set_value(const flag_t *f, const char *v, train_opts_t *o)
{
    char *field = (char *)o + f->offset;
    long x;
    switch (f->kind) {
    case F_STR:
        if (!v[0]) {
            fprintf(stderr, "%s: %s: expected %s, got an empty string\n", prog, f->name, f->arg);
            return -1;
        }
        *(const char **)field = v;
        return 0;
    case F_INT:
        if (parse_long(f, v, &x) < 0) return -1;
        *(int *)field = (int)x;
        return 0;
    case F_LONG:
        return parse_long(f, v, (long *)field);
    case F_U64:
        return parse_u64(f, v, (uint64_t *)field);
    case F_WIDTHS:
        return parse_widths(f, v, o);
    case F_IGNORE:
        return parse_long(f, v, &x);
    case F_SWITCH:
        break;
    }
    return 0;
}

/* One argument (and maybe the next): returns how many were used, or -1. */
static int parse_one(int argc, char **argv, int i, train_opts_t *o)
{
    const char *a = argv[i], *eq = strchr(a, '=');
    const flag_t *f = a[0] == '-' ? find_flag(a, eq ? (size_t)(eq - a) : strlen(a)) : NULL;
    if (!f) {
        fprintf(stderr, "%s: unknown %s '%s' (see %s --help)\n", prog,
                a[0] == '-' ? "flag" : "argument", a, prog);
        return -1;
    }
    if (f->kind == F_SWITCH) {
        if (eq) {
            fprintf(stderr, "%s: %s takes no value\n", prog, f->name);
            return -1;
        }
        *(int *)((char *)o + f->offset) = 1;
        return 1;
    }
    if (!eq && i + 1 >= argc) {
        fprintf(stderr, "%s: %s: expected %s after it\n", prog, f->name, f->arg);
        return -1;
    }
    return set_value(f, eq ? eq + 1 : argv[i + 1], o) < 0 ? -1 : eq ? 1 : 2;
}

static int gpt2_only(const train_opts_t *o)
{
    const char *bad = o->load_llmc     ? "--load-llmc"
                      : o->export_llmc ? "--export-llmc"
                      : o->train_data  ? "--train-data"
                      : o->val_data    ? "--val-data"
                      : o->sample      ? "--sample"
                      : o->seq_len     ? "--seq-len"
                      : o->vocab || o->context || o->channels || o->layers || o->heads
                          ? "a gpt2 dims flag (--vocab/--context/--channels/--layers/--heads)"
                          : NULL;
    if (bad)
        fprintf(stderr,
                "%s: %s: only for --model gpt2 (the mlp trains on the built-in "
                "synthetic task)\n",
                prog, bad);
    return bad ? -1 : 0;
}

static int check(train_opts_t *o)
{
    if (!o->config || (o->steps < 0 && !model_only)) {
        fprintf(stderr, "%s: %s is required (see %s --help)\n", prog,
                !o->config ? "--deepspeed_config FILE" : "--steps N", prog);
        return -1;
    }
    if (strcmp(o->model, "gpt2") && strcmp(o->model, "mlp")) {
        fprintf(stderr, "%s: --model: expected gpt2 or mlp, got '%s'\n", prog, o->model);
        return -1;
    }
    const char *needs_dir = o->resume       ? "--resume"
                            : o->save_every ? "--save-every"
                            : o->keep_last  ? "--keep-last"
                            : o->overwrite  ? "--overwrite"
                                            : NULL;
    if (needs_dir && !o->save_dir) {
        fprintf(stderr, "%s: %s needs --save-dir DIR\n", prog, needs_dir);
        return -1;
    }
    if (o->resume && o->overwrite) {
        fprintf(stderr,
                "%s: --resume and --overwrite: choose one (continue from the "
                "checkpoints in --save-dir, or replace them)\n",
                prog);
        return -1;
    }
    if (o->resume && o->load_llmc) {
        fprintf(stderr,
                "%s: --load-llmc and --resume: a resumed run takes its weights "
                "from the checkpoint, so the llm.c file would be ignored; drop --load-llmc (or "
                "--resume, to start a new run from the llm.c weights)\n",
                prog);
        return -1;
    }
    if (!strcmp(o->model, "mlp")) return gpt2_only(o);
    if (o->n_widths) {
        fprintf(stderr, "%s: --widths: only for --model mlp\n", prog);
        return -1;
    }
    if (!o->train_data && !model_only) {
        fprintf(stderr, "%s: --train-data GLOB is required for --model gpt2\n", prog);
        return -1;
    }
    return 0;
}

static int parse(int argc, char **argv, train_opts_t *o)
{
    *o = (train_opts_t){.model = "gpt2", .steps = -1, .val_batches = 8};
    for (int i = 1; i < argc;) {
        int used = parse_one(argc, argv, i, o);
        if (used < 0) return -1;
        i += used;
    }
    if (o->help) return 0;
    if (check(o) < 0) return -1;
    if (!strcmp(o->model, "mlp") && !o->n_widths) {
        int def[] = {16, 32, 4};
        memcpy(o->widths, def, sizeof(def));
        o->n_widths = 3;
    }
    return 0;
}

int train_args_parse(int argc, char **argv, train_opts_t *o)
{
    prog = "troupe train";
    model_only = 0;
    return parse(argc, argv, o);
}

int train_args_parse_model(const char *cmd, int argc, char **argv, train_opts_t *o)
{
    prog = cmd;
    model_only = 1;
    return parse(argc, argv, o);
}

void train_gpt2_config(const train_opts_t *o, tr_gpt2_config_t *g)
{
    *g = (tr_gpt2_config_t){.vocab_size = o->vocab ? o->vocab : 256,
                            .max_seq_len = o->context ? o->context : 64,
                            .num_layers = o->layers ? o->layers : 4,
                            .num_heads = o->heads ? o->heads : 4,
                            .channels = o->channels ? o->channels : 128};
}
