/* pipeline_demo: pipeline parallelism with stage actors, in one process or under `mpirun -np S`
 * one stage per process. First, with --train-data, the byte-level GPT of `make demo` trained
 * through S stages by the engine (gpt_stages.c); then a pipeline's schedule executed with
 * synthetic layers, and its measured bubble beside 1F1B's theory.
 *
 *   pipeline_demo [--stages S] [--micro-batches M] [--layers L] [--layer-cost-ms X]
 *                 [--schedule 1f1b|zb|both] [--batches N] [--trace DIR]
 *                 [--train-data SHARD [--steps N]]
 *
 * Training: GPT-2 with vocab 256 (bytes), context 64, 128 channels, 4 blocks, 4 heads, batches
 * of 4 sequences per micro-batch, AdamW at lr 2e-3, the layers cut into S stages by their
 * parameter counts (DeepSpeed's "parameters" partition); under mpirun S is the ranks. Real layers
 * share this machine's cores, so their timing says nothing of a pipeline's bubble (that needs a
 * device per stage): the synthetic run measures that.
 *
 * The model is L layers (default 4 per stage) cut evenly into S stages. Each layer costs X ms
 * forward and 2X backward, and zb's split halves cost X each (input gradient, weight
 * gradient): a sleep, not a spin, so S stages show the schedule's shape on a two-core laptop
 * without competing for the cores. Each stage is an actor on its own thread, spawned once per
 * schedule in the demo's runtime and sent one message per batch; activations and
 * gradients travel between neighbours as messages whose headers are checked on arrival. For
 * each schedule it runs N batches (default 3) and prints the median bubble, 1 - busy / (S x
 * makespan), beside theory's (S - 1) / (M + S - 1). With --trace DIR the timeline (one lane
 * per stage, a span per forward and backward) goes to DIR for `troupe trace plot`.
 * Uses only the public API (troupe.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <troupe.h>

#include "gpt_stages.h"

typedef struct demo {
    int stages, micro_batches, layers, batches, which; /* which: 1 1f1b, 2 zb, 3 both */
    double cost_ms;
    const char *trace, *train_data;
    int steps;
    int rank, across; /* under mpirun: this process runs stage `rank` (one per rank) */
} demo_t;

static int sleep_ms(double ms)
{
    struct timespec ts = {(time_t)(ms / 1e3),
                          (long)((ms - (double)(time_t)(ms / 1e3) * 1e3) * 1e6)};
    while (nanosleep(&ts, &ts) < 0)
        if (errno != EINTR) return TR_EINVAL;
    return 0;
}

