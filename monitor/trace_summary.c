/* trace_summary.c: the wall-clock breakdown of a loaded trace, `troupe trace summary`.
 *
 * For every rank and every step (spans grouped by their "step" argument; the step runs from
 * its "step" marker, or its first span, to its last span's end) it computes the following.
 * When a rank's trace has step markers, a group of spans whose step has none is a straggler
 * of a step the window did not write (a span that ended just after its step closed): it is
 * counted as "outside_spans" rather than shown as a step of a few microseconds. Spans outside
 * any training step (TR__STEP_NONE: the runtime's kill/stop/exit, spans with no step) are
 * never a step: they are counted as "nonstep_spans".
 *  - busy time per actor: the time its lane is inside some span. A span wholly inside another
 *    of its lane (a pipeline stage's forward inside the span of the message that ran it,
 *    trace_model.h) is the outer span's time, counted once: busy never exceeds the wall time;
 *  - a breakdown that partitions the step's wall time, by priority: compute (some compute
 *    actor busy), exposed comm (comm busy, no compute), exposed io, other actors (control,
 *    data), mailbox wait (a message sent and not yet being handled, nothing busy), idle;
 *  - overlap: |comm ∩ compute| / |comm| and the same for io, the fraction hidden;
 *  - the critical path: from the span that ends last, walk back to whatever it waited for,
 *    the sender of its message or, when its actor was still busy when the message arrived,
 *    the actor's previous span; a chain through the message graph whose length is the step.
 *    It is made of top-level spans: the time of nested spans is their outer span's; the names
 *    of the spans directly inside one are listed with it ("nested").
 * The breakdown and the overlaps merge every set's intervals, so nesting counts once there
 * too; they split time by the lanes' kinds, which an inner span shares with its outer one.
 * With several ranks it adds min/median/max per phase and the slowest ranks. The result is
 * one JSON document (jansson); trace_text.c prints the text form from it.
 */
#include "monitor/trace_model.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { SET_COMPUTE, SET_COMM, SET_IO, SET_OTHER, SET_WAIT, N_SETS };
enum { PH_COMPUTE, PH_COMM, PH_IO, PH_OTHER, PH_WAIT, PH_IDLE, N_PHASES };
static const char *const phase_names[N_PHASES] = {"compute", "comm_exposed", "io_exposed",
                                                  "other",   "mailbox_wait", "idle"};

/* --- interval sets ----------------------------------------------------------------------- */

typedef struct ivset {
    double *v; /* pairs: begin, end */
    size_t n, cap;
} ivset_t;

static void iv_add(ivset_t *s, double a, double b)
{
    if (b <= a) return;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        double *p = realloc(s->v, s->cap * 2 * sizeof(double));
        if (!p) abort(); /* out of memory while summarising: nothing sensible to print */
        s->v = p;
    }
    s->v[2 * s->n] = a;
    s->v[2 * s->n + 1] = b;
    s->n++;
}

static int pair_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts, clips to [lo, hi] and merges overlapping intervals. */
static void iv_normalize(ivset_t *s, double lo, double hi)
{
    if (!s->n) return;
    qsort(s->v, s->n, 2 * sizeof(double), pair_cmp);
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++) {
        double a = fmax(s->v[2 * i], lo), b = fmin(s->v[2 * i + 1], hi);
        if (b <= a) continue;
        if (n && a <= s->v[2 * n - 1]) {
            s->v[2 * n - 1] = fmax(s->v[2 * n - 1], b);
        } else {
            s->v[2 * n] = a;
            s->v[2 * n + 1] = b;
            n++;
        }
    }
    s->n = n;
}

/* Splits [lo, hi] at every boundary of the sets and adds each piece's length to
 * out[mask of the sets that cover it]. The sets must be normalized. */
static void iv_sweep(ivset_t *sets, int k, double lo, double hi, double *out)
{
    size_t pos[N_SETS] = {0};
    double x = lo;
    while (x < hi) {
        double next = hi;
        unsigned mask = 0;
        for (int i = 0; i < k; i++) {
            ivset_t *s = &sets[i];
            while (pos[i] < s->n && s->v[2 * pos[i] + 1] <= x)
                pos[i]++;
            if (pos[i] == s->n) continue;
            double a = s->v[2 * pos[i]], b = s->v[2 * pos[i] + 1];
            if (a <= x) {
                mask |= 1u << i;
                next = fmin(next, b);
            } else {
                next = fmin(next, a);
            }
        }
        out[mask] += next - x;
        x = next;
    }
}

/* --- one step on one rank ---------------------------------------------------------------- */

typedef struct step_stat {
    int rank;
    int64_t step;
    double t0, t1;
    double phase[N_PHASES];
    double comm_busy, io_busy, comm_hidden, io_hidden;
} step_stat_t;

static int set_of_kind(int kind)
{
    switch (kind) {
    case TR_LANE_COMPUTE:
        return SET_COMPUTE;
    case TR_LANE_COMM:
        return SET_COMM;
    case TR_LANE_IO:
        return SET_IO;
    default:
        return SET_OTHER;
    }
}

/* The step's extent: from its marker (if any) or first span to its last span's end. */
static void step_extent(const tr_trace_t *t, const size_t *idx, size_t n, step_stat_t *st)
{
    st->t0 = INFINITY;
    st->t1 = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        st->t0 = fmin(st->t0, t->spans[idx[i]].ts);
        st->t1 = fmax(st->t1, t->spans[idx[i]].end);
    }
    for (size_t i = 0; i < t->n_marks; i++)
        if (t->marks[i].rank == st->rank && t->marks[i].step == st->step && t->marks[i].ts < st->t0)
            st->t0 = t->marks[i].ts;
}

static void fill_sets(const tr_trace_t *t, const size_t *idx, size_t n, ivset_t *sets)
{
    for (size_t i = 0; i < n; i++) {
        const tr__tspan_t *s = &t->spans[idx[i]];
        iv_add(&sets[set_of_kind(t->lanes[s->lane].kind)], s->ts, s->end);
        const tr__tflow_t *f = s->flow ? tr__trace_flow(t, s->flow, s->rank) : NULL;
        if (f) iv_add(&sets[SET_WAIT], f->ts, s->ts);
    }
}

static void step_compute(const tr_trace_t *t, const size_t *idx, size_t n, step_stat_t *st)
{
    ivset_t sets[N_SETS] = {{0}};
    double by_mask[1u << N_SETS] = {0};
    step_extent(t, idx, n, st);
    fill_sets(t, idx, n, sets);
    for (int i = 0; i < N_SETS; i++)
        iv_normalize(&sets[i], st->t0, st->t1);
    iv_sweep(sets, N_SETS, st->t0, st->t1, by_mask);
    for (unsigned m = 0; m < (1u << N_SETS); m++) {
        double v = by_mask[m];
        int ph = m & 1 << SET_COMPUTE ? PH_COMPUTE
                 : m & 1 << SET_COMM  ? PH_COMM
                 : m & 1 << SET_IO    ? PH_IO
                 : m & 1 << SET_OTHER ? PH_OTHER
                 : m & 1 << SET_WAIT  ? PH_WAIT
                                      : PH_IDLE;
        st->phase[ph] += v;
        double hidden = m & 1 << SET_COMPUTE ? v : 0;
        if (m & 1 << SET_COMM) {
            st->comm_busy += v;
            st->comm_hidden += hidden;
        }
        if (m & 1 << SET_IO) {
            st->io_busy += v;
            st->io_hidden += hidden;
        }
    }
    for (int i = 0; i < N_SETS; i++)
        free(sets[i].v);
}

/* --- the critical path ----------------------------------------------------------------- */

/* The span that span i waited for, or -1: its message's sender, unless its own actor was
 * busy later than the message was sent (then the actor's previous span). */
static long predecessor(const tr_trace_t *t, long i, double t0)
{
    const tr__tspan_t *s = &t->spans[i];
    /* the previous top-level span: i - 1 or the span holding it (i is top-level, so none of
     * its own nested spans comes before it) */
    long prev = (size_t)i > t->lane_first[s->lane] ? t->spans[i - 1].outer : -1;
    if (prev >= 0 && (t->spans[prev].end < t0 || t->spans[prev].step != s->step)) prev = -1;
    const tr__tflow_t *f = s->flow ? tr__trace_flow(t, s->flow, s->rank) : NULL;
    long sender = f && f->ts >= t0 ? tr__trace_span_at(t, f->lane, f->ts) : -1;
    if (sender == i) sender = -1;
    if (sender >= 0 && (prev < 0 || t->spans[prev].end <= f->ts)) return sender;
    return prev;
}

/* The names of the spans directly inside top-level span i (what the message did: a stage's
 * BackwardPass then ForwardPass), in time order; NULL when none. */
static json_t *nested_names(const tr_trace_t *t, long i)
{
    json_t *names = NULL;
    const tr__tspan_t *s = &t->spans[i];
    for (size_t k = (size_t)i + 1;
         k < t->n_spans && t->spans[k].lane == s->lane && t->spans[k].outer == i; k++) {
        if (t->spans[k].depth != 1) continue;
        if (!names) names = json_array();
        json_array_append_new(names, json_string(t->spans[k].name));
    }
    return names;
}

static json_t *critical_path(const tr_trace_t *t, const size_t *idx, size_t n, double t0)
{
    long last = -1; /* the top-level span ending last (one holding a span of the group) */
    for (size_t i = 0; i < n; i++) {
        long top = t->spans[idx[i]].outer;
        if (last < 0 || t->spans[top].end > t->spans[last].end) last = top;
    }
    size_t len = 0, cap = n + 1;
    long *chain = malloc(cap * sizeof(long));
    for (long i = last; i >= 0 && len < cap; i = predecessor(t, i, t0))
        chain[len++] = i;
    json_t *spans = json_array();
    double busy = 0;
    for (size_t k = len; k-- > 0;) {
        const tr__tspan_t *s = &t->spans[chain[k]];
        const char *lane = t->lanes[s->lane].name;
        busy += s->end - s->ts;
        json_t *o = json_pack("{s:s,s:s,s:f,s:f}", "actor", lane ? lane : "?", "message", s->name,
                              "start_ms", (s->ts - t0) / 1e3, "ms", (s->end - s->ts) / 1e3);
        json_t *nested = nested_names(t, chain[k]);
        if (nested) json_object_set_new(o, "nested", nested);
        json_array_append_new(spans, o);
    }
    double total = len ? (t->spans[last].end - t->spans[chain[len - 1]].ts) / 1e3 : 0;
    free(chain);
    return json_pack("{s:f,s:f,s:o}", "ms", total, "busy_ms", busy / 1e3, "spans", spans);
}

/* --- assembling the document ------------------------------------------------------------- */

static json_t *ratio(double part, double whole)
{
    return whole > 0 ? json_real(part / whole) : json_null();
}

static json_t *phases_json(const step_stat_t *st)
{
    json_t *o = json_object();
    for (int p = 0; p < N_PHASES; p++)
        json_object_set_new(o, phase_names[p], json_real(st->phase[p] / 1e3));
    return o;
}

static json_t *overlap_json(const step_stat_t *st)
{
    return json_pack("{s:o,s:o,s:f,s:f}", "comm", ratio(st->comm_hidden, st->comm_busy), "io",
                     ratio(st->io_hidden, st->io_busy), "comm_busy_ms", st->comm_busy / 1e3,
                     "io_busy_ms", st->io_busy / 1e3);
}

