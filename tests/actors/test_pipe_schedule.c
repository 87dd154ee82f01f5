/* Pipeline schedules by invariants, over every shape S = 1..8, M = 1..12 and each kind (the
 * lists DeepSpeed itself yields are compared in tests/tools/test_pipeline_cli.sh): every
 * micro-batch is forwarded once and backwarded once on every stage (zb: its input and weight
 * gradients once each), after its forward; the activations stage s sends are the ones stage
 * s + 1 receives, in the same order, and so are the gradients back; no buffer is reused while
 * its micro-batch is live; the step count is DeepSpeed's; training ends with ReduceTiedGrads,
 * ReduceGrads, OptimizerStep. In virtual time, 1F1B's bubble equals (S-1)/(M+S-1) exactly for
 * any forward and backward costs, and zb's is below it whenever there is a bubble to fill.
 * Bad arguments are refused with the argument named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "troupe.h"

#define MAX_S 8
#define MAX_M 12

static tr_pipe_schedule_t *make(int kind, int M, int S, int s)
{
    char err[256];
    tr_pipe_schedule_t *p;
    if (tr_pipe_schedule_create(&p, kind, M, S, s, err, sizeof(err)) < 0)
        fail_msg("create kind %d M %d S %d stage %d: %s", kind, M, S, s, err);
    return p;
}

/* The micro-batches of op in stage order, into out (returns how many). */
static int seq_of(const tr_pipe_schedule_t *p, int op, int *out)
{
    int k = 0, n;
    for (int step = 0; step < tr_pipe_schedule_steps(p); step++) {
        const tr_pipe_instr_t *x = tr_pipe_schedule_step(p, step, &n);
        for (int i = 0; i < n; i++)
            if (x[i].op == op) out[k++] = x[i].micro_batch;
    }
    return k;
}

/* Each micro-batch exactly once, in any order. */
static void once_each(const int *mbs, int n, int M, const char *what)
{
    int seen[MAX_M] = {0};
    if (n != M) fail_msg("%s: %d instructions for %d micro-batches", what, n, M);
    for (int i = 0; i < n; i++) {
        if (mbs[i] < 0 || mbs[i] >= M || seen[mbs[i]]++)
            fail_msg("%s: micro-batch %d out of range or twice", what, mbs[i]);
    }
}

/* A buffer holds its micro-batch from its first use to its last: no other may take it then. */
static void buffers_not_reused_while_live(const tr_pipe_schedule_t *p, int M)
{
    int first[MAX_M], last[MAX_M], buf[MAX_M], pos = 0, n;
    for (int i = 0; i < M; i++) {
        first[i] = -1;
        last[i] = -1;
        buf[i] = -1;
    }
    for (int step = 0; step < tr_pipe_schedule_steps(p); step++) {
        const tr_pipe_instr_t *x = tr_pipe_schedule_step(p, step, &n);
        for (int i = 0; i < n; i++, pos++) {
            int mb = x[i].micro_batch;
            if (mb < 0) continue;
            assert_true(x[i].buffer >= 0 && x[i].buffer < tr_pipe_schedule_buffers(p));
            if (buf[mb] >= 0 && buf[mb] != x[i].buffer)
                fail_msg("micro-batch %d changes buffer %d -> %d", mb, buf[mb], x[i].buffer);
            buf[mb] = x[i].buffer;
            if (first[mb] < 0) first[mb] = pos;
            last[mb] = pos;
        }
    }
    for (int a = 0; a < M; a++)
        for (int b = a + 1; b < M; b++)
            if (buf[a] == buf[b] && first[b] <= last[a] && first[a] <= last[b])
                fail_msg("micro-batches %d and %d share buffer %d while both live", a, b, buf[a]);
}

