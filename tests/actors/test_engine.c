/* The training engine through its public API: loss falls; GAS=4 x MB=2 equals GAS=1 x MB=8;
 * the DeepSpeed-style loop equals train_batch; resume is bit-exact in a new process; damaged
 * checkpoints are refused while the previous tag still loads; a failing layer stops training
 * with a message naming it; the loader never runs more than `prefetch` batches ahead; a GPT-2
 * trains on llm.c token shards. */
#include <math.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe.h"

#include "engine_testing.h"

#define XD      16 /* inputs */
#define CLASSES 4

extern char **environ;
static const char *self_path;
static char tmpdir[256];

/* --- a synthetic classification task, deterministic per batch index -------------------- */

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

typedef struct task {
    _Atomic uint64_t asked; /* batches the loader asked for (written on its thread) */
    int fail_at;            /* return an error for this batch index (-1: never) */
} task_t;

/* Sample s of the whole stream: x uniform in [-1, 1), class = argmax of a fixed projection. */
static void sample(uint64_t s, float *x, int *target)
{
    float best = -1e30f;
    for (int i = 0; i < XD; i++)
        x[i] = (float)(mix(s * XD + (uint64_t)i + 1) >> 11) / (float)(1ull << 53) * 2.0f - 1.0f;
    for (int c = 0; c < CLASSES; c++) {
        float v = 0;
        for (int i = 0; i < XD; i++)
            v += x[i] * (float)((int)((i * 7 + c * 3) % 5) - 2);
        if (v > best) {
            best = v;
            *target = c;
        }
    }
}

static int batch_cb(void *user, uint64_t index, int B, int T, int *tokens, float *x, int *targets,
                    float *y)
{
    task_t *t = user;
    t->asked++;
    if ((int64_t)index == t->fail_at) return TR_EIO;
    for (int b = 0; b < B * T; b++) /* B rows of batch `index` = samples index*B + b */
        sample(index * (uint64_t)B + (uint64_t)b, x + (size_t)b * XD, &targets[b]);
    return 0;
}

static tr_config_t *config(int mb, int gas, const char *extra)
{
    char json[1024];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, "
             "\"weight_decay\": 0.01}}, \"gradient_clipping\": 1.0,"
             " \"zero_optimization\": {\"reduce_bucket_size\": 100},"
             " \"troupe\": {\"data\": {\"prefetch\": 2}, \"runtime\": {\"workers\": 2}}%s}",
             mb, gas, extra ? extra : "");
    return test_config(json, "test.json");
}

static tr_engine_t *mlp_engine(tr_config_t *cfg, task_t *task)
{
    int widths[] = {XD, 32, CLASSES};
    tr_model_t *model;
    char why[256];
    assert_int_equal(tr_model_mlp_create(&model, widths, 3, why, sizeof(why)), 0);
    tr_engine_opts_t o = {.config = cfg,
                          .model = model,
                          .seq_len = 1,
                          .seed = 42,
                          .init_params = 1,
                          .train = {.batch = batch_cb, .user = task, .x_dim = XD}};
    tr_engine_t *eng;
    char err[512];
    int rc = tr_engine_create(&eng, &o, err, sizeof(err));
    if (rc) fprintf(stderr, "engine: %s\n", err);
    assert_int_equal(rc, 0);
    return eng;
}

static void test_engine_mlp_loss_falls(void **state)
{
    tr_config_t *cfg = config(8, 1, NULL);
    task_t task = {0, -1};
    tr_engine_t *eng = mlp_engine(cfg, &task);
    tr_step_stats_t st, first = {0};
    for (int i = 0; i < 300; i++) {
        assert_int_equal(tr_engine_train_batch(eng, &st), 0);
        if (i == 0) first = st;
        /* the loader is never more than `prefetch` batches ahead of the steps taken */
        assert_true(task.asked <= st.global_step + 2);
    }
    printf("mlp: loss %.4f -> %.4f after %llu steps (lr %.4g, grad norm %.3f)\n", first.loss,
           st.loss, (unsigned long long)st.global_step, st.lr, st.grad_norm);
    assert_int_equal(st.global_step, 300);
    assert_int_equal(st.global_samples, 300 * 8);
    assert_true(st.loss < 0.5f * first.loss);
    float val;
    assert_int_equal(tr_engine_eval(eng, 4, &val), 0);
    assert_true(val < 0.6f * first.loss);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

static void train_params(int mb, int gas, int steps, float *out, size_t n)
{
    tr_config_t *cfg = config(mb, gas, NULL);
    task_t task = {0, -1};
    tr_engine_t *eng = mlp_engine(cfg, &task);
    for (int i = 0; i < steps; i++)
        assert_int_equal(tr_engine_train_batch(eng, NULL), 0);
    memcpy(out, tr_model_params(tr_engine_model(eng)), n * sizeof(float));
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

static void test_engine_accumulation_equals_large_batch(void **state)
{
    /* the same 8 samples per step: 4 micro-batches of 2, or one of 8 */
    size_t n = XD * 32 + 32 + 32 * CLASSES + CLASSES;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    train_params(2, 4, 20, a, n);
    train_params(8, 1, 20, b, n);
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)a[i] - b[i]) / (fabs((double)b[i]) + 1e-3));
    printf("gas: largest relative difference %.3g after 20 steps\n", worst);
    /* summation order differs (4 partial sums of 2 vs one of 8): float rounding only */
    assert_true(worst < 1e-4);
    free(a);
    free(b);
}

