/* walltimer.c: DeepSpeed's SynchronizedWallClockTimer, for wall_clock_breakdown.
 *
 * A group of named timers that accumulate elapsed milliseconds between start and stop, and
 * the line DeepSpeed's engine logs with them: log_dist's "[Rank R] " prefix, "time (ms)",
 * then " | name: %.2f" for every requested timer that exists, in the order requested.
 * Not thread-safe: one group belongs to one engine thread.
 */
#include "troupe/monitor.h"

#include <stdlib.h>
#include <string.h>

typedef struct walltimer {
    char *name;
    int started;
    uint64_t start_ns;
    uint64_t elapsed_ns;
} walltimer_t;

struct tr_walltimers {
    walltimer_t *timers;
    size_t n, cap;
};

int tr_walltimers_create(tr_walltimers_t **out)
{
    *out = calloc(1, sizeof(**out));
    return *out ? 0 : TR_ENOMEM;
}

void tr_walltimers_destroy(tr_walltimers_t *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->n; i++)
        free(t->timers[i].name);
    free(t->timers);
    free(t);
}

static walltimer_t *find(tr_walltimers_t *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->timers[i].name, name)) return &t->timers[i];
    return NULL;
}

/* The timer called name, created (stopped, zero) when missing; NULL when out of memory. */
static walltimer_t *get(tr_walltimers_t *t, const char *name)
{
    walltimer_t *w = find(t, name);
    if (w) return w;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        walltimer_t *p = realloc(t->timers, cap * sizeof(*p));
        if (!p) return NULL;
        t->timers = p;
        t->cap = cap;
    }
    w = &t->timers[t->n];
    *w = (walltimer_t){.name = strdup(name)};
    if (!w->name) return NULL;
    t->n++;
    return w;
}

int tr_walltimers_start(tr_walltimers_t *t, const char *name, uint64_t now_ns)
{
    walltimer_t *w = get(t, name);
    if (!w) return TR_ENOMEM;
    if (w->started) return TR_EINVAL;
    w->started = 1;
    w->start_ns = now_ns;
    return 0;
}

int tr_walltimers_stop(tr_walltimers_t *t, const char *name, uint64_t now_ns)
{
    walltimer_t *w = find(t, name);
    if (!w || !w->started) return TR_EINVAL;
    w->started = 0;
    w->elapsed_ns += now_ns - w->start_ns;
    return 0;
}

static double elapsed_ms(walltimer_t *w, int reset, uint64_t now_ns)
{
    uint64_t ns = w->elapsed_ns;
    if (w->started) { /* DeepSpeed stops, reads, and restarts a running timer */
        ns += now_ns - w->start_ns;
        w->start_ns = now_ns;
        w->elapsed_ns = ns;
    }
    if (reset) w->elapsed_ns = 0;
    return (double)ns / 1e6;
}

double tr_walltimers_elapsed_ms(tr_walltimers_t *t, const char *name, int reset, uint64_t now_ns)
{
    walltimer_t *w = find(t, name);
    return w ? elapsed_ms(w, reset, now_ns) : 0.0;
}

size_t tr_walltimers_log_line(tr_walltimers_t *t, unsigned rank, const char *const *names,
                              size_t n_names, double normalizer, int reset, uint64_t now_ns,
                              char *buf, size_t cap)
{
    size_t len = (size_t)snprintf(buf, cap, "[Rank %u] time (ms)", rank);
    for (size_t i = 0; i < n_names; i++) {
        walltimer_t *w = find(t, names[i]);
        if (!w) continue;
        double ms = elapsed_ms(w, reset, now_ns) / normalizer;
        len += (size_t)snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0,
                                " | %s: %.2f", names[i], ms);
    }
    return len;
}
