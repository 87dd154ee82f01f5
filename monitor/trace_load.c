/* trace_load.c: reading trace files back, for `troupe trace`.
 *
 * A trace is one trace_rank<R>.json or a directory of them. Each file is parsed with
 * jansson; a file that does not parse because the run died while writing it (a partial
 * last line, no closing "]") is repaired by cutting after the last complete event and
 * closing the array, then parsed again. Each file's "troupe_clock" metadata gives its
 * absolute start; timestamps are shifted so every rank is on the earliest rank's clock.
 * Events become spans, lanes, flows and step markers (trace_model.h). Bad input is an error
 * that names the file, the event and the field, never an assert.
 */
#include "monitor/trace_model.h"
#include "base/errf.h"
#include "base/file.h"
#include "troupe/log.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* --- reading and repairing one file ------------------------------------------------------- */

/* Cuts text after its last complete event line and closes the array. 0, or -1 when no
 * complete event is left. text has 2 spare bytes (tr__file_read leaves TR__FILE_SPARE). */
static int repair(char *text, size_t *len)
{
    size_t n = *len;
    while (n > 0) {
        /* the last '}' that ends a line (optionally followed by ',') */
        size_t i = n - 1;
        while (i > 0 && text[i] != '}')
            i--;
        size_t j = i + 1;
        if (j < *len && text[j] == ',') j++;
        /* a line written completely ends in a newline; a '}' at the very end may close
         * only the args of a partial line */
        if (text[i] == '}' && j < *len && (text[j] == '\n' || text[j] == '\r')) {
            text[i + 1] = '\n';
            text[i + 2] = ']';
            *len = i + 3;
            return 0;
        }
        n = i;
    }
    return -1;
}

int tr__trace_read_file(const char *path, json_t **events, int *repaired, char *err, size_t cap)
{
    size_t len;
    *repaired = 0;
    char *text;
    int rc = tr__file_read(path, 0, "a trace-event file", &text, &len, err, cap);
    if (rc) return rc;
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root) {
        json_error_t je2;
        if (repair(text, &len) == 0 && (root = json_loadb(text, len, 0, &je2))) *repaired = 1;
    }
    free(text);
    if (!root)
        return tr__errf(err, cap, TR_EFORMAT, "%s:%d:%d: not a trace-event file: %s", path, je.line,
                        je.column, je.text);
    if (json_is_object(root)) { /* the JSON Object Format */
        json_t *arr = json_incref(json_object_get(root, "traceEvents"));
        json_decref(root);
        root = arr;
    }
    if (!json_is_array(root)) {
        json_decref(root);
        return tr__errf(err, cap, TR_EFORMAT,
                        "%s: expected an array of events or an object with "
                        "\"traceEvents\"",
                        path);
    }
    *events = root;
    return 0;
}

/* --- lanes -------------------------------------------------------------------------------- */

static int lane_cmp(const void *a, const void *b)
{
    const tr__tlane_t *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return x->tid < y->tid ? -1 : x->tid > y->tid;
}

static int lane_find(const tr_trace_t *t, int rank, int64_t tid)
{
    tr__tlane_t key = {.rank = rank, .tid = tid};
    if (!t->n_lanes) return -1;
    const tr__tlane_t *l = bsearch(&key, t->lanes, (size_t)t->n_lanes, sizeof(key), lane_cmp);
    return l ? (int)(l - t->lanes) : -1;
}

static int lane_add(tr_trace_t *t, int *cap, int rank, int64_t tid)
{
    if (t->n_lanes == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        tr__tlane_t *p = realloc(t->lanes, (size_t)*cap * sizeof(*p));
        if (!p) return TR_ENOMEM;
        t->lanes = p;
    }
    t->lanes[t->n_lanes++] = (tr__tlane_t){rank, tid, NULL, TR_LANE_CONTROL};
    return 0;
}

static void rank_add(tr_trace_t *t, int rank)
{
    for (int i = 0; i < t->n_ranks; i++)
        if (t->ranks[i] == rank) return;
    if (t->n_ranks < (int)(sizeof(t->ranks) / sizeof(t->ranks[0]))) t->ranks[t->n_ranks++] = rank;
}

