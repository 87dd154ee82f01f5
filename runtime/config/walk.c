/* walk.c: walks a parsed DeepSpeed config against the schema table. For every key it
 * finds the schema entry (or reports the key as unknown, with a did-you-mean or a "belongs in"
 * hint), checks the type and range, stores the value in tr_config_t and in the resolved tree,
 * and records where it came from. Keys not given get their defaults; "auto" inside a section
 * means the default. The walk never stops early: every problem is reported. */
#include "runtime/config/walk.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FIELD(w, k, type) ((type *)((char *)(w)->cfg + (k)->offset))
#define INT64_LIMIT       9.2233720368547758e18
#define MAX_KEYS          64

/* --- diagnostics ------------------------------------------------------------------------ */

static void report(tr__cfg_walk_t *w, tr_config_severity_t sev, const char *path, const char *tag,
                   const char *fmt, va_list ap)
{
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (path[0])
        tr__cfg_diag_add(w->diag, sev, "%s: %s: %s%s", w->file, path, tag, msg);
    else
        tr__cfg_diag_add(w->diag, sev, "%s: %s%s", w->file, tag, msg);
}

#define REPORT_FN(fn, sev, tag)                                                                    \
    void fn(tr__cfg_walk_t *w, const char *path, const char *fmt, ...)                             \
    {                                                                                              \
        va_list ap;                                                                                \
        va_start(ap, fmt);                                                                         \
        report(w, sev, path, tag, fmt, ap);                                                        \
        va_end(ap);                                                                                \
    }
REPORT_FN(tr__cfg_error, TR_CONFIG_ERROR, "")
REPORT_FN(tr__cfg_warn, TR_CONFIG_WARNING, "warning: ")
REPORT_FN(tr__cfg_note, TR_CONFIG_NOTE, "note: ")

void tr__cfg_set_origin(tr__cfg_walk_t *w, const char *path, const char *origin)
{
    json_object_set_new(w->origins, path, json_string(origin));
}

/* A user-written key made safe to print: control bytes escaped, cut at 64 bytes. */
static const char *safe(const char *s, char *buf, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; s[i] && o + 5 < n && i < 64; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f)
            o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
        else
            buf[o++] = (char)c;
    }
    buf[o] = 0;
    if (strlen(s) > 64 && o + 4 < n) strcpy(buf + o, "...");
    return buf;
}

/* A value as shown in "got ...": scalars as JSON (cut at 40 bytes), containers by kind. */
static const char *show(const json_t *v, char *buf, size_t n)
{
    if (json_is_object(v)) return "an object";
    if (json_is_array(v)) return "an array";
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!s) return "a value";
    if (strlen(s) > 40)
        snprintf(buf, n, "%.37s...", s);
    else
        snprintf(buf, n, "%s", s);
    free(s);
    return buf;
}

static void join(char *out, size_t n, const char *path, const char *name)
{
    snprintf(out, n, "%s%s%s", path, path[0] ? "." : "", name);
}

static bool is_auto(const json_t *v)
{
    return json_is_string(v) && !strcmp(json_string_value(v), "auto");
}

static int64_t to_i64(double d)
{
    if (d >= INT64_LIMIT) return INT64_MAX;
    if (d <= -INT64_LIMIT) return INT64_MIN;
    return (int64_t)d;
}

/* A default as shown in a note: the whole value, compact. */
static const char *show_all(const json_t *v, char *buf, size_t n)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(15));
    snprintf(buf, n, "%s", s ? s : "null");
    free(s);
    return buf;
}

/* --- what a key expects ------------------------------------------------------------------ */

/* "an integer >= 1", "a number > 0", "a number between 0 and 1": the bounds the walker
 * checks, so a message never names a limit other than the real one. */
