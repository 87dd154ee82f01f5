/* chrome.c: Chrome trace-event JSON, one event per line, written by hand.
 *
 * The file is the JSON Array Format: "[" on the first line, then one event per line, each
 * followed by ",", and a last metadata event followed by "]". A run that dies leaves a file
 * whose only defect is a missing "]" and perhaps a partial last line, which chrome://tracing
 * accepts as is and `troupe trace` repairs. pid is the rank, tid the lane (actor); "ts" and
 * "dur" are microseconds from the run's start with nanosecond precision; the absolute start
 * is in the "troupe_clock" metadata event. Formatting is done with a growable buffer and
 * hand-written integer printing, because printf is the writer thread's main cost.
 */
#include "monitor/recorder.h"

#include <stdlib.h>
#include <string.h>

/* --- the output buffer ------------------------------------------------------------------- */

static int reserve(tr__outbuf_t *o, size_t more)
{
    if (o->oom) return -1;
    if (o->len + more <= o->cap) return 0;
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more)
        cap *= 2;
    char *p = realloc(o->data, cap);
    if (!p) {
        o->oom = 1;
        return -1;
    }
    o->data = p;
    o->cap = cap;
    return 0;
}

void tr__out_free(tr__outbuf_t *o)
{
    free(o->data);
    memset(o, 0, sizeof(*o));
}

static inline void out_mem(tr__outbuf_t *o, const char *s, size_t n)
{
    if (__builtin_expect(o->len + n > o->cap, 0) && reserve(o, n)) return;
    memcpy(o->data + o->len, s, n);
    o->len += n;
}

/* A string literal: its length is known at compile time, so the copy is inlined. */
#define OUT_LIT(o, lit) out_mem((o), (lit), sizeof(lit) - 1)

void tr__out_str(tr__outbuf_t *o, const char *s)
{
    out_mem(o, s, strlen(s));
}

void tr__out_json_str(tr__outbuf_t *o, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    if (!s) s = "";
    out_mem(o, "\"", 1);
    size_t plain = 0; /* the common case: nothing to escape, one copy */
    while (s[plain] && s[plain] != '"' && s[plain] != '\\' && (unsigned char)s[plain] >= 0x20)
        plain++;
    out_mem(o, s, plain);
    for (s += plain; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            out_mem(o, esc, 2);
        } else if (c < 0x20) {
            char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            out_mem(o, esc, 6);
        } else {
            out_mem(o, (const char *)&c, 1);
        }
    }
    out_mem(o, "\"", 1);
}

