/* Pipeline stages across ranks (tr_pipe_create with across_ranks, under mpirun with one rank per
 * stage; on 4 ranks, 2 stages x 2 replicas): each rank runs its own stage, transfers and their
 * tensors cross over MPI through the comm layer, and every stage runs every compute instruction
 * once, for 1F1B and zb, batch after batch on the same stage actor and link, each receiving exactly
 * the tensor its neighbour (in its own replica) computed for that micro-batch and step; with
 * compute that takes time each stage's idle share is reported. With TROUPE_FAULT_PIPE_STAGE=0
 * (argument "fault") rank 0 sends one element too many and rank 1 reports the mismatch naming
 * both stages (the job then ends: the script checks it does not hang). Not cmocka: each rank
 * prints what it saw and exits 0 or 1. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "troupe.h"

#define M 6
#define N 4096 /* elements of each tensor */

typedef struct rec {
    int fwd[M], bwd[M], weight[M];
    int S, replica, bad;
    unsigned long long step;
    float acts[M][N], grads[M][N]; /* the send areas: one slot per micro-batch */
} rec_t;

/* What stage s computes for micro-batch mb: an activation (+) or a gradient (-), different
 * for every stage, micro-batch, step, replica and element. */
static float value(const rec_t *r, int s, int mb, int i, int sign)
{
    return (float)sign *
           (float)(1 + s * 100000 + mb * 10000 + (int)r->step * 1000 + r->replica * 500 + i % 499);
}

/* `in` must be what the neighbour computed; then this stage's own tensor is written. */
static void tensors(rec_t *r, int s, int mb, const float *in, int sign)
{
    int from = sign > 0 ? s - 1 : s + 1;
    if (from >= 0 && from < r->S)
        for (int i = 0; i < N; i++)
            if (!in || in[i] != value(r, from, mb, i, sign)) {
                if (!r->bad++)
                    printf("stage %d: micro-batch %d: %s element %d is %g, expected %g\n", s, mb,
                           sign > 0 ? "activation" : "gradient", i, in ? in[i] : -0.0,
                           value(r, from, mb, i, sign));
                break;
            }
    float *out = sign > 0 ? r->acts[mb] : r->grads[mb];
    for (int i = 0; i < N; i++)
        out[i] = value(r, s, mb, i, sign);
}

static int exec(void *user, int stage, const tr_pipe_instr_t *x, const void *in,
                tr_pipe_report_t *rep)
{
    rec_t *r = user;
    (void)rep;
    if (x->op == TR_PIPE_FORWARD) {
        r->fwd[x->micro_batch]++;
        tensors(r, stage, x->micro_batch, in, 1);
        usleep(2000);
    }
    if (x->op == TR_PIPE_BACKWARD || x->op == TR_PIPE_BACKWARD_INPUT) {
        r->bwd[x->micro_batch]++;
        tensors(r, stage, x->micro_batch, in, -1);
        usleep(x->op == TR_PIPE_BACKWARD ? 4000 : 2000);
    }
    if (x->op == TR_PIPE_BACKWARD_WEIGHT) {
        r->weight[x->micro_batch]++;
        usleep(2000);
    }
    return 0;
}

static void *send_mem(void *user, int stage, const tr_pipe_instr_t *x, void **area, size_t *bytes)
{
    rec_t *r = user;
    (void)stage;
    bool act = x->op == TR_PIPE_SEND_ACTIVATION;
    *area = act ? (void *)r->acts : (void *)r->grads;
    *bytes = sizeof(r->acts);
    return act ? r->acts[x->micro_batch] : r->grads[x->micro_batch];
}

/* This rank's stage of an S x D pipeline of `kind`, spawned on rt. */
static int make(tr_runtime_t *rt, int kind, int S, int D, rec_t *r, tr_pipe_t **p, char *err,
                size_t len)
{
    r->S = S;
    tr_pipe_run_opts_t o = {.kind = kind,
                            .stages = S,
                            .micro_batches = M,
                            .exec = exec,
                            .send_mem = send_mem,
                            .user = r,
                            .link_elements = N,
                            .link_dtype = TR_DTYPE_F32,
                            .across_ranks = 1,
                            .replicas = D};
    return tr_pipe_create(p, rt, &o, err, len);
}

