/* The memory prediction (tr_engine_memory_predict, actors/engine/memory_plan.c) against three
 * references: the shapes worked out from a GPT-2's or an MLP's dimensions against the layer
 * table of the model tr_model_*_create builds; every kind against its formula written out by
 * hand here (docs/engine.md's table) for stages 0-2 on 1 to 4 ranks, each rank's partition,
 * bf16, the 16-bit wire, NVMe swap buffers, activation checkpointing; and the engine's own
 * figures (tr_engine_memory) for the same configs. tr_engine_create refuses a configuration
 * predicted to exceed any machine, before it allocates, naming the knobs.
 *
 * Under mpirun (OMPI_COMM_WORLD_SIZE set) only the engine comparison runs, on the launcher's
 * ranks: ZeRO 1 and 2 partition there. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe.h"

#include "actors/engine/memory_plan.h"
#include "engine_testing.h"

static char tmpdir[256];

/* A config for `world` ranks from json; the test fails when it does not load. */
static tr_config_t *config_for(const char *json, int world)
{
    return test_config_world(json, "mem.json", world);
}

static tr_model_t *gpt2(const tr_gpt2_config_t *g)
{
    tr_model_t *m;
    char why[256];
    if (tr_model_gpt2_create(&m, g, why, sizeof(why))) fail_msg("gpt2: %s", why);
    return m;
}

static tr_model_t *mlp(const int *widths, int n)
{
    tr_model_t *m;
    char why[256];
    if (tr_model_mlp_create(&m, widths, n, why, sizeof(why))) fail_msg("mlp: %s", why);
    return m;
}

static void assert_same_shapes(const tr_memory_model_t *a, const tr_memory_model_t *b)
{
    assert_int_equal(a->n_layers, b->n_layers);
    assert_int_equal(a->x_dim, b->x_dim);
    assert_int_equal(a->y_dim, b->y_dim);
    for (int i = 0; i < a->n_layers; i++) {
        const tr_memory_layer_t *x = &a->layers[i], *y = &b->layers[i];
        if (x->params != y->params || x->tied != y->tied || x->acts != y->acts ||
            x->scratch != y->scratch || x->in_dim != y->in_dim || x->out_dim != y->out_dim)
            fail_msg("layer %d: params %zu/%zu tied %zu/%zu acts %zu/%zu scratch %zu/%zu dims "
                     "%d,%d/%d,%d",
                     i, x->params, y->params, x->tied, y->tied, x->acts, y->acts, x->scratch,
                     y->scratch, x->in_dim, x->out_dim, y->in_dim, y->out_dim);
    }
}

/* --- shapes without a model ------------------------------------------------------------- */

static void test_memory_plan_gpt2_shapes_are_the_models(void **state)
{
    (void)state;
    tr_gpt2_config_t gs[] = {
        {.max_seq_len = 8, .vocab_size = 50, .num_layers = 1, .num_heads = 2, .channels = 8},
        {.max_seq_len = 12, .vocab_size = 300, .num_layers = 3, .num_heads = 4, .channels = 16},
        {.max_seq_len = 5,
         .vocab_size = 128,
         .padded_vocab_size = 200,
         .num_layers = 2,
         .num_heads = 3,
         .channels = 12},
    };
    for (size_t k = 0; k < sizeof(gs) / sizeof(gs[0]); k++) {
        tr_model_t *model = gpt2(&gs[k]);
        int Bs[] = {1, 3}, Ts[] = {1, gs[k].max_seq_len};
        for (int b = 0; b < 2; b++)
            for (int t = 0; t < 2; t++) {
                tr_memory_model_t of, shapes;
                char why[256];
                assert_int_equal(tr_memory_model_of(&of, model, Bs[b], Ts[t]), 0);
                assert_int_equal(
                    tr_memory_model_gpt2(&shapes, &gs[k], Bs[b], Ts[t], why, sizeof(why)), 0);
                assert_same_shapes(&shapes, &of);
                tr_memory_model_close(&of);
                tr_memory_model_close(&shapes);
            }
        tr_model_destroy(model);
    }
    /* what tr_model_gpt2_create refuses, refused in its words */
    tr_memory_model_t m;
    char why[256];
    tr_gpt2_config_t bad = gs[0];
    bad.channels = 9;
    assert_int_equal(tr_memory_model_gpt2(&m, &bad, 1, 1, why, sizeof(why)), TR_EINVAL);
    assert_non_null(strstr(why, "channels 9 is not a multiple of num_heads 2"));
}