/* A stage's layers [s L / S, (s + 1) L / S): their synthetic cost for instruction x. */
static int exec(void *user, int stage, const tr_pipe_instr_t *x, const void *in,
                tr_pipe_report_t *rep)
{
    const demo_t *d = user;
    (void)in; /* a synthetic run: headers only */
    (void)rep;
    int layers = (stage + 1) * d->layers / d->stages - stage * d->layers / d->stages;
    double per = x->op == TR_PIPE_FORWARD           ? 1
                 : x->op == TR_PIPE_BACKWARD        ? 2
                 : x->op == TR_PIPE_BACKWARD_INPUT  ? 1
                 : x->op == TR_PIPE_BACKWARD_WEIGHT ? 1
                                                    : 0;
    return per > 0 ? sleep_ms(per * layers * d->cost_ms) : 0;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* N batches of one schedule on S stage actors, spawned once in a runtime of the demo's. */
static int run_kind(const demo_t *d, int kind, const char *name, tr_monitor_t *mon)
{
    double bubble[64], make[64], theory = 0;
    char err[1024];
    tr_pipe_run_opts_t o = {.kind = kind,
                            .stages = d->stages,
                            .micro_batches = d->micro_batches,
                            .exec = exec,
                            .user = (void *)d,
                            .link_elements = 1,
                            .link_dtype = TR_DTYPE_F32,
                            .monitor = mon,
                            .across_ranks = d->across};
    tr_runtime_t *rt;
    tr_pipe_t *p = NULL;
    int rc = tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 1});
    if (rc < 0) {
        fprintf(stderr, "pipeline_demo: cannot start a runtime: %s\n", tr_strerror(rc));
        return 1;
    }
    rc = tr_pipe_create(&p, rt, &o, err, sizeof(err));
    for (int i = 0; rc == 0 && i < d->batches; i++) {
        tr_pipe_run_result_t r;
        rc = tr_pipe_run(p, (unsigned long long)i, NULL, &r, err, sizeof(err));
        if (rc < 0) break;
        bubble[i] = r.bubble;
        make[i] = r.makespan_ms;
        theory = r.theory;
    }
    tr_runtime_shutdown(rt, "pipeline demo: batches done");
    tr_runtime_run(rt);
    tr_runtime_close(rt);
    tr_pipe_destroy(p);
    if (rc < 0) {
        fprintf(stderr, "pipeline_demo: %s\n", err);
        return 1;
    }
    qsort(bubble, (size_t)d->batches, sizeof(double), cmp);
    qsort(make, (size_t)d->batches, sizeof(double), cmp);
    if (d->across) /* each rank measures its own stage, from its own start */
        printf("%s: rank %d, stage %d of %d, M %d: idle %.3f of its batch (median of %d), "
               "theory %.3f (1F1B's bubble, (S-1)/(M+S-1)); makespan %.1f ms\n",
               name, d->rank, d->rank, d->stages, d->micro_batches, bubble[d->batches / 2],
               d->batches, theory, make[d->batches / 2]);
    else
        printf("%s: S %d, M %d: bubble %.3f measured (median of %d batches), theory %.3f "
               "(1F1B's (S-1)/(M+S-1)); makespan %.1f ms\n",
               name, d->stages, d->micro_batches, bubble[d->batches / 2], d->batches, theory,
               make[d->batches / 2]);
    return 0;
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out)
{
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || end == v || x < lo || x > hi) {
        fprintf(stderr, "pipeline_demo: %s: expected an integer from %d to %d, got '%s'\n", flag,
                lo, hi, v ? v : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse(int argc, char **argv, demo_t *d)
{
    *d = (demo_t){.stages = 4,
                  .micro_batches = 8,
                  .layers = 0,
                  .batches = 3,
                  .which = 3,
                  .cost_ms = 2,
                  .steps = 40};
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--stages"))
            rc = parse_int(a, v, 1, 64, &d->stages);
        else if (!strcmp(a, "--micro-batches"))
            rc = parse_int(a, v, 1, 4096, &d->micro_batches);
        else if (!strcmp(a, "--layers"))
            rc = parse_int(a, v, 1, 100000, &d->layers);
        else if (!strcmp(a, "--batches"))
            rc = parse_int(a, v, 1, 64, &d->batches);
        else if (!strcmp(a, "--steps"))
            rc = parse_int(a, v, 1, 100000, &d->steps);
        else if (!strcmp(a, "--trace") && v)
            d->trace = v;
        else if (!strcmp(a, "--train-data") && v)
            d->train_data = v;
        else if (!strcmp(a, "--layer-cost-ms") && v) {
            char *end;
            d->cost_ms = strtod(v, &end);
            if (*end || end == v || !(d->cost_ms >= 0 && d->cost_ms <= 10000)) {
                fprintf(stderr, "pipeline_demo: --layer-cost-ms: expected 0 to 10000, got '%s'\n",
                        v);
                rc = -1;
            }
        } else if (!strcmp(a, "--schedule") && v) {
            d->which = !strcmp(v, "1f1b") ? 1 : !strcmp(v, "zb") ? 2 : !strcmp(v, "both") ? 3 : 0;
            if (!d->which) {
                fprintf(stderr, "pipeline_demo: --schedule: expected 1f1b, zb or both, got '%s'\n",
                        v);
                rc = -1;
            }
        } else {
            fprintf(stderr, "pipeline_demo: unknown flag or missing value: %s\n", a);
            rc = -1;
        }
        if (rc < 0) return -1;
    }
    if (!d->layers) d->layers = 4 * d->stages;
    if (d->layers < d->stages) {
        fprintf(stderr, "pipeline_demo: --layers %d: fewer layers than the %d stages\n", d->layers,
                d->stages);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    demo_t d;
    if (parse(argc, argv, &d) < 0) return 2;
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE"), *wr = getenv("OMPI_COMM_WORLD_RANK");
    if (ws && atoi(ws) > 1) { /* mpirun -np S: one stage per process, transfers over MPI */
        d.across = 1;
        d.stages = atoi(ws);
        d.rank = wr ? atoi(wr) : 0;
        if (d.layers < d.stages) d.layers = 4 * d.stages;
        if (d.trace) {
            fprintf(stderr, "pipeline_demo: --trace needs one process (under mpirun each rank "
                            "reports its stage's idle share instead)\n");
            return 2;
        }
    }
    if (d.train_data) {
        if (d.stages > 6) {
            fprintf(stderr,
                    "pipeline_demo: --stages %d: the GPT has 6 layers (embed, 4 blocks, head); "
                    "train with at most 6 stages\n",
                    d.stages);
            return 2;
        }
        gpt_stages_opts_t g = {.data = d.train_data,
                               .stages = d.stages,
                               .micro_batches = d.micro_batches,
                               .steps = d.steps,
                               .layers = 4,
                               .channels = 128,
                               .B = 4,
                               .T = 64,
                               .lr = 2e-3f};
        int rc = gpt_stages_train(&g);
        if (rc) return rc;
    }
    tr_monitor_t *mon = NULL;
    if (d.trace) {
        tr_trace_opts_t to = {.enabled = 1, .output_path = d.trace};
        if (tr_monitor_create(&to, &mon) < 0) {
            fprintf(stderr, "pipeline_demo: cannot write a trace in %s\n", d.trace);
            return 1;
        }
    }
    if (!d.across || d.rank == 0)
        printf("pipeline demo: %d stages, %d micro-batches, %d synthetic layers (%d per stage on "
               "average), each %.2f ms forward and %.2f ms backward (a sleep: layer costs are "
               "synthetic), one actor and thread per stage\n",
               d.stages, d.micro_batches, d.layers, d.layers / d.stages, d.cost_ms, 2 * d.cost_ms);
    int rc = 0;
    if (d.which & 1) rc = run_kind(&d, TR_PIPE_TRAIN_1F1B, "1f1b", mon);
    if (!rc && (d.which & 2)) rc = run_kind(&d, TR_PIPE_TRAIN_ZB, "zb", mon);
    tr_monitor_destroy(mon);
    if (!rc && d.trace) printf("pipeline demo: timeline in %s (troupe trace plot)\n", d.trace);
    return rc;
}