static void check_stage(const tr_pipe_schedule_t *p, int kind, int M, int S, int s)
{
    int fwd[MAX_M * 2], bwd[MAX_M * 2], n;
    once_each(fwd, seq_of(p, TR_PIPE_FORWARD, fwd), M, "ForwardPass");
    if (kind == TR_PIPE_TRAIN_1F1B) {
        assert_int_equal(tr_pipe_schedule_steps(p), 2 * (M + S - 1));
        int want = S - s < M ? S - s : M;
        assert_int_equal(tr_pipe_schedule_buffers(p), want < 2 ? 2 : want);
        once_each(bwd, seq_of(p, TR_PIPE_BACKWARD, bwd), M, "BackwardPass");
    } else if (kind == TR_PIPE_TRAIN_ZB) {
        once_each(bwd, seq_of(p, TR_PIPE_BACKWARD_INPUT, bwd), M, "BackwardInput");
        once_each(bwd, seq_of(p, TR_PIPE_BACKWARD_WEIGHT, bwd), M, "BackwardWeight");
        assert_int_equal(seq_of(p, TR_PIPE_BACKWARD, bwd), 0);
        tr_pipe_schedule_t *one = make(TR_PIPE_TRAIN_1F1B, M, S, s); /* ZB-H1: no more memory */
        assert_true(tr_pipe_schedule_buffers(p) <= tr_pipe_schedule_buffers(one));
        tr_pipe_schedule_destroy(one);
    } else {
        assert_int_equal(tr_pipe_schedule_steps(p), M + S - 1);
        assert_int_equal(seq_of(p, TR_PIPE_BACKWARD, bwd), 0);
    }
    buffers_not_reused_while_live(p, M);
    if (kind == TR_PIPE_INFERENCE) return;
    const tr_pipe_instr_t *x = tr_pipe_schedule_step(p, tr_pipe_schedule_steps(p) - 1, &n);
    assert_true(n >= 3);
    assert_int_equal(x[n - 3].op, TR_PIPE_REDUCE_TIED_GRADS);
    assert_int_equal(x[n - 2].op, TR_PIPE_REDUCE_GRADS);
    assert_int_equal(x[n - 1].op, TR_PIPE_OPTIMIZER_STEP);
    assert_int_equal(x[n - 1].buffer, -1);
}

/* What stage s sends on, stage s + 1 receives, in the same order (and gradients back). */
static void links_match(tr_pipe_schedule_t **st, int S, int M)
{
    int a[MAX_M * 2], b[MAX_M * 2];
    for (int s = 0; s + 1 < S; s++) {
        int na = seq_of(st[s], TR_PIPE_SEND_ACTIVATION, a);
        int nb = seq_of(st[s + 1], TR_PIPE_RECV_ACTIVATION, b);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, (size_t)na * sizeof(int));
        once_each(a, na, M, "SendActivation");
        na = seq_of(st[s + 1], TR_PIPE_SEND_GRAD, a);
        nb = seq_of(st[s], TR_PIPE_RECV_GRAD, b);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, (size_t)na * sizeof(int));
    }
    assert_int_equal(seq_of(st[0], TR_PIPE_RECV_ACTIVATION, a), 0);
    assert_int_equal(seq_of(st[S - 1], TR_PIPE_SEND_ACTIVATION, a), 0);
}

static void test_schedule_invariants_every_shape(void **state)
{
    (void)state;
    const int kinds[] = {TR_PIPE_TRAIN_1F1B, TR_PIPE_TRAIN_ZB, TR_PIPE_INFERENCE};
    int shapes = 0;
    for (int k = 0; k < 3; k++)
        for (int S = 1; S <= MAX_S; S++)
            for (int M = 1; M <= MAX_M; M++) {
                tr_pipe_schedule_t *st[MAX_S];
                for (int s = 0; s < S; s++) {
                    st[s] = make(kinds[k], M, S, s);
                    check_stage(st[s], kinds[k], M, S, s);
                }
                links_match(st, S, M);
                for (int s = 0; s < S; s++)
                    tr_pipe_schedule_destroy(st[s]);
                shapes++;
            }
    printf("schedules: %d shapes x stages checked\n", shapes);
}

static tr_pipe_sim_t simulate(int kind, int M, int S, tr_pipe_costs_t c)
{
    tr_pipe_schedule_t *st[MAX_S * 2];
    for (int s = 0; s < S; s++)
        st[s] = make(kind, M, S, s);
    tr_pipe_sim_t r;
    char err[256];
    if (tr_pipe_simulate((const tr_pipe_schedule_t *const *)st, S, &c, &r, err, sizeof(err)))
        fail_msg("simulate: %s", err);
    for (int s = 0; s < S; s++)
        tr_pipe_schedule_destroy(st[s]);
    return r;
}

