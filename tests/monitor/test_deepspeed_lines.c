/* DeepSpeed's text outputs: Python's float repr, the wall_clock_breakdown timer lines, the
 * throughput line (expected values from DeepSpeed's ThroughputTimer arithmetic run on the
 * same scripted times) and the progress line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "troupe/monitor.h"

static void expect_repr(double v, const char *want)
{
    char buf[64];
    size_t n = tr_pyfloat_format(v, buf, sizeof(buf));
    assert_string_equal(buf, want);
    assert_int_equal(n, strlen(want));
}

static void test_deepspeed_pyfloat_matches_python_repr(void **state)
{
    expect_repr(0.1, "0.1");
    expect_repr(1e-05, "1e-05");
    expect_repr(0.0001, "0.0001");
    expect_repr(0.000123, "0.000123");
    expect_repr(65536.0, "65536.0");
    expect_repr(1e16, "1e+16");
    expect_repr(1234567890123456.0, "1234567890123456.0");
    expect_repr(1.0 / 3.0, "0.3333333333333333");
    expect_repr(2.5e-310, "2.5e-310");
    expect_repr(5e-324, "5e-324");
    expect_repr(1.7976931348623157e308, "1.7976931348623157e+308");
    expect_repr(123456789012345678.0, "1.2345678901234568e+17");
    expect_repr(-1.5, "-1.5");
    expect_repr(0.001 * 3, "0.003");
    expect_repr(0.0, "0.0");
    expect_repr(-0.0, "-0.0");
    expect_repr(1.0 / 0.0, "inf");
}

static void test_deepspeed_timer_lines_have_deepspeed_format(void **state)
{
    tr_walltimers_t *t;
    assert_int_equal(tr_walltimers_create(&t), 0);
    const uint64_t ms = 1000000;
    /* two micro-steps of one accumulation step */
    for (int mb = 0; mb < 2; mb++) {
        uint64_t t0 = 1000 * ms + (uint64_t)mb * 100 * ms;
        tr_walltimers_start(t, "fwd_microstep", t0);
        tr_walltimers_start(t, "fwd", t0);
        tr_walltimers_stop(t, "fwd_microstep", t0 + 12340000);
        tr_walltimers_stop(t, "fwd", t0 + 12340000);
        tr_walltimers_start(t, "bwd_microstep", t0 + 20 * ms);
        tr_walltimers_start(t, "bwd", t0 + 20 * ms);
        tr_walltimers_stop(t, "bwd_microstep", t0 + 20 * ms + 25005000);
        tr_walltimers_stop(t, "bwd", t0 + 20 * ms + 25005000);
    }
    assert_int_equal(tr_walltimers_stop(t, "bwd", 0), TR_EINVAL); /* not started */
    tr_walltimers_start(t, "step", 2000 * ms);
    assert_int_equal(tr_walltimers_start(t, "step", 2000 * ms), TR_EINVAL);
    tr_walltimers_stop(t, "step", 2000 * ms + 3 * ms);
    const char *micro[] = {TR_WALLTIMER_MICRO_NAMES};
    const char *global[] = {TR_WALLTIMER_GLOBAL_NAMES};
    char line[512];
    tr_walltimers_log_line(t, 0, micro, 5, 1.0, 1, 0, line, sizeof(line));
    /* only the timers that exist print, in DeepSpeed's order; not logged in between, the
     * micro timers hold both micro-steps */
    assert_string_equal(line, "[Rank 0] time (ms) | fwd_microstep: 24.68 | bwd_microstep: 50.01");
    tr_walltimers_log_line(t, 0, global, 5, 1.0, 1, 0, line, sizeof(line));
    assert_string_equal(line, "[Rank 0] time (ms) | fwd: 24.68 | bwd: 50.01 | step: 3.00");
    /* reset: a second log shows zeros */
    size_t need = tr_walltimers_log_line(t, 0, global, 1, 1.0, 1, 0, line, 8);
    assert_int_equal(need, strlen("[Rank 0] time (ms) | fwd: 0.00"));
    assert_int_equal(strlen(line), 7);
    tr_walltimers_destroy(t);
}

static void test_deepspeed_throughput_line_excludes_first_steps(void **state)
{
    tr_throughput_t tp;
    tr_throughput_init(&tp, 16, 2, 0);
    const char *want[] = {
        "epoch=0/micro_step=8/global_step=4, RunningAvgSamplesPerSec=75.82938388625593, "
        "CurrSamplesPerSec=75.11737089201878, MemAllocated=3.0GB, MaxMemAllocated=5.5GB",
        "epoch=0/micro_step=12/global_step=6, RunningAvgSamplesPerSec=74.4186046511628, "
        "CurrSamplesPerSec=72.39819004524887, MemAllocated=3.0GB, MaxMemAllocated=5.5GB",
    };
    int lines = 0;
    for (uint64_t i = 0; i < 12; i++) {
        uint64_t start = 1000000000ull + i * 250000000ull;
        uint64_t stop = start + 100000000ull + i * 1000000ull;
        char buf[256];
        tr_throughput_start(&tp, start);
        if (tr_throughput_stop(&tp, i % 2 == 1, stop, 3ull << 30, 5905580032ull, buf,
                               sizeof(buf))) {
            assert_true(lines < 2);
            assert_string_equal(buf, want[lines++]);
        }
    }
    assert_int_equal(lines, 2);
    assert_int_equal(tp.global_step, 6);
}

static void test_deepspeed_progress_line(void **state)
{
    char buf[256];
    double lr[] = {0.0001, 3e-05};
    double mom[][2] = {{0.9, 0.999}};
    tr_progress_line(0, 10, 1, lr, 2, mom, 1, buf, sizeof(buf));
    assert_string_equal(buf, "[Rank 0] step=10, skipped=1, lr=[0.0001, 3e-05], mom=[[0.9, 0.999]]");
    tr_progress_line(0, 3, 0, lr, 1, NULL, 0, buf, sizeof(buf));
    assert_string_equal(buf, "[Rank 0] step=3, skipped=0, lr=[0.0001], mom=[]");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deepspeed_pyfloat_matches_python_repr),
        cmocka_unit_test(test_deepspeed_timer_lines_have_deepspeed_format),
        cmocka_unit_test(test_deepspeed_throughput_line_excludes_first_steps),
        cmocka_unit_test(test_deepspeed_progress_line),
    };
    return cmocka_run_group_tests_name("deepspeed_lines", tests, NULL, NULL);
}