static void range_text(const tr__cfg_key_t *k, const char *what, bool ints, char *b, size_t n)
{
    bool no_min = ints ? k->min <= -INT64_LIMIT : k->min <= -DBL_MAX;
    bool no_max = ints ? k->max >= INT64_LIMIT : k->max >= DBL_MAX;
    const char *ge = k->flags & TR__F_MIN_EXCL ? ">" : ">=";
    if (no_min && no_max)
        snprintf(b, n, "%s", what);
    else if (no_max)
        snprintf(b, n, ints ? "%s %s %.0f" : "%s %s %g", what, ge, k->min);
    else if (no_min)
        snprintf(b, n, ints ? "%s <= %.0f" : "%s <= %g", what, k->max);
    else
        snprintf(b, n, ints ? "%s between %.0f and %.0f" : "%s between %g and %g", what, k->min,
                 k->max);
}

static void choices_text(const tr__cfg_key_t *k, char *b, size_t n)
{
    size_t o = (size_t)snprintf(b, n, "one of");
    for (int i = 0; k->choices[i] && o < n; i++)
        o += (size_t)snprintf(b + o, n - o, "%s \"%s\"", i ? "," : "", k->choices[i]);
    if (k->flags & TR__F_NULLABLE && o < n) o += (size_t)snprintf(b + o, n - o, " or null");
    if (k->flags & TR__F_NOCASE && o < n) snprintf(b + o, n - o, " (any case)");
}

const char *tr__cfg_expectation(const tr__cfg_key_t *k, char *b, size_t n)
{
    if (k->expect) return k->expect;
    switch (k->kind) {
    case TR__K_BOOL:
        return "true or false";
    case TR__K_INT:
        range_text(k, "an integer", true, b, n);
        return b;
    case TR__K_DOUBLE:
        range_text(k, "a number", false, b, n);
        return b;
    case TR__K_STRING:
        return k->flags & TR__F_NULLABLE ? "a string or null" : "a string";
    case TR__K_ENUM:
        choices_text(k, b, n);
        return b;
    case TR__K_PAIR:
        range_text(k, "a list of two numbers", false, b, n);
        return b;
    case TR__K_STRLIST:
        return "a list of strings";
    default:
        return "an object";
    }
}

static void mistyped(tr__cfg_walk_t *w, const tr__cfg_key_t *k, const char *kp, const json_t *v)
{
    char e[256], g[64];
    tr__cfg_error(w, kp, "must be %s, got %s", tr__cfg_expectation(k, e, sizeof(e)),
                  show(v, g, sizeof(g)));
}

/* --- storing values ---------------------------------------------------------------------- */

static void put(tr__cfg_walk_t *w, json_t *out, const tr__cfg_key_t *k, const char *kp, json_t *v,
                const char *origin)
{
    json_object_set_new(out, k->name, v);
    if (origin) tr__cfg_set_origin(w, kp, origin);
}

json_t *tr__cfg_default_json(tr__cfg_walk_t *w, const tr__cfg_key_t *k)
{
    bool null_default = (k->flags & (TR__F_NULLABLE | TR__F_DERIVED)) && k->def == 0;
    switch (k->kind) {
    case TR__K_BOOL:
        *FIELD(w, k, bool) = k->def != 0;
        return json_boolean(k->def != 0);
    case TR__K_INT:
        *FIELD(w, k, int64_t) = to_i64(k->def);
        if (k->flags & TR__F_AUTO_ZERO && k->def == 0) return json_string("auto");
        return null_default ? json_null() : json_integer(to_i64(k->def));
    case TR__K_DOUBLE:
        *FIELD(w, k, double) = k->def;
        return json_real(k->def);
    case TR__K_ENUM:
        *FIELD(w, k, int) = (int)k->def + (k->flags & TR__F_ENUM1 ? 1 : 0);
        return k->flags & TR__F_DERIVED ? json_null() : json_string(k->choices[(int)k->def]);
    case TR__K_PAIR:
        FIELD(w, k, double)[0] = k->def;
        FIELD(w, k, double)[1] = k->def2;
        return json_pack("[ff]", k->def, k->def2);
    case TR__K_STRLIST:
        FIELD(w, k, tr_config_strlist_t)->count = 0;
        return json_array();
    default:
        break;
    }
    json_t *s = k->def_str ? json_string(k->def_str) : json_null(); /* TR__K_STRING */
    *FIELD(w, k, const char *) = json_string_value(s);
    return s;
}

