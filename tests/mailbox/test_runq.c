/* The run queues: FIFO, capacity, stealing half, and the inject queue. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

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
    assert_int_equal(tr__inject_len(&q), 3);
    for (int i = 0; i < 3; i++)
        assert_ptr_equal(tr__inject_pop(&q), &n[i]);
    assert_null(tr__inject_pop(&q));
    tr__inject_destroy(&q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runq_is_fifo_and_bounded),
        cmocka_unit_test(test_runq_steal_takes_about_half_in_order),
        cmocka_unit_test(test_inject_is_fifo),
    };
    return cmocka_run_group_tests_name("runq", tests, NULL, NULL);
}
