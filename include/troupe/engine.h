/* The training engine: DeepSpeed's engine as actors, embedded in a C program.
 *
 * tr_engine_create builds a runtime and the engine's actors — loader, executor (pinned),
 * bucketer, comm, optimizer (pinned), checkpointer (pinned) — for a model, a DeepSpeed config
 * and a dataset. Two ways to drive it:
 *
 *  1. Engine-driven: tr_engine_train_batch runs gradient_accumulation_steps micro-batches
 *     drawn by the loader, then the optimizer step; tr_engine_eval measures the loss.
 *  2. DeepSpeed-style, for trainers that own their loop: tr_engine_forward(batch),
 *     tr_engine_backward, tr_engine_step (a no-op except at the accumulation boundary).
 *
 * Every call below is synchronous for its caller (it sends a request to the actors and waits
 * for their answer) and is made from one thread at a time, the thread that created the engine
 * or any other, but never from inside an actor. Failures inside the actors (a layer's forward
 * returning an error, a checkpoint that cannot be written, a loss-scale underflow) come back
 * as the call's error, and tr_engine_error says which actor, layer and step.
 *
 * Arguments are checked first: a NULL engine, out-pointer or required input returns TR_EINVAL
 * (never a crash) with a message naming the function and the argument, in the thread's
 * tr_last_error() and, when there is an engine, in tr_engine_error too. A call made while
 * another thread's call on the same engine runs returns TR_EBUSY, explained in the refused
 * thread's tr_last_error() (tr_engine_error stays the running call's).
 */
#ifndef TR_INCLUDE_TROUPE_ENGINE_H
#define TR_INCLUDE_TROUPE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "troupe/config.h"
#include "troupe/runtime.h"
#include "troupe/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_engine tr_engine_t;

/* --- datasets -------------------------------------------------------------------------- */

/* A user's batch source: fill the inputs and targets of the batch numbered `index` (0, 1,
 * 2, ... in the order the loader asks). Inputs: tokens, (B, T) token ids, or for a
 * float-input model x, (B, T, x_dim) floats (the other is NULL). Targets: targets, (B, T)
 * ints, for a model whose loss layer reads integer targets (cross-entropy), or y,
 * (B, T, y_dim) floats, for one that reads float targets (MSE); the other is NULL. Return 0,
 * or a negative TR_E* code to stop training with that error. Called on the loader's thread
 * (the executor's for the validation set). */
typedef int (*tr_batch_cb)(void *user, uint64_t index, int B, int T, int *tokens, float *x,
                           int *targets, float *y);

typedef struct tr_dataset {
    /* llm.c token shards: a glob ("data/train_*.bin"); each shard's windows of B*T+1 tokens
     * become (inputs, targets shifted by one). Ignored when `batch` is set. */
    const char *shards;
    tr_batch_cb batch; /* or a callback */
    void *user;
    int x_dim; /* floats per position for a float-input model (0 for tokens); must be
                * the first layer's input width */
    int y_dim; /* floats of target per position for a float-target model (0: integer
                * targets); must be what the model's loss layer reads */
} tr_dataset_t;

/* --- creating ------------------------------------------------------------------------- */

typedef struct tr_engine_opts {
    const char *config_path;   /* a DeepSpeed JSON config, or: */
    const tr_config_t *config; /* an already loaded one: the engine reads it until
                                * tr_engine_destroy, so destroy it after the engine */
    tr_model_t *model;         /* the engine takes ownership, also on failure */
    tr_dataset_t train;        /* for tr_engine_train_batch (unused for forward/backward) */
    tr_dataset_t val;          /* for tr_engine_eval (optional) */
    int seq_len;               /* T: positions per sequence (1 for an MLP) */
    uint64_t seed;             /* data order and parameter init; 0 = the config's */
    int init_params;           /* 1: initialise the parameters from seed (training from
                                * scratch); 0: keep the model's (loaded from a file) */
    int handle_signals;        /* SIGINT/SIGTERM: finish the step, then stop (see
                                * tr_engine_stop_requested) */
    int rank, world;           /* this process's data-parallel rank and the world size; world
                                * 0: from the launcher's environment (mpirun, srun: see
                                * docs/runtime.md), 1: one process whatever it says */
    const char *trace_dir;     /* write actor timelines here (overrides the config's
                                * troupe.trace); NULL: as the config says */
} tr_engine_opts_t;

/* Creates the engine into *out. Errors (a bad config, a dataset that cannot be opened, a model
 * the config cannot train; NULL out, opts or opts->model: TR_EINVAL) return a negative code and
 * a message, in err when it is not NULL (errlen bytes) and in tr_last_error(). Any thread,
 * never from inside an actor; the engine is then driven from any thread, one call at a time
 * (the header's first comment). */
