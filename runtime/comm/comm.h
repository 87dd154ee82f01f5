/* comm: the communication backends the comm actor drives, and their registry.
 *
 * A backend reduces, gathers and broadcasts buffers among the ranks of a data-parallel group.
 * Every operation is non-blocking: it starts, returns a request id, and later reports its
 * completion through the `done` callback the backend was created with — the comm actor turns
 * that call into a COMM_DONE message to itself, so no actor ever waits or spins on a test.
 * A backend whose operations finish at once (local) calls `done` before the start returns;
 * one that needs progress (MPI) calls it from its progress loop. Reductions are plain sums or
 * maxima: scaling (a mean over ranks, DeepSpeed's predivide factor) is the caller's, as
 * DeepSpeed's numerics need.
 *
 * Backends come from a registry by name ("local" is built in; the MPI and NCCL backends
 * register themselves when the build has them).
 */
#ifndef TR_RUNTIME_COMM_COMM_H
#define TR_RUNTIME_COMM_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "troupe/types.h"

typedef struct tr_comm tr_comm_t;

typedef enum { TR_REDUCE_SUM = 0, TR_REDUCE_MAX = 1, TR_REDUCE_COUNT_ } tr_reduce_op_t;

/* COMM_WATCH's `what` (troupe/msg_types.def): point-to-point transfers that a comm actor's
 * watchdog counts as pending beside its collectives (a pipeline link's, actors/pipe/link.c),
 * and the watchdog's word back when it ends the job. The values travel in messages. */
typedef enum {
    TR_COMM_WATCH_STARTED = 1, /* link -> watchdog: a transfer is pending from now */
    TR_COMM_WATCH_ENDED = 2,   /* link -> watchdog: it completed (id 0: all of the link's) */
    TR_COMM_WATCH_BY = 3,      /* the pipeline's caller -> link: tell `actor` from now on */
    TR_COMM_WATCH_END_JOB = 4, /* watchdog -> link: the job ends; fail the batch */
} tr_comm_watch_t;

/* recv's peer: a message from any rank of the group. */
#define TR_COMM_ANY_SOURCE (-1)
/* Tags of point-to-point messages are in [0, TR_COMM_TAG_MAX]. */
#define TR_COMM_TAG_MAX 32767

/* An operation completed: its request id, the tag the caller set when it started it (see
 * tr_comm_t.op_tag), rc 0 or the backend's error. May run on any thread; keep it short (send a
 * message). */
typedef void (*tr_comm_done_cb)(void *arg, uint64_t req, uint64_t tag, int rc);

typedef struct tr_comm_ops {
    /* In place: buf (count elements of dt) becomes the element-wise op over the ranks. */
    int (*all_reduce)(tr_comm_t *c, void *buf, size_t count, tr_dtype_t dt, tr_reduce_op_t op,
                      uint64_t *req);
    /* send (count * world elements) -> recv (count elements): this rank's part of the sum. */
    int (*reduce_scatter)(tr_comm_t *c, const void *send, void *recv, size_t count, tr_dtype_t dt,
                          uint64_t *req);
    /* send (count elements) -> recv (count * world elements), rank order. */
    int (*all_gather)(tr_comm_t *c, const void *send, void *recv, size_t count, tr_dtype_t dt,
                      uint64_t *req);
    /* In place, uneven: rank r's part is buf[displ(r), displ(r) + counts[r]) with displ(r) the
     * sum of the counts before r; afterwards every rank holds every part. counts (world
     * entries) is copied. */
    int (*all_gather_v)(tr_comm_t *c, void *buf, const size_t *counts, tr_dtype_t dt,
                        uint64_t *req);
    /* In place, uneven: buf holds the sum of counts (world entries, copied) elements, rank r's
     * part being buf[displ(r), displ(r) + counts[r]); afterwards buf[0, counts[rank]) holds
     * this rank's part summed over the ranks (MPI_Ireduce_scatter with MPI_IN_PLACE) and the
     * rest of buf is undefined. A rank whose count is 0 takes part and receives nothing. */
    int (*reduce_scatter_v)(tr_comm_t *c, void *buf, const size_t *counts, tr_dtype_t dt,
                            uint64_t *req);
    /* buf (count elements) becomes root's on every rank. */
    int (*broadcast)(tr_comm_t *c, void *buf, size_t count, tr_dtype_t dt, int root, uint64_t *req);
    /* Point to point, matched by (peer, tag) in the order posted, as MPI's: send hands count
     * elements of buf to rank `peer`; recv takes the next matching message into buf, which
     * holds up to count elements (a longer message is the backend's error; a shorter one
     * leaves the rest of buf as it was). recv's peer may be TR_COMM_ANY_SOURCE. buf is the
     * caller's until done reports the operation. */
    int (*send)(tr_comm_t *c, const void *buf, size_t count, tr_dtype_t dt, int peer, int tag,
                uint64_t *req);
    int (*recv)(tr_comm_t *c, void *buf, size_t count, tr_dtype_t dt, int peer, int tag,
                uint64_t *req);
    /* Fills child (name, done and done_arg already set) with the group of the ranks that
     * gave the same color, ranked by key, then by their rank here. Collective: every rank
     * of c calls it, with nothing of c pending on the calling thread's account. */
    int (*split)(tr_comm_t *c, int color, int key, tr_comm_t *child, char *why, size_t whylen);
    /* Moves pending operations on and reports those that completed (through done); returns
     * how many are still pending, or a negative error. NULL for a backend whose operations
     * complete when they start. The comm actor calls it while anything is pending. */
    int (*progress)(tr_comm_t *c);
    void (*destroy)(tr_comm_t *c);
} tr_comm_ops_t;

