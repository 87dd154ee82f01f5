/* recorder.c: the trace recorder's hot path, its lanes and its step window.
 *
 * Design. Every recording thread owns one tr__tbuf_t, found through a thread-local pointer
 * and registered on the thread's first event (one calloc and a lock-free push on the
 * monitor's list: the only allocation, once per thread, never again). The trace ring inside
 * is single-producer (the owner) single-consumer (the writer, writer.c):
 *  - head: written by the owner only. The owner fills slot head & mask, then stores head + 1
 *    with release; the writer loads head with acquire, so the slot's contents are visible
 *    before it reads them.
 *  - tail: written by the writer only, with release after it has copied the slots out; the
 *    owner loads it with acquire before reusing a slot, so it never overwrites one the
 *    writer is still reading. When head - tail == capacity the event is dropped and counted
 *    (dropped: owner-written, relaxed, read by the writer for the stats only).
 * The monitor's state (0 off, 1 warmup, 2 active) is set by tr_monitor_step and read with
 * relaxed loads: an event recorded just across a step boundary may be classed with the
 * neighbouring step, which the window tolerates; no other data depends on it. A span of an
 * active step recorded after the window closed is still written (tr_monitor_span).
 * The list head `bufs` is pushed with a release CAS (pairs with the acquire load of the
 * writer and of the flight dump, which then see the buffer's fields initialised).
 * Lanes: tr_monitor_lane_set fills a lane, then sets `set` with release; the writer reads
 * `set` with acquire before it reads the name.
 * The flight ring is a second, smaller ring written only by its owner; the dump reads it
 * when the owner is quiescent (see troupe/monitor.h).
 */
#include "monitor/recorder.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Atomic uint64_t next_monitor_id = 1;
/* This thread's buffers for the last few monitors it recorded to; slot 0 is the current
 * one. Monitor ids are never reused, so a stale entry of a destroyed monitor never matches. */
#define TLS_SLOTS 4
static _Thread_local tr__tbuf_t *tls_buf[TLS_SLOTS];
static _Thread_local uint64_t tls_monitor_id[TLS_SLOTS];

static const char *const kind_names[TR_LANE_KIND_COUNT_] = {"compute", "comm", "io", "control",
                                                            "data"};

const char *tr_lane_kind_name(tr_lane_kind_t kind)
{
    return (unsigned)kind < TR_LANE_KIND_COUNT_ ? kind_names[kind] : NULL;
}

int tr_lane_kind_parse(const char *s)
{
    for (int k = 0; k < TR_LANE_KIND_COUNT_; k++)
        if (s && !strcmp(s, kind_names[k])) return k;
    return -1;
}

