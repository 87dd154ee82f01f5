/* engine_internal.h: what the engine's actors share.
 *
 * One training step, as messages (world size 1 shown; the comm actor is where other ranks
 * come in):
 *
 *   loader ──BATCH──▶ executor ──GRAD_READY(layer range)──▶ bucketer ──BUCKET──▶ comm
 *     ▲ CREDIT          │ forward/backward per micro-batch                          │ reduce
 *     └─────────────────┘                                                           ▼
 *   executor ◀──STEP_DONE── optimizer ◀──────────REDUCED (one per bucket)──────────┘
 *
 * Ownership of the shared buffers follows the messages: the executor owns parameters and
 * gradients while it runs a micro-batch; a gradient range belongs to the bucketer/comm/
 * optimizer chain once its GRAD_READY is sent; parameters belong to the optimizer from the
 * last REDUCED until it sends STEP_DONE. Each hand-over is a message, whose mailbox ordering
 * (release on send, acquire on receive) makes the previous owner's writes visible.
 *
 * The embedding API (engine.c) is a client outside the runtime: it sends an ENGINE_REQ and
 * waits on a condition variable until an actor calls tr__engine_reply.
 */
#ifndef TR_ACTORS_ENGINE_INTERNAL_H
#define TR_ACTORS_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "troupe/engine.h"
#include "troupe/monitor.h"
#include "troupe/runtime.h"

#define TR__MAX_PREFETCH 64
#define TR__MAX_BUFFERS  (TR__MAX_PREFETCH + 8)
#define TR__BUF_GRADS    1 /* buffer id of the flat gradient buffer; loader slots follow */
/* The trace lane of the executor's forward and backward passes, below the runtime's own
 * lanes (the engine's few actors take the lowest slots). */
#define TR__LANE_PASSES  (TR_RUNTIME_LANE_EXTERNAL - 1)

typedef enum {
    TR__REQ_TRAIN = 1, /* executor: GAS micro-batches from the loader, then the step */
    TR__REQ_EVAL,      /* executor: n batches of the val set, loss only */
    TR__REQ_FORWARD,   /* executor: forward on eng->req_batch */
    TR__REQ_BACKWARD,  /* executor: backward of the last forward */
    TR__REQ_STEP,      /* executor: wait for the optimizer step at the boundary */
    TR__REQ_SAVE,      /* checkpointer */
    TR__REQ_LOAD,      /* checkpointer */
    TR__REQ_RESEEK,    /* loader: drop prefetched batches, continue from eng->resume */
    TR__REQ_START,     /* loader: start prefetching */
} tr__req_kind_t;

typedef struct tr__dataset tr__dataset_t;
typedef struct tr__optim tr__optim_t;

/* Where the data stream is: enough to continue it exactly. */
typedef struct tr__data_pos {
    uint64_t epoch;
    uint64_t cursor;      /* samples of this rank consumed in the epoch */
    uint64_t batch_index; /* batches produced so far */
} tr__data_pos_t;

struct tr_engine {
    tr_runtime_t *rt;
    tr_config_t *cfg;
    bool own_cfg;
    tr_model_t *model;
    int B, T, GAS, x_dim, rank, world, prefetch;
    size_t n_params;
    uint64_t seed;

    tr_actor_t loader, executor, bucketer, comm, optimizer, checkpointer, supervisor;
    struct tr__loader *ld;
    struct tr__ckpt_actor *ck;
    struct tr__exec *ex;
    struct tr__bucketer *bk;
    struct tr__comm *cm;
    tr__optim_t *op;
    tr__dataset_t *train, *val;

    void *buffers[TR__MAX_BUFFERS]; /* tensor references' buffer ids resolve here */

    /* Training counters: global_steps and skipped_steps written by the optimizer, the others
     * by the executor; other actors read them to stamp messages, the client between calls.
     * Atomic (each has one writer), so those reads are never torn. */
    _Atomic uint64_t global_steps, global_samples, skipped_steps, micro_steps;
    _Atomic uint32_t data_gen;          /* bumped by a reseek; stale batches are dropped */
    tr__data_pos_t resume;              /* the position a reseek continues from */
    tr__data_pos_t consumed;            /* after the last batch trained on: what a save records */
    const tr_engine_batch_t *req_batch; /* FORWARD's batch, valid during the request */

    /* Tracing and DeepSpeed's outputs. mon (NULL: off) is fixed at create. bucket_bytes:
     * gradient bytes in buckets sent and not yet reduced into the step (a counter; relaxed).
     * The t_* are written by the optimizer before it sends STEP_DONE and read by the
     * executor after receiving it (the message orders them). */
    tr_monitor_t *mon;
    char flight_path[1024]; /* where a failed engine's flight recorder goes */
    struct tr__dsmon *ds;
    _Atomic uint64_t bucket_bytes;
    uint64_t t_last_reduced, t_step_begin, t_step_end;

