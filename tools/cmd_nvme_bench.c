/* troupe nvme-bench: the aio engine's write and read throughput on one file in a directory,
 * with the `aio` section's knobs as flags (DeepSpeed's ds_io, in spirit).
 *
 * It writes --io-size bytes from one locked buffer with tr_aio_pwrite_sync into a fresh file
 * under --dir, then reads them back with tr_aio_pread_sync, timing each pass, and prints
 * `nvme.write: X GB/s` and `nvme.read: Y GB/s` (GB = 1e9 bytes). The read follows the write
 * with O_DIRECT, so it measures the device, not the page cache (unless the file system
 * refuses O_DIRECT; the engine then warns). The file is removed at the end.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "troupe/aio.h"
#include "troupe/error.h"

static const char usage[] =
    "usage: troupe nvme-bench --dir DIR [--io-size N] [--block_size N] [--queue_depth N]\n"
    "                         [--intra_op_parallelism N] [--single_submit] [--overlap_events 0|1]\n"
    "\n"
    "Writes then reads N bytes (default 256M) in one file under DIR with the aio engine\n"
    "(libaio, O_DIRECT) and prints nvme.write and nvme.read in GB/s (1e9 bytes).\n"
    "Sizes take a K, M or G suffix (powers of 1024). The aio flags are the config's `aio`\n"
    "keys, with its defaults: block_size 1M, queue_depth 8, intra_op_parallelism 1,\n"
    "single_submit off, overlap_events 1.\n"
    "Exit status: 0; 1 when the I/O fails; 2 for a bad flag.\n";

typedef struct bench {
    const char *dir;
    uint64_t io_size;
    tr_aio_options_t o;
} bench_t;

static int bad(const char *flag, const char *value, const char *expected)
{
    fprintf(stderr, "troupe nvme-bench: %s: expected %s, got '%s'\n%s", flag, expected, value,
            "(troupe nvme-bench --help lists the flags)\n");
    return 2;
}

/* A size with an optional K/M/G suffix, from lo to hi. */
static int parse_size(const char *flag, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mul = *end == 'K' ? 1u << 10 : *end == 'M' ? 1u << 20 : *end == 'G' ? 1u << 30 : 1;
    if (mul > 1)
        end++;
    char expected[96];
    snprintf(expected, sizeof expected, "a size from %llu to %llu bytes (K, M, G allowed)",
             (unsigned long long)lo, (unsigned long long)hi);
    if (errno || end == s || *end || s[0] == '-' || v > hi / mul || v * mul < lo)
        return bad(flag, s, expected);
    *out = v * mul;
    return 0;
}

static int parse_args(int argc, char **argv, bench_t *b)
{
    tr_aio_options_default(&b->o);
    b->io_size = 256u << 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        uint64_t v;
        int rc = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return -1;
        }
        if (!strcmp(a, "--single_submit")) {
            b->o.single_submit = 1;
            continue;
        }
        if (strcmp(a, "--dir") && strcmp(a, "--io-size") && strcmp(a, "--block_size") &&
            strcmp(a, "--queue_depth") && strcmp(a, "--intra_op_parallelism") &&
            strcmp(a, "--overlap_events")) {
            fprintf(stderr, "troupe nvme-bench: unknown flag '%s'\n%s", a, usage);
            return 2;
        }
        if (i + 1 >= argc)
            return bad(a, "", "a value after it");
        const char *val = argv[++i];
        if (!strcmp(a, "--dir"))
            b->dir = val;
        else if (!strcmp(a, "--io-size") && !(rc = parse_size(a, val, 1, 1ull << 40, &v)))
            b->io_size = v;
        else if (!strcmp(a, "--block_size") && !(rc = parse_size(a, val, 512, 1u << 30, &v)))
            b->o.block_size = (size_t)v;
        else if (!strcmp(a, "--queue_depth") && !(rc = parse_size(a, val, 1, 65536, &v)))
            b->o.queue_depth = (int)v;
        else if (!strcmp(a, "--intra_op_parallelism") && !(rc = parse_size(a, val, 1, 1024, &v)))
            b->o.intra_op_parallelism = (int)v;
        else if (!strcmp(a, "--overlap_events")) {
            if (strcmp(val, "0") && strcmp(val, "1"))
                return bad(a, val, "0 or 1");
            b->o.overlap_events = val[0] == '1';
        }
        if (rc)
            return rc;
    }
    if (!b->dir) {
        fprintf(stderr, "troupe nvme-bench: --dir is required\n%s", usage);
        return 2;
    }
    if (b->io_size % (uint64_t)b->o.intra_op_parallelism) {
        char v[32];
        snprintf(v, sizeof v, "%llu", (unsigned long long)b->io_size);
        return bad("--io-size", v, "a multiple of --intra_op_parallelism");
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One timed pass: GB/s into *gbs. */
static int pass(tr_aio_t *aio, tr_aio_file_t *f, int write, void *buf, uint64_t n, double *gbs)
{
    char why[512];
    double t0 = now_s();
    int rc = write ? tr_aio_pwrite_sync(aio, f, buf, (size_t)n, 0, why, sizeof why)
                   : tr_aio_pread_sync(aio, f, buf, (size_t)n, 0, why, sizeof why);
    double dt = now_s() - t0;
    if (rc) {
        fprintf(stderr, "troupe nvme-bench: %s\n", why);
        return 1;
    }
    *gbs = (double)n / dt / 1e9;
    return 0;
}

static int run(const bench_t *b)
{
    char why[512], path[4096];
    snprintf(path, sizeof path, "%s/troupe_nvme_bench.%ld", b->dir, (long)getpid());
    tr_aio_t *aio = NULL;
    tr_aio_file_t *f = NULL;
    void *buf = NULL;
    int rc = tr_aio_create(&b->o, &aio, why, sizeof why);
    if (!rc)
        rc = tr_aio_open(aio, path, TR_AIO_READ | TR_AIO_WRITE | TR_AIO_CREATE, &f, why,
                         sizeof why);
    if (rc) {
        fprintf(stderr, "troupe nvme-bench: %s\n", why);
        tr_aio_destroy(aio);
        return rc == TR_EINVAL ? 2 : 1;
    }
    if (tr_aio_buffer_alloc(aio, (size_t)b->io_size, &buf)) {
        fprintf(stderr, "troupe nvme-bench: no memory for a %llu-byte buffer\n",
                (unsigned long long)b->io_size);
        rc = 1;
    } else {
        memset(buf, 0x5a, (size_t)b->io_size);
        double w = 0, r = 0;
        rc = pass(aio, f, 1, buf, b->io_size, &w) || pass(aio, f, 0, buf, b->io_size, &r);
        if (!rc)
            printf("nvme.io_size: %llu bytes\nnvme.write: %.3f GB/s\nnvme.read: %.3f GB/s\n",
                   (unsigned long long)b->io_size, w, r);
    }
    tr_aio_buffer_free(aio, buf, (size_t)b->io_size);
    tr_aio_close(f);
    unlink(path);
    tr_aio_destroy(aio);
    return rc;
}

int tr_cmd_nvme_bench(int argc, char **argv)
{
    bench_t b = {0};
    int rc = parse_args(argc, argv, &b);
    if (rc)
        return rc < 0 ? 0 : rc;
    return run(&b);
}
