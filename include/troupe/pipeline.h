/* troupe/pipeline.h: pipeline schedules, as pure functions, and their simulation in virtual
 * time.
 *
 * A schedule says what one stage of an S-stage pipeline does to train (or run inference on)
 * M micro-batches: a list of steps, each a list of instructions. The 1F1B training schedule
 * and the inference schedule are DeepSpeed's (deepspeed/runtime/pipe/schedule.py:
 * TrainSchedule, InferenceSchedule), instruction for instruction and buffer for buffer, so
 * `troupe pipeline schedule` prints the lists DeepSpeed's engine executes. The "zb" training
 * schedule goes past 1F1B: each backward is split into its input-gradient part (BackwardInput,
 * which the previous stage waits for) and its weight-gradient part (BackwardWeight, which
 * nobody waits for), and the weight-gradient work fills the time a stage would otherwise sit
 * waiting (the zero-bubble idea, ZB-H1: at most as many activations live as 1F1B keeps).
 *
 * Every instruction names its micro-batch (DeepSpeed's carry only a buffer; a send's
 * micro-batch is the previous step's), so a stage's stream can be executed, and simulated,
 * without a barrier between steps: a receive waits for the matching send, compute for its
 * inputs. tr_pipe_simulate runs the S streams with given costs and measures the bubble.
 */
#ifndef TR_INCLUDE_TROUPE_PIPELINE_H
#define TR_INCLUDE_TROUPE_PIPELINE_H

#include <stddef.h>

#include "troupe/config.h"
#include "troupe/model.h"
#include "troupe/msg.h"
#include "troupe/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Instructions, by DeepSpeed's names (tr_pipe_op_name). */
typedef enum {
    TR_PIPE_LOAD_MICRO_BATCH = 1, /* LoadMicroBatch: the first and last stage read their data */
    TR_PIPE_FORWARD,              /* ForwardPass */
    TR_PIPE_BACKWARD,             /* BackwardPass (1F1B: input and weight gradients) */
    TR_PIPE_SEND_ACTIVATION,      /* SendActivation: to the next stage */
    TR_PIPE_RECV_ACTIVATION,      /* RecvActivation: from the previous stage */
    TR_PIPE_SEND_GRAD,            /* SendGrad: the input gradient, to the previous stage */
    TR_PIPE_RECV_GRAD,            /* RecvGrad: from the next stage */
    TR_PIPE_REDUCE_TIED_GRADS,    /* ReduceTiedGrads: over the stages sharing a weight */
    TR_PIPE_REDUCE_GRADS,         /* ReduceGrads: over the data-parallel replicas */
    TR_PIPE_OPTIMIZER_STEP,       /* OptimizerStep */
    TR_PIPE_BACKWARD_INPUT,       /* BackwardInput (zb): the input gradient only */
    TR_PIPE_BACKWARD_WEIGHT,      /* BackwardWeight (zb): the weight gradients only */
} tr_pipe_op_t;

typedef enum {
    TR_PIPE_TRAIN_1F1B = 1, /* DeepSpeed's TrainSchedule */
    TR_PIPE_INFERENCE,      /* DeepSpeed's InferenceSchedule */
    TR_PIPE_TRAIN_ZB,       /* 1F1B with split backwards, weight gradients in the bubbles */
} tr_pipe_kind_t;

typedef struct tr_pipe_instr {
    int op;          /* tr_pipe_op_t */
    int buffer;      /* the activation buffer it uses; -1: none (the step's collectives) */
    int micro_batch; /* the micro-batch it moves or computes; -1: none */
} tr_pipe_instr_t;

/* The most stages and micro-batches a schedule has: `troupe pipeline` and
 * tr_pipe_schedule_create check against these, the config's pipeline.stages against the same
 * TR_CONFIG_MAX_STAGES. */
#define TR_PIPE_MAX_STAGES        TR_CONFIG_MAX_STAGES
#define TR_PIPE_MAX_MICRO_BATCHES 65535

/* One stage's schedule, built by tr_pipe_schedule_create. */
typedef struct tr_pipe_schedule tr_pipe_schedule_t;

/* Builds stage `stage`'s schedule of `kind` for M micro-batches on S stages. TR_EINVAL with
 * err (naming the argument and its range) for S < 1, M < 1, a stage outside [0, S), an
 * unknown kind; TR_ENOMEM. Free with tr_pipe_schedule_destroy. Any thread. */
int tr_pipe_schedule_create(tr_pipe_schedule_t **out, int kind, int micro_batches, int stages,
                            int stage, char *err, size_t errlen);
