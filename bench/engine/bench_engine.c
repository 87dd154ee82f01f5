/* bench_engine: what the actors cost on a GPT-2 training step, and what tracing adds.
 *
 * The same GPT-2 (V=8192, T=128, C=384, L=6, NH=6), the same batches (B=8), the same
 * kernels on the same 2 kernel threads, trained three ways in one run, step after step in
 * rotation so that load from other processes falls on all three alike:
 *   plain   a loop calling the kernels directly: forward, backward, the gradient norm (the
 *           engine's overflow check and its clipping at 1.0), AdamW (kernels/cpu/adam.h),
 *           zero the gradients;
 *   engine  tr_engine_train_batch with the default config (no tracing; the flight recorder's
 *           ring on, as shipped);
 *   traced  the same engine writing trace_rank0.json for every step (troupe.trace on).
 * Each is timed per step after one warm-up step; the medians give
 *   actor_overhead_pct   = (engine - plain) / plain   (bound: < 2)
 *   tracing_overhead_pct = (traced - engine) / engine (bound: < 3)
 * and the minima (least disturbed steps) are printed too. The three end with the same loss
 * (printed): the engine runs the same arithmetic. Prints `name: value unit` lines.
 * Options: --steps N (10), --threads N (2), --trace-dir DIR (a fresh folder in /tmp).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/kernel_internals.h"
#include "troupe.h"

#define BS        8
#define TS        128
#define V         8192
#define MAX_STEPS 1000

static const tr_gpt2_config_t gpt2 = {.max_seq_len = TS,
                                      .vocab_size = V,
                                      .padded_vocab_size = V,
                                      .num_layers = 6,
                                      .num_heads = 6,
                                      .channels = 384};

/* Batch `index`: deterministic tokens; targets are the next token. */
static int batch_cb(void *user, uint64_t index, int b, int t, int *tokens, float *x, int *targets,
                    float *y)
{
    (void)user;
    (void)x;
    for (int i = 0; i < b * t; i++) {
        uint64_t s = index * (uint64_t)(b * t) + (uint64_t)i;
        tokens[i] = (int)((s * 7919u) % V);
        targets[i] = (int)((s * 7919u + 7919u) % V);
    }
    return 0;
}

static tr_model_t *new_model(void)
{
    tr_model_t *m;
    char why[256];
    if (tr_model_gpt2_create(&m, &gpt2, why, sizeof(why))) {
        fprintf(stderr, "bench_engine: %s\n", why);
        exit(1);
    }
    return m;
}

/* --- the plain loop ---------------------------------------------------------------------- */

typedef struct plain {
    tr_model_t *model;
    float *m, *v;
    tr_adam_opts_t adam;
    tr_adam_state_t st;
    int tokens[BS * TS], targets[BS * TS];
    uint64_t index;
    float loss;
} plain_t;

static void plain_init(plain_t *p, uint64_t seed)
{
    p->model = new_model();
    tr_model_init_params(p->model, seed);
    size_t n = tr_model_num_params(p->model);
    p->m = calloc(n, sizeof(float));
    p->v = calloc(n, sizeof(float));
    p->adam = (tr_adam_opts_t){3e-4f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1};
    tr_adam_state_init(&p->st);
}

