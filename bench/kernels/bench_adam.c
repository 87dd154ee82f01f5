/* bench_adam: CPU Adam throughput against its memory bound and against PyTorch.
 *
 * For 10M and 50M fp32 parameters and 1 and 2 threads it measures, in one run:
 *   adam      tr_adam_step (AdamW, bias correction), parameters per second
 *   bound     a streaming loop with Adam's traffic and no arithmetic: per parameter it
 *             reads p, g, m, v and writes p, m, v (28 bytes), with the same ISA, tiles and
 *             thread pool, and ordinary stores as Adam uses
 *   torch     torch.optim.Adam from bench/peers/torch_adam.py, run by the python named in
 *             TR_BENCH_PYTHON (bench/kernels/run.sh sets it to PyTorch 2's, the peers'
 *             environment of bench/peers/setup.sh); each implementation (for-loop, foreach,
 *             fused) is printed in a '#' line and the fastest is kept. With TR_BENCH_PYTHON
 *             unset there is no peer, said in one line; a peer that fails prints its error.
 * Each figure is the best of several repetitions after a warm-up (the first touch and
 * page faults are not timed). Output: `name: value unit` lines; per size, also PyTorch at its
 * best (its fastest implementation, 1 or 2 threads) against Troupe at its best
 * (adam_vs_torch_best_*).
 * Usage: bench_adam [peer-script]   (default: bench/peers/torch_adam.py next to the source)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/support/kernel_internals.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#ifndef TR_SOURCE_DIR
#define TR_SOURCE_DIR "."
#endif

typedef struct arrays {
    float *p, *g, *m, *v;
    size_t n;
} arrays_t;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *alloc_floats(size_t n)
{
    void *ptr = NULL;
    if (posix_memalign(&ptr, 64, n * sizeof(float))) return NULL;
    return ptr;
}

/* ---------------------------------------------------------------- the bound */

#if defined(__x86_64__)
/* p ← g, m ← p, v ← m: every array read once and three written, no arithmetic; the empty
 * asm keeps the load of v, which nothing else uses. */
__attribute__((target("avx512f"))) static void stream_avx512(arrays_t *a, size_t b, size_t e)
{
    size_t i = b;
    for (; i + 16 <= e; i += 16) {
        __m512 p = _mm512_loadu_ps(a->p + i), g = _mm512_loadu_ps(a->g + i);
        __m512 m = _mm512_loadu_ps(a->m + i), v = _mm512_loadu_ps(a->v + i);
        __asm__ volatile("" ::"v"(v));
        _mm512_storeu_ps(a->p + i, g);
        _mm512_storeu_ps(a->m + i, p);
        _mm512_storeu_ps(a->v + i, m);
    }
    for (; i < e; i++) {
        float p = a->p[i];
        a->p[i] = a->g[i];
        a->v[i] = a->m[i];
        a->m[i] = p;
    }
}

__attribute__((target("avx2"))) static void stream_avx2(arrays_t *a, size_t b, size_t e)
{
    size_t i = b;
    for (; i + 8 <= e; i += 8) {
        __m256 p = _mm256_loadu_ps(a->p + i), g = _mm256_loadu_ps(a->g + i);
        __m256 m = _mm256_loadu_ps(a->m + i), v = _mm256_loadu_ps(a->v + i);
        __asm__ volatile("" ::"x"(v));
        _mm256_storeu_ps(a->p + i, g);
        _mm256_storeu_ps(a->m + i, p);
        _mm256_storeu_ps(a->v + i, m);
    }
    for (; i < e; i++) {
        float p = a->p[i];
        a->p[i] = a->g[i];
        a->v[i] = a->m[i];
        a->m[i] = p;
    }
}
#endif

static void stream_range(void *ctx, size_t b, size_t e, int thread)
{
    arrays_t *a = ctx;
#if defined(__x86_64__)
    if (tr__isa_get() == TR_ISA_AVX512) {
        stream_avx512(a, b, e);
        return;
    }
    if (tr__isa_get() == TR_ISA_AVX2) {
        stream_avx2(a, b, e);
        return;
    }
#endif
    for (size_t i = b; i < e; i++) {
        float p = a->p[i];
        a->p[i] = a->g[i];
        (void)*(volatile float *)&a->v[i];
        a->v[i] = a->m[i];
        a->m[i] = p;
    }
}

/* ---------------------------------------------------------------- measurements */

static void fill(void *ctx, size_t b, size_t e, int thread)
{
    arrays_t *a = ctx;
    for (size_t i = b; i < e; i++) {
        a->p[i] = (float)(i % 1000) * 1e-3f - 0.5f;
        a->g[i] = (float)(i % 777) * 1e-4f - 0.03f;
        a->m[i] = 0.0f;
        a->v[i] = 0.0f;
    }
}

/* Best times of Adam steps and bound passes, taken in alternation so that a disturbance
 * (other processes on the machine) hits both alike. */
