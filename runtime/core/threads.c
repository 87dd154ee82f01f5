/* threads.c: the threads the runtime creates (workers, the loop thread, pinned actors' threads)
 * and what each gets before its first instruction of work: a signal mask, a name and a
 * scheduling slice.
 *
 * Signals: those the runtime handles (handle_signals) are blocked in its threads from their
 * first instruction (a new thread inherits the creator's mask), so the kernel hands them to
 * the application's threads, where libuv's handler passes them to the loop thread. Otherwise a
 * worker asleep in its futex could be the thread picked, and under ThreadSanitizer, which runs
 * a handler at the thread's next intercepted call, the signal was lost there. (TSan still
 * loses one now and then by other routes: test_shutdown's signal cases skip under it.)
 *
 * Names: "tr-worker-N", "tr-loop", "tr-pin-NAME" (15 bytes at most), for top -H, perf, gdb.
 *
 * Slice: each thread asks Linux's scheduler (EEVDF, 6.12 and later) for a short time slice,
 * opts.slice_us (100 us unless set). A thread is woken by another on the waker's own core
 * when the other core is idle (the kernel's choice: it avoids waking a sleeping core, which on
 * a VM costs tens of us), and with the default slice (1.4 ms on two cores) it then waits for
 * the waker to go to sleep: a trainer's thread that sends and sleeps spent ~7 us entering its
 * nanosleep on a 2-vCPU VM before the woken worker ran. A short slice gives the woken thread
 * the earlier deadline, so it runs at once: bench wakeup p50 12.9 -> 5.7 us, p99 46 -> 34 us,
 * every throughput row unchanged. The slice is a share of time, not a priority: a busy
 * thread gets the same CPU, in shorter turns when another wants the core. Threads started
 * from these threads (a BLAS pool a behaviour starts) inherit the slice, as Linux has every
 * thread inherit its creator's. (SCHED_FLAG_RESET_ON_FORK would give them the kernel's
 * instead, but an unprivileged thread cannot clear that flag: a behaviour could no longer
 * change its own thread's policy.) Threads with a real-time or idle policy, which the
 * application chose, are left alone. Older kernels ignore the request; a refused one
 * (seccomp) is logged at debug level and changes nothing else. */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime/core/internal.h"
#include "troupe/log.h"

/* The kernel's struct sched_attr, first version (48 bytes): <linux/sched/types.h> cannot be
 * included beside glibc's <sched.h>. */
typedef struct sched_attr48 {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
} sched_attr48_t;

typedef struct start {
    void *(*fn)(void *);
    void *arg;
    uint64_t slice_ns; /* 0: leave the inherited one */
} start_t;

static void ask_slice(uint64_t slice_ns)
{
    sched_attr48_t a = {0};
    if (syscall(SYS_sched_getattr, 0, &a, sizeof(a), 0) != 0) {
        tr_log(TR_LOG_DEBUG, "runtime thread: sched_getattr: %s; kernel's slice kept",
               strerror(errno));
        return;
    }
    if (a.policy != SCHED_OTHER && a.policy != SCHED_BATCH)
        return; /* real-time or idle: the application chose; not ours to change */
    a.size = sizeof(a);
    a.runtime = slice_ns;
    a.flags = 0;
    if (syscall(SYS_sched_setattr, 0, &a, 0) != 0)
        tr_log(TR_LOG_DEBUG,
               "runtime thread: sched_setattr (slice %llu ns): %s; kernel's slice kept",
               (unsigned long long)slice_ns, strerror(errno));
}

static uint64_t slice_ns(const tr_runtime_opts_t *o)
{
    return o->kernel_slice ? 0 : (uint64_t)(o->slice_us ? o->slice_us : TR__SLICE_US) * 1000u;
}

static void *start(void *arg)
{
    start_t s = *(start_t *)arg;
    free(arg);
    if (s.slice_ns) ask_slice(s.slice_ns);
    return s.fn(s.arg);
}

int tr__thread_create(const tr_runtime_t *rt, pthread_t *thread, void *(*fn)(void *), void *arg,
                      const char *name)
{
    char cut[16]; /* the kernel's limit, with the terminator */
    snprintf(cut, sizeof(cut), "%s", name);
    start_t *s = malloc(sizeof(*s));
    if (!s) return ENOMEM;
    *s = (start_t){.fn = fn, .arg = arg, .slice_ns = slice_ns(&rt->opts)};
    sigset_t block, old;
    sigemptyset(&block);
    if (rt->opts.handle_signals) {
        sigaddset(&block, SIGINT);
        sigaddset(&block, SIGTERM);
        sigaddset(&block, SIGUSR1);
    }
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int rc = pthread_create(thread, NULL, start, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc)
        free(s);
    else
        pthread_setname_np(*thread, cut); /* here: named before this returns */
    return rc;
}
