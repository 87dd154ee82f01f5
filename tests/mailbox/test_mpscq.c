/* The MPSC queue: FIFO order, chains, the folded idle mark, and no loss under producers. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

#include "mailbox/mpscq.h"

typedef struct node {
    tr_msg_t msg;
    unsigned producer;
    uint64_t seq;
} node_t;

static tr__mpscq_head_t head;
static tr__mpscq_tail_t tail;

static node_t *pop(void)
{
    tr_msg_t *done;
    return (node_t *)tr__mpscq_pop(&tail, &done);
}

static void test_mpscq_push_pop_is_fifo(void **state)
{
    node_t n[5] = {0};
    tr__mpscq_init(&head, &tail, false);
    assert_null(pop());
    for (int i = 0; i < 5; i++) {
        n[i].seq = (uint64_t)i;
        tr__mpscq_push(&head, &n[i].msg, &n[i].msg, 1);
    }
    for (int i = 0; i < 5; i++)
        assert_int_equal(pop()->seq, i);
    assert_null(pop());
    assert_true(tr__mpscq_is_empty(&head, &tail));
}

static void test_mpscq_chain_push_keeps_order(void **state)
{
    node_t n[4] = {0};
    tr__mpscq_init(&head, &tail, false);
    for (int i = 0; i < 4; i++) {
        n[i].seq = (uint64_t)i;
        if (i) atomic_store(&n[i - 1].msg.tr_next_, &n[i].msg);
    }
    tr__mpscq_push(&head, &n[0].msg, &n[3].msg, 4);
    assert_int_equal(atomic_load(&head.pushed), 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(pop()->seq, i);
    assert_int_equal(atomic_load(&tail.popped), 4);
}

static void test_mpscq_idle_mark_goes_to_exactly_one_pusher(void **state)
{
    node_t n[3] = {0};
    tr__mpscq_init(&head, &tail, true);
    assert_true(tr__mpscq_push(&head, &n[0].msg, &n[0].msg, 1));  /* was idle: schedule */
    assert_false(tr__mpscq_push(&head, &n[1].msg, &n[1].msg, 1)); /* already scheduled */
    assert_false(tr__mpscq_mark_empty(&head, &tail));             /* messages remain */
    assert_non_null(pop());
    assert_non_null(pop());
    assert_true(tr__mpscq_mark_empty(&head, &tail));
    assert_false(tr__mpscq_unmark(&head) && tr__mpscq_unmark(&head)); /* only one wins */
    assert_true(tr__mpscq_mark_empty(&head, &tail));
    assert_true(tr__mpscq_push(&head, &n[2].msg, &n[2].msg, 1));
    assert_ptr_equal(pop(), &n[2]);
}

#define PRODUCERS    4
#define PER_PRODUCER 200000

static void *producer(void *arg)
{
    node_t *nodes = arg;
    for (int i = 0; i < PER_PRODUCER; i++)
        tr__mpscq_push(&head, &nodes[i].msg, &nodes[i].msg, 1);
    return NULL;
}

static void test_mpscq_producers_lose_nothing(void **state)
{
    tr__mpscq_init(&head, &tail, false);
    node_t *nodes = calloc((size_t)PRODUCERS * PER_PRODUCER, sizeof(node_t));
    pthread_t t[PRODUCERS];
    for (unsigned p = 0; p < PRODUCERS; p++) {
        for (uint64_t i = 0; i < PER_PRODUCER; i++) {
            nodes[p * PER_PRODUCER + i].producer = p;
            nodes[p * PER_PRODUCER + i].seq = i;
        }
        pthread_create(&t[p], NULL, producer, &nodes[(size_t)p * PER_PRODUCER]);
    }
    uint64_t next[PRODUCERS] = {0}, got = 0;
    while (got < (uint64_t)PRODUCERS * PER_PRODUCER) {
        node_t *n = pop();
        if (!n) continue;
        assert_int_equal(n->seq, next[n->producer]); /* per-producer FIFO, no duplicate */
        next[n->producer]++;
        got++;
    }
    for (unsigned p = 0; p < PRODUCERS; p++) {
        pthread_join(t[p], NULL);
        assert_int_equal(next[p], PER_PRODUCER);
    }
    assert_null(pop());
    free(nodes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mpscq_push_pop_is_fifo),
        cmocka_unit_test(test_mpscq_chain_push_keeps_order),
        cmocka_unit_test(test_mpscq_idle_mark_goes_to_exactly_one_pusher),
        cmocka_unit_test(test_mpscq_producers_lose_nothing),
    };
    return cmocka_run_group_tests_name("mpscq", tests, NULL, NULL);
}
