/* The kernels' thread pool and the process's budget of compute threads: every item handled
 * exactly once; concurrent callers all complete, correctly, never more chunk functions
 * running at once than the budget; a caller arriving while another job runs gets the free
 * threads, and a busy budget is shared between jobs instead of serving one job to its end;
 * threads taken for other libraries count against the same budget; nested calls finish. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "kernels/cpu/parallel.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Spins until *flag >= want or `secs` pass; returns whether it got there. */
static int wait_for(atomic_int *flag, int want, double secs)
{
    double end = now() + secs;
    while (atomic_load(flag) < want) {
        if (now() > end) return 0;
        sched_yield();
    }
    return 1;
}

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
    tr_parallel_set_threads(0);
    tr_parallel_shutdown();
}

static void nested(void *ctx, size_t begin, size_t end, int thread)
{
    /* a nested call must not deadlock: it runs serially on this thread's slot */
    tr_parallel_for(end - begin, 1, count_items, (unsigned char *)ctx + begin);
}

static void test_parallel_nested_call_runs_serially(void **state)
{
    tr_parallel_set_threads(2);
    unsigned char hits[4096] = {0};
    tr_parallel_for(sizeof(hits), 64, nested, hits);
    for (size_t i = 0; i < sizeof(hits); i++)
        assert_int_equal(hits[i], 1);
    tr_parallel_set_threads(0);
    tr_parallel_shutdown();
}

/* ---- concurrent callers -------------------------------------------------------------- */

static atomic_int inside, most_inside;

/* Counts the chunk functions running at once (process-wide), then fills out[i] = i * k. */
typedef struct {
    uint32_t *out;
    uint32_t k;
    int nest; /* every chunk makes a nested call for its second half */
} fill_t;

static void fill_part(void *ctx, size_t begin, size_t end, int thread)
{
    fill_t *f = ctx;
    for (size_t i = begin; i < end; i++)
        f->out[i] = (uint32_t)i * f->k;
}

static void fill(void *ctx, size_t begin, size_t end, int thread)
{
    fill_t *f = ctx;
    int in = atomic_fetch_add(&inside, 1) + 1, seen = atomic_load(&most_inside);
    while (in > seen && !atomic_compare_exchange_weak(&most_inside, &seen, in)) {
    }
    sched_yield(); /* widen the window in which others could be inside too */
    size_t mid = f->nest ? begin + (end - begin) / 2 : end;
    fill_part(f, begin, mid, thread);
    if (mid < end) {
        fill_t sub = {f->out + mid, f->k, 0};
        /* the nested job's items are 0-based: shift k·mid back in */
        tr_parallel_for(end - mid, 1, fill_part, &sub);
        for (size_t i = mid; i < end; i++)
            f->out[i] += (uint32_t)mid * f->k;
    }
    atomic_fetch_sub(&inside, 1);
}

typedef struct {
    uint64_t seed;
    int bad;
} caller_t;

static void *caller_main(void *arg)
{
    caller_t *c = arg;
    for (int rep = 0; rep < 150; rep++) {
        c->seed = c->seed * 6364136223846793005ull + 1442695040888963407ull;
        size_t n = 1 + (c->seed >> 33) % 20000, grain = 1 + (c->seed >> 20) % 300;
        uint32_t *out = calloc(n, sizeof(uint32_t));
        fill_t f = {out, (uint32_t)(c->seed >> 50) | 1, rep % 3 == 0};
        tr_parallel_for(n, grain, fill, &f);
        for (size_t i = 0; i < n; i++)
            if (out[i] != (uint32_t)i * f.k) c->bad++;
        free(out);
    }
    return NULL;
}

static void test_parallel_concurrent_callers_complete_within_the_budget(void **state)
{
    enum { CALLERS = 4, BUDGET = 3 };
    tr_parallel_set_threads(BUDGET);
    tr_parallel_stats_t st;
    tr_parallel_stats(&st, 1);
    atomic_store(&most_inside, 0);
    pthread_t th[CALLERS];
    caller_t c[CALLERS];
    for (int i = 0; i < CALLERS; i++) {
        c[i] = (caller_t){.seed = 1000u + (uint64_t)i};
        pthread_create(&th[i], NULL, caller_main, &c[i]);
    }
    for (int i = 0; i < CALLERS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(c[i].bad, 0);
    }
    assert_true(atomic_load(&most_inside) <= BUDGET);
    tr_parallel_stats(&st, 0);
    assert_true(st.peak_running <= BUDGET);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.jobs, 0);
    tr_parallel_set_threads(0);
    tr_parallel_shutdown();
}

/* Job A holds two of four threads (its chunks wait for `release`); job B, started meanwhile
 * from another thread, must get more than its caller: a chunk of B waits (up to 10 s) for a
 * second thread to enter B before it returns. */
static atomic_int a_inside, a_release, b_inside;

static void hold(void *ctx, size_t begin, size_t end, int thread)
{
    atomic_fetch_add(&a_inside, 1);
    wait_for(&a_release, 1, 20.0);
}

static void want_company(void *ctx, size_t begin, size_t end, int thread)
{
    atomic_fetch_add(&b_inside, 1);
    wait_for(&b_inside, 2, 10.0);
}

static void *run_hold(void *arg)
{
    tr_parallel_for(2, 1, hold, NULL);
    tr_parallel_last_job(arg);
    return NULL;
}

