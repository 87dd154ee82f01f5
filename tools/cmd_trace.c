/* cmd_trace.c: `troupe trace`, reading the traces a run wrote.
 *
 *   troupe trace summary DIR|FILE [--json]      the wall-clock breakdown, overlap, critical path
 *   troupe trace plot FILE|DIR -o timeline.svg  a timeline picture
 *   troupe trace merge DIR -o merged.json       every rank in one file, clocks aligned
 *
 * A file cut short by a crash is repaired as it is read. Exit status: 0, 1 when the trace
 * cannot be read or written or the plot's window holds no span, 2 for bad usage (an output
 * that is one of the inputs included).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>

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

#define MIN_WIDTH 400 /* pixels: the lane labels take 180 */
#define MAX_WIDTH 100000

/* --width PX: an integer from MIN_WIDTH to MAX_WIDTH, nothing else. */
static int parse_width(const char *v, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || v[0] == ' ' || x < MIN_WIDTH || x > MAX_WIDTH) {
        fprintf(stderr,
                "troupe trace: --width: expected an integer from %d to %d (pixels), "
                "got '%s'\n",
                MIN_WIDTH, MAX_WIDTH, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* --from/--to US: a finite number of microseconds >= 0 (trace timestamps start at 0). */
static int parse_time(const char *flag, const char *v, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || v[0] == ' ' || !isfinite(x) || x < 0) {
        fprintf(stderr,
                "troupe trace: %s: expected a finite number of microseconds >= 0, got "
                "'%s'\n",
                flag, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* One flag with its value argv[i + 1]; returns how many arguments it used, or -1. */
static int parse_flag(int argc, char **argv, int i, trace_args_t *a)
{
    const char *arg = argv[i];
    if (!strcmp(arg, "--json")) {
        a->json = 1;
        return 1;
    }
    if (strcmp(arg, "-o") && strcmp(arg, "--width") && strcmp(arg, "--from") &&
        strcmp(arg, "--to")) {
        fprintf(stderr, "troupe trace: unexpected argument '%s'\n", arg);
        return -1;
    }
    if (i + 1 >= argc) {
        fprintf(stderr, "troupe trace: %s: expected a value after it\n", arg);
        return -1;
    }
    const char *v = argv[i + 1];
    int rc = 0;
    if (!strcmp(arg, "-o"))
        a->output = v;
    else if (!strcmp(arg, "--width"))
        rc = parse_width(v, &a->plot.width);
    else
        rc = parse_time(arg, v, !strcmp(arg, "--from") ? &a->plot.from_us : &a->plot.to_us);
    return rc < 0 ? -1 : 2;
}

static int parse_args(int argc, char **argv, trace_args_t *a)
{
    memset(a, 0, sizeof(*a));
    int has_to = 0;
    for (int i = 2; i < argc;) {
        int used = 1;
        if (argv[i][0] != '-' && !a->input)
            a->input = argv[i];
        else if ((used = parse_flag(argc, argv, i, a)) < 0)
            return -1;
        has_to |= !strcmp(argv[i], "--to");
        i += used;
    }
    if (has_to && a->plot.to_us <= a->plot.from_us) {
        fprintf(stderr, "troupe trace: --to %g: expected a time after --from %g\n", a->plot.to_us,
                a->plot.from_us);
        return -1;
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

/* Is `name` one of the files tr_trace_load reads from a directory (trace_rank*.json)? */
static int is_trace_name(const char *name)
{
    size_t len = strlen(name);
    return !strncmp(name, "trace_rank", 10) && len >= 15 && !strcmp(name + len - 5, ".json");
}

/* Refuses an output that is one of the inputs (the file given, or a trace_rank*.json of the
 * directory given), compared by device and inode so another spelling, a symlink or a hard
 * link of the input is caught too: opening it for writing would destroy the trace before it
 * is written. 0 when the output is not an input (or does not exist yet). */
static int output_is_input(const char *input, const char *output)
{
    struct stat o, in;
    if (!output || stat(output, &o) || stat(input, &in)) return 0;
    int same = 0;
    if (!S_ISDIR(in.st_mode)) same = in.st_dev == o.st_dev && in.st_ino == o.st_ino;
    DIR *d = S_ISDIR(in.st_mode) ? opendir(input) : NULL;
    for (struct dirent *e; d && !same && (e = readdir(d));) {
        char path[4096];
        struct stat st;
        if (!is_trace_name(e->d_name)) continue;
        snprintf(path, sizeof(path), "%s/%s", input, e->d_name);
        same = !stat(path, &st) && st.st_dev == o.st_dev && st.st_ino == o.st_ino;
    }
    if (d) closedir(d);
    if (same)
        fprintf(stderr,
                "troupe trace: -o %s: is one of the input trace files; writing it would "
                "destroy the trace. Give an output outside the inputs (e.g. merged.json)\n",
                output);
    return same;
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
    if (out != stdout && fclose(out)) err = err ? err : -1;
    char to[64] = "";
    if (a->plot.to_us > 0) snprintf(to, sizeof(to), " --to %g", a->plot.to_us);
    if (err == TR_ERANGE) /* the plot's window selects no span */
        fprintf(stderr,
                "troupe trace plot: --from %g%s: no span of the trace lies in this window "
                "(times are microseconds on the trace's clock, as in its \"ts\" fields)\n",
                a->plot.from_us, to);
    else if (err)
        fprintf(stderr, "troupe trace %s: cannot write %s\n", what,
                a->output ? a->output : "stdout");
    struct stat st; /* no empty or half-written file left; /dev/null and pipes stay */
    if (err && a->output && !stat(a->output, &st) && S_ISREG(st.st_mode)) remove(a->output);
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
    for (int i = 2; i < argc; i++) /* `troupe trace summary --help`: the usage, not an error */
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout);
    trace_args_t a;
    if (parse_args(argc, argv, &a)) return usage(stderr);
    if (strcmp(what, "summary") && !a.output) {
        fprintf(stderr, "troupe trace %s: give the output file with -o\n", what);
        return 2;
    }
    if (output_is_input(a.input, a.output)) return 2;
    tr_trace_t *t = load(a.input);
    if (!t) return 1;
    int rc = write_output(&a, t, what);
    tr_trace_destroy(t);
    return rc;
}
