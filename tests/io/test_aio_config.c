/* The config's `aio` section as engine options (runtime/config/aio_options.c): a config without the
 * section gives tr_aio_options_default's values, every key of a given section comes through,
 * and the deprecated thread_count reaches intra_op_parallelism. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "troupe/aio.h"
#include "troupe/config.h"

/* The options of a config given as JSON text (which must load). */
static tr_aio_options_t options_of(const char *json)
{
    tr_config_t *cfg = NULL;
    tr_config_diag_t diag;
    tr_config_diag_init(&diag);
    assert_int_equal(tr_config_from_string(json, strlen(json), "ds.json", 1, &cfg, &diag), 0);
    tr_aio_options_t o;
    memset(&o, 0xff, sizeof o);
    tr_aio_options_from_config(&cfg->aio, &o);
    tr_config_destroy(cfg);
    tr_config_diag_close(&diag);
    return o;
}

static void test_aio_config_defaults_are_the_engines(void **state)
{
    (void)state;
    tr_aio_options_t want, got = options_of("{\"train_batch_size\": 1}");
    tr_aio_options_default(&want);
    assert_int_equal(got.block_size, want.block_size);
    assert_int_equal(got.queue_depth, want.queue_depth);
    assert_int_equal(got.intra_op_parallelism, want.intra_op_parallelism);
    assert_int_equal(got.single_submit, want.single_submit);
    assert_int_equal(got.overlap_events, want.overlap_events);
}

static void test_aio_config_section_comes_through(void **state)
{
    (void)state;
    tr_aio_options_t o = options_of(
        "{\"train_batch_size\": 1, \"aio\": {\"block_size\": 262144, \"queue_depth\": 32,"
        " \"intra_op_parallelism\": 4, \"single_submit\": true, \"overlap_events\": false}}");
    assert_int_equal(o.block_size, 262144);
    assert_int_equal(o.queue_depth, 32);
    assert_int_equal(o.intra_op_parallelism, 4);
    assert_int_equal(o.single_submit, 1);
    assert_int_equal(o.overlap_events, 0);
}

static void test_aio_config_thread_count_is_intra_op_parallelism(void **state)
{
    (void)state;
    tr_aio_options_t o = options_of("{\"train_batch_size\": 1, \"aio\": {\"thread_count\": 3}}");
    assert_int_equal(o.intra_op_parallelism, 3);
    assert_int_equal(o.queue_depth, 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_aio_config_defaults_are_the_engines),
        cmocka_unit_test(test_aio_config_section_comes_through),
        cmocka_unit_test(test_aio_config_thread_count_is_intra_op_parallelism),
    };
    return cmocka_run_group_tests_name("aio_config", tests, NULL, NULL);
}
