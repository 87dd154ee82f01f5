/* bench_parallel: the executor's GEMMs while the optimizer's gradient norm runs beside them,
 * both through the kernels' thread pool (kernels/cpu/parallel.h).
 *
 * The GEMM is GPT-2 small's MLP up-projection at a 1024-token micro-batch: out (1024, 3072) =
 * inp (1024, 768) weight^T (768, 3072), split over 64-row blocks of out exactly as
 * kernels/cpu/linear.c splits it (grain as there), each block one single-threaded OpenBLAS
 * call. The gradient norm is tr_grad_sumsq over --gn-floats floats (a bucket). Phases:
 *   alone:  GEMMs alone; gradient norms alone (their speeds with the whole budget);
 *   loop:   GEMMs on this thread while a second thread runs gradient norms back to back;
 *   bursts: the same, the second thread sleeping 4x a norm's time between norms (the
 *           optimizer hearing a bucket now and then while the executor computes).
 * For each: GEMM GFLOP/s, the time of one gradient norm, the threads the GEMM got (the
 * most chunks of one GEMM running at once, counted in its chunk function, averaged over the
 * GEMMs), and both speeds against their `alone` peers of the same run. The norm's time
 * covers waiting for a thread.
 * Prints `name: value unit` lines. Options: --threads N (the budget; 0 = cores), --reps N,
 * --gn-floats N.
 */
#include <cblas.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/support/kernel_internals.h"
#include "troupe/blas.h"

#define M         1024
#define K         768
#define N         3072
#define GEMM_ROWS 64

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    const float *a, *w; // (M, K), (N, K)
    float *c;           // (M, N)
    atomic_int inside, peak;
} gemm_t;

static void gemm_rows(void *ctx, size_t begin, size_t end, int thread)
{
    gemm_t *g = ctx;
    int in = atomic_fetch_add(&g->inside, 1) + 1, seen = atomic_load(&g->peak);
    while (in > seen && !atomic_compare_exchange_weak(&g->peak, &seen, in)) {
    }
    int m0 = (int)begin * GEMM_ROWS, m1 = (int)end * GEMM_ROWS < M ? (int)end * GEMM_ROWS : M;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m1 - m0, N, K, 1.0f, g->a + (size_t)m0 * K,
                K, g->w, K, 0.0f, g->c + (size_t)m0 * N, N);
    atomic_fetch_sub(&g->inside, 1);
}

/* Runs reps GEMMs; returns GFLOP/s, *threads = the mean of each GEMM's peak chunks at once. */
static double run_gemms(gemm_t *g, int reps, double *threads)
{
    size_t blocks = (M + GEMM_ROWS - 1) / GEMM_ROWS;
    int t = tr_parallel_threads();
    double sum_peak = 0, t0 = now();
    for (int r = 0; r < reps; r++) {
        atomic_store(&g->peak, 0);
        tr_parallel_for(blocks, (blocks + t - 1) / t, gemm_rows, g);
        sum_peak += atomic_load(&g->peak);
    }
    double secs = now() - t0;
    *threads = sum_peak / reps;
    return 2.0 * M * N * K * reps / secs / 1e9;
}

typedef struct {
    const float *g;
    size_t n;
    double pause_s; // sleep between norms (0: back to back)
    atomic_int stop;
    long norms;
    double busy, sink; // seconds inside tr_grad_sumsq
} norms_t;

static void *norm_loop(void *arg)
{
    norms_t *s = arg;
    while (!atomic_load(&s->stop)) {
        double t0 = now();
        s->sink += tr_grad_sumsq(s->g, s->n);
        s->busy += now() - t0;
        s->norms++;
        if (s->pause_s > 0) {
            struct timespec ts = {0, (long)(s->pause_s * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

static int arg_int(int argc, char **argv, const char *name, int dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return atoi(argv[i + 1]);
    return dflt;
}

/* GEMMs on this thread while norm_loop runs with the given pause; prints the phase's lines. */
static void phase(const char *name, gemm_t *g, norms_t *s, double pause_s, int reps,
                  double gemm_alone, double norm_alone_ms)
{
    s->pause_s = pause_s;
    s->norms = 0;
    s->busy = 0;
    atomic_store(&s->stop, 0);
    pthread_t th;
    pthread_create(&th, NULL, norm_loop, s);
    struct timespec warm = {0, 2000000};
    nanosleep(&warm, NULL);
    double threads, gf = run_gemms(g, reps, &threads);
    atomic_store(&s->stop, 1);
    pthread_join(th, NULL);
    double ms = s->busy / s->norms * 1e3;
    printf("%s_gemm_gflops: %.1f GFLOP/s\n", name, gf);
    printf("%s_gemm_threads: %.2f threads\n", name, threads);
    printf("%s_gemm_vs_alone: %.3f x\n", name, gf / gemm_alone);
    printf("%s_gradnorm_ms: %.2f ms (%ld norms)\n", name, ms, s->norms);
    printf("%s_gradnorm_vs_alone: %.3f x\n", name, norm_alone_ms / ms);
}

int main(int argc, char **argv)
{
    tr_blas_reexec_if_needed(argc, argv);
    int reps = arg_int(argc, argv, "--reps", 20);
    size_t gn = (size_t)arg_int(argc, argv, "--gn-floats", 8 << 20);
    tr_parallel_set_threads(arg_int(argc, argv, "--threads", 0));
    openblas_set_num_threads(1); // as linear.c: one OpenBLAS thread per block, the pool splits
    gemm_t g = {.a = malloc(sizeof(float) * M * K),
                .w = malloc(sizeof(float) * N * K),
                .c = malloc(sizeof(float) * M * N)};
    float *grads = malloc(sizeof(float) * gn);
    for (size_t i = 0; i < (size_t)M * K; i++)
        ((float *)g.a)[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)N * K; i++)
        ((float *)g.w)[i] = (float)(i % 5) * 0.1f;
    for (size_t i = 0; i < gn; i++)
        grads[i] = (float)(i % 11) * 1e-3f;
    printf("threads: %d\n", tr_parallel_threads());
    printf("gemm_shape: %dx%dx%d\n", M, N, K);
    printf("gradnorm_floats: %zu\n", gn);

    double threads, warm = run_gemms(&g, 2, &threads);
    (void)warm;
    double gemm_alone = run_gemms(&g, reps, &threads);
    printf("alone_gemm_gflops: %.1f GFLOP/s\n", gemm_alone);
    printf("alone_gemm_threads: %.2f threads\n", threads);
    norms_t s = {.g = grads, .n = gn};
    double t_norm = now();
    for (int r = 0; r < 5; r++)
        s.sink += tr_grad_sumsq(grads, gn);
    t_norm = (now() - t_norm) / 5;
    printf("alone_gradnorm_gbs: %.2f GB/s\n", gn * sizeof(float) / t_norm / 1e9);
    printf("alone_gradnorm_ms: %.2f ms\n", t_norm * 1e3);

    phase("loop", &g, &s, 0.0, reps, gemm_alone, t_norm * 1e3);
    phase("bursts", &g, &s, 4 * t_norm, reps, gemm_alone, t_norm * 1e3);
    if (s.sink < 0) printf("unreachable\n");
    free((void *)g.a);
    free((void *)g.w);
    free(g.c);
    free(grads);
    tr_parallel_shutdown();
    return 0;
}
