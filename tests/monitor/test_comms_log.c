/* DeepSpeed's comms logger: calc_bw_log's formulas per op, convert_size, the verbose line, the
 * 10% trimmed means and the seven-column summary, checked against values worked out by hand
 * from DeepSpeed's Python (deepspeed/utils/comms_logging.py, utils/timer.py trim_mean). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "monitor/comms_log.h"
#include "troupe.h"

static void test_comms_bandwidths_follow_deepspeed(void **state)
{
    (void)state;
    double a, b;
    assert_int_equal(tr_comms_bw("all_reduce", 1e6, 1.0, 4, &a, &b), 0);
    assert_float_equal(a, 16.0, 1e-9); /* 2 S / t, bytes/ms * 8 / 1e6 */
    assert_float_equal(b, 12.0, 1e-9); /* S / t * 2 (n-1)/n */
    assert_int_equal(tr_comms_bw("reduce_scatter", 1e6, 1.0, 4, &a, &b), 0);
    assert_float_equal(a, 32.0, 1e-9); /* S <- S n */
    assert_float_equal(b, 24.0, 1e-9);
    assert_int_equal(tr_comms_bw("all_gather", 2e6, 2.0, 2, &a, &b), 0);
    assert_float_equal(a, 16.0, 1e-9);
    assert_float_equal(b, 8.0, 1e-9);
    assert_int_equal(tr_comms_bw("broadcast", 1e6, 4.0, 8, &a, &b), 0);
    assert_float_equal(a, 2.0, 1e-9);
    assert_float_equal(b, 2.0, 1e-9);
    assert_int_equal(tr_comms_bw("all_to_all_single", 1e6, 1.0, 4, &a, &b), 0);
    assert_float_equal(a, 8.0, 1e-9);
    assert_float_equal(b, 6.0, 1e-9);
    assert_int_equal(tr_comms_bw("allreduce", 1e6, 1.0, 4, &a, &b), TR_EINVAL);
}

static void test_comms_sizes_print_as_deepspeed_does(void **state)
{
    (void)state;
    char s[48];
    tr_comms_size_str(0, s, sizeof(s));
    assert_string_equal(s, "0B");
    tr_comms_size_str(512, s, sizeof(s));
    assert_string_equal(s, "512.0 B");
    tr_comms_size_str(1536, s, sizeof(s));
    assert_string_equal(s, "1.5 KB");
    tr_comms_size_str(711838228, s, sizeof(s)); /* 678.8619... MiB */
    assert_string_equal(s, "678.86 MB");
    char line[256];
    tr_comms_line("all_reduce", 1.0, 1e6, 4, line, sizeof(line));
    assert_string_equal(line, "comm op: all_reduce | time (ms): 1.00 | msg size: 976.56 KB | "
                              "algbw (Gbps): 16.00 | busbw (Gbps): 12.00");
}

static void test_comms_summary_uses_trimmed_means(void **state)
{
    (void)state;
    tr_comms_log_t *log;
    assert_int_equal(tr_comms_log_create(2, &log), 0);
    for (int i = 1; i <= 10; i++) /* latencies 1..10 ms: trim_mean drops 1 and 10 -> 5.5 */
        assert_int_equal(tr_comms_log_add(log, "all_reduce", 1024, (double)i), 0);
    assert_int_equal(tr_comms_log_add(log, "all_reduce", 512, 2.0), 0);
    assert_int_equal(tr_comms_log_add(log, "broadcast", 2048, 1.0), 0);
    assert_int_equal(tr_comms_log_add(log, "nonsense", 1, 1.0), TR_EINVAL);
    assert_int_equal(tr_comms_log_count(log), 12);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    tr_comms_log_summary(log, f);
    fclose(f);
    /* all_reduce 1 KiB on 2 ranks: algbw_i = 2*1024/i ms *8/1e6; trimmed over i = 2..9 */
    double alg = 0, bus = 0;
    for (int i = 2; i <= 9; i++) {
        alg += 2 * 1024.0 / i * 8 / 1e6;
        bus += 1024.0 / i * 2 * 0.5 * 8 / 1e6;
    }
    char row[256];
    snprintf(row, sizeof(row), "%-20s%-20s%-20s%-20.2f%-20.2f%-20.2f%-20.2f", " ", "1.0 KB", "10",
             55.0, 5.5, alg / 8, bus / 8);
    const char *want[] = {
        "Comm. Op            Message Size        Count               Total Latency(ms)   "
        "Avg Latency(ms)     tput_avg (Gbps)     busbw_avg (Gbps)    ",
        "all_reduce",
        "                    512.0 B             1                   2.00                2.00"
        "                0.00                0.00                ",
        row,
        "broadcast",
    };
    char *line = buf;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = '\0';
        assert_string_equal(line, want[i]);
        line = nl + 1;
    }
    free(buf);
    f = open_memstream(&buf, &len);
    tr_comms_log_json(log, f);
    fclose(f);
    json_error_t je;
    json_t *root = json_loads(buf, 0, &je);
    assert_non_null(root);
    json_t *ar = json_object_get(json_object_get(root, "summary"), "all_reduce");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(ar, "1024"), "count")), 10);
    assert_float_equal(
        json_real_value(json_object_get(json_object_get(ar, "1024"), "avg_latency_ms")), 5.5, 1e-9);
    json_decref(root);
    free(buf);
    tr_comms_log_destroy(log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_comms_bandwidths_follow_deepspeed),
        cmocka_unit_test(test_comms_sizes_print_as_deepspeed_does),
        cmocka_unit_test(test_comms_summary_uses_trimmed_means),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
