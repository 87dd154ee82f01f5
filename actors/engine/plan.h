/* plan.h: what the engine's actors know of each other, fixed before the first message.
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
 * (tr__plan_t: shapes, config, the model's layer table, the optimizer's slice, the peers'
 * addresses, registry ids), plus memory named by tensor references that resolve through the
 * runtime's buffer registry (troupe/buffer.h): parameters and gradients (the executor's while
 * it runs a micro-batch; a gradient range belongs to the bucketer/comm/optimizer chain once
 * its GRAD_READY is sent; parameters belong to the optimizer from the last REDUCED until it
 * sends STEP_DONE), loader slots, the client's staging batch and a checkpoint's staging
 * arrays. Each hand-over is a message, whose mailbox ordering (release on send, acquire on
 * receive) makes the previous owner's writes visible.
 *
 * The embedding API (engine.c) is a client outside the runtime (client.h): it sends an
 * ENGINE_REQ and waits in its reply slot until an actor answers with tr__reply. Everything
 * the client learns (step statistics, the accumulation window, the global step) comes in a
 * reply.
 *
 * What an actor may include of the engine: this header (which brings the client endpoint's,
 * client.h), its messages (troupe/msg.h) and the runtime. Each actor's spawn takes the plan as
 * a const view, which it keeps (as its `eng`) for its lifetime, and returns what it made (its
 * state, its address, its memory figures, the swapper's layout) to the code that assembles
 * the engine (engine.c); no actor writes the engine, and no spawn reads what another spawn
 * made, so their order is free.
 */
#ifndef TR_ACTORS_ENGINE_PLAN_H
#define TR_ACTORS_ENGINE_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "actors/engine/client.h"
#include "base/errf.h"
#include "base/vmem.h"
#include "troupe/buffer.h"
#include "troupe/config.h"
#include "troupe/engine.h"
#include "troupe/log.h"
#include "troupe/model.h"
#include "troupe/monitor.h"
#include "troupe/runtime.h"

#define TR__MAX_PREFETCH 64
/* The trace lane of the executor's forward and backward passes, below the runtime's own
 * lanes (the engine's few actors take the lowest slots). */
#define TR__LANE_PASSES (TR_RUNTIME_LANE_EXTERNAL - 1)
/* The lanes of the collectives in flight, one span each from post to completion: with a
 * backend that needs progress the communication happens there, not in the comm actor's short
 * handlers, so this is what the trace summary's "comm hidden" fraction measures. Collectives
 * in flight at once take one lane each (a lane's spans never overlap). */
#define TR__LANE_COLLECTIVES (TR_RUNTIME_LANE_EXTERNAL - 2)
#define TR__COLLECTIVE_LANES 4 /* TR__LANE_COLLECTIVES - k, k < 4 */
/* A checkpoint wait (a save, load or tr_engine_wait_checkpoint waiting for the last save to be
 * durable) as a span of its own lane: the trace shows the caller held up. */
#define TR__LANE_CKPT_WAIT (TR__LANE_COLLECTIVES - TR__COLLECTIVE_LANES)

/* ENGINE_STATE's kinds: a save collects state on its way executor -> optimizer ->
 * checkpointer, which copies it (the caller's reply), writes it (WRITE, to itself) and reports
 * to the executor (WRITTEN); once every rank's files are durable the executor asks rank 0's
 * checkpointer for latest (LATEST, reported as WRITTEN); when some rank's files could not be
 * written, every rank's checkpointer removes those it wrote (DISCARD). A restore hands the state
 * out checkpointer -> optimizer -> executor -> checkpointer (RESTORED). */
typedef enum {
    TR__STATE_SAVE = 1,
    TR__STATE_RESTORE,
    TR__STATE_RESTORED,
    TR__STATE_WRITE,
    TR__STATE_WRITTEN,
    TR__STATE_LATEST,
    TR__STATE_DISCARD, /* a save failed on some rank: remove the files this rank wrote for it */
} tr__state_kind_t;

