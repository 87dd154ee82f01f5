/* A model run through a pipeline of stage actors (tr_pipe_model) against the same model run
 * unpipelined (tr_model_forward/backward over the same micro-batches): GPT-2, whose head is
 * tied to the embedding's wte, cut into 2 and 3 stages (1F1B and zb), and an MLP whose links
 * carry different widths, cut into 3: every micro-batch's loss is bitwise the same, every
 * gradient too except the tied wte's (summed in another order: the relative L2 difference of
 * the gradients under 1e-6); partitioning by
 * DeepSpeed's methods, and bad bounds and methods refused with the reason. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "troupe.h"

#define NB 2 /* batch */
#define NT 8 /* positions */
#define NM 4 /* micro-batches */

static tr_model_t *gpt2(void)
{
    tr_gpt2_config_t c = {.max_seq_len = 16,
                          .vocab_size = 60,
                          .padded_vocab_size = 64,
                          .num_layers = 4,
                          .num_heads = 4,
                          .channels = 32};
    tr_model_t *m;
    char why[256];
    if (tr_model_gpt2_create(&m, &c, why, sizeof(why))) fail_msg("gpt2: %s", why);
    tr_model_init_params(m, 7);
    return m;
}

/* the same GPT-2 in bf16 mixed precision */
static tr_model_t *gpt2_bf16(void)
{
    tr_model_t *m = gpt2();
    if (tr_model_set_bf16(m, 1)) fail_msg("gpt2: no memory for the bf16 copies");
    return m;
}

static tr_model_t *mlp(void)
{
    int widths[] = {12, 20, 16, 5};
    tr_model_t *m;
    char why[256];
    if (tr_model_mlp_create(&m, widths, 4, why, sizeof(why))) fail_msg("mlp: %s", why);
    tr_model_init_params(m, 9);
    return m;
}

typedef struct data {
    int tokens[NM][NB * NT], targets[NM][NB * NT];
    float x[NM][NB * NT * 12];
    tr_batch_t b[NM];
} data_t;

static void make_data(data_t *d, int floats, int classes)
{
    uint64_t s = 12345;
    for (int k = 0; k < NM; k++) {
        for (int i = 0; i < NB * NT; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            d->tokens[k][i] = (int)(s >> 33) % 60;
            d->targets[k][i] = (int)(s >> 41) % classes;
        }
        for (int i = 0; i < NB * NT * 12; i++)
            d->x[k][i] = (float)((i * 37 + k * 11) % 17) / 17.0f - 0.5f;
        d->b[k] = (tr_batch_t){.B = NB,
                               .T = NT,
                               .tokens = floats ? NULL : d->tokens[k],
                               .x = floats ? d->x[k] : NULL,
                               .targets = d->targets[k]};
    }
}

/* The reference: NM forward/backward passes of the whole model. */
static void reference(tr_model_t *m, const data_t *d, float *losses)
{
    tr_model_zero_grad(m);
    for (int k = 0; k < NM; k++) {
        if (tr_model_forward(m, &d->b[k], &losses[k])) fail_msg("%s", tr_model_error(m));
        if (tr_model_backward(m, NULL, NULL)) fail_msg("%s", tr_model_error(m));
    }
}

/* The runtime the stage actors live in, and its end (before tr_pipe_model_destroy). */
static tr_runtime_t *rt_new(void)
{
    tr_runtime_t *rt;
    if (tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 1})) fail_msg("runtime");
    return rt;
}

static void rt_end(tr_runtime_t *rt)
{
    tr_runtime_shutdown(rt, "test over");
    tr_runtime_run(rt);
    tr_runtime_close(rt);
}

