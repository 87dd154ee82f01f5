/* The state of one configuration load, shared by the walker (walk.c), the resolver
 * (resolve.c) and the loader (config.c). Private to runtime/config/. */
#ifndef TR_RUNTIME_CONFIG_WALK_H
#define TR_RUNTIME_CONFIG_WALK_H

#include <jansson.h>
#include <stdint.h>

#include "runtime/config/schema.h"

enum { TR__BATCH_ABSENT, TR__BATCH_GIVEN, TR__BATCH_AUTO, TR__BATCH_BAD };
enum { TR__TB, TR__MB, TR__GAS };

/* What a loaded config keeps beyond its typed fields. */
struct tr__config_priv {
    json_t *tree;    /* resolved values, one object per section, in schema order */
    json_t *origins; /* dotted path -> "default" | "auto" | "derived" | "ignored" */
    char *source;
};

typedef struct tr__cfg_walk {
    tr_config_t *cfg;
    tr_config_diag_t *diag;
    const char *file;
    json_t *tree, *origins;
    json_t *scratch; /* values made up while walking (cpu_offload's object) */
    int batch_state[3];
    int64_t batch[3];
} tr__cfg_walk_t;

/* Walks root (an object) against the schema: fills cfg's fields, the resolved tree and the
 * origins, and reports every unknown, mistyped, out-of-range, deprecated and ignored key. */
void tr__cfg_walk(tr__cfg_walk_t *w, json_t *root);

/* After the walk: the batch triple, precision, ZeRO and cross-section rules. */
void tr__cfg_resolve(tr__cfg_walk_t *w);

/* Diagnostics for key path (may be ""): "file: path: [warning: |note: ]message". */
void tr__cfg_error(tr__cfg_walk_t *w, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void tr__cfg_warn(tr__cfg_walk_t *w, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void tr__cfg_note(tr__cfg_walk_t *w, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* What k accepts, in words ("an integer >= 1"); may use b. */
const char *tr__cfg_expectation(const tr__cfg_key_t *k, char *b, size_t n);

/* k's default as JSON (null for derived ones), also stored in w->cfg's field. */
json_t *tr__cfg_default_json(tr__cfg_walk_t *w, const tr__cfg_key_t *k);

/* Records where the value at path came from (a string constant: "default", ...). */
void tr__cfg_set_origin(tr__cfg_walk_t *w, const char *path, const char *origin);

/* Replaces the resolved value at a dotted path (which must exist); steals v. */
void tr__cfg_tree_set(tr__cfg_walk_t *w, const char *path, json_t *v);

/* The JSON value at a dotted path of tree, or NULL. */
json_t *tr__cfg_tree_get(json_t *tree, const char *path);

#endif