static int idx_cmp(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* Each lane's busy time: the length of the union of its spans in the group. In index order
 * (lane, ts) the spans of a lane come in a run; a span that starts before the merged interval
 * ends (a nested span, or one overlapping the last) only extends it. */
static double *lane_busy(const tr_trace_t *t, const size_t *idx, size_t n)
{
    double *busy = calloc((size_t)t->n_lanes + 1, sizeof(double));
    size_t *ord = malloc((n + 1) * sizeof(size_t));
    if (!busy || !ord) abort(); /* out of memory while summarising: nothing sensible to print */
    memcpy(ord, idx, n * sizeof(size_t));
    qsort(ord, n, sizeof(size_t), idx_cmp);
    double a = 0;
    double b = 0;
    for (size_t i = 0; i < n; i++) {
        const tr__tspan_t *s = &t->spans[ord[i]];
        int first = !i || t->spans[ord[i - 1]].lane != s->lane;
        if (first || s->ts > b) {
            if (!first) busy[s->lane] += b - a;
            a = s->ts;
            b = s->end;
        } else {
            b = fmax(b, s->end);
        }
        if (i + 1 == n || t->spans[ord[i + 1]].lane != s->lane) busy[s->lane] += b - a;
    }
    free(ord);
    return busy;
}

static json_t *busy_json(const tr_trace_t *t, const size_t *idx, size_t n, double wall)
{
    double *busy = lane_busy(t, idx, n);
    json_t *arr = json_array();
    for (int l = 0; l < t->n_lanes; l++) {
        if (busy[l] <= 0) continue;
        const tr__tlane_t *lane = &t->lanes[l];
        json_array_append_new(arr,
                              json_pack("{s:s,s:s,s:f,s:o}", "actor", lane->name ? lane->name : "?",
                                        "kind", tr_lane_kind_name(lane->kind), "ms", busy[l] / 1e3,
                                        "fraction", ratio(busy[l], wall)));
    }
    free(busy);
    return arr;
}

static json_t *step_json(const tr_trace_t *t, const size_t *idx, size_t n, step_stat_t *st)
{
    step_compute(t, idx, n, st);
    double wall = st->t1 - st->t0;
    return json_pack("{s:I,s:f,s:f,s:o,s:o,s:o,s:o}", "step", (json_int_t)st->step, "start_ms",
                     st->t0 / 1e3, "wall_ms", wall / 1e3, "breakdown_ms", phases_json(st),
                     "overlap", overlap_json(st), "busy", busy_json(t, idx, n, wall),
                     "critical_path", critical_path(t, idx, n, st->t0));
}

static void stat_add(step_stat_t *sum, const step_stat_t *st)
{
    for (int p = 0; p < N_PHASES; p++)
        sum->phase[p] += st->phase[p];
    sum->comm_busy += st->comm_busy;
    sum->io_busy += st->io_busy;
    sum->comm_hidden += st->comm_hidden;
    sum->io_hidden += st->io_hidden;
    sum->t1 += st->t1 - st->t0; /* the total: summed wall time */
}

static int by_rank_step(const void *a, const void *b, void *arg)
{
    const tr_trace_t *t = arg;
    const tr__tspan_t *x = &t->spans[*(const size_t *)a], *y = &t->spans[*(const size_t *)b];
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return x->step < y->step ? -1 : x->step > y->step;
}

typedef struct summary {
    step_stat_t *stats;
    size_t n_stats;
    json_t *ranks;
} summary_t;

/* 1 when rank has step markers and none for step: its spans are stragglers (see the top). */
static int outside_window(const tr_trace_t *t, int rank, int64_t step)
{
    int any = 0;
    for (size_t i = 0; i < t->n_marks; i++)
        if (t->marks[i].rank == rank) {
            if (t->marks[i].step == step) return 0;
            any = 1;
        }
    return any;
}

/* Every (rank, step) group of spans in turn; fills s->stats and s->ranks. */
static void summarize_groups(const tr_trace_t *t, size_t *idx, summary_t *s)
{
    json_t *rank_obj = NULL, *steps = NULL;
    step_stat_t total = {0};
    for (size_t i = 0; i < t->n_spans;) {
        const tr__tspan_t *first = &t->spans[idx[i]];
        size_t j = i;
        while (j < t->n_spans && !by_rank_step(&idx[i], &idx[j], (void *)t))
            j++;
        if (!rank_obj || first->rank != total.rank) {
            rank_obj = json_object();
            steps = json_array();
            json_object_set_new(rank_obj, "rank", json_integer(first->rank));
            json_object_set_new(rank_obj, "steps", steps);
            json_array_append_new(s->ranks, rank_obj);
            total = (step_stat_t){.rank = first->rank};
        }
        if (first->step == TR__STEP_NONE) { /* shutdown traffic, spans with no step */
            json_object_set_new(rank_obj, "nonstep_spans", json_integer((json_int_t)(j - i)));
            i = j;
            continue;
        }
        if (outside_window(t, first->rank, first->step)) {
            json_t *o = json_object_get(rank_obj, "outside_spans");
            json_object_set_new(rank_obj, "outside_spans",
                                json_integer(json_integer_value(o) + (json_int_t)(j - i)));
            i = j;
            continue;
        }
        step_stat_t *st = &s->stats[s->n_stats++];
        *st = (step_stat_t){.rank = first->rank, .step = first->step};
        json_array_append_new(steps, step_json(t, idx + i, j - i, st));
        stat_add(&total, st);
        json_object_set_new(rank_obj, "total",
                            json_pack("{s:f,s:o,s:o}", "wall_ms", total.t1 / 1e3, "breakdown_ms",
                                      phases_json(&total), "overlap", overlap_json(&total)));
        i = j;
    }
}

static int dbl_cmp(const void *a, const void *b)
{
    return pair_cmp(a, b);
}

/* min/median/max of one phase (or the wall time, phase < 0) over the ranks' step `step`. */
static json_t *spread(const summary_t *s, int64_t step, int phase)
{
    double v[1024];
    size_t n = 0;
    for (size_t i = 0; i < s->n_stats && n < 1024; i++)
        if (s->stats[i].step == step)
            v[n++] = phase < 0 ? s->stats[i].t1 - s->stats[i].t0 : s->stats[i].phase[phase];
    qsort(v, n, sizeof(double), dbl_cmp);
    double med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    return json_pack("{s:f,s:f,s:f}", "min", v[0] / 1e3, "median", med / 1e3, "max",
                     v[n - 1] / 1e3);
}

static json_t *slowest_ranks(const summary_t *s, int64_t step)
{
    step_stat_t *sel[1024];
    size_t n = 0;
    for (size_t i = 0; i < s->n_stats && n < 1024; i++)
        if (s->stats[i].step == step) sel[n++] = &s->stats[i];
    json_t *arr = json_array();
    for (size_t k = 0; k < 3 && k < n; k++) { /* a partial selection sort: the top three */
        size_t best = k;
        for (size_t i = k + 1; i < n; i++)
            if (sel[i]->t1 - sel[i]->t0 > sel[best]->t1 - sel[best]->t0) best = i;
        step_stat_t *tmp = sel[k];
        sel[k] = sel[best];
        sel[best] = tmp;
        json_array_append_new(arr, json_pack("{s:i,s:f}", "rank", sel[k]->rank, "wall_ms",
                                             (sel[k]->t1 - sel[k]->t0) / 1e3));
    }
    return arr;
}

static json_t *across_ranks(const summary_t *s)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < s->n_stats; i++) {
        int64_t step = s->stats[i].step;
        int seen = 0;
        for (size_t k = 0; k < i && !seen; k++)
            seen = s->stats[k].step == step;
        if (seen) continue;
        json_t *ph = json_object();
        json_object_set_new(ph, "wall", spread(s, step, -1));
        for (int p = 0; p < N_PHASES; p++)
            json_object_set_new(ph, phase_names[p], spread(s, step, p));
        json_array_append_new(arr, json_pack("{s:I,s:o,s:o}", "step", (json_int_t)step, "phases_ms",
                                             ph, "slowest_ranks", slowest_ranks(s, step)));
    }
    return arr;
}

