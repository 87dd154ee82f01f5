/* watchdog.h: the comm actor's hang diagnosis across ranks.
 *
 * When a collective, or a pipeline link's transfer with another rank (the link reports each
 * to the comm actor, COMM_WATCH), has been pending past troupe.comm.timeout_s on some rank,
 * every rank's table of pending operations is gathered on rank 0, which names the rank that
 * diverged and the operation the others wait in, in one diagnosis; then every rank's engine
 * fails (and its pipeline link its batch) and the job ends. A rank whose oldest wait is a
 * transfer waits on one peer, not on every rank: the diagnosis names it with that peer rather
 * than as diverged, beside the ranks that wait in collectives. The tables travel as msgpack over a
 * control channel: a group of its own split off the data communicator (so control messages never
 * match a data operation), point to point.
 *
 *   rank r (its oldest operation timed out) ──alarm──▶ rank 0    (rank 0 itself: no message)
 *   rank 0 ──ask──▶ every rank ──table──▶ rank 0                 (waits GRACE at most)
 *   rank 0: prints the diagnosis ──verdict──▶ every rank: fails its engine
 *
 * Every rank keeps one receive posted on the channel, any source, and the comm actor moves it
 * on from a slow timer (TR__WATCH_TICK_NS) even when nothing else is pending, so a rank that
 * stopped posting collectives (stuck in compute, or skipping one) still answers; a rank that
 * does not answer within the grace period is named as dead or blocked. A rank that raised the
 * alarm and hears no verdict fails alone after twice the grace period.
 *
 * Everything here runs on the comm actor's thread (the owner of the watch).
 */
#ifndef TR_ACTORS_COMM_WATCHDOG_H
#define TR_ACTORS_COMM_WATCHDOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/comm/comm.h"

#define TR__WATCH_TICK_NS  200000000ull  /* the control channel's idle poll: 5 per second */
#define TR__WATCH_GRACE_NS 3000000000ull /* rank 0 waits this long for the tables */
#define TR__WATCH_MAX_OPS  32            /* pending operations a table carries (the oldest) */

/* What a collective is: the op of the header every rank exchanges before it, and of the
 * watchdog's tables. The values travel to other ranks (headers are compared byte for byte,
 * tables go to rank 0), so each keeps its number. */
typedef enum {
    TR__COLL_ALL_REDUCE = 1,     /* a bucket's all-reduce */
    TR__COLL_SCALAR = 2,         /* a scalar all-reduce (COMM_SCALAR) */
    TR__COLL_ALL_GATHER = 3,     /* the parameter all-gather (ZeRO 1, 2) */
    TR__COLL_REDUCE_SCATTER = 4, /* a bucket's reduce-scatter (ZeRO 2) */
    TR__COLL_VECTOR = 5,         /* a vector all-reduce (COMM_REDUCE) */
    /* the tables only, never a header's: a pipeline link's point-to-point transfer with the
     * neighbouring stage's rank (COMM_WATCH), which another rank's stage waits on */
    TR__COLL_PIPE_SEND = 6,
    TR__COLL_PIPE_RECV = 7,
} tr__coll_op_t;

/* One operation as the header exchange and the watchdog name it. */
typedef struct tr__watch_op {
    tr__coll_op_t op;
    uint32_t dtype;
    uint64_t seq; /* the comm actor's collective number, from 1 */
    uint64_t bytes, step;
    uint32_t micro_step, bucket;
    bool exchange;    /* the header exchange before the collective, not the collective */
    double pending_s; /* how long it has been pending (0 for a rank's last started one) */
    /* a pipeline transfer (TR__COLL_PIPE_*): micro_step is its micro-batch, seq 0 */
    int peer;                   /* the rank it goes to or comes from */
    uint32_t stage, peer_stage; /* this rank's stage and the peer's */
    bool grad;                  /* a gradient (else an activation) */
    bool tensor;                /* the tensor's bytes (else the frame with its header) */
} tr__watch_op_t;

/* Whether o is a pipeline transfer (point to point with o->peer), not a collective. */
static inline bool tr__watch_is_pipe(const tr__watch_op_t *o)
{
    return o->op == TR__COLL_PIPE_SEND || o->op == TR__COLL_PIPE_RECV;
}

/* A rank's table: what it started last and what is pending on it, oldest first. */
typedef struct tr__watch_table {
    int rank;
    uint64_t started;    /* collectives started (the last one's seq) */
    tr__watch_op_t last; /* the last started (valid when started > 0) */
    int n;
    tr__watch_op_t ops[TR__WATCH_MAX_OPS];
} tr__watch_table_t;

typedef struct tr__watch tr__watch_t;

/* "collective #3, the all-reduce of bucket 0, 244 bytes of f32, step 1, micro-step 0";
 * with exchange, "the header exchange before ..." instead; a pipeline transfer: "the
 * pipeline's receive from rank 1 (stage 1 to stage 0) of the gradient of micro-batch 0, step
 * 5 (its tensor, 2048 bytes of f32)". */
void tr__watch_describe(const tr__watch_op_t *o, char *out, size_t len);

/* Splits data into the control channel (collective over data's ranks: every rank calls it at
 * the same point), reporting completions to done(arg), and posts its receive. *out is NULL
 * (and 0 returned) for a group of one or a backend without point-to-point. Error: why. */
int tr__watch_create(tr_comm_t *data, tr_comm_done_cb done, void *arg, tr__watch_t **out, char *why,
                     size_t whylen);
void tr__watch_destroy(tr__watch_t *w);

/* This rank's oldest collective passed the timeout (table: this rank's, now): rank 0 starts
 * the diagnosis, another rank alarms rank 0. Once per watch; later calls do nothing. */
void tr__watch_alarm(tr__watch_t *w, const tr__watch_table_t *mine, uint64_t now_ns);

/* The slow tick: moves the channel on and checks the deadlines. Returns 1 when this rank's
 * engine must fail now, with the reason in fail (rank 0: the diagnosis), else 0. */
int tr__watch_tick(tr__watch_t *w, const tr__watch_table_t *mine, uint64_t now_ns, char *fail,
                   size_t faillen);

/* A control-channel operation completed (its COMM_DONE): a message is handled (an alarm, an
 * ask answered with mine, a table recorded, a verdict) and the receive posted again. Returns as
 * tr__watch_tick does. */
int tr__watch_done(tr__watch_t *w, uint64_t req, int rc, const tr__watch_table_t *mine,
                   uint64_t now_ns, char *fail, size_t faillen);

/* Whether this rank ended the job itself (rank 0's diagnosis, or no verdict came), not on
 * rank 0's verdict: the rank that aborts the MPI job at shutdown, since the rank the diagnosis
 * names may be stopped, and MPI_Finalize would wait for it. */
bool tr__watch_ended_here(const tr__watch_t *w);

/* Whether a diagnosis is under way on this rank (it alarmed, or was asked): its own watchdog
 * then waits for the verdict instead of failing alone. */
bool tr__watch_busy(const tr__watch_t *w);

#endif