static int plain_step(plain_t *p)
{
    batch_cb(NULL, p->index++, BS, TS, p->tokens, NULL, p->targets, NULL);
    tr_batch_t batch = {.B = BS, .T = TS, .tokens = p->tokens, .targets = p->targets};
    int rc = tr_model_forward(p->model, &batch, &p->loss);
    if (rc == 0) rc = tr_model_backward(p->model, NULL, NULL);
    if (rc < 0) return rc;
    size_t n = tr_model_num_params(p->model);
    float *g = tr_model_grads(p->model);
    double norm;
    if (tr_grad_norm_finish(tr_grad_sumsq(g, n), &norm) < 0) return TR_ENONFINITE;
    tr_adam_state_advance(&p->adam, &p->st);
    float mul = tr_grad_clip_mul(norm, 1.0, 1.0), *w = tr_model_params(p->model);
    for (int i = 0; i < tr_model_num_layers(p->model); i++) { /* decay as the engine does */
        const tr_layer_t *l = tr_model_layer(p->model, i);
        for (int k = 0; k < l->n_params; k++) {
            size_t at = l->param_offset + l->params[k].offset;
            tr_adam_opts_t o = p->adam;
            o.weight_decay = l->params[k].no_decay ? 0.0f : o.weight_decay;
            tr_adam_update(&o, &p->st, mul, w + at, g + at, p->m + at, p->v + at,
                           l->params[k].numel, NULL, TR_HALF_NONE);
        }
    }
    tr_model_zero_grad(p->model);
    return 0;
}

/* --- the engine -------------------------------------------------------------------------- */

/* The engine on the same step; traced into trace_dir when not NULL; with wire_check, every
 * message crosses its msgpack form. */
static tr_engine_t *new_engine(uint64_t seed, const char *trace_dir, int wire_check)
{
    char json[1024];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 8, \"gradient_accumulation_steps\": 1,"
             " \"steps_per_print\": 1000000, \"gradient_clipping\": 1.0,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4, "
             "\"weight_decay\": 0.01}},"
             " \"troupe\": {\"runtime\": {\"workers\": 2, \"wire_check\": %s},"
             " \"data\": {\"prefetch\": 2}}}",
             wire_check ? "true" : "false");
    tr_config_t *cfg;
    if (tr_config_from_string(json, strlen(json), "bench_engine.json", 1, &cfg, NULL)) {
        fprintf(stderr, "bench_engine: bad built-in config\n");
        exit(1);
    }
    tr_engine_opts_t o = {.config_path = NULL,
                          .model = new_model(),
                          .seq_len = TS,
                          .seed = seed,
                          .init_params = 1,
                          .trace_dir = trace_dir,
                          .train = {.batch = batch_cb}};
    o.config = cfg;
    tr_engine_t *eng;
    char err[512];
    if (tr_engine_create(&eng, &o, err, sizeof(err))) {
        fprintf(stderr, "bench_engine: %s\n", err);
        exit(1);
    }
    return eng;
}

