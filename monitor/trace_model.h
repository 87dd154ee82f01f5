/* The in-memory form of a loaded trace (trace_load.c), read by the summary, the plot and
 * the merge. Times are microseconds on the common clock (ranks aligned). Strings point into
 * the parsed JSON documents, which live as long as the trace.
 */
#ifndef TR_MONITOR_TRACE_MODEL_H
#define TR_MONITOR_TRACE_MODEL_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "troupe/monitor.h"
#include "troupe/trace.h"

/* The step of a span outside any training step: one with no "step" argument, or the runtime's
 * lifecycle traffic (kill, stop, exit), whatever step its header carried. The summary leaves
 * such spans out of every step and counts them (per_rank[].nonstep_spans). */
#define TR__STEP_NONE (-1)

typedef struct tr__tspan {
    int rank;
    int lane; /* index into tr_trace.lanes */
    const char *name;
    double ts, end;           /* us */
    int64_t step, micro_step; /* step: TR__STEP_NONE outside any training step */
    uint64_t bytes;
    uint64_t flow; /* the flow id of the message handled; 0 none */
    /* Nesting on the lane (build_index): a span lying wholly inside an earlier one of its lane
     * (a stage's forward inside the span of the message that ran it) has depth > 0 and outer
     * the index of the outermost span holding it; a top-level span has depth 0 and outer its
     * own index. Time on a lane is its top-level spans' time. */
    int depth;
    long outer;
} tr__tspan_t;

typedef struct tr__tlane {
    int rank;
    int64_t tid;
    const char *name;
    int kind; /* tr_lane_kind_t */
} tr__tlane_t;

typedef struct tr__tflow {
    uint64_t id;
    int rank;
    int lane;  /* sending lane (index) */
    double ts; /* send time */
} tr__tflow_t;

typedef struct tr__tmark {
    int rank;
    int64_t step;
    double ts;
} tr__tmark_t;

typedef struct tr__tfile {
    char *path;
    json_t *events;   /* the array */
    double offset_us; /* added to this file's timestamps */
    uint64_t base_unix_ns;
    int repaired;
} tr__tfile_t;

struct tr_trace {
    tr__tfile_t *files;
    int n_files;
    tr__tspan_t *spans; /* sorted by (lane, ts, longest first): an outer span before its inner */
    size_t n_spans;
    tr__tlane_t *lanes;
    int n_lanes;
    tr__tflow_t *flows; /* sorted by id */
    size_t n_flows;
    tr__tmark_t *marks; /* step markers */
    size_t n_marks;
    int ranks[1024];
    int n_ranks;
    uint64_t base_unix_ns; /* the earliest rank's start */
    /* per lane: the range of its spans in `spans` */
    size_t *lane_first, *lane_count;
};

/* The top-level span on lane `lane` whose [ts, end] holds t; -1 if none. */
long tr__trace_span_at(const tr_trace_t *t, int lane, double t_us);
/* The flow with this id, preferring one sent on `rank` when ranks reuse ids; NULL if
 * none. */
const tr__tflow_t *tr__trace_flow(const tr_trace_t *t, uint64_t id, int rank);
/* Reads and, when cut short, repairs one file into a JSON array. */
int tr__trace_read_file(const char *path, json_t **events, int *repaired, char *err, size_t cap);

/* Prints the summary document (trace_summary.c) as text (trace_text.c). */
void tr__summary_print_text(FILE *out, json_t *doc);

#endif
