/* troupe nvme-tune: sweeps the `aio` section's knobs on a directory and prints the best read
 * and write configurations and the section to paste into a DeepSpeed config (DeepSpeed's
 * ds_nvme_tune, in C).
 *
 * The grid: block_size 256K, 1M, 4M; queue_depth 8, 32, 128; intra_op_parallelism 1, 2, 4,
 * 8; single_submit 0, 1; overlap_events 0, 1 (144 configurations; DeepSpeed's default sweep
 * is block_size 1M, 8M, queue_depth 32, 128, io_parallel 1, 2, 4, 8 and both booleans).
 * Each configuration is measured once by tr__nvme_measure (the write then the read of
 * --io-size bytes, as `troupe nvme-bench`). The sweep stops before a configuration that
 * would end past --budget-s (judged by the mean time per configuration so far); it visits the
 * grid in a scattered order (a stride coprime with its size), so a sweep cut short still
 * samples every value of every knob rather than only the first block sizes.
 *
 * The section printed is the configuration with the highest harmonic mean of read and write
 * GB/s: an optimizer swap reads and writes the same bytes, so that mean is the bytes moved
 * over the time taken for both. (DeepSpeed ranks by read + write, which favours a
 * configuration fast one way and slow the other.)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "nvme_measure.h"
#include "troupe/aio.h"
#include "troupe/error.h"

static const char usage[] =
    "usage: troupe nvme-tune --dir DIR [--io-size N] [--budget-s S]\n"
    "\n"
    "Measures the aio engine's write and read GB/s (1e9 bytes) in DIR for each aio\n"
    "configuration of a grid (block_size 256K 1M 4M, queue_depth 8 32 128,\n"
    "intra_op_parallelism 1 2 4 8, single_submit and overlap_events off and on: 144), each\n"
    "writing then reading N bytes (default 64M; a multiple of 64K), for at most S seconds\n"
    "(default 60). Prints each result, how many configurations were measured, the best read\n"
    "and the best write, and the `aio` section of the best by the harmonic mean of read and\n"
    "write GB/s (the bytes of a swap out and in over its time), as JSON for a DeepSpeed config.\n"
    "Sizes take a K, M or G suffix (powers of 1024).\n"
    "Exit status: 0; 1 when the I/O fails; 2 for a bad flag or a directory it cannot write.\n";

static const char cmd[] = "nvme-tune";

static const size_t block_sizes[] = {256u << 10, 1u << 20, 4u << 20};
static const int queue_depths[] = {8, 32, 128};
static const int parallelisms[] = {1, 2, 4, 8};
#define N_OF(a)   (sizeof(a) / sizeof((a)[0]))
#define GRID_SIZE (N_OF(block_sizes) * N_OF(queue_depths) * N_OF(parallelisms) * 4)

typedef struct tune {
    const char *dir;
    uint64_t io_size;
    double budget_s;
} tune_t;

typedef struct result {
    tr_aio_options_t o;
    double write_gbs, read_gbs;
} result_t;

/* ---- flags -------------------------------------------------------------------------- */

static int parse_budget(const char *flag, const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v > 0 && v <= 86400))
        return tr__nvme_bad_flag(cmd, flag, s, "seconds, more than 0 and at most 86400");
    *out = v;
    return 0;
}

static int apply_flag(const char *a, const char *val, tune_t *t)
{
    if (!strcmp(a, "--dir")) {
        t->dir = val;
        return 0;
    }
    if (!strcmp(a, "--budget-s")) return parse_budget(a, val, &t->budget_s);
    int rc = tr__nvme_parse_size(cmd, a, val, 64u << 10, 1ull << 40, &t->io_size);
    if (rc == 0 && t->io_size % (64u << 10))
        return tr__nvme_bad_flag(cmd, a, val,
                                 "a multiple of 64K (every thread count's share "
                                 "of it stays aligned)");
    return rc;
}

/* 0, -1 after --help, or 2 for bad usage (printed). */
static int parse_args(int argc, char **argv, tune_t *t)
{
    t->io_size = 64u << 20;
    t->budget_s = 60;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return -1;
        }
        if (strcmp(a, "--dir") && strcmp(a, "--io-size") && strcmp(a, "--budget-s")) {
            fprintf(stderr, "troupe %s: unknown flag '%s'\n%s", cmd, a, usage);
            return 2;
        }
        if (i + 1 >= argc) return tr__nvme_bad_flag(cmd, a, "", "a value after it");
        int rc = apply_flag(a, argv[++i], t);
        if (rc) return rc;
    }
    if (!t->dir) {
        fprintf(stderr, "troupe %s: --dir is required\n%s", cmd, usage);
        return 2;
    }
    return 0;
}

/* ---- the sweep ---------------------------------------------------------------------- */

/* Grid point i (0 <= i < GRID_SIZE): the booleans vary fastest, block_size slowest. */
static tr_aio_options_t grid_point(size_t i)
{
    tr_aio_options_t o;
    o.overlap_events = (int)(i % 2);
    o.single_submit = (int)(i / 2 % 2);
    i /= 4;
    o.intra_op_parallelism = parallelisms[i % N_OF(parallelisms)];
    i /= N_OF(parallelisms);
    o.queue_depth = queue_depths[i % N_OF(queue_depths)];
    o.block_size = block_sizes[i / N_OF(queue_depths)];
    return o;
}

