/* futex: sleep until a 32-bit word changes, and wake sleepers. Linux futexes, with a
 * fallback to a short sleep elsewhere (correct, just slower to wake). */
#ifndef TR_RUNTIME_CORE_FUTEX_H
#define TR_RUNTIME_CORE_FUTEX_H

#include <stdatomic.h>
#include <stdint.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Sleeps while *word == expected (spurious returns possible: callers loop). */
static inline void tr__futex_wait(_Atomic uint32_t *word, uint32_t expected)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static inline void tr__futex_wake(_Atomic uint32_t *word, int n)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}
#else
#include <time.h>
static inline void tr__futex_wait(_Atomic uint32_t *word, uint32_t expected)
{
    struct timespec ts = {0, 50000};
    if (atomic_load(word) == expected) nanosleep(&ts, NULL);
}
static inline void tr__futex_wake(_Atomic uint32_t *word, int n)
{
    (void)word;
    (void)n;
}
#endif

static inline void tr__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif
