/* dump.c: the resolved configuration as indented JSON, keys in schema order, every
 * default filled in. With TR_CONFIG_DUMP_MARK, each value that was not written in the file
 * ends its line with a comment saying where it came from ("// default"). */
#include "runtime/config/walk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PATH_MAX_LEN 1024

typedef struct dumper {
    FILE *f;
    json_t *origins;
    bool mark;
} dumper_t;

static void print_json(dumper_t *d, json_t *v)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(15));
    fputs(s ? s : "null", d->f);
    free(s);
}

static void print_key(dumper_t *d, const char *key, int depth)
{
    json_t *k = json_string(key);
    fprintf(d->f, "%*s", depth * 2, "");
    print_json(d, k);
    fputs(": ", d->f);
    json_decref(k);
}

static void print_object(dumper_t *d, json_t *obj, char *path, size_t plen, int depth)
{
    const char *key;
    json_t *v;
    size_t i = 0, n = json_object_size(obj);
    if (n == 0) {
        fputs("{}", d->f);
        return;
    }
    fputs("{\n", d->f);
    json_object_foreach(obj, key, v)
    {
        size_t len = plen + (plen ? 1 : 0) + strlen(key);
        if (len < PATH_MAX_LEN)
            snprintf(path + plen, PATH_MAX_LEN - plen, "%s%s", plen ? "." : "", key);
        const char *origin = json_string_value(json_object_get(d->origins, path));
        print_key(d, key, depth + 1);
        if (json_is_object(v) && !origin)
            print_object(d, v, path, len < PATH_MAX_LEN ? len : plen, depth + 1);
        else
            print_json(d, v);
        fputs(++i < n ? "," : "", d->f);
        if (d->mark && origin) fprintf(d->f, "  // %s", origin);
        fputc('\n', d->f);
        path[plen] = 0;
    }
    fprintf(d->f, "%*s}", depth * 2, "");
}

char *tr_config_dump(const tr_config_t *cfg, unsigned flags)
{
    char *text = NULL, path[PATH_MAX_LEN] = "";
    size_t size = 0;
    dumper_t d = {.f = open_memstream(&text, &size),
                  .origins = cfg->priv_->origins,
                  .mark = flags & TR_CONFIG_DUMP_MARK};
    if (!d.f) return NULL;
    print_object(&d, cfg->priv_->tree, path, 0, 0);
    fputc('\n', d.f);
    if (fclose(d.f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}