/* Every (pid, tid) that carries a span or a flow becomes a lane, sorted and unique; then the
 * thread_name metadata names them. */
static int collect_lanes(tr_trace_t *t)
{
    int cap = 0;
    for (int f = 0; f < t->n_files; f++) {
        size_t i;
        json_t *ev;
        json_array_foreach(t->files[f].events, i, ev)
        {
            const char *ph = json_string_value(json_object_get(ev, "ph"));
            json_t *pid = json_object_get(ev, "pid"), *tid = json_object_get(ev, "tid");
            if (!ph || !json_is_integer(pid) || !json_is_integer(tid)) continue;
            if (strchr("XsfM", ph[0]) &&
                lane_add(t, &cap, (int)json_integer_value(pid), json_integer_value(tid)))
                return TR_ENOMEM;
            rank_add(t, (int)json_integer_value(pid));
        }
    }
    if (t->n_lanes) qsort(t->lanes, (size_t)t->n_lanes, sizeof(*t->lanes), lane_cmp);
    int n = 0;
    for (int i = 0; i < t->n_lanes; i++)
        if (!n || lane_cmp(&t->lanes[n - 1], &t->lanes[i])) t->lanes[n++] = t->lanes[i];
    t->n_lanes = n;
    return 0;
}

static void name_lane(tr_trace_t *t, json_t *ev)
{
    json_t *args = json_object_get(ev, "args");
    int l = lane_find(t, (int)json_integer_value(json_object_get(ev, "pid")),
                      json_integer_value(json_object_get(ev, "tid")));
    if (l < 0) return;
    t->lanes[l].name = json_string_value(json_object_get(args, "name"));
    int kind = tr_lane_kind_parse(json_string_value(json_object_get(args, "kind")));
    if (kind >= 0) t->lanes[l].kind = kind;
}

/* --- events ------------------------------------------------------------------------------- */

static uint64_t flow_value(json_t *v)
{
    if (json_is_integer(v)) return (uint64_t)json_integer_value(v);
    if (json_is_string(v)) return strtoull(json_string_value(v), NULL, 0);
    return 0;
}

/* A required number field; on failure the message names the event and the field. */
static int number(json_t *ev, const char *key, double *out, const char *path, size_t i, char *err,
                  size_t cap)
{
    json_t *v = json_object_get(ev, key);
    if (!json_is_number(v))
        return tr__errf(err, cap, TR_EFORMAT,
                        "%s: event %zu (line %zu in a troupe file): field \"%s\" is missing or not "
                        "a number",
                        path, i, i + 2, key);
    *out = json_number_value(v);
    return 0;
}

/* Makes room in *arr (a pointer to the array pointer; n elements of elem bytes in use, *cap
 * allocated) for one more, doubling from 256. 0, or TR_ENOMEM with the array as it was. */
static int grow(void *arr, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap) return 0;
    size_t want = *cap ? *cap * 2 : 256;
    void *p = realloc(*(void **)arr, want * elem);
    if (!p) return TR_ENOMEM;
    *(void **)arr = p;
    *cap = want;
    return 0;
}

#define GROW(arr, n, cap) grow(&(arr), (n), &(cap), sizeof(*(arr)))

typedef struct caps {
    size_t spans, flows, marks;
} caps_t;

/* The runtime's lifecycle messages (an actor told to stop, killed, or reporting its exit):
 * sent when training is over (or before it starts), they carry whatever step the header
 * held, 0 in practice, yet belong to no training step. */
static int lifecycle(const char *name)
{
    return !strcmp(name, "kill") || !strcmp(name, "stop") || !strcmp(name, "exit");
}

