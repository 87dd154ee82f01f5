/* engine_testing.h: what the engine tests share. Include after <cmocka.h> and "troupe.h". */
#ifndef TR_TESTS_ACTORS_ENGINE_TESTING_H
#define TR_TESTS_ACTORS_ENGINE_TESTING_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Built with a sanitizer: its shadow memory and quarantines make the resident set
 * meaningless, so the tests that measure it skip. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif
#else
#define SANITIZED 0
#endif

/* A config parsed from json for `world` ranks (0: the launcher's; named `source` in its
 * diagnostics, which go to stderr); the test fails when it does not load. */
static inline tr_config_t *test_config_world(const char *json, const char *source, int world)
{
    tr_config_t *cfg;
    tr_config_diag_t d;
    tr_config_diag_init(&d);
    int rc = tr_config_from_string(json, strlen(json), source, world, &cfg, &d);
    for (size_t i = 0; i < d.count; i++)
        fprintf(stderr, "%s\n", d.items[i].text);
    tr_config_diag_close(&d);
    assert_int_equal(rc, 0);
    return cfg;
}

/* The same for one process. */
static inline tr_config_t *test_config(const char *json, const char *source)
{
    return test_config_world(json, source, 1);
}

/* A synthetic classification task for an MLP of TEST_XD inputs and TEST_CLASSES classes (the
 * class is a band of x0 + x1/2, so it can be learned), deterministic per batch index (a
 * tr_batch_cb). */
#define TEST_XD      8
#define TEST_CLASSES 3
static inline int test_mlp_batch(void *user, uint64_t index, int B, int T, int *tokens, float *x,
                                 int *targets, float *y)
{
    (void)user;
    (void)tokens;
    (void)y;
    for (int i = 0; i < B * T; i++) {
        uint64_t s = index * (uint64_t)(B * T) + (uint64_t)i;
        for (int k = 0; k < TEST_XD; k++)
            x[i * TEST_XD + k] = (float)((s * 31 + (uint64_t)k * 7) % 19) / 9.0f - 1.0f;
        float v = x[i * TEST_XD] + 0.5f * x[i * TEST_XD + 1]; /* a learnable class */
        targets[i] = v < -0.5f ? 0 : v < 0.5f ? 1 : 2;
    }
    return 0;
}

/* An engine for the MLP TEST_XD -> 16 -> TEST_CLASSES on test_mlp_batch, over `world` ranks
 * (0: the launcher's), from json (named `source`); *cfg is its config, to destroy after the
 * engine. The test fails when either does not load. */
static inline tr_engine_t *test_mlp_engine_widths(const char *json, const char *source, int world,
                                                  tr_config_t **cfg, const int *widths, int n);
static inline tr_engine_t *test_mlp_engine(const char *json, const char *source, int world,
                                           tr_config_t **cfg)
{
    int widths[] = {TEST_XD, 16, TEST_CLASSES};
    return test_mlp_engine_widths(json, source, world, cfg, widths, 3);
}

/* The same for an MLP of the given widths (widths[0] TEST_XD, widths[n - 1] TEST_CLASSES). */
static inline tr_engine_t *test_mlp_engine_widths(const char *json, const char *source, int world,
                                                  tr_config_t **cfg, const int *widths, int n)
{
    *cfg = test_config_world(json, source, world);
    tr_model_t *model;
    char why[256], err[512];
    assert_int_equal(tr_model_mlp_create(&model, widths, n, why, sizeof(why)), 0);
    tr_engine_opts_t o = {.config = *cfg,
                          .model = model,
                          .seq_len = 1,
                          .seed = 11,
                          .init_params = 1,
                          .world = world,
                          .train = {.batch = test_mlp_batch, .x_dim = TEST_XD}};
    tr_engine_t *eng;
    if (tr_engine_create(&eng, &o, err, sizeof(err))) fail_msg("engine (world %d): %s", world, err);
    return eng;
}

#endif