void tr_pipe_schedule_destroy(tr_pipe_schedule_t *s);

/* Its number of steps (1F1B: 2 (M + S - 1); inference: M + S - 1; zb: one per compute
 * instruction, then one for the step's collectives) and of activation buffers (1F1B:
 * max(2, min(S - stage, M)); inference: 2; zb: the most micro-batches live at once, from a
 * forward to its weight gradient). */
int tr_pipe_schedule_steps(const tr_pipe_schedule_t *s);
int tr_pipe_schedule_buffers(const tr_pipe_schedule_t *s);

/* Step `step`'s instructions, in order: *n of them from *out (valid until destroy). A step
 * outside [0, steps) has none. */
const tr_pipe_instr_t *tr_pipe_schedule_step(const tr_pipe_schedule_t *s, int step, int *n);

/* DeepSpeed's name of an instruction ("ForwardPass"); "?" for an unknown op. */
const char *tr_pipe_op_name(int op);

/* One step as `troupe pipeline schedule` prints it: "5: RecvGrad(0) SendActivation(2)
 * BackwardPass(0)" (an instruction without a buffer has empty parentheses; an empty step is
 * "8:"). Returns what snprintf returns. */
int tr_pipe_schedule_format_step(const tr_pipe_schedule_t *s, int step, char *out, size_t len);

/* Costs in virtual time units: a forward, a whole backward (1F1B and inference), its
 * input-gradient and weight-gradient parts (zb; their sum is the whole backward), per stage
 * alike. Sends, receives, loads and the step's collectives cost nothing. */
typedef struct tr_pipe_costs {
    double forward, backward, backward_input, backward_weight;
} tr_pipe_costs_t;

typedef struct tr_pipe_sim {
    double makespan; /* from the first instruction to the last stage's end */
    double busy;     /* compute time summed over the stages */
    double bubble;   /* 1 - busy / (S makespan) */
    double theory;   /* 1F1B's (S - 1) / (M + S - 1) for these M, S */
} tr_pipe_sim_t;

/* Runs the S stages' schedules (stages[s] is stage s's, all of one kind, M and S) against each
 * other in virtual time: a stage executes its instructions in order, a receive waits for the
 * matching send, compute takes its cost. TR_EINVAL with err when the schedules do not belong
 * together, or a stage waits for a send that never comes (a deadlock, naming the stage and the
 * instruction). Any thread. */
int tr_pipe_simulate(const tr_pipe_schedule_t *const *stages, int n_stages,
                     const tr_pipe_costs_t *costs, tr_pipe_sim_t *out, char *err, size_t errlen);

/* --- running a schedule ------------------------------------------------------------------
 *
 * tr_pipe_create spawns the S stages of a schedule as pinned actors of the caller's runtime
 * (each on its own thread, so a stage's compute never waits for another's), once; the
 * pipeline then runs batch after batch with tr_pipe_run. A batch is a PIPE_XFER of kind start
 * to each stage, which may name the batch's tensors (tr_pipe_run_batch: references into
 * buffers the caller registered); the stage resolves them and hands them to the caller's start
 * callback, on its own thread, before its first instruction. A send is a PIPE_XFER message
 * to the neighbour stage; it carries its header (kind, step, micro-batch, stages, dtype,
 * elements), which the receiver checks against what its schedule expects, so a mismatch is
 * an error naming both stages instead of a hang. A receive waits for its message; an early
 * one waits in the stage until its instruction. Every other instruction is the caller's exec
 * callback, on the stage's thread. Each stage reports its losses (PIPE_LOSS) and its end,
 * timings or failure (PIPE_DONE) to the pipeline's runner actor, which assembles the batch's
 * result from those messages alone. */

struct tr_monitor;

/* What an instruction reports besides its code: a forward on the last stage sets loss and
 * has_loss (the micro-batch's loss comes back in tr_pipe_run's losses); a failing one may
 * explain itself in why (then the run's error is that text, else one naming the stage, the
 * instruction and the code). */
typedef struct tr_pipe_report {
    float loss;
    int has_loss;
    char why[400];
} tr_pipe_report_t;

/* Runs instruction x on stage `stage` (its thread): compute, a load, the step's collectives.
 * `in` is the tensor the stage received for x's micro-batch when x is a ForwardPass (the
 * previous stage's activation) or a BackwardPass / BackwardInput (the next stage's gradient);
 * NULL otherwise, on the first stage's forward, the last stage's backward, and in a run
 * without send_mem. It stays valid until the instruction returns. rep starts zeroed. 0, or a
 * negative TR_E* code, which stops the batch (the error names the stage and x). A callback
 * touches only what belongs to its stage. */