static void compare(tr_model_t *(*make)(void), int floats, int classes, int S, int kind,
                    const char *method, int ckpt)
{
    data_t *d = calloc(1, sizeof(*d));
    make_data(d, floats, classes);
    tr_model_t *ref = make(), *pip = make();
    float want[NM], got[NM];
    reference(ref, d, want);
    int bounds[8];
    char err[1024];
    if (tr_pipe_partition(pip, method, S, bounds, err, sizeof(err))) fail_msg("%s", err);
    tr_model_set_checkpoint_interval(pip, ckpt); /* the stages checkpoint every ckpt layers */
    tr_pipe_model_t *pm;
    tr_runtime_t *rt = rt_new();
    if (tr_pipe_model_create(&pm, rt, pip, bounds, S, kind, NM, NB, NT, 0, NULL, err, sizeof(err)))
        fail_msg("%s", err);
    tr_model_zero_grad(pip);
    tr_pipe_run_result_t r;
    if (tr_pipe_model_run(pm, d->b, got, 0, &r, err, sizeof(err))) fail_msg("%s", err);
    rt_end(rt);
    assert_memory_equal(got, want, sizeof(want));
    size_t n = tr_model_num_params(ref), same = 0;
    const float *a = tr_model_grads(ref), *g = tr_model_grads(pip);
    double diff = 0, norm = 0; /* float summation order: the relative L2 difference */
    for (size_t i = 0; i < n; i++) {
        same += a[i] == g[i];
        diff += ((double)a[i] - g[i]) * ((double)a[i] - g[i]);
        norm += (double)a[i] * a[i];
    }
    double worst = sqrt(diff / (norm > 0 ? norm : 1));
    size_t tied = 0;
    for (int i = 0; i < tr_model_num_layers(pip); i++)
        tied += tr_model_layer(pip, i)->tie_count;
    printf("pipe model: S %d (%s, bounds %d..%d), kind %d: losses bitwise, %zu of %zu gradients "
           "bitwise (%zu tied), relative L2 difference %.2g\n",
           S, method, bounds[0], bounds[S], kind, same, n, tied, worst);
    assert_true(worst < 1e-6);
    assert_true(same >= n - tied);
    tr_pipe_model_destroy(pm);
    tr_model_destroy(ref);
    tr_model_destroy(pip);
    free(d);
}

static void test_gpt2_pipelined_equals_unpipelined(void **state)
{
    (void)state;
    compare(gpt2, 0, 60, 2, TR_PIPE_TRAIN_1F1B, "uniform", 0);
    compare(gpt2, 0, 60, 3, TR_PIPE_TRAIN_1F1B, "parameters", 0);
    compare(gpt2, 0, 60, 3, TR_PIPE_TRAIN_ZB, "uniform", 0);
    compare(gpt2, 0, 60, 6, TR_PIPE_TRAIN_1F1B, "uniform", 0); /* a layer per stage */
    compare(gpt2, 0, 60, 2, TR_PIPE_TRAIN_1F1B, "uniform", 1); /* activation checkpointing */
    compare(gpt2, 0, 60, 2, TR_PIPE_TRAIN_ZB, "uniform", 2);
}

static void test_mlp_links_of_different_widths(void **state)
{
    (void)state;
    compare(mlp, 1, 5, 3, TR_PIPE_TRAIN_1F1B, "uniform", 0);
    compare(mlp, 1, 5, 2, TR_PIPE_TRAIN_ZB, "parameters", 0);
}

/* zb's split backward on real layers: a stage of GPT-2 blocks (and of MLP linears) run as
 * BackwardInput for two micro-batches, then BackwardWeight for both, gives bitwise the input
 * gradients and parameter gradients of the whole backwards; the input part leaves the
 * parameter gradients untouched (the weight work is really deferred). */
static void split_equals_whole(tr_model_t *(*make)(void), int floats, int first, int last)
{
    data_t *d = calloc(1, sizeof(*d));
    make_data(d, floats, 5);
    tr_model_t *m = make();
    size_t n = tr_model_num_params(m), in_floats;
    tr_model_stage_t *head, *st[2];
    char why[256];
    int L = tr_model_num_layers(m);
    /* the layers before `first` produce the stage's input; those after it its output's grad */
    if (tr_model_stage_create(&head, m, 0, first - 1, 2, NB, NT, why, sizeof(why)) ||
        tr_model_stage_create(&st[0], m, first, last, 2, NB, NT, why, sizeof(why)) ||
        tr_model_stage_create(&st[1], m, first, last, 2, NB, NT, why, sizeof(why)))
        fail_msg("%s", why);
    assert_int_equal(tr_model_stage_splits(st[0]), 1);
    in_floats = tr_model_stage_input_floats(st[0]);
    size_t out_floats = tr_model_stage_output_floats(st[0]);
    float *dout = malloc(out_floats * sizeof(float)), *din[2][2], *grads[2];
    for (size_t i = 0; i < out_floats; i++)
        dout[i] = (float)((int)(i * 29 % 23) - 11) / 64.0f;
    for (int way = 0; way < 2; way++) { /* 0: whole backwards, 1: split */
        tr_model_zero_grad(m);
        for (int mb = 0; mb < 2; mb++) {
            float loss;
            if (tr_model_stage_forward(head, mb, &d->b[mb], NULL, &loss) ||
                tr_model_stage_forward(st[way], mb, &d->b[mb], tr_model_stage_output(head, mb),
                                       &loss))
                fail_msg("forward");
        }
        for (int mb = 0; mb < 2; mb++) {
            const float *g;
            int rc = way ? tr_model_stage_backward_input(st[way], mb, dout, &g)
                         : tr_model_stage_backward(st[way], mb, dout, &g);
            assert_int_equal(rc, 0);
            din[way][mb] = malloc(in_floats * sizeof(float));
            memcpy(din[way][mb], g, in_floats * sizeof(float));
        }
        if (way) { /* nothing accumulated yet: the weight work waits */
            const float *g = tr_model_grads(m);
            for (size_t i = 0; i < n; i++)
                if (g[i] != 0) fail_msg("gradient %zu is %g after the input parts", i, g[i]);
            for (int mb = 0; mb < 2; mb++)
                assert_int_equal(tr_model_stage_backward_weight(st[way], mb), 0);
        }
        grads[way] = malloc(n * sizeof(float));
        memcpy(grads[way], tr_model_grads(m), n * sizeof(float));
    }
    for (int mb = 0; mb < 2; mb++)
        assert_memory_equal(din[0][mb], din[1][mb], in_floats * sizeof(float));
    assert_memory_equal(grads[0], grads[1], n * sizeof(float));
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++)
        nonzero += grads[1][i] != 0;
    assert_true(nonzero > 0);
    printf("split backward: layers %d to %d of %d: input and %zu parameter gradients bitwise "
           "the whole backward's\n",
           first, last, L, nonzero);
    for (int way = 0; way < 2; way++) {
        free(din[way][0]);
        free(din[way][1]);
        free(grads[way]);
        tr_model_stage_destroy(st[way]);
    }
    tr_model_stage_destroy(head);
    free(dout);
    tr_model_destroy(m);
    free(d);
}

