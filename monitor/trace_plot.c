/* trace_plot.c: `troupe trace plot`, a timeline as a hand-written SVG.
 *
 * One lane per actor (grouped by rank), spans as rectangles coloured by the actor's kind
 * with a tooltip (message, step, duration); a span nested in another of its lane (a pipeline
 * stage's forward inside the message that ran it) is drawn over it, inset by NEST_INSET pixels
 * a level, and a span holding others is paler, so both read. Message arrows from the sending
 * span to the handling span, dashed lines at step boundaries, a time axis in milliseconds with
 * round tick steps, and a legend. It opens in any browser; no other tool is needed.
 */
#include "monitor/trace_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define LABEL_W    180
#define LANE_H     18
#define LANE_GAP   6
#define TOP        60
#define NEST_INSET 2 /* pixels off the top and the bottom per nesting level */
#define NEST_MAX   3 /* deeper spans are drawn as at this level */

static const char *const kind_colour[TR_LANE_KIND_COUNT_] = {"#4e79a7", "#f28e2b", "#59a14f",
                                                             "#9d9792", "#b07aa1"};

typedef struct plot {
    const tr_trace_t *t;
    FILE *out;
    double t0, t1; /* us */
    int width, plot_w;
    int *row; /* lane index -> row, -1 when the lane has no span */
    int rows;
} plot_t;

static double px(const plot_t *p, double us)
{
    return LABEL_W + (us - p->t0) / (p->t1 - p->t0) * p->plot_w;
}

static double row_y(int row)
{
    return TOP + row * (LANE_H + LANE_GAP);
}

static void xml_text(FILE *out, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '<')
            fputs("&lt;", out);
        else if (*s == '>')
            fputs("&gt;", out);
        else if (*s == '&')
            fputs("&amp;", out);
        else if (*s == '"')
            fputs("&quot;", out);
        else
            fputc(*s, out);
    }
}

/* A tick step of 1, 2 or 5 times a power of ten giving about 10 ticks over span_ms. */
static double tick_step(double span_ms)
{
    double raw = span_ms / 10, p = pow(10, floor(log10(raw)));
    return raw <= p ? p : raw <= 2 * p ? 2 * p : raw <= 5 * p ? 5 * p : 10 * p;
}

#define MAX_TICKS 100 /* about 10 are drawn; the bound holds whatever the window */

/* Ticks every 1, 2 or 5 x 10^k ms from the window's start, labelled relative to it; none
 * when the step is 0, NaN or too small to move along the window (timestamps so large that
 * t0 + step == t0 in double), and never more than MAX_TICKS. */
static void draw_axis(const plot_t *p, int height)
{
    double span_ms = (p->t1 - p->t0) / 1e3, step = tick_step(span_ms);
    fprintf(p->out,
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#333\"/>\n"
            "<text x=\"6\" y=\"%d\" font-size=\"10\">ms from %.3f ms</text>\n",
            LABEL_W, TOP - 8, LABEL_W + p->plot_w, TOP - 8, TOP - 12, p->t0 / 1e3);
    if (!isfinite(step) || !(step > 0) || p->t0 + step * 1e3 == p->t0) return;
    for (int i = 0; i <= MAX_TICKS && i * step <= span_ms * (1 + 1e-9); i++) {
        double rel = i * step, x = px(p, p->t0 + rel * 1e3);
        fprintf(p->out,
                "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>\n"
                "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">%g"
                "</text>\n",
                x, TOP - 8, x, height - 24, x, TOP - 12, rel);
    }
}

static void draw_legend(const plot_t *p)
{
    fprintf(p->out,
            "<text x=\"10\" y=\"18\" font-size=\"14\" font-weight=\"bold\">Troupe "
            "timeline: %d rank(s), %zu spans</text>\n",
            p->t->n_ranks, p->t->n_spans);
    for (int k = 0; k < TR_LANE_KIND_COUNT_; k++)
        fprintf(p->out,
                "<rect x=\"%d\" y=\"26\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                "<text x=\"%d\" y=\"36\" font-size=\"11\">%s</text>\n",
                LABEL_W + k * 90, kind_colour[k], LABEL_W + k * 90 + 16, tr_lane_kind_name(k));
    fprintf(p->out, "<text x=\"%d\" y=\"36\" font-size=\"11\">→ message</text>\n",
            LABEL_W + TR_LANE_KIND_COUNT_ * 90);
}

