/* client.h: the client endpoint. The thread that calls tr_engine_* is a client outside the
 * runtime: it sends an ENGINE_REQ and waits in its reply slot until an actor ends the request
 * with tr__reply (or fails the engine with tr__engine_fail). A supervisor actor is linked to
 * every engine actor: a failed actor fails the engine, so a waiting call gets the failure,
 * never a hang, and every later call returns it.
 *
 * Actors use the first group (reply, fail, resolve, request_new, bucket_bytes); the engine's
 * own files use the rest. The slot itself (tr__client_t) is opaque: its mutex orders the
 * actors' writes with the caller's reads.
 */
#ifndef TR_ACTORS_ENGINE_CLIENT_H
#define TR_ACTORS_ENGINE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "troupe/buffer.h"
#include "troupe/engine.h"
#include "troupe/runtime.h"

typedef enum {
    TR__REQ_TRAIN = 1, /* executor: GAS micro-batches from the loader, then the step */
    TR__REQ_EVAL,      /* executor: n batches of the val set, loss only */
    TR__REQ_FORWARD,   /* executor: forward on the client's staged batch */
    TR__REQ_BACKWARD,  /* executor: backward of the last forward */
    TR__REQ_STEP,      /* executor: wait for the optimizer step at the boundary */
    TR__REQ_SAVE,      /* executor, which starts the save chain (see ENGINE_STATE) */
    TR__REQ_LOAD,      /* checkpointer, which starts the restore chain */
    TR__REQ_START,     /* loader: start prefetching */
    TR__REQ_WAIT,      /* executor: the last checkpoint save finished on every rank */
    TR__REQ_GATHER,    /* executor: the parameters whole on this rank (ZeRO 3) */
} tr__req_kind_t;

/* What the client learns from a reply. */
typedef struct tr__reply {
    float loss;            /* FORWARD, EVAL */
    tr_step_stats_t stats; /* TRAIN, STEP at a boundary */
    uint64_t global_step;  /* after the request */
    int window;            /* micro-batches of the open accumulation window the executor
                            * holds (done, waiting for backward or for the step) */
    int micro_pos;         /* the micro-batch DeepSpeed's is_gradient_accumulation_boundary
                            * speaks of: the one in progress, else the next */
} tr__reply_t;

/* The client's reply slot: the one place actors write for the caller's thread. */
typedef struct tr__client tr__client_t;

/* The actors' view of the engine (plan.h): where the reply slot, the runtime and the monitor
 * are. */
struct tr__plan;

/* --- for actors (any actor's thread) --------------------------------------------------- */

/* The memory a reference names, checked by the registry; NULL (with the reason in why) for a
 * reference that does not resolve, which is an engine bug. */
void *tr__resolve(const struct tr__plan *eng, const tr_tensor_ref_t *ref, char *why, size_t whylen);

/* Ends the client's current request: rc, what it learns (NULL: nothing new) and, for rc < 0,
 * the explanation (fmt may name nothing: the code's own text is used, never ""). */
void tr__reply(const struct tr__plan *eng, int rc, const tr__reply_t *reply, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* As tr__reply, and fails the engine for good (every later call returns rc): for a state no
 * later call can recover from. */
void tr__engine_fail(const struct tr__plan *eng, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A request message of `kind` (dir and tag empty, n 0), to fill and send. NULL: no memory. */
tr_msg_t *tr__request_new(tr_runtime_t *rt, tr__req_kind_t kind);

/* A gradient bucket of `delta` bytes entered (>0) or left (<0) the reduction pipeline: the
 * bucket_bytes counter, sampled into the trace while it records. */
void tr__engine_bucket_bytes(const struct tr__plan *eng, int64_t delta);

/* --- for the engine (the caller's thread unless said) ----------------------------------- */

/* A new reply slot; NULL: no memory. */
tr__client_t *tr__client_create(void);
/* NULL does nothing. After the runtime has closed. */
void tr__client_destroy(tr__client_t *c);

/* Sends request m to `to` and waits for its reply. m->step is last->global_step; on success
 * *last becomes the reply's view. err (errlen bytes) gets the explanation of a failure, or ""
 * on success. m is the runtime's (or freed) whatever the outcome. */
int tr__client_call(tr__client_t *c, tr_runtime_t *rt, tr_actor_t to, tr_msg_t *m,
                    tr__reply_t *last, char *err, size_t errlen);

/* The supervisor's behaviour; its state is the client. Spawn it with defer_stop: at destroy
 * it stops itself once every child's exit notice has arrived (see tr__client_destroying). */
int tr__client_supervise(tr_ctx_t *ctx, tr_msg_t *msg);

/* Destroy is stopping the engine's n_children actors: their stops are not failures. */
void tr__client_destroying(tr__client_t *c, int n_children);

/* The code every call now returns (an actor failed), or 0. */
int tr__client_failed(tr__client_t *c);

/* The failure's explanation ("" if none); for the flight recorder's line, once the actors
 * have stopped. */
const char *tr__client_error(const tr__client_t *c);

/* The supervisor saw a signal's STOP. Any thread. */
int tr__client_stop_requested(tr__client_t *c);

/* On several ranks a stop is agreed on: each rank adds whether it saw a signal to its step's
 * loss all-reduce, and when the sum says some rank did, the executor sets the flag before that
 * step's reply, so every rank stops after the same step (a signal reaches the ranks at
 * different instants). Any thread. */
void tr__client_stop_agree(tr__client_t *c);
int tr__client_stop_agreed(tr__client_t *c);

#endif