typedef int (*tr_pipe_exec_fn)(void *user, int stage, const tr_pipe_instr_t *x, const void *in,
                               tr_pipe_report_t *rep);

/* The tensor stage `stage` sends in instruction x (a SendActivation or a SendGrad): its
 * address, which lies in the stage's send area for that kind of send (*area, *area_bytes, the
 * same for every send of the kind). The stage registers each area in the runtime's buffer
 * registry once, and the transfer carries a reference into it (across ranks, the link sends
 * the bytes). The bytes must stay unchanged until the receiver's compute of that micro-batch
 * has run: the schedule guarantees it for a slot of the sender's buffers (an activation:
 * micro-batch mod the sender's buffers) or of the receiver's (a gradient: mod the previous
 * stage's). */
typedef void *(*tr_pipe_send_fn)(void *user, int stage, const tr_pipe_instr_t *x, void **area,
                                 size_t *area_bytes);

/* A batch's tensors (tr_pipe_run_batch), for the stages: references into buffers the caller
 * registered (troupe/buffer.h), e.g. a model's inputs and its targets for the M micro-batches
 * (buffer_id 0: none). They travel in each stage's start message. */
#define TR_PIPE_BATCH_TENSORS 2
typedef struct tr_pipe_batch {
    tr_tensor_ref_t tensor[TR_PIPE_BATCH_TENSORS];
} tr_pipe_batch_t;

/* Called on stage `stage`'s thread when a batch starts, before its first instruction:
 * tensors[i] is the address of the batch's tensor i, resolved through the registry from the
 * start message's reference (NULL for none, and in a batch run by tr_pipe_run), bytes[i] its
 * length. The bytes stay the caller's, unchanged until the batch ends: the stage reads them,
 * never writes them. rep starts zeroed (its why explains a failure). 0, or a negative TR_E*
 * code, which fails the batch. */
typedef int (*tr_pipe_start_fn)(void *user, int stage, void *const *tensors,
                                const unsigned long long *bytes, tr_pipe_report_t *rep);

typedef struct tr_pipe_run_opts {
    int kind, stages, micro_batches; /* the schedule (tr_pipe_kind_t, S, M) */
    tr_pipe_exec_fn exec;
    void *user;
    unsigned long long link_elements; /* elements of each activation and gradient sent */
    const unsigned long long *links;  /* or, per link s (stages s and s + 1), its elements
                                       * (S - 1 of them; NULL: link_elements for all); copied */
    int link_dtype;                   /* their tr_dtype_t */
    tr_pipe_send_fn send_mem;         /* the tensors sent (NULL: headers only, a synthetic run
                                       * whose stages exchange no data) */
    tr_pipe_start_fn start;           /* a batch's tensors, at its start (may be NULL) */
    struct tr_monitor *monitor;       /* traces each stage's compute on the stage actor's own
                                       * lane (NULL: none); borrowed */
    int across_ranks;                 /* 1: the job's ranks are the stages (from the MPI launcher's
                                       * environment): this process runs its own stage and its transfers go
                                       * over MPI point to point; the result is its stage's */
    int replicas; /* across ranks: data-parallel replicas of the pipeline (0 or 1: one);
                   * the world is stages x replicas, stage-major as DeepSpeed's
                   * PipeDataParallelTopology lays it out: rank = stage * replicas +
                   * replica, so a stage's neighbours are rank -/+ replicas */
} tr_pipe_run_opts_t;

typedef struct tr_pipe_run_result {
    double makespan_ms; /* from the start to the last stage's end */
    double busy_ms;     /* time in compute instructions, summed over the stages */
    double bubble;      /* 1 - busy / (S makespan) */
    double theory;      /* 1F1B's (S - 1) / (M + S - 1) */
    /* DeepSpeed's pipeline timers, summed over the stages: time waiting in RecvActivation and
     * RecvGrad, and spent in SendActivation and SendGrad */
    double recv_input_ms, recv_grad_ms, send_output_ms, send_grad_ms;
    double forward_ms, backward_ms; /* compute in forwards and in backwards (both parts) */
} tr_pipe_run_result_t;

/* A pipeline: its stage actors, spawned once, and its runner. */
typedef struct tr_pipe tr_pipe_t;

