/* Reading Troupe traces back: what `troupe trace` does, as a library.
 *
 * tr_trace_load reads one trace_rank<R>.json or a directory of them (one per rank), repairs
 * a file cut short by a crash (a partial last line, no closing "]"), and aligns the ranks'
 * clocks on their recorded absolute start times. From a loaded trace:
 *  - tr_trace_summary_write: per step and per actor busy time; the wall-clock breakdown
 *    (compute, exposed communication, exposed I/O, other actors, waiting in a mailbox,
 *    idle); overlap, the fraction of communication and of I/O time that ran while some
 *    compute actor was busy; the step's critical path through the message graph; with
 *    several ranks, min/median/max per phase and the slowest ranks. Text or JSON.
 *  - tr_trace_plot_svg: a timeline picture.
 *  - tr_trace_merge_write: one Chrome trace file holding every rank, clocks aligned.
 * docs/tracing.md describes the outputs.
 */
#ifndef TR_INCLUDE_TROUPE_TRACE_H
#define TR_INCLUDE_TROUPE_TRACE_H

#include <stddef.h>
#include <stdio.h>

#include "troupe/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_trace tr_trace_t;

/* Loads a file or every trace_rank*.json in a directory. On failure returns TR_EFORMAT,
 * TR_ENOENT, TR_ENOMEM or -errno and writes a message naming the file, the line or event,
 * and the field into err (cap bytes). Repairs are reported on stderr-free terms through
 * tr_trace_repaired. Any thread. */
int tr_trace_load(const char *path, tr_trace_t **out, char *err, size_t cap);
void tr_trace_destroy(tr_trace_t *t);

/* How many files needed repair (cut short by a crash). */
int tr_trace_repaired(const tr_trace_t *t);
/* Spans loaded. */
size_t tr_trace_span_count(const tr_trace_t *t);

/* The summary, as text (json = 0) or as one JSON document. -errno on a write error. */
int tr_trace_summary_write(const tr_trace_t *t, FILE *out, int json);

typedef struct tr_plot_opts {
    int width;             /* pixels; 0 = 1600 */
    int max_arrows;        /* message arrows drawn at most; 0 = 4000 */
    double from_us, to_us; /* the time window; both 0 = everything */
} tr_plot_opts_t;

/* An SVG timeline: one lane per actor, spans coloured by kind, message arrows, step
 * boundaries, a time axis and a legend. opts may be NULL. */
int tr_trace_plot_svg(const tr_trace_t *t, FILE *out, const tr_plot_opts_t *opts);

/* Every loaded event in one Chrome trace file, timestamps shifted onto the earliest rank's
 * clock, one event per line. */
int tr_trace_merge_write(const tr_trace_t *t, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
