/* Optimizer state offloaded to NVMe (zero_optimization.offload_optimizer.device "nvme"): the
 * swapper keeps it in nvme_path/troupe_swap/rank0/optimizer.swp and the optimizer steps it
 * sub-group by sub-group. Training gives bitwise the losses and parameters of in-memory
 * training for each elementwise optimizer, with and without the pipeline; a flipped byte in
 * the swap file stops training with a message naming the file and the offset; a save and a
 * resume in a new engine are bit-exact; Lamb, too few buffers and a disk without room for the
 * state are refused at create. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe.h"

#include "engine_testing.h"

#define STEPS 8

static char tmpdir[256];

/* A config: the optimizer section `optim`, and (offload) the state in tmpdir with sub-groups
 * of 50 elements (the MLP has 195 parameters: four sub-groups, cut inside tensors). */
static void config_json(char *json, size_t len, const char *optim, bool offload, int buffers,
                        bool pipelined)
{
    char off[600] = "";
    if (offload)
        snprintf(off, sizeof(off),
                 ", \"sub_group_size\": 50, \"offload_optimizer\": "
                 "{\"device\": \"nvme\", \"nvme_path\": \"%s\", \"buffer_count\": %d, "
                 "\"pipeline_read\": %s, \"pipeline_write\": %s}",
                 tmpdir, buffers, pipelined ? "true" : "false", pipelined ? "true" : "false");
    snprintf(json, len,
             "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2,"
             " \"optimizer\": %s, \"gradient_clipping\": 1.0,"
             " \"zero_optimization\": {\"stage\": 0%s},"
             " \"troupe\": {\"runtime\": {\"workers\": 2}}}",
             optim, off);
}

static void run(tr_engine_t *eng, int steps, float *losses)
{
    for (int i = 0; i < steps; i++) {
        tr_step_stats_t st;
        if (tr_engine_train_batch(eng, &st) != 0) fail_msg("step %d: %s", i, tr_engine_error(eng));
        losses[i] = st.loss;
    }
}