static void test_engine_deepspeed_style_equals_train_batch(void **state)
{
    size_t n = XD * 32 + 32 + 32 * CLASSES + CLASSES;
    float *a = malloc(n * sizeof(float));
    train_params(2, 2, 10, a, n);
    tr_config_t *cfg = config(2, 2, NULL);
    task_t task = {0, -1};
    int widths[] = {XD, 32, CLASSES};
    tr_model_t *model;
    assert_int_equal(tr_model_mlp_create(&model, widths, 3, NULL, 0), 0);
    tr_engine_opts_t o = {.config = cfg,
                          .model = model,
                          .seq_len = 1,
                          .seed = 42,
                          .init_params = 1,
                          .train = {.x_dim = XD}};
    tr_engine_t *eng;
    assert_int_equal(tr_engine_create(&eng, &o, NULL, 0), 0);
    float x[2 * XD];
    int targets[2];
    uint64_t index = 0;
    for (int s = 0; s < 10; s++) {
        for (int m = 0; m < 2; m++) {
            batch_cb(&task, index++, 2, 1, NULL, x, targets, NULL);
            tr_engine_batch_t b = {.x = x, .targets = targets};
            float loss;
            assert_int_equal(tr_engine_forward(eng, &b, &loss), 0);
            assert_int_equal(tr_engine_is_boundary(eng), m == 1);
            assert_int_equal(tr_engine_backward(eng), 0);
            tr_step_stats_t st = {0};
            assert_int_equal(tr_engine_step(eng, &st), 0);
            assert_int_equal(st.global_step, m == 1 ? (uint64_t)s + 1 : 0);
        }
    }
    assert_memory_equal(tr_model_params(tr_engine_model(eng)), a, n * sizeof(float));
    assert_int_equal(tr_engine_backward(eng), TR_EINVAL); /* no forward to go back through */
    assert_non_null(strstr(tr_engine_error(eng), "no forward"));
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    free(a);
}

/* --- resume: 20 straight vs 10 + save + a new process that loads and runs 10 ----------- */

static void run_steps(tr_engine_t *eng, int steps, float *losses)
{
    for (int i = 0; i < steps; i++) {
        tr_step_stats_t st;
        assert_int_equal(tr_engine_train_batch(eng, &st), 0);
        losses[i] = st.loss;
    }
}

static void write_result(const char *path, tr_engine_t *eng, const float *losses, int n)
{
    FILE *f = fopen(path, "wb");
    const tr_model_t *m = tr_engine_model(eng);
    fwrite(losses, sizeof(float), (size_t)n, f);
    fwrite(tr_model_params(m), sizeof(float), tr_model_num_params(m), f);
    fclose(f);
}

static int resume_child(const char *dir, const char *out)
{
    tr_config_t *cfg = config(4, 2, NULL);
    task_t task = {0, -1};
    tr_engine_t *eng = mlp_engine(cfg, &task);
    if (tr_engine_load_checkpoint(eng, dir, NULL) != 0) {
        fprintf(stderr, "child: %s\n", tr_engine_error(eng));
        return 1;
    }
    float losses[10];
    run_steps(eng, 10, losses);
    write_result(out, eng, losses, 10);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    return 0;
}