static void test_parallel_caller_arriving_during_a_job_gets_free_threads(void **state)
{
    tr_parallel_set_threads(4);
    atomic_store(&a_inside, 0);
    atomic_store(&a_release, 0);
    atomic_store(&b_inside, 0);
    tr_parallel_job_info_t a = {0}, b = {0};
    pthread_t th;
    pthread_create(&th, NULL, run_hold, &a);
    assert_true(wait_for(&a_inside, 2, 10.0));
    tr_parallel_for(64, 1, want_company, NULL);
    tr_parallel_last_job(&b);
    atomic_store(&a_release, 1);
    pthread_join(th, NULL);
    assert_int_equal(a.threads, 2);
    assert_true(b.threads >= 2);
    assert_int_equal(b.waited, 0);
    tr_parallel_set_threads(0);
    tr_parallel_shutdown();
}

/* Budget 2, job A alone on both threads, each of its 8 chunks spinning up to 200 ms unless B
 * has run. B arrives: it must get a thread at A's next chunk boundary (A yields one), not
 * after A's last chunk; so at most a few of A's chunks spin their full time. */
static atomic_int b_ran, a_long_chunks;

static void slow_until_b(void *ctx, size_t begin, size_t end, int thread)
{
    atomic_fetch_add(&a_inside, 1);
    if (!wait_for(&b_ran, 1, 0.2)) atomic_fetch_add(&a_long_chunks, 1);
}

static void mark_b(void *ctx, size_t begin, size_t end, int thread)
{
    atomic_store(&b_ran, 1);
}

static void *run_slow(void *arg)
{
    tr_parallel_for(8, 1, slow_until_b, NULL);
    return NULL;
}

static void test_parallel_busy_budget_is_shared_not_served_in_turn(void **state)
{
    tr_parallel_set_threads(2);
    atomic_store(&a_inside, 0);
    atomic_store(&b_ran, 0);
    atomic_store(&a_long_chunks, 0);
    pthread_t th;
    pthread_create(&th, NULL, run_slow, NULL);
    assert_true(wait_for(&a_inside, 2, 10.0));
    tr_parallel_for(1, 1, mark_b, NULL);
    tr_parallel_job_info_t b;
    tr_parallel_last_job(&b);
    pthread_join(th, NULL);
    assert_int_equal(b.waited, 1);
    assert_true(atomic_load(&a_long_chunks) <= 4); /* served in turn: all 8 */
    tr_parallel_set_threads(0);
    tr_parallel_shutdown();
}

/* ---- threads for other libraries ----------------------------------------------------- */

static atomic_int released;

static void *hold_all_then_release(void *arg)
{
    int got = tr_parallel_acquire(3);
    *(int *)arg = got;
    atomic_store(&a_inside, 1);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    atomic_store(&released, 1);
    tr_parallel_release(got);
    return NULL;
}

static void acquire_inside(void *ctx, size_t begin, size_t end, int thread)
{
    int got = tr_parallel_acquire(8);
    *(int *)ctx = got;
    tr_parallel_release(got);
}

static unsigned char hits5k[5000];

static void *run_count(void *arg)
{
    tr_parallel_for(sizeof(hits5k), 1, count_items, hits5k);
    tr_parallel_last_job(arg);
    return NULL;
}

static void test_parallel_acquired_threads_count_against_the_budget(void **state)
{
    tr_parallel_set_threads(3);
    assert_int_equal(tr_parallel_acquire(2), 2);
    tr_parallel_stats_t st;
    tr_parallel_stats(&st, 0);
    assert_int_equal(st.running, 2);
    /* a job from another thread (the acquiring thread is one of its acquired threads) */
    tr_parallel_job_info_t info = {0};
    pthread_t th;
    pthread_create(&th, NULL, run_count, &info);
    pthread_join(th, NULL);
    assert_int_equal(info.threads, 1); /* 3 - 2 acquired */
    assert_int_equal(info.chunks, 12);
    for (size_t i = 0; i < sizeof(hits5k); i++)
        assert_int_equal(hits5k[i], 1);
    tr_parallel_release(2);

    /* inside a chunk its own slot counts: a one-chunk job leaves 2 free, so 3 in all */
    int inside_got = 0;
    tr_parallel_for(1, 1, acquire_inside, &inside_got);
    assert_int_equal(inside_got, 3);

    /* the whole budget taken elsewhere: acquire waits for it to come back */
    int other = 0;
    atomic_store(&a_inside, 0);
    atomic_store(&released, 0);
    pthread_create(&th, NULL, hold_all_then_release, &other);
    assert_true(wait_for(&a_inside, 1, 10.0));
    int got = tr_parallel_acquire(1);
    assert_int_equal(atomic_load(&released), 1);
    assert_int_equal(got, 1);
    tr_parallel_release(got);
    pthread_join(th, NULL);
    assert_int_equal(other, 3);
    tr_parallel_stats(&st, 0);
    assert_int_equal(st.running, 0);
    tr_parallel_set_threads(0);
    tr_parallel_shutdown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parallel_for_covers_every_item_once),
        cmocka_unit_test(test_parallel_nested_call_runs_serially),
        cmocka_unit_test(test_parallel_concurrent_callers_complete_within_the_budget),
        cmocka_unit_test(test_parallel_caller_arriving_during_a_job_gets_free_threads),
        cmocka_unit_test(test_parallel_busy_budget_is_shared_not_served_in_turn),
        cmocka_unit_test(test_parallel_acquired_threads_count_against_the_budget),
    };
    return cmocka_run_group_tests_name("parallel", tests, NULL, NULL);
}