/* --- timing ------------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int arg_int(int argc, char **argv, const char *name, int dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return atoi(argv[i + 1]);
    return dflt;
}

static const char *arg_str(int argc, char **argv, const char *name)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return NULL;
}

static void check(int rc, const char *what)
{
    if (rc < 0) {
        fprintf(stderr, "bench_engine: %s: %s\n", what, tr_strerror(rc));
        exit(1);
    }
}

int main(int argc, char **argv)
{
    tr_blas_reexec_if_needed(argc, argv);
    int steps = arg_int(argc, argv, "--steps", 10), threads = arg_int(argc, argv, "--threads", 2);
    if (steps < 1 || steps > MAX_STEPS) steps = 10;
    char dir[256];
    const char *trace_dir = arg_str(argc, argv, "--trace-dir");
    if (!trace_dir) {
        snprintf(dir, sizeof(dir), "/tmp/bench_engine_trace_XXXXXX");
        trace_dir = mkdtemp(dir);
    }
    tr_parallel_set_threads(threads);
    printf("threads: %d\nsteps: %d\ntrace_dir: %s\n", threads, steps, trace_dir);

    plain_t *plain = calloc(1, sizeof(*plain));
    plain_init(plain, 1);
    tr_engine_t *eng = new_engine(1, NULL, 0), *traced = new_engine(1, trace_dir, 0);
    tr_engine_t *wired = new_engine(1, NULL, 1);
    static double t_plain[MAX_STEPS], t_eng[MAX_STEPS], t_traced[MAX_STEPS], t_wire[MAX_STEPS];
    tr_step_stats_t st_eng = {0}, st_traced = {0}, st_wire = {0};
    for (int s = 0; s <= steps; s++) { /* step 0 warms up: page faults, buffers */
        uint64_t t0 = tr_now_ns();
        check(plain_step(plain), "plain step");
        uint64_t t1 = tr_now_ns();
        check(tr_engine_train_batch(eng, &st_eng), tr_engine_error(eng));
        uint64_t t2 = tr_now_ns();
        check(tr_engine_train_batch(traced, &st_traced), tr_engine_error(traced));
        uint64_t t3 = tr_now_ns();
        check(tr_engine_train_batch(wired, &st_wire), tr_engine_error(wired));
        uint64_t t4 = tr_now_ns();
        if (s > 0) {
            t_plain[s - 1] = (double)(t1 - t0) / 1e6;
            t_eng[s - 1] = (double)(t2 - t1) / 1e6;
            t_traced[s - 1] = (double)(t3 - t2) / 1e6;
            t_wire[s - 1] = (double)(t4 - t3) / 1e6;
        }
    }
    printf("plain_loss: %.6f\nengine_loss: %.6f\ntraced_loss: %.6f\n", plain->loss, st_eng.loss,
           st_traced.loss);
    printf("wire_check_loss: %.6f\n", st_wire.loss);
    printf("same_loss: %s\n", plain->loss == st_eng.loss && st_eng.loss == st_traced.loss &&
                                      st_eng.loss == st_wire.loss
                                  ? "yes"
                                  : "NO (the four did not compute the same steps)");
    tr_engine_destroy(wired);
    tr_engine_destroy(traced);
    tr_engine_destroy(eng);
    tr_model_destroy(plain->model);
    free(plain->m);
    free(plain->v);
    free(plain);

    /* paired: each round's engine, traced and wire-check steps against that round's plain
     * step, so a slow stretch of the machine falls on both sides of each ratio */
    static double r_eng[MAX_STEPS], r_trace[MAX_STEPS], r_wire[MAX_STEPS];
    for (int i = 0; i < steps; i++) {
        r_eng[i] = (t_eng[i] - t_plain[i]) / t_plain[i] * 100.0;
        r_trace[i] = (t_traced[i] - t_eng[i]) / t_eng[i] * 100.0;
        r_wire[i] = (t_wire[i] - t_eng[i]) / t_eng[i] * 100.0;
    }
    double pm = median(t_plain, steps), em = median(t_eng, steps), tm = median(t_traced, steps);
    double wm = median(t_wire, steps);
    double p0 = t_plain[0], e0 = t_eng[0], q0 = t_traced[0]; /* sorted: the minima */
    printf("plain_step_ms: %.2f ms\n", pm);
    printf("engine_step_ms: %.2f ms\n", em);
    printf("traced_step_ms: %.2f ms\n", tm);
    printf("actor_overhead_pct: %.2f %% (bound < 2)\n", (em - pm) / pm * 100.0);
    printf("tracing_overhead_pct: %.2f %% (bound < 3)\n", (tm - em) / em * 100.0);
    printf("actor_overhead_paired_pct: %.2f %% (median of per-round ratios; bound < 2)\n",
           median(r_eng, steps));
    printf("tracing_overhead_paired_pct: %.2f %% (bound < 3)\n", median(r_trace, steps));
    printf("wire_check_overhead_paired_pct: %.2f %%\n", median(r_wire, steps));
    printf("wire_check_step_ms: %.2f ms\n", wm);
    printf("wire_check_overhead_pct: %.2f %% (a test mode, off by default)\n",
           (wm - em) / em * 100.0);
    printf("plain_step_min_ms: %.2f ms\nengine_step_min_ms: %.2f ms\ntraced_step_min_ms: %.2f ms\n",
           p0, e0, q0);
    printf("actor_overhead_min_pct: %.2f %%\n", (e0 - p0) / p0 * 100.0);
    printf("tracing_overhead_min_pct: %.2f %%\n", (q0 - e0) / e0 * 100.0);
    return 0;
}
