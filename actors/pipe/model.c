/* model.c: a model's batch run through a pipeline of stage actors, in one process or one
 * stage per rank (troupe/pipeline.h, tr_pipe_model_*).
 *
 * Each stage owns its part: its layers and activation slots (a tr_model_stage_t), its two send
 * areas, its view of the batch's micro-batches, and what it reports (its losses and failures
 * go to the pipeline's runner as messages, run.c); the stage actor's callbacks touch nothing
 * else of the pipelined model, whose shared fields are fixed at creation.
 *
 * How a batch reaches the stages. The pipelined model owns a staging area, registered in the
 * runtime's buffer registry at creation: the inputs (tokens or x) and the targets (integer or
 * float) of M micro-batches, each one buffer. tr_pipe_model_run copies the caller's batch into
 * it on the caller's thread, then sends each stage its start message, which carries the two
 * references (tr_pipe_run_batch): the copy happens before the sends, which publish it. Each
 * stage resolves the references through the registry (run.c) and, in its start callback, builds
 * its own tr_batch_t per micro-batch, pointing into the area, which it only reads; the next
 * batch's copy waits for this one's end (tr_pipe_model_run returns only after every stage has
 * reported).
 *
 * What travels between stages, and where it waits. Stage s sends each forward's output from
 * its activation send area, slot micro-batch mod buffers(s): that slot is rewritten only by
 * the forward of micro-batch mb + buffers(s), which waits for s's backward of mb, which waits
 * for s + 1's gradient of mb, sent after s + 1's forward of mb copied its input. A backward's
 * input gradient is copied into s's gradient send area, slot mb mod buffers(s - 1): its next
 * writer, micro-batch mb + buffers(s - 1), is backwarded on s only after s - 1 has run the
 * forward of mb + buffers(s - 1), which waits for s - 1's backward of mb, which consumed the
 * gradient. The stages register the two areas and transfers carry references into them
 * (across ranks the link moves the bytes into slots it keeps the same way); no stage reads
 * another's memory except through a transfer.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/pipe/link.h"
#include "actors/pipe/own.h"
#include "actors/pipe/schedule.h"
#include "base/errf.h"
#include "troupe/buffer.h"
#include "troupe/error.h"
#include "troupe/model.h"
#include "troupe/pipeline.h"
#include "troupe/runtime.h"
#include "troupe/types.h"

/* One stage's own part (written by its actor only, during a batch). */
typedef struct pstage {
    tr_model_stage_t *st;
    int buffers, prev_buffers; /* its schedule's slots, and the previous stage's */
    float *acts;               /* buffers slots of its output, as sent (all but the last stage) */
    float *grads;     /* prev_buffers slots of its input gradient, as sent (all but the first) */
    tr_batch_t *view; /* M: each micro-batch as it reads it, in the staging area */
} pstage_t;

/* The staging area: what the caller hands the stages, copied in for each batch. */
typedef struct staging {
    int in_dim;           /* the first layer's (0: it reads tokens, int32) */
    int targets;          /* TR_TARGETS_* of the loss layer */
    int y_dim;            /* its floats per position (TR_TARGETS_FLOAT) */
    size_t in_bytes;      /* one micro-batch's inputs: (B, T) ints or (B, T, in_dim) floats */
    size_t tg_bytes;      /* one micro-batch's targets: (B, T) ints or (B, T, y_dim) floats */
    void *inputs;         /* (M, in_bytes) */
    void *tgts;           /* (M, tg_bytes); NULL without targets */
    tr_pipe_batch_t refs; /* their references: tensor[0] the inputs, [1] the targets */
} staging_t;

struct tr_pipe_model {
    tr_model_t *model;
    int S, M, kind, B, T;
    int replicas; /* 0: every stage here; >= 1: this rank's stage only, across ranks */
    int lo, hi;   /* the stages this process runs */
    int *bounds;
    pstage_t *stage;
    unsigned long long *links; /* each link's elements */
    tr_pipe_t *pipe;
    staging_t in;        /* written by the caller's thread only, between batches */
    tr__pipe_own_t *own; /* across ranks: this rank's groups (own.c), the caller's thread's */
};

