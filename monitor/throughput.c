/* throughput.c: DeepSpeed's ThroughputTimer and the engine's progress line.
 *
 * The timer follows deepspeed/utils/timer.py step for step: timing begins at the first
 * start() once global_step >= start_step (2 by default, so the first two steps, with their
 * warm-up costs, are excluded), every micro-step's duration is added to the running total
 * and to the current step's, and at a global step that is a multiple of steps_per_output it
 * logs "epoch=E/micro_step=M/global_step=G, RunningAvgSamplesPerSec=A, CurrSamplesPerSec=C,
 * MemAllocated=XGB, MaxMemAllocated=YGB" with Python's float formatting. Not thread-safe:
 * it belongs to the engine's thread.
 */
#include "troupe/monitor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

void tr_throughput_init(tr_throughput_t *tp, uint64_t batch_size, uint64_t steps_per_output,
                        uint64_t start_step)
{
    *tp = (tr_throughput_t){.batch_size = batch_size ? batch_size : 1,
                            .steps_per_output = steps_per_output ? steps_per_output : 50,
                            .start_step = start_step ? start_step : 2};
}

void tr_throughput_epoch(tr_throughput_t *tp)
{
    tp->epoch++;
    tp->micro_step = 0;
}

void tr_throughput_start(tr_throughput_t *tp, uint64_t now_ns)
{
    tp->started = 1;
    if (tp->global_step >= tp->start_step) tp->start_ns = now_ns;
}

/* Python's round(bytes / 1024**3, 2). */
static double gib_2(uint64_t bytes)
{
    char tmp[64];
    snprintf(tmp, sizeof(tmp), "%.2f", (double)bytes / (1024.0 * 1024.0 * 1024.0));
    return strtod(tmp, NULL);
}

static size_t speed_line(const tr_throughput_t *tp, uint64_t mem, uint64_t max_mem, char *buf,
                         size_t cap)
{
    char avg[40], curr[40], m1[40], m2[40];
    double avg_step_s = tp->total_elapsed_s / (double)(tp->global_step - tp->start_step);
    tr_pyfloat_format((double)tp->batch_size / avg_step_s, avg, sizeof(avg));
    tr_pyfloat_format((double)tp->batch_size / tp->step_elapsed_s, curr, sizeof(curr));
    tr_pyfloat_format(gib_2(mem), m1, sizeof(m1));
    tr_pyfloat_format(gib_2(max_mem), m2, sizeof(m2));
    return (size_t)snprintf(buf, cap,
                            "epoch=%llu/micro_step=%llu/global_step=%llu, "
                            "RunningAvgSamplesPerSec=%s, CurrSamplesPerSec=%s, "
                            "MemAllocated=%sGB, MaxMemAllocated=%sGB",
                            (unsigned long long)tp->epoch, (unsigned long long)tp->micro_step,
                            (unsigned long long)tp->global_step, avg, curr, m1, m2);
}

int tr_throughput_stop(tr_throughput_t *tp, int global_step, uint64_t now_ns,
                       uint64_t mem_allocated, uint64_t max_mem_allocated, char *buf, size_t cap)
{
    if (!tp->started) return 0;
    tp->started = 0;
    tp->micro_step++;
    if (global_step) tp->global_step++;
    if (!tp->start_ns) return 0;
    double duration = (double)(now_ns - tp->start_ns) / 1e9;
    tp->total_elapsed_s += duration;
    tp->step_elapsed_s += duration;
    if (!global_step) return 0;
    int report = tp->global_step % tp->steps_per_output == 0;
    if (report) speed_line(tp, mem_allocated, max_mem_allocated, buf, cap);
    tp->step_elapsed_s = 0;
    return report;
}

/* "[a, b, ...]" of Python floats at *len. */
static void py_list(char *buf, size_t cap, size_t *len, const double *v, size_t n)
{
    *len += (size_t)snprintf(*len < cap ? buf + *len : NULL, *len < cap ? cap - *len : 0, "[");
    for (size_t i = 0; i < n; i++) {
        char f[40];
        tr_pyfloat_format(v[i], f, sizeof(f));
        *len += (size_t)snprintf(*len < cap ? buf + *len : NULL, *len < cap ? cap - *len : 0,
                                 "%s%s", i ? ", " : "", f);
    }
    *len += (size_t)snprintf(*len < cap ? buf + *len : NULL, *len < cap ? cap - *len : 0, "]");
}

size_t tr_progress_line(unsigned rank, uint64_t step, uint64_t skipped, const double *lr,
                        size_t n_lr, const double (*mom)[2], size_t n_mom, char *buf, size_t cap)
{
    size_t len = (size_t)snprintf(buf, cap, "[Rank %u] step=%llu, skipped=%llu, lr=", rank,
                                  (unsigned long long)step, (unsigned long long)skipped);
    py_list(buf, cap, &len, lr, n_lr);
    len += (size_t)snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, ", mom=[");
    for (size_t i = 0; i < n_mom; i++) {
        if (i)
            len += (size_t)snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, ", ");
        py_list(buf, cap, &len, mom[i], 2);
    }
    len += (size_t)snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, "]");
    return len;
}
