/* Pipeline stages across ranks (tr_pipe_run with across_ranks, under mpirun with one rank per
 * stage): each rank runs its own stage, transfers cross over MPI through the comm layer, and
 * every stage runs every compute instruction once, for 1F1B and zb, batch after batch; with
 * compute that takes time each stage's idle share is reported. With TROUPE_FAULT_PIPE_STAGE=0
 * (argument "fault") rank 0 sends one element too many and rank 1 reports the mismatch naming
 * both stages (the job then ends: the script checks it does not hang). Not cmocka: each rank
 * prints what it saw and exits 0 or 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "troupe.h"

#define M 6

typedef struct rec {
    int fwd[M], bwd[M], weight[M];
} rec_t;

static int exec(void *user, int stage, const tr_pipe_instr_t *x)
{
    rec_t *r = user;
    (void)stage;
    if (x->op == TR_PIPE_FORWARD) r->fwd[x->micro_batch]++, usleep(2000);
    if (x->op == TR_PIPE_BACKWARD || x->op == TR_PIPE_BACKWARD_INPUT)
        r->bwd[x->micro_batch]++, usleep(x->op == TR_PIPE_BACKWARD ? 4000 : 2000);
    if (x->op == TR_PIPE_BACKWARD_WEIGHT) r->weight[x->micro_batch]++, usleep(2000);
    return 0;
}

static int run(int kind, int S, unsigned long long step, char *err, size_t len,
               tr_pipe_run_result_t *res, rec_t *r)
{
    memset(r, 0, sizeof(*r));
    tr_pipe_run_opts_t o = {.kind = kind,
                            .stages = S,
                            .micro_batches = M,
                            .exec = exec,
                            .user = r,
                            .link_elements = 4096,
                            .link_dtype = TR_DTYPE_F32,
                            .step = step,
                            .across_ranks = 1};
    return tr_pipe_run(&o, res, err, len);
}

int main(int argc, char **argv)
{
    int S = atoi(getenv("OMPI_COMM_WORLD_SIZE") ? getenv("OMPI_COMM_WORLD_SIZE") : "1");
    int rank = atoi(getenv("OMPI_COMM_WORLD_RANK") ? getenv("OMPI_COMM_WORLD_RANK") : "0");
    char err[1024];
    tr_pipe_run_result_t res;
    rec_t r;
    if (argc > 1 && !strcmp(argv[1], "fault")) {
        setenv("TROUPE_FAULT_PIPE_STAGE", "0", 1);
        int rc = run(TR_PIPE_TRAIN_1F1B, S, 0, err, sizeof(err), &res, &r);
        printf("fault: rank %d: %d: %s\n", rank, rc, rc ? err : "");
        fflush(stdout);
        int named = rc == TR_EMISMATCH && strstr(err, "stage 1 received from stage 0") &&
                    strstr(err, "another element count");
        printf("fault: rank %d: %s\n", rank, named ? "reported" : "NOT REPORTED");
        fflush(stdout);
        return 1; /* a failed rank exits non-zero, which ends the MPI job (rank 0 waits on) */
    }
    for (int kind = TR_PIPE_TRAIN_1F1B; kind <= TR_PIPE_TRAIN_ZB; kind += 2)
        for (unsigned long long step = 0; step < 3; step++) {
            if (run(kind, S, step, err, sizeof(err), &res, &r)) {
                printf("rank %d: %s\n", rank, err);
                return 1;
            }
            for (int mb = 0; mb < M; mb++)
                if (r.fwd[mb] != 1 || r.bwd[mb] != 1 ||
                    r.weight[mb] != (kind == TR_PIPE_TRAIN_ZB)) {
                    printf("rank %d: kind %d: micro-batch %d ran %d forwards, %d backwards\n", rank,
                           kind, mb, r.fwd[mb], r.bwd[mb]);
                    return 1;
                }
            if (step == 2)
                printf("rank %d (stage %d of %d), %s: every instruction once; this stage idle "
                       "%.3f of the batch (%.1f ms)\n",
                       rank, rank, S, kind == TR_PIPE_TRAIN_ZB ? "zb" : "1f1b", res.bubble,
                       res.makespan_ms);
        }
    printf("rank %d: ok\n", rank);
    return 0;
}