static void test_memory_plan_mlp_shapes_are_the_models(void **state)
{
    (void)state;
    int w1[] = {8, 16, 3}, w2[] = {5, 7, 9, 2};
    const int *ws[] = {w1, w2};
    int ns[] = {3, 4};
    for (int k = 0; k < 2; k++) {
        tr_model_t *model = mlp(ws[k], ns[k]);
        tr_memory_model_t of, shapes;
        char why[256];
        assert_int_equal(tr_memory_model_of(&of, model, 4, 1), 0);
        assert_int_equal(tr_memory_model_mlp(&shapes, ws[k], ns[k], 4, 1, why, sizeof(why)), 0);
        assert_same_shapes(&shapes, &of);
        tr_memory_model_close(&of);
        tr_memory_model_close(&shapes);
        tr_model_destroy(model);
    }
    tr_memory_model_t m;
    char why[256];
    assert_int_equal(tr_memory_model_mlp(&m, w1, 1, 4, 1, why, sizeof(why)), TR_EINVAL);
    assert_non_null(strstr(why, "need at least 2"));
}

/* --- every kind against its formula ----------------------------------------------------- */

#define MLP_N    (8 * 32 + 32 + 32 * 32 + 32 + 32 * 3 + 3) /* widths 8,32,32,3: 1443 */
#define MLP_LMAX (32 * 32 + 32)                            /* fc1 */

/* rank's ZeRO partition of n over world (docs/engine.md): slices of S = ceil(n / 2W) 2. */
static size_t owned(size_t n, int world, int rank)
{
    size_t S = (n + 2 * (size_t)world - 1) / (2 * (size_t)world) * 2;
    size_t lo = (size_t)rank * S, hi = lo + S;
    lo = lo < n ? lo : n;
    return (hi < n ? hi : n) - lo;
}

static void predict(const char *json, int world, int rank, const tr_memory_model_t *m,
                    tr_engine_memory_t *out, char *note, size_t note_len)
{
    tr_config_t *cfg = config_for(json, world);
    assert_int_equal(tr_engine_memory_predict(cfg, m, rank, 1, out, note, note_len), 0);
    tr_config_destroy(cfg);
}