static void draw_lanes(const plot_t *p)
{
    for (int l = 0; l < p->t->n_lanes; l++) {
        if (p->row[l] < 0) continue;
        const tr__tlane_t *lane = &p->t->lanes[l];
        double y = row_y(p->row[l]);
        fprintf(p->out,
                "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%d\" fill=\"#f7f7f7\"/>\n"
                "<text x=\"6\" y=\"%.1f\" font-size=\"11\">r%d ",
                LABEL_W, y, p->plot_w, LANE_H, y + LANE_H - 5, lane->rank);
        if (lane->name)
            xml_text(p->out, lane->name);
        else
            fprintf(p->out, "tid %lld", (long long)lane->tid);
        fprintf(p->out, "</text>\n");
    }
}

/* A span's colour: its lane's kind; on a compute lane a single backward pass darker and a
 * weight-gradient pass (zb) lighter, so a pipeline's 1F1B pattern and the executor's passes
 * read at a glance. */
static const char *span_colour(const plot_t *p, int lane, const char *title, size_t n)
{
    int kind = p->t->lanes[lane].kind;
    if (n == 1 && kind == TR_LANE_COMPUTE && title) {
        if (!strncmp(title, "BackwardWeight", 14)) return "#a0cbe8";
        if (!strncasecmp(title, "backward", 8)) return "#2b4c6f";
    }
    return kind_colour[kind];
}

/* holds: the span has others nested in it (drawn paler, without its name, under them) */
static void draw_rect(const plot_t *p, int lane, double x0, double x1, const char *title,
                      const tr__tspan_t *s, size_t n, int holds)
{
    double w = x1 - x0 > 3 ? x1 - x0 - 1 : fmax(x1 - x0, 0.5); /* a gap between neighbours */
    int inset = NEST_INSET * (s->depth < NEST_MAX ? s->depth : NEST_MAX);
    fprintf(p->out,
            "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" fill=\"%s\"%s>"
            "<title>",
            x0, row_y(p->row[lane]) + 1 + inset, w, LANE_H - 2 - 2 * inset,
            span_colour(p, lane, title, n), holds ? " fill-opacity=\"0.5\"" : "");
    if (n > 1)
        fprintf(p->out, "%zu messages, %.3f ms</title></rect>\n", n, (s->end - s->ts) / 1e3);
    else {
        xml_text(p->out, title);
        fprintf(p->out, " step %lld/%lld, %.3f ms</title></rect>\n", (long long)s->step,
                (long long)s->micro_step, (s->end - s->ts) / 1e3);
        if (!holds && x1 - x0 >= 7.0 * (double)strlen(title) + 8) { /* the name fits: write it */
            fprintf(p->out, "<text x=\"%.2f\" y=\"%.1f\" font-size=\"10\" fill=\"white\">", x0 + 4,
                    row_y(p->row[lane]) + LANE_H - 6);
            xml_text(p->out, title);
            fputs("</text>\n", p->out);
        }
    }
}

/* Spans in lane order, an outer span before the spans nested in it (drawn over it); a run of
 * spans of one nesting level each under a pixel wide with sub-pixel gaps is drawn as one
 * rectangle ("N messages"), the spans nested in them included but not counted, which keeps a
 * long run's picture small and readable. */
static void draw_spans(const plot_t *p)
{
    const tr__tspan_t *sp = p->t->spans;
    for (size_t i = 0; i < p->t->n_spans;) {
        if (sp[i].end < p->t0 || sp[i].ts > p->t1) {
            i++;
            continue;
        }
        double x0 = px(p, fmax(sp[i].ts, p->t0)), x1 = px(p, fmin(sp[i].end, p->t1));
        double end = sp[i].end;
        size_t j = i + 1, n = 1;
        while (x1 - x0 < 1 && j < p->t->n_spans && sp[j].lane == sp[i].lane &&
               sp[j].depth >= sp[i].depth && sp[j].ts <= p->t1 && px(p, sp[j].ts) - x1 < 0.5 &&
               px(p, fmin(sp[j].end, p->t1)) - px(p, sp[j].ts) < 1) {
            x1 = fmax(x1, px(p, fmin(sp[j].end, p->t1)));
            end = fmax(end, sp[j].end);
            n += sp[j].depth == sp[i].depth;
            j++;
        }
        tr__tspan_t run = sp[i];
        run.end = end;
        int holds = j < p->t->n_spans && sp[j].lane == sp[i].lane && sp[j].depth > sp[i].depth;
        draw_rect(p, sp[i].lane, x0, x1, sp[i].name, n > 1 ? &run : &sp[i], n, holds);
        i = j;
    }
}

