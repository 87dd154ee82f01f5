/* comm_internal.h: the comm actor's state, shared by comm.c (its messages, completions,
 * polling and watchdog) and comm_start.c (how its collectives are submitted, agreed on and
 * started). Nothing outside the comm actor includes this. */
#ifndef TR_ACTORS_COMM_COMM_INTERNAL_H
#define TR_ACTORS_COMM_COMM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "actors/comm/watchdog.h"
#include "actors/comm/comm_spawn.h"
#include "actors/engine/plan.h"
#include "monitor/comms_log.h"
#include "runtime/comm/comm.h"

/* What every collective carries, exchanged (all-gathered, on a communicator of their own)
 * beside the collective itself and compared on arrival: a rank that diverged is named at once,
 * and no collective's result is delivered before every rank's header matched. */
typedef struct header {
    tr__coll_op_t op; /* what the collective is (and, in the pending table, what it does) */
    uint32_t dtype;
    uint64_t seq; /* collectives this comm actor submitted, from 1 */
    uint64_t bytes;
    uint64_t step;
    uint32_t micro_step, bucket; /* a scalar all-reduce: its requester's `what` */
} header_t;

/* Ranks compare headers byte for byte: the op stays 4 bytes wide. */
_Static_assert(sizeof(tr__coll_op_t) == sizeof(uint32_t), "a header's op is 4 bytes");

typedef struct pending {
    uint64_t req;  /* 0: free; UINT64_MAX: not started yet */
    header_t head; /* its header: head.op says what a data entry does (hdr: an exchange) */
    bool agreed;   /* every rank's header matched: its result may be delivered */
    bool ended;    /* it completed before the headers arrived: delivered once they match */
    void *ptr;     /* a gather's or vector's buffer */
    uint32_t bucket;
    uint64_t step;
    tr_tensor_ref_t grads; /* a bucket: its range of the gradient buffer */
    float *data;
    size_t mine, mine_at;        /* ZeRO 2: this rank's part of it (elements, flat index) */
    tr_actor_t asker;            /* who asked (none for a bucket) */
    tr_msg_comm_scalar_t scalar; /* its request */
    double *vals;                /* its values, reduced in place (not in this table, which
                                  * may move while the operation is in flight) */
    uint64_t t_start;            /* for the comms logger and the watchdog */
    struct header *hdr;          /* a header exchange: every rank's, then ours (else NULL) */
    size_t of;                   /* a header exchange: its collective's entry */
    uint32_t reduce_op, what;    /* a vector's reduction and the asker's tag */
    int lane;                    /* its trace lane (TR__LANE_COLLECTIVES - lane), -1: none */
    tr_tensor_ref_t buf;         /* its buffer: the parameters */
    tr__watch_op_t op;           /* its header, for the watchdog's table */
} pending_t;

/* A pipeline link's transfer with another rank, pending from its COMM_WATCH start until its
 * end: in the watchdog's table beside the collectives (the link moves it on itself). */
typedef struct watched {
    uint64_t id;       /* the link's id for it; 0: a free entry */
    uint64_t t_start;  /* when the comm actor heard of it */
    tr__watch_op_t op; /* what it is, for the table */
} watched_t;