/* Spawns the stages (across ranks: this rank's stage and its link to the other ranks) and
 * the runner on rt, as actors named "stage<s>", "pipe-link" and "pipe-runner" (so one pipeline
 * per runtime). TR_EINVAL with err for bad options (*out NULL); a spawn's error (*out is set
 * all the same, and rt is shut down: the actors made so far stop with it). Free with
 * tr_pipe_destroy after the runtime has closed (the actors stop with it, or tr_pipe_stop). For
 * tests, TROUPE_FAULT_PIPE_STAGE=s makes stage s send one element too many. Any thread. */
int tr_pipe_create(tr_pipe_t **out, tr_runtime_t *rt, const tr_pipe_run_opts_t *o, char *err,
                   size_t errlen);
void tr_pipe_destroy(tr_pipe_t *p);

/* Asks the pipeline's actors to stop (each after the batch in progress, if any), as
 * tr_runtime_shutdown would, for a runtime that goes on without them. NULL does nothing. Any
 * thread. */
void tr_pipe_stop(tr_pipe_t *p);

/* Across ranks: from the next batch on, the link tells `watchdog` (an actor: the engine's comm
 * actor) of each transfer with another rank as it starts and ends (COMM_WATCH messages), so
 * that one pending past troupe.comm.timeout_s is diagnosed as a collective would be, naming
 * the rank it waits on; when the watchdog ends the job it tells the link, whose batch then
 * fails at once (the stages stop waiting and tr_pipe_run returns). In one process: nothing.
 * 0, or the send's error. The threads tr_pipe_run allows, between batches. */
int tr_pipe_watch(tr_pipe_t *p, tr_actor_t watchdog);

/* Runs one batch, numbered step (carried by every transfer), and waits for it: losses (M of
 * them; may be NULL) get the last stage's PIPE_LOSS values (copied on this thread once the
 * batch is over; an entry whose loss never came is left as it was), out its timing. The first
 * stage's failure (a callback's code, a transfer whose header does not match, naming both
 * stages) otherwise; the stages are then ready for the next batch (across ranks a failed
 * pipeline runs no more: TR_EFAILED). A thread that is not one of rt's workers (the caller's,
 * or a pinned actor's), one batch at a time. */
int tr_pipe_run(tr_pipe_t *p, unsigned long long step, float *losses, tr_pipe_run_result_t *out,
                char *err, size_t errlen);
/* tr_pipe_run, whose start messages carry batch's references (NULL: none), for the stages'
 * start callback; a reference that does not resolve, or a start callback's failure, fails the
 * batch, naming the stage. The caller leaves the buffers unchanged until it returns. The
 * threads tr_pipe_run allows. */
int tr_pipe_run_batch(tr_pipe_t *p, unsigned long long step, const tr_pipe_batch_t *batch,
                      float *losses, tr_pipe_run_result_t *out, char *err, size_t errlen);

/* --- a model trained through a pipeline, in one process or across ranks ---------------------
 *
 * tr_pipe_model cuts a model (troupe/model.h) into S stages at the given layer bounds, each with
 * its schedule's activation slots, spawns them once as a pipeline's stage actors on the
 * caller's runtime (tr_pipe_create), and runs a batch of M micro-batches through
 * tr_pipe_run_batch: the caller's micro-batches are copied into the pipelined model's registered
 * staging area (its inputs and targets), on the caller's thread, and each stage's start message
 * names them, so each stage reads the batch through the registry, as its own view; a
 * stage's output and a backward's input gradient are copied into the stage's send slots, which
 * the schedule keeps until the neighbour has used them, and travel as references into them
 * (across ranks, as bytes). The gradients accumulate into the model's buffer as M
 * micro-batches of tr_model_forward/backward would (the tied ones reduced after the batch), so
 * the optimizer step that follows is the unpipelined one. zb's BackwardInput runs each layer's
 * input-gradient part (tr_model_stage_backward_input: GPT-2's blocks and linear layers split
 * their backward; other layers run whole there) and BackwardWeight the parameter gradients,
 * bitwise what the whole backward adds. */

typedef struct tr_pipe_model tr_pipe_model_t;

/* bounds[0] = 0 < bounds[1] < ... < bounds[S] = the model's layers: stage s holds layers
 * [bounds[s], bounds[s + 1]). replicas 0: every stage runs in this process; >= 1: across
 * ranks (tr_pipe_run_opts_t.replicas): this process makes and runs its rank's stage only, and
 * the world must be stages x replicas. The stage actors are spawned on rt, their compute
 * traced on monitor (may be NULL); destroy after rt has closed. TR_EINVAL with err for bad
 * bounds, shapes or world; TR_ENOMEM; a spawn's error. */