static int check_bounds(const tr_model_t *model, const int *b, int S, char *err, size_t len)
{
    int n = tr_model_num_layers(model);
    if (S < 1 || S > n)
        return tr__errf(err, len, TR_EINVAL, "pipeline: %d stages for a model of %d layers", S, n);
    if (b[0] != 0 || b[S] != n)
        return tr__errf(err, len, TR_EINVAL,
                        "pipeline: stage bounds must start at 0 and end at "
                        "%d (the layers), got %d and %d",
                        n, b[0], b[S]);
    for (int s = 0; s < S; s++)
        if (b[s + 1] <= b[s])
            return tr__errf(err, len, TR_EINVAL,
                            "pipeline: stage %d holds layers [%d, %d): "
                            "none",
                            s, b[s], b[s + 1]);
    return 0;
}

/* Stage s's slots, send areas and layers. */
static int make_stage(tr_pipe_model_t *pm, int s, char *err, size_t errlen)
{
    pstage_t *g = &pm->stage[s];
    int rc = tr_model_stage_create(&g->st, pm->model, pm->bounds[s], pm->bounds[s + 1] - 1,
                                   g->buffers, pm->B, pm->T, err, errlen);
    if (rc < 0) return rc;
    size_t out = tr_model_stage_output_floats(g->st);
    size_t in = tr_model_stage_input_floats(g->st);
    if (s + 1 < pm->S && !(g->acts = malloc((size_t)g->buffers * out * sizeof(float))))
        return tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    if (s > 0 && !(g->grads = malloc((size_t)g->prev_buffers * in * sizeof(float))))
        return tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    if (!(g->view = calloc((size_t)pm->M, sizeof(*g->view))))
        return tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    return 0;
}

/* Allocates and registers one array of the staging area (owner: the caller's thread; reused
 * batch after batch), and references it whole; none when bytes is 0. */
static int stage_array(tr_runtime_t *rt, const char *what, int dtype, size_t bytes, void **mem,
                       tr_tensor_ref_t *ref)
{
    if (!bytes) return 0;
    tr_buffer_info_t info = {.bytes = bytes,
                             .dtype = (uint8_t)dtype,
                             .owner = TR_ACTOR_NONE,
                             .lifetime = TR_BUFFER_REQUEST};
    snprintf(info.name, sizeof(info.name), "pipe/%s", what);
    uint64_t id = 0;
    int rc = tr_buffer_alloc_host(rt, &info, mem, &id);
    return rc < 0 ? rc : tr_buffer_ref(rt, id, 0, bytes, dtype, ref);
}

/* The staging area for M micro-batches of (B, T), shaped by the model's first layer and its
 * loss layer's targets. */
static int make_staging(tr_pipe_model_t *pm, tr_runtime_t *rt, char *err, size_t errlen)
{
    staging_t *a = &pm->in;
    size_t N = (size_t)pm->B * (size_t)pm->T, M = (size_t)pm->M;
    a->in_dim = tr_model_layer(pm->model, 0)->in_dim;
    a->targets = tr_model_targets(pm->model, &a->y_dim);
    a->in_bytes = N * (a->in_dim ? (size_t)a->in_dim * sizeof(float) : sizeof(int32_t));
    a->tg_bytes = a->targets == TR_TARGETS_FLOAT ? N * (size_t)a->y_dim * sizeof(float)
                  : a->targets == TR_TARGETS_INT ? N * sizeof(int32_t)
                                                 : 0;
    int rc = stage_array(rt, "inputs", a->in_dim ? TR_DTYPE_F32 : TR_DTYPE_I32, M * a->in_bytes,
                         &a->inputs, &a->refs.tensor[0]);
    if (rc == 0)
        rc =
            stage_array(rt, "targets", a->targets == TR_TARGETS_FLOAT ? TR_DTYPE_F32 : TR_DTYPE_I32,
                        M * a->tg_bytes, &a->tgts, &a->refs.tensor[1]);
    if (rc < 0 && a->refs.tensor[0].buffer_id) /* the memory goes with the pipelined model */
        tr_buffer_unregister(rt, a->refs.tensor[0].buffer_id);
    if (rc < 0)
        return tr__errf(err, errlen, rc, "pipeline: its staging area of %zu bytes: %s",
                        M * (a->in_bytes + a->tg_bytes), tr_strerror(rc));
    return 0;
}