static int run(tr_pipe_t *p, unsigned long long step, char *err, size_t len,
               tr_pipe_run_result_t *res, rec_t *r)
{
    memset(r->fwd, 0, sizeof(r->fwd));
    memset(r->bwd, 0, sizeof(r->bwd));
    memset(r->weight, 0, sizeof(r->weight));
    r->step = step;
    return tr_pipe_run(p, step, NULL, res, err, len);
}

static void end(tr_runtime_t *rt, tr_pipe_t *p)
{
    tr_runtime_shutdown(rt, "test over");
    tr_runtime_run(rt);
    tr_runtime_close(rt);
    tr_pipe_destroy(p);
}

int main(int argc, char **argv)
{
    int world = atoi(getenv("OMPI_COMM_WORLD_SIZE") ? getenv("OMPI_COMM_WORLD_SIZE") : "1");
    int rank = atoi(getenv("OMPI_COMM_WORLD_RANK") ? getenv("OMPI_COMM_WORLD_RANK") : "0");
    int D = world == 4 ? 2 : 1, S = world / D; /* stage-major: rank = stage * D + replica */
    char err[1024];
    tr_pipe_run_result_t res;
    static rec_t r;
    r.replica = rank % D;
    tr_runtime_t *rt;
    tr_pipe_t *p = NULL;
    if (tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 1})) return 1;
    if (argc > 1 && !strcmp(argv[1], "fault")) {
        setenv("TROUPE_FAULT_PIPE_STAGE", "0", 1);
        int rc = make(rt, TR_PIPE_TRAIN_1F1B, S, D, &r, &p, err, sizeof(err));
        if (rc == 0) rc = run(p, 0, err, sizeof(err), &res, &r);
        printf("fault: rank %d: %d: %s\n", rank, rc, rc ? err : "");
        fflush(stdout);
        int named = rc == TR_EMISMATCH && strstr(err, "stage 1 received from stage 0") &&
                    strstr(err, "another element count");
        printf("fault: rank %d: %s\n", rank, named ? "reported" : "NOT REPORTED");
        fflush(stdout);
        end(rt, p);
        return 1; /* a failed rank exits non-zero, which ends the MPI job (rank 0 waits on) */
    }
    tr_runtime_close(rt);
    for (int kind = TR_PIPE_TRAIN_1F1B; kind <= TR_PIPE_TRAIN_ZB; kind += 2) {
        if (tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 1})) return 1;
        if (make(rt, kind, S, D, &r, &p, err, sizeof(err))) {
            printf("rank %d: %s\n", rank, err);
            return 1;
        }
        for (unsigned long long step = 0; step < 3; step++) {
            if (run(p, step, err, sizeof(err), &res, &r)) {
                printf("rank %d: %s\n", rank, err);
                return 1;
            }
            if (r.bad) return 1;
            for (int mb = 0; mb < M; mb++)
                if (r.fwd[mb] != 1 || r.bwd[mb] != 1 ||
                    r.weight[mb] != (kind == TR_PIPE_TRAIN_ZB)) {
                    printf("rank %d: kind %d: micro-batch %d ran %d forwards, %d backwards\n", rank,
                           kind, mb, r.fwd[mb], r.bwd[mb]);
                    return 1;
                }
            if (step == 2)
                printf("rank %d (stage %d of %d, replica %d of %d), %s: every instruction once, "
                       "every tensor as sent; this stage idle %.3f of the batch (%.1f ms)\n",
                       rank, rank / D, S, rank % D, D, kind == TR_PIPE_TRAIN_ZB ? "zb" : "1f1b",
                       res.bubble, res.makespan_ms);
        }
        end(rt, p);
    }
    printf("rank %d: ok\n", rank);
    return 0;
}