static void store_default(tr__cfg_walk_t *w, const tr__cfg_key_t *k, const char *kp, json_t *out,
                          const char *origin)
{
    put(w, out, k, kp, tr__cfg_default_json(w, k), origin);
}

static int parse_int(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 0;
    }
    if (!json_is_real(v)) return -1;
    double d = json_real_value(v); /* 5e8: integral reals are integers */
    if (d != floor(d) || d >= INT64_LIMIT || d < -INT64_LIMIT) return -1;
    *out = (int64_t)d;
    return 0;
}

static bool in_range(const tr__cfg_key_t *k, double d)
{
    if (k->flags & TR__F_MIN_EXCL && d <= k->min) return false;
    return d >= k->min && d <= k->max;
}

static int match_choice(const tr__cfg_key_t *k, const char *s)
{
    for (int i = 0; k->choices[i]; i++)
        if (k->flags & TR__F_NOCASE ? !strcasecmp(k->choices[i], s) : !strcmp(k->choices[i], s))
            return i;
    return -1;
}

static json_t *parse_pair(tr__cfg_walk_t *w, const tr__cfg_key_t *k, json_t *v)
{
    if (!json_is_array(v) || json_array_size(v) != 2) return NULL;
    for (size_t i = 0; i < 2; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_number(e) || !in_range(k, json_number_value(e))) return NULL;
    }
    for (size_t i = 0; i < 2; i++)
        FIELD(w, k, double)[i] = json_number_value(json_array_get(v, i));
    return json_pack("[ff]", FIELD(w, k, double)[0], FIELD(w, k, double)[1]);
}

static json_t *parse_strlist(tr__cfg_walk_t *w, const tr__cfg_key_t *k, json_t *v)
{
    size_t i;
    json_t *e;
    if (!json_is_array(v) || json_array_size(v) > TR_CONFIG_MAX_LIST) return NULL;
    json_array_foreach(v, i, e) if (!json_is_string(e)) return NULL;
    tr_config_strlist_t *l = FIELD(w, k, tr_config_strlist_t);
    l->count = (int)json_array_size(v);
    json_array_foreach(v, i, e) l->items[i] = json_string_value(e);
    return json_incref(v);
}

/* The value for k parsed from v into the field; NULL when v does not fit k. */
static json_t *parse_value(tr__cfg_walk_t *w, const tr__cfg_key_t *k, json_t *v)
{
    int64_t i;
    int c;
    switch (k->kind) {
    case TR__K_BOOL:
        if (!json_is_boolean(v)) return NULL;
        *FIELD(w, k, bool) = json_is_true(v);
        return json_incref(v);
    case TR__K_INT:
        if (parse_int(v, &i) < 0 || !in_range(k, (double)i)) return NULL;
        *FIELD(w, k, int64_t) = i;
        return json_integer(i);
    case TR__K_DOUBLE:
        if (!json_is_number(v) || !in_range(k, json_number_value(v))) return NULL;
        *FIELD(w, k, double) = json_number_value(v);
        return json_real(json_number_value(v));
    case TR__K_STRING:
        if (!json_is_string(v)) return NULL;
        *FIELD(w, k, const char *) = json_string_value(v);
        return json_incref(v);
    case TR__K_ENUM:
        if (!json_is_string(v) || (c = match_choice(k, json_string_value(v))) < 0) return NULL;
        *FIELD(w, k, int) = c + (k->flags & TR__F_ENUM1 ? 1 : 0);
        return json_string(k->choices[c]);
    case TR__K_PAIR:
        return parse_pair(w, k, v);
    case TR__K_STRLIST:
        return parse_strlist(w, k, v);
    default:
        return NULL;
    }
}

