/* The recorder's private structures, shared by recorder.c (the hot path), writer.c (the
 * thread that drains buffers into the trace file), chrome.c (event formatting) and flight.c
 * (the flight-recorder dump). See recorder.c for the concurrency design.
 */
#ifndef TR_MONITOR_RECORDER_H
#define TR_MONITOR_RECORDER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "troupe/monitor.h"

enum {
    TR__EV_SPAN = 1,
    TR__EV_SEND = 2,
    TR__EV_COUNTER = 3,
    TR__EV_INSTANT = 4,
    TR__EV_STEP = 5,
};

/* One recorded event, 56 bytes. For a counter, value holds the sample. */
typedef struct tr__event {
    uint8_t type;
    uint8_t warmup; /* recorded in a warmup step: drained but not written */
    uint16_t lane;  /* < TR_MONITOR_MAX_LANES; for a counter: lane + 1, 0 = process-wide */
    uint32_t micro_step;
    const char *name;
    uint64_t t0, t1; /* ns; t1 only for spans */
    uint64_t step;
    uint64_t bytes;
    union {
        uint64_t flow;
        double value;
    };
} tr__event_t;

/* A thread's buffers: the trace ring (single producer: the owning thread; single consumer:
 * the writer) and the flight ring (written by the owner only). */
typedef struct tr__tbuf {
    /* written by the owning thread */
    _Atomic uint64_t head; /* events published */
    _Atomic uint64_t dropped;
    _Atomic uint64_t flight_next; /* spans ever put in the flight ring */
    char pad0_[64 - 3 * sizeof(uint64_t)];
    /* written by the writer */
    _Atomic uint64_t tail; /* events consumed */
    char pad1_[64 - sizeof(uint64_t)];
    /* set once at registration */
    struct tr__tbuf *next; /* registration list */
    size_t mask;
    tr__event_t *events;
    size_t flight_mask;
    tr_span_t *flight;
} tr__tbuf_t;

typedef struct tr__lane {
    _Atomic int set; /* 1 once name/kind are valid (release in lane_set) */
    int written;     /* metadata written (writer only) */
    tr_lane_kind_t kind;
    char name[48];
} tr__lane_t;

typedef struct tr__flowmap tr__flowmap_t;

struct tr_monitor {
    tr_trace_opts_t opts;
    char *output_path;
    uint64_t id;                /* distinguishes monitors in the thread-local cache */
    uint64_t base_ns;           /* CLOCK_MONOTONIC at create */
    uint64_t base_unix_ns;      /* CLOCK_REALTIME at create */
    _Atomic int state;          /* 0 off, 1 warmup, 2 active (relaxed: see recorder.c) */
    _Atomic(tr__tbuf_t *) bufs; /* registered thread buffers, newest first */
    tr__lane_t *lanes;          /* TR_MONITOR_MAX_LANES */

    /* the writer's side, under write_mu */
    pthread_mutex_t write_mu;
    FILE *file;
    struct tr__outbuf *out; /* formatted text not yet written, reused across drains */
    char *path;
    char *claimed; /* the canonical trace path this monitor holds (writer.c: claim_path) */
    tr__flowmap_t *flows;
    uint64_t events_written;
    uint64_t flows_pending; /* unpaired flow halves in the map */
    uint64_t flows_pruned;  /* halves dropped from the map unpaired after FLOW_TTL */
    uint64_t newest_ns;     /* the latest event time drained */
    double fill;            /* the fullest buffer's fill at the last drain, 0..1 */
    int write_error;

    /* the writer thread */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t wake_mu;
    pthread_cond_t wake;
    int stopping;
};

/* --- chrome.c: one Chrome trace event per line ------------------------------------------ */

typedef struct tr__outbuf tr__outbuf_t;
struct tr__outbuf {
    char *data;
    size_t len, cap;
    int oom;
};

void tr__out_free(tr__outbuf_t *o);
void tr__out_str(tr__outbuf_t *o, const char *s);
void tr__out_json_str(tr__outbuf_t *o, const char *s); /* quoted and escaped */
void tr__out_u64(tr__outbuf_t *o, uint64_t v);
void tr__out_us(tr__outbuf_t *o, uint64_t ns); /* ns as microseconds, 3 decimals */
void tr__out_double(tr__outbuf_t *o, double v);

/* Each appends one event followed by ",\n". */
void tr__chrome_header(tr__outbuf_t *o, unsigned rank, uint64_t base_unix_ns);
void tr__chrome_lane(tr__outbuf_t *o, unsigned rank, uint32_t lane, const tr__lane_t *l);
void tr__chrome_span(tr__outbuf_t *o, unsigned rank, uint64_t base_ns, const tr_span_t *s,
                     tr_lane_kind_t kind);
void tr__chrome_flow(tr__outbuf_t *o, unsigned rank, uint64_t base_ns, uint64_t flow,
                     const char *name, uint32_t from_lane, uint64_t send_ns, uint32_t to_lane,
                     uint64_t recv_ns);
void tr__chrome_counter(tr__outbuf_t *o, unsigned rank, uint64_t base_ns, const tr__event_t *e,
                        const tr__lane_t *lanes);
void tr__chrome_instant(tr__outbuf_t *o, unsigned rank, uint64_t base_ns, const tr__event_t *e);
/* The last line: a metadata event without a trailing comma, then "]\n". */
void tr__chrome_footer(tr__outbuf_t *o, unsigned rank, const tr_monitor_stats_t *st);

/* --- writer.c ---------------------------------------------------------------------------- */

int tr__writer_open(tr_monitor_t *m);
/* Drains every buffer into the file. Takes write_mu. */
int tr__writer_drain(tr_monitor_t *m);
int tr__writer_start(tr_monitor_t *m);
/* Stops the thread, drains, writes the footer and closes. */
void tr__writer_close(tr_monitor_t *m);

#endif
