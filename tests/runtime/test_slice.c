/* The time slice the runtime's threads ask Linux for (opts.slice_us, opts.kernel_slice;
 * runtime/core/threads.c), and their names. A behaviour reads its own thread's slice with
 * sched_getattr, on a worker and on a pinned actor's thread, the loop thread's (found by its
 * name), and that of a thread it starts. Where threads cannot choose a slice (a kernel before
 * 6.12, a seccomp filter, a real-time or idle policy) those tests skip. Options out of range
 * fail tr_runtime_init with a line naming them, everywhere. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>

#include "thread_testing.h"
#include "troupe.h"

typedef struct attr48 {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
} attr48_t;

/* tid's slice in ns as the kernel reports it (0: none reported); UINT64_MAX when the call is
 * refused. */
static uint64_t slice_of(pid_t tid)
{
    attr48_t a = {0};
    if (syscall(SYS_sched_getattr, tid, &a, sizeof(a), 0) != 0) return UINT64_MAX;
    return a.runtime;
}

static void *try_slice(void *arg)
{
    attr48_t a = {0};
    *(int *)arg = 0;
    if (syscall(SYS_sched_getattr, 0, &a, sizeof(a), 0) != 0 ||
        (a.policy != SCHED_OTHER && a.policy != SCHED_BATCH))
        return NULL;
    a.runtime = 100000;
    a.size = sizeof(a);
    a.flags = 0;
    *(int *)arg = syscall(SYS_sched_setattr, 0, &a, 0) == 0 && slice_of(0) == 100000;
    return NULL;
}

/* Whether a thread of this process can ask for a slice and read it back: Linux 6.12 or later,
 * an ordinary policy, no seccomp filter refusing the calls. Tried on a scratch thread. */
static int slices_work(void)
{
    int ok = 0;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, try_slice, &ok), 0);
    pthread_join(t, NULL);
    if (!ok) print_message("this kernel or sandbox gives threads no slice of their choosing\n");
    return ok;
}

/* The slice of the process's thread named name, which must exist, once. */
static uint64_t named_slice(const char *name)
{
    return slice_of(tid_named(name));
}

typedef struct probe {
    uint64_t slice;       /* the behaviour's thread's */
    uint64_t child_slice; /* a thread the behaviour started */
    uint64_t loop_slice;  /* the loop thread's */
} probe_t;

static void *child(void *arg)
{
    *(uint64_t *)arg = slice_of(0);
    return NULL;
}

static int probe_once(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    probe_t *p = ctx->state;
    p->slice = slice_of(0);
    /* the loop thread asks for its slice when it starts, which may be after this runs */
    for (int i = 0; i < 2000 && (p->loop_slice = named_slice("tr-loop")) != p->slice; i++)
        usleep(1000);
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
    named_slice("tr-worker-0"); /* the runtime's threads are named */
    probe_t p = {0};
    tr_actor_t a;
    tr_actor_opts_t ao = {.pinned = pinned, .name = "probe"};
    assert_int_equal(tr_actor_spawn(rt, probe_once, &p, &ao, &a), 0);
    if (pinned) named_slice("tr-pin-probe");
    assert_int_equal(tr_actor_send(rt, a, tr_msg_alloc(rt, TR_MSG_USER, 0)), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
    return p;
}

static void default_slice_everywhere(void **state)
{
    (void)state;
    if (!slices_work()) skip();
    uint64_t mine = slice_of(0);
    for (int pinned = 0; pinned <= 1; pinned++) {
        probe_t p = run_probe(NULL, pinned);
        assert_int_equal(p.slice, 100000);
        assert_int_equal(p.loop_slice, 100000);
        assert_int_equal(p.child_slice, 100000); /* Linux: a thread inherits its creator's */
    }
    assert_int_equal(slice_of(0), mine); /* the caller's thread is left alone */
}

static void chosen_and_kernel_slice(void **state)
{
    (void)state;
    if (!slices_work()) skip();
    probe_t p = run_probe(&(tr_runtime_opts_t){.n_workers = 1, .slice_us = 2500}, 0);
    assert_int_equal(p.slice, 2500000);
    assert_int_equal(p.loop_slice, 2500000);
    p = run_probe(&(tr_runtime_opts_t){.n_workers = 1, .kernel_slice = 1}, 0);
    assert_int_equal(p.slice, slice_of(0)); /* what the creating thread, this one, has */
    assert_int_equal(p.loop_slice, slice_of(0));
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
        cmocka_unit_test(default_slice_everywhere),
        cmocka_unit_test(chosen_and_kernel_slice),
        cmocka_unit_test(bad_options_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
