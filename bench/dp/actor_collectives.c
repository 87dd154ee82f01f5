/* actor_collectives.c: the comm actor's side of bench_collectives. The comm actor lives inside
 * the engine (spawned by tr__comm_spawn), so it is driven the way training drives it: an
 * engine on a model whose whole gradient is exactly one bucket of the size measured (a single
 * linear layer, X inputs by 64 classes plus biases: (X + 1) * 64 floats), trained one sample a
 * step, so each step hands the comm actor one BUCKET and waits for its REDUCED. With
 * zero_optimization.stage 0 the bucket is all-reduced; with stage 2 it is reduce-scattered
 * (once the build has ZeRO 2: until then the engine warns that stage 2 runs as stage 1, which
 * all-reduces, and the caller is told).
 *
 * The time comes from the engine's own trace: per step, from the latest of the ranks' BUCKET
 * spans starting on the comm lane to the latest REDUCED span starting on the optimizer lane.
 * That is the collective and everything the actor adds to it (the header exchange posted
 * beside it, whose end its result waits for, polling, two mailbox hops) and the mean's
 * scaling, which the bare-MPI side does
 * too, with the ranks' skew taken out as the bare-MPI side takes it out with a barrier.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/support/monitor_internals.h"
#include "troupe.h"

#include "collectives.h"

#define CLASSES 64

typedef struct task {
    int x_dim;
} task_t;

/* A fixed pseudo-random sample per index: the values do not matter, only the work. */
static int sample(void *user, uint64_t index, int B, int T, int *tokens, float *x, int *targets,
                  float *y)
{
    const task_t *t = user;
    (void)tokens;
    (void)y;
    for (int i = 0; i < B * T; i++) {
        for (int k = 0; k < t->x_dim; k++)
            x[(size_t)i * (size_t)t->x_dim + (size_t)k] =
                (float)(((index + (uint64_t)i) * 31 + (uint64_t)k * 7) % 19) / 9.0f - 1.0f;
        targets[i] = (int)((index + (uint64_t)i) % CLASSES);
    }
    return 0;
}

/* The log sink: lines go to stderr as before; the stage-1 fallback warning is noted. */
static void watch_log(void *user, int level, const char *line)
{
    if (level >= TR_LOG_WARN && strstr(line, "zero_optimization.stage") &&
        strstr(line, "(stage 1)"))
        *(int *)user = 1;
    fprintf(stderr, "%s\n", line);
}

/* The engine; *cfg is its config, to destroy after it (the engine reads it until then). */
static tr_engine_t *engine(int stage, size_t floats, const char *trace_dir, task_t *task,
                           tr_config_t **cfgp)
{
    char json[768];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}},"
             " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %zu},"
             " \"troupe\": {\"runtime\": {\"workers\": 1}, \"log_level\": \"warning\"}}",
             stage, floats);
    tr_config_t *cfg;
    tr_config_diag_t d;
    tr_config_diag_init(&d);
    int rc = tr_config_from_string(json, strlen(json), "bench_collectives.json", 0, &cfg, &d);
    for (size_t i = 0; i < d.count; i++)
        fprintf(stderr, "%s\n", d.items[i].text);
    tr_config_diag_close(&d);
    if (rc < 0) return NULL;
    task->x_dim = (int)(floats / CLASSES) - 1;
    int widths[] = {task->x_dim, CLASSES};
    tr_model_t *model;
    char why[256], err[512] = "";
    if (tr_model_mlp_create(&model, widths, 2, why, sizeof(why)) < 0) {
        fprintf(stderr, "bench_collectives: model of %zu floats: %s\n", floats, why);
        tr_config_destroy(cfg);
        return NULL;
    }
    tr_engine_opts_t o = {.config = cfg,
                          .model = model,
                          .seq_len = 1,
                          .seed = 1,
                          .init_params = 1,
                          .trace_dir = trace_dir,
                          .train = {.batch = sample, .user = task, .x_dim = task->x_dim}};
    tr_engine_t *eng = NULL;
    if (tr_engine_create(&eng, &o, err, sizeof(err)) < 0)
        fprintf(stderr, "bench_collectives: engine: %s\n", err);
    if (!eng)
        tr_config_destroy(cfg);
    else
        *cfgp = cfg;
    return eng;
}

/* The latest start of a span named `name` on lanes named `lane` in step `step`, over every
 * rank; -1 when a rank has none. */
static double latest(const tr_trace_t *t, const char *lane, const char *name, int64_t step,
                     int world)
{
    double when = -1;
    int seen = 0;
    for (size_t i = 0; i < t->n_spans; i++) {
        const tr__tspan_t *s = &t->spans[i];
        if (s->step != step || strcmp(s->name, name) || strcmp(t->lanes[s->lane].name, lane))
            continue;
        seen++;
        if (s->ts > when) when = s->ts;
    }
    return seen == world ? when : -1;
}

/* Rank 0: the trace's bucket-to-reduced time of steps warmup.. in v[reps]; 0, or -1 when a
 * step misses one. */
static int from_trace(const char *dir, int warmup, int reps, int world, double *v)
{
    tr_trace_t *t;
    char err[512];
    if (tr_trace_load(dir, &t, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_collectives: reading the trace: %s\n", err);
        return -1;
    }
    int n = 0;
    for (int s = warmup; s < warmup + reps; s++) {
        double b = latest(t, "comm", "bucket", s, world);
        double r = latest(t, "optimizer", "reduced", s, world);
        if (b >= 0 && r >= b) v[n++] = (r - b) * 1e-6;
    }
    if (n != reps)
        fprintf(stderr,
                "bench_collectives: %s: %d of %d steps have a BUCKET and a REDUCED on "
                "every rank\n",
                dir, n, reps);
    tr_trace_destroy(t);
    return n == reps ? 0 : -1;
}

static void remove_traces(const char *dir, int rank)
{
    char path[1100];
    snprintf(path, sizeof(path), "%s/trace_rank%d.json", dir, rank);
    unlink(path);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) rmdir(dir);
}

int bench_actor_times(int stage, size_t bytes, int warmup, int reps, const char *tmpdir,
                      int *stage2_as_1, double *t)
{
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    static int calls; /* a trace folder per call (BENCH_KEEP_TRACES keeps every round's) */
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/stage%d_%zu_%d", tmpdir, stage, bytes, calls++);
    task_t task;
    int warned = 0;
    tr_log_set_sink(watch_log, &warned);
    tr_config_t *cfg = NULL;
    tr_engine_t *eng = engine(stage, bytes / sizeof(float), dir, &task, &cfg);
    tr_log_set_sink(NULL, NULL);
    int ok = eng != NULL;
    for (int s = 0; ok && s < warmup + reps; s++)
        if (tr_engine_train_batch(eng, NULL) < 0) {
            fprintf(stderr, "bench_collectives: rank %d: %s\n", rank, tr_engine_error(eng));
            ok = 0;
        }
    tr_engine_destroy(eng); /* the trace file is complete once this returns */
    tr_config_destroy(cfg);
    int all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    int rc = all_ok && (rank != 0 || from_trace(dir, warmup, reps, world, t) == 0) ? 0 : -1;
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rc == 0) MPI_Bcast(t, reps, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Allreduce(&warned, stage2_as_1, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!getenv("BENCH_KEEP_TRACES")) remove_traces(dir, rank);
    return rc;
}
