/* engine_internal.h: the engine's actors and what they know of each other.
 *
 * One training step, as messages (world size 1 shown; the comm actor is where other ranks
 * come in):
 *
 *   loader ──BATCH──▶ executor ──GRAD_READY(layer range)──▶ bucketer ──BUCKET──▶ comm
 *     ▲ CREDIT          │ forward/backward per micro-batch                          │ reduce
 *     └─────────────────┘                                                           ▼
 *   executor ◀──STEP_DONE── optimizer ◀──────────REDUCED (one per bucket)──────────┘
 *
 * Ownership. Each actor's state is its own: no actor reads another's fields, and the caller's
 * thread reads none. What they share is fixed before the first message and read-only after
 * (the `fixed` part of tr_engine_t: shapes, config, the model's layer table, the peers'
 * addresses, registry ids), plus memory named by tensor references that resolve through the
 * runtime's buffer registry (troupe/buffer.h): parameters and gradients (the executor's while
 * it runs a micro-batch; a gradient range belongs to the bucketer/comm/optimizer chain once
 * its GRAD_READY is sent; parameters belong to the optimizer from the last REDUCED until it
 * sends STEP_DONE), loader slots, the client's staging batch and a checkpoint's staging
 * arrays. Each hand-over is a message, whose mailbox ordering (release on send, acquire on
 * receive) makes the previous owner's writes visible.
 *
 * The embedding API (engine.c) is a client outside the runtime: it sends an ENGINE_REQ and
 * waits in its reply slot (tr__client_t) until an actor answers with tr__reply. Everything
 * the client learns (step statistics, the accumulation window, the global step) comes in a
 * reply.
 */
#ifndef TR_ACTORS_ENGINE_ENGINE_INTERNAL_H
#define TR_ACTORS_ENGINE_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "actors/engine/client.h"
#include "base/errf.h"
#include "troupe/buffer.h"
#include "troupe/engine.h"
#include "troupe/log.h"
#include "troupe/monitor.h"
#include "troupe/runtime.h"

#define TR__MAX_PREFETCH 64
/* The trace lane of the executor's forward and backward passes, below the runtime's own
 * lanes (the engine's few actors take the lowest slots). */
#define TR__LANE_PASSES  (TR_RUNTIME_LANE_EXTERNAL - 1)
/* The lanes of the collectives in flight, one span each from post to completion: with a
 * backend that needs progress the communication happens there, not in the comm actor's short
 * handlers, so this is what the trace summary's "comm hidden" fraction measures. Collectives
 * in flight at once take one lane each (a lane's spans never overlap). */
#define TR__LANE_COLLECTIVES   (TR_RUNTIME_LANE_EXTERNAL - 2)
#define TR__COLLECTIVE_LANES 4 /* TR__LANE_COLLECTIVES - k, k < 4 */
/* A checkpoint wait (a save, load or tr_engine_wait_checkpoint waiting for the last save to be
 * durable) as a span of its own lane: the trace shows the caller held up. */
#define TR__LANE_CKPT_WAIT (TR__LANE_COLLECTIVES - TR__COLLECTIVE_LANES)

/* ENGINE_STATE's kinds: a save collects state on its way executor -> optimizer ->
 * checkpointer, which copies it (the caller's reply), writes it (WRITE, to itself) and reports
 * to the executor (WRITTEN); once every rank's files are durable the executor asks rank 0's
 * checkpointer for latest (LATEST, reported as WRITTEN). A restore hands the state out
 * checkpointer -> optimizer -> executor -> checkpointer (RESTORED). */
typedef enum {
    TR__STATE_SAVE = 1,
    TR__STATE_RESTORE,
    TR__STATE_RESTORED,
    TR__STATE_WRITE,
    TR__STATE_WRITTEN,
    TR__STATE_LATEST,
} tr__state_kind_t;

/* COMM_SCALAR `what` tags for checkpoints: the comm actor names them when the ranks diverge (a
 * save's wait or a load called on some ranks only meets another collective on the others).
 * Other requesters' tags are their own, below these. */
enum {
    TR__SCALAR_CKPT_SAVE = 0x100, /* the executor: how far every rank's part of a save is */
    TR__SCALAR_CKPT_LOAD = 0x102, /* the checkpointer: every rank read and checked its part */
};

/* The optimizer's slice of the flat parameters: it keeps moment arrays of hi - lo floats for
 * [lo, hi) (hi may pass n_params if the buffer is ever padded; only [0, n_params) is
 * saved). `partitioned`: the ranks' slices differ (ZeRO >= 1 on several ranks); otherwise
 * every rank holds the whole, identical state. */
