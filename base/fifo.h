/* fifo.h: a growable first-in first-out queue of fixed-size items (a ring that doubles when
 * full), for an actor's own backlog. Not thread-safe: one owner. */
#ifndef TR_BASE_FIFO_H
#define TR_BASE_FIFO_H

#include <stdlib.h>
#include <string.h>

typedef struct tr__fifo {
    unsigned char *items;
    size_t size; /* bytes per item */
    size_t head, len, cap;
} tr__fifo_t;

static inline void tr__fifo_init(tr__fifo_t *q, size_t size)
{
    *q = (tr__fifo_t){.size = size};
}

/* Appends a copy of *item. 0, or -1 without memory (the queue unchanged). */
static inline int tr__fifo_push(tr__fifo_t *q, const void *item)
{
    if (q->len == q->cap) {
        size_t cap = q->cap ? 2 * q->cap : 16;
        unsigned char *n = malloc(cap * q->size);
        if (!n) return -1;
        for (size_t k = 0; k < q->len; k++)
            memcpy(n + k * q->size, q->items + (q->head + k) % q->cap * q->size, q->size);
        free(q->items);
        q->items = n;
        q->cap = cap;
        q->head = 0;
    }
    memcpy(q->items + (q->head + q->len++) % q->cap * q->size, item, q->size);
    return 0;
}

/* The oldest item (NULL when empty); valid until the next push or pop. */
static inline void *tr__fifo_front(const tr__fifo_t *q)
{
    return q->len ? q->items + q->head * q->size : NULL;
}

static inline void tr__fifo_pop(tr__fifo_t *q)
{
    if (!q->len) return;
    q->head = (q->head + 1) % q->cap;
    q->len--;
}

static inline void tr__fifo_free(tr__fifo_t *q)
{
    free(q->items);
    tr__fifo_init(q, q->size);
}

#endif