/* PARAM_FETCH's kinds and passes (ZeRO 3: executor -> fetcher). */
enum {
    TR__FETCH_PASS = 1,      /* a pass over the layers starts */
    TR__FETCH_DONE = 2,      /* the pass is done with a layer */
    TR__FETCH_ALL = 3,       /* every layer whole (a save, tr_engine_gather_params) */
    TR__FETCH_REWRITTEN = 4, /* a restore wrote the whole buffer */
};
enum {
    TR__PASS_FORWARD = 1,       /* a training micro-batch's forward (its backward follows) */
    TR__PASS_BACKWARD = 2,      /* its backward: the layers from the last */
    TR__PASS_FORWARD_ALONE = 3, /* a forward with no backward (evaluation) */
};

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

/* The optimizer's state offloaded to NVMe (actors/optim/swapper.c): this rank's partition
 * [lo, hi) is cut into n_groups sub-groups of `group` elements (the last may be shorter).
 * Sub-group g's moment arrays lie in a swap buffer as n_arrays arrays of `group` floats each
 * (m, then v, then vmax), followed by the swapper's trailer; `slot_bytes` is that part's size and
 * a sub-group's slot in the swap file. With the parameters offloaded to NVMe too
 * (offload_param.device nvme) they live in a second file cut into the same sub-groups, and a
 * buffer holds the sub-group's parameters after its state: `param_bytes` more (`group` floats
 * and their trailer; 0 otherwise), `buf_bytes` in all. The optimizer steps a sub-group in one of
 * the n_bufs registered buffers buf_ids[] (owner: the swapper), which it names in SWAP
 * messages. The fetcher reads and writes parameter ranges with TR__SWAP_READ_PARAMS and
 * TR__SWAP_WRITE_PARAMS, naming any registered buffer's range ([group, group + n) of the flat
 * parameters, n the reference's floats). */
#define TR__MAX_SWAP_BUFS 64
enum {
    TR__SWAP_READ = 1,         /* a sub-group's state (and parameters) into a swap buffer */
    TR__SWAP_WRITE = 2,        /* ... from it */
    TR__SWAP_WRITE_STATE = 3,  /* its state only (a restore: the parameters come from the model) */
    TR__SWAP_READ_PARAMS = 4,  /* a range of the parameter file into a registered buffer */
    TR__SWAP_WRITE_PARAMS = 5, /* ... from it */
    TR__SWAP_PUT_GRADS = 6,    /* reduced gradients [group, group + n) into the gradient file */
};
/* Sends the swapper a SWAP request (op, group, tag, buf as tr__swap_layout_t says) for step
 * `step`; 0, or the send's error with the message freed. The caller's actor thread. */
static inline int tr__swap_ask(tr_ctx_t *ctx, tr_actor_t swapper, uint32_t op, uint64_t group,
                               uint32_t tag, tr_tensor_ref_t buf, uint64_t step)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_SWAP);
    if (!m) return TR_ENOMEM;
    *TR_MSG_AS(m, swap) = (tr_msg_swap_t){.op = op, .group = group, .buf = buf, .tag = tag};
    m->step = step;
    int rc = tr_actor_send(ctx->rt, swapper, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    return rc;
}

typedef struct tr__swap_layout {
    size_t group, n_groups, slot_bytes, param_bytes, buf_bytes;
    size_t grad_bytes; /* with plan.swap_grads: a buffer's gradient region, after the
                        * parameters' (a slot of `group` floats); 0 otherwise */
    int n_arrays, n_bufs;
    uint64_t buf_ids[TR__MAX_SWAP_BUFS];
} tr__swap_layout_t;

/* The engine's fixed part, as the actors see it: filled by engine.c and setup_check.c before
 * the first message (the addresses as the actors are spawned), read-only after (any thread).
 * tr_engine_t holds it, and each actor keeps a const pointer to it. */