int tr_pipe_model_create(tr_pipe_model_t **out, tr_runtime_t *rt, tr_model_t *model,
                         const int *bounds, int stages, int kind, int micro_batches, int B, int T,
                         int replicas, struct tr_monitor *monitor, char *err, size_t errlen);
void tr_pipe_model_destroy(tr_pipe_model_t *pm);
/* tr_pipe_stop for its stage actors. NULL does nothing. Any thread. */
void tr_pipe_model_stop(tr_pipe_model_t *pm);

/* tr_pipe_watch for its pipeline. */
int tr_pipe_model_watch(tr_pipe_model_t *pm, tr_actor_t watchdog);

/* Across ranks: the stage this process runs; -1 in one process (every stage). */
int tr_pipe_model_stage(const tr_pipe_model_t *pm);

/* One batch: micro-batch i is batches[i] (B, T as at create; tokens or x, as the model's first
 * layer reads, and the targets its loss layer reads), copied on this thread into the staging
 * area before the stages start (they never read batches itself); losses[i] gets its loss
 * (across ranks, on the last stage's ranks only). TR_EINVAL naming the micro-batch when one
 * has another shape or lacks a field the model reads. Gradients accumulate (zero them
 * before, as for the model; across ranks a stage's tied gradients stay apart until
 * tr_pipe_model_reduce_grads). result (may be NULL) gets the run's timing and bubble. Errors
 * name the stage and layer. */
int tr_pipe_model_run(tr_pipe_model_t *pm, const tr_batch_t *batches, float *losses,
                      unsigned long long step, tr_pipe_run_result_t *result, char *err,
                      size_t errlen);

/* Across ranks, each rank holds only its stage: its layers' range of the model's flat
 * parameter and gradient buffers, and the tied tensors its layers use (a tensor of another
 * stage's layer: GPT-2's wte, which the last stage's head reads), and it touches nothing else
 * of them. What the whole model gave every rank travels in the calls below, on the caller's
 * thread, between batches; every rank of the pipeline makes the same calls in the same order
 * (they are collective). Each fails with err naming the operation, and after
 * tr_pipe_model_set_timeout's seconds (default 300) waiting for another rank. In one process
 * they are TR_EINVAL (tr_pipe_model_zero_grad zeroes the model's gradients). The thread that
 * runs the batches (tr_pipe_model_run's), between batches. */
void tr_pipe_model_set_timeout(tr_pipe_model_t *pm, double seconds);
/* After a batch: the tied gradients summed between the two stages that hold them (the
 * owner's stage steps them; the user's part is zeroed), then the stage's range all-reduced
 * among its replicas (the ranks of the same stage): each value times pre before the sum, the
 * sum times post (a mean over R replicas: pre 1, post 1 / R). */
int tr_pipe_model_reduce_grads(tr_pipe_model_t *pm, float pre, float post, char *err,
                               size_t errlen);
/* After an optimizer step: partitioned (ZeRO 1): the replicas' slices of the stage's range
 * (DeepSpeed's cut: its elements padded to a multiple of 2 R, in R equal slices, the last
 * clipped) all-gathered; then the tied
 * tensors' new values sent from the stage that owns them to the stage that uses them. */
int tr_pipe_model_sync_params(tr_pipe_model_t *pm, int partitioned, char *err, size_t errlen);
/* An evaluation batch (B, T as at create) forwarded through the replica's stages, each on its
 * own ranks; *has_loss is 1 on the last stage, which gets the loss in *loss. */
int tr_pipe_model_eval(tr_pipe_model_t *pm, const tr_batch_t *batch, float *loss, int *has_loss,
                       char *err, size_t errlen);
/* For a caller that reads the whole model (an export, sampling): every stage's parameters
 * broadcast from its first replica to every rank (in one process: nothing to do). They stay
 * whole until the next batch or evaluation, which gives the other stages' back to the
 * kernel. */
int tr_pipe_model_gather_params(tr_pipe_model_t *pm, char *err, size_t errlen);
/* Zeroes the gradients this process holds (across ranks: its stage's range and tied area). */
void tr_pipe_model_zero_grad(tr_pipe_model_t *pm);

/* DeepSpeed's partition methods over the model's layers into S stages, as bounds (S + 1
 * ints): "uniform" (layer counts), "parameters" (parameter counts, balanced: the largest
 * stage as small as can be), "type:REGEX" (balance the layers whose kind or name matches the
 * regular expression, case-insensitive). TR_EINVAL with err for an unknown method, a bad
 * regex, or more stages than layers. */
int tr_pipe_partition(const tr_model_t *model, const char *method, int stages, int *bounds,
                      char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
