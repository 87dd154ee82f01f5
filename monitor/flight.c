/* flight.c: the flight recorder's dump.
 *
 * Every recording thread keeps its last flight_spans spans in a ring (recorder.c), whether
 * or not a trace is being written. When the runtime dies of an unhandled failure it calls
 * tr_monitor_flight_dump, which writes every ring, oldest span first per thread, as a
 * complete Chrome trace file with the lanes' names, so the last moments before the failure
 * open in Perfetto and in `troupe trace`. Each ring's count is read with acquire (pairs with
 * the release in flight_put); a thread still recording may overwrite the oldest slot while it
 * is copied, so call it after the workers have stopped when possible.
 */
#include "monitor/recorder.h"

#include <errno.h>
#include <stdlib.h>

static void dump_ring(tr_monitor_t *m, const tr__tbuf_t *b, tr__outbuf_t *o, uint64_t *n)
{
    uint64_t next = atomic_load_explicit(&((tr__tbuf_t *)b)->flight_next, memory_order_acquire);
    uint64_t size = b->flight_mask + 1;
    uint64_t first = next > size ? next - size : 0;
    for (uint64_t i = first; i < next; i++) {
        const tr_span_t *s = &b->flight[i & b->flight_mask];
        tr_lane_kind_t kind = TR_LANE_CONTROL;
        if (s->lane < TR_MONITOR_MAX_LANES &&
            atomic_load_explicit(&m->lanes[s->lane].set, memory_order_acquire))
            kind = m->lanes[s->lane].kind;
        tr__chrome_span(o, m->opts.rank, m->base_ns, s, kind);
        (*n)++;
    }
}

int tr_monitor_flight_dump(tr_monitor_t *m, const char *path)
{
    if (!m || !m->opts.flight_recorder) return TR_EINVAL;
    tr__outbuf_t o = {0};
    tr__chrome_header(&o, m->opts.rank, m->base_unix_ns);
    for (uint32_t i = 0; i < TR_MONITOR_MAX_LANES; i++)
        if (atomic_load_explicit(&m->lanes[i].set, memory_order_acquire))
            tr__chrome_lane(&o, m->opts.rank, i, &m->lanes[i]);
    tr_monitor_stats_t st = {0};
    for (tr__tbuf_t *b = atomic_load_explicit(&m->bufs, memory_order_acquire); b; b = b->next)
        if (b->flight) dump_ring(m, b, &o, &st.events_written);
    tr__chrome_footer(&o, m->opts.rank, &st);
    int err = o.oom ? TR_ENOMEM : 0;
    FILE *f = err ? NULL : fopen(path, "w");
    if (!err && !f) err = -errno;
    if (f && fwrite(o.data, 1, o.len, f) != o.len) err = TR_EIO;
    if (f && fclose(f) && !err) err = -errno;
    tr__out_free(&o);
    return err;
}