static void test_engine_resume_is_bit_exact(void **state)
{
    char dir[300], out[300];
    snprintf(dir, sizeof(dir), "%s/ckpt", tmpdir);
    snprintf(out, sizeof(out), "%s/child.bin", tmpdir);
    tr_config_t *cfg = config(4, 2, NULL);
    task_t task = {0, -1};
    tr_engine_t *eng = mlp_engine(cfg, &task);
    float straight[20], half[10];
    run_steps(eng, 20, straight);
    size_t n = tr_model_num_params(tr_engine_model(eng));
    float *expect = malloc(n * sizeof(float));
    memcpy(expect, tr_model_params(tr_engine_model(eng)), n * sizeof(float));
    tr_engine_destroy(eng);

    atomic_store(&task.asked, 0);
    task.fail_at = -1;
    eng = mlp_engine(cfg, &task);
    run_steps(eng, 10, half);
    for (int i = 0; i < 10; i++)
        printf("resume: step %d: straight %.9g, again %.9g\n", i + 1, straight[i], half[i]);
    assert_memory_equal(half, straight, sizeof(half));
    assert_int_equal(tr_engine_save_checkpoint(eng, dir, NULL), 0);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);

    char *argv[] = {(char *)self_path, "resume-child", dir, out, NULL};
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, self_path, NULL, NULL, argv, environ), 0);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    FILE *f = fopen(out, "rb");
    float got[10];
    float *params = malloc(n * sizeof(float));
    assert_int_equal(fread(got, sizeof(float), 10, f), 10);
    assert_int_equal(fread(params, sizeof(float), n, f), n);
    fclose(f);
    assert_memory_equal(got, straight + 10, sizeof(got));   /* every loss, bitwise */
    assert_memory_equal(params, expect, n * sizeof(float)); /* every parameter, bitwise */
    free(params);
    free(expect);
}

/* --- background saves ------------------------------------------------------------------ */

static unsigned char *slurp(const char *path, long *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *m = malloc((size_t)*len + 1);
    assert_int_equal(fread(m, 1, (size_t)*len, f), (size_t)*len);
    fclose(f);
    return m;
}

static void same_file(const char *dir, const char *tag_a, const char *tag_b, const char *name)
{
    char a[600], b[600];
    snprintf(a, sizeof(a), "%s/%s/%s", dir, tag_a, name);
    snprintf(b, sizeof(b), "%s/%s/%s", dir, tag_b, name);
    long la, lb;
    unsigned char *fa = slurp(a, &la), *fb = slurp(b, &lb);
    printf("background save: %s: %ld bytes, blocking %ld\n", name, la, lb);
    assert_int_equal(la, lb);
    assert_memory_equal(fa, fb, (size_t)la);
    free(fa);
    free(fb);
}

/* A save written in the background while 5 more steps train writes the same bytes as the same
 * save waited for at once (two engines with one seed); latest names it only after the wait;
 * and a second save waits for the first. */