int tr_engine_create(tr_engine_t **out, const tr_engine_opts_t *opts, char *err, size_t errlen);

/* Stops the actors and frees everything, the model too. NULL does nothing. */
void tr_engine_destroy(tr_engine_t *eng);

/* --- engine-driven training ------------------------------------------------------------ */

typedef struct tr_step_stats {
    uint64_t global_step;    /* optimizer steps taken, skipped ones included (DeepSpeed) */
    uint64_t global_samples; /* samples consumed */
    uint64_t skipped_steps;  /* steps skipped on overflow so far */
    float loss;              /* mean loss over the step's micro-batches, every rank's */
    double lr;               /* learning rate used by this step */
    double grad_norm;        /* global gradient norm before clipping (0 when skipped) */
    double loss_scale;       /* fp16 loss scale in use (1 without fp16) */
    int skipped;             /* this step was skipped (overflow) */
    uint64_t tokens;         /* positions processed by this step, over every rank */
    double step_ms;          /* wall time of the whole step */
} tr_step_stats_t;

/* Runs gradient_accumulation_steps micro-batches from the train dataset and one optimizer
 * step. stats may be NULL. The caller's thread. */
int tr_engine_train_batch(tr_engine_t *eng, tr_step_stats_t *stats);

/* Mean loss over the first n_batches micro-batches of the val dataset (the train one if none),
 * into *loss (required), without touching gradients or optimizer state. The same batches at
 * any world size: rank r of W evaluates batches r, W + r, ... and the mean is over all of
 * them. Every rank calls it. The caller's thread. */
int tr_engine_eval(tr_engine_t *eng, int n_batches, float *loss);

/* --- DeepSpeed-style -------------------------------------------------------------------- */

/* A batch for forward: B = train_micro_batch_size_per_gpu sequences of seq_len positions. */
typedef struct tr_engine_batch {
    const int *tokens;  /* (B, T) */
    const float *x;     /* (B, T, x_dim), for float-input models */
    const int *targets; /* (B, T), for a loss layer that reads integer targets */
    const float *y;     /* (B, T, y_dim), for one that reads float targets */
} tr_engine_batch_t;

/* Forward on one micro-batch (required); *loss (required) gets its mean loss (unscaled, not
 * divided by GAS). */
int tr_engine_forward(tr_engine_t *eng, const tr_engine_batch_t *batch, float *loss);

/* Backward for the last forward, accumulating gradients (the loss divided by GAS); at the
 * accumulation boundary (with ZeRO 2 on several ranks: at every micro-step) the gradient
 * buckets go to the communicator, as layers finish with overlap_comm, else after the pass; at
 * ZeRO 2 it first waits for the previous micro-step's reductions to free the buffer. */
int tr_engine_backward(tr_engine_t *eng);

/* The optimizer step at the accumulation boundary; a no-op returning 0 otherwise (as
 * DeepSpeed's engine.step()). stats, when not NULL, is filled at a boundary. */
int tr_engine_step(tr_engine_t *eng, tr_step_stats_t *stats);

/* DeepSpeed's is_gradient_accumulation_boundary(): true when the micro-batch in progress
 * (between its forward and its tr_engine_step), or else the next one, is the last of the
 * accumulation window, so that its tr_engine_step steps. The caller's thread, between calls;
 * it reads what the last call's reply said, never an actor's state. TR_EINVAL for a NULL eng. */
int tr_engine_is_boundary(const tr_engine_t *eng);

/* --- checkpoints ----------------------------------------------------------------------- */

/* Saves <dir>/<tag>/ (tag NULL: "global_step<N>") with model states (written by rank 0) and
 * the optimizer's states (with zero_optimization.stage >= 1 one file per data-parallel rank,
 * its partition; otherwise rank 0's alone), then <dir>/latest once every rank's files are
 * durable. Each file is written to a temporary name, fsynced and renamed; latest last: a
 * crash leaves the previous checkpoint loadable.
 *
 * In the background (checkpoint.writer.decoupled, the default): the call returns once the
 * state is copied, and the files are written while training goes on; latest moves when every
 * rank's files are durable (the ranks learn it at the next steps). At most one save is in
 * flight: a save or load first waits for the last one, and so does tr_engine_destroy. A
 * write that fails is logged as an error on every rank, leaves latest on the previous
 * checkpoint, and is returned by tr_engine_wait_checkpoint. With decoupled false the call
 * returns when latest names the new tag, with the save's outcome.
 *
 * Every rank must call it at the same step: a call on some ranks only fails the engine on
 * every rank, and no latest is written. dir is required and not empty; a tag must be one
 * directory name (not empty, ".", ".." nor containing '/'): otherwise TR_EINVAL naming it. */
