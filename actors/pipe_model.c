/* pipe_model.c: a model's batch run through a pipeline of stage actors in one process
 * (troupe/pipeline.h, tr_pipe_model_*), and DeepSpeed's layer partitioning.
 *
 * Data between stages, without copies where the schedule allows: stage s's forward of
 * micro-batch mb reads stage s - 1's output slot for mb in place — that slot is reused only for
 * micro-batch mb + buffers(s - 1), whose forward on s - 1 waits for s - 1's backward of mb,
 * which waits for s's backward of mb, after s's forward. A backward's input gradient lives in
 * the stage's boundary buffer only until its next backward, so it is copied into the link
 * slot mb % buffers(s - 1) of the previous stage before SendGrad: that slot's next writer,
 * micro-batch mb + buffers(s - 1), exists only once s - 1 has run its backward of mb.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/errf.h"
#include "troupe.h"

struct tr_pipe_model {
    tr_model_t *model;
    int S, M, kind, B, T;
    int *bounds;
    tr_model_stage_t **st;
    int *buffers; /* each stage's schedule buffers (its slots) */
    float **link; /* link[s]: buffers[s] slots of stage s's output gradient (s < S - 1) */
    /* the batch being run */
    const tr_batch_t *batches;
    float *losses;
    atomic_int failed; /* the stage whose failure why explains (-1: none) */
    char why[512];     /* the first failing stage's reason */
};

static int stage_buffers(int kind, int M, int S, int s, char *err, size_t len)
{
    tr_pipe_schedule_t *p;
    int rc = tr_pipe_schedule_create(&p, kind, M, S, s, err, len);
    if (rc < 0) return rc;
    int n = tr_pipe_schedule_buffers(p);
    tr_pipe_schedule_destroy(p);
    return n;
}

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

int tr_pipe_model_create(tr_pipe_model_t **out, tr_model_t *model, const int *bounds, int stages,
                         int kind, int micro_batches, int B, int T, char *err, size_t errlen)
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
    if (rc < 0) return rc;
    tr_pipe_model_t *pm = calloc(1, sizeof(*pm));
    if (!pm) return tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    *pm = (tr_pipe_model_t){
        .model = model, .S = stages, .M = micro_batches, .kind = kind, .B = B, .T = T};
    pm->bounds = malloc((size_t)(stages + 1) * sizeof(int));
    pm->st = calloc((size_t)stages, sizeof(*pm->st));
    pm->buffers = calloc((size_t)stages, sizeof(int));
    pm->link = calloc((size_t)stages, sizeof(float *));
    rc = pm->bounds && pm->st && pm->buffers && pm->link
             ? 0
             : tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    if (!rc) memcpy(pm->bounds, bounds, (size_t)(stages + 1) * sizeof(int));
    for (int s = 0; rc == 0 && s < stages; s++) {
        rc = pm->buffers[s] = stage_buffers(kind, micro_batches, stages, s, err, errlen);
        if (rc > 0)
            rc = tr_model_stage_create(&pm->st[s], model, bounds[s], bounds[s + 1] - 1,
                                       pm->buffers[s], B, T, err, errlen);
        size_t out_floats = rc == 0 ? tr_model_stage_output_floats(pm->st[s]) : 0;
        if (rc == 0 && s + 1 < stages &&
            !(pm->link[s] = malloc((size_t)pm->buffers[s] * out_floats * sizeof(float))))
            rc = tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    }
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
        if (pm->link) free(pm->link[s]);
    }
    free(pm->st), free(pm->link), free(pm->buffers), free(pm->bounds);
    free(pm);
}

static int forward(tr_pipe_model_t *pm, int s, int mb)
{
    const float *in = s > 0 ? tr_model_stage_output(pm->st[s - 1], mb % pm->buffers[s - 1]) : NULL;
    float loss = 0;
    int rc = tr_model_stage_forward(pm->st[s], mb % pm->buffers[s], &pm->batches[mb], in, &loss);
    if (rc == 0 && s == pm->S - 1) pm->losses[mb] = loss;
    return rc;
}

static int backward(tr_pipe_model_t *pm, int s, int mb)
{
    const float *dout = s + 1 < pm->S ? pm->link[s] + (size_t)(mb % pm->buffers[s]) *
                                                          tr_model_stage_output_floats(pm->st[s])
                                      : NULL;
    const float *din;
    int rc = tr_model_stage_backward(pm->st[s], mb % pm->buffers[s], dout, &din);
    if (rc == 0 && s > 0) {
        size_t n = tr_model_stage_input_floats(pm->st[s]);
        memcpy(pm->link[s - 1] + (size_t)(mb % pm->buffers[s - 1]) * n, din, n * sizeof(float));
    }
    return rc;
}

/* tr_pipe_run's callback: stage s's compute. A stage writes only its own slots, its link slot
 * upstream and its layers' gradients; ReduceTiedGrads waits for the end of the batch. */
static int exec(void *user, int s, const tr_pipe_instr_t *x)
{
    tr_pipe_model_t *pm = user;
    int rc = 0;
    if (x->op == TR_PIPE_FORWARD) rc = forward(pm, s, x->micro_batch);
    if (x->op == TR_PIPE_BACKWARD || x->op == TR_PIPE_BACKWARD_INPUT)
        rc = backward(pm, s, x->micro_batch);
    int none = -1; /* one failing stage stops the others: the first one's reason is kept */
    if (rc < 0 && atomic_compare_exchange_strong(&pm->failed, &none, s))
        snprintf(pm->why, sizeof(pm->why), "stage %d (layers %d to %d): %s", s, pm->bounds[s],
                 pm->bounds[s + 1] - 1, tr_model_stage_error(pm->st[s]));
    return rc;
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
    for (int s = 0; s + 1 < pm->S && s < 4096; s++)
        links[s] = tr_model_stage_output_floats(pm->st[s]);
    tr_pipe_run_opts_t o = {.kind = pm->kind,
                            .stages = pm->S,
                            .micro_batches = pm->M,
                            .exec = exec,
                            .user = pm,
                            .link_elements = 1,
                            .links = links,
                            .link_dtype = TR_DTYPE_F32,
                            .step = step,
                            .monitor = monitor};
    tr_pipe_run_result_t r;
    int rc = tr_pipe_run(&o, &r, err, errlen);
    if (rc < 0 && atomic_load(&pm->failed) >= 0) tr__errf(err, errlen, rc, "pipeline: %s", pm->why);
    for (int s = 0; s < pm->S; s++) /* ReduceTiedGrads, now that no stage is in backward; a
                                     * failed batch's tied parts are dropped */
        if (rc == 0)
            tr_model_stage_reduce_tied(pm->st[s]);
        else
            tr_model_stage_zero_tied(pm->st[s]);
    if (rc == 0 && result) *result = r;
    return rc;
}
