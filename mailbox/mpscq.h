/* mpscq: the intrusive multi-producer single-consumer message queue behind every mailbox.
 *
 * Design (after Vyukov's intrusive MPSC queue and Pony's message queue):
 *
 *   producers ──exchange──▶ head ─▶ [m5] ◀─next─ [m4] ◀─ ... ◀─ [m1] ◀─next─ tail (consumer)
 *
 * - Producers: any thread. A push is one atomic exchange on `head` followed by one release
 *   store linking the previous head to the new chain. A chain of messages (already linked
 *   through tr_next_) is pushed with the same single exchange. The push also adds to a
 *   relaxed `pushed` counter on the same cache line (already owned after the exchange), which
 *   gives the mailbox depth (pushed - popped) without any work on the consumer's side.
 * - Consumer: exactly one thread at a time (the thread running the actor). A pop is a plain
 *   read of `tail` and an acquire load of tail->next; no read-modify-write per receive.
 *   The message a pop returns becomes the new `tail` (the queue's stub) and stays allocated
 *   until the next pop hands the previous tail back to the caller to free.
 * - Idle state folded into the queue: the low bit of `head` means "empty and not scheduled".
 *   When the consumer finds nothing to pop it tries tr__mpscq_mark_empty(), a CAS that sets
 *   the bit only if no push is in flight (head == tail). The producer whose exchange returns a
 *   marked pointer learns that the actor was idle and is the one, the only one, to schedule
 *   it. No other flag, lock or counter decides who schedules.
 * - A push that has exchanged `head` but not yet linked `prev->next` makes the queue look
 *   empty to the consumer while head != tail; mark_empty then fails and the caller must keep
 *   the actor scheduled (it will see the link shortly, unless the pusher was preempted in
 *   between: the runtime then yields its core every few empty tries, runtime/core/actor.c).
 *
 * Memory ordering, beside each atomic below:
 * - push exchange (seq_cst): release publishes the pushed messages' contents to the thread
 *   that will later read them via prev->next; acquire orders our store to prev->next after
 *   the previous producer's initialisation of prev (including its next = NULL); seq_cst puts
 *   an urgent push in the single order with the consumer's mark and its check of the urgent
 *   lane after it (runtime/core/actor.c), which acq_rel would not. x86's exchange is a full
 *   barrier either way.
 * - push link store (release): pairs with the consumer's acquire load of tail->next.
 * - mark_empty CAS (acq_rel, seq_cst for the urgent-lane check in the runtime): release
 *   publishes everything the consumer did while running the actor to the producer that
 *   observes the mark, who hands the actor to the next thread that runs it.
 */
#ifndef TR_MAILBOX_MPSCQ_H
#define TR_MAILBOX_MPSCQ_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "troupe/msg.h"

#define TR__MARK_EMPTY ((uintptr_t)1)

/* The producers' side: what senders write. Keep it on a cache line of its own. */
typedef struct tr__mpscq_head {
    _Atomic(uintptr_t) head;  /* newest message; low bit: marked empty (idle) */
    _Atomic(uint64_t) pushed; /* messages ever pushed (relaxed; for depth counters) */
} tr__mpscq_head_t;

/* The consumer's side. The stub only ever has its link read, so it is just the link. */
typedef struct tr__mpscq_tail {
    tr_msg_t *tail;           /* oldest: the last message popped, or the stub */
    _Atomic(tr_msg_t *) stub; /* stands in for a tr_msg_t whose only field used is tr_next_ */
    _Atomic(uint64_t) popped; /* messages ever popped (single writer, relaxed) */
} tr__mpscq_tail_t;

static inline tr_msg_t *tr__mpscq_stub(tr__mpscq_tail_t *t)
{
    /* tr_next_ is tr_msg_t's first member: the stub is read only through it */
    return (tr_msg_t *)(void *)&t->stub;
}

/* Initialises an empty queue. With marked, it starts idle (the first push schedules). */
static inline void tr__mpscq_init(tr__mpscq_head_t *h, tr__mpscq_tail_t *t, bool marked)
{
    atomic_init(&t->stub, NULL);
    t->tail = tr__mpscq_stub(t);
    atomic_init(&t->popped, 0);
    atomic_init(&h->pushed, 0);
    atomic_init(&h->head, (uintptr_t)tr__mpscq_stub(t) | (marked ? TR__MARK_EMPTY : 0));
}

/* A push's first step: counts the chain ending at last (n messages) and exchanges the head
 * for it. Returns the previous head (low bit: the queue was marked empty), which the second
 * step links to; until then the consumer sees the queue as empty with a push in flight. */