struct tr__comm {
    const tr__plan_t *eng;
    tr_runtime_t *rt;
    tr_actor_t self;
    tr_comm_t *backend;
    tr_comm_t *headers; /* the header exchanges' own communicator (NULL: a group of one) */
    uint64_t started;   /* collectives started on the backend (in seq order) */
    float pre, post;    /* multipliers before and after the sum (1: none) */
    tr_dtype_t wire;    /* communication_data_type on more than one rank: F32, F16 or BF16 */
    uint16_t *wire16;   /* a 16-bit wire's copy of the gradients, indexed as the gradient buffer
                         * (buckets are disjoint ranges: no two in flight share any of it) */
    bool polling;       /* a COMM_POLL is on its way */
    bool slack_set;     /* its thread's timer slack is 1 us (comm.c, timer_slack) */
    bool eager;         /* young operations may be polled without a pause (comm.c, eager_polls) */
    bool tail;          /* ... and may now: the step's backward is over (its last bucket came) */
    int inflight;       /* operations the backend holds, as of the last start or progress */
    pending_t *pending; /* operations in flight (grows; a step's buckets at most) */
    size_t cap;
    size_t *free_slots; /* indices of the free entries of pending, a stack (cap of them) */
    size_t n_free;
    size_t *by_seq;      /* the entry of submitted data operation s, for started < s <= seq, at
                          * by_seq[s % cap]: the next to start is found at once, not by a scan */
    size_t *by_req;      /* 1 + the entry of each started request (open addressing on req, 2 cap
                          * slots, 0 empty): a completion finds its entry at once */
    tr_comms_log_t *log; /* comms_logger (NULL: off) */
    bool log_verbose;
    uint64_t seq;             /* collectives submitted */
    unsigned lanes_busy;      /* trace lanes held by collectives in flight (bit k: lane k) */
    uint64_t timeout_ns;      /* troupe.comm.timeout_s */
    bool broken;              /* the ranks diverged or a collective failed: start nothing more */
    int exchanges;            /* header exchanges in flight */
    int held_rc;              /* the backend failed while exchanges were in flight: its error, */
    char held_why[256];       /* reported once they end unless they name a divergence (0: none) */
    int fault_rank;           /* TROUPE_FAULT_HEADER_RANK: this rank sends a wrong header (tests) */
    int fault_count;          /* TROUPE_FAULT_COUNT_RANK: this rank's buckets are a float short */
    int fault_silent;         /* TROUPE_FAULT_SILENT_RANK: this rank stops posting after step 0 */
    int fault_gather_silent;  /* TROUPE_FAULT_SILENT_GATHER_RANK: ... its parameter all-gathers */
    int fault_kill;           /* TROUPE_FAULT_KILL_RANK: this rank kills itself (SIGKILL) ... */
    uint64_t fault_kill_step; /* ... on the first bucket of TROUPE_FAULT_KILL_STEP */
    tr__watch_op_t last;      /* the last collective's header (seq == seq) */
    tr__watch_t *watch;       /* the diagnosis across ranks (NULL: a group of one) */
    watched_t *xfers;         /* the pipeline link's transfers in flight (grows) */
    size_t xfers_cap;
    tr_actor_t link; /* the link that reports them: told when the watchdog ends the job */
};

/* Records operation op under header h and starts it at once (collectives start in the order
 * submitted, so every rank posts the same sequence); on more than one rank h's exchange is
 * posted just before it. Its completion is delivered only once every rank's header has arrived
 * and matches this one, so a rank that diverged is named before any result of a mismatched
 * collective is used. */
int tr__comm_submit(struct tr__comm *c, pending_t op, header_t h);

/* A header exchange (p) completed: every rank's header must be ours, and then its collective is
 * agreed; if that collective has ended already, *ready is it, to deliver now (else NULL). A
 * mismatch fails the engine naming both headers. */
int tr__comm_headers_arrived(struct tr__comm *c, pending_t *p, pending_t **ready);

/* The started operation with backend request req (hdr: a header exchange's), or NULL. */
pending_t *tr__comm_pending_find(struct tr__comm *c, uint64_t req, bool hdr);

/* p's entry is free again (zeroed; what it pointed to is the caller's to free). */
void tr__comm_pending_free(struct tr__comm *c, pending_t *p);

/* What a data operation is, in words ("a bucket's all-reduce"), for errors. */
const char *tr__comm_op_name(tr__coll_op_t op);

/* h in words, for errors. */
void tr__comm_describe(const header_t *h, char *out, size_t len);

/* ZeRO 2: the part of bucket [a, b) that each rank owns, as counts; this rank's part
 * (elements and flat index) in *mine, *mine_at. NULL: no memory. */
size_t *tr__comm_bucket_parts(const tr__plan_t *e, size_t a, size_t b, size_t *mine,
                              size_t *mine_at);

/* A 16-bit wire: the bucket's floats [a, a + n) of the gradient buffer to fp16 or bf16
 * (rounded to nearest even) into c->wire16, and back. */
void tr__comm_to_wire(struct tr__comm *c, const float *x, size_t a, size_t n);
void tr__comm_from_wire(const struct tr__comm *c, float *x, size_t a, size_t n);

#endif