/* Whether the parsed value r of k equals k's default (which has no effect to lose). */
static bool is_default(const tr__cfg_key_t *k, const json_t *r)
{
    switch (k->kind) {
    case TR__K_BOOL:
        return json_is_true(r) == (k->def != 0);
    case TR__K_INT:
        return json_integer_value(r) == to_i64(k->def);
    case TR__K_DOUBLE:
        return json_real_value(r) == k->def;
    case TR__K_ENUM:
        return !strcmp(json_string_value(r), k->choices[(int)k->def]);
    case TR__K_STRING:
        return k->def_str && !strcmp(json_string_value(r), k->def_str);
    case TR__K_PAIR:
        return json_real_value(json_array_get(r, 0)) == k->def &&
               json_real_value(json_array_get(r, 1)) == k->def2;
    case TR__K_STRLIST:
        return json_array_size(r) == 0;
    default:
        return false;
    }
}

/* --- "auto" and the batch keys ----------------------------------------------------------- */

static void auto_value(tr__cfg_walk_t *w, const tr__cfg_key_t *k, const char *kp, json_t *out)
{
    char e[256], d[64];
    if (k->flags & TR__F_AUTO_ZERO) {
        *FIELD(w, k, int64_t) = 0;
        put(w, out, k, kp, json_string("auto"), NULL);
        return;
    }
    json_t *def = tr__cfg_default_json(w, k);
    if (!strchr(kp, '.')) {
        tr__cfg_error(w, kp,
                      "\"auto\" cannot be resolved at the top level; write %s (DeepSpeed's "
                      "default is %s)",
                      tr__cfg_expectation(k, e, sizeof(e)), show_all(def, d, sizeof(d)));
        put(w, out, k, kp, def, "default");
    } else if (k->flags & TR__F_REQUIRED) {
        tr__cfg_error(w, kp, "\"auto\" has no default to stand for here; write %s",
                      tr__cfg_expectation(k, e, sizeof(e)));
        put(w, out, k, kp, def, "default");
    } else {
        tr__cfg_note(w, kp, "\"auto\" means the default here: %s", show_all(def, d, sizeof(d)));
        put(w, out, k, kp, def, "auto");
    }
}

static void batch_key(tr__cfg_walk_t *w, const tr__cfg_key_t *k, const char *kp, json_t *v,
                      json_t *out)
{
    int i = (int)(k - tr__cfg_top.keys); /* the triple opens the top table: TB, MB, GAS */
    json_object_set_new(out, k->name, json_null()); /* filled by the resolver */
    if (!v || json_is_null(v))
        w->batch_state[i] = TR__BATCH_ABSENT;
    else if (is_auto(v))
        w->batch_state[i] = TR__BATCH_AUTO;
    else if (parse_int(v, &w->batch[i]) == 0)
        w->batch_state[i] = TR__BATCH_GIVEN;
    else {
        char g[64];
        tr__cfg_error(w, kp, "must be a positive integer or \"auto\", got %s",
                      show(v, g, sizeof(g)));
        w->batch_state[i] = TR__BATCH_BAD;
    }
}

static void resolve_leaf(tr__cfg_walk_t *w, const tr__cfg_key_t *k, const char *kp, json_t *v,
                         json_t *out, bool present)
{
    char e[256];
    if (k->flags & TR__F_BATCH) {
        batch_key(w, k, kp, v, out);
    } else if (!v || (json_is_null(v) && k->flags & TR__F_NULLABLE)) {
        if (!v && present && k->flags & TR__F_REQUIRED)
            tr__cfg_error(w, kp, "missing; must be %s", tr__cfg_expectation(k, e, sizeof(e)));
        store_default(w, k, kp, out, "default");
    } else if (is_auto(v) && k->kind != TR__K_STRING) {
        auto_value(w, k, kp, out);
    } else {
        json_t *r = parse_value(w, k, v);
        if (r) {
            char st[256];
            if (k->state == TR__S_INERT && (k->flags & TR__F_DERIVED || !is_default(k, r)))
                tr__cfg_warn(w, kp, "%s", tr__cfg_state_text(k, st, sizeof(st)));
            put(w, out, k, kp, r, NULL);
        } else {
            mistyped(w, k, kp, v);
            store_default(w, k, kp, out, "default");
        }
    }
}

