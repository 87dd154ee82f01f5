/* pool: message memory from per-thread free lists by size class.
 *
 * Every thread that allocates messages for a runtime owns a tr__pool_t. Allocation pops the
 * thread's own free list (no atomic, no lock, no malloc on the steady-state path). A message
 * freed by its owner goes back on the owner's list; one freed by another thread is collected
 * in a small per-owner batch and returned to the owner's lock-free "returned" stack in one
 * CAS when the batch fills (or when the thread flushes, e.g. before parking). The owner takes
 * the whole returned stack with one exchange when its own list runs dry. Slabs are only
 * freed when the pool set is destroyed with the runtime, so a message outliving its
 * allocating thread stays valid.
 *
 * Sizes above the largest class come from malloc and go back to free.
 */
#ifndef TR_MAILBOX_POOL_H
#define TR_MAILBOX_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "troupe/error.h"
#include "troupe/msg.h"

typedef struct tr__pool tr__pool_t;
typedef struct tr__pool_set tr__pool_set_t;

/* A set of pools, one per thread that touches it. NULL on out-of-memory. Any thread. */
tr__pool_set_t *tr__pool_set_create(void);

/* Frees every pool, slab and large message. No thread may use the set any more. */
void tr__pool_set_destroy(tr__pool_set_t *set);

/* The calling thread's pool in set, created on first use. NULL on out-of-memory. */
tr__pool_t *tr__pool_get(tr__pool_set_t *set);

/* A set's id: unique in the process, never reused (a set at a freed set's address differs). */
uint64_t tr__pool_set_id(const tr__pool_set_t *set);

/* The pool tr__pool_get last returned on this thread, and its set's id: a caller that knows
 * the id can skip the call (tr__thread_pool, runtime/core/internal.h). */
extern _Thread_local uint64_t tr__pool_tls_set_id;
extern _Thread_local tr__pool_t *tr__pool_tls_pool;

/* A message with body capacity >= body_size, envelope zeroed (body not). NULL on OOM.
 * The pool's own thread. */
tr_msg_t *tr__pool_alloc(tr__pool_t *pool, size_t body_size);

/* Gives m back: to pool's free list if pool owns it, else into a batch for its owner.
 * The pool's own thread. */
void tr__pool_free(tr__pool_t *pool, tr_msg_t *m);

/* Returns every batched remote free to its owner. The pool's own thread. */
void tr__pool_flush(tr__pool_t *pool);

/* Makes the process-wide slab cache hold n slabs (within its bound) whose first 64 KiB the
 * calling thread has written: the slabs the next n pools take. A thread's first message then comes
 * from a slab that is already mapped and page-faulted, not from an mmap and a page fault
 * inside a behaviour (~30 us on a VM: bench latency's max when the timer's actor first ran
 * on the other worker). Runtime start-up, once per thread that will allocate. */
void tr__pool_prefault(unsigned n);

/* Bytes the set holds in slabs and large messages (for start-up memory reports). */
size_t tr__pool_set_bytes(tr__pool_set_t *set);

#endif