int tr_engine_save_checkpoint(tr_engine_t *eng, const char *dir, const char *tag);

/* Waits until the last save's files are durable on every rank and latest names it; returns
 * its outcome (0, or the error that stopped it, once). 0 at once when no save is in flight
 * and none failed since the last call. Every rank must call it; between steps. */
int tr_engine_wait_checkpoint(tr_engine_t *eng);

/* Makes the parameters whole in tr_engine_model's buffer on this rank, for the caller to read
 * (an export, sampling): at zero_optimization.stage 3 each rank keeps only its slice and the
 * layers are gathered when used, so this all-gathers every layer; on a pipeline across ranks
 * each stage's ranks hold only their layers, so every stage's are broadcast. Every rank must
 * call it, as for a save; elsewhere they are whole already and it returns at once. Between
 * steps only (TR_EBUSY inside an accumulation window); read them before the next call that
 * trains or evaluates, which hands them back (ZeRO 3: down to max_live_parameters). */
int tr_engine_gather_params(tr_engine_t *eng);

/* Loads <dir>/<tag> (NULL: the tag in <dir>/latest): parameters, optimizer state, step
 * counters, scheduler, loss scaler, data position and RNG, so training resumes bit-exactly.
 * Checks sizes, checksums and compatibility with this engine's model and config; a mismatch
 * is an error that says what differs, and leaves the engine as it was. The checkpoint may
 * come from another number of ranks or ZeRO stage: the optimizer states are re-partitioned
 * and the per-rank data position rescaled (then the losses match within float summation
 * order). Every rank must call it; when any rank's checks fail, no rank changes. dir and tag
 * as for tr_engine_save_checkpoint. */
int tr_engine_load_checkpoint(tr_engine_t *eng, const char *dir, const char *tag);

/* --- queries --------------------------------------------------------------------------- */

/* The last error's explanation ("" if none). Valid until the next call. A NULL eng gets a
 * static text saying so. */
const char *tr_engine_error(const tr_engine_t *eng);

/* The engine's model, as a read-only view: the executor owns it. Its parameters may be read
 * between calls (not while a call runs); to change them, load a checkpoint. At
 * zero_optimization.stage 3 (and on a pipeline's ranks) the buffer holds this rank's part
 * only, the rest reading as zeros or as a stale copy: call tr_engine_gather_params first, and
 * read before the next training or evaluation call (after tr_engine_destroy the model keeps
 * what the rank held). The caller's thread. Both return NULL for a NULL eng (tr_last_error()
 * says so). */
const tr_model_t *tr_engine_model(const tr_engine_t *eng);
const tr_config_t *tr_engine_config(const tr_engine_t *eng);

/* The runtime the actors run on (for tracing and counters). NULL for a NULL eng. */
tr_runtime_t *tr_engine_runtime(const tr_engine_t *eng);

/* Optimizer steps taken so far, skipped ones included (tr_step_stats_t.global_step); after
 * tr_engine_load_checkpoint, the checkpoint's. The caller's thread, between calls. 0 for a NULL
 * eng (tr_last_error() says so). */
uint64_t tr_engine_global_step(const tr_engine_t *eng);

/* The memory this rank holds for training, in bytes, by kind: fixed at create (also logged
 * then). On W ranks, zero_optimization.stage 1 cuts the optimizer's states to about 1/W; stage
 * 2 keeps only this rank's 1/W of the reduced gradients (grad_partition), and its backward
 * holds only the gradients of the buckets in flight (grads: at most 2 buckets with
 * overlap_comm, else 1, plus the largest layer and any tied tensor). docs/engine.md has the
 * formulas; tr_engine_memory_predict computes them from a config and a model's shapes before
 * anything is allocated. */
typedef struct tr_engine_memory {
    uint64_t params;         /* fp32: every parameter; ZeRO 3: the slice (its home with
                              * offload_param cpu; on disk with nvme), the persistent layers
                              * and the gathered window */
    uint64_t grads;          /* fp32: the backward's (whole, or ZeRO 2's window) */
    uint64_t grad_partition; /* ZeRO 2: the reduced gradients this rank owns, accumulated */
    uint64_t optimizer;      /* the optimizer's moments in memory for the parameters this rank
                              * updates (0 when they are on NVMe: see swap) */
    uint64_t swap;           /* offload_optimizer nvme: the swap buffers the moments pass
                              * through; offload_param nvme: the parameters' too, and the
                              * swapper's cache of them (the rest is on disk) */
    uint64_t comm;           /* the communicator's staging (16-bit wire copies) and MPI's
                              * copies of the collectives in flight */
    uint64_t batches;        /* the loader's prefetch slots and the client's staging batch */
    uint64_t bf16_copies;    /* bf16 mixed precision: the weights' bf16 copies (2 bytes each) */
    uint64_t activations;    /* a micro-batch's forward and backward: the activations kept
                              * (checkpointed: the groups' outputs and one group's), the
                              * backward's scratch and boundary gradients, the model's copy of
                              * the batch; laid out at the first forward */
} tr_engine_memory_t;

