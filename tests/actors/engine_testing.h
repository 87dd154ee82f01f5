/* engine_testing.h: what the engine tests share. Include after <cmocka.h> and "troupe.h". */
#ifndef TR_TESTS_ACTORS_ENGINE_TESTING_H
#define TR_TESTS_ACTORS_ENGINE_TESTING_H

#include <stdio.h>
#include <string.h>

/* A config parsed from json (named `source` in its diagnostics, which go to stderr); the test
 * fails when it does not load. */
static inline tr_config_t *test_config(const char *json, const char *source)
{
    tr_config_t *cfg;
    tr_config_diag_t d;
    tr_config_diag_init(&d);
    int rc = tr_config_from_string(json, strlen(json), source, 1, &cfg, &d);
    for (size_t i = 0; i < d.count; i++)
        fprintf(stderr, "%s\n", d.items[i].text);
    tr_config_diag_close(&d);
    assert_int_equal(rc, 0);
    return cfg;
}

#endif
