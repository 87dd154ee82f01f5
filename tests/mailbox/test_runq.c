/* The run queues: FIFO, capacity, stealing half, and the inject queue. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "mailbox/runq.h"

static tr__runq_t a, b;

static void test_runq_is_fifo_and_bounded(void **state)
{
    tr__runq_init(&a);
    for (uintptr_t i = 1; i <= TR__RUNQ_CAP; i++)
        assert_true(tr__runq_push(&a, (void *)i));
    assert_false(tr__runq_push(&a, (void *)999));
    for (uintptr_t i = 1; i <= TR__RUNQ_CAP; i++)
        assert_int_equal((uintptr_t)tr__runq_pop(&a), i);
    assert_null(tr__runq_pop(&a));
}

static void test_runq_steal_takes_about_half_in_order(void **state)
{
    tr__runq_init(&a);
    tr__runq_init(&b);
    for (uintptr_t i = 1; i <= 10; i++)
        tr__runq_push(&a, (void *)i);
    assert_int_equal((uintptr_t)tr__runq_steal(&b, &a), 1);
    assert_int_equal(tr__runq_len(&b), 4); /* 5 taken: one to run, four queued */
    assert_int_equal(tr__runq_len(&a), 5);
    assert_int_equal((uintptr_t)tr__runq_pop(&b), 2);
    assert_int_equal((uintptr_t)tr__runq_pop(&a), 6);
    tr__runq_init(&a);
    assert_null(tr__runq_steal(&b, &a));
}

static void test_inject_is_fifo(void **state)
{
    tr__inject_t q;
    tr__qnode_t n[3];
    tr__inject_init(&q);
    tr__qnode_t *two[2] = {&n[0], &n[1]};
    tr__inject_push(&q, two, 2);
    tr__qnode_t *one = &n[2];
    tr__inject_push(&q, &one, 1);
    assert_true(tr__inject_nonempty(&q));
    for (int i = 0; i < 3; i++)
        assert_ptr_equal(tr__inject_pop(&q), &n[i]);
    assert_null(tr__inject_pop(&q));
    assert_false(tr__inject_nonempty(&q));
    tr__inject_push(&q, &one, 1); /* after the stub went round: still FIFO, still found */
    assert_true(tr__inject_nonempty(&q));
    assert_ptr_equal(tr__inject_pop(&q), &n[2]);
    assert_false(tr__inject_nonempty(&q));
    tr__inject_destroy(&q);
}

/* Stress: 4 producer threads push their nodes (each many times over: a node goes back in once
 * it is popped, as an actor is scheduled again) while consumers pop; every push is popped
 * exactly once and nothing is left. With one consumer, each producer's pushes also come out
 * in order (with two, pops are serialised too, but the checks after them are not). */
#define P_THREADS 4
#define P_NODES   64
#define P_ROUNDS  20000

typedef struct snode {
    tr__qnode_t q;
    int producer;
    _Atomic int queued; /* pushed and not popped yet */
    int64_t round;      /* which push of its producer this is */
} snode_t;

static tr__inject_t sq;
static snode_t snodes[P_THREADS][P_NODES];
static _Atomic uint64_t popped, bad;
static _Atomic int producers_done;
static int64_t last_seen[P_THREADS]; /* one consumer only */

static void *s_producer(void *arg)
{
    int p = (int)(intptr_t)arg;
    for (int64_t r = 0; r < P_ROUNDS; r++) {
        snode_t *n = &snodes[p][r % P_NODES];
        while (atomic_load_explicit(&n->queued, memory_order_acquire)) /* still queued */
            ;
        n->round = r;
        atomic_store_explicit(&n->queued, 1, memory_order_relaxed);
        tr__qnode_t *one = &n->q;
        tr__inject_push(&sq, &one, 1);
    }
    atomic_fetch_add(&producers_done, 1);
    return NULL;
}

static void *s_consumer(void *check_order)
{
    for (;;) {
        tr__qnode_t *q = tr__inject_pop(&sq);
        if (!q) {
            if (atomic_load(&producers_done) == P_THREADS && !tr__inject_nonempty(&sq)) return NULL;
            continue;
        }
        snode_t *n = (snode_t *)q;
        if (!atomic_load_explicit(&n->queued, memory_order_relaxed))
            atomic_fetch_add(&bad, 1); /* popped twice */
        if (check_order) {
            if (n->round != last_seen[n->producer] + 1) atomic_fetch_add(&bad, 1);
            last_seen[n->producer] = n->round;
        }
        atomic_fetch_add(&popped, 1);
        atomic_store_explicit(&n->queued, 0, memory_order_release);
    }
}

static void inject_stress(int consumers)
{
    tr__inject_init(&sq);
    atomic_store(&popped, 0);
    atomic_store(&bad, 0);
    atomic_store(&producers_done, 0);
    for (int p = 0; p < P_THREADS; p++) {
        last_seen[p] = -1;
        for (int i = 0; i < P_NODES; i++)
            snodes[p][i] = (snode_t){.producer = p};
    }
    pthread_t t[P_THREADS + 2];
    for (int p = 0; p < P_THREADS; p++)
        pthread_create(&t[p], NULL, s_producer, (void *)(intptr_t)p);
    for (int c = 0; c < consumers; c++)
        pthread_create(&t[P_THREADS + c], NULL, s_consumer, consumers == 1 ? &sq : NULL);
    for (int i = 0; i < P_THREADS + consumers; i++)
        pthread_join(t[i], NULL);
    printf("inject stress, %d consumer(s): %llu pops of %d pushes, %llu wrong\n", consumers,
           (unsigned long long)atomic_load(&popped), P_THREADS * P_ROUNDS,
           (unsigned long long)atomic_load(&bad));
    assert_int_equal(atomic_load(&popped), P_THREADS * P_ROUNDS);
    assert_int_equal(atomic_load(&bad), 0);
    assert_false(tr__inject_nonempty(&sq));
}

static void test_inject_stress(void **state)
{
    (void)state;
    inject_stress(1);
    inject_stress(2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runq_is_fifo_and_bounded),
        cmocka_unit_test(test_runq_steal_takes_about_half_in_order),
        cmocka_unit_test(test_inject_is_fifo),
        cmocka_unit_test(test_inject_stress),
    };
    return cmocka_run_group_tests_name("runq", tests, NULL, NULL);
}
