/* own.c: a pipeline across ranks whose ranks hold only their stage.
 *
 * Rank r = stage x replicas + replica runs stage `stage` and touches only its layers' range of
 * the model's flat buffers [lo, hi), plus the tied tensors its layers use (GPT-2's head reads
 * the embedding's wte, which stage 0 owns). What the whole model gave every rank for free
 * travels here, between batches, on the caller's thread (the executor's), over communicators
 * of this file's own, split off a duplicate of MPI's world at create:
 *
 *   - dp:  the stage's data-parallel group (the ranks of one stage, ordered by replica): the
 *          stage's gradients are all-reduced there after each batch, and ZeRO 1's slices
 *          all-gathered there after each step;
 *   - tie: per replica, the two stages that hold a tied tensor (owner first): its gradient is
 *          summed there (DeepSpeed's TiedLayerSpec all-reduces it over the same pair), and
 *          after the step the owner, whose optimizer alone updates it, sends the new values
 *          to the user, which keeps a copy and no optimizer state for it;
 *   - all: the world, for evaluation's activations (stage to stage, as a forward).
 *
 * Each operation is started and then driven by the backend's progress on this thread until
 * its completion callback runs; one is in flight at a time. A rank that never takes part ends
 * the wait after the timeout (troupe.comm.timeout_s), with an error naming the operation; the
 * operation stays posted, so the backend ends the job at shutdown rather than leave a rank
 * waiting forever.
 */
#include "actors/pipe/own.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/errf.h"
#include "base/vmem.h"
#include "runtime/comm/comm.h"
#include "troupe/error.h"
#include "troupe/runtime.h"

#define TAG_EVAL 101 /* an evaluation batch's activations, stage s to s + 1 */

struct tr__pipe_own {
    tr_model_t *model;
    int stage, stages, replicas, replica, rank, world, B, T;
    const int *bounds; /* the pipelined model's (stages + 1) */
    size_t lo, hi;     /* this stage's range of the flat buffers */
    size_t tie_lo, tie_hi;
    int tie_owner, tie_user; /* the stages holding the tied range (-1: none crosses stages) */
    tr_comm_t *all, *dp, *tie;
    double timeout_s;
    uint64_t done_req; /* the last completion reported (one operation in flight), reset to 0
                        * before each start: request ids are per communicator, so another's
                        * may equal the next */
    int done_rc;
    int fault_silent;       /* TROUPE_FAULT_PIPE_SILENT_RANK: this rank skips its reductions */
    bool whole;             /* tr__pipe_own_gather made the parameters whole here */
    tr_model_stage_t *eval; /* evaluation's activations (made at the first) */
    float *eval_in;         /* the previous stage's output */
};

static void op_done(void *arg, uint64_t req, uint64_t tag, int rc)
{
    (void)tag;
    tr__pipe_own_t *o = arg;
    o->done_req = req;
    o->done_rc = rc;
}

/* Drives c until request req completes (rc), or the timeout. */
static int wait_op(tr__pipe_own_t *o, tr_comm_t *c, int rc, uint64_t req, const char *what,
                   char *err, size_t errlen)
{
    if (rc < 0)
        return tr__errf(err, errlen, rc, "pipeline: rank %d: %s: %s", o->rank, what,
                        c->error[0] ? c->error : tr_strerror(rc));
    uint64_t t0 = tr_now_ns();
    for (unsigned polls = 0; o->done_req != req; polls++) {
        int left = c->ops->progress ? c->ops->progress(c) : 0;
        if (left < 0)
            return tr__errf(err, errlen, left, "pipeline: rank %d: %s: %s", o->rank, what,
                            c->error);
        if (o->done_req == req) break;
        double waited = (double)(tr_now_ns() - t0) / 1e9;
        if (waited > o->timeout_s)
            return tr__errf(err, errlen, TR_ETIMEDOUT,
                            "pipeline: rank %d (stage %d, replica %d): %s has been pending for "
                            "%.1f s, past troupe.comm.timeout_s: another rank diverged, stopped "
                            "or died; the job ends on every rank",
                            o->rank, o->stage, o->replica, what, waited);
        if (polls > 64) nanosleep(&(struct timespec){0, 20000}, NULL);
    }
    if (o->done_rc < 0)
        return tr__errf(err, errlen, o->done_rc, "pipeline: rank %d: %s: %s", o->rank, what,
                        c->error[0] ? c->error : tr_strerror(o->done_rc));
    return 0;
}

