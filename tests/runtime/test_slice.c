/* The time slice the runtime's threads ask Linux for (opts.slice_us, opts.kernel_slice;
 * runtime/threads.c). A behaviour reads its own thread's slice with sched_getattr, on a worker
 * and on a pinned actor's thread, and so does a thread it starts. Kernels before 6.12 report
 * no slice for ordinary threads: there the values are not checked, only that the runtime
 * runs. Options out of range fail tr_runtime_init with a line naming them. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe.h"

typedef struct attr48 {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
} attr48_t;

/* The calling thread's slice in ns as the kernel reports it; 0 when it reports none. */
static uint64_t my_slice(void)
{
    attr48_t a = {0};
    assert_int_equal(syscall(SYS_sched_getattr, 0, &a, sizeof(a), 0), 0);
    return a.runtime;
}

typedef struct probe {
    uint64_t slice;       /* the behaviour's thread's */
    uint64_t child_slice; /* a thread the behaviour started */
} probe_t;

static void *child(void *arg)
{
    *(uint64_t *)arg = my_slice();
    return NULL;
}

static int probe_once(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    probe_t *p = ctx->state;
    p->slice = my_slice();
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, child, &p->child_slice), 0);
    pthread_join(t, NULL);
    return tr_actor_stop(ctx->rt, ctx->self);
}

/* Runs one probe actor (pinned or not) in a runtime made with opts. */
static probe_t run_probe(const tr_runtime_opts_t *opts, int pinned)
{
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, opts), 0);
    probe_t p = {0};
    tr_actor_t a;
    tr_actor_opts_t ao = {.pinned = pinned};
    assert_int_equal(tr_actor_spawn(rt, probe_once, &p, &ao, &a), 0);
    assert_int_equal(tr_actor_send(rt, a, tr_msg_alloc(rt, TR_MSG_USER, 0)), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
    return p;
}

static void default_slice_on_workers_and_pinned(void **state)
{
    (void)state;
    uint64_t kernel = my_slice(); /* this thread is the test's own: the kernel's default */
    for (int pinned = 0; pinned <= 1; pinned++) {
        probe_t p = run_probe(NULL, pinned);
        if (!kernel) continue; /* a kernel before 6.12: nothing to read */
        assert_int_equal(p.slice, 100000);
        assert_int_equal(p.child_slice, kernel); /* a behaviour's threads get the kernel's */
    }
    assert_int_equal(my_slice(), kernel); /* the caller's thread is left alone */
}

static void chosen_and_kernel_slice(void **state)
{
    (void)state;
    uint64_t kernel = my_slice();
    probe_t p = run_probe(&(tr_runtime_opts_t){.n_workers = 1, .slice_us = 2500}, 0);
    if (kernel) assert_int_equal(p.slice, 2500000);
    p = run_probe(&(tr_runtime_opts_t){.n_workers = 1, .kernel_slice = 1}, 0);
    if (kernel) assert_int_equal(p.slice, kernel);
}

static void bad_options_named(void **state)
{
    (void)state;
    static const struct {
        tr_runtime_opts_t o;
        const char *says;
    } bad[] = {
        {{.slice_us = 50}, "slice_us is 50: expected 100 to 100000"},
        {{.slice_us = 100001}, "slice_us is 100001: expected 100 to 100000"},
        {{.slice_us = 100, .kernel_slice = 1}, "slice_us is 100 and kernel_slice is set"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tr_runtime_t *rt = (tr_runtime_t *)&rt; /* must come back NULL */
        assert_int_equal(tr_runtime_init(&rt, &bad[i].o), TR_EINVAL);
        assert_null(rt);
        assert_non_null(strstr(tr_last_error(), bad[i].says));
    }
    tr_runtime_t *rt; /* the bounds themselves are fine */
    assert_int_equal(tr_runtime_init(&rt, &(tr_runtime_opts_t){.slice_us = 100000}), 0);
    tr_runtime_close(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(default_slice_on_workers_and_pinned),
        cmocka_unit_test(chosen_and_kernel_slice),
        cmocka_unit_test(bad_options_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
