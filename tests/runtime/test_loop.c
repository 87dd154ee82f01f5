/* The loop thread: timers fire within 2 ms of their deadline, repeat and stop; a watched
 * file descriptor produces one message per readiness; SIGINT gives a graceful stop. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/core/internal.h" /* tr__timer_next_arm */
#include "troupe.h"

#define MS 1000000ull

typedef struct timer_state {
    int64_t worst_fire_late_ns; /* the loop thread's send vs the deadline: the timer itself */
    int64_t worst_late_ns, worst_early_ns; /* the handler's start vs the deadline */
    int fired[6];
    uint64_t repeat_id;
    int done;
} timer_state_t;

static int timer_actor(tr_ctx_t *ctx, tr_msg_t *msg)
{
    timer_state_t *s = ctx->state;
    if (msg->type != TR_MSG_TIMER) return 0;
    tr_msg_timer_t *t = TR_MSG_AS(msg, timer);
    int64_t late = (int64_t)(tr_now_ns() - t->deadline_ns);
    int64_t fire_late = (int64_t)(t->fired_ns - t->deadline_ns);
    if (fire_late > s->worst_fire_late_ns) s->worst_fire_late_ns = fire_late;
    if (late > s->worst_late_ns) s->worst_late_ns = late;
    if (-late > s->worst_early_ns) s->worst_early_ns = -late;
    s->fired[t->tag]++;
    if (t->tag == 3 && t->count == 5) tr_timer_stop(ctx->rt, s->repeat_id);
    if (s->fired[0] == 1 && s->fired[1] == 1 && s->fired[2] == 1 && s->fired[3] == 5 && !s->done++)
        return tr_actor_stop(ctx->rt, ctx->self);
    return 0;
}

/* Under a sanitizer every instruction costs several times more, and the loop thread's first
 * wake-ups pay for shadow memory: the lateness bounds there are 25 times looser (measured
 * under TSan on a 2-vCPU VM: 1.2-10.5 ms usually, 23 ms once in a CI run; the ordering and
 * never-early checks stay exact). */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__) /* gcc */
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer) /* clang */
#define SANITIZED 1
#endif
#endif
#ifdef SANITIZED
#define SLACK 25
#else
#define SLACK 1
#endif

/* One run of four timers (three one-shots, one repeating five times), beside two whose
 * times do not fit in 64 bits of nanoseconds from now: a timeout (tag 4) and a repeat after a
 * first firing (tag 5). They fire never and once: the sums saturate instead of wrapping
 * round to a deadline in the past. */
static void run_timers(timer_state_t *s)
{
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, NULL), 0);
    tr_actor_t a;
    assert_int_equal(tr_actor_spawn(rt, timer_actor, s, NULL, &a), 0);
    uint64_t id[3];
    assert_int_equal(tr_timer_start(rt, a, 0, 5 * MS, 0, &id[0]), 0);
    assert_int_equal(tr_timer_start(rt, a, 1, 20 * MS, 0, &id[1]), 0);
    assert_int_equal(tr_timer_start(rt, a, 2, 37 * MS, 0, &id[2]), 0);
    assert_int_equal(tr_timer_start(rt, a, 3, 10 * MS, 10 * MS, &s->repeat_id), 0);
    uint64_t far[2];
    assert_int_equal(tr_timer_start(rt, a, 4, UINT64_MAX - 1000, 0, &far[0]), 0);
    assert_int_equal(tr_timer_start(rt, a, 5, 1 * MS, UINT64_MAX - 1000, &far[1]), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    printf("timers: fired at most %.3f ms late; handlers started at most %.3f ms late, "
           "%.3f ms early\n",
           s->worst_fire_late_ns / 1e6, s->worst_late_ns / 1e6, s->worst_early_ns / 1e6);
    assert_true(s->worst_early_ns <= 0); /* never before the deadline */
    assert_int_equal(s->fired[3], 5);    /* stopped after the fifth */
    assert_int_equal(s->fired[4], 0);
    assert_int_equal(s->fired[5], 1);
    assert_int_equal(tr_timer_stop(rt, id[0]), TR_ENOENT); /* one-shot: already gone */
    tr_runtime_close(rt);
}

