/* runq.c: a worker's bounded run queue with stealing, and the global inject queue.
 *
 * Local queue design: positions are free-running 32-bit counters; slot = position % CAP.
 * - The owner writes slots[tail] (relaxed) then publishes it by storing tail + 1 (release).
 * - Consumers (the owner, thieves) read head (acquire) and tail (acquire; pairs with the
 *   owner's release), read the slots they want, and claim them with one CAS on head
 *   (acq_rel). A slot read before a successful CAS cannot have been overwritten: the owner
 *   only writes slots[t] when t - head < CAP, and head did not move before the CAS.
 * - The owner's fullness check may use a stale (smaller) head, which only makes it think
 *   the queue fuller than it is.
 */
#include "mailbox/runq.h"

#define MASK (TR__RUNQ_CAP - 1)

void tr__runq_init(tr__runq_t *q)
{
    atomic_init(&q->head, 0);
    atomic_init(&q->tail, 0);
    for (uint32_t i = 0; i < TR__RUNQ_CAP; i++)
        atomic_init(&q->slots[i], NULL);
}

bool tr__runq_push(tr__runq_t *q, void *item)
{
    uint32_t t = atomic_load_explicit(&q->tail, memory_order_relaxed);
    /* acquire: pairs with consumers' CAS, so their reads of the slot precede our overwrite */
    uint32_t h = atomic_load_explicit(&q->head, memory_order_acquire);
    if (t - h >= TR__RUNQ_CAP) return false;
    atomic_store_explicit(&q->slots[t & MASK], item, memory_order_relaxed);
    /* seq_cst: publishes the slot to consumers' acquire load of tail, and orders it before
     * the scheduler's seq_cst read of the idle count (runtime/core/sched.c) */
    atomic_store_explicit(&q->tail, t + 1, memory_order_seq_cst);
    return true;
}

void *tr__runq_pop(tr__runq_t *q)
{
    uint32_t h = atomic_load_explicit(&q->head, memory_order_acquire);
    for (;;) {
        /* acquire: pairs with the owner's release store of tail */
        uint32_t t = atomic_load_explicit(&q->tail, memory_order_acquire);
        if (h == t) return NULL;
        void *item = atomic_load_explicit(&q->slots[h & MASK], memory_order_relaxed);
        /* acq_rel: claims the slot; on failure h is reloaded */
        if (atomic_compare_exchange_weak_explicit(&q->head, &h, h + 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            return item;
    }
}

uint32_t tr__runq_len(tr__runq_t *q)
{
    uint32_t t = atomic_load_explicit(&q->tail, memory_order_seq_cst);
    uint32_t h = atomic_load_explicit(&q->head, memory_order_seq_cst);
    return t - h;
}

void *tr__runq_steal(tr__runq_t *dst, tr__runq_t *src)
{
    void *batch[TR__RUNQ_CAP / 2];
    uint32_t h = atomic_load_explicit(&src->head, memory_order_acquire);
    for (;;) {
        uint32_t t = atomic_load_explicit(&src->tail, memory_order_acquire);
        uint32_t n = t - h;
        if (n == 0) return NULL;
        if (n > TR__RUNQ_CAP) { /* head moved on between our two loads: read it again */
            h = atomic_load_explicit(&src->head, memory_order_acquire);
            continue;
        }
        n -= n / 2;
        uint32_t room = TR__RUNQ_CAP - tr__runq_len(dst);
        if (n > room + 1) n = room + 1;
        if (n > TR__RUNQ_CAP / 2) n = TR__RUNQ_CAP / 2;
        for (uint32_t i = 0; i < n; i++)
            batch[i] = atomic_load_explicit(&src->slots[(h + i) & MASK], memory_order_relaxed);
        if (atomic_compare_exchange_weak_explicit(&src->head, &h, h + n, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            for (uint32_t i = 1; i < n; i++)
                tr__runq_push(dst, batch[i]);
            return batch[0];
        }
    }
}

uint32_t tr__runq_take_half(tr__runq_t *q, void **out, uint32_t max)
{
    uint32_t n = tr__runq_len(q) / 2;
    if (n > max) n = max;
    uint32_t got = 0;
    while (got < n) {
        void *item = tr__runq_pop(q);
        if (!item) break;
        out[got++] = item;
    }
    return got;
}

void tr__inject_init(tr__inject_t *q)
{
    atomic_init(&q->stub.next, NULL);
    atomic_init(&q->tail, &q->stub);
    atomic_init(&q->head, &q->stub);
    atomic_init(&q->busy, 0);
}

void tr__inject_destroy(tr__inject_t *q)
{
    (void)q;
}

void tr__inject_push(tr__inject_t *q, tr__qnode_t **nodes, size_t n)
{
    if (n == 0) return;
    for (size_t i = 0; i + 1 < n; i++)
        atomic_store_explicit(&nodes[i]->next, nodes[i + 1], memory_order_relaxed);
    atomic_store_explicit(&nodes[n - 1]->next, NULL, memory_order_relaxed);
    /* seq_cst: the publication the parking protocol needs (runtime/core/sched.c); its release also
     * orders the links above before the link store below makes them reachable */
    tr__qnode_t *prev = atomic_exchange_explicit(&q->tail, nodes[n - 1], memory_order_seq_cst);
    /* release: pairs with the consumer's acquire load of prev->next */
    atomic_store_explicit(&prev->next, nodes[0], memory_order_release);
}

/* Vyukov's pop, by the consumer holding busy. head's stores are seq_cst, for
 * tr__inject_nonempty's loads. */
static tr__qnode_t *pop_locked(tr__inject_t *q)
{
    tr__qnode_t *head = atomic_load_explicit(&q->head, memory_order_relaxed);
    tr__qnode_t *next = atomic_load_explicit(&head->next, memory_order_acquire);
    if (head == &q->stub) {
        if (!next) return NULL;
        atomic_store_explicit(&q->head, next, memory_order_seq_cst);
        head = next;
        next = atomic_load_explicit(&next->next, memory_order_acquire);
    }
    if (next) {
        atomic_store_explicit(&q->head, next, memory_order_seq_cst);
        return head;
    }
    if (head != atomic_load_explicit(&q->tail, memory_order_acquire))
        return NULL; /* a push between its exchange and its link: soon */
    tr__qnode_t *stub = &q->stub;
    tr__inject_push(q, &stub, 1);
    next = atomic_load_explicit(&head->next, memory_order_acquire);
    if (!next) return NULL;
    atomic_store_explicit(&q->head, next, memory_order_seq_cst);
    return head;
}

tr__qnode_t *tr__inject_pop(tr__inject_t *q)
{
    if (!tr__inject_nonempty(q) ||
        /* acquire: the previous consumer's head, released by its store of busy */
        atomic_exchange_explicit(&q->busy, 1, memory_order_acquire))
        return NULL;
    tr__qnode_t *n = pop_locked(q);
    atomic_store_explicit(&q->busy, 0, memory_order_release);
    return n;
}