static size_t gcd(size_t a, size_t b)
{
    return b ? gcd(b, a % b) : a;
}

/* A stride coprime with n near n / golden ratio: k * stride mod n visits every point once,
 * and consecutive visits land far apart in every knob. */
static size_t scatter_stride(size_t n)
{
    size_t s = (size_t)((double)n * 0.618) | 1;
    while (gcd(s, n) != 1)
        s += 2;
    return s;
}

static void print_result(const result_t *r)
{
    printf("%10zu %11d %20d %13d %14d %10.3f %9.3f\n", r->o.block_size, r->o.queue_depth,
           r->o.intra_op_parallelism, r->o.single_submit, r->o.overlap_events, r->write_gbs,
           r->read_gbs);
}

/* Measures the grid into res until the budget runs out; the count measured, or -exit status
 * when a measurement fails (printed). */
static int sweep(const tune_t *t, result_t *res)
{
    size_t n = GRID_SIZE, stride = scatter_stride(n);
    double t0 = tr__now_s();
    printf("%10s %11s %20s %13s %14s %10s %9s\n", "block_size", "queue_depth",
           "intra_op_parallelism", "single_submit", "overlap_events", "write_GB/s", "read_GB/s");
    for (size_t k = 0; k < n; k++) {
        double spent = tr__now_s() - t0;
        if (k > 0 && spent + spent / (double)k > t->budget_s) return (int)k;
        result_t *r = &res[k];
        r->o = grid_point(k * stride % n);
        char why[512];
        int rc = tr__nvme_measure(t->dir, t->io_size, &r->o, &r->write_gbs, &r->read_gbs, why,
                                  sizeof why);
        if (rc) {
            fprintf(stderr, "troupe %s: %s\n", cmd, why);
            return rc == TR_EINVAL ? -2 : -1;
        }
        print_result(r);
        fflush(stdout);
    }
    return (int)n;
}

/* ---- the report --------------------------------------------------------------------- */

static double harmonic(const result_t *r)
{
    return 2.0 / (1.0 / r->read_gbs + 1.0 / r->write_gbs);
}

/* The index of the best of res[0..n) by score. */
static int best_by(const result_t *res, int n, double (*score)(const result_t *))
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (score(&res[i]) > score(&res[best])) best = i;
    return best;
}

static double read_of(const result_t *r)
{
    return r->read_gbs;
}

static double write_of(const result_t *r)
{
    return r->write_gbs;
}

static void print_best(const char *what, const result_t *r, double gbs)
{
    printf("nvme-tune.best_%s: %.3f GB/s (block_size %zu, queue_depth %d, intra_op_parallelism "
           "%d, single_submit %d, overlap_events %d)\n",
           what, gbs, r->o.block_size, r->o.queue_depth, r->o.intra_op_parallelism,
           r->o.single_submit, r->o.overlap_events);
}

static void report(const tune_t *t, const result_t *res, int n, double seconds)
{
    printf("nvme-tune.measured: %d of %zu configurations in %.1f s (io-size %llu bytes, "
           "budget %g s)\n",
           n, (size_t)GRID_SIZE, seconds, (unsigned long long)t->io_size, t->budget_s);
    const result_t *r = &res[best_by(res, n, read_of)];
    print_best("read", r, r->read_gbs);
    r = &res[best_by(res, n, write_of)];
    print_best("write", r, r->write_gbs);
    r = &res[best_by(res, n, harmonic)];
    printf("nvme-tune.best: read %.3f GB/s, write %.3f GB/s, harmonic mean %.3f GB/s; its aio "
           "section, for a DeepSpeed config:\n",
           r->read_gbs, r->write_gbs, harmonic(r));
    printf("{\n  \"aio\": {\n    \"block_size\": %zu,\n    \"queue_depth\": %d,\n"
           "    \"intra_op_parallelism\": %d,\n    \"single_submit\": %s,\n"
           "    \"overlap_events\": %s\n  }\n}\n",
           r->o.block_size, r->o.queue_depth, r->o.intra_op_parallelism,
           r->o.single_submit ? "true" : "false", r->o.overlap_events ? "true" : "false");
}

/* 0 when dir is a directory we can create a file in; else 2 after saying why. */
static int check_dir(const char *dir)
{
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode))
        return tr__nvme_bad_flag(cmd, "--dir", dir, "an existing directory");
    char path[4096];
    snprintf(path, sizeof path, "%s/troupe_nvme_tune.probe", dir);
    FILE *f = fopen(path, "w");
    if (!f) return tr__nvme_bad_flag(cmd, "--dir", dir, "a directory this process can write");
    fclose(f);
    remove(path);
    return 0;
}

int tr_cmd_nvme_tune(int argc, char **argv)
{
    tune_t t = {0};
    int rc = parse_args(argc, argv, &t);
    if (rc) return rc < 0 ? 0 : rc;
    if ((rc = check_dir(t.dir))) return rc;
    result_t res[GRID_SIZE];
    double t0 = tr__now_s();
    int n = sweep(&t, res);
    if (n < 0) return -n;
    report(&t, res, n, tr__now_s() - t0);
    return 0;
}