static void layer_range(const tr_model_t *m, int first, int last, size_t *lo, size_t *hi)
{
    const tr_layer_t *a = tr_model_layer(m, first), *b = tr_model_layer(m, last);
    *lo = a->param_offset;
    *hi = b->param_offset + b->param_count;
}

static int stage_of(const int *bounds, int stages, int layer)
{
    int s = 0;
    while (s + 1 < stages && layer >= bounds[s + 1])
        s++;
    return s;
}

/* The tied range that crosses stages, and the two stages holding it: one pair at most. */
static int find_ties(tr__pipe_own_t *o, char *err, size_t errlen)
{
    o->tie_owner = o->tie_user = -1;
    for (int i = 0; i < tr_model_num_layers(o->model); i++) {
        const tr_layer_t *l = tr_model_layer(o->model, i);
        if (!l->tie_count) continue;
        int user = stage_of(o->bounds, o->stages, i);
        int owner = stage_of(o->bounds, o->stages, l->tie_layer);
        if (user == owner) continue;
        size_t lo = l->tie_offset, hi = lo + l->tie_count;
        if (o->tie_owner >= 0 &&
            (o->tie_owner != owner || o->tie_user != user || o->tie_lo != lo || o->tie_hi != hi))
            return tr__errf(err, errlen, TR_EINVAL,
                            "pipeline: layer %d '%s' ties [%zu, %zu) of stage %d's parameters to "
                            "stage %d, and another layer ties [%zu, %zu) of stage %d's to stage "
                            "%d: a pipeline across ranks reduces one tied tensor between one "
                            "pair of stages",
                            i, l->name, lo, hi, owner, user, o->tie_lo, o->tie_hi, o->tie_owner,
                            o->tie_user);
        o->tie_owner = owner;
        o->tie_user = user;
        o->tie_lo = lo;
        o->tie_hi = hi;
    }
    return 0;
}

/* The three communicators (every rank splits in the same order). */
static int make_groups(tr__pipe_own_t *o, char *err, size_t errlen)
{
    char why[256] = "";
    int rc = tr_comm_create("mpi", o->rank, o->world, op_done, o, &o->all, why, sizeof(why));
    if (rc < 0) return tr__errf(err, errlen, rc, "pipeline across ranks: the MPI backend: %s", why);
    rc = tr_comm_split(o->all, o->stage, o->replica, &o->dp, why, sizeof(why));
    bool in_tie = o->stage == o->tie_owner || o->stage == o->tie_user;
    /* the ranks outside a tie form groups of one, which nothing uses */
    int color = in_tie ? o->replica : o->replicas + o->rank;
    if (rc == 0) rc = tr_comm_split(o->all, color, o->stage, &o->tie, why, sizeof(why));
    if (rc < 0) return tr__errf(err, errlen, rc, "pipeline across ranks: its groups: %s", why);
    o->dp->done_arg = o->tie->done_arg = o;
    return 0;
}

int tr__pipe_own_create(tr__pipe_own_t **out, tr_model_t *model, const int *bounds, int stages,
                        int stage, int replicas, int rank, int world, int B, int T, char *err,
                        size_t errlen)
{
    *out = NULL;
    tr__pipe_own_t *o = calloc(1, sizeof(*o));
    if (!o) return tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
    *o = (tr__pipe_own_t){.model = model,
                          .stage = stage,
                          .stages = stages,
                          .replicas = replicas,
                          .replica = rank % replicas,
                          .rank = rank,
                          .world = world,
                          .B = B,
                          .T = T,
                          .bounds = bounds,
                          .timeout_s = 300};
    const char *fault = getenv("TROUPE_FAULT_PIPE_SILENT_RANK"); /* the tests' (docs/engine.md) */
    o->fault_silent = fault ? atoi(fault) : -1;
    layer_range(model, bounds[stage], bounds[stage + 1] - 1, &o->lo, &o->hi);
    int rc = find_ties(o, err, errlen);
    if (rc == 0) rc = make_groups(o, err, errlen);
    if (rc < 0) {
        tr__pipe_own_destroy(o);
        return rc;
    }
    *out = o;
    return 0;
}