/* Lateness is the runtime's when the machine lets it run: a VM's host may take a core away
 * for a few milliseconds now and then (seen: 3 ms once in a few dozen runs), so the bound
 * must hold in one of three runs; ordering, never-early and counts hold in every run. */
static void test_loop_timers_fire_within_2ms(void **state)
{
    (void)state;
    bool met = false;
    for (int attempt = 0; attempt < 3 && !met; attempt++) {
        timer_state_t s = {0};
        run_timers(&s);
        /* the handler also waits for a worker to be scheduled by the OS */
        met = s.worst_fire_late_ns < (int64_t)(2 * MS * SLACK) &&
              s.worst_late_ns < (int64_t)(5 * MS * SLACK);
    }
    assert_true(met);
}

static int ignore_actor(tr_ctx_t *ctx, tr_msg_t *msg)
{
    (void)ctx;
    (void)msg;
    return 0;
}

/* Each misuse returns its code and leaves a line naming the call and what was wrong. */
static void expect_error(int rc, int want, const char *needle)
{
    assert_int_equal(rc, want);
    if (!strstr(tr_last_error(), needle))
        fail_msg("tr_last_error() is \"%s\", expected it to contain \"%s\"", tr_last_error(),
                 needle);
}

static void test_loop_misuse_says_what_was_wrong(void **state)
{
    (void)state;
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, NULL), 0);
    tr_actor_t a, gone = {.id = 7 | (9ull << 32)};
    assert_int_equal(tr_actor_spawn(rt, ignore_actor, NULL, NULL, &a), 0);
    uint64_t id, timer, watch;
    int fd = eventfd(0, EFD_NONBLOCK);
    assert_true(fd >= 0);
    expect_error(tr_timer_start(rt, a, 0, MS, 0, NULL), TR_EINVAL, "tr_timer_start: timer_id");
    expect_error(tr_timer_start(NULL, a, 0, MS, 0, &id), TR_EINVAL, "tr_timer_start: rt");
    expect_error(tr_timer_start(rt, gone, 0, MS, 0, &id), TR_ENOACTOR, "actor #7");
    expect_error(tr_timer_stop(rt, 12345), TR_ENOENT, "tr_timer_stop: no live timer has id 12345");
    expect_error(tr_timer_stop(NULL, 1), TR_EINVAL, "tr_timer_stop: rt is NULL");
    expect_error(tr_poll_start(rt, -1, TR_POLL_READABLE, a, 0, &id), TR_EINVAL, "fd -1");
    expect_error(tr_poll_start(rt, fd, 0, a, 0, &id), TR_EINVAL, "events 0x0");
    expect_error(tr_poll_start(rt, fd, TR_POLL_READABLE, a, 0, NULL), TR_EINVAL, "poll_id");
    expect_error(tr_poll_start(rt, fd, TR_POLL_READABLE, gone, 0, &id), TR_ENOACTOR,
                 "tr_poll_start: actor #7");
    expect_error(tr_poll_resume(rt, 99), TR_ENOENT, "tr_poll_resume: no live poll has id 99");
    expect_error(tr_poll_stop(rt, 99), TR_ENOENT, "tr_poll_stop: no live poll has id 99");
    /* timers and watches share one id space; each call takes only its own kind */
    assert_int_equal(tr_timer_start(rt, a, 0, 60000 * MS, 0, &timer), 0);
    assert_int_equal(tr_poll_start(rt, fd, TR_POLL_READABLE, a, 0, &watch), 0);
    expect_error(tr_timer_stop(rt, watch), TR_ENOENT, "no live timer");
    expect_error(tr_poll_resume(rt, timer), TR_ENOENT, "no live poll");
    expect_error(tr_poll_stop(rt, timer), TR_ENOENT, "no live poll");
    assert_int_equal(tr_timer_stop(rt, timer), 0);
    expect_error(tr_timer_stop(rt, timer), TR_ENOENT, "no live timer"); /* stopped once */
    assert_int_equal(tr_poll_stop(rt, watch), 0);
    assert_int_equal(tr_actor_stop(rt, a), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
    close(fd);
}

