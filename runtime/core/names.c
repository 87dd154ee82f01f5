/* names.c: the runtime's name registry, so a client addresses an actor by a name that
 * survives restarts instead of holding an address that a restart leaves stopped.
 *
 * Design: a chained hash table from name to slot index, under one mutex (lookups are a hash
 * and a short chain; names are for the few long-lived actors, not the hot path). A name is
 * claimed at spawn, before the actor is published, and freed by finish() before the
 * generation ends, so at any time a name names at most one slot. Lookup reads the slot's
 * generation (acquire, pairing with publish()'s release): an odd one is the live actor's
 * address; an even one (claimed, not yet published) is no actor yet. A restart in place
 * claims the name again for the same slot, so lookup answers the new generation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/core/internal.h"

#define INITIAL_BUCKETS 64u

typedef struct entry {
    struct entry *next;
    uint32_t slot;
    char name[TR__NAME_MAX];
} entry_t;

struct tr__names {
    pthread_mutex_t mu;
    entry_t **buckets; /* n_buckets, a power of two */
    size_t n_buckets, count;
};

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static entry_t **find(tr__names_t *n, const char *name)
{
    entry_t **p = &n->buckets[hash(name) & (n->n_buckets - 1)];
    while (*p && strcmp((*p)->name, name) != 0)
        p = &(*p)->next;
    return p;
}

/* Doubles the table; keeps the old one when out of memory (chains just get longer). */
static void grow(tr__names_t *n)
{
    size_t nb = n->n_buckets * 2;
    entry_t **b = calloc(nb, sizeof(*b));
    if (!b) return;
    for (size_t i = 0; i < n->n_buckets; i++)
        for (entry_t *e = n->buckets[i], *next; e; e = next) {
            next = e->next;
            entry_t **head = &b[hash(e->name) & (nb - 1)];
            e->next = *head;
            *head = e;
        }
    free(n->buckets);
    n->buckets = b;
    n->n_buckets = nb;
}

int tr__names_create(tr_runtime_t *rt)
{
    tr__names_t *n = calloc(1, sizeof(*n));
    if (!n || !(n->buckets = calloc(INITIAL_BUCKETS, sizeof(*n->buckets)))) {
        free(n);
        return TR_ENOMEM;
    }
    n->n_buckets = INITIAL_BUCKETS;
    pthread_mutex_init(&n->mu, NULL);
    rt->names = n;
    return 0;
}

void tr__names_destroy(tr_runtime_t *rt)
{
    tr__names_t *n = rt->names;
    if (!n) return;
    for (size_t i = 0; i < n->n_buckets; i++)
        for (entry_t *e = n->buckets[i], *next; e; e = next) {
            next = e->next;
            free(e);
        }
    free(n->buckets);
    pthread_mutex_destroy(&n->mu);
    free(n);
    rt->names = NULL;
}

int tr__names_claim(tr_runtime_t *rt, const char *name, uint32_t slot, uint32_t *holder)
{
    tr__names_t *n = rt->names;
    entry_t *e = malloc(sizeof(*e));
    if (!e) return TR_ENOMEM;
    snprintf(e->name, sizeof(e->name), "%s", name); /* the caller checked its length */
    e->slot = slot;
    pthread_mutex_lock(&n->mu);
    entry_t **p = find(n, name);
    int rc = 0;
    if (*p) {
        *holder = (*p)->slot;
        rc = (*p)->slot == slot ? 0 : TR_EEXIST; /* the same slot claiming again: fine */
    } else {
        e->next = NULL;
        *p = e;
        e = NULL;
        if (++n->count > n->n_buckets) grow(n);
    }
    pthread_mutex_unlock(&n->mu);
    free(e);
    return rc;
}

void tr__names_release(tr_runtime_t *rt, const char *name, uint32_t slot)
{
    tr__names_t *n = rt->names;
    entry_t *dead = NULL;
    pthread_mutex_lock(&n->mu);
    entry_t **p = find(n, name);
    if (*p && (*p)->slot == slot) {
        dead = *p;
        *p = dead->next;
        n->count--;
    }
    pthread_mutex_unlock(&n->mu);
    free(dead);
}

tr_actor_t tr_actor_lookup(tr_runtime_t *rt, const char *name)
{
    if (!rt || !name || !name[0]) return TR_ACTOR_NONE;
    tr__names_t *n = rt->names;
    tr_actor_t out = TR_ACTOR_NONE;
    pthread_mutex_lock(&n->mu);
    entry_t *e = *find(n, name);
    if (e) {
        tr__actor_t *a = tr__slot(rt, e->slot);
        /* acquire: pairs with publish()'s release of a new generation */
        uint32_t gen = atomic_load_explicit(&a->gen, memory_order_acquire);
        if (gen & 1) out = tr__actor_id(gen, e->slot);
    }
    pthread_mutex_unlock(&n->mu);
    return out;
}

int tr_actor_send_name(tr_runtime_t *rt, const char *name, tr_msg_t *msg)
{
    if (!rt || !name || !msg) return TR_EINVAL;
    tr_actor_t to = tr_actor_lookup(rt, name);
    if (tr_actor_is_none(to))
        return tr__error(TR_ENOACTOR,
                         "cannot send '%s' to actor '%s': no live actor has that "
                         "name (never spawned, stopped, or not yet restarted)",
                         tr_msg_type_name(msg->type), name);
    return tr_actor_send(rt, to, msg);
}