/* --- sections ---------------------------------------------------------------------------- */

static void walk_section(tr__cfg_walk_t *w, const tr__cfg_section_t *sec, json_t *in, json_t *out,
                         const char *path, bool present);

/* "(it belongs in 'a' or 'b')" for a key that exists in other sections, "" otherwise. */
static void belongs_hint(const tr__cfg_section_t *sec, const char *path, const char *name,
                         char *hint, size_t n)
{
    char places[TR__CFG_WHERE_MAX + 1][256];
    int found = tr__cfg_where(name, sec, places);
    hint[0] = 0;
    if (found == 0 || found > TR__CFG_WHERE_MAX) return;
    if (found == 1 && !strchr(places[0], '.')) {
        snprintf(hint, n, " ('%s' is a top-level section: move it out of '%s')", name, path);
        return;
    }
    size_t o = (size_t)snprintf(hint, n, " (it belongs in ");
    for (int i = 0; i < found && o < n; i++) {
        *strrchr(places[i], '.') = 0; /* the section, not the key */
        if (!strcmp(places[i], path)) /* another variant of this very section */
            return (void)snprintf(hint, n, " (not a parameter of this type)");
        o += (size_t)snprintf(hint + o, n - o, "%s'%s'", i ? " or " : "", places[i]);
    }
    if (o < n) snprintf(hint + o, n - o, ")");
}

static void unknown_key(tr__cfg_walk_t *w, const tr__cfg_section_t *sec, const char *path,
                        const char *name)
{
    char q[300], hint[1100];
    safe(name, q, sizeof(q));
    belongs_hint(sec, path, name, hint, sizeof(hint));
    const char *c = hint[0] ? NULL : tr__cfg_closest(sec, name);
    if (c)
        tr__cfg_error(w, path, "unknown key '%s' (did you mean '%s'?)", q, c);
    else
        tr__cfg_error(w, path, "unknown key '%s'%s", q, hint);
}

/* cpu_offload: true stands for "offload_optimizer": {"device": "cpu"}. */
static json_t *section_alias(tr__cfg_walk_t *w, const char *kp, json_t *v)
{
    if (!json_is_boolean(v)) {
        char g[64];
        tr__cfg_error(w, kp, "must be true or false, got %s", show(v, g, sizeof(g)));
        return NULL;
    }
    json_t *o = json_is_true(v) ? json_pack("{ss}", "device", "cpu") : json_object();
    json_array_append_new(w->scratch, o);
    return o;
}

static void take_alias(tr__cfg_walk_t *w, const tr__cfg_section_t *sec, const tr__cfg_key_t *k,
                       json_t *v, const char *path, json_t **vals, const char **as)
{
    const tr__cfg_key_t *t = tr__cfg_find(sec, k->alias_of);
    size_t i = (size_t)(t - sec->keys);
    char kp[512];
    join(kp, sizeof(kp), path, k->name);
    if (t->kind == TR__K_SECTION && !json_is_object(v)) {
        tr__cfg_warn(w, kp, "deprecated; write \"%s\": {\"device\": \"cpu\"} instead", t->name);
        if (!(v = section_alias(w, kp, v))) return;
    } else if (k->flags & TR__F_DEPRECATED) {
        tr__cfg_warn(w, kp, "deprecated name; write '%s' instead", t->name);
    }
    if (vals[i])
        tr__cfg_error(w, path, "'%s' and '%s' are the same setting; keep only '%s'", as[i], k->name,
                      t->name);
    vals[i] = v;
    as[i] = k->name;
}

