/* cmd_trace.c: `troupe trace`, reading the traces a run wrote.
 *
 *   troupe trace summary DIR|FILE [--json]      the wall-clock breakdown, overlap, critical path
 *   troupe trace plot FILE|DIR -o timeline.svg  a timeline picture
 *   troupe trace merge DIR -o merged.json       every rank in one file, clocks aligned
 *
 * A file cut short by a crash is repaired as it is read. Exit status: 0, 1 when the trace
 * cannot be read or written, 2 for bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "troupe/trace.h"

static int usage(FILE *out)
{
    fprintf(out, "usage: troupe trace summary DIR|FILE [--json]\n"
                 "       troupe trace plot DIR|FILE -o timeline.svg [--width PX] [--from US] "
                 "[--to US]\n"
                 "       troupe trace merge DIR -o merged.json\n"
                 "DIR holds trace_rank<R>.json files; a file cut short by a crash is repaired.\n");
    return out == stdout ? 0 : 2;
}

typedef struct trace_args {
    const char *input;
    const char *output;
    int json;
    tr_plot_opts_t plot;
} trace_args_t;

static int parse_args(int argc, char **argv, trace_args_t *a)
{
    memset(a, 0, sizeof(*a));
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(arg, "--json"))
            a->json = 1;
        else if (!strcmp(arg, "-o") && has_value)
            a->output = argv[++i];
        else if (!strcmp(arg, "--width") && has_value)
            a->plot.width = atoi(argv[++i]);
        else if (!strcmp(arg, "--from") && has_value)
            a->plot.from_us = atof(argv[++i]);
        else if (!strcmp(arg, "--to") && has_value)
            a->plot.to_us = atof(argv[++i]);
        else if (arg[0] != '-' && !a->input)
            a->input = arg;
        else {
            fprintf(stderr, "troupe trace: unexpected argument '%s'\n", arg);
            return -1;
        }
    }
    if (!a->input) {
        fprintf(stderr, "troupe trace %s: which trace? (a directory or a file)\n", argv[1]);
        return -1;
    }
    return 0;
}

static tr_trace_t *load(const char *path)
{
    char err[512];
    tr_trace_t *t;
    if (tr_trace_load(path, &t, err, sizeof(err))) {
        fprintf(stderr, "troupe trace: %s\n", err);
        return NULL;
    }
    if (tr_trace_repaired(t))
        fprintf(stderr, "troupe trace: %d file(s) were cut short (a crashed run?) and repaired\n",
                tr_trace_repaired(t));
    return t;
}

/* Runs what on the loaded trace into a->output (stdout when NULL). */
static int write_output(const trace_args_t *a, tr_trace_t *t, const char *what)
{
    FILE *out = a->output ? fopen(a->output, "w") : stdout;
    if (!out) {
        perror(a->output);
        return 1;
    }
    int err;
    if (!strcmp(what, "summary"))
        err = tr_trace_summary_write(t, out, a->json);
    else if (!strcmp(what, "plot"))
        err = tr_trace_plot_svg(t, out, &a->plot);
    else
        err = tr_trace_merge_write(t, out);
    if (out != stdout && fclose(out))
        err = err ? err : -1;
    if (err)
        fprintf(stderr, "troupe trace %s: cannot write %s\n", what,
                a->output ? a->output : "stdout");
    return err ? 1 : 0;
}

int tr_cmd_trace(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
        return usage(argc < 2 ? stderr : stdout);
    const char *what = argv[1];
    if (strcmp(what, "summary") && strcmp(what, "plot") && strcmp(what, "merge")) {
        fprintf(stderr, "troupe trace: unknown subcommand '%s'\n", what);
        return usage(stderr);
    }
    trace_args_t a;
    if (parse_args(argc, argv, &a))
        return usage(stderr);
    if (strcmp(what, "summary") && !a.output) {
        fprintf(stderr, "troupe trace %s: give the output file with -o\n", what);
        return 2;
    }
    tr_trace_t *t = load(a.input);
    if (!t)
        return 1;
    int rc = write_output(&a, t, what);
    tr_trace_destroy(t);
    return rc;
}
