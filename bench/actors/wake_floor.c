/* wake_floor.c: what waking a parked thread costs on this machine with no runtime at all,
 * the floor under the wakeup benchmark (idle.c).
 *
 * wakeup_floor: the wakeup benchmark's sending pattern, bare. A thread sleeps ~1 ms, stamps,
 *   sets a word and wakes (FUTEX_WAKE) a thread waiting on it in FUTEX_WAIT, which records
 *   (time it runs - stamp) and waits again. The same samples, warm-up and repetitions as
 *   wakeup; p50, p90, p99 and max in microseconds. Troupe's wakeup adds to this its send, the
 *   schedule and the worker's return to work; a VM's host decides the rest (when it runs an
 *   idle vCPU again).
 */
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "benches.h"

typedef struct floor_state {
    _Atomic uint32_t word;  /* odd: a stamp is waiting */
    _Atomic uint64_t stamp; /* the sender's clock when it woke the waiter */
    uint64_t *samples;      /* LATENCY_SAMPLES */
} floor_state_t;

static void *floor_waiter(void *arg)
{
    floor_state_t *s = arg;
    for (int n = 0; n < LATENCY_WARMUP + LATENCY_SAMPLES;) {
        uint32_t w = atomic_load(&s->word);
        if (!(w & 1)) {
            syscall(SYS_futex, &s->word, FUTEX_WAIT_PRIVATE, w, NULL, NULL, 0);
            continue;
        }
        uint64_t t = bench_now_ns();
        if (n >= LATENCY_WARMUP) s->samples[n - LATENCY_WARMUP] = t - atomic_load(&s->stamp);
        n++;
        atomic_store(&s->word, w + 1);
    }
    return NULL;
}

static int floor_once(const bench_args_t *a, uint64_t *samples)
{
    (void)a;
    floor_state_t s = {.word = 0, .samples = samples};
    pthread_t th;
    if (pthread_create(&th, NULL, floor_waiter, &s) != 0) {
        fprintf(stderr, "wakeup_floor: cannot start the waiting thread\n");
        return -1;
    }
    for (int i = 0; i < LATENCY_WARMUP + LATENCY_SAMPLES; i++) {
        bench_sleep_ns(LATENCY_GAP_NS);
        while (atomic_load(&s.word) & 1) /* the last stamp not yet taken: wait for it */
            bench_sleep_ns(1000);
        atomic_store(&s.stamp, bench_now_ns());
        atomic_fetch_add(&s.word, 1);
        syscall(SYS_futex, &s.word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    }
    pthread_join(th, NULL);
    return 0;
}

int bench_wakeup_floor(const bench_args_t *a)
{
    return bench_latency_reps(a, "wakeup_floor", LATENCY_SAMPLES, floor_once);
}
