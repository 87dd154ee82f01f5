/* A key's state against the code: every key the schema calls "no effect yet" has a field in
 * tr_config_t that no source outside the config loader reads, and every key it calls acted
 * upon has a field that some source reads. The sources are the library's and the tools' (not
 * tests/, bench/, nor the loader's own files, which read every field to check, dump and
 * document it); a read is a member access naming the field exactly (`zero.stage`,
 * `cfg->aio.queue_depth`) or, in a file that names the field's struct type
 * (tr_config_aio_t), the member itself (`c->queue_depth`), outside comments and string
 * literals and not the left side of an assignment. Issue 40: the `aio` keys were read by the
 * swapper while the docs and `troupe config check` said "no effect yet". */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/config/schema.h"

/* --- the sources, comments blanked ------------------------------------------------------- */

typedef struct {
    char *path; /* relative to TR_SRC */
    char *text;
} source_t;

static source_t *sources;
static size_t n_sources, cap_sources;

/* The loader: it reads every field to validate, resolve, dump and document it. */
static const char *const loader_files[] = {"runtime/config/schema.c",
                                           "runtime/config/walk.c",
                                           "runtime/config/config.c",
                                           "runtime/config/resolve.c",
                                           "runtime/config/dump.c",
                                           "runtime/config/docs.c",
                                           "runtime/config/diag.c",
                                           "runtime/config/schema.h",
                                           "runtime/config/walk.h",
                                           "include/troupe/config.h",
                                           NULL};
static const char *const skipped_dirs[] = {"build", "tests", "bench", "docs", ".git", NULL};

static void blank_comments_and_strings(char *s)
{
    for (char *p = s; *p; p++) {
        if (*p == '"' || *p == '\'') { /* a literal: blanked too (a key's path in a string,
                                        * e.g. agree.c's per-process keys, reads nothing) */
            char q = *p;
            for (p++; *p && *p != q; p++) {
                if (*p == '\\' && p[1]) *p++ = ' ';
                if (*p != '\n') *p = ' ';
            }
            if (!*p) return;
        } else if (p[0] == '/' && p[1] == '*') {
            char *e = strstr(p + 2, "*/");
            char *end = e ? e + 2 : p + strlen(p);
            for (; p < end; p++)
                if (*p != '\n') *p = ' ';
            p--;
        } else if (p[0] == '/' && p[1] == '/') {
            for (; *p && *p != '\n'; p++)
                *p = ' ';
            if (!*p) return;
        }
    }
}

static int add_source(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    if (ftw->level == 0) return FTW_CONTINUE;
    const char *rel = path + strlen(TR_SRC) + 1;
    if (type == FTW_D) {
        for (int i = 0; skipped_dirs[i]; i++)
            if (ftw->level == 1 && !strncmp(rel, skipped_dirs[i], strlen(skipped_dirs[i])))
                return FTW_SKIP_SUBTREE;
        return FTW_CONTINUE;
    }
    size_t len = strlen(path);
    if (type != FTW_F || len < 2 || path[len - 2] != '.' ||
        (path[len - 1] != 'c' && path[len - 1] != 'h'))
        return FTW_CONTINUE;
    for (int i = 0; loader_files[i]; i++)
        if (!strcmp(rel, loader_files[i])) return FTW_CONTINUE;
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *text = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&text, &size);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, n, m);
    fclose(f);
    fclose(m);
    blank_comments_and_strings(text);
    if (n_sources == cap_sources) {
        cap_sources = cap_sources ? 2 * cap_sources : 256;
        sources = realloc(sources, cap_sources * sizeof(*sources));
        assert_non_null(sources);
    }
    sources[n_sources].path = strdup(rel);
    sources[n_sources++].text = text;
    return FTW_CONTINUE;
}

static int load_sources(void **state)
{
    (void)state;
    if (nftw(TR_SRC, add_source, 32, FTW_PHYS | FTW_ACTIONRETVAL) != 0) return -1;
    return n_sources > 100 ? 0 : -1;
}