static uint64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static size_t pow2_at_least(size_t n)
{
    size_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

/* --- the window ------------------------------------------------------------------------- */

/* 0 off, 1 warmup, 2 active for step, by PyTorch's schedule. */
static int window_state(const tr_trace_steps_t *w, uint64_t step)
{
    uint64_t cycle = (uint64_t)w->wait + w->warmup + w->active;
    if (cycle == 0) return 2;
    if (w->repeat && step >= cycle * w->repeat) return 0;
    uint64_t pos = step % cycle;
    if (pos < w->wait) return 0;
    return pos < (uint64_t)w->wait + w->warmup ? 1 : 2;
}

int tr_monitor_recording(const tr_monitor_t *m)
{
    return m && atomic_load_explicit(&m->state, memory_order_relaxed) != 0;
}

/* --- thread buffers --------------------------------------------------------------------- */

static tr__tbuf_t *tbuf_new(tr_monitor_t *m)
{
    /* 64-byte aligned, so the owner's and the writer's field groups sit on their own lines */
    size_t size = (sizeof(tr__tbuf_t) + 63) & ~(size_t)63;
    tr__tbuf_t *b = aligned_alloc(64, size);
    if (!b) return NULL;
    memset(b, 0, size);
    if (m->opts.enabled) {
        b->mask = m->opts.buffer_events - 1;
        b->events = malloc(m->opts.buffer_events * sizeof(tr__event_t));
    }
    if (m->opts.flight_recorder) {
        b->flight_mask = m->opts.flight_spans - 1;
        b->flight = calloc(m->opts.flight_spans, sizeof(tr_span_t));
    }
    if ((m->opts.enabled && !b->events) || (m->opts.flight_recorder && !b->flight)) {
        free(b->events);
        free(b->flight);
        free(b);
        return NULL;
    }
    tr__tbuf_t *old = atomic_load_explicit(&m->bufs, memory_order_relaxed);
    do
        b->next = old;
    /* release: pairs with the acquire loads of bufs in writer.c and flight.c */
    while (!atomic_compare_exchange_weak_explicit(&m->bufs, &old, b, memory_order_release,
                                                  memory_order_relaxed));
    return b;
}

/* Finds or registers this thread's buffer for m and moves it to slot 0. */
static tr__tbuf_t *tbuf_lookup(tr_monitor_t *m)
{
    int i = 1;
    while (i < TLS_SLOTS && tls_monitor_id[i] != m->id)
        i++;
    tr__tbuf_t *b = i < TLS_SLOTS ? tls_buf[i] : tbuf_new(m);
    if (!b) return NULL;
    if (i == TLS_SLOTS) i = TLS_SLOTS - 1; /* the least recently used slot gives way */
    for (; i > 0; i--) {
        tls_buf[i] = tls_buf[i - 1];
        tls_monitor_id[i] = tls_monitor_id[i - 1];
    }
    tls_buf[0] = b;
    tls_monitor_id[0] = m->id;
    return b;
}

/* This thread's buffer for m; NULL when it cannot be allocated (the event is lost). */
static inline tr__tbuf_t *tbuf_get(tr_monitor_t *m)
{
    if (__builtin_expect(tls_monitor_id[0] == m->id, 1)) return tls_buf[0];
    return tbuf_lookup(m);
}

/* Counts a lost event (owner-written, relaxed: read for the stats only). */
static void count_drop(tr__tbuf_t *b)
{
    atomic_store_explicit(&b->dropped, atomic_load_explicit(&b->dropped, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

/* The slot for the next event, or NULL (buffer full: counted as dropped). */
static inline tr__event_t *slot_claim(tr__tbuf_t *b, uint64_t *head)
{
    uint64_t h = atomic_load_explicit(&b->head, memory_order_relaxed);
    /* acquire: pairs with the writer's release store of tail after it copied the slots */
    uint64_t t = atomic_load_explicit(&b->tail, memory_order_acquire);
    if (h - t > b->mask) {
        count_drop(b);
        return NULL;
    }
    *head = h;
    return &b->events[h & b->mask];
}

static inline void slot_publish(tr__tbuf_t *b, uint64_t head)
{
    /* release: pairs with the writer's acquire load of head */
    atomic_store_explicit(&b->head, head + 1, memory_order_release);
}

/* Claims a slot when state (0 off, 1 warmup, 2 active) records; fills the common fields. A
 * lane out of range (a bug in the caller) is counted as a drop rather than written under a
 * wrong lane. */
static inline tr__event_t *event_begin_in(tr_monitor_t *m, tr__tbuf_t *b, int type, uint32_t lane,
                                          int state, uint64_t *h)
{
    if (!state || !b->events) return NULL;
    if (lane > TR_MONITOR_MAX_LANES) {
        count_drop(b);
        return NULL;
    }
    tr__event_t *e = slot_claim(b, h);
    if (e) {
        e->type = (uint8_t)type;
        e->warmup = state == 1;
        e->lane = (uint16_t)lane;
    }
    return e;
}

/* The same in the monitor's current state. */
static inline tr__event_t *event_begin(tr_monitor_t *m, tr__tbuf_t *b, int type, uint32_t lane,
                                       uint64_t *h)
{
    return event_begin_in(m, b, type, lane, atomic_load_explicit(&m->state, memory_order_relaxed),
                          h);
}

/* --- lifetime ---------------------------------------------------------------------------- */

static int opts_check(tr_trace_opts_t *o)
{
    if (o->enabled && (!o->output_path || !*o->output_path)) return TR_EINVAL;
    if (o->steps.repeat && !(o->steps.wait + o->steps.warmup + o->steps.active)) return TR_EINVAL;
    if (o->steps.wait + o->steps.warmup && !o->steps.active)
        return TR_EINVAL; /* a cycle that never writes anything */
    o->buffer_events = pow2_at_least(o->buffer_events ? o->buffer_events : 65536);
    o->flight_spans = pow2_at_least(o->flight_spans ? o->flight_spans : 256);
    if (!o->flush_ms) o->flush_ms = 100;
    return 0;
}

int tr_monitor_create(const tr_trace_opts_t *opts, tr_monitor_t **out)
{
    *out = NULL;
    tr_monitor_t *m = calloc(1, sizeof(*m));
    if (!m) return TR_ENOMEM;
    m->opts = *opts;
    int err = opts_check(&m->opts);
    if (err) {
        free(m);
        return err;
    }
    m->id = atomic_fetch_add_explicit(&next_monitor_id, 1, memory_order_relaxed);
    m->base_ns = clock_ns(CLOCK_MONOTONIC);
    m->base_unix_ns = clock_ns(CLOCK_REALTIME);
    m->lanes = calloc(TR_MONITOR_MAX_LANES, sizeof(tr__lane_t));
    m->output_path = opts->output_path ? strdup(opts->output_path) : NULL;
    pthread_mutex_init(&m->write_mu, NULL);
    pthread_mutex_init(&m->wake_mu, NULL);
    pthread_cond_init(&m->wake, NULL);
    m->opts.output_path = m->output_path;
    if (!m->lanes || (opts->output_path && !m->output_path)) err = TR_ENOMEM;
    if (!err && m->opts.enabled) {
        atomic_store_explicit(&m->state, window_state(&m->opts.steps, 0), memory_order_relaxed);
        err = tr__writer_open(m);
        if (!err) err = tr__writer_start(m);
    }
    if (err) {
        tr_monitor_destroy(m);
        return err;
    }
    *out = m;
    return 0;
}

void tr_monitor_destroy(tr_monitor_t *m)
{
    if (!m) return;
    tr__writer_close(m);
    tr__tbuf_t *b = atomic_load_explicit(&m->bufs, memory_order_acquire);
    while (b) {
        tr__tbuf_t *next = b->next;
        free(b->events);
        free(b->flight);
        free(b);
        b = next;
    }
    for (int i = 0; i < TLS_SLOTS; i++)
        if (tls_monitor_id[i] == m->id) {
            tls_buf[i] = NULL;
            tls_monitor_id[i] = 0;
        }
    pthread_mutex_destroy(&m->write_mu);
    pthread_mutex_destroy(&m->wake_mu);
    pthread_cond_destroy(&m->wake);
    free(m->lanes);
    free(m->output_path);
    free(m);
}

int tr_monitor_lane_set(tr_monitor_t *m, uint32_t lane, const char *name, tr_lane_kind_t kind)
{
    if (!m) return 0;
    if (lane >= TR_MONITOR_MAX_LANES || (unsigned)kind >= TR_LANE_KIND_COUNT_ || !name)
        return TR_EINVAL;
    tr__lane_t *l = &m->lanes[lane];
    if (atomic_load_explicit(&l->set, memory_order_acquire))
        return 0; /* named once; a later rename would race with the writer */
    snprintf(l->name, sizeof(l->name), "%s", name);
    l->kind = kind;
    /* release: pairs with the writer's acquire load of set before it reads name and kind */
    atomic_store_explicit(&l->set, 1, memory_order_release);
    return 0;
}

/* --- the hot path ------------------------------------------------------------------------ */

void tr_monitor_step(tr_monitor_t *m, uint64_t step, uint64_t now_ns)
{
    if (!m || !m->opts.enabled) return;
    atomic_store_explicit(&m->state, window_state(&m->opts.steps, step), memory_order_relaxed);
    tr__tbuf_t *b = tbuf_get(m);
    uint64_t h;
    tr__event_t *e = b ? event_begin(m, b, TR__EV_STEP, 0, &h) : NULL;
    if (!e) return;
    e->name = "step";
    e->t0 = now_ns;
    e->step = step;
    slot_publish(b, h);
}

static inline void flight_put(tr__tbuf_t *b, const tr_span_t *s)
{
    uint64_t n = atomic_load_explicit(&b->flight_next, memory_order_relaxed);
    b->flight[n & b->flight_mask] = *s;
    /* release: a dump that sees n + 1 (acquire) sees the span written */
    atomic_store_explicit(&b->flight_next, n + 1, memory_order_release);
}

void tr_monitor_span(tr_monitor_t *m, const tr_span_t *s)
{
    if (!m) return;
    tr__tbuf_t *b = tbuf_get(m);
    if (!b) return;
    if (b->flight) flight_put(b, s);
    uint64_t h;
    /* The current state decides, except that a span of an active step that ends after the
     * window closed (the last step's final message, handled while the caller has already
     * moved on) is still written with its step. */
    int state = atomic_load_explicit(&m->state, memory_order_relaxed);
    if (!state && window_state(&m->opts.steps, s->step) == 2) state = 2;
    /* a span's lane must be < TR_MONITOR_MAX_LANES (a counter's lane + 1 may equal it) */
    tr__event_t *e = event_begin_in(m, b, TR__EV_SPAN,
                                    s->lane < TR_MONITOR_MAX_LANES ? s->lane : ~0u, state, &h);
    if (!e) return;
    e->name = s->name;
    e->t0 = s->begin_ns;
    e->t1 = s->end_ns;
    e->step = s->step;
    e->micro_step = s->micro_step;
    e->bytes = s->bytes;
    e->flow = s->flow;
    slot_publish(b, h);
}

/* The shared body of send, counter and instant: one event with a time, a lane and a name. */
static inline tr__event_t *point_begin(tr_monitor_t *m, tr__tbuf_t **bp, int type, uint32_t lane,
                                       const char *name, uint64_t ns, uint64_t *h)
{
    if (!m || !m->opts.enabled) return NULL;
    tr__tbuf_t *b = tbuf_get(m);
    if (type != TR__EV_COUNTER && lane >= TR_MONITOR_MAX_LANES) lane = ~0u; /* counted as a drop */
    tr__event_t *e = b ? event_begin(m, b, type, lane, h) : NULL;
    if (e) {
        e->name = name;
        e->t0 = ns;
    }
    *bp = b;
    return e;
}

void tr_monitor_send(tr_monitor_t *m, uint32_t lane, uint64_t flow, const char *name,
                     uint64_t now_ns)
{
    tr__tbuf_t *b;
    uint64_t h;
    tr__event_t *e = point_begin(m, &b, TR__EV_SEND, lane, name, now_ns, &h);
    if (e) {
        e->flow = flow;
        slot_publish(b, h);
    }
}

void tr_monitor_counter(tr_monitor_t *m, int lane, const char *name, double value, uint64_t now_ns)
{
    tr__tbuf_t *b;
    uint64_t h;
    uint32_t l = lane < 0 ? 0 : lane < TR_MONITOR_MAX_LANES ? (uint32_t)lane + 1 : ~0u;
    tr__event_t *e = point_begin(m, &b, TR__EV_COUNTER, l, name, now_ns, &h);
    if (e) {
        e->value = value;
        slot_publish(b, h);
    }
}

void tr_monitor_instant(tr_monitor_t *m, uint32_t lane, const char *name, uint64_t now_ns)
{
    tr__tbuf_t *b;
    uint64_t h;
    tr__event_t *e = point_begin(m, &b, TR__EV_INSTANT, lane, name, now_ns, &h);
    if (e) slot_publish(b, h);
}

void tr_monitor_stats(tr_monitor_t *m, tr_monitor_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    if (!m) return;
    for (tr__tbuf_t *b = atomic_load_explicit(&m->bufs, memory_order_acquire); b; b = b->next) {
        out->dropped += atomic_load_explicit(&b->dropped, memory_order_relaxed);
        out->threads++;
    }
    pthread_mutex_lock(&m->write_mu);
    out->events_written = m->events_written;
    out->unmatched_flows = m->flows_pending + m->flows_pruned;
    pthread_mutex_unlock(&m->write_mu);
}