static void test_memory_plan_kinds_follow_the_formulas(void **state)
{
    (void)state;
    int w[] = {8, 32, 32, 3};
    tr_memory_model_t m;
    char why[256], json[1024], note[512];
    assert_int_equal(tr_memory_model_mlp(&m, w, 4, 4, 1, why, sizeof(why)), 0);
    size_t N = MLP_N;
    for (int world = 1; world <= 4; world++)
        for (int stage = 0; stage <= 2; stage++)
            for (int rank = 0; rank < world; rank++) {
                snprintf(json, sizeof(json),
                         "{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": "
                         "\"AdamW\", \"params\": {\"lr\": 0.01}}, \"zero_optimization\": "
                         "{\"stage\": %d, \"reduce_bucket_size\": 100}}",
                         stage);
                tr_engine_memory_t e;
                predict(json, world, rank, &m, &e, note, sizeof(note));
                int zero = world > 1 ? stage : 0;
                size_t part = zero ? owned(N, world, rank) : N;
                size_t window = 100 + MLP_LMAX; /* one bucket in flight, the largest layer */
                assert_int_equal(e.params, 4 * N);
                assert_int_equal(e.grads, 4 * (zero == 2 ? window : N));
                /* MPI's copies of the gradients in flight: the window, or all of them */
                size_t held = zero == 2 ? window : N;
                assert_int_equal(e.comm, world > 1 ? 4 * held : 0); /* fp32: no wire copy */
                assert_int_equal(e.grad_partition, zero == 2 ? 4 * part : 0);
                assert_int_equal(e.optimizer, 2 * 4 * part);
                assert_int_equal(e.swap, 0);
                assert_int_equal(e.batches,
                                 (4 * 8 * 4 + 4 * 4) * 3); /* x, targets; 1 + prefetch 2 */
                assert_int_equal(e.bf16_copies, 0);
                assert_int_equal(note[0] != '\0', world == 1 && stage > 0);
            }
    /* overlap_comm: two buckets in flight; a bucket as large as the model: the whole */
    tr_engine_memory_t e;
    predict("{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"Adam\"},"
            " \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 100,"
            " \"overlap_comm\": true}}",
            2, 0, &m, &e, NULL, 0);
    assert_int_equal(e.grads, 4 * (2 * 100 + MLP_LMAX));
    predict("{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"Adam\"},"
            " \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 500,"
            " \"overlap_comm\": true}}",
            2, 0, &m, &e, NULL, 0);
    assert_int_equal(e.grads, 4 * N); /* 2 x 500 + 1056 > N */
    /* bf16: the weights' copies and the 16-bit wire across ranks; AMSGrad's third array */
    predict("{\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {\"enabled\": true},"
            " \"optimizer\": {\"type\": \"Adam\", \"params\": {\"amsgrad\": true}},"
            " \"zero_optimization\": {\"stage\": 1}}",
            3, 2, &m, &e, NULL, 0);
    assert_int_equal(e.bf16_copies, 2 * N);
    assert_int_equal(e.comm, 2 * N + 2 * N); /* the wire's copy; MPI's of all in flight */
    assert_int_equal(e.optimizer, 3 * 4 * owned(N, 3, 2));
    predict("{\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {\"enabled\": true},"
            " \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}}",
            1, 0, &m, &e, NULL, 0);
    assert_int_equal(e.comm, 0); /* one rank: no wire */
    assert_int_equal(e.optimizer, 4 * N);
    /* NVMe: buffer_count buffers of one sub-group's slot (the moments and a 64-byte trailer,
     * rounded up to 4096 x intra_op_parallelism); the moments in memory: none */
    predict(
        "{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"AdamW\"},"
        " \"zero_optimization\": {\"stage\": 1, \"sub_group_size\": 300,"
        " \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp\","
        " \"buffer_count\": 3, \"pipeline_read\": true}}, \"aio\": {\"intra_op_parallelism\": 2}}",
        2, 0, &m, &e, NULL, 0);
    assert_int_equal(e.optimizer, 0);
    assert_int_equal(e.swap, 3 * 8192); /* 2 x 300 x 4 + 64 = 2464 bytes -> 8192 */
    predict("{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"AdamW\"},"
            " \"zero_optimization\": {\"stage\": 0, \"sub_group_size\": 100000,"
            " \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp\"}}}",
            1, 0, &m, &e, NULL, 0);
    assert_int_equal(e.swap, (2 * N * 4 + 64 + 4095) / 4096 * 4096); /* one buffer, one group */
    /* stage 3: the slice, the persistent layers (none here: threshold 0) and the fetcher's
     * window (max_live_parameters and the largest layer); offload_param cpu: the slice in its
     * own host buffer, the same bytes, said */
    predict("{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"AdamW\"},"
            " \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": 100,"
            " \"stage3_param_persistence_threshold\": 0, \"stage3_max_live_parameters\": 10,"
            " \"overlap_comm\": false, \"offload_param\": {\"device\": \"cpu\"}}}",
            2, 1, &m, &e, note, sizeof(note));
    assert_non_null(strstr(note, "offload_param cpu: the partition lives in its own host buffer"));
    size_t slice = (N + 3) / 4 * 4 / 2, held = slice + 10 + MLP_LMAX;
    assert_int_equal(e.params, 4 * (held < N ? held : N));
    assert_int_equal(e.grads, 4 * (100 + MLP_LMAX));
    assert_int_equal(e.grad_partition, 4 * owned(N, 2, 1));
    assert_int_equal(e.swap, 0);
    /* offload_param nvme (with the optimizer's state): the slice is on disk; the swap buffer
     * holds a sub-group's moments and parameters, and the swapper caches buffer_count (3) of at
     * most buffer_size (50) parameters, max_in_cpu (100) elements of them: 2 */
    predict("{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"AdamW\"},"
            " \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": 100,"
            " \"stage3_param_persistence_threshold\": 0, \"stage3_max_live_parameters\": 10,"
            " \"overlap_comm\": false, \"sub_group_size\": 1000,"
            " \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp\"},"
            " \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp\","
            " \"buffer_count\": 3, \"buffer_size\": 50, \"max_in_cpu\": 100}}}",
            2, 1, &m, &e, note, sizeof(note));
    held = 10 + MLP_LMAX;
    assert_int_equal(e.params, 4 * (held < N ? held : N));
    assert_int_equal(e.optimizer, 0);
    /* one micro-step: the reduced partition is swapped too (a gradient region in the buffer,
     * 4 sub-groups filling); each slot (2 x 50 x 4 + 64, 50 x 4 + 64) fits a page */
    assert_int_equal(e.grad_partition, 0);
    assert_int_equal(e.swap, (3 + 2 + 4) * 4096);
    tr_memory_model_close(&m);
}

