/* The loss scaler against scripted overflow sequences. Expected rows are what DeepSpeed
 * 0.19.8's own DynamicLossScaler.update_scale gives for the same overflows (initial scale 16,
 * window 3, min 2, hysteresis 2; its class run once per row), with and without
 * consecutive_hysteresis, each ending in the overflow at the minimum that must stop training.
 * Its window counts good steps after the first one since an overflow: the scale doubles at
 * the 4th good step here (rows 8), not the 3rd. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/loss_scaler.h"
#include "troupe/error.h"

typedef struct row {
    int overflow;
    double scale; /* after the update */
    int hysteresis;
    int err;
} row_t;

static void run_script(int consecutive, const row_t *rows, size_t n)
{
    tr_loss_scaler_opts_t o;
    tr_loss_scaler_opts_default(&o);
    o.initial_scale_power = 4;
    o.loss_scale_window = 3;
    o.min_loss_scale = 2.0;
    o.consecutive_hysteresis = consecutive;
    tr_loss_scaler_t s;
    assert_int_equal(tr_loss_scaler_init(&s, &o), 0);
    assert_true(tr_loss_scaler_scale(&s) == 16.0);
    for (size_t i = 0; i < n; i++) {
        int skip = -1;
        int err = tr_loss_scaler_update(&s, rows[i].overflow, &skip);
        if (err || rows[i].err) printf("row %zu: err %d (%s)\n", i, err, s.message);
        assert_int_equal(err, rows[i].err);
        assert_int_equal(skip, rows[i].overflow);
        if (err) {
            assert_non_null(strstr(s.message, "minimum"));
            assert_true(tr_loss_scaler_scale(&s) == o.min_loss_scale);
            continue;
        }
        assert_true(tr_loss_scaler_scale(&s) == rows[i].scale);
        assert_int_equal(s.cur_hysteresis, rows[i].hysteresis);
    }
}

static void test_loss_scaler_follows_script_without_consecutive_hysteresis(void **state)
{
    static const row_t rows[] = {
        {0, 16, 2, 0}, {0, 16, 2, 0}, {1, 16, 1, 0}, {1, 8, 1, 0},
        {0, 8, 1, 0},  {0, 8, 1, 0},  {0, 8, 1, 0},  {0, 16, 2, 0},
        {0, 16, 2, 0}, {1, 16, 1, 0}, {0, 16, 1, 0}, {1, 8, 1, 0},
        {1, 4, 1, 0},  {1, 2, 1, 0},  {0, 2, 1, 0},  {1, 0, 0, TR_ENONFINITE},
    };
    run_script(0, rows, sizeof(rows) / sizeof(rows[0]));
}

static void test_loss_scaler_follows_script_with_consecutive_hysteresis(void **state)
{
    static const row_t rows[] = {
        {0, 16, 2, 0},
        {0, 16, 2, 0},
        {1, 16, 1, 0},
        {1, 8, 1, 0},
        {0, 8, 2, 0},
        {0, 8, 2, 0},
        {0, 8, 2, 0},
        {0, 16, 2, 0},
        {0, 16, 2, 0},
        {1, 16, 1, 0},
        {0, 16, 2, 0},
        {1, 16, 1, 0},
        {1, 8, 1, 0},
        {1, 4, 1, 0},
        {0, 4, 2, 0},
        {1, 4, 1, 0},
        {0, 4, 2, 0},
        {0, 4, 2, 0},
        {1, 4, 1, 0},
        {1, 2, 1, 0},
        {0, 2, 2, 0},
        {1, 2, 1, 0},
        {1, 0, 0, TR_ENONFINITE},
    };
    run_script(1, rows, sizeof(rows) / sizeof(rows[0]));
}

/* DeepSpeed's defaults: 2^16; after an overflow, the 1001st good step doubles it. */
static void test_loss_scaler_defaults_double_after_window(void **state)
{
    tr_loss_scaler_opts_t o;
    tr_loss_scaler_opts_default(&o);
    tr_loss_scaler_t s;
    assert_int_equal(tr_loss_scaler_init(&s, &o), 0);
    assert_true(tr_loss_scaler_scale(&s) == 65536.0);
    int skip;
    assert_int_equal(tr_loss_scaler_update(&s, 1, &skip), 0); /* hysteresis 2 -> 1 */
    assert_true(tr_loss_scaler_scale(&s) == 65536.0);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(tr_loss_scaler_update(&s, 0, &skip), 0);
    assert_true(tr_loss_scaler_scale(&s) == 65536.0);
    assert_int_equal(tr_loss_scaler_update(&s, 0, &skip), 0);
    assert_true(tr_loss_scaler_scale(&s) == 131072.0);
    assert_int_equal(skip, 0);
}

static void test_loss_scaler_static_never_changes(void **state)
{
    tr_loss_scaler_opts_t o;
    tr_loss_scaler_opts_default(&o);
    o.loss_scale = 128.0;
    tr_loss_scaler_t s;
    assert_int_equal(tr_loss_scaler_init(&s, &o), 0);
    int skip;
    for (int i = 0; i < 50; i++) {
        assert_int_equal(tr_loss_scaler_update(&s, i % 3 == 0, &skip), 0);
        assert_int_equal(skip, i % 3 == 0);
        assert_true(tr_loss_scaler_scale(&s) == 128.0);
    }
}

static void test_loss_scaler_rejects_bad_options_naming_the_key(void **state)
{
    tr_loss_scaler_opts_t o;
    tr_loss_scaler_t s;
    tr_loss_scaler_opts_default(&o);
    o.loss_scale_window = 0;
    assert_int_equal(tr_loss_scaler_init(&s, &o), TR_EINVAL);
    assert_non_null(strstr(s.message, "loss_scale_window"));
    tr_loss_scaler_opts_default(&o);
    o.hysteresis = 0;
    assert_int_equal(tr_loss_scaler_init(&s, &o), TR_EINVAL);
    assert_non_null(strstr(s.message, "hysteresis"));
    tr_loss_scaler_opts_default(&o);
    o.loss_scale = -1.0;
    assert_int_equal(tr_loss_scaler_init(&s, &o), TR_EINVAL);
    assert_non_null(strstr(s.message, "loss_scale"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loss_scaler_follows_script_without_consecutive_hysteresis),
        cmocka_unit_test(test_loss_scaler_follows_script_with_consecutive_hysteresis),
        cmocka_unit_test(test_loss_scaler_defaults_double_after_window),
        cmocka_unit_test(test_loss_scaler_static_never_changes),
        cmocka_unit_test(test_loss_scaler_rejects_bad_options_naming_the_key),
    };
    return cmocka_run_group_tests_name("loss_scaler", tests, NULL, NULL);
}
