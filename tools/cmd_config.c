/* cmd_config.c: `troupe config check|show FILE [--world-size N]` and `troupe config
 * reference`. check prints the resolved batch triple and every warning (exit 0), or every
 * error (exit 2); show prints the fully resolved config, defaults marked; reference prints the
 * key tables of docs/config.md. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "troupe/config.h"

static const char usage[] =
    "usage: troupe config check FILE [--world-size N]\n"
    "       troupe config show FILE [--world-size N] [--plain]\n"
    "       troupe config reference\n"
    "\n"
    "Reads a DeepSpeed config (ds_config.json) as Troupe resolves it.\n"
    "  check         print the resolved batch triple and any warnings; exit 0 when the\n"
    "                config is valid, 2 with every error otherwise\n"
    "  show          print the fully resolved config; values not written in the file are\n"
    "                marked // default, // auto, // derived or // ignored\n"
    "  reference     print every section and key with its default (docs/config.md)\n"
    "  --world-size  data-parallel world size used to resolve the batch (default 1)\n"
    "  --plain       show: plain JSON without the markers\n";

typedef struct opts {
    const char *action, *file;
    int world;
    int plain;
} opts_t;

static int parse_world(const char *s, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > 1 << 24) return -1;
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.world = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--world-size") && i + 1 < argc) {
            if (parse_world(argv[++i], &o->world) < 0) {
                fprintf(stderr,
                        "troupe config: --world-size must be a positive integer, got "
                        "'%s'\n",
                        argv[i]);
                return -1;
            }
        } else if (!strcmp(a, "--plain")) {
            o->plain = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "troupe config: unknown option '%s'\n%s", a, usage);
            return -1;
        } else if (!o->action) {
            o->action = a;
        } else if (!o->file) {
            o->file = a;
        } else {
            fprintf(stderr, "troupe config: unexpected argument '%s'\n%s", a, usage);
            return -1;
        }
    }
    if (!o->action || !o->file || (strcmp(o->action, "check") && strcmp(o->action, "show"))) {
        fputs(usage, stderr);
        return -1;
    }
    return 0;
}

static void print_diag(const tr_config_diag_t *d)
{
    for (size_t i = 0; i < d->count; i++)
        fprintf(stderr, "%s\n", d->items[i].text);
}

static void print_check(const tr_config_t *cfg, const tr_config_diag_t *d)
{
    printf("%s: ok: train_batch_size %lld = train_micro_batch_size_per_gpu %lld * "
           "gradient_accumulation_steps %lld * world_size %lld\n",
           cfg->source, (long long)cfg->train_batch_size,
           (long long)cfg->train_micro_batch_size_per_gpu,
           (long long)cfg->gradient_accumulation_steps, (long long)cfg->world_size);
    if (d->n_warnings)
        printf("%s: %zu warning%s\n", cfg->source, d->n_warnings, d->n_warnings == 1 ? "" : "s");
}

int tr_cmd_config(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return 0;
        }
    if (argc == 2 && !strcmp(argv[1], "reference")) {
        char *text = tr_config_reference();
        if (text) fputs(text, stdout);
        free(text);
        return text ? 0 : 1;
    }
    opts_t o;
    if (parse_args(argc, argv, &o) < 0) return 2;
    tr_config_diag_t d;
    tr_config_diag_init(&d);
    tr_config_t *cfg = NULL;
    int err = tr_config_load(o.file, o.world, &cfg, &d);
    print_diag(&d);
    int rc = 2;
    if (err == 0 && !strcmp(o.action, "check")) {
        print_check(cfg, &d);
        rc = 0;
    } else if (err == 0) {
        char *text = tr_config_dump(cfg, o.plain ? 0 : TR_CONFIG_DUMP_MARK);
        if (text) fputs(text, stdout);
        free(text);
        rc = text ? 0 : 1;
    } else {
        fprintf(stderr, "%s: %zu error%s (%s)\n", o.file, d.n_errors, d.n_errors == 1 ? "" : "s",
                tr_strerror(err));
    }
    tr_config_destroy(cfg);
    tr_config_diag_close(&d);
    return rc;
}
