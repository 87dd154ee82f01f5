/* Pipeline schedules executed by stage actors (tr_pipe_create, tr_pipe_run): every stage runs each
 * of its compute instructions once, a stage's forward of a micro-batch after the previous stage's
 * and its backward after the next stage's (the transfers carry the order), for 1F1B and zb on 1 to
 * 4 stages; a transfer whose header does not match (a stage sending one element too many) is an
 * error naming both stages, not a hang; a failing instruction stops every stage with its stage and
 * instruction named, and the same stage actors then run the next batch. A batch's tensors
 * (tr_pipe_run_batch) reach every stage's start callback through the buffer registry; a start that
 * fails, on any stage, fails the batch without a hang, and so does a reference that no longer
 * resolves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe.h"

#define MAX_S 4
#define M     6

typedef struct record {
    atomic_int clock;                 /* a global order of events */
    int fwd[MAX_S][M], bwd[MAX_S][M]; /* when each ran (0: not) */
    int runs[MAX_S];
    int fail_stage, fail_mb;
    int compute_us; /* a forward's time (0: instant) */
    int one_batch;  /* run one batch, not two on the same stage actors */
    int second_rc;  /* the second batch's code (its fail_stage is -1) */
} record_t;

static int exec(void *user, int stage, const tr_pipe_instr_t *x, const void *in,
                tr_pipe_report_t *rep)
{
    (void)rep;
    record_t *r = user;
    (void)in; /* a synthetic run: headers only */
    if (x->op == TR_PIPE_FORWARD || x->op == TR_PIPE_BACKWARD || x->op == TR_PIPE_BACKWARD_INPUT) {
        int t = atomic_fetch_add(&r->clock, 1) + 1;
        int *slot = x->op == TR_PIPE_FORWARD ? &r->fwd[stage][x->micro_batch]
                                             : &r->bwd[stage][x->micro_batch];
        if (*slot) return TR_EINVAL; /* twice */
        *slot = t;
    }
    r->runs[stage]++;
    if (stage == r->fail_stage && x->op == TR_PIPE_FORWARD && x->micro_batch == r->fail_mb)
        return TR_EIO;
    if (r->compute_us && x->op == TR_PIPE_FORWARD) usleep((useconds_t)r->compute_us);
    return 0;
}

/* Two batches (steps 7 and 8) on one pipeline of S stage actors in a runtime of the test's,
 * the records cleared between them: the first one's code; the second's in r->second_rc. */
static int run(record_t *r, int kind, int S, char *err, size_t len)
{
    tr_pipe_run_opts_t o = {.kind = kind,
                            .stages = S,
                            .micro_batches = M,
                            .exec = exec,
                            .user = r,
                            .link_elements = 4096,
                            .link_dtype = TR_DTYPE_F32};
    tr_runtime_t *rt;
    if (tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 1})) fail_msg("runtime");
    tr_pipe_t *p;
    tr_pipe_run_result_t res;
    int rc = tr_pipe_create(&p, rt, &o, err, len);
    if (rc == 0) rc = tr_pipe_run(p, 7, NULL, &res, err, len);
    if (rc == 0)
        printf("pipe run: kind %d, S %d: bubble %.3f (instant compute), makespan %.2f ms\n", kind,
               S, res.bubble, res.makespan_ms);
    if (p && !r->one_batch) { /* the same actors again; the exec callbacks ran before */
        memset(r->fwd, 0, sizeof(r->fwd));
        memset(r->bwd, 0, sizeof(r->bwd));
        r->fail_stage = -1;
        char err2[1024];
        r->second_rc = tr_pipe_run(p, 8, NULL, &res, err2, sizeof(err2));
        if (r->second_rc) printf("second batch: %s\n", err2);
    }
    tr_runtime_shutdown(rt, "test over");
    tr_runtime_run(rt);
    tr_runtime_close(rt);
    tr_pipe_destroy(p);
    return rc;
}