/* tr_pipe_run's callbacks, on stage s's thread; each touches stage s's part only. */
static int exec(void *user, int s, const tr_pipe_instr_t *x, const void *in, tr_pipe_report_t *rep);
static void *send_mem(void *user, int s, const tr_pipe_instr_t *x, void **area, size_t *bytes);
static int begin(void *user, int s, void *const *tensors, const unsigned long long *bytes,
                 tr_pipe_report_t *rep);

/* The stages' pipeline, spawned on rt. */
static int make_pipe(tr_pipe_model_t *pm, tr_runtime_t *rt, tr_monitor_t *monitor, char *err,
                     size_t errlen)
{
    pm->links = calloc((size_t)pm->S, sizeof(*pm->links));
    if (!pm->links) return tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    for (int s = 0; s + 1 < pm->S; s++) { /* the boundary's width */
        const tr_layer_t *last = tr_model_layer(pm->model, pm->bounds[s + 1] - 1);
        pm->links[s] = (unsigned long long)pm->B * (unsigned long long)pm->T *
                       (unsigned long long)last->out_dim;
    }
    tr_pipe_run_opts_t o = {.kind = pm->kind,
                            .stages = pm->S,
                            .micro_batches = pm->M,
                            .exec = exec,
                            .send_mem = send_mem,
                            .start = begin,
                            .user = pm,
                            .link_elements = 1,
                            .links = pm->links,
                            .link_dtype = TR_DTYPE_F32,
                            .monitor = monitor,
                            .across_ranks = pm->replicas > 0,
                            .replicas = pm->replicas};
    return tr_pipe_create(&pm->pipe, rt, &o, err, errlen);
}

int tr_pipe_model_create(tr_pipe_model_t **out, tr_runtime_t *rt, tr_model_t *model,
                         const int *bounds, int stages, int kind, int micro_batches, int B, int T,
                         int replicas, tr_monitor_t *monitor, char *err, size_t errlen)
{
    *out = NULL;
    int rc = model && bounds ? check_bounds(model, bounds, stages, err, errlen)
                             : tr__errf(err, errlen, TR_EINVAL, "pipeline: no model or bounds");
    if (rc == 0 && kind != TR_PIPE_TRAIN_1F1B && kind != TR_PIPE_TRAIN_ZB)
        /* the slot reuse argument above needs the gradients' way back: training schedules */
        rc = tr__errf(err, errlen, TR_EINVAL,
                      "pipeline: a model runs the training schedules "
                      "(1f1b, zb), not kind %d",
                      kind);
    int me = 0, rank, world;
    if (rc == 0 && replicas > 0)
        rc = tr__pipe_rank_stage(stages, replicas, &rank, &world, &me, err, errlen);
    if (rc < 0) return rc;
    tr_pipe_model_t *pm = calloc(1, sizeof(*pm));
    if (!pm) return tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    *pm = (tr_pipe_model_t){.model = model,
                            .S = stages,
                            .M = micro_batches,
                            .kind = kind,
                            .B = B,
                            .T = T,
                            .replicas = replicas,
                            .lo = replicas > 0 ? me : 0,
                            .hi = replicas > 0 ? me + 1 : stages};
    pm->bounds = malloc((size_t)(stages + 1) * sizeof(int));
    pm->stage = calloc((size_t)stages, sizeof(*pm->stage));
    rc = pm->bounds && pm->stage ? 0 : tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    if (!rc) memcpy(pm->bounds, bounds, (size_t)(stages + 1) * sizeof(int));
    for (int s = 0; rc == 0 && s < stages; s++) {
        rc = tr__pipe_stage_buffers(kind, micro_batches, stages, s, err, errlen);
        if (rc > 0) {
            pm->stage[s].buffers = rc;
            if (s + 1 < stages) pm->stage[s + 1].prev_buffers = rc;
            rc = 0;
        }
    }
    for (int s = pm->lo; rc == 0 && s < pm->hi; s++)
        rc = make_stage(pm, s, err, errlen);
    if (rc == 0 && replicas > 0)
        rc = tr__pipe_own_create(&pm->own, model, pm->bounds, stages, me, replicas, rank, world, B,
                                 T, err, errlen);
    if (rc == 0) rc = make_staging(pm, rt, err, errlen);
    if (rc == 0) rc = make_pipe(pm, rt, monitor, err, errlen);
    if (rc < 0 && !pm->pipe) { /* no actor holds it yet */
        tr_pipe_model_destroy(pm);
        return rc;
    }
    *out = pm; /* a failed spawn: the actors made stop with the runtime; destroy after */
    return rc;
}