void tr__pipe_own_destroy(tr__pipe_own_t *o)
{
    if (!o) return;
    tr_model_stage_destroy(o->eval);
    free(o->eval_in);
    tr_comm_destroy(o->tie);
    tr_comm_destroy(o->dp);
    tr_comm_destroy(o->all);
    free(o);
}

void tr__pipe_own_set_timeout(tr__pipe_own_t *o, double seconds)
{
    if (seconds > 0) o->timeout_s = seconds;
}

static void scale(float *x, size_t n, float mul)
{
    if (mul == 1.0f) return;
    for (size_t i = 0; i < n; i++)
        x[i] *= mul;
}

/* x (n floats) summed over c's ranks in place, CHUNK elements at a time: MPI's reductions
 * take a temporary buffer as large as what they reduce, which stays that small. */
#define CHUNK (1u << 20)
static int sum_over(tr__pipe_own_t *o, tr_comm_t *c, float *x, size_t n, const char *what,
                    char *err, size_t errlen)
{
    int rc = 0;
    for (size_t at = 0; rc == 0 && at < n; at += CHUNK) {
        uint64_t req = 0;
        size_t k = n - at < CHUNK ? n - at : CHUNK;
        o->done_req = 0;
        rc = c->ops->all_reduce(c, x + at, k, TR_DTYPE_F32, TR_REDUCE_SUM, &req);
        rc = wait_op(o, c, rc, req, what, err, errlen);
    }
    return rc;
}

int tr__pipe_own_reduce(tr__pipe_own_t *o, float *tied, float pre, float post, char *err,
                        size_t errlen)
{
    int rc = 0;
    bool owner = o->stage == o->tie_owner, user = o->stage == o->tie_user;
    if (o->rank == o->fault_silent) return 0; /* the others wait for it, then give up */
    if (owner || user) { /* the owner's gradient in the model's buffer, the user's kept apart */
        float *g = owner ? tr_model_grads(o->model) : tied;
        if (!g)
            return tr__errf(err, errlen, TR_EINVAL,
                            "pipeline: stage %d uses a tied tensor but kept no gradient of it",
                            o->stage);
        rc = sum_over(o, o->tie, g + o->tie_lo, o->tie_hi - o->tie_lo,
                      "the tied gradients' all-reduce between stages", err, errlen);
        if (rc < 0) return rc;
    }
    if (o->replicas == 1) return 0;
    float *g = tr_model_grads(o->model) + o->lo;
    size_t n = o->hi - o->lo;
    scale(g, n, pre);
    rc =
        sum_over(o, o->dp, g, n, "the stage's gradient all-reduce among its replicas", err, errlen);
    if (rc == 0) scale(g, n, post);
    return rc;
}

/* ZeRO's cut of n elements among `world` ranks (actors/engine/plan.h's tr__zero_owned): rank
 * r's count, clipped to n. */
static size_t zero_count(size_t n, int world, int r)
{
    size_t q = 2 * (size_t)world, S = (n + q - 1) / q * q / (size_t)world, a = (size_t)r * S;
    size_t b = a + S;
    return (b < n ? b : n) - (a < n ? a : n);
}

int tr__pipe_own_sync(tr__pipe_own_t *o, bool partitioned, char *err, size_t errlen)
{
    uint64_t req = 0;
    int rc = 0;
    float *params = tr_model_params(o->model);
    if (partitioned && o->replicas > 1) {
        size_t *counts = malloc((size_t)o->replicas * sizeof(size_t));
        if (!counts) return tr__errf(err, errlen, TR_ENOMEM, "pipeline: out of memory");
        for (int r = 0; r < o->replicas; r++)
            counts[r] = zero_count(o->hi - o->lo, o->replicas, r);
        o->done_req = 0;
        rc = o->dp->ops->all_gather_v(o->dp, params + o->lo, counts, TR_DTYPE_F32, &req);
        free(counts);
        rc = wait_op(o, o->dp, rc, req, "the stage's parameter all-gather among its replicas", err,
                     errlen);
        if (rc < 0) return rc;
    }
    if (o->stage != o->tie_owner && o->stage != o->tie_user) return 0;
    /* the owner is rank 0 of the tie group (split by stage, the owner's the lower) */
    int root = o->tie_owner < o->tie_user ? 0 : 1;
    o->done_req = 0;
    rc = o->tie->ops->broadcast(o->tie, params + o->tie_lo, o->tie_hi - o->tie_lo, TR_DTYPE_F32,
                                root, &req);
    rc = wait_op(o, o->tie, rc, req, "the tied parameters' broadcast to the stage that uses them",
                 err, errlen);
    if (rc == 0) tr_model_params_changed(o->model);
    return rc;
}

