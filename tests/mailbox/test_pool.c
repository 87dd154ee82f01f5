/* The message pool: sizes, reuse, cross-thread returns, large messages. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "mailbox/pool.h"

/* Pages of [from, from + len) in memory. */
static size_t resident_pages(const char *from, size_t len)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)from & ~(page - 1), hi = (uintptr_t)from + len;
    size_t n = (hi - lo + page - 1) / page, in = 0;
    unsigned char *v = malloc(n);
    assert_non_null(v);
    assert_int_equal(mincore((void *)lo, hi - lo, v), 0);
    for (size_t i = 0; i < n; i++)
        in += v[i] & 1;
    free(v);
    return in;
}

/* A new slab's chunks are carved as they are handed out: the first message does not fault in
 * the slab's 64 pages (~200 us on a VM, once per 2,048 messages on a sending path). Runs
 * first, so that the slab is fresh from the system, not one a closed set left in the cache. */
static void test_pool_new_slab_is_touched_as_used(void **state)
{
    (void)state;
    tr__pool_set_t *set = tr__pool_set_create();
    tr__pool_t *p = tr__pool_get(set);
    tr_msg_t *first = tr__pool_alloc(p, 0); /* 128-byte class: 2,047 chunks a slab */
    assert_non_null(first);
    const char *slab = (const char *)first - 128; /* the first chunk follows the slab header */
    if (getenv("MALLOC_PERTURB_")) { /* glibc then fills the slab when it allocates it */
        tr__pool_free(p, first);
        tr__pool_set_destroy(set);
        skip();
    }
    size_t before = resident_pages(slab, 256 * 1024);
    print_message("slab pages resident after one message: %zu of 64\n", before);
    assert_true(before <= 3);
    tr_msg_t *m[200];
    for (int i = 0; i < 200; i++) {
        m[i] = tr__pool_alloc(p, 0);
        assert_true((const char *)m[i] > slab && (const char *)m[i] < slab + 256 * 1024);
    }
    size_t after = resident_pages(slab, 256 * 1024);
    assert_true(after > before && after <= before + 8); /* 201 x 128 bytes: 7 pages */
    for (int i = 0; i < 200; i++)
        tr__pool_free(p, m[i]);
    tr__pool_free(p, first);
    tr__pool_set_destroy(set);
}

/* tr__pool_prefault (runtime start-up): the slab a new pool takes next is in memory, the
 * first 64 KiB of it, even one a closed set left in the cache (the test before's) with only
 * the pages its messages used. */
static void test_pool_prefaulted_slab_is_resident(void **state)
{
    (void)state;
    tr__pool_prefault(2);
    tr__pool_set_t *set = tr__pool_set_create();
    tr__pool_t *p = tr__pool_get(set);
    tr_msg_t *first = tr__pool_alloc(p, 0);
    assert_non_null(first);
    const char *slab = (const char *)first - 128;
    assert_int_equal(resident_pages(slab, 64 * 1024), 16);
    tr__pool_free(p, first);
    tr__pool_set_destroy(set);
}

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

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
    return x < y ? -1 : x > y;
}

/* Messages of three size classes, freed by another thread in an order that keeps evicting
 * its batches (the classes alternate), and a count that leaves partial batches for the
 * flush: every one comes back to the owner, once. The owner allocates a class until it has
 * to carve a new slab: by then it must have handed out each returned address, and no
 * address twice. */
#define MIXED      999
#define MAX_CARVED 4096
static size_t mixed_sizes[3] = {16, 300, 3000};
static tr_msg_t *mixed[MIXED];

static void *free_mixed_elsewhere(void *arg)
{
    (void)arg;
    tr__pool_t *mine = tr__pool_get(shared_set);
    for (int i = 0; i < MIXED; i++)
        tr__pool_free(mine, mixed[i]);
    tr__pool_flush(mine);
    return NULL;
}

static bool contains(tr_msg_t **sorted, size_t n, tr_msg_t *m)
{
    return bsearch(&m, sorted, n, sizeof(*sorted), cmp_ptr) != NULL;
}