static int add_span(tr_trace_t *t, caps_t *c, const tr__tfile_t *f, json_t *ev, size_t i, char *err,
                    size_t cap)
{
    double ts, dur;
    int e = number(ev, "ts", &ts, f->path, i, err, cap);
    if (!e) e = number(ev, "dur", &dur, f->path, i, err, cap);
    if (!e && dur < 0)
        e = tr__errf(err, cap, TR_EFORMAT, "%s: event %zu: field \"dur\" is negative", f->path, i);
    if (e || (e = GROW(t->spans, t->n_spans, c->spans))) return e;
    json_t *args = json_object_get(ev, "args");
    tr__tspan_t *s = &t->spans[t->n_spans++];
    s->rank = (int)json_integer_value(json_object_get(ev, "pid"));
    s->lane = lane_find(t, s->rank, json_integer_value(json_object_get(ev, "tid")));
    s->name = json_string_value(json_object_get(ev, "name"));
    if (!s->name) s->name = "?";
    s->ts = ts + f->offset_us;
    s->end = s->ts + dur;
    s->step = json_is_integer(json_object_get(args, "step")) && !lifecycle(s->name)
                  ? json_integer_value(json_object_get(args, "step"))
                  : TR__STEP_NONE;
    s->micro_step = json_integer_value(json_object_get(args, "micro_step"));
    s->bytes = (uint64_t)json_integer_value(json_object_get(args, "bytes"));
    s->flow = flow_value(json_object_get(args, "flow"));
    return 0;
}

static int add_event(tr_trace_t *t, caps_t *c, const tr__tfile_t *f, json_t *ev, size_t i,
                     char *err, size_t cap)
{
    const char *ph = json_string_value(json_object_get(ev, "ph"));
    if (!json_is_object(ev) || !ph)
        return tr__errf(err, cap, TR_EFORMAT, "%s: event %zu: not an object with a \"ph\" string",
                        f->path, i);
    json_t *pid = json_object_get(ev, "pid"), *tid = json_object_get(ev, "tid");
    int has_ids = json_is_integer(pid) && json_is_integer(tid);
    if (strchr("XsM", ph[0]) && !has_ids)
        return tr__errf(err, cap, TR_EFORMAT,
                        "%s: event %zu: fields \"pid\" and \"tid\" must be "
                        "integers",
                        f->path, i);
    double ts;
    if (ph[0] == 'X') return add_span(t, c, f, ev, i, err, cap);
    const char *name = json_string_value(json_object_get(ev, "name"));
    if (ph[0] == 'M' && name && !strcmp(name, "thread_name") && has_ids) name_lane(t, ev);
    if (ph[0] == 's') {
        int e = number(ev, "ts", &ts, f->path, i, err, cap);
        if (e || (e = GROW(t->flows, t->n_flows, c->flows))) return e;
        t->flows[t->n_flows++] = (tr__tflow_t){
            flow_value(json_object_get(ev, "id")), (int)json_integer_value(pid),
            lane_find(t, (int)json_integer_value(pid), json_integer_value(tid)), ts + f->offset_us};
    }
    if (ph[0] == 'i' && name && !strcmp(name, "step") && json_is_integer(pid)) {
        int e = number(ev, "ts", &ts, f->path, i, err, cap);
        if (e || (e = GROW(t->marks, t->n_marks, c->marks))) return e;
        t->marks[t->n_marks++] =
            (tr__tmark_t){(int)json_integer_value(pid),
                          json_integer_value(json_object_get(json_object_get(ev, "args"), "step")),
                          ts + f->offset_us};
    }
    return 0;
}

/* --- indexes ------------------------------------------------------------------------------ */

static int span_cmp(const void *a, const void *b)
{
    const tr__tspan_t *x = a, *y = b;
    if (x->lane != y->lane) return x->lane < y->lane ? -1 : 1;
    if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
    return x->end > y->end ? -1 : x->end < y->end; /* the outer first */
}

