/* agree.c: the ranks' agreement on their resolved config (agree.h).
 *
 * What is agreed on: the resolved tree (defaults filled in, the batch triple resolved for the
 * world size) less the keys that only say how one process runs and what it writes about itself,
 * which may differ from rank to rank without changing what the ranks compute together:
 * PER_PROCESS below (worker threads and the scheduler, tracing, the log level, the aio tuning,
 * the monitors' outputs, the comms logger and the NVMe paths, which are per node).
 *
 * The protocol, on a group split off the caller's comm: an all-gather of every rank's
 * (hash, length); when a hash differs, an all-gather of every rank's shared JSON, so that every
 * rank builds the same explanation (each differing rank against rank 0, key by key) and fails
 * with it. The operations are the backend's non-blocking ones, polled here to completion.
 */
#include "runtime/config/agree.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/errf.h"
#include "runtime/config/walk.h"
#include "troupe/runtime.h"

/* The keys (dotted paths of the resolved tree) a rank may set on its own. */
static const char *const PER_PROCESS[] = {
    "troupe.runtime",
    "troupe.trace",
    "troupe.log_level",
    "aio",
    "csv_monitor",
    "tensorboard",
    "comms_logger",
    "zero_optimization.offload_optimizer.nvme_path",
    "zero_optimization.offload_param.nvme_path",
};

static void drop_path(json_t *tree, const char *path)
{
    char parent[256];
    const char *dot = strrchr(path, '.');
    if (!dot) {
        json_object_del(tree, path);
        return;
    }
    snprintf(parent, sizeof(parent), "%.*s", (int)(dot - path), path);
    json_t *p = tr__cfg_tree_get(tree, parent);
    if (json_is_object(p)) json_object_del(p, dot + 1);
}

char *tr__config_shared_json(const tr_config_t *cfg)
{
    json_t *tree = json_deep_copy(cfg->priv_->tree);
    if (!tree) return NULL;
    for (size_t i = 0; i < sizeof(PER_PROCESS) / sizeof(PER_PROCESS[0]); i++)
        drop_path(tree, PER_PROCESS[i]);
    char *s = json_dumps(tree, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(tree);
    return s;
}

uint64_t tr__config_hash_text(const char *text)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)(text ? text : ""); *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return h;
}

/* --- explaining a difference ---------------------------------------------------------------- */

typedef struct text {
    char *s;
    size_t len, cap;
} text_t;

__attribute__((format(printf, 2, 3))) static void put(text_t *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = t->len < t->cap ? vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap) : 0;
    va_end(ap);
    t->len += n > 0 ? (size_t)n : 0;
    if (t->len >= t->cap) t->len = t->cap ? t->cap - 1 : 0;
}

static void put_value(text_t *t, json_t *v)
{
    char *s = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(15)) : NULL;
    put(t, "%s", s ? s : "(absent)");
    free(s);
}

/* Every leaf of a (rank 0's) and b whose values differ, as "path a vs b", after sep. */
static void diff_object(text_t *t, json_t *a, json_t *b, const char *path, int *n)
{
    const char *key;
    json_t *va;
    char sub[512];
    json_object_foreach(a, key, va)
    {
        json_t *vb = json_object_get(b, key);
        snprintf(sub, sizeof(sub), "%s%s%s", path, *path ? "." : "", key);
        if (json_is_object(va) && json_is_object(vb)) {
            diff_object(t, va, vb, sub, n);
        } else if (!vb || !json_equal(va, vb)) {
            put(t, "%s%s ", (*n)++ ? ", " : "", sub);
            put_value(t, va);
            put(t, " vs ");
            put_value(t, vb);
        }
    }
    json_object_foreach(b, key, va) if (!json_object_get(a, key))
    {
        snprintf(sub, sizeof(sub), "%s%s%s", path, *path ? "." : "", key);
        put(t, "%s%s (absent) vs ", (*n)++ ? ", " : "", sub);
        put_value(t, va);
    }
}

/* "rank r's config differs from rank 0's: key a vs b, ..." for each rank whose text differs. */
static void explain(text_t *t, const char *const *texts, int world)
{
    json_t *zero = json_loads(texts[0], 0, NULL);
    for (int r = 1; r < world; r++) {
        if (!strcmp(texts[r], texts[0])) continue;
        json_t *other = json_loads(texts[r], 0, NULL);
        int n = 0;
        put(t, "%srank %d's config differs from rank 0's: ", t->len ? "; " : "", r);
        if (zero && other) diff_object(t, zero, other, "", &n);
        if (!n) put(t, "(its resolved config could not be compared key by key)");
        json_decref(other);
    }
    json_decref(zero);
}

/* --- the collectives ------------------------------------------------------------------------ */

typedef struct waiter {
    int pending;
    int rc;
} waiter_t;

static void op_done(void *arg, uint64_t req, uint64_t tag, int rc)
{
    waiter_t *w = arg;
    (void)req;
    (void)tag;
    w->pending--;
    if (rc < 0 && !w->rc) w->rc = rc;
}