/* Trains STEPS steps; losses and a copy of the parameters out (free *params). */
static void train(const char *json, float *losses, float **params, size_t *n)
{
    tr_config_t *cfg;
    tr_engine_t *eng = test_mlp_engine(json, "offload.json", 1, &cfg);
    run(eng, STEPS, losses);
    const tr_model_t *m = tr_engine_model(eng);
    *n = tr_model_num_params(m);
    *params = malloc(*n * sizeof(float));
    memcpy(*params, tr_model_params(m), *n * sizeof(float));
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

static void check_same_as_in_memory(const char *optim, int buffers, bool pipelined)
{
    char json[1200];
    float mem_loss[STEPS], nvme_loss[STEPS], *mem_p, *nvme_p;
    size_t n, n2;
    config_json(json, sizeof(json), optim, false, 0, false);
    train(json, mem_loss, &mem_p, &n);
    config_json(json, sizeof(json), optim, true, buffers, pipelined);
    train(json, nvme_loss, &nvme_p, &n2);
    printf("offload: %s, %d buffers%s: loss %.9g -> %.9g (in memory %.9g -> %.9g)\n", optim,
           buffers, pipelined ? ", pipelined" : "", nvme_loss[0], nvme_loss[STEPS - 1], mem_loss[0],
           mem_loss[STEPS - 1]);
    assert_true(mem_loss[STEPS - 1] != mem_loss[0]); /* it trained */
    assert_memory_equal(nvme_loss, mem_loss, sizeof(mem_loss));
    assert_int_equal(n, n2);
    assert_memory_equal(nvme_p, mem_p, n * sizeof(float));
    free(mem_p);
    free(nvme_p);
}

static void test_offload_adamw_is_bitwise_in_memory(void **state)
{
    (void)state;
    const char *adamw = "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}";
    check_same_as_in_memory(adamw, 3, true);
    check_same_as_in_memory(adamw, 4, false); /* one buffer at a time */
}

static void test_offload_other_optimizers_are_bitwise_in_memory(void **state)
{
    (void)state;
    check_same_as_in_memory("{\"type\": \"Adam\", \"params\": {\"lr\": 0.01, \"amsgrad\": true, "
                            "\"weight_decay\": 0.01}}",
                            5, true);
    check_same_as_in_memory("{\"type\": \"SGD\", \"params\": {\"lr\": 0.05, \"momentum\": 0.9, "
                            "\"weight_decay\": 0.01}}",
                            3, true);
    check_same_as_in_memory("{\"type\": \"Lion\", \"params\": {\"lr\": 0.001, "
                            "\"weight_decay\": 0.1}}",
                            3, true);
}

static const char *ADAMW = "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}";

static void flip_byte(const char *path, long at)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static void test_offload_flipped_byte_names_file_and_offset(void **state)
{
    (void)state;
    char json[1200], swap[400];
    config_json(json, sizeof(json), ADAMW, true, 3, true);
    tr_config_t *cfg;
    tr_engine_t *eng = test_mlp_engine(json, "offload.json", 1, &cfg);
    float losses[2];
    run(eng, 2, losses);
    snprintf(swap, sizeof(swap), "%s/troupe_swap/rank0/optimizer.swp", tmpdir);
    /* a save reads every sub-group once the step's write-backs are done; then the 3 buffers
     * read sub-groups 0 to 2 ahead of the next step, so sub-group 3 (slots of 4096 bytes) is
     * the one read during it, after this */
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/flip_ckpt", tmpdir);
    if (tr_engine_save_checkpoint(eng, dir, NULL)) fail_msg("save: %s", tr_engine_error(eng));
    flip_byte(swap, 3 * 4096 + 20);
    tr_step_stats_t st;
    assert_true(tr_engine_train_batch(eng, &st) < 0);
    const char *err = tr_engine_error(eng);
    printf("offload: flipped byte: %s\n", err);
    assert_non_null(strstr(err, swap));
    assert_non_null(strstr(err, "sub-group 3 at offset 12288"));
    assert_non_null(strstr(err, "CRC32C"));
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

/* 8 straight steps against 4, a save, one step, a load into the same engine and 4 steps,
 * then a new engine that loads it and runs 4. */
static void test_offload_resume_is_bit_exact(void **state)
{
    (void)state;
    char json[1200], dir[300];
    snprintf(dir, sizeof(dir), "%s/ckpt", tmpdir);
    config_json(json, sizeof(json), ADAMW, true, 3, true);
    float straight[STEPS], again[STEPS], *expect;
    size_t n;
    train(json, straight, &expect, &n);

    tr_config_t *cfg;
    tr_engine_t *eng = test_mlp_engine(json, "offload.json", 1, &cfg);
    run(eng, STEPS / 2, again);
    if (tr_engine_save_checkpoint(eng, dir, NULL)) fail_msg("save: %s", tr_engine_error(eng));
    run(eng, 1, again + STEPS / 2); /* training goes on after a save */
    assert_memory_equal(again, straight, (STEPS / 2 + 1) * sizeof(float));
    /* a load into the same engine: the next step's state is being read ahead by now */
    if (tr_engine_load_checkpoint(eng, dir, NULL)) fail_msg("load: %s", tr_engine_error(eng));
    run(eng, STEPS / 2, again + STEPS / 2);
    assert_memory_equal(again, straight, sizeof(straight));
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);

    eng = test_mlp_engine(json, "offload.json", 1, &cfg);
    if (tr_engine_load_checkpoint(eng, dir, NULL)) fail_msg("load: %s", tr_engine_error(eng));
    run(eng, STEPS / 2, again + STEPS / 2);
    assert_memory_equal(again, straight, sizeof(straight));
    assert_memory_equal(tr_model_params(tr_engine_model(eng)), expect, n * sizeof(float));
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    free(expect);
}

static long vm_locked_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmLck: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

/* offload_optimizer {"device": "cpu", "pin_memory": true}: the state is locked in memory
 * (VmLck grows by at least its page) and training is bitwise the unpinned run. */
static void test_offload_cpu_pinned_locks_the_state(void **state)
{
    (void)state;
    char json[1200];
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": %s,"
             " \"zero_optimization\": {\"stage\": 0, \"offload_optimizer\": {\"device\": \"cpu\","
             " \"pin_memory\": true}}, \"troupe\": {\"runtime\": {\"workers\": 2}}}",
             ADAMW);
    long before = vm_locked_kb();
    tr_config_t *cfg;
    tr_engine_t *eng = test_mlp_engine(json, "offload.json", 1, &cfg);
    long during = vm_locked_kb();
    printf("offload: cpu pinned: VmLck %ld kB -> %ld kB\n", before, during);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    before = -1; /* the sanitizers make mlock a no-op */
#endif
    if (before >= 0) assert_true(during >= before + 4);
    float pinned[4], plain[4];
    run(eng, 4, pinned);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    snprintf(json, sizeof(json),
             "{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": %s,"
             " \"zero_optimization\": {\"stage\": 0}, \"troupe\": {\"runtime\": {\"workers\": 2}}}",
             ADAMW);
    eng = test_mlp_engine(json, "offload.json", 1, &cfg);
    run(eng, 4, plain);
    assert_memory_equal(pinned, plain, sizeof(plain));
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

/* Engine create fails with a message holding `want`. */
static void check_refused(const char *json, const char *want)
{
    tr_config_t *cfg;
    tr_config_diag_t d;
    tr_config_diag_init(&d);
    assert_int_equal(tr_config_from_string(json, strlen(json), "offload.json", 1, &cfg, &d), 0);
    tr_config_diag_close(&d);
    int widths[] = {TEST_XD, 16, TEST_CLASSES};
    tr_model_t *model;
    char why[256], err[1024] = "";
    assert_int_equal(tr_model_mlp_create(&model, widths, 3, why, sizeof(why)), 0);
    tr_engine_opts_t o = {.config = cfg,
                          .model = model,
                          .seq_len = 1,
                          .seed = 11,
                          .init_params = 1,
                          .world = 1,
                          .train = {.batch = test_mlp_batch, .x_dim = TEST_XD}};
    tr_engine_t *eng;
    assert_true(tr_engine_create(&eng, &o, err, sizeof(err)) < 0);
    printf("offload: refused: %s\n", err);
    assert_non_null(strstr(err, want));
    tr_config_destroy(cfg);
}

static void test_offload_refuses_lamb_and_too_few_buffers(void **state)
{
    (void)state;
    char json[1200];
    config_json(json, sizeof(json), "{\"type\": \"Lamb\", \"params\": {\"lr\": 0.01}}", true, 3,
                true);
    check_refused(json, "Lamb");
    config_json(json, sizeof(json), ADAMW, true, 2, true);
    check_refused(json, "buffer_count is 2");
}

/* A disk without room for the state: an error at create naming the file (a 8 KiB tmpfs for
 * 4 slots of 4096 bytes; skipped where tmpfs cannot be mounted, as without root). */
static void test_offload_full_disk_is_an_error_at_create(void **state)
{
    (void)state;
    char mnt[200], cmd[600], json[1200], saved[256];
    snprintf(mnt, sizeof(mnt), "%.180s/small", tmpdir);
    snprintf(cmd, sizeof(cmd),
             "mkdir -p '%s' && mount -t tmpfs -o size=8k tmpfs '%s' "
             "2>/dev/null",
             mnt, mnt);
    if (system(cmd) != 0) {
        printf("offload: full disk: skipped (cannot mount a tmpfs here)\n");
        skip();
    }
    memcpy(saved, tmpdir, sizeof(saved));
    snprintf(tmpdir, sizeof(tmpdir), "%s", mnt); /* config_json's nvme_path */
    config_json(json, sizeof(json), ADAMW, true, 3, true);
    memcpy(tmpdir, saved, sizeof(saved));
    check_refused(json, "small/troupe_swap/rank0/optimizer.swp");
    check_refused(json, "the disk is full");
    snprintf(cmd, sizeof(cmd), "umount '%s'", mnt);
    assert_int_equal(system(cmd), 0);
}

/* A checkpoint disk that fills up mid-training (a 24 KiB tmpfs holds one tag of this model
 * and latest, not two): the second save's failure is a clear error naming the file and the
 * full disk, its half-written tag is removed, latest stays on the first tag, which loads,
 * training goes on and the next save (to a disk with room) succeeds. */
static void test_offload_full_checkpoint_disk_keeps_the_last_checkpoint(void **state)
{
    (void)state;
    char mnt[200], cmd[600], json[1200];
    snprintf(mnt, sizeof(mnt), "%.180s/ckfull", tmpdir);
    snprintf(cmd, sizeof(cmd),
             "mkdir -p '%s' && mount -t tmpfs -o size=24k tmpfs '%s' "
             "2>/dev/null",
             mnt, mnt);
    if (system(cmd) != 0) {
        printf("offload: full checkpoint disk: skipped (cannot mount a tmpfs here)\n");
        skip();
    }
    config_json(json, sizeof(json), ADAMW, true, 3, true);
    tr_config_t *cfg;
    tr_engine_t *eng = test_mlp_engine(json, "offload.json", 1, &cfg);
    float losses[STEPS];
    run(eng, 2, losses);
    if (tr_engine_save_checkpoint(eng, mnt, "one") || tr_engine_wait_checkpoint(eng))
        fail_msg("first save: %s", tr_engine_error(eng));
    run(eng, 2, losses);
    int rc = tr_engine_save_checkpoint(eng, mnt, "two");
    if (rc == 0) rc = tr_engine_wait_checkpoint(eng);
    const char *err = tr_engine_error(eng);
    printf("offload: full checkpoint disk: %d: %s\n", rc, err);
    assert_true(rc < 0);
    assert_non_null(strstr(err, "/ckfull/two/"));
    assert_non_null(strstr(err, "latest still names one"));
    char two[300];
    snprintf(two, sizeof(two), "%s/two", mnt);
    assert_int_equal(access(two, F_OK), -1); /* the half-written tag is removed */
    char latest[400], tag[32] = "";
    snprintf(latest, sizeof(latest), "%s/latest", mnt);
    FILE *f = fopen(latest, "r");
    assert_non_null(f);
    assert_non_null(fgets(tag, sizeof(tag), f));
    fclose(f);
    assert_string_equal(tag, "one");
    run(eng, 1, losses); /* training goes on, and the next save (where there is room) works */
    char roomy[300];
    snprintf(roomy, sizeof(roomy), "%.180s/ckroomy", tmpdir);
    if (tr_engine_save_checkpoint(eng, roomy, "three") || tr_engine_wait_checkpoint(eng))
        fail_msg("the save after a failed one: %s", tr_engine_error(eng));
    if (tr_engine_load_checkpoint(eng, mnt, NULL)) fail_msg("load: %s", tr_engine_error(eng));
    assert_int_equal(tr_engine_global_step(eng), 2);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
    snprintf(cmd, sizeof(cmd), "umount '%s'", mnt);
    assert_int_equal(system(cmd), 0);
}

/* The optimizer cannot copy the offloaded state for a save (no memory, injected): the save
 * ends as failed through the checkpointer like any failure — the wait returns it, nothing is
 * written — and the next save, the wait and destroy neither hang nor fail. */
static void test_offload_refused_save_does_not_hang_the_next(void **state)
{
    (void)state;
    char json[1200], dir[300], latest[400];
    snprintf(dir, sizeof(dir), "%s/refused", tmpdir);
    snprintf(latest, sizeof(latest), "%s/latest", dir);
    config_json(json, sizeof(json), ADAMW, true, 3, true);
    tr_config_t *cfg;
    tr_engine_t *eng = test_mlp_engine(json, "offload.json", 1, &cfg);
    float losses[2];
    run(eng, 2, losses);
    setenv("TROUPE_FAULT_SAVE_NOMEM", "1", 1);
    int rc = tr_engine_save_checkpoint(eng, dir, "nomem");
    unsetenv("TROUPE_FAULT_SAVE_NOMEM");
    assert_int_equal(rc, 0); /* the call returns; the save's outcome comes with the wait */
    assert_int_equal(tr_engine_wait_checkpoint(eng), TR_EFAILED);
    printf("offload: refused save: %s\n", tr_engine_error(eng));
    assert_non_null(strstr(tr_engine_error(eng), "no memory for a copy of the offloaded"));
    assert_int_equal(access(latest, F_OK), -1);
    run(eng, 1, losses);
    if (tr_engine_save_checkpoint(eng, dir, "ok") || tr_engine_wait_checkpoint(eng))
        fail_msg("save after a refused one: %s", tr_engine_error(eng));
    assert_int_equal(access(latest, F_OK), 0);
    tr_engine_destroy(eng);
    tr_config_destroy(cfg);
}

static int setup_dir(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/tr_offload_test.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_dir(void **state)
{
    (void)state;
    char cmd[1000];
    snprintf(cmd, sizeof(cmd), "umount '%s/small' '%s/ckfull' 2>/dev/null; rm -rf '%s'", tmpdir,
             tmpdir, tmpdir);
    return system(cmd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offload_adamw_is_bitwise_in_memory),
        cmocka_unit_test(test_offload_other_optimizers_are_bitwise_in_memory),
        cmocka_unit_test(test_offload_flipped_byte_names_file_and_offset),
        cmocka_unit_test(test_offload_resume_is_bit_exact),
        cmocka_unit_test(test_offload_cpu_pinned_locks_the_state),
        cmocka_unit_test(test_offload_refuses_lamb_and_too_few_buffers),
        cmocka_unit_test(test_offload_full_disk_is_an_error_at_create),
        cmocka_unit_test(test_offload_full_checkpoint_disk_keeps_the_last_checkpoint),
        cmocka_unit_test(test_offload_refused_save_does_not_hang_the_next),
    };
    return cmocka_run_group_tests_name("engine_offload", tests, setup_dir, remove_dir);
}
