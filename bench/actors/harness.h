/* harness.h: what the actor benchmarks and their peers share, so both sides are measured and
 * reported the same way: argument parsing (--only, --reps, --workers), a monotonic clock,
 * an idle process's CPU time, the median of repetitions, percentiles, and the `name: value unit`
 * output lines that bench/actors/run.sh reads.
 *
 * Plain C, usable from C++ (bench/peers/caf includes it too). No Troupe header: the peers
 * must not depend on the runtime they are compared with.
 */
#ifndef TR_BENCH_ACTORS_HARNESS_H
#define TR_BENCH_ACTORS_HARNESS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BENCH_MAX_REPS 101

typedef struct bench_args {
    const char *only; /* run only the benchmarks this names (see bench_selected); NULL: all */
    int reps;         /* repetitions of each timed and latency benchmark; medians reported */
    unsigned workers; /* scheduler threads; 0 = online cores (the same on both sides) */
} bench_args_t;

/* Parses --only NAME, --reps N, --workers N. Prints usage and returns -1 on anything else. */
static inline int bench_parse(int argc, char **argv, bench_args_t *a)
{
    a->only = NULL;
    a->reps = 5;
    a->workers = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--only") && v)
            a->only = v;
        else if (!strcmp(argv[i], "--reps") && v)
            a->reps = atoi(v);
        else if (!strcmp(argv[i], "--workers") && v)
            a->workers = (unsigned)atoi(v);
        else {
            fprintf(stderr, "usage: %s [--only NAME] [--reps N (1..%d)] [--workers N]\n", argv[0],
                    BENCH_MAX_REPS);
            return -1;
        }
        i++;
    }
    if (a->reps < 1 || a->reps > BENCH_MAX_REPS) {
        fprintf(stderr, "%s: --reps must be 1..%d\n", argv[0], BENCH_MAX_REPS);
        return -1;
    }
    if (a->workers == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        a->workers = n > 0 ? (unsigned)n : 1;
    }
    return 0;
}

/* Whether `name` runs under --only: when one names a prefix of the other, so that
 * "--only fanin" runs fanin_1..fanin_8 and "--only wakeup_p99" runs the wakeup group. */
static inline int bench_selected(const bench_args_t *a, const char *name)
{
    return !a->only || !strncmp(name, a->only, strlen(a->only)) ||
           !strncmp(a->only, name, strlen(name));
}

/* Monotonic time; the same clock as tr_now_ns(). */
static inline uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* idle_cpu's measurement, the same in every program (the Erlang peer's too): a shell outside
 * this process sums the run time of its threads in ns (/proc/PID/task/N/schedstat, the sum
 * getrusage gives) settle_ms after the call and again window_ms later, while the calling
 * thread waits for the answer without a timer of its own; both samples are printed at the
 * end, so nothing wakes the process in the window. (Read from inside with a sleep between,
 * the reading thread's own wake-up was counted: 50-160 us of CPU on a 2-vCPU VM, 0.003-0.008 %
 * of 2 s, as much as a runtime with nothing to do costs.) Returns the window's CPU time in
 * percent of one core, or -1 after saying what went wrong. */
static inline double bench_idle_pct(unsigned settle_ms, unsigned window_ms)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "s() { echo \"$(date +%%s%%N) $(cat /proc/%d/task/*/schedstat |"
             " awk '{s += $1} END {if (NR) printf \"%%.0f\", s}')\"; };"
             " sleep %u.%03u; a=$(s); sleep %u.%03u; b=$(s); echo \"$a\"; echo \"$b\"",
             (int)getpid(), settle_ms / 1000, settle_ms % 1000, window_ms / 1000, window_ms % 1000);
    FILE *sh = popen(cmd, "r");
    unsigned long long t0 = 0, c0 = 0, t1 = 0, c1 = 0;
    int got = sh ? fscanf(sh, "%llu %llu %llu %llu", &t0, &c0, &t1, &c1) : -1;
    int status = sh ? pclose(sh) : -1;
    if (got != 4 || status != 0 || t1 <= t0 || c1 < c0) {
        fprintf(stderr,
                "idle_cpu: could not read this process's CPU time from "
                "/proc/%d/task/*/schedstat (%d of 4 numbers, shell status %d)\n",
                (int)getpid(), got, status);
        return -1;
    }
    return 100.0 * (double)(c1 - c0) / (double)(t1 - t0);
}