/* Polls c until the operation started (rc) completes, for up to timeout_s. */
static int finish(tr_comm_t *c, waiter_t *w, int rc, double timeout_s, const char *what, char *err,
                  size_t errlen)
{
    if (rc < 0)
        return tr__errf(err, errlen, rc, "config agreement: %s: %s", what,
                        c->error[0] ? c->error : tr_strerror(rc));
    uint64_t t0 = tr_now_ns();
    while (w->pending > 0) {
        int left = c->ops->progress ? c->ops->progress(c) : 0;
        if (left < 0)
            return tr__errf(err, errlen, left, "config agreement: %s: %s", what, c->error);
        if (w->pending <= 0) break;
        if ((double)(tr_now_ns() - t0) * 1e-9 > timeout_s)
            return tr__errf(err, errlen, TR_ETIMEDOUT,
                            "config agreement: %s: a rank did not take part within %.0f s "
                            "(troupe.comm.timeout_s)",
                            what, timeout_s);
        nanosleep(&(struct timespec){0, 50000}, NULL);
    }
    return w->rc < 0 ? tr__errf(err, errlen, w->rc, "config agreement: %s: %s", what, c->error) : 0;
}

/* Every rank's shared text, gathered on g and explained; hash_len: each rank's (hash, length
 * with its NUL), as the hashes' all-gather left them. */
static int gather_and_explain(tr_comm_t *g, waiter_t *w, const char *mine, const uint64_t *hash_len,
                              double timeout_s, char *err, size_t errlen)
{
    int world = g->world;
    size_t *counts = calloc((size_t)world, sizeof(size_t)), total = 0, at = 0;
    const char **texts = calloc((size_t)world, sizeof(char *));
    for (int r = 0; counts && r < world; r++) {
        counts[r] = (size_t)hash_len[2 * r + 1];
        total += counts[r];
    }
    char *all = counts && texts ? malloc(total) : NULL;
    if (!all) {
        free(counts);
        free(texts);
        return tr__errf(err, errlen, TR_ENOMEM, "config agreement: out of memory");
    }
    for (int r = 0; r < world; r++) {
        texts[r] = all + at;
        if (r == g->rank) memcpy(all + at, mine, counts[r]);
        at += counts[r];
    }
    uint64_t req;
    w->pending = 1;
    int rc = g->ops->all_gather_v(g, all, counts, TR_DTYPE_U8, &req);
    rc = finish(g, w, rc, timeout_s, "gathering the ranks' configs", err, errlen);
    for (int r = 0; rc == 0 && r < world; r++)
        if (counts[r] == 0 || texts[r][counts[r] - 1] != '\0') rc = TR_EFORMAT;
    if (rc == TR_EFORMAT) tr__errf(err, errlen, rc, "config agreement: a rank's config is garbled");
    if (rc == 0) {
        text_t t = {.s = err, .cap = errlen};
        explain(&t, texts, world);
        put(&t, " (every rank must run with the same config; only %s", PER_PROCESS[0]);
        for (size_t i = 1; i < sizeof(PER_PROCESS) / sizeof(PER_PROCESS[0]); i++)
            put(&t, ", %s", PER_PROCESS[i]);
        put(&t, " may differ)");
        rc = TR_ECONFIG;
    }
    free(all);
    free(counts);
    free(texts);
    return rc;
}

static int agree_on(tr_comm_t *g, waiter_t *w, const char *mine, double timeout_s, char *err,
                    size_t errlen)
{
    int world = g->world;
    uint64_t me[2] = {tr__config_hash_text(mine), strlen(mine) + 1};
    uint64_t *all = calloc((size_t)world * 2, sizeof(uint64_t)), req;
    if (!all) return tr__errf(err, errlen, TR_ENOMEM, "config agreement: out of memory");
    w->pending = 1;
    int rc = g->ops->all_gather(g, me, all, sizeof(me), TR_DTYPE_U8, &req);
    rc = finish(g, w, rc, timeout_s, "exchanging the config hashes", err, errlen);
    bool same = true;
    for (int r = 0; rc == 0 && r < world; r++)
        same = same && all[2 * r] == me[0];
    if (rc == 0 && !same) rc = gather_and_explain(g, w, mine, all, timeout_s, err, errlen);
    free(all);
    return rc;
}

int tr__config_agree(const tr_config_t *cfg, tr_comm_t *comm, double timeout_s, char *err,
                     size_t errlen)
{
    if (comm->world < 2) return 0;
    char why[256] = "";
    tr_comm_t *g = NULL;
    int rc = tr_comm_split(comm, 0, comm->rank, &g, why, sizeof(why));
    if (rc < 0) return tr__errf(err, errlen, rc, "config agreement: its group: %s", why);
    waiter_t w = {0};
    g->done = op_done;
    g->done_arg = &w;
    char *mine = tr__config_shared_json(cfg);
    rc = mine ? agree_on(g, &w, mine, timeout_s > 0 ? timeout_s : 300, err, errlen)
              : tr__errf(err, errlen, TR_ENOMEM, "config agreement: out of memory");
    free(mine);
    tr_comm_destroy(g);
    return rc;
}
