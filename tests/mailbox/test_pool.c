/* The message pool: sizes, reuse, cross-thread returns, large messages. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "mailbox/pool.h"

static void test_pool_alloc_gives_requested_capacity(void **state)
{
    tr__pool_set_t *set = tr__pool_set_create();
    tr__pool_t *p = tr__pool_get(set);
    size_t sizes[] = {0, 1, 31, 32, 100, 1000, 5000, 60000, 200000};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        tr_msg_t *m = tr__pool_alloc(p, sizes[i]);
        assert_non_null(m);
        assert_true(m->tr_cap_ >= sizes[i]);
        assert_int_equal((uintptr_t)tr_msg_body(m) % 16, 0);
        memset(tr_msg_body(m), 0xab, sizes[i]); /* ASan checks the capacity is real */
        assert_int_equal(m->type, 0);
        tr__pool_free(p, m);
    }
    tr__pool_set_destroy(set);
}

static void test_pool_free_then_alloc_reuses_memory(void **state)
{
    tr__pool_set_t *set = tr__pool_set_create();
    tr__pool_t *p = tr__pool_get(set);
    tr_msg_t *a = tr__pool_alloc(p, 16);
    tr__pool_free(p, a);
    tr_msg_t *b = tr__pool_alloc(p, 16);
    assert_ptr_equal(a, b);
    tr__pool_free(p, b);
    assert_ptr_equal(tr__pool_get(set), p); /* one pool per thread */
    tr__pool_set_destroy(set);
}

#define N 1000
static tr__pool_set_t *shared_set;
static tr_msg_t *msgs[N];

static void *free_elsewhere(void *arg)
{
    tr__pool_t *mine = tr__pool_get(shared_set);
    for (int i = 0; i < N; i++)
        tr__pool_free(mine, msgs[i]);
    tr__pool_flush(mine);
    return NULL;
}

static void test_pool_remote_frees_come_back_to_owner(void **state)
{
    shared_set = tr__pool_set_create();
    tr__pool_t *p = tr__pool_get(shared_set);
    for (int i = 0; i < N; i++)
        msgs[i] = tr__pool_alloc(p, 16);
    size_t before = tr__pool_set_bytes(shared_set);
    pthread_t t;
    pthread_create(&t, NULL, free_elsewhere, NULL);
    pthread_join(t, NULL);
    for (int i = 0; i < N; i++) /* the owner gets its memory back: no new slab */
        assert_non_null(tr__pool_alloc(p, 16));
    assert_int_equal(tr__pool_set_bytes(shared_set), before);
    tr__pool_set_destroy(shared_set);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_alloc_gives_requested_capacity),
        cmocka_unit_test(test_pool_free_then_alloc_reuses_memory),
        cmocka_unit_test(test_pool_remote_frees_come_back_to_owner),
    };
    return cmocka_run_group_tests_name("pool", tests, NULL, NULL);
}