void tr__out_u64(tr__outbuf_t *o, uint64_t v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[sizeof(tmp) - 1 - n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    out_mem(o, tmp + sizeof(tmp) - n, (size_t)n);
}

void tr__out_us(tr__outbuf_t *o, uint64_t ns)
{
    tr__out_u64(o, ns / 1000);
    unsigned frac = (unsigned)(ns % 1000);
    char tmp[4] = {'.', (char)('0' + frac / 100), (char)('0' + frac / 10 % 10),
                   (char)('0' + frac % 10)};
    out_mem(o, tmp, 4);
}

void tr__out_double(tr__outbuf_t *o, double v)
{
    if (v == v && v >= 0 && v < 9007199254740992.0 && v == (double)(uint64_t)v) {
        tr__out_u64(o, (uint64_t)v);
        return;
    }
    if (v != v || v > 1.7976931348623157e308 || v < -1.7976931348623157e308) {
        OUT_LIT(o, "null"); /* JSON has no NaN or infinity */
        return;
    }
    char tmp[32];
    snprintf(tmp, sizeof(tmp), "%.17g", v);
    tr__out_str(o, tmp);
}

/* --- events ------------------------------------------------------------------------------ */

static uint64_t rel(uint64_t ns, uint64_t base)
{
    return ns > base ? ns - base : 0;
}

/* {"ph":"<ph>","pid":R,"tid":T, — the common head of every event. */
static void head(tr__outbuf_t *o, const char *ph, unsigned rank, uint32_t tid)
{
    OUT_LIT(o, "{\"ph\":\"");
    tr__out_str(o, ph);
    OUT_LIT(o, "\",\"pid\":");
    tr__out_u64(o, rank);
    OUT_LIT(o, ",\"tid\":");
    tr__out_u64(o, tid);
}

static void flow_id(tr__outbuf_t *o, uint64_t flow)
{
    static const char hex[] = "0123456789abcdef";
    char tmp[24];
    int n = sizeof(tmp);
    tmp[--n] = '"';
    do {
        tmp[--n] = hex[flow & 15];
        flow >>= 4;
    } while (flow);
    tmp[--n] = 'x';
    tmp[--n] = '0';
    tmp[--n] = '"';
    out_mem(o, tmp + n, sizeof(tmp) - (size_t)n);
}

void tr__chrome_header(tr__outbuf_t *o, unsigned rank, uint64_t base_unix_ns)
{
    OUT_LIT(o, "[\n");
    head(o, "M", rank, 0);
    OUT_LIT(o, ",\"name\":\"process_name\",\"args\":{\"name\":\"rank ");
    tr__out_u64(o, rank);
    OUT_LIT(o, "\"}},\n");
    head(o, "M", rank, 0);
    OUT_LIT(o, ",\"name\":\"process_sort_index\",\"args\":{\"sort_index\":");
    tr__out_u64(o, rank);
    OUT_LIT(o, "}},\n");
    head(o, "M", rank, 0);
    OUT_LIT(o, ",\"name\":\"troupe_clock\",\"args\":{\"base_unix_ns\":");
    tr__out_u64(o, base_unix_ns);
    OUT_LIT(o, ",\"rank\":");
    tr__out_u64(o, rank);
    OUT_LIT(o, ",\"ts_unit\":\"us\",\"version\":1}},\n");
}

void tr__chrome_lane(tr__outbuf_t *o, unsigned rank, uint32_t lane, const tr__lane_t *l)
{
    head(o, "M", rank, lane);
    OUT_LIT(o, ",\"name\":\"thread_name\",\"args\":{\"name\":");
    tr__out_json_str(o, l->name);
    OUT_LIT(o, ",\"kind\":\"");
    tr__out_str(o, tr_lane_kind_name(l->kind));
    OUT_LIT(o, "\"}},\n");
    head(o, "M", rank, lane);
    OUT_LIT(o, ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":");
    tr__out_u64(o, lane);
    OUT_LIT(o, "}},\n");
}

void tr__chrome_span(tr__outbuf_t *o, unsigned rank, uint64_t base_ns, const tr_span_t *s,
                     tr_lane_kind_t kind)
{
    uint64_t t0 = rel(s->begin_ns, base_ns), t1 = rel(s->end_ns, base_ns);
    head(o, "X", rank, s->lane);
    OUT_LIT(o, ",\"name\":");
    tr__out_json_str(o, s->name);
    OUT_LIT(o, ",\"cat\":\"");
    tr__out_str(o, tr_lane_kind_name(kind));
    OUT_LIT(o, "\",\"ts\":");
    tr__out_us(o, t0);
    OUT_LIT(o, ",\"dur\":");
    tr__out_us(o, t1 > t0 ? t1 - t0 : 0);
    OUT_LIT(o, ",\"args\":{\"step\":");
    tr__out_u64(o, s->step);
    OUT_LIT(o, ",\"micro_step\":");
    tr__out_u64(o, s->micro_step);
    OUT_LIT(o, ",\"bytes\":");
    tr__out_u64(o, s->bytes);
    if (s->flow) {
        OUT_LIT(o, ",\"flow\":");
        flow_id(o, s->flow);
    }
    OUT_LIT(o, "}},\n");
}

static void flow_half(tr__outbuf_t *o, const char *ph, unsigned rank, uint64_t ts_rel,
                      uint64_t flow, const char *name, uint32_t lane)
{
    head(o, ph, rank, lane);
    if (ph[0] == 'f') OUT_LIT(o, ",\"bp\":\"e\"");
    OUT_LIT(o, ",\"name\":");
    tr__out_json_str(o, name);
    OUT_LIT(o, ",\"cat\":\"msg\",\"id\":");
    flow_id(o, flow);
    OUT_LIT(o, ",\"ts\":");
    tr__out_us(o, ts_rel);
    OUT_LIT(o, "},\n");
}

void tr__chrome_flow(tr__outbuf_t *o, unsigned rank, uint64_t base_ns, uint64_t flow,
                     const char *name, uint32_t from_lane, uint64_t send_ns, uint32_t to_lane,
                     uint64_t recv_ns)
{
    flow_half(o, "s", rank, rel(send_ns, base_ns), flow, name, from_lane);
    flow_half(o, "f", rank, rel(recv_ns, base_ns), flow, name, to_lane);
}

void tr__chrome_counter(tr__outbuf_t *o, unsigned rank, uint64_t base_ns, const tr__event_t *e,
                        const tr__lane_t *lanes)
{
    head(o, "C", rank, e->lane ? e->lane - 1 : 0);
    OUT_LIT(o, ",\"name\":");
    char name[128]; /* the counter's name with the lane's appended, escaped as one string */
    const tr__lane_t *l =
        e->lane && e->lane - 1 < TR_MONITOR_MAX_LANES ? &lanes[e->lane - 1] : NULL;
    if (l && atomic_load_explicit(&l->set, memory_order_acquire))
        snprintf(name, sizeof(name), "%s %s", e->name, l->name);
    else if (e->lane)
        snprintf(name, sizeof(name), "%s %u", e->name, e->lane - 1);
    else
        snprintf(name, sizeof(name), "%s", e->name);
    tr__out_json_str(o, name);
    OUT_LIT(o, ",\"ts\":");
    tr__out_us(o, rel(e->t0, base_ns));
    OUT_LIT(o, ",\"args\":{\"value\":");
    tr__out_double(o, e->value);
    OUT_LIT(o, "}},\n");
}

void tr__chrome_instant(tr__outbuf_t *o, unsigned rank, uint64_t base_ns, const tr__event_t *e)
{
    int step = e->type == TR__EV_STEP;
    head(o, "i", rank, e->lane);
    if (step)
        OUT_LIT(o, ",\"s\":\"p\",\"name\":");
    else
        OUT_LIT(o, ",\"s\":\"t\",\"name\":");
    tr__out_json_str(o, e->name);
    OUT_LIT(o, ",\"ts\":");
    tr__out_us(o, rel(e->t0, base_ns));
    if (step) {
        OUT_LIT(o, ",\"args\":{\"step\":");
        tr__out_u64(o, e->step);
        OUT_LIT(o, "}");
    }
    OUT_LIT(o, "},\n");
}

void tr__chrome_footer(tr__outbuf_t *o, unsigned rank, const tr_monitor_stats_t *st)
{
    head(o, "M", rank, 0);
    OUT_LIT(o, ",\"name\":\"troupe_stats\",\"args\":{\"events\":");
    tr__out_u64(o, st->events_written);
    OUT_LIT(o, ",\"dropped\":");
    tr__out_u64(o, st->dropped);
    OUT_LIT(o, ",\"unmatched_flows\":");
    tr__out_u64(o, st->unmatched_flows);
    OUT_LIT(o, "}}\n]\n");
}
