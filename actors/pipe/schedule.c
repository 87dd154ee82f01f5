/* pipe_schedule.c: pipeline schedules as lists of steps (troupe/pipeline.h).
 *
 * TrainSchedule and InferenceSchedule follow deepspeed/runtime/pipe/schedule.py line for line
 * (the step-to-micro-batch arithmetic, the order of instructions in a step, the buffers), with
 * the micro-batch of each instruction recorded beside its buffer. The zb schedule is built by
 * running every stage's 1F1B order of forwards and backwards in unit time (a forward, an
 * input-gradient backward and a weight-gradient backward cost 1 each) with the backwards
 * split: a stage runs its next forward or input-gradient backward when its inputs are there,
 * and otherwise, while it would wait, the oldest weight-gradient backward it owes; it never
 * keeps more micro-batches live (forwarded, weight gradient not yet computed) than 1F1B's
 * buffers for it, running a weight gradient first when it would. What each stage ran, in order,
 * is its schedule.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/pipe/schedule.h"
#include "base/errf.h"
#include "troupe/error.h"

struct tr_pipe_schedule {
    int kind, M, S, stage;
    int n_steps, buffers;
    int *at; /* step k's instructions are instr[at[k], at[k + 1]) */
    tr_pipe_instr_t *instr;
    int n, cap;
};

static const char *const NAMES[] = {
    [TR_PIPE_LOAD_MICRO_BATCH] = "LoadMicroBatch",
    [TR_PIPE_FORWARD] = "ForwardPass",
    [TR_PIPE_BACKWARD] = "BackwardPass",
    [TR_PIPE_SEND_ACTIVATION] = "SendActivation",
    [TR_PIPE_RECV_ACTIVATION] = "RecvActivation",
    [TR_PIPE_SEND_GRAD] = "SendGrad",
    [TR_PIPE_RECV_GRAD] = "RecvGrad",
    [TR_PIPE_REDUCE_TIED_GRADS] = "ReduceTiedGrads",
    [TR_PIPE_REDUCE_GRADS] = "ReduceGrads",
    [TR_PIPE_OPTIMIZER_STEP] = "OptimizerStep",
    [TR_PIPE_BACKWARD_INPUT] = "BackwardInput",
    [TR_PIPE_BACKWARD_WEIGHT] = "BackwardWeight",
};

const char *tr_pipe_op_name(int op)
{
    return op > 0 && op < (int)(sizeof(NAMES) / sizeof(NAMES[0])) && NAMES[op] ? NAMES[op] : "?";
}

/* --- building ------------------------------------------------------------------------------ */

static int emit(tr_pipe_schedule_t *s, int op, int buffer, int mb)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        tr_pipe_instr_t *p = realloc(s->instr, (size_t)cap * sizeof(*p));
        if (!p) return TR_ENOMEM;
        s->instr = p;
        s->cap = cap;
    }
    s->instr[s->n++] = (tr_pipe_instr_t){op, buffer, mb};
    return 0;
}

/* Ends step k (the instructions emitted since the last call are its). */
static void end_step(tr_pipe_schedule_t *s, int k)
{
    s->at[k + 1] = s->n;
}

static int emit_step_end(tr_pipe_schedule_t *s)
{
    int rc = emit(s, TR_PIPE_REDUCE_TIED_GRADS, -1, -1);
    if (!rc) rc = emit(s, TR_PIPE_REDUCE_GRADS, -1, -1);
    if (!rc) rc = emit(s, TR_PIPE_OPTIMIZER_STEP, -1, -1);
    return rc;
}

static int valid_mb(const tr_pipe_schedule_t *s, int mb)
{
    return mb >= 0 && mb < s->M;
}

/* DeepSpeed's TrainSchedule._step_to_micro_batch: a forward when step and stage have the same
 * parity. */
static int step_to_mb(const tr_pipe_schedule_t *s, int step, int *forward)
{
    int st = s->stage, even_step = step % 2 == 0, even_stage = st % 2 == 0;
    *forward = even_step == even_stage;
    if (even_step && even_stage) return step / 2 - st / 2;
    if (!even_step && !even_stage) return (step - 1) / 2 - st / 2;
    if (even_step) return step / 2 - s->S + (st + 1) / 2;
    return (step - 1) / 2 - s->S + 1 + st / 2;
}

