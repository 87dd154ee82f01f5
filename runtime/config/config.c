/* config.c: loading a DeepSpeed config. Reads the file (refusing directories and anything
 * over 16 MiB), parses it with jansson with duplicate keys rejected (syntax errors become
 * "file:line:column: message"), then walks it against the schema and resolves the rules that
 * span keys. Also the getters by dotted path and tr_config_destroy. */
#include "runtime/config/walk.h"
#include "runtime/comm/ranks.h"
#include "base/file.h"

#include <stdlib.h>
#include <string.h>

#define MAX_FILE_BYTES (16u << 20)

/* --- the resolved tree ------------------------------------------------------------------- */

json_t *tr__cfg_tree_get(json_t *tree, const char *path)
{
    char part[256];
    const char *p = path;
    json_t *v = tree;
    while (v && *p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (n >= sizeof(part)) return NULL;
        memcpy(part, p, n);
        part[n] = 0;
        v = json_is_object(v) ? json_object_get(v, part) : NULL;
        p += n + (dot != NULL);
    }
    return v;
}

void tr__cfg_tree_set(tr__cfg_walk_t *w, const char *path, json_t *v)
{
    const char *dot = strrchr(path, '.');
    json_t *parent = w->tree;
    if (dot) {
        char up[256];
        snprintf(up, sizeof(up), "%.*s", (int)(dot - path), path);
        parent = tr__cfg_tree_get(w->tree, up);
    }
    json_object_set_new(parent, dot ? dot + 1 : path, v);
}

/* --- loading ----------------------------------------------------------------------------- */

static int parse_failed(const char *name, const json_error_t *je, tr_config_diag_t *diag)
{
    tr__cfg_diag_add(diag, TR_CONFIG_ERROR, "%s:%d:%d: %s", name, je->line, je->column, je->text);
    return TR_ECONFIG;
}

static int walk_root(json_t *root, const char *name, int world, tr_config_t **out,
                     tr_config_diag_t *diag)
{
    tr_config_t *cfg = calloc(1, sizeof(*cfg));
    struct tr__config_priv *priv = calloc(1, sizeof(*priv));
    tr__cfg_walk_t w = {.cfg = cfg,
                        .diag = diag,
                        .file = name,
                        .tree = json_object(),
                        .origins = json_object(),
                        .scratch = json_array()};
    if (!cfg || !priv || !w.tree || !w.origins || !w.scratch || !(priv->source = strdup(name))) {
        free(cfg);
        free(priv ? priv->source : NULL);
        free(priv);
        json_decref(w.tree);
        json_decref(w.origins);
        json_decref(w.scratch);
        return TR_ENOMEM;
    }
    cfg->priv_ = priv;
    cfg->source = priv->source;
    cfg->world_size = cfg->ranks = world;
    priv->tree = w.tree;
    priv->origins = w.origins;
    size_t errors_before = diag->n_errors;
    tr__cfg_walk(&w, root);
    tr__cfg_resolve(&w);
    json_decref(w.scratch);
    if (diag->n_errors != errors_before) {
        tr_config_destroy(cfg);
        return TR_ECONFIG;
    }
    *out = cfg;
    return 0;
}

static int from_text(const char *json, size_t len, const char *name, int world, tr_config_t **cfg,
                     tr_config_diag_t *diag)
{
    if (len >= 3 && !memcmp(json, "\xEF\xBB\xBF", 3)) { /* a UTF-8 BOM, as some editors write */
        json += 3;
        len -= 3;
    }
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return parse_failed(name, &je, diag);
    int err;
    if (!json_is_object(root)) {
        tr__cfg_diag_add(diag, TR_CONFIG_ERROR,
                         "%s: the top level must be a JSON object, got "
                         "an array",
                         name);
        err = TR_ECONFIG;
    } else {
        err = walk_root(root, name, world, cfg, diag);
    }
    json_decref(root);
    return err;
}

