/* pipe_model.c: a model's batch run through a pipeline of stage actors, in one process or one
 * stage per rank (troupe/pipeline.h, tr_pipe_model_*).
 *
 * What travels between stages, and where it waits. Stage s sends each forward's output from
 * its activation send area, slot micro-batch mod buffers(s): that slot is rewritten only by
 * the forward of micro-batch mb + buffers(s), which waits for s's backward of mb, which waits
 * for s + 1's gradient of mb, sent after s + 1's forward of mb copied its input. A backward's
 * input gradient is copied into s's gradient send area, slot mb mod buffers(s - 1): its next
 * writer, micro-batch mb + buffers(s - 1), is backwarded on s only after s - 1 has run the
 * forward of mb + buffers(s - 1), which waits for s - 1's backward of mb, which consumed the
 * gradient. The run registers the two areas and transfers carry references into them (across
 * ranks the link moves the bytes into slots it keeps the same way); no stage reads another's
 * memory except through a transfer.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/pipe/link.h"
#include "actors/pipe/schedule.h"
#include "base/errf.h"
#include "troupe.h"

struct tr_pipe_model {
    tr_model_t *model;
    int S, M, kind, B, T;
    int replicas; /* 0: every stage here; >= 1: this rank's stage only, across ranks */
    int lo, hi;   /* the stages this process runs */
    int *bounds;
    tr_model_stage_t **st;
    int *buffers; /* each stage's schedule buffers (its slots) */
    float **acts; /* acts[s]: buffers[s] slots of stage s's output, as sent (s < S - 1) */
    float **grads; /* grads[s]: buffers[s - 1] slots of stage s's input gradient (s > 0) */
    /* the batch being run */
    const tr_batch_t *batches;
    float *losses;
    atomic_int failed; /* the stage whose failure why explains (-1: none) */
    char why[512];     /* the first failing stage's reason */
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
    int rc = tr_model_stage_create(&pm->st[s], pm->model, pm->bounds[s], pm->bounds[s + 1] - 1,
                                   pm->buffers[s], pm->B, pm->T, err, errlen);
    if (rc < 0) return rc;
    size_t out = tr_model_stage_output_floats(pm->st[s]);
    size_t in = tr_model_stage_input_floats(pm->st[s]);
    if (s + 1 < pm->S && !(pm->acts[s] = malloc((size_t)pm->buffers[s] * out * sizeof(float))))
        return tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    if (s > 0 && !(pm->grads[s] = malloc((size_t)pm->buffers[s - 1] * in * sizeof(float))))
        return tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    return 0;
}

int tr_pipe_model_create(tr_pipe_model_t **out, tr_model_t *model, const int *bounds, int stages,
                         int kind, int micro_batches, int B, int T, int replicas, char *err,
                         size_t errlen)
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
    pm->st = calloc((size_t)stages, sizeof(*pm->st));
    pm->buffers = calloc((size_t)stages, sizeof(int));
    pm->acts = calloc((size_t)stages, sizeof(float *));
    pm->grads = calloc((size_t)stages, sizeof(float *));
    rc = pm->bounds && pm->st && pm->buffers && pm->acts && pm->grads
             ? 0
             : tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    if (!rc) memcpy(pm->bounds, bounds, (size_t)(stages + 1) * sizeof(int));
    for (int s = 0; rc == 0 && s < stages; s++)
        if ((rc = pm->buffers[s] =
                 tr__pipe_stage_buffers(kind, micro_batches, stages, s, err, errlen)) > 0)
            rc = 0;
    for (int s = pm->lo; rc == 0 && s < pm->hi; s++)
        rc = make_stage(pm, s, err, errlen);
    if (rc < 0) {
        tr_pipe_model_destroy(pm);
        return rc;
    }
    *out = pm;
    return 0;
}

void tr_pipe_model_destroy(tr_pipe_model_t *pm)
{
    if (!pm) return;
    for (int s = 0; s < pm->S; s++) {
        if (pm->st) tr_model_stage_destroy(pm->st[s]);
        if (pm->acts) free(pm->acts[s]);
        if (pm->grads) free(pm->grads[s]);
    }
    free(pm->st), free(pm->acts), free(pm->grads), free(pm->buffers), free(pm->bounds);
    free(pm);
}

static int forward(tr_pipe_model_t *pm, int s, int mb, const float *in)
{
    float loss = 0;
    int rc = tr_model_stage_forward(pm->st[s], mb % pm->buffers[s], &pm->batches[mb], in, &loss);
    if (rc == 0 && s == pm->S - 1) pm->losses[mb] = loss;
    if (rc == 0 && s + 1 < pm->S) { /* the output, into its send slot */
        size_t n = tr_model_stage_output_floats(pm->st[s]);
        memcpy(pm->acts[s] + (size_t)(mb % pm->buffers[s]) * n,
               tr_model_stage_output(pm->st[s], mb % pm->buffers[s]), n * sizeof(float));
    }
    return rc;
}