static void test_pool_remote_frees_of_mixed_classes_return_exactly(void **state)
{
    (void)state;
    shared_set = tr__pool_set_create();
    tr__pool_t *p = tr__pool_get(shared_set);
    for (int i = 0; i < MIXED; i++)
        mixed[i] = tr__pool_alloc(p, mixed_sizes[i % 3]);
    pthread_t t;
    pthread_create(&t, NULL, free_mixed_elsewhere, NULL);
    pthread_join(t, NULL);
    static tr_msg_t *got[MAX_CARVED];
    for (int c = 0; c < 3; c++) {
        size_t n = 0, bytes = tr__pool_set_bytes(shared_set);
        for (;;) {
            tr_msg_t *m = tr__pool_alloc(p, mixed_sizes[c]);
            assert_non_null(m);
            memset(tr_msg_body(m), 0xcd, mixed_sizes[c]); /* ASan: all of it usable */
            if (tr__pool_set_bytes(shared_set) != bytes)
                break; /* a new slab: everything free before it was handed out */
            assert_true(n < MAX_CARVED);
            got[n++] = m;
        }
        qsort(got, n, sizeof(got[0]), cmp_ptr);
        for (size_t i = 1; i < n; i++)
            assert_ptr_not_equal(got[i - 1], got[i]);
        for (int i = c; i < MIXED; i += 3)
            assert_true(contains(got, n, mixed[i]));
    }
    tr__pool_set_destroy(shared_set);
}

/* Stress: one thread allocates and hands messages over a ring to another, which checks that
 * each is exclusively its own (a stamp nobody else wrote) and frees it back; the owner keeps
 * reusing what comes back. A chunk handed out twice while live breaks a stamp. */
#define STRESS_MSGS 400000
#define RING        256
static _Atomic(tr_msg_t *) ring[RING];
static _Atomic uint64_t bad_stamps;

static void *stress_consumer(void *arg)
{
    (void)arg;
    tr__pool_t *mine = tr__pool_get(shared_set);
    for (uint64_t i = 0; i < STRESS_MSGS; i++) {
        tr_msg_t *m;
        while (!(m = atomic_exchange_explicit(&ring[i % RING], NULL, memory_order_acquire)))
            ;
        uint64_t stamp;
        memcpy(&stamp, tr_msg_body(m), sizeof(stamp));
        if (stamp != i || m->seq != i)
            atomic_fetch_add_explicit(&bad_stamps, 1, memory_order_relaxed);
        tr__pool_free(mine, m);
    }
    tr__pool_flush(mine);
    return NULL;
}

static void test_pool_stress_cross_thread_reuse(void **state)
{
    (void)state;
    unsigned seed = (unsigned)time(NULL);
    printf("pool stress seed %u\n", seed);
    srand(seed);
    shared_set = tr__pool_set_create();
    tr__pool_t *p = tr__pool_get(shared_set);
    pthread_t t;
    pthread_create(&t, NULL, stress_consumer, NULL);
    for (uint64_t i = 0; i < STRESS_MSGS; i++) {
        size_t size = (size_t)(rand() % 3 == 0 ? 200 : 8);
        tr_msg_t *m = tr__pool_alloc(p, size);
        assert_non_null(m);
        memcpy(tr_msg_body(m), &i, sizeof(i));
        m->seq = i;
        while (atomic_load_explicit(&ring[i % RING], memory_order_relaxed))
            ;
        atomic_store_explicit(&ring[i % RING], m, memory_order_release);
    }
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&bad_stamps), 0);
    /* the steady state reused returned memory: far fewer slabs than messages sent */
    assert_true(tr__pool_set_bytes(shared_set) < (size_t)STRESS_MSGS * 128 / 8);
    tr__pool_set_destroy(shared_set);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_new_slab_is_touched_as_used),
        cmocka_unit_test(test_pool_prefaulted_slab_is_resident),
        cmocka_unit_test(test_pool_alloc_gives_requested_capacity),
        cmocka_unit_test(test_pool_free_then_alloc_reuses_memory),
        cmocka_unit_test(test_pool_remote_frees_come_back_to_owner),
        cmocka_unit_test(test_pool_remote_frees_of_mixed_classes_return_exactly),
        cmocka_unit_test(test_pool_stress_cross_thread_reuse),
    };
    return cmocka_run_group_tests_name("pool", tests, NULL, NULL);
}
