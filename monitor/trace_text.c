/* trace_text.c: the text form of `troupe trace summary`.
 *
 * For each rank: a table with one row per step (wall time, the breakdown as percentages of
 * it, how much comm and io was hidden behind compute, the critical path's length), a row
 * for all steps together, and, for the slowest step, the busy time of every actor and the
 * critical path itself. Then, with several ranks, the spread of each phase across ranks and
 * the slowest ranks. Everything printed here is in the JSON document (`--json`).
 */
#include "monitor/trace_model.h"

#include <string.h>

static const char *const phases[] = {"compute", "comm_exposed", "io_exposed",
                                     "other",   "mailbox_wait", "idle"};
#define N_PH (sizeof(phases) / sizeof(phases[0]))

static double num(json_t *o, const char *k)
{
    return json_number_value(json_object_get(o, k));
}

static void pct(FILE *out, json_t *v, int width)
{
    if (json_is_number(v))
        fprintf(out, " %*.1f%%", width - 1, 100 * json_number_value(v));
    else
        fprintf(out, " %*s", width, "n/a");
}

static void table_header(FILE *out)
{
    fprintf(out, "  %5s %10s %8s %9s %8s %7s %10s %7s | %11s %9s | %8s\n", "step", "wall ms",
            "compute", "comm exp", "io exp", "other", "mbox wait", "idle", "comm hidden",
            "io hidden", "crit ms");
}

/* One row: label, wall, the phases as % of wall, the overlaps, the critical path. */
static void table_row(FILE *out, const char *label, json_t *st)
{
    static const int widths[N_PH] = {8, 9, 8, 7, 10, 7};
    double wall = num(st, "wall_ms");
    json_t *b = json_object_get(st, "breakdown_ms"), *ov = json_object_get(st, "overlap");
    fprintf(out, "  %5s %10.3f", label, wall);
    for (size_t p = 0; p < N_PH; p++)
        fprintf(out, " %*.1f%%", widths[p] - 1, wall > 0 ? 100 * num(b, phases[p]) / wall : 0);
    fprintf(out, " |");
    pct(out, json_object_get(ov, "comm"), 11);
    pct(out, json_object_get(ov, "io"), 9);
    json_t *cp = json_object_get(st, "critical_path");
    if (cp)
        fprintf(out, " | %8.3f\n", num(cp, "ms"));
    else
        fprintf(out, " | %8s\n", "");
}

static void print_details(FILE *out, json_t *st)
{
    size_t i;
    json_t *a;
    double wall = num(st, "wall_ms");
    fprintf(out, "  slowest step %lld (%.3f ms):\n    busy:",
            (long long)json_integer_value(json_object_get(st, "step")), wall);
    json_array_foreach(json_object_get(st, "busy"), i, a) fprintf(
        out, "%s %s %.3f ms (%.0f%%)", i ? "," : "", json_string_value(json_object_get(a, "actor")),
        num(a, "ms"), wall > 0 ? 100 * num(a, "ms") / wall : 0);
    json_t *cp = json_object_get(st, "critical_path"), *spans = json_object_get(cp, "spans");
    size_t n = json_array_size(spans);
    fprintf(out, "\n    critical path: %.3f ms over %zu span%s (%.3f ms busy):", num(cp, "ms"), n,
            n == 1 ? "" : "s", num(cp, "busy_ms"));
    for (i = 0; i < n; i++) {
        if (i == 8 && n > 10) { /* the first eight and the last */
            fprintf(out, " -> ... %zu more", n - 9);
            i = n - 1;
        }
        a = json_array_get(spans, i);
        fprintf(out, "%s %s/%s", i ? " ->" : "", json_string_value(json_object_get(a, "actor")),
                json_string_value(json_object_get(a, "message")));
        size_t k;
        json_t *name;
        json_array_foreach(json_object_get(a, "nested"), k, name)
            fprintf(out, "%s%s", k ? "," : "(", json_string_value(name));
        fprintf(out, "%s %.3f", json_array_size(json_object_get(a, "nested")) ? ")" : "",
                num(a, "ms"));
    }
    fprintf(out, "\n");
}

static void print_rank(FILE *out, json_t *r)
{
    json_t *steps = json_object_get(r, "steps"), *st, *slowest = NULL;
    size_t i;
    json_int_t outside = json_integer_value(json_object_get(r, "outside_spans"));
    fprintf(out, "rank %d: %zu step%s", (int)json_integer_value(json_object_get(r, "rank")),
            json_array_size(steps), json_array_size(steps) == 1 ? "" : "s");
    json_int_t nonstep = json_integer_value(json_object_get(r, "nonstep_spans"));
    if (outside)
        fprintf(out, " (%lld span%s of untraced steps left out)", (long long)outside,
                outside == 1 ? "" : "s");
    if (nonstep)
        fprintf(out, " (%lld span%s outside any step left out: kill/stop/exit, no step)",
                (long long)nonstep, nonstep == 1 ? "" : "s");
    fputc('\n', out);
    table_header(out);
    json_array_foreach(steps, i, st)
    {
        char label[24];
        snprintf(label, sizeof(label), "%lld",
                 (long long)json_integer_value(json_object_get(st, "step")));
        table_row(out, label, st);
        if (!slowest || num(st, "wall_ms") > num(slowest, "wall_ms")) slowest = st;
    }
    if (json_array_size(steps) > 1) table_row(out, "all", json_object_get(r, "total"));
    if (slowest) print_details(out, slowest);
}

static void print_across(FILE *out, json_t *across)
{
    size_t i, j;
    json_t *st, *r, *v;
    const char *k;
    if (json_array_size(across)) fprintf(out, "across ranks (ms, min/median/max):\n");
    json_array_foreach(across, i, st)
    {
        fprintf(out, "  step %lld:", (long long)json_integer_value(json_object_get(st, "step")));
        json_object_foreach(json_object_get(st, "phases_ms"), k, v)
            fprintf(out, " %s %.3f/%.3f/%.3f;", k, num(v, "min"), num(v, "median"), num(v, "max"));
        fprintf(out, " slowest:");
        json_array_foreach(json_object_get(st, "slowest_ranks"), j, r)
            fprintf(out, "%s rank %d (%.3f)", j ? "," : "",
                    (int)json_integer_value(json_object_get(r, "rank")), num(r, "wall_ms"));
        fprintf(out, "\n");
    }
}

void tr__summary_print_text(FILE *out, json_t *doc)
{
    fprintf(out, "%d rank(s), %lld spans%s\n",
            (int)json_integer_value(json_object_get(doc, "ranks")),
            (long long)json_integer_value(json_object_get(doc, "spans")),
            json_integer_value(json_object_get(doc, "repaired_files"))
                ? " (repaired: cut short by a crash)"
                : "");
    if (json_integer_value(json_object_get(doc, "spans")) == 0)
        fprintf(out, "no spans: no step of the run fell in the trace's step window "
                     "(troupe.trace.steps), or no message was handled\n");
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(doc, "per_rank"), i, r) print_rank(out, r);
    print_across(out, json_object_get(doc, "across_ranks"));
}
