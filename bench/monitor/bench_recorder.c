/* bench_recorder: what the trace recorder costs the thread that handles messages.
 *
 * Prints `name: value unit` lines: the cost of one tr_monitor_span call with tracing off
 * (NULL monitor), with only the flight recorder, and with tracing on (buffer not full);
 * the cost of a send (flow start); the writer thread's cost per handled message (its span
 * and flow, formatted and written to the file);
 * and, as the bound the issue sets (under 3% of step time), how many handled messages a
 * 1 ms step can afford at that cost. Usage: bench_recorder [spans per round] [rounds].
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "troupe/monitor.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ns per span over rounds of n spans, flushing between rounds (not timed) so the buffer
 * never fills; the best round, to keep the other engineers' load out of the figure. */
static double time_spans(tr_monitor_t *m, int n, int rounds, int send)
{
    double best = 1e30;
    uint64_t t = now_ns();
    for (int r = 0; r < rounds; r++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < n; i++) {
            tr_span_t s = {"grad_ready", t + (uint64_t)i * 10, t + (uint64_t)i * 10 + 5,
                           (uint64_t)r,  (uint32_t)i & 7,      (uint32_t)i & 15,
                           4096,         (uint64_t)i + 1};
            if (send)
                tr_monitor_send(m, (uint32_t)i & 15, (uint64_t)i + 1, "grad_ready", t + i);
            else
                tr_monitor_span(m, &s);
        }
        double ns = (double)(now_ns() - t0) / n;
        best = ns < best ? ns : best;
        tr_monitor_flush(m);
    }
    return best;
}

static tr_monitor_t *open_monitor(const char *dir, int enabled, int flight);

/* The writer's cost per handled message (a span, its flow's "s" and "f"): n messages are
 * recorded as a run would (send, then the span that handles it), then one flush, timed
 * alone, formats and writes them. */
static double time_writer(const char *dir, int n)
{
    tr_monitor_t *m = open_monitor(dir, 1, 0);
    uint64_t t = now_ns(), flow = 1;
    double best = 1e30;
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < n && i < (1 << 16); i++, flow++) {
            uint64_t ts = t + flow * 1000;
            tr_monitor_send(m, (uint32_t)i & 15, flow, "grad_ready", ts);
            tr_span_t s = {"grad_ready",           ts + 200, ts + 900, 0, 0,
                           ((uint32_t)i + 1) & 15, 4096,     flow};
            tr_monitor_span(m, &s);
        }
        uint64_t t0 = now_ns();
        tr_monitor_flush(m);
        double ns = (double)(now_ns() - t0) / (n < (1 << 16) ? n : (1 << 16));
        best = ns < best ? ns : best;
    }
    tr_monitor_destroy(m);
    return best;
}

static tr_monitor_t *open_monitor(const char *dir, int enabled, int flight)
{
    tr_trace_opts_t o = {.enabled = enabled,
                         .output_path = dir,
                         .flight_recorder = flight,
                         .buffer_events = 1 << 17,
                         .flush_ms = 1000000};
    tr_monitor_t *m = NULL;
    if (tr_monitor_create(&o, &m)) {
        fprintf(stderr, "bench_recorder: cannot create a monitor in %s\n", dir);
        exit(1);
    }
    for (uint32_t l = 0; l < 16; l++)
        tr_monitor_lane_set(m, l, "actor", l % 3 == 0 ? TR_LANE_COMM : TR_LANE_COMPUTE);
    return m;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 100000, rounds = argc > 2 ? atoi(argv[2]) : 10;
    char dir[128];
    snprintf(dir, sizeof(dir), "/tmp/bench_recorder_%d", (int)getpid());
    double off = time_spans(NULL, n, rounds, 0);
    tr_monitor_t *m = open_monitor(dir, 0, 1);
    double flight = time_spans(m, n, rounds, 0);
    tr_monitor_destroy(m);
    m = open_monitor(dir, 1, 1);
    double on = time_spans(m, n, rounds, 0);
    double send = time_spans(m, n, rounds, 1);
    tr_monitor_destroy(m);
    double writer = time_writer(dir, n);
    printf("span_off: %.1f ns\nspan_flight_only: %.1f ns\nspan_on: %.1f ns\nsend_on: %.1f ns\n",
           off, flight, on, send);
    printf("writer_per_message: %.1f ns (background thread: span + flow, formatted and written)\n",
           writer);
    printf("bound_spans_per_ms_step_at_3pct: %.0f spans (span + send per message)\n",
           0.03 * 1e6 / (on + send));
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) ? 1 : 0;
}