/* GPT-2: the tied wte in the stage-2 window, and the activations of model.c's layout with and
 * without checkpointing (each checked against tr_model_acts_floats and the layers' own scratch
 * and widths, and what a forward lays out). */
static void test_memory_plan_gpt2_window_and_activations(void **state)
{
    (void)state;
    tr_gpt2_config_t g = {
        .max_seq_len = 8, .vocab_size = 50, .num_layers = 4, .num_heads = 2, .channels = 8};
    tr_model_t *model = gpt2(&g);
    int B = 2, T = 8, n = tr_model_num_layers(model);
    tr_memory_model_t m;
    assert_int_equal(tr_memory_model_of(&m, model, B, T), 0);
    size_t N = tr_model_num_params(model), wte = 128 * 8, embed = wte + 8 * 8;
    char json[512];
    tr_engine_memory_t e;
    predict("{\"train_micro_batch_size_per_gpu\": 2, \"optimizer\": {\"type\": \"AdamW\"},"
            " \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 100,"
            " \"overlap_comm\": true}}",
            2, 0, &m, &e, NULL, 0);
    assert_int_equal(e.grads, 4 * (2 * 100 + embed + wte)); /* Lmax: the embedding; Tt: wte */
    predict("{\"train_micro_batch_size_per_gpu\": 2, \"optimizer\": {\"type\": \"AdamW\"},"
            " \"zero_optimization\": {\"stage\": 2}}",
            2, 0, &m, &e, NULL, 0);
    assert_int_equal(e.grads, 4 * (N + wte)); /* the window is the whole; the tied on top */
    size_t scratch = 1, dbuf = 1, NT = (size_t)B * T;
    for (int i = 0; i < n; i++) {
        const tr_layer_t *l = tr_model_layer(model, i);
        size_t s = l->ops->scratch_size ? l->ops->scratch_size(l, B, T) : 0;
        size_t d = NT * (size_t)(l->in_dim > l->out_dim ? l->in_dim : l->out_dim);
        scratch = s > scratch ? s : scratch;
        dbuf = d > dbuf ? d : dbuf;
    }
    size_t batch = NT * 4; /* tokens, targets, x (1 per position), y (1) */
    int tokens[16], targets[16];
    for (int i = 0; i < 16; i++)
        tokens[i] = targets[i] = (i * 7) % 50;
    tr_batch_t b = {.B = B, .T = T, .tokens = tokens, .targets = targets};
    int ks[] = {0, 1, 2, 3, 5, 6, 7}; /* 6 layers: 6 and 7 are one group, i.e. off */
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++) {
        snprintf(json, sizeof(json),
                 "{\"train_micro_batch_size_per_gpu\": 2, \"optimizer\": {\"type\": \"AdamW\"},"
                 " \"pipeline\": {\"activation_checkpoint_interval\": %d}}",
                 ks[i]);
        predict(json, 1, 0, &m, &e, NULL, 0);
        tr_model_set_checkpoint_interval(model, ks[i] < n ? ks[i] : n);
        size_t kept = tr_model_acts_floats(model, B, T);
        assert_int_equal(e.activations, 4 * (kept + scratch + 2 * dbuf + batch));
        assert_int_equal(tr_model_forward(model, &b, NULL), 0);
        assert_int_equal(tr_model_num_acts(model), kept); /* what a forward lays out */
    }
    assert_int_equal(e.params, 4 * N);
    tr_memory_model_close(&m);
    tr_model_destroy(model);
}

/* --- against the engine ----------------------------------------------------------------- */

static int token_batch(void *user, uint64_t index, int B, int T, int *tokens, float *x,
                       int *targets, float *y)
{
    (void)user;
    (void)x;
    (void)y;
    for (int i = 0; i < B * T; i++) {
        tokens[i] = (int)((index * 13 + (uint64_t)i * 7) % 50);
        targets[i] = (int)((index * 5 + (uint64_t)i * 3) % 50);
    }
    return 0;
}

