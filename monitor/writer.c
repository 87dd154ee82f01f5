/* writer.c: the thread that drains the recorders' buffers into trace_rank<R>.json.
 *
 * Design. One writer thread per monitor wakes every flush_ms (or when told to stop), takes
 * write_mu, and for every registered thread buffer copies out the events between tail and
 * head, formats them (chrome.c) and advances tail. tr_monitor_flush runs the same drain from
 * the caller's thread under the same mutex, so at most one drainer touches a buffer's tail.
 * Ordering with the recorders is described in recorder.c (head acquire here, tail release).
 *
 * Flows. A send and the span that handles it are recorded on different threads and may be
 * drained in either order, so the writer pairs them in a hash map keyed by flow id: the first
 * half to arrive waits in the map, the second writes both the "s" and the "f" event. Flow
 * halves still unpaired at close are never written (counted as unmatched_flows), so every
 * flow start in the file has its end. A half that waits longer than FLOW_TTL (a message that
 * was never handled: a dead letter, a stop) is pruned once the map is large, so a long run's
 * map stays bounded. Spans and other events are written at once.
 *
 * Pace. The thread sleeps flush_ms between drains, halved (down to 1 ms) while some buffer
 * was more than half full at the last drain and doubled back when all are below an eighth,
 * so a burst is drained before it overflows without waking an idle run often.
 */
#include "monitor/recorder.h"
#include "base/file.h"
#include "troupe/log.h"

#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* --- the flow map: open addressing, linear probing, backward-shift deletion ------------- */

typedef struct flow_half {
    uint64_t flow; /* 0 = empty slot */
    uint64_t ns;
    const char *name;
    uint32_t lane;
    int is_end; /* 1: the handling span arrived first */
} flow_half_t;

struct tr__flowmap {
    flow_half_t *slots;
    size_t cap, count;
};

static size_t flow_hash(uint64_t k, size_t mask)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k & mask;
}

static int flowmap_grow(tr__flowmap_t *fm)
{
    size_t cap = fm->cap ? fm->cap * 2 : 1024;
    flow_half_t *slots = calloc(cap, sizeof(*slots));
    if (!slots) return TR_ENOMEM;
    for (size_t i = 0; i < fm->cap; i++) {
        if (!fm->slots[i].flow) continue;
        size_t j = flow_hash(fm->slots[i].flow, cap - 1);
        while (slots[j].flow)
            j = (j + 1) & (cap - 1);
        slots[j] = fm->slots[i];
    }
    free(fm->slots);
    fm->slots = slots;
    fm->cap = cap;
    return 0;
}

static flow_half_t *flowmap_find(tr__flowmap_t *fm, uint64_t flow)
{
    if (!fm->cap) return NULL;
    for (size_t i = flow_hash(flow, fm->cap - 1);; i = (i + 1) & (fm->cap - 1)) {
        if (fm->slots[i].flow == flow) return &fm->slots[i];
        if (!fm->slots[i].flow) return NULL;
    }
}

static int flowmap_put(tr__flowmap_t *fm, const flow_half_t *h)
{
    if ((fm->count + 1) * 4 > fm->cap * 3 && flowmap_grow(fm)) return TR_ENOMEM;
    size_t i = flow_hash(h->flow, fm->cap - 1);
    while (fm->slots[i].flow && fm->slots[i].flow != h->flow)
        i = (i + 1) & (fm->cap - 1);
    if (!fm->slots[i].flow) fm->count++;
    fm->slots[i] = *h;
    return 0;
}

static void flowmap_remove(tr__flowmap_t *fm, flow_half_t *slot)
{
    size_t mask = fm->cap - 1, i = (size_t)(slot - fm->slots);
    for (size_t j = (i + 1) & mask; fm->slots[j].flow; j = (j + 1) & mask) {
        size_t home = flow_hash(fm->slots[j].flow, mask);
        /* move j back into the hole at i when its home is not in (i, j] */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            fm->slots[i] = fm->slots[j];
            i = j;
        }
    }
    fm->slots[i].flow = 0;
    fm->count--;
}