typedef struct tr__optim_slice {
    size_t lo, hi;
    bool partitioned;
} tr__optim_slice_t;

/* The optimizer's state offloaded to NVMe (swapper.c): this rank's partition [lo, hi) is cut
 * into n_groups sub-groups of `group` elements (the last may be shorter). Sub-group g's
 * moment arrays lie in a swap buffer as n_arrays arrays of `group` floats each (m, then v,
 * then vmax), followed by the swapper's trailer; `slot_bytes` is a buffer's size and a
 * sub-group's slot in the swap file. The optimizer steps a sub-group in one of the n_bufs
 * registered buffers buf_ids[] (owner: the swapper), which it names in SWAP messages. */
#define TR__MAX_SWAP_BUFS 64
enum { TR__SWAP_READ = 1, TR__SWAP_WRITE = 2 };
typedef struct tr__swap_layout {
    size_t group, n_groups, slot_bytes;
    int n_arrays, n_bufs;
    uint64_t buf_ids[TR__MAX_SWAP_BUFS];
} tr__swap_layout_t;

typedef struct tr__dataset tr__dataset_t;
typedef struct tr__optim tr__optim_t;

/* Where the data stream is: enough to continue it exactly. */
typedef struct tr__data_pos {
    uint64_t epoch;
    uint64_t cursor;      /* samples of this rank consumed in the epoch */
    uint64_t batch_index; /* batches produced so far */
} tr__data_pos_t;

struct tr_engine {
    /* --- fixed at create, before any message; read-only after (any thread) --- */
    tr_runtime_t *rt;
    tr_config_t *cfg;
    bool own_cfg;
    tr_model_t *model; /* actors other than the executor read only its layer table */
    int B, T, GAS, x_dim, y_dim, rank, world, prefetch;
    int stages; /* pipeline.stages: stage actors the executor runs a step's micro-batches
                 * through (1: none) */
    int replicas; /* data-parallel replicas: each reads its own share of the data. world, or
                   * with a pipeline across ranks world / stages (a replica's stages are
                   * consecutive ranks: rank = stage * replicas + replica) */
    int replica;  /* this rank's: rank % replicas */
    size_t n_params;
    int zero;          /* the ZeRO stage in effect: 0 at world size 1; 3 runs as 2 */
    bool overlap_comm; /* buckets leave during the backward (else after it) */
    uint64_t seed;
    double loss_scale0; /* the loss scale of the first step */
    tr_engine_memory_t memory; /* filled as the actors are made */
    tr__optim_slice_t optim_slice; /* set by the optimizer's spawn; checkpoints read it */
    tr__swap_layout_t swap; /* set by the swapper's spawn (offload_optimizer.device nvme) */
    tr_monitor_t *mon;  /* NULL: off; thread-safe */
    char flight_path[1024];
    tr_actor_t loader, executor, bucketer, comm, optimizer, checkpointer, supervisor;
    tr_actor_t swapper; /* NONE unless the optimizer's state is offloaded to NVMe */
    uint64_t buf_params, buf_grads;             /* registry ids */
    uint64_t buf_stage_in, buf_stage_targets, buf_stage_y; /* the client's staging batch */
    tr__client_t *client;

    /* --- each actor's own state; here only to be freed at destroy --- */
    struct tr__loader *ld;
    struct tr__ckpt_actor *ck;
    struct tr__exec *ex;
    struct tr__bucketer *bk;
    struct tr__comm *cm;
    tr__optim_t *op;
    struct tr__swapper *sw;
    tr__dataset_t *train, *val; /* the loader's and the executor's */
    struct tr__dsmon *ds;       /* the executor's */

    /* deterministic mode (troupe.runtime.deterministic): a thread runs the runtime's seeded
     * scheduler (tr_runtime_run) for the engine's lifetime */
    pthread_t driver;
    bool driving;
    bool created; /* tr_engine_create succeeded: the actors answer calls */
    int driver_rc;

    /* --- the caller's thread only --- */
    void *stage_in, *stage_targets, *stage_y;
    tr__reply_t last; /* the last successful reply's view */
    char error[1024]; /* the last call's explanation */
};

/* --- dataset.c --- */
int tr__dataset_open(tr__dataset_t **out, const tr_dataset_t *spec, const tr_engine_t *eng,
                     bool shuffle, uint64_t seed, char *err, size_t errlen);
