/* The kernels' thread pool: every item is handled exactly once, for any size and grain. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "kernels/cpu/parallel.h"

static void count_items(void *ctx, size_t begin, size_t end, int thread)
{
    unsigned char *hits = ctx;
    assert_true(thread >= 0 && thread < tr_parallel_threads());
    for (size_t i = begin; i < end; i++)
        hits[i]++;
}

static void test_parallel_for_covers_every_item_once(void **state)
{
    size_t sizes[] = {1, 2, 3, 7, 64, 1000, 12345, 1u << 20};
    for (int threads = 1; threads <= 4; threads++) {
        tr_parallel_set_threads(threads);
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            for (size_t grain = 1; grain <= 4096; grain *= 8) {
                unsigned char *hits = calloc(sizes[s], 1);
                tr_parallel_for(sizes[s], grain, count_items, hits);
                for (size_t i = 0; i < sizes[s]; i++)
                    assert_int_equal(hits[i], 1);
                free(hits);
            }
        }
    }
    tr_parallel_shutdown();
}

static void nested(void *ctx, size_t begin, size_t end, int thread)
{
    /* a nested call must not deadlock: it runs serially */
    tr_parallel_for(end - begin, 1, count_items, (unsigned char *)ctx + begin);
}

static void test_parallel_nested_call_runs_serially(void **state)
{
    tr_parallel_set_threads(2);
    unsigned char hits[4096] = {0};
    tr_parallel_for(sizeof(hits), 64, nested, hits);
    for (size_t i = 0; i < sizeof(hits); i++)
        assert_int_equal(hits[i], 1);
    tr_parallel_shutdown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parallel_for_covers_every_item_once),
        cmocka_unit_test(test_parallel_nested_call_runs_serially),
    };
    return cmocka_run_group_tests_name("parallel", tests, NULL, NULL);
}