#define FLOW_TTL_NS   (10ull * 1000000000ull)
#define FLOW_PRUNE_AT 65536

/* Rebuilds the map without halves older than cutoff; returns how many were dropped. */
static size_t flowmap_prune(tr__flowmap_t *fm, uint64_t cutoff)
{
    tr__flowmap_t fresh = {0};
    size_t dropped = 0;
    for (size_t i = 0; i < fm->cap; i++) {
        if (!fm->slots[i].flow) continue;
        if (fm->slots[i].ns < cutoff || flowmap_put(&fresh, &fm->slots[i])) dropped++;
    }
    free(fm->slots);
    *fm = fresh;
    return dropped;
}

/* --- draining ---------------------------------------------------------------------------- */

static void pair_flow(tr_monitor_t *m, tr__outbuf_t *o, const flow_half_t *h)
{
    flow_half_t *other = flowmap_find(m->flows, h->flow);
    if (!other || other->is_end == h->is_end) {
        /* the first half, or a repeated id (the newer half wins) */
        if (flowmap_put(m->flows, h)) m->write_error = TR_ENOMEM;
        m->flows_pending = m->flows->count;
        return;
    }
    const flow_half_t *s = h->is_end ? other : h, *f = h->is_end ? h : other;
    tr__chrome_flow(o, m->opts.rank, m->base_ns, h->flow, s->name, s->lane, s->ns, f->lane, f->ns);
    m->events_written += 2;
    flowmap_remove(m->flows, other);
    m->flows_pending = m->flows->count;
}

static void write_lanes(tr_monitor_t *m, tr__outbuf_t *o)
{
    for (uint32_t i = 0; i < TR_MONITOR_MAX_LANES; i++) {
        tr__lane_t *l = &m->lanes[i];
        /* acquire: pairs with the release store in tr_monitor_lane_set */
        if (l->written || !atomic_load_explicit(&l->set, memory_order_acquire)) continue;
        tr__chrome_lane(o, m->opts.rank, i, l);
        l->written = 1;
    }
}

static tr_lane_kind_t lane_kind(tr_monitor_t *m, uint32_t lane)
{
    if (lane < TR_MONITOR_MAX_LANES &&
        atomic_load_explicit(&m->lanes[lane].set, memory_order_acquire))
        return m->lanes[lane].kind;
    return TR_LANE_CONTROL;
}

static void write_event(tr_monitor_t *m, tr__outbuf_t *o, const tr__event_t *e)
{
    unsigned rank = m->opts.rank;
    if (e->t0 > m->newest_ns) m->newest_ns = e->t0;
    switch (e->type) {
    case TR__EV_SPAN: {
        tr_span_t s = {e->name, e->t0, e->t1, e->step, e->micro_step, e->lane, e->bytes, e->flow};
        tr__chrome_span(o, rank, m->base_ns, &s, lane_kind(m, e->lane));
        m->events_written++;
        /* the arrow ends 1 ns inside the span, so viewers that bind "f" to the slice
         * enclosing it never depend on how they order equal timestamps */
        if (e->flow)
            pair_flow(m, o, &(flow_half_t){e->flow, e->t0 + (e->t1 > e->t0), e->name, e->lane, 1});
        break;
    }
    case TR__EV_SEND:
        pair_flow(m, o, &(flow_half_t){e->flow, e->t0, e->name, e->lane, 0});
        break;
    case TR__EV_COUNTER:
        tr__chrome_counter(o, rank, m->base_ns, e, m->lanes);
        m->events_written++;
        break;
    default:
        tr__chrome_instant(o, rank, m->base_ns, e);
        m->events_written++;
        break;
    }
}

static int out_put(tr_monitor_t *m, tr__outbuf_t *o)
{
    if (o->oom) return TR_ENOMEM;
    if (o->len && fwrite(o->data, 1, o->len, m->file) != o->len) return errno ? -errno : TR_EIO;
    o->len = 0;
    return 0;
}