void tr__dataset_close(tr__dataset_t *ds);
/* Fills one micro-batch: tokens (or x), targets (int, when the dataset gives them) and y
 * (float targets, when it gives them). *wrapped says an epoch ended. */
int tr__dataset_next(tr__dataset_t *ds, int *tokens, float *x, int *targets, float *y,
                     bool *wrapped, char *err, size_t errlen);
tr__data_pos_t tr__dataset_pos(const tr__dataset_t *ds);
int tr__dataset_seek(tr__dataset_t *ds, tr__data_pos_t pos);
uint64_t tr__dataset_samples_per_epoch(const tr__dataset_t *ds);

/* --- the actors; each _spawn creates its state and actor (no message is sent), each _free
 * releases state after the runtime has closed --- */
int tr__loader_spawn(tr_engine_t *eng);
void tr__loader_free(tr_engine_t *eng);
int tr__executor_spawn(tr_engine_t *eng, char *err, size_t errlen);
void tr__executor_free(tr_engine_t *eng);
int tr__bucketer_spawn(tr_engine_t *eng);
void tr__bucketer_free(tr_engine_t *eng);
int tr__comm_spawn(tr_engine_t *eng, char *err, size_t errlen);
void tr__comm_free(tr_engine_t *eng);
int tr__optimizer_spawn(tr_engine_t *eng, char *err, size_t errlen);
/* The optimizer keeps its state in the swapper's file (offload_optimizer.device nvme and
 * an optimizer with state). Fixed at create. */
bool tr__optimizer_swaps(const tr_engine_t *eng);
void tr__optimizer_free(tr_engine_t *eng);
/* Only with zero_optimization.offload_optimizer.device nvme; after the optimizer's spawn
 * (it reads optim_slice). Writes every sub-group's zeroed state, so a full disk is found now. */
int tr__swapper_spawn(tr_engine_t *eng, char *err, size_t errlen);
void tr__swapper_free(tr_engine_t *eng);
int tr__checkpointer_spawn(tr_engine_t *eng);
void tr__checkpointer_free(tr_engine_t *eng);

/* ds_monitor.c: DeepSpeed's timer lines, throughput/progress lines, csv_monitor and
 * tensorboard scalars. create/destroy on the client's thread; the rest on the executor's. */
int tr__dsmon_create(tr_engine_t *eng, char *err, size_t errlen);
/* A pipelined step's transfer times, for DeepSpeed's pipeline timers (wall_clock_breakdown). */
struct tr_pipe_run_result;
void tr__dsmon_pipe(struct tr__dsmon *d, const struct tr_pipe_run_result *r, uint64_t now);
void tr__dsmon_destroy(tr_engine_t *eng);
/* A training micro-batch's forward ran from t0 to t1. */
void tr__dsmon_forward(struct tr__dsmon *d, uint64_t t0, uint64_t t1);
/* Its backward ran from t0 to t1; off the boundary this ends the micro-step's outputs. */
void tr__dsmon_backward(struct tr__dsmon *d, uint64_t t0, uint64_t t1, bool boundary);
/* The boundary's STEP_DONE arrived: the step's outputs. */
void tr__dsmon_step(struct tr__dsmon *d, const tr_step_stats_t *st,
                    const tr_msg_step_done_t *done);

/* ZeRO's partitions, DeepSpeed's way: the flat buffer's n elements padded to a multiple of
 * 2 world and cut into world equal slices; rank r owns [r S, (r + 1) S) of it, clipped to n
 * (the padding is never stored). */
static inline size_t tr__zero_slice(size_t n, int world)
{
    size_t q = 2 * (size_t)world;
    return (n + q - 1) / q * q / (size_t)world;
}

static inline void tr__zero_owned(size_t n, int world, int rank, size_t *lo, size_t *hi)
{
    size_t S = tr__zero_slice(n, world), a = (size_t)rank * S, b = a + S;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

/* optimizer.c: the state checkpoints save and restore, as a msgpack map (on the optimizer's
 * thread: it packs into an ENGINE_STATE's bytes, and unpacks from them). */
int tr__optimizer_state_pack(const tr__optim_t *o, void *pk); /* a msgpack_packer * */
int tr__optimizer_state_unpack(tr__optim_t *o, const void *obj, char *err, size_t errlen);
/* The moment arrays' names and count (0 when the optimizer keeps none); fixed at create. */
int tr__optimizer_array_names(const tr_engine_t *eng, const char **names, int max);

#endif
