/* A checker for Chrome trace-event files, shared by the monitor's tests: it parses a file
 * with jansson and asserts the format (event fields by phase, every flow start has one end,
 * both inside a span of their lane so viewers bind the arrow, spans on one lane never
 * overlap). */
#ifndef TR_TESTS_MONITOR_TRACE_CHECK_H
#define TR_TESTS_MONITOR_TRACE_CHECK_H

#include <jansson.h>

typedef struct trace_counts {
    int spans, flow_starts, flow_ends, counters, instants, metadata, lanes_named;
} trace_counts_t;

/* Loads path (which must be complete, valid JSON) and checks it; fails the current cmocka
 * test on any violation. Returns the parsed array (caller json_decref's) and the counts. */
json_t *trace_check_file(const char *path, trace_counts_t *counts);

#endif