static void test_split_backward_equals_whole(void **state)
{
    (void)state;
    split_equals_whole(gpt2, 0, 1, 3);
    split_equals_whole(gpt2_bf16, 0, 1, 3); /* each gradient rounded once or twice: same bits */
    split_equals_whole(mlp, 1, 2, 4);
}

/* A batch that fails (a token id past the vocabulary in micro-batch 2) names the stage and
 * layer, and leaves nothing behind: the tied gradients the head's stage kept apart are dropped,
 * so the next batch's gradients are the reference's; inference schedules are refused. */
static void test_failed_batch_leaves_nothing_behind(void **state)
{
    (void)state;
    data_t *d = calloc(1, sizeof(*d));
    make_data(d, 0, 60);
    tr_model_t *ref = gpt2(), *pip = gpt2();
    float want[NM], got[NM];
    reference(ref, d, want);
    int bounds[] = {0, 3, 6};
    char err[1024];
    tr_pipe_model_t *pm;
    tr_runtime_t *rt = rt_new();
    assert_int_equal(tr_pipe_model_create(&pm, rt, pip, bounds, 2, TR_PIPE_INFERENCE, NM, NB, NT, 0,
                                          NULL, err, sizeof(err)),
                     TR_EINVAL);
    assert_non_null(strstr(err, "training schedules"));
    if (tr_pipe_model_create(&pm, rt, pip, bounds, 2, TR_PIPE_TRAIN_1F1B, NM, NB, NT, 0, NULL, err,
                             sizeof(err)))
        fail_msg("%s", err);
    int saved = d->tokens[2][5];
    d->tokens[2][5] = 63; /* the embedding's table has 64 rows, the vocabulary 60 */
    tr_model_zero_grad(pip);
    int rc = tr_pipe_model_run(pm, d->b, got, 0, NULL, err, sizeof(err));
    printf("failed batch: %d: %s\n", rc, err);
    assert_true(rc < 0);
    assert_non_null(strstr(err, "stage 0 (layers 0 to 2)"));
    assert_non_null(strstr(err, "embed"));
    d->tokens[2][5] = saved;
    tr_batch_t bad[NM]; /* another shape: refused before any stage starts */
    memcpy(bad, d->b, sizeof(bad));
    bad[1].T = NT - 1;
    assert_int_equal(tr_pipe_model_run(pm, bad, got, 0, NULL, err, sizeof(err)), TR_EINVAL);
    printf("bad micro-batch: %s\n", err);
    assert_non_null(strstr(err, "micro-batch 1 has B"));
    tr_model_zero_grad(pip);
    if (tr_pipe_model_run(pm, d->b, got, 1, NULL, err, sizeof(err))) fail_msg("%s", err);
    rt_end(rt);
    assert_memory_equal(got, want, sizeof(want));
    size_t n = tr_model_num_params(ref);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        double a = tr_model_grads(ref)[i], g = tr_model_grads(pip)[i];
        diff += (a - g) * (a - g);
        norm += a * a;
    }
    printf("after the failed batch: relative L2 difference %.2g\n", sqrt(diff / norm));
    assert_true(sqrt(diff / norm) < 1e-6);
    tr_pipe_model_destroy(pm);
    tr_model_destroy(ref);
    tr_model_destroy(pip);
    free(d);
}