/* An engine for json on `world` ranks (0: the launcher's), its model an MLP or (gpt2) a tiny
 * GPT-2; its tr_engine_memory against the prediction for its rank, kind by kind. */
static void check_engine(const char *json, int world, int use_gpt2)
{
    tr_config_t *cfg = config_for(json, world);
    tr_gpt2_config_t g = {
        .max_seq_len = 8, .vocab_size = 50, .num_layers = 2, .num_heads = 2, .channels = 8};
    int widths[] = {TEST_XD, 16, TEST_CLASSES};
    tr_model_t *model = use_gpt2 ? gpt2(&g) : mlp(widths, 3);
    tr_engine_opts_t o = {.config = cfg,
                          .model = model,
                          .seq_len = use_gpt2 ? 8 : 1,
                          .seed = 3,
                          .init_params = 1,
                          .world = world};
    if (use_gpt2)
        o.train = (tr_dataset_t){.batch = token_batch};
    else
        o.train = (tr_dataset_t){.batch = test_mlp_batch, .x_dim = TEST_XD};
    tr_engine_t *eng;
    char err[1024];
    if (tr_engine_create(&eng, &o, err, sizeof(err))) fail_msg("engine: %s", err);
    assert_int_equal(tr_engine_train_batch(eng, NULL), 0); /* the activations laid out */
    tr_memory_model_t m;
    tr_engine_memory_t have, want;
    const tr_model_t *em = tr_engine_model(eng);
    assert_int_equal(
        tr_memory_model_of(&m, em, (int)cfg->train_micro_batch_size_per_gpu, o.seq_len), 0);
    assert_int_equal(tr_engine_memory_predict(cfg, &m, tr_engine_rank(eng), 1, &want, NULL, 0), 0);
    tr_engine_memory(eng, &have);
    if (memcmp(&have, &want, sizeof(have))) {
        char a[512], b[512];
        tr_engine_memory_format(&have, a, sizeof(a));
        tr_engine_memory_format(&want, b, sizeof(b));
        fail_msg("%s on rank %d: the engine holds %s; predicted %s", json, tr_engine_rank(eng), a,
                 b);
    }
    /* the kept activations are what the model laid out in the step */
    int B = (int)cfg->train_micro_batch_size_per_gpu;
    assert_true(have.activations >= 4 * tr_model_num_acts(em));
    assert_int_equal(tr_model_num_acts(em), tr_model_acts_floats(em, B, o.seq_len));
    tr_memory_model_close(&m);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

static void test_memory_plan_is_the_engines(void **state)
{
    (void)state;
    char json[1024];
    const char *cases[] = {
        "\"optimizer\": {\"type\": \"AdamW\"}",
        "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"amsgrad\": true}},"
        " \"bf16\": {\"enabled\": true}",
        "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}},"
        " \"troupe\": {\"data\": {\"prefetch\": 5}}",
        "\"optimizer\": {\"type\": \"AdamW\"}, \"pipeline\": {\"activation_checkpoint_interval\": "
        "1}",
    };
    for (int gpt = 0; gpt <= 1; gpt++)
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            snprintf(json, sizeof(json), "{\"train_micro_batch_size_per_gpu\": 2, %s}", cases[i]);
            check_engine(json, 1, gpt);
        }
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 2, \"optimizer\": {\"type\": \"AdamW\"},"
             " \"zero_optimization\": {\"sub_group_size\": 40, \"offload_optimizer\":"
             " {\"device\": \"nvme\", \"nvme_path\": \"%s\", \"buffer_count\": 3,"
             " \"pipeline_read\": true}}}",
             tmpdir);
    check_engine(json, 1, 0);
}

/* Stages 0-2 on the launcher's ranks, the stage-2 window smaller than the gradient and not,
 * the 16-bit wire (bf16) and not; a tiny GPT-2 (tied wte) under bf16, the MLP otherwise. */
static void test_memory_plan_is_the_engines_on_ranks(void **state)
{
    (void)state;
    char json[1024];
    for (int stage = 0; stage <= 2; stage++)
        for (int bf16 = 0; bf16 <= 1; bf16++)
            for (int big = 0; big <= 1; big++) {
                snprintf(json, sizeof(json),
                         "{\"train_micro_batch_size_per_gpu\": 2, \"optimizer\": {\"type\":"
                         " \"AdamW\"}, \"bf16\": {\"enabled\": %s}, \"zero_optimization\":"
                         " {\"stage\": %d, \"reduce_bucket_size\": %d, \"overlap_comm\": true}}",
                         bf16 ? "true" : "false", stage, big ? 1000000 : 60);
                check_engine(json, 0, bf16);
            }
}