static int free_sources(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_sources; i++) {
        free(sources[i].path);
        free(sources[i].text);
    }
    free(sources);
    return 0;
}

/* --- reads of a field ----------------------------------------------------------------------- */

/* The struct type that holds the members of section path (dots), where it has a name. */
static const char *holder_type(const char *section)
{
    static const char *const types[][2] = {
        {"zero", "tr_config_zero_t"},
        {"zero.offload_optimizer", "tr_config_offload_optimizer_t"},
        {"zero.offload_param", "tr_config_offload_param_t"},
        {"fp16", "tr_config_fp16_t"},
        {"bf16", "tr_config_bf16_t"},
        {"optimizer", "tr_config_optimizer_t"},
        {"scheduler", "tr_config_scheduler_t"},
        {"aio", "tr_config_aio_t"},
        {"csv_monitor", "tr_config_monitor_t"},
        {"tensorboard", "tr_config_monitor_t"},
        {"comms_logger", "tr_config_comms_logger_t"},
        {"pipeline", "tr_config_pipeline_t"},
        {"activation_checkpointing", "tr_config_activation_checkpointing_t"},
        {"checkpoint", "tr_config_checkpoint_t"},
        {"troupe", "tr_config_troupe_t"},
    };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (!strcmp(section, types[i][0])) return types[i][1];
    return NULL;
}

