/* clock: cheap timestamps for the scheduler's hot path.
 *
 * tr__ticks() reads the CPU's time-stamp counter where it is invariant (constant rate, runs in
 * every power state: CPUID 0x80000007 EDX bit 8), else CLOCK_MONOTONIC in nanoseconds. On
 * virtual machines clock_gettime can cost several times an actor activation; rdtsc costs a
 * few nanoseconds. Ticks are only differenced and converted (tr__ticks_to_ns); message send
 * times and everything user-visible stay in CLOCK_MONOTONIC nanoseconds (tr_now_ns).
 */
#ifndef TR_BASE_CLOCK_H
#define TR_BASE_CLOCK_H

#include <stdint.h>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

/* Nanoseconds per tick, measured once per process; 1.0 when ticks are nanoseconds. */
double tr__ns_per_tick(void);

/* Whether tr__ticks reads the TSC (set by the first tr__ns_per_tick call). */
extern int tr__tsc_ok;

static inline uint64_t tr__ticks(void)
{
#if defined(__x86_64__)
    if (tr__tsc_ok) return __rdtsc();
#endif
    extern uint64_t tr_now_ns(void);
    return tr_now_ns();
}

static inline uint64_t tr__ticks_to_ns(uint64_t ticks)
{
    return (uint64_t)((double)ticks * tr__ns_per_tick());
}

static inline uint64_t tr__ns_to_ticks(uint64_t ns)
{
    return (uint64_t)((double)ns / tr__ns_per_tick());
}

#endif
