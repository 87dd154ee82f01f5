/* trace_check.c: see trace_check.h. */
#include "trace_check.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

typedef struct span_iv {
    long long pid, tid;
    double ts, end;
} span_iv_t;

static int by_lane_then_ts(const void *a, const void *b)
{
    const span_iv_t *x = a, *y = b;
    if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
    if (x->tid != y->tid) return x->tid < y->tid ? -1 : 1;
    return x->ts < y->ts ? -1 : x->ts > y->ts;
}

static void check_common(json_t *ev)
{
    assert_true(json_is_object(ev));
    assert_true(json_is_string(json_object_get(ev, "ph")));
    assert_true(json_is_integer(json_object_get(ev, "pid")));
    assert_true(json_is_integer(json_object_get(ev, "tid")));
    assert_true(json_is_string(json_object_get(ev, "name")));
}

static void check_span(json_t *ev, span_iv_t *iv)
{
    json_t *args = json_object_get(ev, "args");
    assert_true(json_is_number(json_object_get(ev, "ts")));
    assert_true(json_is_number(json_object_get(ev, "dur")));
    assert_true(json_is_string(json_object_get(ev, "cat")));
    assert_true(json_is_integer(json_object_get(args, "step")));
    assert_true(json_is_integer(json_object_get(args, "micro_step")));
    assert_true(json_is_integer(json_object_get(args, "bytes")));
    iv->pid = json_integer_value(json_object_get(ev, "pid"));
    iv->tid = json_integer_value(json_object_get(ev, "tid"));
    iv->ts = json_number_value(json_object_get(ev, "ts"));
    iv->end = iv->ts + json_number_value(json_object_get(ev, "dur"));
    assert_true(iv->end >= iv->ts);
}

/* Every flow id has exactly one "s" and one "f" (bound to its enclosing slice). */
static void check_flows(json_t *flows_s, json_t *flows_f)
{
    const char *id;
    json_t *v;
    json_object_foreach(flows_s, id, v)
    {
        assert_int_equal(json_integer_value(v), 1);
        json_t *f = json_object_get(flows_f, id);
        assert_non_null(f);
        assert_int_equal(json_integer_value(f), 1);
    }
    assert_int_equal(json_object_size(flows_s), json_object_size(flows_f));
}

static void count_flow(json_t *map, json_t *ev)
{
    const char *id = json_string_value(json_object_get(ev, "id"));
    assert_non_null(id);
    json_t *n = json_object_get(map, id);
    json_object_set_new(map, id, json_integer(n ? json_integer_value(n) + 1 : 1));
    assert_true(json_is_number(json_object_get(ev, "ts")));
    assert_string_equal(json_string_value(json_object_get(ev, "cat")), "msg");
}

/* Whether a span on (pid, tid) encloses ts: a flow event binds to it (iv sorted). */
static int enclosed(const span_iv_t *iv, int n, long long pid, long long tid, double ts)
{
    int lo = 0, hi = n; /* the first span after (pid, tid, ts) */
    span_iv_t key = {pid, tid, ts, ts};
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (by_lane_then_ts(&iv[mid], &key) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && iv[lo - 1].pid == pid && iv[lo - 1].tid == tid && iv[lo - 1].end >= ts;
}

/* Every "s" and "f" lies inside a span of its lane, so viewers can bind the arrow. */
static void check_bindings(json_t *root, const span_iv_t *iv, int n)
{
    size_t i;
    json_t *ev;
    json_array_foreach(root, i, ev)
    {
        const char *ph = json_string_value(json_object_get(ev, "ph"));
        if (strcmp(ph, "s") && strcmp(ph, "f")) continue;
        if (!enclosed(iv, n, json_integer_value(json_object_get(ev, "pid")),
                      json_integer_value(json_object_get(ev, "tid")),
                      json_number_value(json_object_get(ev, "ts"))))
            fail_msg("event %zu: flow \"%s\" at ts %.3f is not inside a span of its lane", i, ph,
                     json_number_value(json_object_get(ev, "ts")));
    }
}

json_t *trace_check_file(const char *path, trace_counts_t *c)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) fail_msg("%s:%d: %s", path, jerr.line, jerr.text);
    assert_true(json_is_array(root));
    memset(c, 0, sizeof(*c));
    size_t n = json_array_size(root);
    span_iv_t *iv = calloc(n + 1, sizeof(*iv));
    json_t *fs = json_object(), *ff = json_object();
    for (size_t i = 0; i < n; i++) {
        json_t *ev = json_array_get(root, i);
        check_common(ev);
        const char *ph = json_string_value(json_object_get(ev, "ph"));
        const char *name = json_string_value(json_object_get(ev, "name"));
        if (!strcmp(ph, "X")) {
            check_span(ev, &iv[c->spans++]);
        } else if (!strcmp(ph, "s")) {
            count_flow(fs, ev);
            c->flow_starts++;
        } else if (!strcmp(ph, "f")) {
            assert_string_equal(json_string_value(json_object_get(ev, "bp")), "e");
            count_flow(ff, ev);
            c->flow_ends++;
        } else if (!strcmp(ph, "C")) {
            assert_true(json_is_number(json_object_get(json_object_get(ev, "args"), "value")));
            c->counters++;
        } else if (!strcmp(ph, "i")) {
            assert_true(json_is_string(json_object_get(ev, "s")));
            c->instants++;
        } else {
            assert_string_equal(ph, "M");
            assert_true(json_is_object(json_object_get(ev, "args")));
            if (!strcmp(name, "thread_name")) c->lanes_named++;
            c->metadata++;
        }
    }
    check_flows(fs, ff);
    qsort(iv, (size_t)c->spans, sizeof(*iv), by_lane_then_ts);
    for (int i = 1; i < c->spans; i++)
        if (iv[i].pid == iv[i - 1].pid && iv[i].tid == iv[i - 1].tid)
            assert_true(iv[i].ts >= iv[i - 1].end - 1e-4); /* touching spans: ts + dur in µs
                                                            * may round 1e-13 past the next */
    check_bindings(root, iv, c->spans);
    json_decref(fs);
    json_decref(ff);
    free(iv);
    return root;
}