static int out_write(tr_monitor_t *m, tr__outbuf_t *o)
{
    int err = out_put(m, o);
    if (!err && fflush(m->file)) err = errno ? -errno : TR_EIO;
    return err;
}

/* The text is written in chunks of OUT_CHUNK, so the buffer stays small and warm instead
 * of growing to a whole drain (fresh pages to fault in every time). */
#define OUT_CHUNK (256u << 10)

static void out_spill(tr_monitor_t *m, tr__outbuf_t *o)
{
    if (o->len < OUT_CHUNK) return;
    int err = out_put(m, o);
    if (err && !m->write_error) m->write_error = err;
    o->len = 0;
}

/* Writes out one buffer's events; returns how full it was (0..1). */
static double drain_buffer(tr_monitor_t *m, tr__tbuf_t *b, tr__outbuf_t *o)
{
    uint64_t t = atomic_load_explicit(&b->tail, memory_order_relaxed);
    /* acquire: pairs with the owner's release store of head in slot_publish */
    uint64_t h = atomic_load_explicit(&b->head, memory_order_acquire);
    double fill = (double)(h - t) / (double)(b->mask + 1);
    for (; t != h; t++) {
        const tr__event_t *e = &b->events[t & b->mask];
        if (!e->warmup) write_event(m, o, e);
        out_spill(m, o);
    }
    /* release: pairs with the owner's acquire load of tail; our reads of the slots are done */
    atomic_store_explicit(&b->tail, t, memory_order_release);
    return fill;
}

int tr__writer_drain(tr_monitor_t *m)
{
    if (!m->file) return 0;
    pthread_mutex_lock(&m->write_mu);
    tr__outbuf_t *o = m->out;
    write_lanes(m, o);
    double fill = 0;
    for (tr__tbuf_t *b = atomic_load_explicit(&m->bufs, memory_order_acquire); b; b = b->next)
        if (b->events) fill = fmax(fill, drain_buffer(m, b, o));
    m->fill = fill;
    if (m->flows->count > FLOW_PRUNE_AT && m->newest_ns > FLOW_TTL_NS) {
        m->flows_pruned += flowmap_prune(m->flows, m->newest_ns - FLOW_TTL_NS);
        m->flows_pending = m->flows->count;
    }
    int err = out_write(m, o);
    if (err && !m->write_error) m->write_error = err;
    err = m->write_error;
    pthread_mutex_unlock(&m->write_mu);
    return err;
}

int tr_monitor_flush(tr_monitor_t *m)
{
    return m ? tr__writer_drain(m) : 0;
}

/* --- opening, the thread, closing -------------------------------------------------------- */

/* The trace files this process is writing, by real path: a second monitor (a second engine)
 * aimed at the same file is refused instead of overwriting the first's trace. */
#define MAX_OPEN_TRACES 64
static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static char *open_traces[MAX_OPEN_TRACES];

/* Claims m->path for this monitor (m->claimed gets the canonical name). TR_EBUSY when another
 * monitor of this process writes it. */
static int claim_path(tr_monitor_t *m)
{
    char *dir = realpath(m->output_path, NULL);
    if (!dir) return -errno;
    size_t n = strlen(dir) + 64;
    char *key = malloc(n);
    if (!key) {
        free(dir);
        return TR_ENOMEM;
    }
    snprintf(key, n, "%s/trace_rank%u.json", dir, m->opts.rank);
    free(dir);
    int rc = TR_ENOSPC, free_at = -1;
    pthread_mutex_lock(&open_mu);
    for (int i = 0; i < MAX_OPEN_TRACES; i++) {
        if (open_traces[i] && !strcmp(open_traces[i], key)) {
            free_at = -2;
            break;
        }
        if (!open_traces[i] && free_at == -1) free_at = i;
    }
    if (free_at >= 0) {
        open_traces[free_at] = m->claimed = key;
        rc = 0;
    } else if (free_at == -2) {
        rc = TR_EBUSY;
    }
    pthread_mutex_unlock(&open_mu);
    if (rc < 0) {
        if (rc == TR_EBUSY)
            tr_log(TR_LOG_ERROR,
                   "trace: %s is being written by another engine (monitor) in this "
                   "process; give this one another output_path or rank",
                   key);
        free(key);
    }
    return rc;
}

