/* runq: the scheduler's queues of runnable things (actors), knowing nothing of actors.
 *
 * tr__runq_t is one worker's local queue: a bounded ring that only its owner pushes to, and
 * that its owner and thieves pop from (FIFO). tr__inject_t is the global queue for threads
 * that are not workers (the main thread, the loop thread, pinned actors) and for a local
 * queue's overflow: Vyukov's intrusive multi-producer queue, where a push is one exchange on
 * the producers' tail (a line consumers only read to see whether anything is there) and one
 * link store, and consumers take turns through a try-lock (a worker that finds it taken looks
 * elsewhere and comes back).
 */
#ifndef TR_MAILBOX_RUNQ_H
#define TR_MAILBOX_RUNQ_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TR__RUNQ_CAP 256u

typedef struct tr__runq {
    _Atomic uint32_t head; /* consumers (owner and thieves), by CAS */
    char pad0_[60];
    _Atomic uint32_t tail; /* the owner only */
    char pad1_[60];
    _Atomic(void *) slots[TR__RUNQ_CAP];
} tr__runq_t;

void tr__runq_init(tr__runq_t *q);

/* Appends item. False when full. The owner only. */
bool tr__runq_push(tr__runq_t *q, void *item);

/* The oldest item or NULL. Any thread. */
void *tr__runq_pop(tr__runq_t *q);

/* Items queued now (a hint when read by another thread). Any thread. */
uint32_t tr__runq_len(tr__runq_t *q);

/* Moves about half of src's items into dst (owned by the caller) and returns one more item
 * for the caller to run, or NULL when src was empty. Any thread that owns dst. */
void *tr__runq_steal(tr__runq_t *dst, tr__runq_t *src);

/* Moves half of q's items into `out` (at most max) for spilling to the inject queue; returns
 * how many. The owner only. */
uint32_t tr__runq_take_half(tr__runq_t *q, void **out, uint32_t max);

/* A node embedded in whatever goes through the inject queue. */
typedef struct tr__qnode {
    struct tr__qnode *_Atomic next;
} tr__qnode_t;

typedef struct tr__inject {
    _Atomic(tr__qnode_t *) tail; /* the newest node: producers exchange it */
    char pad0_[64 - sizeof(void *)];
    _Atomic(tr__qnode_t *) head; /* the oldest (the stub when empty): written by the consumer
                                  * holding busy, read by tr__inject_nonempty */
    _Atomic int busy;            /* a consumer is popping */
    tr__qnode_t stub;
} tr__inject_t;

void tr__inject_init(tr__inject_t *q);
void tr__inject_destroy(tr__inject_t *q);

/* Appends n nodes (an array of pointers) in order. Its exchange is seq_cst: the scheduler's
 * parking protocol orders it before the pusher's read of the idle count. Any thread. */
void tr__inject_push(tr__inject_t *q, tr__qnode_t **nodes, size_t n);

/* The oldest node, or NULL: empty, another consumer is popping, or a push is between its
 * exchange and its link (tr__inject_nonempty then still says so: come back). Any thread. */
tr__qnode_t *tr__inject_pop(tr__inject_t *q);

/* Something was pushed and not popped: seq_cst loads of the tail and the head. Empty is the
 * stub alone, first and last; the stub last but not first is not empty (a consumer put it
 * back behind nodes pushed meanwhile). Any thread. */
static inline bool tr__inject_nonempty(tr__inject_t *q)
{
    return atomic_load_explicit(&q->tail, memory_order_seq_cst) != &q->stub ||
           atomic_load_explicit(&q->head, memory_order_seq_cst) != &q->stub;
}

#endif