    /* the client's rendezvous */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool waiting;
    int reply_rc;
    float reply_loss;
    tr_step_stats_t reply_stats;
    char error[1024];
    int failed;            /* an actor failed: every call returns this */
    bool destroying;       /* tr_engine_destroy is stopping the actors */
    int n_children, exits; /* actors to hear from at destroy; exit notices heard */
    _Atomic int stop_requested;
};

/* Resolves a tensor reference's buffer. */
static inline void *tr__engine_buffer(tr_engine_t *eng, const tr_tensor_ref_t *ref)
{
    return ref->buffer_id < TR__MAX_BUFFERS && eng->buffers[ref->buffer_id]
               ? (char *)eng->buffers[ref->buffer_id] + ref->offset
               : NULL;
}

/* A reference to [offset, offset + count) floats of the gradient buffer. */
tr_tensor_ref_t tr__grad_ref(tr_engine_t *eng, size_t offset, size_t count);

/* Fails the engine for good (every later call returns rc) and ends the current request with
 * the explanation: for a state no later call can recover from. Any actor. */
void tr__engine_fail(tr_engine_t *eng, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Ends the client's current request: rc and, for rc < 0, the explanation. Any actor. */
void tr__engine_reply(tr_engine_t *eng, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sends a request message to an actor from an actor or the client. */
int tr__engine_request(tr_engine_t *eng, tr_actor_t to, tr__req_kind_t kind, uint32_t n,
                       const char *dir, const char *tag);

/* --- dataset.c --- */
int tr__dataset_open(tr__dataset_t **out, const tr_dataset_t *spec, const tr_engine_t *eng,
                     bool shuffle, uint64_t seed, char *err, size_t errlen);
void tr__dataset_close(tr__dataset_t *ds);
/* Fills one micro-batch: tokens (or x) and targets. *wrapped says an epoch ended. */
int tr__dataset_next(tr__dataset_t *ds, int *tokens, float *x, int *targets, bool *wrapped,
                     char *err, size_t errlen);
tr__data_pos_t tr__dataset_pos(const tr__dataset_t *ds);
int tr__dataset_seek(tr__dataset_t *ds, tr__data_pos_t pos);
uint64_t tr__dataset_samples_per_epoch(const tr__dataset_t *ds);

/* --- the actors; each _spawn creates its state and actor, each _free releases state --- */
int tr__loader_spawn(tr_engine_t *eng);
void tr__loader_free(tr_engine_t *eng);
int tr__executor_spawn(tr_engine_t *eng);
/* Micro-batches done in the open accumulation window (0 at a step boundary), plus one when a
 * forward waits for its backward. Client side, between calls. */
int tr__executor_window(const tr_engine_t *eng);
/* Micro-batches done in the open accumulation window, the one being worked on excluded. */
int tr__executor_micro(const tr_engine_t *eng);
void tr__executor_free(tr_engine_t *eng);
int tr__bucketer_spawn(tr_engine_t *eng);
void tr__bucketer_free(tr_engine_t *eng);
int tr__comm_spawn(tr_engine_t *eng);
void tr__comm_free(tr_engine_t *eng);
int tr__optimizer_spawn(tr_engine_t *eng, char *err, size_t errlen);
void tr__optimizer_free(tr_engine_t *eng);
int tr__checkpointer_spawn(tr_engine_t *eng);
void tr__checkpointer_free(tr_engine_t *eng);

/* ds_monitor.c: DeepSpeed's timer lines, throughput/progress lines, csv_monitor and
 * tensorboard scalars. create/destroy on the client's thread; the rest on the executor's. */
int tr__dsmon_create(tr_engine_t *eng, char *err, size_t errlen);
void tr__dsmon_destroy(tr_engine_t *eng);
/* A training micro-batch's forward ran from t0 to t1. */
void tr__dsmon_forward(tr_engine_t *eng, uint64_t t0, uint64_t t1);
/* Its backward ran from t0 to t1; off the boundary this ends the micro-step's outputs. */
void tr__dsmon_backward(tr_engine_t *eng, uint64_t t0, uint64_t t1, bool boundary);
/* The boundary's STEP_DONE arrived: the step's outputs. */
void tr__dsmon_step(tr_engine_t *eng, const tr_step_stats_t *st);

/* A gradient bucket of `delta` bytes entered (>0) or left (<0) the reduction pipeline: the
 * bucket_bytes counter, sampled into the trace while it records. Any actor. */
void tr__engine_bucket_bytes(tr_engine_t *eng, int64_t delta);

/* optimizer.c: the learning rate the next step will use (DeepSpeed's get_lr()[0]). */
double tr__optimizer_lr(const tr_engine_t *eng);

/* optimizer.c: the state checkpoints save and restore (quiescent engine only). */
double tr__optimizer_loss_scale(const tr_engine_t *eng);
int tr__optimizer_state_pack(const tr_engine_t *eng, void *pk); /* a msgpack_packer * */
int tr__optimizer_state_unpack(tr_engine_t *eng, const void *obj, char *err, size_t errlen);
/* The moment arrays (NULL when the optimizer has none): n_params floats each. */
int tr__optimizer_arrays(tr_engine_t *eng, float **arrays, const char **names, int max);

#endif
