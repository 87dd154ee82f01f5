/* csv_monitor: a scripted DeepSpeed-like run (fp16, wall_clock_breakdown, a resume) writes
 * the same bytes as DeepSpeed's csvMonitor, run by tests/monitor/ds_csv_reference.py on the
 * same events with Python's csv module; and the layout is checked by hand for one file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tr_build_config.h"
#include "troupe/monitor.h"

static const char *tags[] = {
    TR_TAG_TRAIN_LOSS,
    TR_TAG_LR,
    TR_TAG_LOSS_SCALE,
    TR_TAG_FORWARD_MS,
    TR_TAG_BACKWARD_MS,
    TR_TAG_BACKWARD_INNER_MS,
    TR_TAG_BACKWARD_ALLREDUCE_MS,
    TR_TAG_STEP_MS,
    "odd tag, with \"quotes\"",
};
#define N_TAGS (sizeof(tags) / sizeof(tags[0]))

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = 0;
    fclose(f);
    return strdup(buf);
}

/* Steps 1..n of a run with train_batch_size 32 writing every tag; values vary like a run's. */
static void run_steps(tr_csv_monitor_t *c, FILE *events, int first, int last)
{
    for (int step = first; step <= last; step++) {
        uint64_t samples = (uint64_t)step * 32;
        double values[N_TAGS] = {10.0 / step + 0.123456789,
                                 1e-4 * step / 7.0,
                                 65536.0 / (1 << (step % 3)),
                                 12.3 * step,
                                 25.0 + step / 3.0,
                                 20.0,
                                 5.0 + 1e-7 * step,
                                 3.25,
                                 -1e-5 * step};
        for (size_t i = 0; i < N_TAGS; i++) {
            if (!strcmp(tags[i], TR_TAG_LOSS_SCALE) && step == 1) {
                /* DeepSpeed's initial loss scale is the Python int 2**16 */
                assert_int_equal(tr_csv_monitor_write_int(c, tags[i], 65536, samples), 0);
                fprintf(events, "%s\ti:65536\t%llu\n", tags[i], (unsigned long long)samples);
                continue;
            }
            assert_int_equal(tr_csv_monitor_write(c, tags[i], values[i], samples), 0);
            fprintf(events, "%s\t%.17g\t%llu\n", tags[i], values[i], (unsigned long long)samples);
        }
    }
}

static void test_csv_monitor_matches_deepspeed_reference(void **state)
{
    char ours[256], ref[256], events_path[300], cmd[1200];
    snprintf(ours, sizeof(ours), "/tmp/tr_test_csv_%d/ours", (int)getpid());
    snprintf(ref, sizeof(ref), "/tmp/tr_test_csv_%d/ref", (int)getpid());
    snprintf(events_path, sizeof(events_path), "/tmp/tr_test_csv_%d/events.tsv", (int)getpid());
    tr_csv_monitor_t *c;
    assert_int_equal(tr_csv_monitor_create(ours, "job_1", &c), 0);
    FILE *events = fopen(events_path, "w");
    assert_non_null(events);
    run_steps(c, events, 1, 5);
    tr_csv_monitor_destroy(c);
    /* a resumed run appends to the same files */
    fprintf(events, "RESUME\n");
    assert_int_equal(tr_csv_monitor_create(ours, "job_1", &c), 0);
    run_steps(c, events, 6, 8);
    tr_csv_monitor_destroy(c);
    fclose(events);

    if (access("/usr/bin/python3", X_OK)) skip();
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s/tests/monitor/ds_csv_reference.py %s %s job_1",
             TR_SOURCE_DIR, events_path, ref);
    assert_int_equal(system(cmd), 0);
    for (size_t i = 0; i < N_TAGS; i++) {
        char name[128], a[400], b[400];
        size_t k = 0;
        for (const char *s = tags[i]; *s; s++)
            name[k++] = *s == '/' || *s == ' ' ? '_' : *s;
        name[k] = 0;
        snprintf(a, sizeof(a), "%s/job_1/%s.csv", ours, name);
        snprintf(b, sizeof(b), "%s/job_1/%s.csv", ref, name);
        char *x = read_all(a), *y = read_all(b);
        assert_non_null(x);
        assert_non_null(y);
        assert_string_equal(x, y);
        free(x);
        free(y);
    }
    char lr[400];
    snprintf(lr, sizeof(lr), "%s/job_1/Train_Samples_loss_scale.csv", ours);
    char *text = read_all(lr);
    const char *want = "step,loss_scale\r\n32,65536\r\n64,16384.0\r\n96,65536.0\r\n";
    assert_true(!strncmp(text, want, strlen(want)));
    assert_null(strstr(text + 1, "step,")); /* one header despite the resume */
    free(text);
    snprintf(cmd, sizeof(cmd), "rm -rf /tmp/tr_test_csv_%d", (int)getpid());
    assert_int_equal(system(cmd), 0);
}

static void test_csv_monitor_reports_unwritable_dir(void **state)
{
    tr_csv_monitor_t *c;
    assert_true(tr_csv_monitor_create("/proc/none", "job", &c) < 0);
    assert_null(c);
    assert_int_equal(tr_csv_monitor_create("/tmp", "", &c), TR_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_csv_monitor_matches_deepspeed_reference),
        cmocka_unit_test(test_csv_monitor_reports_unwritable_dir),
    };
    return cmocka_run_group_tests_name("csv_monitor", tests, NULL, NULL);
}
