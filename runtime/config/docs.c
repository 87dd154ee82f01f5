/* docs.c: the key reference of docs/config.md, generated from the schema table so the
 * documentation cannot drift from what the reader accepts. One Markdown table per section:
 * key, what it accepts, its default, what it means; sections follow their parent. */
#include "runtime/config/walk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void default_text(const tr__cfg_key_t *k, tr__cfg_walk_t *w, char *b, size_t n)
{
    if (k->flags & TR__F_REQUIRED) {
        snprintf(b, n, "required");
        return;
    }
    if (k->flags & TR__F_BATCH) {
        snprintf(b, n, "derived");
        return;
    }
    if (k->flags & TR__F_DERIVED) {
        snprintf(b, n, "derived");
        return;
    }
    json_t *v = tr__cfg_default_json(w, k);
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(15));
    snprintf(b, n, "`%s`", s ? s : "null");
    free(s);
    json_decref(v);
}

/* The state column: what Troupe does with the key's value. */
static const char *state_cell(const tr__cfg_key_t *k, char *b, size_t n)
{
    if (k->kind == TR__K_SECTION || k->kind == TR__K_VARIANT) return "its keys'";
    if (k->kind == TR__K_ALIAS)
        return k->flags & TR__F_DEPRECATED ? "as its target; **warning**: deprecated"
                                           : "as its target";
    if (k->kind == TR__K_IGNORED) return "**warning**: not supported, ignored";
    if (k->state == TR__S_REJECTED) return "**error**";
    if (k->state != TR__S_INERT) return "acted upon";
    snprintf(b, n, "**no effect yet**: %s (a warning %s)", k->why,
             k->flags & TR__F_DERIVED ? "when given" : "unless the default");
    return b;
}

static void key_row(FILE *f, const tr__cfg_key_t *k, tr__cfg_walk_t *w)
{
    char e[256], d[128], st[512];
    const char *state = state_cell(k, st, sizeof(st));
    switch (k->kind) {
    case TR__K_SECTION:
    case TR__K_VARIANT:
        fprintf(f, "| `%s` | object | | %s | %s |\n", k->name, state, k->doc);
        return;
    case TR__K_ALIAS:
        fprintf(f, "| `%s` | as `%s` | | %s | %s |\n", k->name, k->alias_of, state, k->doc);
        return;
    case TR__K_IGNORED:
    case TR__K_REJECT:
        fprintf(f, "| `%s` | anything | | %s | %s |\n", k->name, state, k->doc);
        return;
    default:
        break;
    }
    default_text(k, w, d, sizeof(d));
    fprintf(f, "| `%s` | %s | %s | %s | %s |\n", k->name, tr__cfg_expectation(k, e, sizeof(e)), d,
            state, k->doc);
}

static void section_doc(FILE *f, const tr__cfg_section_t *sec, const char *title, tr__cfg_walk_t *w)
{
    fprintf(f,
            "### %s\n\n| key | accepts | default | state | meaning |\n"
            "| --- | --- | --- | --- | --- |\n",
            title);
    for (size_t i = 0; i < sec->n_keys; i++)
        key_row(f, &sec->keys[i], w);
    fputc('\n', f);
    for (size_t i = 0; i < sec->n_keys; i++) {
        const tr__cfg_key_t *k = &sec->keys[i];
        char t[256];
        if (k->kind == TR__K_SECTION) {
            snprintf(t, sizeof(t), "`%s`", k->sub->name);
            section_doc(f, k->sub, t, w);
        }
        for (int v = 1; k->kind == TR__K_VARIANT && k->variants[v]; v++) {
            const tr__cfg_key_t *type = &sec->keys[0]; /* "type" precedes "params" */
            snprintf(t, sizeof(t), "`%s` for `%s`", k->variants[v]->name, type->choices[v - 1]);
            section_doc(f, k->variants[v], t, w);
        }
    }
}

char *tr_config_reference(void)
{
    char *text = NULL;
    size_t size = 0;
    tr_config_t scratch;
    tr__cfg_walk_t w = {.cfg = &scratch};
    FILE *f = open_memstream(&text, &size);
    if (!f) return NULL;
    section_doc(f, &tr__cfg_top, "Top level", &w);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}