static inline void bench_sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline int bench_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sorts v in place and returns its median. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The p-th percentile (0..100, nearest rank) of v, which must be sorted ascending. */
static inline uint64_t bench_percentile(const uint64_t *v, size_t n, double p)
{
    size_t rank = (size_t)(p / 100.0 * (double)n + 0.999999);
    return v[rank == 0 ? 0 : (rank > n ? n - 1 : rank - 1)];
}

/* A small LCG both sides use where a benchmark needs random choices (Big's targets), so
 * Troupe and its peers make the same choices from the same seeds. */
static inline uint32_t bench_rand(uint64_t *state, uint32_t bound)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((*state >> 33) % bound);
}

/* The machine-readable result line that run.sh parses, with `digits` decimals. */
static inline void bench_print_digits(const char *name, double value, int digits, const char *unit)
{
    printf("%s: %.*f %s\n", name, digits, value, unit);
    fflush(stdout);
}

static inline void bench_print(const char *name, double value, const char *unit)
{
    bench_print_digits(name, value, 3, unit);
}

/* idle_cpu's line: six decimals, since an idle runtime's share of a core over 2 s can be a
 * few millionths of a percent (one wake-up) or none at all. */
static inline void bench_print_idle(double pct)
{
    bench_print_digits("idle_cpu", pct, 6, "%");
}

/* One run of a latency program: fills samples[0..n) (ns, warm-up dropped; n as passed to
 * bench_latency_reps), or returns -1 after saying what went wrong. */
typedef int (*bench_lat_fn)(const bench_args_t *a, uint64_t *samples);

/* Runs fn a->reps times, each a whole program of n samples, and prints NAME_p50, NAME_p90,
 * NAME_p99 and NAME_max in us, each the median over the runs of that run's value: the
 * timed benchmarks' median of repetitions, applied to each row. One run's max is one sample
 * of 2000, which a VM's host decides (each vCPU stops ~40 us every millisecond and, a few
 * times a second, 100 us to 3 ms; bench/RESULTS.md): one such stop in one program's window
 * was the whole comparison. -1 if a run failed. */
static inline int bench_latency_reps(const bench_args_t *a, const char *name, size_t n,
                                     bench_lat_fn fn)
{
    static const int pct[] = {50, 90, 99, 100};
    double rows[4][BENCH_MAX_REPS];
    uint64_t *samples = (uint64_t *)malloc(n * sizeof(*samples));
    if (!samples) {
        fprintf(stderr, "%s: out of memory for %zu samples\n", name, n);
        return -1;
    }
    for (int r = 0; r < a->reps; r++) {
        if (fn(a, samples) < 0) {
            fprintf(stderr, "%s: FAILED\n", name);
            free(samples);
            return -1;
        }
        qsort(samples, n, sizeof(samples[0]), bench_cmp_u64);
        for (int i = 0; i < 4; i++)
            rows[i][r] = (double)bench_percentile(samples, n, pct[i]) / 1e3;
    }
    free(samples);
    for (int i = 0; i < 4; i++) {
        char line[64];
        if (pct[i] < 100)
            snprintf(line, sizeof(line), "%s_p%d", name, pct[i]);
        else
            snprintf(line, sizeof(line), "%s_max", name);
        bench_print(line, bench_median(rows[i], a->reps), "us");
    }
    return 0;
}

/* What one repetition of a timed benchmark returns: 0 and its time in ms, or -1 when its
 * result was wrong (it has said why on stderr). */
typedef int (*bench_fn)(const bench_args_t *a, double *ms);

/* Runs fn a->reps times and prints the median as `name: X ms`. -1 if any repetition failed. */
static inline int bench_timed(const bench_args_t *a, const char *name, bench_fn fn)
{
    double ms[BENCH_MAX_REPS];
    for (int r = 0; r < a->reps; r++)
        if (fn(a, &ms[r]) < 0) {
            fprintf(stderr, "%s: FAILED (wrong result)\n", name);
            return -1;
        }
    bench_print(name, bench_median(ms, a->reps), "ms");
    return 0;
}

#ifdef __cplusplus
}
#endif
#endif