static bool is_ident(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* Whether text has a member access ending in member, not assigned to; when parent is not
 * NULL, the access must be parent.member or parent->member. Sets *where to the match. */
static bool reads_member(const char *text, const char *parent, const char *member,
                         const char **where)
{
    regex_t re;
    char pat[512];
    if (parent)
        snprintf(pat, sizeof pat, "(^|[^A-Za-z0-9_])%s[[:space:]]*(\\.|->)[[:space:]]*%s", parent,
                 member);
    else
        snprintf(pat, sizeof pat, "(\\.|->)[[:space:]]*%s", member);
    assert_int_equal(regcomp(&re, pat, REG_EXTENDED), 0);
    bool found = false;
    const char *p = text;
    regmatch_t m;
    while (!found && regexec(&re, p, 1, &m, p == text ? 0 : REG_NOTBOL) == 0) {
        const char *end = p + m.rm_eo;
        const char *q = end;
        while (*q == ' ' || *q == '\t')
            q++;
        bool assigned = q[0] == '=' && q[1] != '=';
        if (!is_ident(*end) && !assigned) {
            found = true;
            *where = p + m.rm_so;
        }
        p = end;
    }
    regfree(&re);
    return found;
}

/* Where field (dotted, from tr_config_t) is read: "path:line", or false. */
static bool field_is_read(const char *field, char *at, size_t n)
{
    char section[256];
    snprintf(section, sizeof section, "%s", field);
    char *dot = strrchr(section, '.');
    const char *member = dot ? dot + 1 : field;
    if (dot) *dot = '\0';
    const char *parent_dot = dot ? strrchr(section, '.') : NULL;
    const char *parent = !dot ? NULL : parent_dot ? parent_dot + 1 : section;
    /* the holder: its type's name, or for an anonymous struct (optimizer.params) the access
     * to it, as in `__typeof__(c->optimizer.params) *p = &c->optimizer.params` */
    const char *type = !dot ? NULL : holder_type(section) ? holder_type(section) : section;
    for (size_t i = 0; i < n_sources; i++) {
        const char *text = sources[i].text, *where = NULL;
        bool read = reads_member(text, parent, member, &where) ||
                    (type && strstr(text, type) && reads_member(text, NULL, member, &where));
        if (!read) continue;
        int line = 1;
        for (const char *p = text; p < where; p++)
            line += *p == '\n';
        snprintf(at, n, "%s:%d", sources[i].path, line);
        return true;
    }
    return false;
}

/* --- every leaf key ------------------------------------------------------------------------- */

/* Acted-upon keys whose value the loader settles: no field read, and none needed. */
static const char *const settled[][2] = {
    {"data_types.grad_accum_dtype", "only fp32 is accepted, and Troupe accumulates in fp32"},
    {"bf16.immediate_grad_update", "Troupe always adds each layer's gradients into fp32 at once"},
};

static const char *settled_by_loader(const char *name)
{
    for (size_t i = 0; i < sizeof(settled) / sizeof(settled[0]); i++)
        if (!strcmp(name, settled[i][0])) return settled[i][1];
    return NULL;
}

static int wrong, checked, inert;

static void check_key(const tr__cfg_section_t *sec, const tr__cfg_key_t *k)
{
    if (k->kind == TR__K_SECTION || k->kind == TR__K_VARIANT || k->kind == TR__K_ALIAS ||
        k->kind == TR__K_IGNORED || k->kind == TR__K_REJECT)
        return;
    char name[256], at[512];
    snprintf(name, sizeof name, "%s%s%s", sec->name, sec->name[0] ? "." : "", k->name);
    if (!k->field) {
        print_message("%s: the schema names no field\n", name);
        wrong++;
        return;
    }
    checked++;
    bool read = field_is_read(k->field, at, sizeof at);
    if (k->state == TR__S_INERT) {
        inert++;
        if (read) {
            print_message("%s: state \"no effect yet\" (%s), but tr_config_t.%s is read at %s\n",
                          name, k->why, k->field, at);
            wrong++;
        }
    } else if (k->state == TR__S_ACTED && !read && !settled_by_loader(name)) {
        print_message("%s: state \"acted upon\", but no source reads tr_config_t.%s\n", name,
                      k->field);
        wrong++;
    }
}

static void walk(const tr__cfg_section_t *sec)
{
    for (size_t i = 0; i < sec->n_keys; i++) {
        const tr__cfg_key_t *k = &sec->keys[i];
        check_key(sec, k);
        if (k->kind == TR__K_SECTION) walk(k->sub);
        for (int v = 1; k->kind == TR__K_VARIANT && k->variants[v]; v++)
            walk(k->variants[v]);
    }
}

static void test_config_states_match_what_the_code_reads(void **state)
{
    (void)state;
    wrong = checked = inert = 0;
    walk(&tr__cfg_top);
    print_message("%d keys checked against %zu sources, %d with no effect yet\n", checked,
                  n_sources, inert);
    assert_true(checked > 150);
    assert_true(inert > 20);
    assert_int_equal(wrong, 0);
}

/* The matcher itself: an exact field, a typed pointer, comments, strings and assignments. */
static void test_config_states_matcher(void **state)
{
    (void)state;
    const char *w;
    char a[] = "x = cfg->aio.queue_depth;", b[] = "/* cfg->aio.queue_depth */ y = 1;",
         c[] = "cfg->aio.queue_depth = 3;", d[] = "n = cfg->aio.queue_depth2;",
         e[] = "if (cfg->aio . queue_depth == 3) f();",
         g[] = "const char *k = \"cfg->aio.queue_depth\\\"x\", *l = \"\";";
    blank_comments_and_strings(b);
    assert_true(reads_member(a, "aio", "queue_depth", &w));
    assert_false(reads_member(b, "aio", "queue_depth", &w));
    assert_false(reads_member(c, "aio", "queue_depth", &w));
    assert_false(reads_member(d, "aio", "queue_depth", &w));
    assert_true(reads_member(e, "aio", "queue_depth", &w));
    assert_false(reads_member(a, "zero", "queue_depth", &w));
    assert_true(reads_member("o = c->queue_depth;", NULL, "queue_depth", &w));
    blank_comments_and_strings(g); /* a path in a string reads nothing */
    assert_false(reads_member(g, "aio", "queue_depth", &w));
    assert_int_equal(strlen(g),
                     strlen("const char *k = \"cfg->aio.queue_depth\\\"x\", *l = \"\";"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_states_matcher),
        cmocka_unit_test(test_config_states_match_what_the_code_reads),
    };
    return cmocka_run_group_tests(tests, load_sources, free_sources);
}