struct tr_comm {
    const tr_comm_ops_t *ops;
    const char *name;
    int rank, world;
    tr_comm_done_cb done;
    void *done_arg;
    uint64_t next_req; /* request ids, from 1 */
    uint64_t op_tag;   /* the caller's: set before starting an operation; the backend records
                        * it at the start and hands it back to done (the comm actor puts the
                        * step there, so a completion is classed with its step) */
    char error[256];   /* the last failing operation's explanation (the backend's words) */
    bool abort_job;    /* set by the owner when a rank is known dead or stopped: destroy ends
                        * the job (mpi: MPI_Abort) instead of leaving MPI_Finalize, collective
                        * over the job, to wait for that rank forever */
    void *impl;
};

/* A backend's constructor: fills c->ops and c->impl for c->rank of c->world. TR_EINVAL with
 * why for a rank/world it cannot serve. */
typedef int (*tr_comm_backend_fn)(tr_comm_t *c, char *why, size_t whylen);

/* Adds a backend under name (a string that outlives the process's use of it). TR_EEXIST when
 * the name is taken, TR_ENOSPC past 16 backends. Any thread. */
int tr_comm_backend_register(const char *name, tr_comm_backend_fn create);

/* The backend named `name` for this rank and world size, reporting completions to done(arg).
 * TR_ENOTSUP for a name this build does not have (why lists those it has), TR_EINVAL for a
 * rank/world the backend cannot serve. */
int tr_comm_create(const char *name, int rank, int world, tr_comm_done_cb done, void *arg,
                   tr_comm_t **out, char *why, size_t whylen);
void tr_comm_destroy(tr_comm_t *c);

/* The sub-group of the ranks of parent that pass the same color (>= 0), ranked by key (ties
 * by their rank in parent), as a comm of its own (rank and world in it; request ids from 1;
 * completions to parent's done and done_arg, which the caller may change before starting
 * anything on it). Collective over parent: every rank calls it, in the same order relative to
 * parent's other collectives. TR_EINVAL for a negative color, the backend's error with why.
 * The child is destroyed with tr_comm_destroy, before or after its parent. Parent's thread. */
int tr_comm_split(tr_comm_t *parent, int color, int key, tr_comm_t **child, char *why,
                  size_t whylen);

/* A new request id. Backends call this when an operation starts. */
uint64_t tr_comm_next_req(tr_comm_t *c);

/* Validates the arguments every operation shares: TR_EINVAL for a NULL buffer with count > 0,
 * a bad dtype or reduction, a root outside [0, world). */
int tr_comm_check(const tr_comm_t *c, const void *buf, size_t count, tr_dtype_t dt, int op_or_root,
                  int is_root);

/* A send's or recv's arguments: TR_EINVAL (with c->error) for a NULL buffer with count > 0,
 * a bad dtype, a peer outside the group (TR_COMM_ANY_SOURCE is a peer for recv only) or a tag
 * outside [0, TR_COMM_TAG_MAX]. */
int tr_comm_check_p2p(tr_comm_t *c, const void *buf, size_t count, tr_dtype_t dt, int peer, int tag,
                      int is_recv);

/* mpi.c, in builds with MPI: the "mpi" backend (registered by name). */
int tr__comm_mpi_create(tr_comm_t *c, char *why, size_t whylen);

/* In place: a one-element all-reduce of a double (a loss, a norm, an overflow flag). */
int tr_comm_all_reduce_scalar(tr_comm_t *c, double *v, tr_reduce_op_t op, uint64_t *req);

#endif