void tr_pipe_model_stop(tr_pipe_model_t *pm)
{
    if (pm) tr_pipe_stop(pm->pipe);
}

int tr_pipe_model_watch(tr_pipe_model_t *pm, tr_actor_t watchdog)
{
    return tr_pipe_watch(pm->pipe, watchdog);
}

void tr_pipe_model_destroy(tr_pipe_model_t *pm)
{
    if (!pm) return;
    tr_pipe_destroy(pm->pipe);
    tr__pipe_own_destroy(pm->own);
    for (int s = 0; pm->stage && s < pm->S; s++) {
        tr_model_stage_destroy(pm->stage[s].st);
        free(pm->stage[s].acts);
        free(pm->stage[s].grads);
        free(pm->stage[s].view);
    }
    free(pm->in.inputs); /* its registrations end with the runtime, closed by now */
    free(pm->in.tgts);
    free(pm->stage);
    free(pm->links);
    free(pm->bounds);
    free(pm);
}

static int forward(const tr_pipe_model_t *pm, pstage_t *g, int s, int mb, const float *in,
                   tr_pipe_report_t *rep)
{
    int slot = mb % g->buffers;
    int rc = tr_model_stage_forward(g->st, slot, &g->view[mb], in, &rep->loss);
    rep->has_loss = rc == 0 && s == pm->S - 1;
    if (rc == 0 && s + 1 < pm->S) { /* the output, into its send slot */
        size_t n = tr_model_stage_output_floats(g->st);
        memcpy(g->acts + (size_t)slot * n, tr_model_stage_output(g->st, slot), n * sizeof(float));
    }
    return rc;
}

static int backward(pstage_t *g, int s, int mb, const float *dout, bool split)
{
    const float *din;
    int slot = mb % g->buffers;
    int rc = split ? tr_model_stage_backward_input(g->st, slot, dout, &din)
                   : tr_model_stage_backward(g->st, slot, dout, &din);
    if (rc == 0 && s > 0) { /* the input gradient, into its send slot */
        size_t n = tr_model_stage_input_floats(g->st);
        memcpy(g->grads + (size_t)(mb % g->prev_buffers) * n, din, n * sizeof(float));
    }
    return rc;
}

/* Stage s's compute, which writes only its own slots, send areas and its layers' gradients
 * (ReduceTiedGrads waits for the end of the batch); its loss and failure go into rep, which
 * the stage actor sends to the runner. */
static int exec(void *user, int s, const tr_pipe_instr_t *x, const void *in, tr_pipe_report_t *rep)
{
    const tr_pipe_model_t *pm = user;
    pstage_t *g = &pm->stage[s];
    int rc = 0;
    if (x->op == TR_PIPE_FORWARD) rc = forward(pm, g, s, x->micro_batch, in, rep);
    if (x->op == TR_PIPE_BACKWARD || x->op == TR_PIPE_BACKWARD_INPUT)
        rc = backward(g, s, x->micro_batch, in, x->op == TR_PIPE_BACKWARD_INPUT);
    if (x->op == TR_PIPE_BACKWARD_WEIGHT)
        rc = tr_model_stage_backward_weight(g->st, x->micro_batch % g->buffers);
    if (rc < 0)
        snprintf(rep->why, sizeof(rep->why), "stage %d (layers %d to %d): %s", s, pm->bounds[s],
                 pm->bounds[s + 1] - 1, tr_model_stage_error(g->st));
    return rc;
}