static json_t *summary_json(const tr_trace_t *t)
{
    size_t *idx = malloc((t->n_spans + 1) * sizeof(size_t));
    summary_t s = {calloc(t->n_spans + 1, sizeof(step_stat_t)), 0, json_array()};
    for (size_t i = 0; i < t->n_spans; i++)
        idx[i] = i;
    qsort_r(idx, t->n_spans, sizeof(size_t), by_rank_step, (void *)t);
    summarize_groups(t, idx, &s);
    json_t *doc =
        json_pack("{s:i,s:i,s:I,s:o}", "ranks", t->n_ranks, "repaired_files", tr_trace_repaired(t),
                  "spans", (json_int_t)t->n_spans, "per_rank", s.ranks);
    if (t->n_ranks > 1) json_object_set_new(doc, "across_ranks", across_ranks(&s));
    free(idx);
    free(s.stats);
    return doc;
}

int tr_trace_summary_write(const tr_trace_t *t, FILE *out, int json)
{
    json_t *doc = summary_json(t);
    if (!doc) return TR_ENOMEM;
    if (json) {
        json_dumpf(doc, out, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
        fputc('\n', out);
    } else {
        tr__summary_print_text(out, doc);
    }
    json_decref(doc);
    return ferror(out) ? TR_EIO : 0;
}