static int backward(tr_pipe_model_t *pm, int s, int mb, const float *dout, bool split)
{
    const float *din;
    int slot = mb % pm->buffers[s];
    int rc = split ? tr_model_stage_backward_input(pm->st[s], slot, dout, &din)
                   : tr_model_stage_backward(pm->st[s], slot, dout, &din);
    if (rc == 0 && s > 0) { /* the input gradient, into its send slot */
        size_t n = tr_model_stage_input_floats(pm->st[s]);
        memcpy(pm->grads[s] + (size_t)(mb % pm->buffers[s - 1]) * n, din, n * sizeof(float));
    }
    return rc;
}

/* tr_pipe_run's callbacks, on stage s's thread: its compute, which writes only its own slots,
 * send areas and its layers' gradients (ReduceTiedGrads waits for the end of the batch)... */
static int exec(void *user, int s, const tr_pipe_instr_t *x, const void *in)
{
    tr_pipe_model_t *pm = user;
    int rc = 0;
    if (x->op == TR_PIPE_FORWARD) rc = forward(pm, s, x->micro_batch, in);
    if (x->op == TR_PIPE_BACKWARD || x->op == TR_PIPE_BACKWARD_INPUT)
        rc = backward(pm, s, x->micro_batch, in, x->op == TR_PIPE_BACKWARD_INPUT);
    if (x->op == TR_PIPE_BACKWARD_WEIGHT)
        rc = tr_model_stage_backward_weight(pm->st[s], x->micro_batch % pm->buffers[s]);
    int none = -1; /* one failing stage stops the others: the first one's reason is kept */
    if (rc < 0 && atomic_compare_exchange_strong(&pm->failed, &none, s))
        snprintf(pm->why, sizeof(pm->why), "stage %d (layers %d to %d): %s", s, pm->bounds[s],
                 pm->bounds[s + 1] - 1, tr_model_stage_error(pm->st[s]));
    return rc;
}

/* ... and the slot a send sends. */
static void *send_mem(void *user, int s, const tr_pipe_instr_t *x, void **area, size_t *bytes)
{
    tr_pipe_model_t *pm = user;
    bool act = x->op == TR_PIPE_SEND_ACTIVATION;
    int slots = act ? pm->buffers[s] : pm->buffers[s - 1];
    size_t n =
        act ? tr_model_stage_output_floats(pm->st[s]) : tr_model_stage_input_floats(pm->st[s]);
    float *a = act ? pm->acts[s] : pm->grads[s];
    *area = a, *bytes = (size_t)slots * n * sizeof(float);
    return a + (size_t)(x->micro_batch % slots) * n;
}

int tr_pipe_model_run(tr_pipe_model_t *pm, const tr_batch_t *batches, float *losses,
                      unsigned long long step, struct tr_monitor *monitor,
                      tr_pipe_run_result_t *result, char *err, size_t errlen)
{
    pm->batches = batches;
    pm->losses = losses;
    pm->why[0] = '\0';
    atomic_store(&pm->failed, -1);
    unsigned long long links[4096];
    for (int s = 0; s + 1 < pm->S && s < 4096; s++) /* the boundary's width */
        links[s] = (unsigned long long)pm->B * (unsigned long long)pm->T *
                   (unsigned long long)tr_model_layer(pm->model, pm->bounds[s + 1] - 1)->out_dim;
    tr_pipe_run_opts_t o = {.kind = pm->kind,
                            .stages = pm->S,
                            .micro_batches = pm->M,
                            .exec = exec,
                            .send_mem = send_mem,
                            .user = pm,
                            .link_elements = 1,
                            .links = links,
                            .link_dtype = TR_DTYPE_F32,
                            .step = step,
                            .monitor = monitor,
                            .across_ranks = pm->replicas > 0,
                            .replicas = pm->replicas};
    tr_pipe_run_result_t r;
    int rc = tr_pipe_run(&o, &r, err, errlen);
    if (rc < 0 && atomic_load(&pm->failed) >= 0) tr__errf(err, errlen, rc, "pipeline: %s", pm->why);
    for (int s = pm->lo; s < pm->hi; s++) /* ReduceTiedGrads, now that no stage is in backward;
                                           * a failed batch's tied parts are dropped */
        if (rc == 0)
            tr_model_stage_reduce_tied(pm->st[s]);
        else
            tr_model_stage_zero_tied(pm->st[s]);
    if (rc == 0 && result) *result = r;
    return rc;
}

int tr_pipe_model_stage(const tr_pipe_model_t *pm)
{
    return pm->replicas > 0 ? pm->lo : -1;
}