static void test_1f1b_bubble_is_theory_and_zb_is_below(void **state)
{
    (void)state;
    const tr_pipe_costs_t costs[] = {{1, 2, 1, 1}, {1, 1, 0.5, 0.5}, {2, 3, 2, 1}};
    for (size_t c = 0; c < sizeof(costs) / sizeof(costs[0]); c++)
        for (int S = 1; S <= MAX_S * 2; S++)
            for (int M = 1; M <= MAX_M * 3; M++) {
                tr_pipe_sim_t a = simulate(TR_PIPE_TRAIN_1F1B, M, S, costs[c]);
                double f = costs[c].forward, b = costs[c].backward;
                if (a.makespan != (M + S - 1) * (f + b) || a.bubble - a.theory > 1e-12 ||
                    a.theory - a.bubble > 1e-12)
                    fail_msg("1f1b S %d M %d: makespan %g bubble %.6f, theory %.6f", S, M,
                             a.makespan, a.bubble, a.theory);
                tr_pipe_sim_t z = simulate(TR_PIPE_TRAIN_ZB, M, S, costs[c]);
                if (z.busy != a.busy || z.bubble > a.bubble + 1e-12 ||
                    (S > 1 && M > 1 && costs[c].backward_weight > 0 && !(z.bubble < a.bubble)))
                    fail_msg("zb S %d M %d: bubble %.6f, 1f1b %.6f", S, M, z.bubble, a.bubble);
            }
    tr_pipe_sim_t z = simulate(TR_PIPE_TRAIN_ZB, 8, 4, costs[0]);
    printf("S 4, M 8: 1f1b bubble %.4f (theory), zb %.4f\n", z.theory, z.bubble);
}

static void test_bad_arguments_are_named(void **state)
{
    (void)state;
    char err[256];
    tr_pipe_schedule_t *p;
    assert_int_equal(tr_pipe_schedule_create(&p, TR_PIPE_TRAIN_1F1B, 4, 0, 0, err, sizeof(err)),
                     TR_EINVAL);
    assert_non_null(strstr(err, "stages is 0"));
    assert_int_equal(tr_pipe_schedule_create(&p, TR_PIPE_TRAIN_1F1B, 0, 2, 0, err, sizeof(err)),
                     TR_EINVAL);
    assert_non_null(strstr(err, "micro-batches is 0"));
    assert_int_equal(tr_pipe_schedule_create(&p, TR_PIPE_TRAIN_1F1B, 4, 2, 2, err, sizeof(err)),
                     TR_EINVAL);
    assert_non_null(strstr(err, "stage is 2; expected 0 to 1"));
    assert_int_equal(tr_pipe_schedule_create(&p, 9, 4, 2, 0, err, sizeof(err)), TR_EINVAL);
    assert_null(p);
    /* stages out of order, or a stage of another pipeline: refused, not simulated */
    tr_pipe_schedule_t *st[2] = {make(TR_PIPE_TRAIN_1F1B, 4, 2, 1),
                                 make(TR_PIPE_TRAIN_1F1B, 4, 2, 0)};
    tr_pipe_costs_t c = {1, 2, 1, 1};
    tr_pipe_sim_t r;
    assert_int_equal(
        tr_pipe_simulate((const tr_pipe_schedule_t *const *)st, 2, &c, &r, err, sizeof(err)),
        TR_EINVAL);
    assert_non_null(strstr(err, "schedule 0 is stage 1 of 2"));
    tr_pipe_schedule_destroy(st[0]);
    st[0] = make(TR_PIPE_TRAIN_1F1B, 3, 2, 0);
    assert_int_equal(
        tr_pipe_simulate((const tr_pipe_schedule_t *const *)st, 2, &c, &r, err, sizeof(err)),
        TR_EINVAL);
    assert_non_null(strstr(err, "schedule 1 is stage 0 of 2"));
    tr_pipe_schedule_destroy(st[0]);
    tr_pipe_schedule_destroy(st[1]);
    assert_string_equal(tr_pipe_op_name(99), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule_invariants_every_shape),
        cmocka_unit_test(test_1f1b_bubble_is_theory_and_zb_is_below),
        cmocka_unit_test(test_bad_arguments_are_named),
    };
    return cmocka_run_group_tests_name("pipe_schedule", tests, NULL, NULL);
}