/* A cleanup that runs at close, after the loop thread has stopped, gets TR_ESHUTDOWN from
 * every loop call instead of a crash. */
static int closing_rc[3];

static void stop_timer_at_cleanup(tr_ctx_t *ctx, int reason)
{
    (void)reason;
    uint64_t id;
    closing_rc[0] = tr_timer_stop(ctx->rt, 1);
    closing_rc[1] = tr_timer_start(ctx->rt, ctx->self, 0, MS, 0, &id);
    closing_rc[2] = tr_poll_stop(ctx->rt, 2);
}

static void test_loop_calls_from_a_cleanup_at_close_are_refused(void **state)
{
    (void)state;
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, NULL), 0);
    tr_actor_t a;
    tr_actor_opts_t o = {.cleanup = stop_timer_at_cleanup};
    assert_int_equal(tr_actor_spawn(rt, ignore_actor, NULL, &o, &a), 0);
    tr_runtime_close(rt); /* never run: the actor is still alive and is cleaned up here */
    for (int i = 0; i < 3; i++)
        assert_int_equal(closing_rc[i], TR_ESHUTDOWN);
}

/* A timer an actor re-arms from its own behaviour, many times over: each firing arrives once
 * (count 1, the id its start returned), in order, never early; one stopped before its
 * deadline never fires (it would, five timeouts later, were the stop lost). */
typedef struct rearm_state {
    uint64_t timeout_ns, last_deadline, late_ns[200], id;
    int fired, early, out_of_order, stopped_fired, stopped_late, wrong;
} rearm_state_t;

static int rearm_actor(tr_ctx_t *ctx, tr_msg_t *msg)
{
    rearm_state_t *s = ctx->state;
    if (msg->type != TR_MSG_TIMER) return 0;
    tr_msg_timer_t *t = TR_MSG_AS(msg, timer);
    if (t->tag == 1) {
        s->stopped_fired++;
        return 0;
    }
    uint64_t now = tr_now_ns();
    s->early += now < t->deadline_ns;
    s->out_of_order += t->deadline_ns < s->last_deadline;
    s->last_deadline = t->deadline_ns;
    s->late_ns[s->fired] = now - t->deadline_ns;
    s->wrong += t->count != 1 || (s->id && t->timer_id != s->id);
    if (++s->fired == 200) return tr_actor_stop(ctx->rt, ctx->self);
    uint64_t doomed;
    int rc = tr_timer_start(ctx->rt, ctx->self, 1, 5 * s->timeout_ns, 0, &doomed);
    if (rc == 0 && (rc = tr_timer_stop(ctx->rt, doomed)) == TR_ENOENT) {
        s->stopped_late++; /* it fired before the stop: this thread was preempted */
        rc = 0;
    }
    if (rc == 0) rc = tr_timer_start(ctx->rt, ctx->self, 0, s->timeout_ns, 0, &s->id);
    return rc;
}

/* A firing arms the timerfd for its receiver's next start (loop.c's design block): after the
 * firing, so that a receiver restarting the same timeout finds it armed and makes no system
 * call, and no later than that restart's deadline, so that it never fires late. Also when
 * the firing came later than its timeout (a VM's host delays some by milliseconds): the
 * one-shot's deadline plus its timeout is then in the past, and the restart made the call. */