static int flow_cmp(const void *a, const void *b)
{
    const tr__tflow_t *x = a, *y = b;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static int flow_id_cmp(const void *a, const void *b)
{
    const tr__tflow_t *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Each span's depth and outermost holder on its lane (trace_model.h), with a stack of the
 * spans still open at the span's start; spans are sorted by (lane, ts, longest first). A span
 * that only overlaps the open one (ends after it) is not inside it: the open one is closed. */
static int mark_nesting(tr_trace_t *t)
{
    long *open = malloc((t->n_spans + 1) * sizeof(long));
    if (!open) return TR_ENOMEM;
    size_t n = 0;
    for (size_t i = 0; i < t->n_spans; i++) {
        tr__tspan_t *s = &t->spans[i];
        if (i && t->spans[i - 1].lane != s->lane) n = 0;
        while (n && t->spans[open[n - 1]].end < s->end)
            n--;
        s->depth = (int)n;
        s->outer = n ? open[0] : (long)i;
        open[n++] = (long)i;
    }
    free(open);
    return 0;
}

static int build_index(tr_trace_t *t)
{
    if (t->n_spans) qsort(t->spans, t->n_spans, sizeof(*t->spans), span_cmp);
    if (t->n_flows) qsort(t->flows, t->n_flows, sizeof(*t->flows), flow_cmp);
    t->lane_first = calloc((size_t)t->n_lanes + 1, sizeof(size_t));
    t->lane_count = calloc((size_t)t->n_lanes + 1, sizeof(size_t));
    if (!t->lane_first || !t->lane_count) return TR_ENOMEM;
    for (size_t i = t->n_spans; i-- > 0;) {
        t->lane_first[t->spans[i].lane] = i;
        t->lane_count[t->spans[i].lane]++;
    }
    return mark_nesting(t);
}

long tr__trace_span_at(const tr_trace_t *t, int lane, double t_us)
{
    if (lane < 0 || !t->lane_count[lane]) return -1;
    size_t lo = t->lane_first[lane], hi = lo + t->lane_count[lane];
    while (hi - lo > 1) { /* the last span starting at or before t_us */
        size_t mid = (lo + hi) / 2;
        if (t->spans[mid].ts <= t_us)
            lo = mid;
        else
            hi = mid;
    }
    /* a nested span may end before t_us while its outer span still holds it */
    const tr__tspan_t *s = &t->spans[t->spans[lo].outer];
    return s->ts <= t_us && t_us <= s->end ? t->spans[lo].outer : -1;
}

const tr__tflow_t *tr__trace_flow(const tr_trace_t *t, uint64_t id, int rank)
{
    tr__tflow_t key = {.id = id};
    if (!t->n_flows) return NULL;
    const tr__tflow_t *f = bsearch(&key, t->flows, t->n_flows, sizeof(key), flow_id_cmp);
    if (!f) return NULL;
    while (f > t->flows && f[-1].id == id) /* the first with this id */
        f--;
    for (const tr__tflow_t *g = f; g < t->flows + t->n_flows && g->id == id; g++)
        if (g->rank == rank) return g;
    return f;
}

/* --- loading ------------------------------------------------------------------------------ */

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The files to read: path itself, or the trace_rank*.json in it. */
static int list_files(const char *path, char ***names, int *n, char *err, size_t cap)
{
    struct stat st;
    if (stat(path, &st)) return tr__errf(err, cap, -errno, "%s: %s", path, strerror(errno));
    *n = 0;
    *names = calloc(1024, sizeof(char *));
    if (!*names) return TR_ENOMEM;
    if (!S_ISDIR(st.st_mode)) {
        (*names)[(*n)++] = strdup(path);
        return 0;
    }
    DIR *d = opendir(path);
    if (!d) return tr__errf(err, cap, -errno, "%s: %s", path, strerror(errno));
    for (struct dirent *e; (e = readdir(d)) && *n < 1024;) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "trace_rank", 10) || len < 15 ||
            strcmp(e->d_name + len - 5, ".json"))
            continue;
        size_t size = strlen(path) + len + 2;
        char *p = malloc(size);
        if (p) tr__path_join(p, size, path, e->d_name);
        (*names)[(*n)++] = p;
    }
    closedir(d);
    qsort(*names, (size_t)*n, sizeof(char *), name_cmp);
    return *n ? 0 : tr__errf(err, cap, TR_ENOENT, "%s: no trace_rank*.json files in it", path);
}

static uint64_t clock_base(json_t *events)
{
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev)
    {
        const char *name = json_string_value(json_object_get(ev, "name"));
        if (name && !strcmp(name, "troupe_clock"))
            return (uint64_t)json_integer_value(
                json_object_get(json_object_get(ev, "args"), "base_unix_ns"));
    }
    return 0;
}

