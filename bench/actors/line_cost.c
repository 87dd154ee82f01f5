/* line_cost: what moving a cache line between two cores costs on this machine, the bound
 * under every cross-thread message (a send writes lines that the receiving core then reads).
 *
 *   line_cost
 *
 * Two threads pinned to CPUs 0 and 1. Prints `name: value ns` lines:
 *   line_handoff          one way of a line written by each thread in turn (a ping-pong)
 *   locked_add_owned      a locked add on a line the thread already owns
 *   write_after_read      writing a line the other core has read (random order, a locked add
 *                         after each write, as a send's push does); _x4: four writes a fence
 *   write_after_write     the same for lines the other core has written
 *   load_miss_cpu0/1      a load that misses the core's own caches, on each CPU: a chain of
 *                         dependent loads through 8 MiB in random order (fjthrput's messages in
 *                         flight are 6-12 MiB). On a VM the two figures can differ by 4x for
 *                         minutes, as other tenants load the host's caches under one vCPU and
 *                         not the other (bench/RESULTS.md); a thread placed there runs slower.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { HANDOFFS = 2000000, LINES = 4096, ROUNDS = 200 };
enum { MISS_BYTES = 8 << 20, MISS_LINES = MISS_BYTES / 64, MISS_LOADS = 1000000 };

typedef struct line {
    _Atomic uint64_t v;
    char pad[56];
} line_t;

static line_t flag;
static line_t *lines;
static uint32_t order[LINES];
static _Atomic int phase;
static int other_writes;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return pthread_setaffinity_np(pthread_self(), sizeof(s), &s);
}

/* Thread 1's half of the ping-pong: waits for odd values and answers with the next one. */
static void *ponger(void *arg)
{
    pin(1);
    for (uint64_t i = 1; i < HANDOFFS; i += 2) {
        while (atomic_load_explicit(&flag.v, memory_order_acquire) != i)
            ;
        atomic_store_explicit(&flag.v, i + 1, memory_order_release);
    }
    return arg;
}

/* Thread 1 in the write tests: on each odd phase, reads (or writes) every line, then hands
 * the phase back. */
static void *toucher(void *arg)
{
    pin(1);
    uint64_t sum = 0;
    for (int r = 0; r < ROUNDS; r++) {
        while (atomic_load(&phase) != 2 * r + 1)
            ;
        for (int i = 0; i < LINES; i++) {
            if (other_writes)
                atomic_store_explicit(&lines[order[i]].v, (uint64_t)r, memory_order_relaxed);
            else
                sum += atomic_load_explicit(&lines[order[i]].v, memory_order_relaxed);
        }
        atomic_store(&phase, 2 * r + 2);
    }
    return (void *)(uintptr_t)sum;
}

static double handoff_ns(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, ponger, NULL) != 0) return -1;
    uint64_t t0 = now_ns();
    for (uint64_t i = 0; i < HANDOFFS; i += 2) {
        while (atomic_load_explicit(&flag.v, memory_order_acquire) != i)
            ;
        atomic_store_explicit(&flag.v, i + 1, memory_order_release);
    }
    pthread_join(t, NULL);
    return (double)(now_ns() - t0) / HANDOFFS;
}

static double write_ns(int writes, int group)
{
    other_writes = writes;
    atomic_store(&phase, 0);
    pthread_t t;
    if (pthread_create(&t, NULL, toucher, NULL) != 0) return -1;
    _Atomic uint64_t fence_word = 0;
    uint64_t total = 0;
    for (int r = 0; r < ROUNDS; r++) {
        atomic_store(&phase, 2 * r + 1);
        while (atomic_load(&phase) != 2 * r + 2)
            ;
        uint64_t t0 = now_ns();
        for (int i = 0; i < LINES; i += group) {
            for (int j = 0; j < group; j++)
                atomic_store_explicit(&lines[order[i + j]].v, 1, memory_order_relaxed);
            atomic_fetch_add(&fence_word, 1);
        }
        total += now_ns() - t0;
    }
    pthread_join(t, NULL);
    return (double)total / ROUNDS / LINES;
}

/* v[0..n) made 0..n-1 in a random order (Fisher-Yates, rand()). */
static void shuffled(uint32_t *v, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        v[i] = i;
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = (uint32_t)rand() % (i + 1), k = v[i];
        v[i] = v[j];
        v[j] = k;
    }
}

/* One random cycle through MISS_LINES lines: next[i * 8] is the index (in words) of the next
 * line's word. NULL when out of memory. */
static uint64_t *miss_cycle(void)
{
    uint64_t *next = aligned_alloc(64, MISS_BYTES);
    uint32_t *perm = malloc(sizeof(uint32_t) * MISS_LINES);
    if (!next || !perm) {
        free(next);
        free(perm);
        return NULL;
    }
    shuffled(perm, MISS_LINES);
    for (uint32_t i = 0; i < MISS_LINES; i++)
        next[(size_t)perm[i] * 8] = (uint64_t)perm[(i + 1) % MISS_LINES] * 8;
    free(perm);
    return next;
}

/* The mean latency of a dependent load through the cycle, on the given CPU, after one pass
 * that brings the lines as close to it as they fit. */
static double miss_ns(const uint64_t *next, int cpu)
{
    if (pin(cpu) != 0) return -1;
    uint64_t at = 0;
    for (uint32_t i = 0; i < MISS_LINES; i++)
        at = next[at];
    uint64_t t0 = now_ns();
    for (uint32_t i = 0; i < MISS_LOADS; i++)
        at = next[at];
    uint64_t t = now_ns() - t0;
    return (double)t / MISS_LOADS + (at == UINT64_MAX); /* at is used: the chain is kept */
}

int main(int argc, char **argv)
{
    if (argc > 1) { /* no options: say what it does rather than ignore them */
        bool help = strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0;
        if (!help) fprintf(stderr, "line_cost: unknown option '%s' (it takes none)\n", argv[1]);
        fprintf(help ? stdout : stderr, "usage: line_cost\n  prints what moving a cache line "
                                        "between CPUs 0 and 1 costs, and a load that misses "
                                        "each one's own caches, as `name: value ns` lines\n");
        return help ? 0 : 2;
    }
    if (pin(0) != 0) {
        fprintf(stderr, "line_cost: cannot pin to CPU 0 and 1 (needs two CPUs)\n");
        return 1;
    }
    lines = aligned_alloc(64, sizeof(line_t) * LINES);
    if (!lines) return 1;
    memset(lines, 0, sizeof(line_t) * LINES);
    srand(1);
    shuffled(order, LINES); /* a random order defeats the prefetchers */
    printf("line_handoff: %.1f ns\n", handoff_ns());
    _Atomic uint64_t x = 0;
    uint64_t t0 = now_ns();
    for (int i = 0; i < HANDOFFS; i++)
        atomic_fetch_add(&x, 1);
    printf("locked_add_owned: %.1f ns\n", (double)(now_ns() - t0) / HANDOFFS);
    printf("write_after_read: %.1f ns\n", write_ns(0, 1));
    printf("write_after_read_x4: %.1f ns\n", write_ns(0, 4));
    printf("write_after_write: %.1f ns\n", write_ns(1, 1));
    printf("write_after_write_x4: %.1f ns\n", write_ns(1, 4));
    uint64_t *next = miss_cycle();
    if (next) {
        printf("load_miss_cpu0: %.1f ns\n", miss_ns(next, 0));
        printf("load_miss_cpu1: %.1f ns\n", miss_ns(next, 1));
        free(next);
    }
    free(lines);
    return 0;
}