static void test_stages_run_in_dataflow_order(void **state)
{
    (void)state;
    for (int kind = TR_PIPE_TRAIN_1F1B; kind <= TR_PIPE_TRAIN_ZB; kind += 2)
        for (int S = 1; S <= MAX_S; S++) {
            record_t *r = calloc(1, sizeof(*r));
            r->fail_stage = -1;
            char err[1024];
            if (run(r, kind, S, err, sizeof(err))) fail_msg("%s", err);
            assert_int_equal(r->second_rc, 0);
            for (int s = 0; s < S; s++)
                for (int mb = 0; mb < M; mb++) {
                    assert_true(r->fwd[s][mb] > 0 && r->bwd[s][mb] > r->fwd[s][mb]);
                    if (s > 0) assert_true(r->fwd[s][mb] > r->fwd[s - 1][mb]);
                    if (s + 1 < S) assert_true(r->bwd[s][mb] > r->bwd[s + 1][mb]);
                }
            free(r);
        }
}

static void test_header_mismatch_names_both_stages(void **state)
{
    (void)state;
    record_t *r = calloc(1, sizeof(*r));
    r->fail_stage = -1;
    char err[1024];
    r->one_batch = 1; /* the fault stays with the stage */
    setenv("TROUPE_FAULT_PIPE_STAGE", "1", 1);
    int rc = run(r, TR_PIPE_TRAIN_1F1B, 3, err, sizeof(err));
    unsetenv("TROUPE_FAULT_PIPE_STAGE");
    printf("mismatch: %s\n", err);
    assert_int_equal(rc, TR_EMISMATCH);
    assert_non_null(strstr(err, "received from stage 1"));
    assert_non_null(strstr(err, "of 4097 elements of f32"));
    assert_non_null(strstr(err, "another element count"));
    assert_non_null(strstr(err, "of 4096 elements of f32"));
    free(r);
}

static void test_failing_instruction_stops_every_stage(void **state)
{
    (void)state;
    record_t *r = calloc(1, sizeof(*r));
    r->fail_stage = 1;
    r->fail_mb = 2;
    char err[1024];
    int rc = run(r, TR_PIPE_TRAIN_ZB, 3, err, sizeof(err));
    printf("failure: %s\n", err);
    assert_int_equal(rc, TR_EIO);
    assert_non_null(strstr(err, "stage 1: ForwardPass of micro-batch 2"));
    assert_int_equal(r->second_rc, 0); /* the late transfers of the failed batch are dropped */
    free(r);
    /* with compute that takes time, the stages the failure stopped are not blamed */
    r = calloc(1, sizeof(*r));
    r->fail_stage = 2;
    r->fail_mb = 1;
    r->compute_us = 2000;
    rc = run(r, TR_PIPE_TRAIN_1F1B, 3, err, sizeof(err));
    printf("failure with compute: %s\n", err);
    assert_int_equal(rc, TR_EIO);
    assert_non_null(strstr(err, "stage 2: ForwardPass of micro-batch 1"));
    assert_int_equal(r->second_rc, 0);
    free(r);
    tr_pipe_run_opts_t bad = {
        .kind = TR_PIPE_TRAIN_1F1B, .stages = 2, .micro_batches = 2, .exec = exec};
    tr_pipe_t *p;
    assert_int_equal(tr_pipe_create(&p, NULL, &bad, err, sizeof(err)), TR_EINVAL);
    assert_null(p);
    assert_non_null(strstr(err, "link_elements is 0"));
}

/* What each stage's start callback saw (each stage writes its own row). */
typedef struct starts {
    int fail_stage; /* its start fails (-1: none) */
    int calls[MAX_S];
    unsigned long long bytes[MAX_S][2];
    int value[MAX_S];  /* tensor 0's element 5; -1: no tensor 0 */
    int second[MAX_S]; /* tensor 1 was named */
} starts_t;

static int on_start(void *user, int stage, void *const *tensors, const unsigned long long *bytes,
                    tr_pipe_report_t *rep)
{
    starts_t *t = user;
    t->calls[stage]++;
    t->bytes[stage][0] = bytes[0];
    t->bytes[stage][1] = bytes[1];
    t->value[stage] = tensors[0] ? ((const int *)tensors[0])[5] : -1;
    t->second[stage] = tensors[1] != NULL;
    if (stage != t->fail_stage) return 0;
    snprintf(rep->why, sizeof(rep->why), "the start of stage %d failed on purpose", stage);
    return TR_EIO;
}