static void test_loop_firing_arms_for_the_next_start(void **state)
{
    (void)state;
    const uint64_t deadline = 1000 * MS;
    for (uint64_t late = 0; late <= 3 * MS; late += MS / 2) {
        uint64_t now = deadline + late, at = tr__timer_next_arm(deadline, 0, MS, now);
        assert_true(at > now);       /* armed for the future: the restart makes no call */
        assert_true(at <= now + MS); /* a restart after now: its deadline is now + 1 ms or later */
    }
    assert_int_equal(tr__timer_next_arm(deadline, 0, MS / 20, deadline), 0); /* 50 us: too short */
    assert_int_equal(tr__timer_next_arm(deadline, MS, 0, deadline), deadline + MS); /* a repeat */
    assert_int_equal(tr__timer_next_arm(deadline, 0, UINT64_MAX, deadline), UINT64_MAX); /* never */
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void test_loop_timers_rearmed_by_an_actor(void **state)
{
    (void)state;
    static const uint64_t timeouts[] = {20000, MS};
    for (int i = 0; i < 2; i++) {
        tr_runtime_t *rt;
        assert_int_equal(tr_runtime_init(&rt, NULL), 0);
        rearm_state_t s = {.timeout_ns = timeouts[i]};
        tr_actor_t a;
        uint64_t id;
        assert_int_equal(tr_actor_spawn(rt, rearm_actor, &s, NULL, &a), 0);
        assert_int_equal(tr_timer_start(rt, a, 0, 0, 0, &id), 0);
        assert_int_equal(tr_runtime_run(rt), 0);
        tr_runtime_close(rt);
        qsort(s.late_ns, 200, sizeof(s.late_ns[0]), cmp_u64);
        printf("re-armed %llu us timers: handled a median %.1f us after their deadline\n",
               (unsigned long long)(timeouts[i] / 1000), s.late_ns[100] / 1e3);
        assert_int_equal(s.fired, 200);
        assert_int_equal(s.early, 0);
        assert_int_equal(s.out_of_order, 0);
        /* a stop that succeeded never fires: only the late ones (this thread preempted past
         * the doomed timer's deadline, under load) may have */
        assert_true(s.stopped_fired <= s.stopped_late);
        assert_int_equal(s.wrong, 0);
        assert_true(s.late_ns[100] < MS * SLACK); /* the median; a VM's hiccups hit the tail */
    }
}

/* A watchdog: a behaviour starts a 1 ms timer for itself and hands 30 ms of work to another
 * actor, which runs next on the only worker. The timer is sent (the loop thread's firing) on
 * time; the worker handles it once the work is done. */
typedef struct watch_state {
    tr_actor_t worker;
    uint64_t deadline_ns, fired_ns;
} watch_state_t;

static int long_work(tr_ctx_t *ctx, tr_msg_t *msg)
{
    (void)msg;
    uint64_t until = tr_now_ns() + 30 * MS;
    while (tr_now_ns() < until)
        ;
    return tr_actor_stop(ctx->rt, ctx->self);
}

static int watchdog(tr_ctx_t *ctx, tr_msg_t *msg)
{
    watch_state_t *s = ctx->state;
    if (msg->type == TR_MSG_TIMER) {
        s->deadline_ns = TR_MSG_AS(msg, timer)->deadline_ns;
        s->fired_ns = TR_MSG_AS(msg, timer)->fired_ns;
        return tr_actor_stop(ctx->rt, ctx->self);
    }
    uint64_t id;
    int rc = tr_timer_start(ctx->rt, ctx->self, 0, MS, 0, &id);
    tr_msg_t *m = rc < 0 ? NULL : tr_msg_alloc(ctx->rt, TR_MSG_USER, 0);
    if (rc == 0 && !m) rc = TR_ENOMEM;
    if (rc == 0 && (rc = tr_actor_send(ctx->rt, s->worker, m)) < 0) tr_msg_free(ctx->rt, m);
    return rc;
}

static void test_loop_timer_fires_while_its_worker_computes(void **state)
{
    (void)state;
    bool met = false;
    for (int attempt = 0; attempt < 3 && !met; attempt++) { /* as above: a VM's hiccups */
        tr_runtime_t *rt;
        tr_runtime_opts_t o = {.n_workers = 1};
        assert_int_equal(tr_runtime_init(&rt, &o), 0);
        watch_state_t s = {0};
        tr_actor_t dog;
        assert_int_equal(tr_actor_spawn(rt, long_work, NULL, NULL, &s.worker), 0);
        assert_int_equal(tr_actor_spawn(rt, watchdog, &s, NULL, &dog), 0);
        tr_msg_t *m = tr_msg_alloc(rt, TR_MSG_USER, 0);
        assert_non_null(m);
        assert_int_equal(tr_actor_send(rt, dog, m), 0);
        assert_int_equal(tr_runtime_run(rt), 0);
        tr_runtime_close(rt);
        assert_true(s.deadline_ns > 0 && s.fired_ns >= s.deadline_ns);
        printf("watchdog timer: fired %.3f ms after its deadline, during the 30 ms of work\n",
               (s.fired_ns - s.deadline_ns) / 1e6);
        met = s.fired_ns - s.deadline_ns < 5 * MS * SLACK; /* 29 ms if it waited for the work */
    }
    assert_true(met);
}

typedef struct poll_state {
    int fd;
    uint64_t poll_id;
    uint64_t total;
    int messages;
} poll_state_t;

static int poll_actor(tr_ctx_t *ctx, tr_msg_t *msg)
{
    poll_state_t *s = ctx->state;
    if (msg->type != TR_MSG_POLL) return 0;
    assert_int_equal(TR_MSG_AS(msg, poll)->fd, s->fd);
    assert_true(TR_MSG_AS(msg, poll)->events & TR_POLL_READABLE);
    uint64_t v;
    assert_int_equal(read(s->fd, &v, sizeof(v)), sizeof(v));
    s->total += v;
    s->messages++;
    if (s->total == 6) {
        tr_poll_stop(ctx->rt, s->poll_id);
        return tr_actor_stop(ctx->rt, ctx->self);
    }
    return tr_poll_resume(ctx->rt, s->poll_id);
}

static void test_loop_fd_readiness_becomes_messages(void **state)
{
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, NULL), 0);
    poll_state_t s = {.fd = eventfd(0, EFD_NONBLOCK)};
    tr_actor_t a;
    assert_int_equal(tr_actor_spawn(rt, poll_actor, &s, NULL, &a), 0);
    assert_int_equal(tr_poll_start(rt, s.fd, TR_POLL_READABLE, a, 9, &s.poll_id), 0);
    for (uint64_t v = 1; v <= 3; v++) {
        assert_int_equal(write(s.fd, &v, sizeof(v)), sizeof(v));
        usleep(20000); /* one readiness at a time */
    }
    assert_int_equal(tr_runtime_run(rt), 0);
    assert_int_equal(s.total, 6);
    assert_int_equal(s.messages, 3);
    assert_int_equal(tr_poll_resume(rt, s.poll_id), TR_ENOENT);
    tr_runtime_close(rt);
    close(s.fd);
}

