/* clock.c: tr_now_ns (CLOCK_MONOTONIC nanoseconds), and calibrates the time-stamp counter against
 * CLOCK_MONOTONIC, once per process (a 2 ms measurement, taken the first time a runtime starts). */
#include "base/clock.h"

#include <pthread.h>
#include <time.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

int tr__tsc_ok;
static double ns_per_tick = 1.0;
static pthread_once_t once = PTHREAD_ONCE_INIT;

uint64_t tr_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int tsc_invariant(void)
{
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u) return 0;
    __get_cpuid(0x80000007u, &a, &b, &c, &d);
    return (d >> 8) & 1;
#else
    return 0;
#endif
}

static void calibrate(void)
{
#if defined(__x86_64__)
    if (!tsc_invariant()) return;
    uint64_t n0 = tr_now_ns(), t0 = __rdtsc(), n1, t1;
    do { /* 2 ms: the two clock reads' cost is then a few parts per million */
        n1 = tr_now_ns();
        t1 = __rdtsc();
    } while (n1 - n0 < 2000000);
    if (t1 > t0) {
        ns_per_tick = (double)(n1 - n0) / (double)(t1 - t0);
        tr__tsc_ok = 1;
    }
#endif
}

double tr__ns_per_tick(void)
{
    pthread_once(&once, calibrate);
    return ns_per_tick;
}