/* The slot a send sends, in stage s's send area for its kind. */
static void *send_mem(void *user, int s, const tr_pipe_instr_t *x, void **area, size_t *bytes)
{
    const tr_pipe_model_t *pm = user;
    const pstage_t *g = &pm->stage[s];
    bool act = x->op == TR_PIPE_SEND_ACTIVATION;
    int slots = act ? g->buffers : g->prev_buffers;
    size_t n = act ? tr_model_stage_output_floats(g->st) : tr_model_stage_input_floats(g->st);
    float *a = act ? g->acts : g->grads;
    *area = a;
    *bytes = (size_t)slots * n * sizeof(float);
    return a + (size_t)(x->micro_batch % slots) * n;
}

/* A batch starts on stage s (its thread): its view of each micro-batch, into the staging area
 * its start message named (tensors[0] the inputs, [1] the targets; resolved by run.c). */
static int begin(void *user, int s, void *const *tensors, const unsigned long long *bytes,
                 tr_pipe_report_t *rep)
{
    const tr_pipe_model_t *pm = user;
    const staging_t *a = &pm->in;
    pstage_t *g = &pm->stage[s];
    size_t M = (size_t)pm->M;
    if (!tensors[0] || bytes[0] != M * a->in_bytes || bytes[1] != M * a->tg_bytes) {
        snprintf(rep->why, sizeof(rep->why),
                 "stage %d: its start names %llu bytes of inputs and %llu of targets; expected "
                 "%zu and %zu (%d micro-batches)",
                 s, bytes[0], bytes[1], M * a->in_bytes, M * a->tg_bytes, pm->M);
        return TR_EMISMATCH;
    }
    const unsigned char *in = tensors[0], *tg = tensors[1];
    for (size_t mb = 0; mb < M; mb++) {
        const void *x = in + mb * a->in_bytes, *y = tg ? tg + mb * a->tg_bytes : NULL;
        g->view[mb] = (tr_batch_t){.B = pm->B,
                                   .T = pm->T,
                                   .tokens = a->in_dim ? NULL : x,
                                   .x = a->in_dim ? x : NULL,
                                   .targets = a->targets == TR_TARGETS_INT ? y : NULL,
                                   .y = a->targets == TR_TARGETS_FLOAT ? y : NULL,
                                   .y_dim = a->y_dim};
    }
    return 0;
}

/* Copies the caller's micro-batches into the staging area (the caller's thread, before the
 * start messages). TR_EINVAL naming the micro-batch for another shape or a missing field. */
static int stage_batch(tr_pipe_model_t *pm, const tr_batch_t *batches, char *err, size_t errlen)
{
    staging_t *a = &pm->in;
    for (int mb = 0; mb < pm->M; mb++) {
        const tr_batch_t *b = &batches[mb];
        const void *x = a->in_dim ? (const void *)b->x : (const void *)b->tokens;
        const void *y = a->targets == TR_TARGETS_FLOAT ? (const void *)b->y
                        : a->targets == TR_TARGETS_INT ? (const void *)b->targets
                                                       : NULL;
        if (b->B != pm->B || b->T != pm->T || !x || (a->tg_bytes && !y))
            return tr__errf(err, errlen, TR_EINVAL,
                            "pipeline: micro-batch %d has B %d, T %d%s%s; the pipeline needs B "
                            "%d, T %d, %s and %s",
                            mb, b->B, b->T, x ? "" : ", no inputs",
                            a->tg_bytes && !y ? ", no targets" : "", pm->B, pm->T,
                            a->in_dim ? "x" : "tokens",
                            a->targets == TR_TARGETS_FLOAT ? "y"
                            : a->targets == TR_TARGETS_INT ? "targets"
                                                           : "no targets");
        memcpy((unsigned char *)a->inputs + (size_t)mb * a->in_bytes, x, a->in_bytes);
        if (a->tg_bytes)
            memcpy((unsigned char *)a->tgts + (size_t)mb * a->tg_bytes, y, a->tg_bytes);
    }
    return 0;
}