typedef struct tr__plan {
    tr_runtime_t *rt;
    const tr_config_t *cfg;
    const tr_model_t *model; /* actors other than the executor read only its layer table */
    int B, T, GAS, x_dim, y_dim, rank, world, prefetch;
    int stages;   /* pipeline.stages: stage actors the executor runs a step's micro-batches
                   * through (1: none) */
    int replicas; /* data-parallel replicas: each reads its own share of the data. world, or
                   * with a pipeline across ranks world / stages (a replica's stages are
                   * consecutive ranks: rank = stage * replicas + replica) */
    int replica;  /* this rank's: rank % replicas */
    /* With a pipeline across ranks, this rank's stage (rank / replicas) holds only its layers
     * [stage_first, stage_last], whose parameters and gradients are [own_lo, own_hi) of the
     * flat buffers, and the tied tensors they use (actors/pipe/model.c): it never touches the
     * rest. stage -1: the rank holds every layer (own_lo 0, own_hi n_params). */
    int stage, stage_first, stage_last;
    size_t own_lo, own_hi;
    size_t n_params;
    int zero;           /* the ZeRO stage in effect: 0 at world size 1 */
    size_t grad_window; /* ZeRO 2: the gradient elements the backward may have out for
                         * reduction at once (tr__grad_window); 0: the whole buffer stays */
    bool overlap_comm;  /* buckets leave during the backward (else after it) */
    uint64_t seed;
    double loss_scale0;            /* the loss scale of the first step */
    tr__optim_slice_t optim_slice; /* the optimizer's; checkpoints read it */
    int n_arrays;                  /* the optimizer's moment arrays (0: it keeps none) */
    const char *array_names[3];    /* their names in checkpoints, n_arrays of them */
    bool swaps; /* the optimizer keeps its state in the swapper's file (offload_optimizer.device
                 * nvme and an optimizer with state) */
    tr__swap_layout_t swap;  /* that file's layout, as the swapper's spawn made it */
    int param_offload;       /* ZeRO 3's offload_param.device in effect: TR_OFFLOAD_NONE, _CPU (the
                              * partition lives in buf_param_home) or _NVME (in the swapper's
                              * parameter file); the parameter buffer then holds only gathered layers */
    uint64_t buf_param_home; /* offload_param cpu: this rank's partition, hi - lo floats */
    bool swap_grads;   /* offload_param nvme with one micro-step per step: the reduced gradient
                        * partition goes to the swapper's gradient file as it arrives (PUT_GRADS)
                        * and comes back with each sub-group of the step, instead of staying in
                        * memory */
    tr_monitor_t *mon; /* NULL: off; thread-safe */
    tr_actor_t loader, executor, bucketer, comm, optimizer, checkpointer, supervisor;
    tr_actor_t swapper; /* NONE unless the optimizer's state or the parameters are on NVMe */
    tr_actor_t fetcher; /* ZeRO 3: gathers each layer's parameters; else NONE */
    uint64_t buf_params, buf_grads; /* registry ids */
    uint64_t buf_params_bf16;       /* the model's bf16 weight copies (bf16 mixed precision;
                                     * else 0): ZeRO 3's fetcher makes a layer's as it gathers */
    uint64_t buf_stage_in, buf_stage_targets, buf_stage_y; /* the client's staging batch */
    tr__client_t *client;
} tr__plan_t;

/* ZeRO's partitions, DeepSpeed's way: the flat buffer's n elements padded to a multiple of
 * 2 world and cut into world equal slices; rank r owns [r S, (r + 1) S) of it, clipped to n
 * (the padding is never stored). */
static inline size_t tr__zero_slice(size_t n, int world)
{
    size_t q = 2 * (size_t)world;
    return (n + q - 1) / q * q / (size_t)world;
}

/* ZeRO 2's gradient window, in elements, for n parameters whose largest layer has `largest`:
 * the backward hands each layer's gradient out as soon as it is done and starts a layer only
 * while the ranges out for reduction (handed out, not yet freed by the optimizer) and the
 * layer's own stay within k buckets (k = 2 with overlap_comm: one reducing while the next
 * fills; else 1) and the largest layer, so a rank never holds the whole gradient when the
 * buckets are smaller than the model. A window of at least one bucket beyond the layer always
 * has a whole bucket out when the backward waits, so the wait ends. bucket: reduce_bucket_size (<=
 * 0: the whole model). Tied tensors (GPT-2's wte, written by the head early in the backward and
 * handed out with its owner's layer) come on top: tr__tied_floats. */
static inline size_t tr__grad_window_of(size_t n, size_t largest, int64_t bucket, bool overlap)
{
    size_t b = bucket > 0 ? (size_t)bucket : n;
    size_t w = (overlap ? 2 : 1) * b + largest;
    return w < n ? w : n;
}

/* The same for a model: n its parameters, largest its largest layer's (memory_plan.c predicts
 * it from the layer table through tr__grad_window_of). */