static void best_times(arrays_t *a, int reps, double *t_adam, double *t_bound)
{
    tr_adam_opts_t o = {.lr = 1e-3f,
                        .beta1 = 0.9f,
                        .beta2 = 0.999f,
                        .eps = 1e-8f,
                        .weight_decay = 0.0f,
                        .adamw_mode = 1,
                        .bias_correction = 1};
    tr_adam_state_t st;
    tr_adam_state_init(&st);
    tr_adam_step(&o, &st, a->p, a->g, a->m, a->v, a->n); /* warm-up */
    tr_parallel_for(a->n, 32768, stream_range, a);
    *t_adam = *t_bound = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        tr_adam_step(&o, &st, a->p, a->g, a->m, a->v, a->n);
        double t1 = now();
        tr_parallel_for(a->n, 32768, stream_range, a);
        double t2 = now();
        *t_adam = t1 - t0 < *t_adam ? t1 - t0 : *t_adam;
        *t_bound = t2 - t1 < *t_bound ? t2 - t1 : *t_bound;
    }
}

/* Runs the PyTorch peer with `py` for n parameters and `threads` threads: its best rate and
 * implementation, or 0 and its last line of output (its error) in `impl`. */
static double torch_rate(const char *py, const char *script, size_t n, int threads, char *impl,
                         size_t impl_size)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "'%s' '%s' %zu %d 2>&1", py, script, n, threads);
    snprintf(impl, impl_size, "could not run %.200s", py);
    FILE *f = popen(cmd, "r");
    if (!f) return 0.0;
    char line[512], name[32];
    double rate = 0.0;
    while (fgets(line, sizeof(line), f)) {
        double r;
        if (sscanf(line, "torch_adam_best: %lf %31s", &r, name) == 2) {
            rate = r;
            snprintf(impl, impl_size, "%s", name);
        } else if (line[0] == '#') {
            fputs(line, stdout); /* pass the peer's settings and each implementation through */
        } else if (rate == 0.0 && line[0] != '\n') {
            line[strcspn(line, "\n")] = 0;
            snprintf(impl, impl_size, "%.200s", line);
        }
    }
    pclose(f);
    return rate;
}

int main(int argc, char **argv)
{
    const char *script = argc > 1 ? argv[1] : TR_SOURCE_DIR "/bench/peers/torch_adam.py";
    const char *py = getenv("TR_BENCH_PYTHON");
    if (!py || !*py)
        printf("# no PyTorch peer: TR_BENCH_PYTHON is unset (bench/kernels/run.sh sets it to the "
               "peers' python)\n");
    size_t sizes[] = {10000000, 50000000};
    printf("# isa %s; best of repetitions; bytes per parameter 28\n", tr__isa_name(tr__isa_get()));
    for (int s = 0; s < 2; s++) {
        size_t n = sizes[s];
        int reps = n > 20000000 ? 8 : 20;
        double best_adam = 0, best_torch = 0; /* each side at its best thread count */
        int at_adam = 0, at_torch = 0;
        char impl[256], best_impl[256] = "";
        for (int threads = 1; threads <= 2; threads++) {
            tr_parallel_set_threads(threads);
            arrays_t a = {alloc_floats(n), alloc_floats(n), alloc_floats(n), alloc_floats(n), n};
            if (!a.p || !a.g || !a.m || !a.v) {
                fprintf(stderr, "bench_adam: out of memory for %zu parameters\n", n);
                return 1;
            }
            tr_parallel_for(n, 32768, fill, &a);
            double t_adam, t_bound;
            best_times(&a, reps, &t_adam, &t_bound);
            free(a.p);
            free(a.g);
            free(a.m);
            free(a.v);
            double adam = (double)n / t_adam, bound = (double)n / t_bound;
            int mp = (int)(n / 1000000);
            printf("adam_%dM_%dt: %.4g params/s\n", mp, threads, adam);
            printf("adam_bandwidth_%dM_%dt: %.2f GB/s\n", mp, threads, adam * 28e-9);
            printf("bound_%dM_%dt: %.4g params/s\n", mp, threads, bound);
            printf("bound_bandwidth_%dM_%dt: %.2f GB/s\n", mp, threads, bound * 28e-9);
            printf("adam_of_bound_%dM_%dt: %.1f %%\n", mp, threads, 100.0 * adam / bound);
            if (adam > best_adam) {
                best_adam = adam;
                at_adam = threads;
            }
            if (!py || !*py) continue;
            double torch = torch_rate(py, script, n, threads, impl, sizeof(impl));
            if (torch > best_torch) {
                best_torch = torch;
                at_torch = threads;
                snprintf(best_impl, sizeof(best_impl), "%s", impl);
            }
            if (torch > 0.0) {
                printf("torch_adam_%dM_%dt: %.4g params/s (%s)\n", mp, threads, torch, impl);
                printf("adam_over_torch_%dM_%dt: %.2f x\n", mp, threads, adam / torch);
            } else {
                printf("torch_adam_%dM_%dt: failed: %s\n", mp, threads, impl);
            }
            fflush(stdout);
        }
        if (best_torch > 0.0) /* PyTorch at its best (its fastest implementation, 1 or 2 threads) */
            printf("torch_adam_best_%dM: %.4g params/s (%s, %d thread%s)\n"
                   "adam_vs_torch_best_%dM: %.2f x (Troupe at %d thread%s)\n",
                   (int)(n / 1000000), best_torch, best_impl, at_torch, at_torch > 1 ? "s" : "",
                   (int)(n / 1000000), best_adam / best_torch, at_adam, at_adam > 1 ? "s" : "");
    }
    tr_parallel_shutdown();
    return 0;
}