static void release_path(tr_monitor_t *m)
{
    if (!m->claimed) return;
    pthread_mutex_lock(&open_mu);
    for (int i = 0; i < MAX_OPEN_TRACES; i++)
        if (open_traces[i] == m->claimed) open_traces[i] = NULL;
    pthread_mutex_unlock(&open_mu);
    free(m->claimed);
    m->claimed = NULL;
}

int tr__writer_open(tr_monitor_t *m)
{
    int err = tr__mkdir_p(m->output_path);
    if (err) return err;
    size_t n = strlen(m->output_path) + 64;
    m->path = malloc(n);
    m->flows = calloc(1, sizeof(*m->flows));
    m->out = calloc(1, sizeof(*m->out));
    if (!m->path || !m->flows || !m->out) return TR_ENOMEM;
    snprintf(m->path, n, "%s/trace_rank%u.json", m->output_path, m->opts.rank);
    if ((err = claim_path(m)) < 0) return err;
    m->file = fopen(m->path, "w");
    if (!m->file) return -errno;
    tr__outbuf_t o = {0};
    tr__chrome_header(&o, m->opts.rank, m->base_unix_ns);
    err = out_write(m, &o);
    tr__out_free(&o);
    return err;
}

/* The next sleep: shorter while buffers fill up, back to flush_ms when they do not. */
static uint64_t next_period(tr_monitor_t *m, uint64_t period_ns)
{
    uint64_t max_ns = (uint64_t)m->opts.flush_ms * 1000000u;
    pthread_mutex_lock(&m->write_mu);
    double fill = m->fill;
    pthread_mutex_unlock(&m->write_mu);
    if (fill > 0.5) return period_ns / 2 > 1000000u ? period_ns / 2 : 1000000u;
    if (fill < 0.125) return period_ns * 2 < max_ns ? period_ns * 2 : max_ns;
    return period_ns;
}

static void *writer_main(void *arg)
{
    tr_monitor_t *m = arg;
    uint64_t period_ns = (uint64_t)m->opts.flush_ms * 1000000u;
    pthread_mutex_lock(&m->wake_mu);
    while (!m->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        uint64_t ns = (uint64_t)until.tv_nsec + period_ns;
        until.tv_sec += (time_t)(ns / 1000000000u);
        until.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&m->wake, &m->wake_mu, &until);
        if (m->stopping) break;
        pthread_mutex_unlock(&m->wake_mu);
        tr__writer_drain(m);
        period_ns = next_period(m, period_ns);
        pthread_mutex_lock(&m->wake_mu);
    }
    pthread_mutex_unlock(&m->wake_mu);
    return NULL;
}

int tr__writer_start(tr_monitor_t *m)
{
    int err = pthread_create(&m->thread, NULL, writer_main, m);
    if (err) return -err;
    m->thread_started = 1;
    return 0;
}

void tr__writer_close(tr_monitor_t *m)
{
    if (m->thread_started) {
        pthread_mutex_lock(&m->wake_mu);
        m->stopping = 1;
        pthread_cond_signal(&m->wake);
        pthread_mutex_unlock(&m->wake_mu);
        pthread_join(m->thread, NULL);
        m->thread_started = 0;
    }
    if (m->file) {
        tr__writer_drain(m);
        tr_monitor_stats_t st;
        tr_monitor_stats(m, &st);
        tr__outbuf_t o = {0};
        tr__chrome_footer(&o, m->opts.rank, &st);
        out_write(m, &o);
        tr__out_free(&o);
        fclose(m->file);
        m->file = NULL;
    }
    if (m->out) tr__out_free(m->out);
    free(m->out);
    m->out = NULL;
    if (m->flows) free(m->flows->slots);
    free(m->flows);
    m->flows = NULL;
    free(m->path);
    m->path = NULL;
    release_path(m);
}