int tr_config_from_string(const char *json, size_t len, const char *name, int world,
                          tr_config_t **cfg, tr_config_diag_t *diag)
{
    tr_config_diag_t scratch;
    tr_config_diag_init(&scratch);
    if (!diag) diag = &scratch;
    *cfg = NULL;
    name = name ? name : "<string>";
    int err = TR_EINVAL;
    tr_ranks_t ranks;
    char why[384];
    if (world == 0 && tr_ranks_discover(NULL, &ranks, why, sizeof(why)) < 0)
        tr__cfg_diag_add(diag, TR_CONFIG_ERROR, "%s: world size: %s", name, why);
    else if (world == 0 && (world = ranks.world) < 1)
        tr__cfg_diag_add(diag, TR_CONFIG_ERROR, "%s: world size must be >= 1", name);
    else if (world < 1)
        tr__cfg_diag_add(diag, TR_CONFIG_ERROR, "%s: world size must be >= 1, got %d", name, world);
    else if (!json && len)
        tr__cfg_diag_add(diag, TR_CONFIG_ERROR, "%s: no text given", name);
    else
        err = from_text(json ? json : "", len, name, world, cfg, diag);
    tr_config_diag_close(&scratch);
    return err;
}

/* Reads the file into *buf; a failure is added to diag as "<path>: ...". */
static int read_file(const char *path, char **buf, size_t *len, tr_config_diag_t *diag)
{
    char why[4400];
    int err = tr__file_read(path, MAX_FILE_BYTES, "a JSON file", buf, len, why, sizeof(why));
    if (err) tr__cfg_diag_add(diag, TR_CONFIG_ERROR, "%s", why);
    return err;
}

int tr_config_load(const char *path, int world, tr_config_t **cfg, tr_config_diag_t *diag)
{
    tr_config_diag_t scratch;
    tr_config_diag_init(&scratch);
    if (!diag) diag = &scratch;
    *cfg = NULL;
    char *buf = NULL;
    size_t len = 0;
    if (!path) {
        tr_config_diag_close(&scratch);
        return TR_EINVAL;
    }
    int err = read_file(path, &buf, &len, diag);
    if (err == 0) err = tr_config_from_string(buf, len, path, world, cfg, diag);
    free(buf);
    tr_config_diag_close(&scratch);
    return err;
}

void tr_config_destroy(tr_config_t *cfg)
{
    if (!cfg) return;
    if (cfg->priv_) {
        json_decref(cfg->priv_->tree);
        json_decref(cfg->priv_->origins);
        free(cfg->priv_->source);
        free(cfg->priv_);
    }
    free(cfg);
}

/* --- getters ----------------------------------------------------------------------------- */

static json_t *lookup(const tr_config_t *cfg, const char *path)
{
    return cfg && path ? tr__cfg_tree_get(cfg->priv_->tree, path) : NULL;
}

int tr_config_get_int(const tr_config_t *cfg, const char *path, int64_t *out)
{
    json_t *v = lookup(cfg, path);
    if (!v) return TR_ENOENT;
    if (!json_is_integer(v)) return TR_EINVAL;
    *out = json_integer_value(v);
    return 0;
}

int tr_config_get_double(const tr_config_t *cfg, const char *path, double *out)
{
    json_t *v = lookup(cfg, path);
    if (!v) return TR_ENOENT;
    if (!json_is_number(v)) return TR_EINVAL;
    *out = json_number_value(v);
    return 0;
}

int tr_config_get_bool(const tr_config_t *cfg, const char *path, bool *out)
{
    json_t *v = lookup(cfg, path);
    if (!v) return TR_ENOENT;
    if (!json_is_boolean(v)) return TR_EINVAL;
    *out = json_is_true(v);
    return 0;
}

int tr_config_get_string(const tr_config_t *cfg, const char *path, const char **out)
{
    json_t *v = lookup(cfg, path);
    if (!v) return TR_ENOENT;
    if (!json_is_string(v)) return TR_EINVAL;
    *out = json_string_value(v);
    return 0;
}

tr_config_origin_t tr_config_origin(const tr_config_t *cfg, const char *path)
{
    if (!lookup(cfg, path)) return TR_ORIGIN_UNKNOWN;
    const char *o = json_string_value(json_object_get(cfg->priv_->origins, path));
    if (!o) return TR_ORIGIN_GIVEN;
    if (!strcmp(o, "default")) return TR_ORIGIN_DEFAULT;
    if (!strcmp(o, "auto")) return TR_ORIGIN_AUTO;
    if (!strcmp(o, "derived")) return TR_ORIGIN_DERIVED;
    return TR_ORIGIN_IGNORED;
}