static int build_1f1b(tr_pipe_schedule_t *s)
{
    int first = s->stage == 0, last = s->stage == s->S - 1, prev = -1, rc = 0;
    s->buffers = s->S - s->stage < s->M ? s->S - s->stage : s->M;
    if (s->buffers < 2) s->buffers = 2;
    for (int k = 0; rc == 0 && k < s->n_steps; k++) {
        int fwd, mb = step_to_mb(s, k, &fwd);
        int cur = valid_mb(s, mb) ? mb % s->buffers : -1;
        int pbuf = valid_mb(s, prev) ? prev % s->buffers : -1;
        if (fwd) {
            if (pbuf >= 0 && !first) rc = emit(s, TR_PIPE_SEND_GRAD, pbuf, prev);
            if (!rc && cur >= 0 && !first) rc = emit(s, TR_PIPE_RECV_ACTIVATION, cur, mb);
        } else {
            if (cur >= 0 && !last) rc = emit(s, TR_PIPE_RECV_GRAD, cur, mb);
            if (!rc && pbuf >= 0 && !last) rc = emit(s, TR_PIPE_SEND_ACTIVATION, pbuf, prev);
        }
        if (!rc && (first || last) && fwd && cur >= 0)
            rc = emit(s, TR_PIPE_LOAD_MICRO_BATCH, cur, mb);
        if (!rc && cur >= 0) rc = emit(s, fwd ? TR_PIPE_FORWARD : TR_PIPE_BACKWARD, cur, mb);
        if (!rc && k == s->n_steps - 1) rc = emit_step_end(s);
        end_step(s, k);
        prev = mb;
    }
    return rc;
}

/* DeepSpeed's InferenceSchedule: two buffers alternating by step. */
static int build_inference(tr_pipe_schedule_t *s)
{
    int st = s->stage, first = st == 0, last = st == s->S - 1, rc = 0;
    s->buffers = 2;
    for (int k = 0; rc == 0 && k < s->n_steps; k++) {
        int mb = k - st, even = st % 2 == 0;
        int recv = even ? k % 2 : (k + 1) % 2, send = even ? (k + 1) % 2 : k % 2;
        if ((first || last) && valid_mb(s, mb)) rc = emit(s, TR_PIPE_LOAD_MICRO_BATCH, recv, mb);
        int do_send = !rc && !last && valid_mb(s, mb - 1);
        int do_recv = !rc && !first && valid_mb(s, mb);
        if (even && do_send) rc = emit(s, TR_PIPE_SEND_ACTIVATION, send, mb - 1);
        if (!rc && do_recv) rc = emit(s, TR_PIPE_RECV_ACTIVATION, recv, mb);
        if (!rc && !even && do_send) rc = emit(s, TR_PIPE_SEND_ACTIVATION, send, mb - 1);
        if (!rc && valid_mb(s, mb)) rc = emit(s, TR_PIPE_FORWARD, recv, mb);
        end_step(s, k);
    }
    return rc;
}

/* --- zb ------------------------------------------------------------------------------------ */

enum { OP_F = 1, OP_B, OP_W };

typedef struct zb_stage {
    int *order; /* 1F1B's compute order: +mb + 1 for a forward, -(mb + 1) for a backward */
    int n_order, pos;
    int w_next, b_done; /* weight gradients run (in micro-batch order); backwards run */
    int f_done, cap;    /* forwards run; the most micro-batches live at once */
    int *ran, n_ran;    /* what ran: OP_F/OP_B/OP_W * 65536 + mb */
    int busy_until;
} zb_stage_t;

/* f_end[s][mb], b_end[s][mb]: the tick a forward or input-gradient backward ended (-1: not
 * yet). */
typedef struct zb {
    int S, M;
    zb_stage_t *st;
    int *f_end, *b_end;
} zb_t;

static int *end_at(const zb_t *z, int *a, int s, int mb)
{
    return &a[s * z->M + mb];
}

/* Whether stage s can start its next ordered op at tick t (its inputs ended by then). */
static int ready(const zb_t *z, int s, int t)
{
    const zb_stage_t *g = &z->st[s];
    int code = g->order[g->pos], mb = (code > 0 ? code : -code) - 1;
    if (code > 0) {
        if (g->f_done - g->w_next >= g->cap) return 0; /* a weight gradient first */
        if (s == 0) return 1;
        int e = *end_at(z, z->f_end, s - 1, mb);
        return e >= 0 && e <= t;
    }
    if (s == z->S - 1) return 1; /* the loss: its own forward is done (in order) */
    int e = *end_at(z, z->b_end, s + 1, mb);
    return e >= 0 && e <= t;
}

/* Stage s at tick t: the next ordered op if ready, else a weight gradient it owes. */
static void zb_tick(zb_t *z, int s, int t)
{
    zb_stage_t *g = &z->st[s];
    if (g->busy_until > t) return;
    int op = 0, mb = -1;
    if (g->pos < g->n_order && ready(z, s, t)) {
        int code = g->order[g->pos++];
        op = code > 0 ? OP_F : OP_B;
        mb = (code > 0 ? code : -code) - 1;
        if (op == OP_F) {
            g->f_done++;
            *end_at(z, z->f_end, s, mb) = t + 1;
        } else {
            g->b_done++;
            *end_at(z, z->b_end, s, mb) = t + 1;
        }
    } else if (g->w_next < g->b_done) {
        op = OP_W;
        mb = g->w_next++;
    }
    if (!op) return;
    g->ran[g->n_ran++] = op * 65536 + mb;
    g->busy_until = t + 1;
}