static void classify(tr__cfg_walk_t *w, const tr__cfg_section_t *sec, json_t *in, const char *path,
                     json_t **vals)
{
    const char *as[MAX_KEYS] = {0};
    const char *name;
    json_t *v;
    json_object_foreach(in, name, v)
    {
        const tr__cfg_key_t *k = tr__cfg_find(sec, name);
        if (!k) {
            unknown_key(w, sec, path, name);
        } else if (k->kind == TR__K_ALIAS) {
            take_alias(w, sec, k, v, path, vals, as);
        } else {
            size_t i = (size_t)(k - sec->keys);
            if (vals[i])
                tr__cfg_error(w, path, "'%s' and '%s' are the same setting; keep only '%s'", as[i],
                              name, name);
            vals[i] = v;
            as[i] = k->name;
        }
    }
}

static void ignored_key(tr__cfg_walk_t *w, const tr__cfg_key_t *k, const char *kp, json_t *v,
                        json_t *out)
{
    if (k->flags & TR__F_IF_ENABLED && json_is_object(v) &&
        json_is_true(json_object_get(v, "enabled"))) {
        tr__cfg_error(w, kp,
                      "enabled, but Troupe does not support %s; remove the section or set "
                      "\"enabled\": false",
                      k->doc);
        return;
    }
    tr__cfg_warn(w, kp, "not supported by Troupe (%s); ignored", k->doc);
    put(w, out, k, kp, json_incref(v), "ignored");
}

static void section_key(tr__cfg_walk_t *w, const tr__cfg_key_t *k, const char *kp, json_t *v,
                        json_t *out)
{
    if (v && !json_is_object(v)) {
        mistyped(w, k, kp, v);
        v = NULL;
    }
    if (!v && k->flags & TR__F_OPTIONAL) return;
    json_t *sub = json_object();
    json_object_set_new(out, k->name, sub);
    walk_section(w, k->sub, v, sub, kp, v != NULL);
}

static void variant_key(tr__cfg_walk_t *w, const tr__cfg_key_t *k, const char *kp, json_t *v,
                        json_t *out)
{
    int t = *(int *)((char *)w->cfg + k->variant_of);
    if (v && !json_is_object(v)) {
        mistyped(w, k, kp, v);
        v = NULL;
    }
    if (t <= 0) /* the type is missing or wrong, and already reported */
        return;
    json_t *sub = json_object();
    json_object_set_new(out, k->name, sub);
    walk_section(w, k->variants[t], v, sub, kp, true);
}

static void resolve_key(tr__cfg_walk_t *w, const tr__cfg_key_t *k, json_t *v, const char *path,
                        json_t *out, bool present)
{
    char kp[512];
    join(kp, sizeof(kp), path, k->name);
    switch (k->kind) {
    case TR__K_SECTION:
        section_key(w, k, kp, v, out);
        break;
    case TR__K_VARIANT:
        variant_key(w, k, kp, v, out);
        break;
    case TR__K_ALIAS:
        break; /* its value went to the key it stands for */
    case TR__K_IGNORED:
        if (v) ignored_key(w, k, kp, v, out);
        break;
    case TR__K_REJECT:
        if (v) tr__cfg_error(w, kp, "%s", k->doc);
        break;
    default:
        resolve_leaf(w, k, kp, v, out, present);
    }
}

static void walk_section(tr__cfg_walk_t *w, const tr__cfg_section_t *sec, json_t *in, json_t *out,
                         const char *path, bool present)
{
    json_t *vals[MAX_KEYS] = {0};
    assert(sec->n_keys <= MAX_KEYS); /* the schema table's own limit */
    if (in) classify(w, sec, in, path, vals);
    for (size_t i = 0; i < sec->n_keys; i++)
        resolve_key(w, &sec->keys[i], vals[i], path, out, present);
}

void tr__cfg_walk(tr__cfg_walk_t *w, json_t *root)
{
    walk_section(w, &tr__cfg_top, root, w->tree, "", true);
}
