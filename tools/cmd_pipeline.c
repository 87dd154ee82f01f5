/* `troupe pipeline schedule|simulate`: a pipeline stage's instruction list, as DeepSpeed's
 * engine would execute it, and the S stages' schedules run in virtual time with the bubble
 * they leave (troupe/pipeline.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "troupe/pipeline.h"

static const char *USAGE =
    "usage: troupe pipeline schedule --stages S --micro-batches M [--stage s]\n"
    "                                [--schedule 1f1b|zb|inference]\n"
    "       troupe pipeline simulate --stages S --micro-batches M [--forward F]\n"
    "                                [--backward B] [--weight-share W]\n";

static const char *HELP =
    "\n"
    "schedule prints stage s's schedule (every stage's, each after a `stage s (N buffers):`\n"
    "line, without --stage), one line per step: the step, a colon, then its instructions by\n"
    "DeepSpeed's names, each with its activation buffer in parentheses (empty for the step's\n"
    "collectives), e.g. `5: RecvGrad(0) SendActivation(2) BackwardPass(0)`. 1f1b (the default)\n"
    "and inference are DeepSpeed's TrainSchedule and InferenceSchedule; zb splits each\n"
    "backward into BackwardInput and BackwardWeight and runs the weight gradients where a\n"
    "stage would wait, keeping no more activations than 1f1b.\n"
    "\n"
    "simulate runs every stage's 1f1b and zb schedule against the others in virtual time: a\n"
    "forward costs F (default 1), a backward B (default 2), of which the weight gradients are\n"
    "the share W (default 0.5) in zb; transfers cost nothing. It prints each schedule's\n"
    "makespan and bubble (1 - busy / (S makespan)) beside 1F1B's theory (S-1)/(M+S-1).\n"
    "Its work grows as S^2 (M + S - 1): past 2^23 (a few seconds) it is refused (exit 2).\n"
    "S is at most 4096 (as the config's pipeline.stages), M at most 65535.\n"
    "Exit status: 0; 1 when a schedule cannot be built or simulated; 2 for a bad flag.\n";

typedef struct opts {
    int stages, micro_batches, stage, kind;
    double forward, backward, weight_share;
} opts_t;

/* Prints "troupe pipeline: " and the message to stderr; returns rc. */
static int complain(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int complain(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("troupe pipeline: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    return rc;
}

static int int_flag(const char *flag, const char *v, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "troupe pipeline: %s: expected an integer from %d to %d, got '%s'\n", flag,
                lo, hi, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int real_flag(const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "troupe pipeline: %s: expected a number from %g to %g, got '%s'\n", flag,
                lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int schedule_flag(const char *v, int *kind)
{
    if (!strcmp(v, "1f1b"))
        *kind = TR_PIPE_TRAIN_1F1B;
    else if (!strcmp(v, "zb"))
        *kind = TR_PIPE_TRAIN_ZB;
    else if (!strcmp(v, "inference"))
        *kind = TR_PIPE_INFERENCE;
    else
        return complain(-1, "--schedule: expected 1f1b, zb or inference, got '%s'\n", v);
    return 0;
}

static int parse(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){
        .stage = -1, .kind = TR_PIPE_TRAIN_1F1B, .forward = 1, .backward = 2, .weight_share = 0.5};
    for (int i = 2; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return complain(-1, "%s needs a value\n%s", a, USAGE);
        int rc = !strcmp(a, "--stages") ? int_flag(a, v, 1, TR_PIPE_MAX_STAGES, &o->stages)
                 : !strcmp(a, "--micro-batches")
                     ? int_flag(a, v, 1, TR_PIPE_MAX_MICRO_BATCHES, &o->micro_batches)
                 : !strcmp(a, "--stage")    ? int_flag(a, v, 0, TR_PIPE_MAX_STAGES - 1, &o->stage)
                 : !strcmp(a, "--schedule") ? schedule_flag(v, &o->kind)
                 : !strcmp(a, "--forward")  ? real_flag(a, v, 0, 1e9, &o->forward)
                 : !strcmp(a, "--backward") ? real_flag(a, v, 0, 1e9, &o->backward)
                 : !strcmp(a, "--weight-share") ? real_flag(a, v, 0, 1, &o->weight_share)
                                                : complain(-1, "unknown flag %s\n%s", a, USAGE);
        if (rc < 0) return -1;
    }
    if (!o->stages || !o->micro_batches)
        return complain(-1, "--stages and --micro-batches are needed\n%s", USAGE);
    if (o->stage >= o->stages)
        return complain(-1, "--stage %d: expected 0 to %d (--stages %d)\n", o->stage, o->stages - 1,
                        o->stages);
    return 0;
}

static int print_stage(const opts_t *o, int stage, int header)
{
    char err[256], line[4096];
    tr_pipe_schedule_t *s;
    if (tr_pipe_schedule_create(&s, o->kind, o->micro_batches, o->stages, stage, err, sizeof(err)) <
        0)
        return complain(2, "%s\n", err);
    if (header) printf("stage %d (%d buffers):\n", stage, tr_pipe_schedule_buffers(s));
    for (int k = 0; k < tr_pipe_schedule_steps(s); k++) {
        tr_pipe_schedule_format_step(s, k, line, sizeof(line));
        puts(line);
    }
    tr_pipe_schedule_destroy(s);
    return 0;
}

static int simulate_kind(const opts_t *o, int kind, const char *name)
{
    char err[256];
    int S = o->stages, rc = 0;
    tr_pipe_schedule_t **st = calloc((size_t)S, sizeof(*st));
    if (!st) return complain(1, "out of memory\n");
    for (int s = 0; rc == 0 && s < S; s++)
        rc = tr_pipe_schedule_create(&st[s], kind, o->micro_batches, S, s, err, sizeof(err));
    tr_pipe_costs_t c = {o->forward, o->backward, o->backward * (1 - o->weight_share),
                         o->backward * o->weight_share};
    tr_pipe_sim_t r;
    if (rc == 0)
        rc = tr_pipe_simulate((const tr_pipe_schedule_t *const *)st, S, &c, &r, err, sizeof(err));
    if (rc == 0) {
        printf("pipeline.%s.makespan: %.4g units\n", name, r.makespan);
        printf("pipeline.%s.bubble: %.4f (theory %.4f)\n", name, r.bubble, r.theory);
        printf("pipeline.%s.buffers_stage0: %d\n", name, tr_pipe_schedule_buffers(st[0]));
    } else {
        fprintf(stderr, "troupe pipeline: %s\n", err);
    }
    for (int s = 0; s < S; s++)
        tr_pipe_schedule_destroy(st[s]);
    free(st);
    return rc < 0 ? 1 : 0;
}

/* simulate builds S schedules, and zb's of one stage runs every stage's 1F1B order in unit
 * time: S^2 (M + S - 1) steps in all. Past this many it would take minutes and gigabytes (at
 * the flags' maximums, days), so it is refused, naming the flags. About 2 s at the limit. */
#define SIM_MAX_WORK (1LL << 23)

static int simulate_bounded(const opts_t *o)
{
    long long S = o->stages, work = S * S * (o->micro_batches + S - 1);
    if (work > SIM_MAX_WORK)
        return complain(2,
                        "simulate: --stages %d and --micro-batches %d are too large: stages^2 x "
                        "(micro-batches + stages - 1) is %lld, the limit is %lld (fewer stages "
                        "or micro-batches; `pipeline schedule --stage s` prints one stage of "
                        "any size)\n",
                        o->stages, o->micro_batches, work, SIM_MAX_WORK);
    return 0;
}

int tr_cmd_pipeline(int argc, char **argv)
{
    const char *sub = argc > 1 ? argv[1] : "";
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h")) {
        printf("%s%s", USAGE, HELP);
        return 0;
    }
    if (strcmp(sub, "schedule") && strcmp(sub, "simulate"))
        return complain(2, "expected schedule or simulate\n%s", USAGE);
    opts_t o;
    if (parse(argc, argv, &o) < 0) return 2;
    if (!strcmp(sub, "simulate")) {
        if (simulate_bounded(&o)) return 2;
        printf("pipeline.shape: %d stages, %d micro-batches; forward %g, backward %g (weight "
               "share %g)\n",
               o.stages, o.micro_batches, o.forward, o.backward, o.weight_share);
        int rc = simulate_kind(&o, TR_PIPE_TRAIN_1F1B, "1f1b");
        return rc ? rc : simulate_kind(&o, TR_PIPE_TRAIN_ZB, "zb");
    }
    if (o.stage >= 0) return print_stage(&o, o.stage, 0);
    for (int s = 0; s < o.stages; s++)
        if (print_stage(&o, s, 1)) return 2;
    return 0;
}