static inline size_t tr__grad_window(const tr_model_t *m, int64_t bucket, bool overlap)
{
    size_t largest = 0;
    for (int i = 0; i < tr_model_num_layers(m); i++) {
        size_t c = tr_model_layer(m, i)->param_count;
        largest = c > largest ? c : largest;
    }
    return tr__grad_window_of(tr_model_num_params(m), largest, bucket, overlap);
}

/* ZeRO 3: the layer whose parameters layer i reads besides its own (a tied tensor's owner), or
 * -1. */
static inline int tr__layer_tie(const tr_model_t *m, int i)
{
    const tr_layer_t *l = tr_model_layer(m, i);
    return l->tie_count ? l->tie_layer : -1;
}

/* The first layer whose forward layer i's backward runs (activation checkpointing: the
 * backward of a kept group's last layer runs the group's forward again, model.c), or i. */
static inline int tr__backward_from(const tr_model_t *m, int i)
{
    int k = tr_model_checkpoint_interval(m), n = tr_model_num_layers(m);
    return k && i % k == k - 1 && i / k < (n - 1) / k ? i / k * k : i;
}

/* ZeRO 3: layer i's forward (or backward) reads parameters, of layers [first, i] (first: i, or
 * tr__backward_from) or of their tied tensors' owners, so the executor waits for the
 * fetcher's PARAM_READY. */
static inline bool tr__layer_fetched(const tr_model_t *m, int i, bool backward)
{
    for (int j = backward ? tr__backward_from(m, i) : i; j <= i; j++)
        if (tr_model_layer(m, j)->param_count > 0 || tr__layer_tie(m, j) >= 0) return true;
    return false;
}

/* ZeRO 3: a layer of n parameters stays whole on every rank (the fetcher's persistent layers:
 * at most param_persistence_threshold each, model_persistence_threshold in all, counted in
 * layer order, `kept` before it). */
static inline bool tr__persists(size_t n, size_t kept, const tr_config_t *c)
{
    return n && (int64_t)n <= c->zero.param_persistence_threshold &&
           (int64_t)(kept + n) <= c->zero.model_persistence_threshold;
}

/* ZeRO 3: the parameter floats a rank holds at most, of n: its slice, the `kept` persistent
 * ones, and the fetcher's gathered layers (max_live_parameters, and one position beyond it:
 * `largest`, the most one layer's pass reads, a checkpointed group's in a backward). */
static inline size_t tr__zero3_params_of(size_t n, int world, size_t kept, size_t largest,
                                         const tr_config_t *c)
{
    size_t rest = n - kept, live = (size_t)c->zero.max_live_parameters + largest;
    /* offload_param nvme: the slice is on disk (its cache is the swapper's) */
    size_t slice = c->zero.offload_param.device == TR_OFFLOAD_NVME ? 0 : tr__zero_slice(n, world);
    size_t held = slice + kept + (live < rest ? live : rest);
    return held < n ? held : n;
}

/* ZeRO 3: the parameters of [a, b) outside this rank's slice [lo, hi) go back to the kernel,
 * and their bf16 copies (bf16: NULL without); the pages read as zeros until written again. */
static inline void tr__release_outside(float *params, uint16_t *bf16, size_t a, size_t b, size_t lo,
                                       size_t hi)
{
    size_t x = b < lo ? b : lo, y = a > hi ? a : hi;
    if (x > a) tr__vmem_release(params + a, (x - a) * sizeof(float));
    if (b > y) tr__vmem_release(params + y, (b - y) * sizeof(float));
    if (bf16 && x > a) tr__vmem_release(bf16 + a, (x - a) * sizeof(uint16_t));
    if (bf16 && b > y) tr__vmem_release(bf16 + y, (b - y) * sizeof(uint16_t));
}

/* The elements of tied tensors: written by one layer, handed out with another's range. */
static inline size_t tr__tied_floats(const tr_model_t *m)
{
    size_t t = 0;
    for (int i = 0; i < tr_model_num_layers(m); i++)
        t += tr_model_layer(m, i)->tie_count;
    return t;
}

static inline void tr__zero_owned(size_t n, int world, int rank, size_t *lo, size_t *hi)
{
    size_t S = tr__zero_slice(n, world), a = (size_t)rank * S, b = a + S;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

#endif