static void draw_arrows(const plot_t *p, int max_arrows)
{
    int n = 0;
    for (size_t i = 0; i < p->t->n_spans && n < max_arrows; i++) {
        const tr__tspan_t *s = &p->t->spans[i];
        const tr__tflow_t *f = s->flow ? tr__trace_flow(p->t, s->flow, s->rank) : NULL;
        if (!f || f->lane < 0 || p->row[f->lane] < 0 || f->ts < p->t0 || s->ts > p->t1) continue;
        fprintf(p->out,
                "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#222\" "
                "stroke-width=\"0.7\" marker-end=\"url(#arrow)\"/>\n",
                px(p, f->ts), row_y(p->row[f->lane]) + LANE_H / 2.0, px(p, s->ts),
                row_y(p->row[s->lane]) + LANE_H / 2.0);
        n++;
    }
}

static void draw_steps(const plot_t *p, int height)
{
    for (size_t i = 0; i < p->t->n_marks; i++) {
        const tr__tmark_t *m = &p->t->marks[i];
        if (m->ts < p->t0 || m->ts > p->t1) continue;
        double x = px(p, m->ts);
        fprintf(p->out,
                "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#c00\" "
                "stroke-dasharray=\"4,3\"/>\n<text x=\"%.2f\" y=\"%d\" font-size=\"10\" "
                "fill=\"#c00\">r%d step %lld</text>\n",
                x, TOP - 4, x, height - 24, x + 2, height - 14 + 10 * (m->rank % 2), m->rank,
                (long long)m->step);
    }
}

/* Does some span lie in [t0, t1]? */
static int window_has_span(const plot_t *p)
{
    for (size_t i = 0; i < p->t->n_spans; i++)
        if (p->t->spans[i].end >= p->t0 && p->t->spans[i].ts <= p->t1) return 1;
    return 0;
}

/* The window: every span, or o's [from, to] (to 0: up to the last span). TR_ERANGE when the
 * window given selects no span: the picture would be empty. */
static int time_range(plot_t *p, const tr_plot_opts_t *o)
{
    p->t0 = INFINITY;
    p->t1 = -INFINITY;
    for (size_t i = 0; i < p->t->n_spans; i++) {
        p->t0 = fmin(p->t0, p->t->spans[i].ts);
        p->t1 = fmax(p->t1, p->t->spans[i].end);
    }
    /* a step's marker comes before its first span */
    for (size_t i = 0; i < p->t->n_marks && p->t->n_spans; i++) {
        p->t0 = fmin(p->t0, p->t->marks[i].ts);
        p->t1 = fmax(p->t1, p->t->marks[i].ts);
    }
    if (o && (o->from_us || o->to_us)) {
        p->t0 = o->from_us;
        p->t1 = o->to_us > o->from_us ? o->to_us : p->t1;
        if (!(p->t1 >= p->t0) || !window_has_span(p)) return TR_ERANGE;
    }
    if (!(p->t1 > p->t0) || p->t0 + 1 == p->t0) { /* no spans, one of zero length, huge ts */
        p->t0 = isfinite(p->t0) ? p->t0 : 0;
        p->t1 = p->t0 + fmax(1, fabs(p->t0) * 1e-9); /* a width t0 + it can resolve */
    }
    return 0;
}

int tr_trace_plot_svg(const tr_trace_t *t, FILE *out, const tr_plot_opts_t *o)
{
    plot_t p = {.t = t, .out = out, .width = o && o->width > LABEL_W + 100 ? o->width : 1600};
    p.plot_w = p.width - LABEL_W - 20;
    if (time_range(&p, o)) return TR_ERANGE; /* nothing written */
    p.row = malloc(((size_t)t->n_lanes + 1) * sizeof(int));
    if (!p.row) return TR_ENOMEM;
    for (int l = 0; l < t->n_lanes; l++)
        p.row[l] = t->lane_count[l] ? p.rows++ : -1;
    int height = (int)row_y(p.rows) + 34;
    fprintf(out,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/"
            "2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\">\n"
            "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" "
            "markerWidth=\"6\" markerHeight=\"6\" orient=\"auto\"><path d=\"M0,0 L10,5 "
            "L0,10 z\" fill=\"#222\"/></marker></defs>\n<rect width=\"100%%\" "
            "height=\"100%%\" fill=\"white\"/>\n",
            p.width, height);
    draw_legend(&p);
    draw_lanes(&p);
    draw_axis(&p, height);
    draw_spans(&p);
    draw_steps(&p, height);
    draw_arrows(&p, o && o->max_arrows > 0 ? o->max_arrows : 4000);
    fputs("</svg>\n", out);
    free(p.row);
    return ferror(out) ? TR_EIO : 0;
}
