/* troupe nvme-bench: the aio engine's write and read throughput on one file in a directory,
 * with the `aio` section's knobs as flags (DeepSpeed's ds_io, in spirit).
 *
 * The options start from the defaults, or from the `aio` section of --deepspeed_config FILE
 * (through tr_aio_options_from_config, as the swapper will read them); the aio flags override
 * them wherever they stand on the line. tr__nvme_measure (nvme_measure.c) writes --io-size
 * bytes into a fresh file under --dir, reads them back, and removes the file; this prints
 * `nvme.write: X GB/s` and `nvme.read: Y GB/s` (GB = 1e9 bytes).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "nvme_measure.h"
#include "troupe/aio.h"
#include "troupe/config.h"
#include "troupe/error.h"

static const char usage[] =
    "usage: troupe nvme-bench --dir DIR [--io-size N] [--deepspeed_config FILE]\n"
    "                         [--block_size N] [--queue_depth N] [--intra_op_parallelism N]\n"
    "                         [--single_submit] [--overlap_events 0|1]\n"
    "\n"
    "Writes then reads N bytes (default 256M) in one file under DIR with the aio engine\n"
    "(libaio, O_DIRECT) and prints nvme.write and nvme.read in GB/s (1e9 bytes).\n"
    "Sizes take a K, M or G suffix (powers of 1024). The aio flags are the config's `aio`\n"
    "keys, with its defaults: block_size 1M, queue_depth 8, intra_op_parallelism 1,\n"
    "single_submit off, overlap_events 1. --deepspeed_config takes them from FILE's `aio`\n"
    "section instead; the aio flags still override it.\n"
    "Exit status: 0; 1 when the I/O fails; 2 for a bad flag or config.\n";

static const char cmd[] = "nvme-bench";

typedef struct bench {
    const char *dir;
    uint64_t io_size;
    tr_aio_options_t o;
} bench_t;

/* The `aio` section of a config file as options; 2 (the exit status) when it does not load,
 * after printing its errors. The warnings are left out: today they say only that training
 * does not use the section yet, which is not true of this command. */
static int options_from_file(const char *path, tr_aio_options_t *o)
{
    tr_config_diag_t d;
    tr_config_diag_init(&d);
    tr_config_t *cfg = NULL;
    int rc = tr_config_load(path, 1, &cfg, &d);
    for (size_t i = 0; i < d.count; i++)
        if (d.items[i].severity == TR_CONFIG_ERROR) fprintf(stderr, "%s\n", d.items[i].text);
    if (rc)
        fprintf(stderr, "troupe %s: --deepspeed_config %s: %s\n", cmd, path, tr_strerror(rc));
    else
        tr_aio_options_from_config(&cfg->aio, o);
    tr_config_destroy(cfg);
    tr_config_diag_close(&d);
    return rc ? 2 : 0;
}

/* The options before the flags: --deepspeed_config's section, or the defaults. */
static int base_options(int argc, char **argv, tr_aio_options_t *o)
{
    tr_aio_options_default(o);
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--deepspeed_config")) return options_from_file(argv[i + 1], o);
    return 0;
}

static int known_valued_flag(const char *a)
{
    static const char *const flags[] = {
        "--dir",           "--io-size",     "--deepspeed_config",
        "--block_size",    "--queue_depth", "--intra_op_parallelism",
        "--overlap_events"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(a, flags[i])) return 1;
    return 0;
}

/* One flag with its value. */
static int apply_flag(const char *a, const char *val, bench_t *b)
{
    uint64_t v;
    int rc = 0;
    if (!strcmp(a, "--dir"))
        b->dir = val;
    else if (!strcmp(a, "--io-size") && !(rc = tr__nvme_parse_size(cmd, a, val, 1, 1ull << 40, &v)))
        b->io_size = v;
    else if (!strcmp(a, "--block_size") &&
             !(rc = tr__nvme_parse_size(cmd, a, val, 512, 1u << 30, &v)))
        b->o.block_size = (size_t)v;
    else if (!strcmp(a, "--queue_depth") && !(rc = tr__nvme_parse_size(cmd, a, val, 1, 65536, &v)))
        b->o.queue_depth = (int)v;
    else if (!strcmp(a, "--intra_op_parallelism") &&
             !(rc = tr__nvme_parse_size(cmd, a, val, 1, 1024, &v)))
        b->o.intra_op_parallelism = (int)v;
    else if (!strcmp(a, "--overlap_events")) {
        if (strcmp(val, "0") && strcmp(val, "1")) return tr__nvme_bad_flag(cmd, a, val, "0 or 1");
        b->o.overlap_events = val[0] == '1';
    }
    return rc;
}

/* 0, -1 after --help, or 2 for bad usage (printed). */
static int parse_args(int argc, char **argv, bench_t *b)
{
    b->io_size = 256u << 20;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return -1;
        }
    int rc = base_options(argc, argv, &b->o);
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--single_submit")) {
            b->o.single_submit = 1;
        } else if (!known_valued_flag(a)) {
            fprintf(stderr, "troupe %s: unknown flag '%s'\n%s", cmd, a, usage);
            return 2;
        } else if (i + 1 >= argc) {
            return tr__nvme_bad_flag(cmd, a, "", "a value after it");
        } else {
            rc = apply_flag(a, argv[++i], b);
        }
    }
    if (rc) return rc;
    if (!b->dir) {
        fprintf(stderr, "troupe %s: --dir is required\n%s", cmd, usage);
        return 2;
    }
    if (b->io_size % (uint64_t)b->o.intra_op_parallelism) {
        char v[32];
        snprintf(v, sizeof v, "%llu", (unsigned long long)b->io_size);
        return tr__nvme_bad_flag(cmd, "--io-size", v, "a multiple of --intra_op_parallelism");
    }
    return 0;
}

int tr_cmd_nvme_bench(int argc, char **argv)
{
    bench_t b = {0};
    int rc = parse_args(argc, argv, &b);
    if (rc) return rc < 0 ? 0 : rc;
    char why[512];
    double w = 0, r = 0;
    rc = tr__nvme_measure(b.dir, b.io_size, &b.o, &w, &r, why, sizeof why);
    if (rc) {
        fprintf(stderr, "troupe %s: %s\n", cmd, why);
        return rc == TR_EINVAL ? 2 : 1;
    }
    printf("nvme.io_size: %llu bytes\nnvme.block_size: %zu bytes\nnvme.queue_depth: %d\n"
           "nvme.intra_op_parallelism: %d\nnvme.single_submit: %d\nnvme.overlap_events: %d\n"
           "nvme.write: %.3f GB/s\nnvme.read: %.3f GB/s\n",
           (unsigned long long)b.io_size, b.o.block_size, b.o.queue_depth, b.o.intra_op_parallelism,
           b.o.single_submit, b.o.overlap_events, w, r);
    return 0;
}