int tr_pipe_model_run(tr_pipe_model_t *pm, const tr_batch_t *batches, float *losses,
                      unsigned long long step, tr_pipe_run_result_t *result, char *err,
                      size_t errlen)
{
    if (pm->own) tr__pipe_own_unwhole(pm->own); /* a gather's other stages go back */
    int rc = stage_batch(pm, batches, err, errlen);
    if (rc < 0) return rc;
    tr_pipe_run_result_t r; /* the start messages publish the copy to the stages */
    rc = tr_pipe_run_batch(pm->pipe, step, &pm->in.refs, losses, &r, err, errlen);
    for (int s = pm->lo; s < pm->hi; s++) /* ReduceTiedGrads, now that no stage is in backward
                                           * (across ranks: tr_pipe_model_reduce_grads); a
                                           * failed batch's tied parts are dropped */
        if (rc == 0 && !pm->own)
            tr_model_stage_reduce_tied(pm->stage[s].st);
        else if (rc < 0)
            tr_model_stage_zero_tied(pm->stage[s].st);
    if (rc == 0 && result) *result = r;
    return rc;
}

int tr_pipe_model_stage(const tr_pipe_model_t *pm)
{
    return pm->replicas > 0 ? pm->lo : -1;
}

/* --- across ranks: a rank holds only its stage (own.c) ------------------------------------ */

static int not_across(const char *what, char *err, size_t errlen)
{
    return tr__errf(err, errlen, TR_EINVAL,
                    "pipeline: %s: the pipeline runs in one process (replicas 0), where every "
                    "stage is this process's",
                    what);
}

void tr_pipe_model_set_timeout(tr_pipe_model_t *pm, double seconds)
{
    if (pm->own) tr__pipe_own_set_timeout(pm->own, seconds);
}

int tr_pipe_model_reduce_grads(tr_pipe_model_t *pm, float pre, float post, char *err, size_t errlen)
{
    if (!pm->own) return not_across("reducing the stages' gradients", err, errlen);
    tr_model_stage_t *st = pm->stage[pm->lo].st;
    int rc = tr__pipe_own_reduce(pm->own, tr_model_stage_tied(st), pre, post, err, errlen);
    tr_model_stage_zero_tied(st); /* the sum is the owner's to step */
    return rc;
}

int tr_pipe_model_sync_params(tr_pipe_model_t *pm, int partitioned, char *err, size_t errlen)
{
    if (!pm->own) return not_across("syncing the stages' parameters", err, errlen);
    return tr__pipe_own_sync(pm->own, partitioned != 0, err, errlen);
}

int tr_pipe_model_eval(tr_pipe_model_t *pm, const tr_batch_t *batch, float *loss, int *has_loss,
                       char *err, size_t errlen)
{
    if (!pm->own) return not_across("an evaluation through the stages", err, errlen);
    tr__pipe_own_unwhole(pm->own);
    bool has = false;
    int rc = tr__pipe_own_eval(pm->own, batch, loss, &has, err, errlen);
    *has_loss = has;
    return rc;
}

int tr_pipe_model_gather_params(tr_pipe_model_t *pm, char *err, size_t errlen)
{
    if (!pm->own) return 0; /* in one process every stage's parameters are here */
    return tr__pipe_own_gather(pm->own, err, errlen);
}

void tr_pipe_model_zero_grad(tr_pipe_model_t *pm)
{
    if (!pm->own) {
        tr_model_zero_grad(pm->model);
        return;
    }
    tr__pipe_own_zero_grad(pm->own);
    tr_model_stage_zero_tied(pm->stage[pm->lo].st);
}