typedef struct stop_state {
    char reason[48];
    int saved;
} stop_state_t;

static int trainer(tr_ctx_t *ctx, tr_msg_t *msg)
{
    stop_state_t *s = ctx->state;
    if (msg->type == TR_MSG_STOP) {
        snprintf(s->reason, sizeof(s->reason), "%s", TR_MSG_AS(msg, stop)->reason);
        s->saved = 1; /* "finish the step and save" */
        return tr_actor_stop(ctx->rt, ctx->self);
    }
    return 0;
}

static void test_loop_sigint_stops_gracefully(void **state)
{
    tr_runtime_t *rt;
    tr_runtime_opts_t o = {.handle_signals = 1};
    assert_int_equal(tr_runtime_init(&rt, &o), 0);
    stop_state_t s = {{0}, 0};
    tr_actor_opts_t ao = {.defer_stop = 1};
    tr_actor_t a;
    assert_int_equal(tr_actor_spawn(rt, trainer, &s, &ao, &a), 0);
    usleep(10000);
    assert_int_equal(raise(SIGINT), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    assert_string_equal(s.reason, "SIGINT");
    assert_int_equal(s.saved, 1);
    tr_runtime_close(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loop_timers_fire_within_2ms),
        cmocka_unit_test(test_loop_fd_readiness_becomes_messages),
        cmocka_unit_test(test_loop_misuse_says_what_was_wrong),
        cmocka_unit_test(test_loop_calls_from_a_cleanup_at_close_are_refused),
        cmocka_unit_test(test_loop_timers_rearmed_by_an_actor),
        cmocka_unit_test(test_loop_firing_arms_for_the_next_start),
        cmocka_unit_test(test_loop_timer_fires_while_its_worker_computes),
        cmocka_unit_test(test_loop_sigint_stops_gracefully),
    };
    return cmocka_run_group_tests_name("loop", tests, NULL, NULL);
}