/* The 1F1B compute order of stage s (from its DeepSpeed schedule). */
static int order_of(int M, int S, int s, zb_stage_t *g)
{
    tr_pipe_schedule_t *one;
    char err[128];
    int rc = tr_pipe_schedule_create(&one, TR_PIPE_TRAIN_1F1B, M, S, s, err, sizeof(err));
    if (rc < 0) return rc;
    g->order = malloc((size_t)(2 * M) * sizeof(int));
    g->ran = malloc((size_t)(3 * M) * sizeof(int));
    g->cap = one->buffers;
    for (int i = 0; g->order && i < one->n; i++) {
        const tr_pipe_instr_t *x = &one->instr[i];
        if (x->op == TR_PIPE_FORWARD) g->order[g->n_order++] = x->micro_batch + 1;
        if (x->op == TR_PIPE_BACKWARD) g->order[g->n_order++] = -(x->micro_batch + 1);
    }
    tr_pipe_schedule_destroy(one);
    return g->order && g->ran ? 0 : TR_ENOMEM;
}

/* Runs every stage's order in unit time; then s->stage's ran list becomes its steps. */
static int zb_run(zb_t *z)
{
    long long total = 3LL * z->M * z->S, done = 0;
    for (int t = 0; done < total; t++) {
        if ((long long)t > 4LL * total) return TR_EINVAL; /* cannot happen: ops become ready */
        for (int s = 0; s < z->S; s++) {
            int before = z->st[s].n_ran;
            zb_tick(z, s, t);
            done += z->st[s].n_ran - before;
        }
    }
    return 0;
}

static int emit_zb_op(tr_pipe_schedule_t *s, int op, int mb, int buf)
{
    int first = s->stage == 0, last = s->stage == s->S - 1, rc = 0;
    if (op == OP_F) {
        if (!first) rc = emit(s, TR_PIPE_RECV_ACTIVATION, buf, mb);
        if (!rc && (first || last)) rc = emit(s, TR_PIPE_LOAD_MICRO_BATCH, buf, mb);
        if (!rc) rc = emit(s, TR_PIPE_FORWARD, buf, mb);
        if (!rc && !last) rc = emit(s, TR_PIPE_SEND_ACTIVATION, buf, mb);
    } else if (op == OP_B) {
        if (!last) rc = emit(s, TR_PIPE_RECV_GRAD, buf, mb);
        if (!rc) rc = emit(s, TR_PIPE_BACKWARD_INPUT, buf, mb);
        if (!rc && !first) rc = emit(s, TR_PIPE_SEND_GRAD, buf, mb);
    } else {
        rc = emit(s, TR_PIPE_BACKWARD_WEIGHT, buf, mb);
    }
    return rc;
}

/* The most micro-batches live at once in a ran list (forwarded, weight gradient not run). */
static int zb_live_max(const zb_stage_t *g)
{
    int live = 0, most = 0;
    for (int i = 0; i < g->n_ran; i++) {
        int op = g->ran[i] / 65536;
        live += op == OP_F ? 1 : op == OP_W ? -1 : 0;
        most = live > most ? live : most;
    }
    return most;
}

static int build_zb(tr_pipe_schedule_t *s)
{
    zb_t z = {.S = s->S, .M = s->M};
    size_t cells = (size_t)s->S * (size_t)s->M;
    z.st = calloc((size_t)s->S, sizeof(*z.st));
    z.f_end = malloc(cells * sizeof(int));
    z.b_end = malloc(cells * sizeof(int));
    int rc = z.st && z.f_end && z.b_end ? 0 : TR_ENOMEM;
    for (size_t i = 0; rc == 0 && i < cells; i++)
        z.f_end[i] = z.b_end[i] = -1;
    for (int g = 0; rc == 0 && g < s->S; g++)
        rc = order_of(s->M, s->S, g, &z.st[g]);
    if (!rc) rc = zb_run(&z);
    const zb_stage_t *me = rc == 0 ? &z.st[s->stage] : NULL;
    if (me) {
        s->buffers = zb_live_max(me);
        s->n_steps = me->n_ran + 1;
        int *at = realloc(s->at, (size_t)(s->n_steps + 1) * sizeof(int));
        if (!at) {
            rc = TR_ENOMEM;
        } else {
            s->at = at;
            at[0] = 0;
        }
    }
    for (int k = 0; me && rc == 0 && k < me->n_ran; k++) {
        int op = me->ran[k] / 65536, mb = me->ran[k] % 65536;
        rc = emit_zb_op(s, op, mb, mb % s->buffers);
        end_step(s, k);
    }
    if (me && rc == 0) {
        rc = emit_step_end(s);
        end_step(s, s->n_steps - 1);
    }
    for (int g = 0; z.st && g < s->S; g++) {
        free(z.st[g].order);
        free(z.st[g].ran);
    }
    free(z.st);
    free(z.f_end);
    free(z.b_end);
    return rc;
}