static inline uintptr_t tr__mpscq_push_exchange(tr__mpscq_head_t *h, tr_msg_t *last, uint64_t n)
{
    atomic_store_explicit(&last->tr_next_, NULL, memory_order_relaxed);
    /* relaxed: a statistic; same cache line as head, already owned by this thread */
    atomic_fetch_add_explicit(&h->pushed, n, memory_order_relaxed);
    /* seq_cst: see the design block */
    return atomic_exchange_explicit(&h->head, (uintptr_t)last, memory_order_seq_cst);
}

/* A push's second step: links the chain starting at first after prev (what the first step
 * returned). True when the queue was marked empty: the caller now owns scheduling it. */
static inline bool tr__mpscq_push_link(uintptr_t prev, tr_msg_t *first)
{
    tr_msg_t *p = (tr_msg_t *)(prev & ~TR__MARK_EMPTY);
    /* release: pairs with the acquire load in tr__mpscq_pop */
    atomic_store_explicit(&p->tr_next_, first, memory_order_release);
    return (prev & TR__MARK_EMPTY) != 0;
}

/* Pushes the chain first..last of n messages (linked through tr_next_). Returns true when
 * the queue was marked empty: the caller now owns scheduling the consumer. Any thread. */
static inline bool tr__mpscq_push(tr__mpscq_head_t *h, tr_msg_t *first, tr_msg_t *last, uint64_t n)
{
    return tr__mpscq_push_link(tr__mpscq_push_exchange(h, last, n), first);
}

/* The oldest message, or NULL when none is linked yet. *done gets the previous tail, now
 * the caller's to free (NULL when it was the stub). Consumer only. */
static inline tr_msg_t *tr__mpscq_pop(tr__mpscq_tail_t *t, tr_msg_t **done)
{
    tr_msg_t *tail = t->tail;
    /* acquire: pairs with the release link store in tr__mpscq_push_link */
    tr_msg_t *next = atomic_load_explicit(&tail->tr_next_, memory_order_acquire);
    *done = NULL;
    if (next) {
        t->tail = next;
        *done = tail == tr__mpscq_stub(t) ? NULL : tail;
        atomic_store_explicit(&t->popped,
                              atomic_load_explicit(&t->popped, memory_order_relaxed) + 1,
                              memory_order_relaxed);
    }
    return next;
}

/* True when nothing is queued or being pushed. Consumer only. */
static inline bool tr__mpscq_is_empty(tr__mpscq_head_t *h, tr__mpscq_tail_t *t)
{
    /* seq_cst: orders this load after a preceding seq_cst mark (store-load, see
     * runtime/core/actor.c) */
    uintptr_t head = atomic_load_explicit(&h->head, memory_order_seq_cst);
    return (tr_msg_t *)(head & ~TR__MARK_EMPTY) == t->tail;
}

/* True when something was pushed after the consumer saw `tail` as its tail. Any thread: it
 * reads only the producers' head (the caller took `tail` while it was the consumer). */
static inline bool tr__mpscq_pushed_since(tr__mpscq_head_t *h, const tr_msg_t *tail)
{
    /* seq_cst: orders this load after a preceding seq_cst mark (store-load, see
     * runtime/core/actor.c) */
    uintptr_t head = atomic_load_explicit(&h->head, memory_order_seq_cst);
    return (const tr_msg_t *)(head & ~TR__MARK_EMPTY) != tail;
}

/* Marks the queue empty and idle. False when a push is in flight or messages remain: the
 * consumer must stay scheduled. Consumer only; after true it must not touch the queue. */
static inline bool tr__mpscq_mark_empty(tr__mpscq_head_t *h, tr__mpscq_tail_t *t)
{
    uintptr_t tail = (uintptr_t)t->tail;
    /* seq_cst: the runtime checks the urgent lane after this (store-load ordering, see
     * runtime/core/actor.c); its release publishes the activation's writes to the next scheduler */
    return atomic_compare_exchange_strong_explicit(&h->head, &tail, tail | TR__MARK_EMPTY,
                                                   memory_order_seq_cst, memory_order_relaxed);
}

/* Clears the mark if the queue is marked: true when this caller took over scheduling.
 * Any thread (after an urgent send, and at spawn to run an actor's init). */
static inline bool tr__mpscq_unmark(tr__mpscq_head_t *h)
{
    uintptr_t head = atomic_load_explicit(&h->head, memory_order_seq_cst);
    if (!(head & TR__MARK_EMPTY)) return false;
    /* seq_cst: pairs with mark_empty's CAS and the producers' exchange; of the threads
     * racing on a marked head exactly one wins */
    return atomic_compare_exchange_strong_explicit(&h->head, &head, head & ~TR__MARK_EMPTY,
                                                   memory_order_seq_cst, memory_order_relaxed);
}

#endif