int tr__pipe_own_eval(tr__pipe_own_t *o, const tr_batch_t *batch, float *loss, bool *has_loss,
                      char *err, size_t errlen)
{
    *has_loss = false;
    if (!o->eval) {
        char why[256];
        int rc =
            tr_model_stage_create(&o->eval, o->model, o->bounds[o->stage],
                                  o->bounds[o->stage + 1] - 1, 1, o->B, o->T, why, sizeof(why));
        size_t in = tr_model_stage_input_floats(o->eval);
        if (rc == 0 && in && !(o->eval_in = malloc(in * sizeof(float)))) rc = TR_ENOMEM;
        if (rc < 0) return tr__errf(err, errlen, rc, "pipeline: evaluation's slot: %s", why);
    }
    uint64_t req = 0;
    int rc = 0;
    size_t in = tr_model_stage_input_floats(o->eval), out = tr_model_stage_output_floats(o->eval);
    if (o->stage > 0) {
        o->done_req = 0;
        rc = o->all->ops->recv(o->all, o->eval_in, in, TR_DTYPE_F32, o->rank - o->replicas,
                               TAG_EVAL, &req);
        rc = wait_op(o, o->all, rc, req,
                     "an evaluation batch's activations from the previous stage", err, errlen);
        if (rc < 0) return rc;
    }
    float l = 0;
    rc = tr_model_stage_forward(o->eval, 0, batch, o->eval_in, &l);
    if (rc < 0)
        return tr__errf(err, errlen, rc, "pipeline: evaluation on stage %d: %s", o->stage,
                        tr_model_stage_error(o->eval));
    if (o->stage + 1 == o->stages) {
        *loss = l;
        *has_loss = true;
        return 0;
    }
    o->done_req = 0;
    rc = o->all->ops->send(o->all, tr_model_stage_output(o->eval, 0), out, TR_DTYPE_F32,
                           o->rank + o->replicas, TAG_EVAL, &req);
    return wait_op(o, o->all, rc, req, "an evaluation batch's activations to the next stage", err,
                   errlen);
}

int tr__pipe_own_gather(tr__pipe_own_t *o, char *err, size_t errlen)
{
    float *params = tr_model_params(o->model);
    int rc = 0;
    for (int s = 0; rc == 0 && s < o->stages; s++) { /* from stage s's first replica */
        size_t lo, hi;
        uint64_t req = 0;
        layer_range(o->model, o->bounds[s], o->bounds[s + 1] - 1, &lo, &hi);
        char what[96];
        snprintf(what, sizeof(what), "stage %d's parameters broadcast to every rank", s);
        o->done_req = 0;
        rc = o->all->ops->broadcast(o->all, params + lo, hi - lo, TR_DTYPE_F32, s * o->replicas,
                                    &req);
        rc = wait_op(o, o->all, rc, req, what, err, errlen);
    }
    o->whole = true; /* for the caller to read, until the next batch, evaluation or step */
    if (rc == 0) tr_model_params_changed(o->model);
    return rc;
}

/* After a gather: what is not the stage's goes back to the kernel (zeroed), the tied range its
 * layers use stays. */
static void release_others(tr__pipe_own_t *o, size_t a, size_t b)
{
    float *params = tr_model_params(o->model);
    bool tie = o->stage == o->tie_user;
    for (size_t x = a; x < b;) { /* [x, y): up to the next held range */
        size_t y = b, next = b;
        if (tie && o->tie_lo >= x && o->tie_lo < y) y = o->tie_lo, next = o->tie_hi;
        tr__vmem_release(params + x, (y - x) * sizeof(float));
        x = next;
    }
}

void tr__pipe_own_unwhole(tr__pipe_own_t *o)
{
    if (!o->whole) return;
    o->whole = false;
    release_others(o, 0, o->lo);
    release_others(o, o->hi, tr_model_num_params(o->model));
}

void tr__pipe_own_zero_grad(const tr__pipe_own_t *o)
{
    memset(tr_model_grads(o->model) + o->lo, 0, (o->hi - o->lo) * sizeof(float));
}