static int no_exec(void *user, int stage, const tr_pipe_instr_t *x, const void *in,
                   tr_pipe_report_t *rep)
{
    (void)user;
    (void)stage;
    (void)x;
    (void)in;
    (void)rep;
    return 0;
}

static void test_batch_tensors_reach_every_start(void **state)
{
    (void)state;
    enum { S = 3 };
    static int data[16];
    for (int i = 0; i < 16; i++)
        data[i] = 100 + i;
    starts_t *t = calloc(1, sizeof(*t));
    t->fail_stage = -1;
    tr_runtime_t *rt;
    if (tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 1})) fail_msg("runtime");
    tr_buffer_info_t bi = {.name = "test/batch",
                           .base = data,
                           .bytes = sizeof(data),
                           .dtype = TR_DTYPE_I32,
                           .owner = TR_ACTOR_NONE,
                           .lifetime = TR_BUFFER_REQUEST};
    uint64_t id;
    tr_pipe_batch_t batch = {0};
    assert_int_equal(tr_buffer_register(rt, &bi, &id), 0);
    assert_int_equal(tr_buffer_ref(rt, id, 0, sizeof(data), TR_DTYPE_I32, &batch.tensor[0]), 0);
    tr_pipe_run_opts_t o = {.kind = TR_PIPE_TRAIN_1F1B,
                            .stages = S,
                            .micro_batches = M,
                            .exec = no_exec,
                            .start = on_start,
                            .user = t,
                            .link_elements = 16,
                            .link_dtype = TR_DTYPE_F32};
    tr_pipe_t *p;
    char err[1024];
    if (tr_pipe_create(&p, rt, &o, err, sizeof(err))) fail_msg("%s", err);
    tr_pipe_run_result_t res;
    if (tr_pipe_run_batch(p, 1, &batch, NULL, &res, err, sizeof(err))) fail_msg("%s", err);
    for (int s = 0; s < S; s++) {
        assert_int_equal(t->calls[s], 1);
        assert_int_equal(t->bytes[s][0], sizeof(data));
        assert_int_equal(t->bytes[s][1], 0);
        assert_int_equal(t->value[s], 105);
        assert_int_equal(t->second[s], 0);
    }
    if (tr_pipe_run(p, 2, NULL, &res, err, sizeof(err))) fail_msg("%s", err); /* no tensors */
    for (int s = 0; s < S; s++)
        assert_int_equal(t->value[s], -1);
    for (int k = 0; k < 30; k++) { /* a start failing on each stage in turn, then none */
        t->fail_stage = k % (S + 1) < S ? k % (S + 1) : -1;
        int rc =
            tr_pipe_run_batch(p, 3 + (unsigned long long)k, &batch, NULL, &res, err, sizeof(err));
        if (t->fail_stage < 0) {
            if (rc) fail_msg("%s", err);
            continue;
        }
        assert_int_equal(rc, TR_EIO);
        char want[64];
        snprintf(want, sizeof(want), "the start of stage %d failed on purpose", t->fail_stage);
        if (!strstr(err, want)) fail_msg("run %d: %s", k, err);
    }
    t->fail_stage = -1;
    assert_int_equal(tr_buffer_unregister(rt, id), 0); /* a stale reference fails the batch */
    int rc = tr_pipe_run_batch(p, 40, &batch, NULL, &res, err, sizeof(err));
    printf("stale reference: %s\n", err);
    assert_int_equal(rc, TR_ENOENT);
    assert_non_null(strstr(err, "does not resolve"));
    if (tr_pipe_run(p, 41, NULL, &res, err, sizeof(err))) fail_msg("%s", err);
    tr_runtime_shutdown(rt, "test over");
    tr_runtime_run(rt);
    tr_runtime_close(rt);
    tr_pipe_destroy(p);
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stages_run_in_dataflow_order),
        cmocka_unit_test(test_header_mismatch_names_both_stages),
        cmocka_unit_test(test_failing_instruction_stops_every_stage),
        cmocka_unit_test(test_batch_tensors_reach_every_start),
    };
    return cmocka_run_group_tests_name("pipe_run", tests, NULL, NULL);
}