static void test_engine_background_save_is_the_blocking_bytes(void **state)
{
    char dir[300], latest[400];
    snprintf(dir, sizeof(dir), "%s/bg", tmpdir);
    snprintf(latest, sizeof(latest), "%s/latest", dir);
    tr_config_t *cfg = config(8, 1, NULL);
    task_t task = {0, -1};
    tr_engine_t *eng = mlp_engine(cfg, &task);
    run_steps(eng, 3, (float[3]){0});
    assert_int_equal(tr_engine_save_checkpoint(eng, dir, "blocking"), 0);
    assert_int_equal(tr_engine_wait_checkpoint(eng), 0);
    tr_engine_destroy(eng);

    atomic_store(&task.asked, 0);
    eng = mlp_engine(cfg, &task);
    run_steps(eng, 3, (float[3]){0});
    char gate[400];
    snprintf(gate, sizeof(gate), "%s/bg_gate", tmpdir);
    setenv("TROUPE_TEST_CKPT_WRITE_GATE", gate, 1); /* the write waits for the gate file */
    assert_int_equal(tr_engine_save_checkpoint(eng, dir, "background"), 0);
    run_steps(eng, 5, (float[5]){0}); /* the parameters move on before the files are written */
    char tag[64] = "";
    FILE *f = fopen(latest, "r");
    assert_non_null(f);
    assert_non_null(fgets(tag, sizeof(tag), f));
    fclose(f);
    assert_string_equal(tag, "blocking"); /* latest moves only once the files are durable */
    FILE *g = fopen(gate, "w");           /* now the write may start */
    assert_non_null(g);
    fclose(g);
    assert_int_equal(tr_engine_wait_checkpoint(eng), 0);
    unsetenv("TROUPE_TEST_CKPT_WRITE_GATE"); /* no write reads it now */
    f = fopen(latest, "r");
    assert_non_null(f);
    assert_non_null(fgets(tag, sizeof(tag), f));
    fclose(f);
    assert_string_equal(tag, "background");
    same_file(dir, "background", "blocking", "model_states.trck");
    same_file(dir, "background", "blocking", "optim_states_rank0.trck");
    /* two saves in a row: the second waits for the first; both are whole */
    assert_int_equal(tr_engine_save_checkpoint(eng, dir, "first"), 0);
    assert_int_equal(tr_engine_save_checkpoint(eng, dir, "second"), 0);
    assert_int_equal(tr_engine_wait_checkpoint(eng), 0);
    same_file(dir, "first", "second", "model_states.trck");
    assert_int_equal(tr_engine_load_checkpoint(eng, dir, "first"), 0);
    assert_int_equal(tr_engine_global_step(eng), 8);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

/* --- damaged checkpoints ---------------------------------------------------------------- */

static void damage(const char *path, long at, int truncate_it)
{
    if (truncate_it) {
        assert_int_equal(truncate(path, at), 0);
        return;
    }
    FILE *f = fopen(path, "r+b");
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
}

static void test_engine_damaged_checkpoint_is_refused(void **state)
{
    char dir[300], path[400];
    snprintf(dir, sizeof(dir), "%s/damaged", tmpdir);
    tr_config_t *cfg = config(8, 1, NULL);
    task_t task = {0, -1};
    tr_engine_t *eng = mlp_engine(cfg, &task);
    run_steps(eng, 3, (float[3]){0});
    assert_int_equal(tr_engine_save_checkpoint(eng, dir, "good"), 0);
    run_steps(eng, 2, (float[2]){0});
    assert_int_equal(tr_engine_save_checkpoint(eng, dir, "bad"), 0);
    assert_int_equal(tr_engine_wait_checkpoint(eng), 0); /* written in the background */
    snprintf(path, sizeof(path), "%s/bad/model_states.trck", dir);
    damage(path, 100, 1);
    assert_int_equal(tr_engine_load_checkpoint(eng, dir, NULL), TR_EFORMAT);
    assert_non_null(strstr(tr_engine_error(eng), "model_states.trck"));
    snprintf(path, sizeof(path), "%s/bad/optim_states_rank0.trck", dir);
    assert_int_equal(tr_engine_save_checkpoint(eng, dir, "bad"), 0);
    assert_int_equal(tr_engine_wait_checkpoint(eng), 0);
    damage(path, 300, 0);
    assert_int_equal(tr_engine_load_checkpoint(eng, dir, "bad"), TR_ECHECKSUM);
    assert_int_equal(tr_engine_load_checkpoint(eng, dir, "good"), 0); /* the previous tag */
    tr_step_stats_t st;
    assert_int_equal(tr_engine_train_batch(eng, &st), 0);
    assert_int_equal(st.global_step, 4);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);

    /* another model: refused, with what differs */
    cfg = config(8, 1, NULL);
    int widths[] = {XD, 16, CLASSES};
    tr_model_t *model;
    assert_int_equal(tr_model_mlp_create(&model, widths, 3, NULL, 0), 0);
    tr_engine_opts_t o = {.config = cfg,
                          .model = model,
                          .seq_len = 1,
                          .init_params = 1,
                          .train = {.batch = batch_cb, .user = &task, .x_dim = XD}};
    assert_int_equal(tr_engine_create(&eng, &o, NULL, 0), 0);
    assert_int_equal(tr_engine_load_checkpoint(eng, dir, "good"), TR_EMISMATCH);
    /* the model's description names the first field that differs, and both values */
    assert_non_null(
        strstr(tr_engine_error(eng), "good/model_states.trck: layer 0 ('fc0') out_dim"));
    assert_non_null(strstr(tr_engine_error(eng), ", this model has 16"));
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

/* --- failures stop training with a clear message ---------------------------------------- */

static int failing_forward(tr_layer_t *l, tr_layer_ctx_t *c)
{
    return TR_ERANGE;
}

static void test_engine_failing_layer_names_itself(void **state)
{
    tr_config_t *cfg = config(8, 1, NULL);
    task_t task = {0, -1};
    tr_engine_t *eng = mlp_engine(cfg, &task);
    run_steps(eng, 2, (float[2]){0});
    tr_layer_t *l = tr_model_layer(tr_engine_model(eng), 1);
    static tr_layer_ops_t broken;
    broken = *l->ops;
    broken.forward = failing_forward;
    l->ops = &broken;
    assert_int_equal(tr_engine_train_batch(eng, NULL), TR_ERANGE);
    const char *why = tr_engine_error(eng);
    printf("failure: %s\n", why);
    assert_non_null(strstr(why, l->name));
    assert_non_null(strstr(why, "step 2"));
    tr_engine_destroy(eng);

    atomic_store(&task.asked, 0);
    task.fail_at = 5; /* the data source fails on batch 5 */
    eng = mlp_engine(cfg, &task);
    int rc = 0;
    for (int i = 0; i < 10 && rc == 0; i++)
        rc = tr_engine_train_batch(eng, NULL);
    assert_int_equal(rc, TR_EIO);
    assert_non_null(strstr(tr_engine_error(eng), "batch 5"));
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

/* --- GPT-2 on llm.c token shards ------------------------------------------------------- */

static void test_engine_gpt2_trains_on_token_shards(void **state)
{
    char pattern[300], path[300];
    uint16_t *tok = malloc(20000 * sizeof(uint16_t));
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < 20000; i++) /* a repeating phrase with noise: learnable */
            tok[i] = (uint16_t)((i % 17) * 3 % 64 ^ (mix((uint64_t)i) % 7 == 0));
        snprintf(path, sizeof(path), "%s/train_%d.bin", tmpdir, s);
        assert_int_equal(tr_llmc_tokens_save(path, tok, 20000, NULL, 0), 0);
    }
    free(tok);
    snprintf(pattern, sizeof(pattern), "%s/train_*.bin", tmpdir);
    tr_gpt2_config_t g = {
        .max_seq_len = 32, .vocab_size = 64, .num_layers = 2, .num_heads = 2, .channels = 32};
    tr_model_t *model;
    assert_int_equal(tr_model_gpt2_create(&model, &g, NULL, 0), 0);
    tr_config_t *cfg = config(4, 1, NULL);
    tr_engine_opts_t o = {.config = cfg,
                          .model = model,
                          .seq_len = 32,
                          .init_params = 1,
                          .train = {.shards = pattern}};
    tr_engine_t *eng;
    char err[512];
    assert_int_equal(tr_engine_create(&eng, &o, err, sizeof(err)), 0);
    tr_step_stats_t st, first = {0};
    for (int i = 0; i < 60; i++) {
        assert_int_equal(tr_engine_train_batch(eng, &st), 0);
        if (i == 0) first = st;
    }
    printf("gpt2: loss %.3f -> %.3f (ln 64 = %.3f)\n", first.loss, st.loss, log(64.0));
    assert_true(first.loss > 3.5f);
    assert_true(st.loss < 0.6f * first.loss);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);

    /* a shard that is not one: the error names the file and the field */
    snprintf(path, sizeof(path), "%s/bad.bin", tmpdir);
    FILE *f = fopen(path, "wb");
    fputs("not a shard, but long enough to have a header?", f);
    fclose(f);
    assert_int_equal(tr_model_gpt2_create(&model, &g, NULL, 0), 0);
    cfg = config(4, 1, NULL);
    o = (tr_engine_opts_t){.config = cfg, .model = model, .seq_len = 32, .train = {.shards = path}};
    assert_true(tr_engine_create(&eng, &o, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "bad.bin"));
    tr_config_destroy(cfg);
}

static int setup_dir(void **state)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/tr_engine_test.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_dir(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd);
}

int main(int argc, char **argv)
{
    self_path = argv[0];
    if (argc == 4 && !strcmp(argv[1], "resume-child")) return resume_child(argv[2], argv[3]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_mlp_loss_falls),
        cmocka_unit_test(test_engine_accumulation_equals_large_batch),
        cmocka_unit_test(test_engine_deepspeed_style_equals_train_batch),
        cmocka_unit_test(test_engine_resume_is_bit_exact),
        cmocka_unit_test(test_engine_background_save_is_the_blocking_bytes),
        cmocka_unit_test(test_engine_damaged_checkpoint_is_refused),
        cmocka_unit_test(test_engine_failing_layer_names_itself),
        cmocka_unit_test(test_engine_gpt2_trains_on_token_shards),
    };
    return cmocka_run_group_tests_name("engine", tests, setup_dir, remove_dir);
}