/* Fills *out (required; for a NULL eng, with zeros); tr_last_error() says what was NULL. */
void tr_engine_memory(const tr_engine_t *eng, tr_engine_memory_t *out);

/* --- predicting memory ------------------------------------------------------------------ */

/* A model as the prediction sees it, for micro-batches of B sequences of T positions: each
 * layer's parameter floats and what it keeps, read from a model's layer table or worked out
 * from a model's dimensions without allocating anything of the model. */
typedef struct tr_memory_layer {
    size_t params;  /* floats of the layer's parameter range (param_count) */
    size_t tied;    /* floats of another layer's parameter it uses (tie_count; 0: none) */
    size_t acts;    /* activation floats it keeps at (B, T) (its act_size) */
    size_t scratch; /* floats of its backward's scratch at (B, T) */
    int in_dim, out_dim;
} tr_memory_layer_t;

typedef struct tr_memory_model {
    int B, T;
    int n_layers;
    tr_memory_layer_t *layers; /* n_layers of them; freed by tr_memory_model_close */
    int x_dim;                 /* the first layer's input floats per position (0: token ids) */
    int y_dim;                 /* the loss layer's float targets per position (0: integer) */
} tr_memory_model_t;

/* The shapes of a built model (its layer table), at (B, T). 0, TR_EINVAL (NULL model, B or T
 * < 1), TR_ENOMEM. Any thread, not while another call on the model runs. */
int tr_memory_model_of(tr_memory_model_t *out, const tr_model_t *model, int B, int T);
/* The shapes tr_model_gpt2_create / tr_model_mlp_create would build, worked out from their
 * dimensions with no model allocated: a GPT-2 of any size can be predicted on any machine.
 * TR_EINVAL with why for dimensions they would refuse (the same words), TR_ENOMEM. */
int tr_memory_model_gpt2(tr_memory_model_t *out, const tr_gpt2_config_t *config, int B, int T,
                         char *why, size_t why_len);
int tr_memory_model_mlp(tr_memory_model_t *out, const int *widths, int n, int B, int T, char *why,
                        size_t why_len);
/* Frees the layer table. NULL does nothing. */
void tr_memory_model_close(tr_memory_model_t *m);

/* What tr_engine_create would hold on `rank` of the config's world (cfg->ranks) for the model
 * m, by kind, into *out; `training`: with a train dataset (the loader's prefetch slots). The
 * figures are the engine's at that stage (docs/engine.md, Memory per rank); what the build
 * does differently from the config (offload_param, a pipeline's stages) is
 * said in note (may be NULL; "" when nothing). 0, or TR_EINVAL for a NULL argument or a rank
 * outside the world. Any thread. */
int tr_engine_memory_predict(const tr_config_t *cfg, const tr_memory_model_t *m, int rank,
                             int training, tr_engine_memory_t *out, char *note, size_t note_len);

/* The sum of every kind. */
uint64_t tr_engine_memory_total(const tr_engine_memory_t *m);

/* "parameters 12.0 MiB, gradients ..., total ... MiB": the kinds in the words of the engine's
 * start-up line and `troupe memory`, into buf (len bytes). */
void tr_engine_memory_format(const tr_engine_memory_t *m, char *buf, size_t len);

/* The memory this machine can give a new process: MemAvailable from /proc/meminfo, or the
 * cgroup v2 limit (memory.max less memory.current) when lower. *where names the source(s) for
 * messages (may be NULL). 0, or a negative code when neither can be read. Any thread. */
int tr_engine_memory_available(uint64_t *bytes, char *where, size_t where_len);

/* This process's data-parallel rank and the world size (1 for a single process). Any thread.
 * TR_EINVAL for a NULL eng. */
int tr_engine_rank(const tr_engine_t *eng);
int tr_engine_world(const tr_engine_t *eng);

/* True once SIGINT/SIGTERM arrived (with handle_signals): finish the step and stop. On several
 * ranks, true on every rank after the same step: the one after which the ranks learned (in
 * that step's loss all-reduce) that a signal reached one of them. TR_EINVAL (non-zero: stop)
 * for a NULL eng. */
int tr_engine_stop_requested(const tr_engine_t *eng);

#ifdef __cplusplus
}
#endif
#endif