/* A stage checkpointed every layer holds fewer activations than without (and the compares
 * above show it computes the same numbers). */
static void test_stage_checkpointing_holds_less(void **state)
{
    (void)state;
    tr_model_t *m = gpt2();
    tr_model_stage_t *a, *b;
    char err[256];
    assert_int_equal(tr_model_stage_create(&a, m, 0, 3, 4, NB, NT, err, sizeof(err)), 0);
    tr_model_set_checkpoint_interval(m, 1);
    assert_int_equal(tr_model_stage_create(&b, m, 0, 3, 4, NB, NT, err, sizeof(err)), 0);
    printf("stage of 4 layers, 4 slots: %zu activation floats, %zu checkpointed every layer\n",
           tr_model_stage_activation_floats(a), tr_model_stage_activation_floats(b));
    assert_true(tr_model_stage_activation_floats(b) < tr_model_stage_activation_floats(a) / 2);
    tr_model_stage_destroy(a);
    tr_model_stage_destroy(b);
    tr_model_destroy(m);
}

static void test_partition_methods(void **state)
{
    (void)state;
    tr_model_t *m = gpt2(); /* embed, h0..h3, head: 6 layers */
    int b[8];
    char err[512];
    assert_int_equal(tr_pipe_partition(m, "uniform", 4, b, err, sizeof(err)), 0);
    int uni[] = {0, 2, 4, 5, 6};
    assert_memory_equal(b, uni, sizeof(uni));
    assert_int_equal(tr_pipe_partition(m, "parameters", 2, b, err, sizeof(err)), 0);
    size_t w[2] = {0, 0};
    for (int s = 0; s < 2; s++)
        for (int i = b[s]; i < b[s + 1]; i++)
            w[s] += tr_model_layer(m, i)->param_count;
    printf("parameters, 2 stages: bounds %d %d %d, weights %zu %zu\n", b[0], b[1], b[2], w[0],
           w[1]);
    assert_true(b[0] == 0 && b[1] > 0 && b[1] < 6 && b[2] == 6);
    /* no other single cut has a lighter heaviest stage */
    size_t best = w[0] > w[1] ? w[0] : w[1];
    for (int cut = 1; cut < 6; cut++) {
        size_t l = 0, r = 0;
        for (int i = 0; i < 6; i++)
            *(i < cut ? &l : &r) += tr_model_layer(m, i)->param_count;
        assert_true(best <= (l > r ? l : r));
    }
    assert_int_equal(tr_pipe_partition(m, "type:gpt2_block", 2, b, err, sizeof(err)), 0);
    int blocks[] = {0, 3, 6}; /* two blocks each; the embedding and head go with them */
    assert_memory_equal(b, blocks, sizeof(blocks));
    assert_int_equal(tr_pipe_partition(m, "type:(", 2, b, err, sizeof(err)), TR_EINVAL);
    assert_non_null(strstr(err, "not a regular expression"));
    assert_int_equal(tr_pipe_partition(m, "type:head", 2, b, err, sizeof(err)), TR_EINVAL);
    assert_non_null(strstr(err, "matches 1 layers, fewer than the 2 stages"));
    assert_int_equal(tr_pipe_partition(m, "profile", 2, b, err, sizeof(err)), TR_EINVAL);
    assert_non_null(strstr(err, "expected \"parameters\", \"uniform\" or \"type:REGEX\""));
    assert_int_equal(tr_pipe_partition(m, "uniform", 7, b, err, sizeof(err)), TR_EINVAL);
    int bad[] = {0, 3, 3, 6};
    tr_pipe_model_t *pm;
    assert_int_equal(tr_pipe_model_create(&pm, NULL, m, bad, 3, TR_PIPE_TRAIN_1F1B, 4, NB, NT, 0,
                                          NULL, err, sizeof(err)),
                     TR_EINVAL);
    assert_non_null(strstr(err, "stage 1 holds layers [3, 3): none"));
    tr_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_pipelined_equals_unpipelined),
        cmocka_unit_test(test_mlp_links_of_different_widths),
        cmocka_unit_test(test_split_backward_equals_whole),
        cmocka_unit_test(test_failed_batch_leaves_nothing_behind),
        cmocka_unit_test(test_stage_checkpointing_holds_less),
        cmocka_unit_test(test_partition_methods),
    };
    return cmocka_run_group_tests_name("pipe_model", tests, NULL, NULL);
}
