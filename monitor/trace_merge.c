/* trace_merge.c: `troupe trace merge`, every rank's events in one Chrome trace file.
 *
 * The loader has already worked out each file's clock offset from its "troupe_clock"
 * metadata (the absolute time its run started). Merging rewrites each event with "ts"
 * shifted by that offset and each troupe_clock event with the common base, so the merged
 * file loads back with offset zero. pid stays the rank, so Perfetto shows one process per
 * rank on a single time line. Flow ids that several ranks each started (ids that are only
 * unique within a rank) are made unique by putting rank + 1 in their top 16 bits, in the
 * "s" and "f" events and in the spans' "flow" argument alike. One event per line, as the
 * recorder writes.
 */
#include "monitor/trace_model.h"

#include <stdlib.h>
#include <string.h>

/* Whether more than one rank started a flow with this id. */
static int shared_id(const tr_trace_t *t, uint64_t id)
{
    const tr__tflow_t *f = tr__trace_flow(t, id, -1);
    for (const tr__tflow_t *g = f; g && g < t->flows + t->n_flows && g->id == id; g++)
        if (g->rank != f->rank) return 1;
    return 0;
}

static json_t *flow_id_json(uint64_t id)
{
    char hex[24];
    snprintf(hex, sizeof(hex), "0x%llx", (unsigned long long)id);
    return json_string(hex);
}

/* Rewrites a shared flow id in copy (an "s"/"f" event's id, a span's args.flow). */
static void unique_flow(const tr_trace_t *t, json_t *copy, const char *ph)
{
    json_t *args = json_object_get(copy, "args");
    json_t *holder = ph[0] == 'X' ? args : copy;
    const char *key = ph[0] == 'X' ? "flow" : "id";
    json_t *v = json_object_get(holder, key);
    uint64_t id = json_is_string(v) ? strtoull(json_string_value(v), NULL, 0)
                                    : (uint64_t)json_integer_value(v);
    if (!v || !shared_id(t, id)) return;
    uint64_t rank = (uint64_t)json_integer_value(json_object_get(copy, "pid"));
    if (ph[0] == 'X') {
        holder = json_deep_copy(args);
        json_object_set_new(copy, "args", holder);
    }
    json_object_set_new(holder, key, flow_id_json((rank + 1) << 48 | id));
}

/* A shallow copy of ev with its clock fields moved onto the common clock. */
static json_t *aligned(const tr_trace_t *t, const tr__tfile_t *f, json_t *ev)
{
    json_t *copy = json_copy(ev);
    const char *ph = json_string_value(json_object_get(ev, "ph"));
    if (ph && strchr("Xsf", ph[0])) unique_flow(t, copy, ph);
    json_t *ts = json_object_get(ev, "ts");
    if (json_is_number(ts) && f->offset_us != 0)
        json_object_set_new(copy, "ts", json_real(json_number_value(ts) + f->offset_us));
    const char *name = json_string_value(json_object_get(ev, "name"));
    if (name && !strcmp(name, "troupe_clock")) {
        json_t *args = json_deep_copy(json_object_get(ev, "args"));
        json_object_set_new(args, "base_unix_ns", json_integer((json_int_t)t->base_unix_ns));
        json_object_set_new(copy, "args", args);
    }
    return copy;
}

int tr_trace_merge_write(const tr_trace_t *t, FILE *out)
{
    fputs("[\n", out);
    for (int i = 0; i < t->n_files; i++) {
        size_t k;
        json_t *ev;
        json_array_foreach(t->files[i].events, k, ev)
        {
            json_t *copy = aligned(t, &t->files[i], ev);
            char *line = json_dumps(copy, JSON_COMPACT | JSON_REAL_PRECISION(15));
            json_decref(copy);
            if (!line) return TR_ENOMEM;
            fputs(line, out);
            fputs(",\n", out);
            free(line);
        }
    }
    fprintf(out,
            "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"troupe_merge\",\"args\":"
            "{\"files\":%d,\"ranks\":%d}}\n]\n",
            t->n_ranks ? t->ranks[0] : 0, t->n_files, t->n_ranks);
    return ferror(out) ? TR_EIO : 0;
}