/* The rank a file claims: its troupe_clock's args.rank, else its first event's pid; -1 if
 * neither. */
static int file_rank(json_t *events)
{
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev)
    {
        const char *name = json_string_value(json_object_get(ev, "name"));
        json_t *rank = json_object_get(json_object_get(ev, "args"), "rank");
        if (name && !strcmp(name, "troupe_clock") && json_is_integer(rank))
            return (int)json_integer_value(rank);
    }
    json_array_foreach(events, i, ev)
    {
        json_t *pid = json_object_get(ev, "pid");
        if (json_is_integer(pid)) return (int)json_integer_value(pid);
    }
    return -1;
}

/* Two files of one rank (a merged file next to the files it came from, a copy) would count
 * that rank twice: say so, naming both. */
static void warn_same_rank(const tr_trace_t *t)
{
    for (int i = 0; i < t->n_files; i++) {
        int r = file_rank(t->files[i].events);
        for (int j = 0; r >= 0 && j < i; j++)
            if (file_rank(t->files[j].events) == r) {
                tr_log(TR_LOG_WARN,
                       "trace: %s and %s both claim rank %d; its spans are counted twice "
                       "(a merged file or a copy among the inputs?)",
                       t->files[j].path, t->files[i].path, r);
                break;
            }
    }
}

static int read_files(tr_trace_t *t, char **names, int n, char *err, size_t cap)
{
    t->files = calloc((size_t)n, sizeof(*t->files));
    if (!t->files) return TR_ENOMEM;
    for (int i = 0; i < n; i++) {
        tr__tfile_t *f = &t->files[t->n_files++];
        f->path = names[i];
        names[i] = NULL;
        int e = tr__trace_read_file(f->path, &f->events, &f->repaired, err, cap);
        if (e) return e;
        f->base_unix_ns = clock_base(f->events);
        if (f->base_unix_ns && (!t->base_unix_ns || f->base_unix_ns < t->base_unix_ns))
            t->base_unix_ns = f->base_unix_ns;
    }
    for (int i = 0; i < t->n_files; i++)
        if (t->files[i].base_unix_ns)
            t->files[i].offset_us = (double)(t->files[i].base_unix_ns - t->base_unix_ns) / 1e3;
    warn_same_rank(t);
    return 0;
}

static int read_events(tr_trace_t *t, char *err, size_t cap)
{
    caps_t c = {0};
    for (int f = 0; f < t->n_files; f++) {
        size_t i;
        json_t *ev;
        json_array_foreach(t->files[f].events, i, ev)
        {
            int e = add_event(t, &c, &t->files[f], ev, i, err, cap);
            if (e) return e;
        }
    }
    return 0;
}

int tr_trace_load(const char *path, tr_trace_t **out, char *err, size_t cap)
{
    *out = NULL;
    char **names = NULL;
    int n = 0;
    tr_trace_t *t = calloc(1, sizeof(*t));
    if (!t) return TR_ENOMEM;
    int e = list_files(path, &names, &n, err, cap);
    if (!e) e = read_files(t, names, n, err, cap);
    if (!e) e = collect_lanes(t);
    if (!e) e = read_events(t, err, cap);
    if (!e) e = build_index(t);
    for (int i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
    if (e) {
        if (e == TR_ENOMEM) tr__errf(err, cap, e, "%s: out of memory", path);
        tr_trace_destroy(t);
        return e;
    }
    *out = t;
    return 0;
}

void tr_trace_destroy(tr_trace_t *t)
{
    if (!t) return;
    for (int i = 0; i < t->n_files; i++) {
        free(t->files[i].path);
        json_decref(t->files[i].events);
    }
    free(t->files);
    free(t->spans);
    free(t->lanes);
    free(t->flows);
    free(t->marks);
    free(t->lane_first);
    free(t->lane_count);
    free(t);
}

int tr_trace_repaired(const tr_trace_t *t)
{
    int n = 0;
    for (int i = 0; i < t->n_files; i++)
        n += t->files[i].repaired;
    return n;
}

size_t tr_trace_span_count(const tr_trace_t *t)
{
    return t->n_spans;
}