/* --- the refusal ------------------------------------------------------------------------ */

/* The process's peak resident memory (VmHWM): an allocation that was touched and freed again
 * still shows. */
static size_t peak_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kib = 0;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmHWM:", 6)) sscanf(line + 6, "%zu", &kib);
    if (f) fclose(f);
    return kib;
}

static void test_memory_plan_refuses_what_no_machine_has(void **state)
{
    (void)state;
    /* micro-batches of 2^31 - 1 rows of a 4096-wide MLP: petabytes of activations */
    const char *json = "{\"train_micro_batch_size_per_gpu\": 2147483647,"
                       " \"optimizer\": {\"type\": \"AdamW\"}}";
    tr_config_t *cfg = config_for(json, 1);
    int widths[] = {4096, 4096, 2};
    tr_model_t *model = mlp(widths, 3);
    size_t before = peak_kib();
    tr_engine_opts_t o = {.config = cfg,
                          .model = model,
                          .seq_len = 1,
                          .init_params = 1,
                          .world = 1,
                          .train = {.batch = test_mlp_batch, .x_dim = 4096}};
    tr_engine_t *eng = NULL;
    char err[2048];
    assert_int_equal(tr_engine_create(&eng, &o, err, sizeof(err)), TR_ECONFIG);
    assert_null(eng);
    printf("refused: %s\n", err);
    assert_non_null(strstr(err, "mem.json: this configuration needs"));
    assert_non_null(strstr(err, "activations"));
    assert_non_null(strstr(err, "more than this machine has"));
    assert_non_null(strstr(err, "zero_optimization"));
    assert_non_null(strstr(err, "offload_optimizer"));
    assert_non_null(strstr(err, "train_micro_batch_size_per_gpu "));
    assert_non_null(strstr(err, "or less, with gradient_accumulation_steps raised"));
    assert_non_null(strstr(err, "troupe.memory_check false"));
    assert_non_null(strstr(tr_last_error(), "this configuration needs"));
    /* the parameters were never written (init_params would touch their 64 MiB; the test runs
     * first, so the peak so far is small): the refusal came before */
    assert_true(peak_kib() < before + 32 * 1024);
    tr_config_destroy(cfg);

    /* troupe.memory_check false: the check says nothing */
    cfg =
        config_for("{\"train_micro_batch_size_per_gpu\": 2147483647,"
                   " \"optimizer\": {\"type\": \"AdamW\"}, \"troupe\": {\"memory_check\": false}}",
                   1);
    model = mlp(widths, 3);
    assert_int_equal(tr__memory_check(cfg, model, 2147483647, 1, 0, 1, err, sizeof(err)), 0);
    tr_model_destroy(model);
    tr_config_destroy(cfg);
}

/* A configuration that fits is never refused, and the machine says what it has. */
static void test_memory_plan_machine(void **state)
{
    (void)state;
    uint64_t avail;
    char where[96];
    assert_int_equal(tr_engine_memory_available(&avail, where, sizeof(where)), 0);
    assert_true(avail > 0);
    assert_true(strstr(where, "MemAvailable") || strstr(where, "cgroup"));
}

int main(void)
{
    if (getenv("OMPI_COMM_WORLD_SIZE")) {
        const struct CMUnitTest mpi[] = {
            cmocka_unit_test(test_memory_plan_is_the_engines_on_ranks)};
        return cmocka_run_group_tests(mpi, NULL, NULL);
    }
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/troupe_mem_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_plan_refuses_what_no_machine_has), /* first: VmHWM */
        cmocka_unit_test(test_memory_plan_gpt2_shapes_are_the_models),
        cmocka_unit_test(test_memory_plan_mlp_shapes_are_the_models),
        cmocka_unit_test(test_memory_plan_kinds_follow_the_formulas),
        cmocka_unit_test(test_memory_plan_gpt2_window_and_activations),
        cmocka_unit_test(test_memory_plan_is_the_engines),
        cmocka_unit_test(test_memory_plan_machine),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
    return rc;
}