/* --- the public calls ---------------------------------------------------------------------- */

int tr_pipe_schedule_create(tr_pipe_schedule_t **out, int kind, int micro_batches, int stages,
                            int stage, char *err, size_t errlen)
{
    *out = NULL;
    if (kind != TR_PIPE_TRAIN_1F1B && kind != TR_PIPE_INFERENCE && kind != TR_PIPE_TRAIN_ZB)
        return tr__errf(err, errlen, TR_EINVAL, "pipeline schedule: unknown kind %d", kind);
    if (stages < 1 || stages > TR_PIPE_MAX_STAGES)
        return tr__errf(err, errlen, TR_EINVAL, "pipeline schedule: stages is %d; expected 1 to %d",
                        stages, TR_PIPE_MAX_STAGES);
    if (micro_batches < 1 || micro_batches > TR_PIPE_MAX_MICRO_BATCHES)
        return tr__errf(err, errlen, TR_EINVAL,
                        "pipeline schedule: micro-batches is %d; expected 1 to %d", micro_batches,
                        TR_PIPE_MAX_MICRO_BATCHES);
    if (stage < 0 || stage >= stages)
        return tr__errf(err, errlen, TR_EINVAL,
                        "pipeline schedule: stage is %d; expected 0 to "
                        "%d (stages %d)",
                        stage, stages - 1, stages);
    tr_pipe_schedule_t *s = calloc(1, sizeof(*s));
    if (!s) return TR_ENOMEM;
    *s = (tr_pipe_schedule_t){.kind = kind, .M = micro_batches, .S = stages, .stage = stage};
    s->n_steps = kind == TR_PIPE_INFERENCE ? s->M + s->S - 1 : 2 * (s->M + s->S - 1);
    s->at = calloc((size_t)s->n_steps + 1, sizeof(int));
    int rc = !s->at                       ? TR_ENOMEM
             : kind == TR_PIPE_TRAIN_1F1B ? build_1f1b(s)
             : kind == TR_PIPE_INFERENCE  ? build_inference(s)
                                          : build_zb(s);
    if (rc < 0) {
        tr_pipe_schedule_destroy(s);
        return tr__errf(err, errlen, rc, "pipeline schedule: %s", tr_strerror(rc));
    }
    *out = s;
    return 0;
}

void tr_pipe_schedule_destroy(tr_pipe_schedule_t *s)
{
    if (!s) return;
    free(s->at);
    free(s->instr);
    free(s);
}

int tr_pipe_schedule_steps(const tr_pipe_schedule_t *s)
{
    return s->n_steps;
}

int tr_pipe_schedule_buffers(const tr_pipe_schedule_t *s)
{
    return s->buffers;
}

const tr_pipe_instr_t *tr_pipe_schedule_step(const tr_pipe_schedule_t *s, int step, int *n)
{
    *n = 0;
    if (step < 0 || step >= s->n_steps) return NULL;
    *n = s->at[step + 1] - s->at[step];
    return s->instr + s->at[step];
}

int tr_pipe_schedule_format_step(const tr_pipe_schedule_t *s, int step, char *out, size_t len)
{
    int n, w = snprintf(out, len, "%d:", step);
    const tr_pipe_instr_t *x = tr_pipe_schedule_step(s, step, &n);
    for (int i = 0; i < n && w >= 0 && (size_t)w < len; i++) {
        char buf[16] = "";
        if (x[i].buffer >= 0) snprintf(buf, sizeof(buf), "%d", x[i].buffer);
        w += snprintf(out + w, len - (size_t)w, " %s(%s)", tr_pipe_op_name(x[i].op), buf);
    }
    return w;
}

int tr__pipe_schedule_shape(const tr_pipe_schedule_t *s, int *kind, int *M, int *S, int *stage)
{
    *kind = s->kind, *M = s->M, *S = s->S, *stage = s->stage;
    return s->n;
}

const tr_pipe_instr_t *tr__pipe_schedule_all(const tr_pipe_schedule_t *s)
{
    return s->instr;
}

int tr__pipe_stage_buffers(int kind, int M, int S, int s, char *err, size_t errlen)
{
    tr_pipe_schedule_t *p;
    int rc = tr_pipe_schedule_create(&p, kind, M, S, s, err, errlen);
    if (rc < 0) return rc;
    rc = tr_pipe_schedule_buffers(p);
    tr_pipe_schedule_destroy(p);
    return rc;
}
