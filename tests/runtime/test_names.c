/* Names that survive restarts: unique per runtime, found by tr_actor_lookup, reached by
 * tr_actor_send_name across a restart (in place, and pinned in a fresh slot), freed at stop. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "troupe.h"

enum { MSG_WORK = TR_MSG_USER + 20, MSG_BOOM, MSG_DONE };

static const tr_msg_desc_t descs[] = {
    {MSG_WORK, "work", "one unit of work", 0, 0, NULL},
    {MSG_BOOM, "boom", "makes a worker fail", 0, 0, NULL},
    {MSG_DONE, "done", "stops a counter", 0, 0, NULL},
};

static tr_msg_t *msg(tr_runtime_t *rt, uint32_t type)
{
    return tr_msg_alloc(rt, type, 0);
}

/* Counts MSG_WORK, fails on MSG_BOOM, stops on MSG_DONE. */
static int counter(tr_ctx_t *ctx, tr_msg_t *m)
{
    int *n = ctx->state;
    if (m->type == MSG_BOOM) return TR_EIO;
    if (m->type == MSG_DONE) return tr_actor_stop(ctx->rt, ctx->self);
    *n += m->type == MSG_WORK;
    return 0;
}

static void test_names_lookup_send_and_free_at_stop(void **state)
{
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 2}), 0);
    int n = 0;
    tr_actor_t a;
    tr_actor_opts_t o = {.name = "counter"};
    assert_int_equal(tr_actor_spawn(rt, counter, &n, &o, &a), 0);
    assert_true(tr_actor_eq(tr_actor_lookup(rt, "counter"), a));
    assert_true(tr_actor_is_none(tr_actor_lookup(rt, "count")));
    assert_true(tr_actor_is_none(tr_actor_lookup(rt, "")));
    for (int i = 0; i < 3; i++)
        assert_int_equal(tr_actor_send_name(rt, "counter", msg(rt, MSG_WORK)), 0);
    assert_int_equal(tr_actor_send_name(rt, "counter", msg(rt, MSG_DONE)), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    assert_int_equal(n, 3);
    /* stopped: the name is free, and a new actor may take it */
    assert_true(tr_actor_is_none(tr_actor_lookup(rt, "counter")));
    tr_actor_t b;
    assert_int_equal(tr_actor_spawn(rt, counter, &n, &o, &b), 0);
    assert_true(tr_actor_eq(tr_actor_lookup(rt, "counter"), b));
    assert_int_equal(tr_actor_send_name(rt, "counter", msg(rt, MSG_DONE)), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
}

static void test_names_taken_name_is_refused(void **state)
{
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 1}), 0);
    int n = 0;
    tr_actor_t a, b, c, d;
    tr_actor_opts_t o = {.name = "loader"};
    assert_int_equal(tr_actor_spawn(rt, counter, &n, &o, &a), 0);
    assert_int_equal(tr_actor_spawn(rt, counter, &n, &o, &b), TR_EEXIST);
    assert_non_null(strstr(tr_last_error(), "cannot spawn actor 'loader'"));
    assert_non_null(strstr(tr_last_error(), "taken by actor #"));
    o.pinned = 1; /* refused before any thread is made */
    assert_int_equal(tr_actor_spawn(rt, counter, &n, &o, &b), TR_EEXIST);
    /* unnamed actors are not registered: any number of them */
    assert_int_equal(tr_actor_spawn(rt, counter, &n, NULL, &c), 0);
    assert_int_equal(tr_actor_spawn(rt, counter, &n, NULL, &d), 0);
    assert_true(tr_actor_eq(tr_actor_lookup(rt, "loader"), a));
    tr_runtime_shutdown(rt, "test");
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
}

static void test_names_too_long_is_refused_not_cut(void **state)
{
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 1}), 0);
    const char *name = "a-name-of-forty-bytes-is-too-long-for-it"; /* 40 bytes */
    tr_actor_t a;
    int n = 0;
    assert_int_equal(tr_actor_spawn(rt, counter, &n, &(tr_actor_opts_t){.name = name}, &a),
                     TR_EINVAL);
    assert_non_null(strstr(tr_last_error(), "its name is 40 bytes; at most 31 fit"));
    assert_true(tr_actor_is_none(tr_actor_lookup(rt, name)));
    /* 31 bytes fit */
    const char *fits = "exactly-thirty-one-bytes-long-x";
    assert_int_equal(strlen(fits), 31);
    assert_int_equal(tr_actor_spawn(rt, counter, &n, &(tr_actor_opts_t){.name = fits}, &a), 0);
    assert_true(tr_actor_eq(tr_actor_lookup(rt, fits), a));
    assert_string_equal(tr_actor_name(rt, a), fits);
    tr_runtime_shutdown(rt, "test");
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
}

static void test_names_send_to_unknown_name_keeps_message(void **state)
{
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 1}), 0);
    tr_msg_t *m = msg(rt, MSG_WORK);
    assert_int_equal(tr_actor_send_name(rt, "ghost", m), TR_ENOACTOR);
    assert_non_null(strstr(tr_last_error(), "cannot send 'work' to actor 'ghost'"));
    tr_msg_free(rt, m); /* still the caller's */
    assert_int_equal(tr_actor_send_name(rt, NULL, NULL), TR_EINVAL);
    tr_runtime_close(rt);
}

/* --- a restarted actor is found under its name ------------------------------------------- */

typedef struct sup {
    tr_actor_t first, fresh;
    int restart_rc;
    int found_new, old_stopped, freed_at_stop, exits;
} sup_t;

/* Restarts the worker once, then talks to it by name only; when it stops normally, checks
 * that its name was freed and stops. */
static int restarter(tr_ctx_t *ctx, tr_msg_t *m)
{
    sup_t *s = ctx->state;
    if (m->type != TR_MSG_EXIT) return 0;
    tr_msg_exit_t *e = TR_MSG_AS(m, exit);
    if (++s->exits == 1) {
        s->first = e->actor;
        s->restart_rc = tr_actor_restart(ctx->rt, e->actor, &s->fresh);
        if (s->restart_rc < 0) return tr_actor_stop(ctx->rt, ctx->self);
        tr_actor_t found = tr_actor_lookup(ctx->rt, "worker");
        s->found_new = tr_actor_eq(found, s->fresh) && !tr_actor_eq(found, s->first);
        tr_msg_t *w = msg(ctx->rt, MSG_WORK);
        s->old_stopped = tr_actor_send(ctx->rt, s->first, w) == TR_ESTOPPED;
        tr_msg_free(ctx->rt, w);
        tr_actor_send_name(ctx->rt, "worker", msg(ctx->rt, MSG_WORK));
        tr_actor_send_name(ctx->rt, "worker", msg(ctx->rt, MSG_WORK));
        tr_actor_send_name(ctx->rt, "worker", msg(ctx->rt, MSG_DONE));
        return 0;
    }
    s->freed_at_stop = e->reason == 0 && tr_actor_is_none(tr_actor_lookup(ctx->rt, "worker"));
    return tr_actor_stop(ctx->rt, ctx->self);
}

static void names_follow_restart(int pinned)
{
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 2}), 0);
    sup_t s = {0};
    int n = 0;
    tr_actor_t sup, w;
    assert_int_equal(tr_actor_spawn(rt, restarter, &s, &(tr_actor_opts_t){.name = "sup"}, &sup), 0);
    tr_actor_opts_t o = {.name = "worker", .supervisor = sup, .pinned = pinned};
    assert_int_equal(tr_actor_spawn(rt, counter, &n, &o, &w), 0);
    assert_int_equal(tr_actor_send_name(rt, "worker", msg(rt, MSG_BOOM)), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    assert_int_equal(s.restart_rc, 0);
    assert_true(s.found_new);
    assert_true(s.old_stopped);
    assert_int_equal(n, 2); /* both messages sent by name reached the new generation */
    assert_true(s.freed_at_stop);
    assert_int_equal(s.exits, 2);
    tr_runtime_close(rt);
}

static void test_names_follow_a_restart(void **state)
{
    names_follow_restart(0);
}

static void test_names_follow_a_pinned_restart(void **state)
{
    names_follow_restart(1); /* a pinned actor restarts in a fresh slot */
}

int main(void)
{
    for (size_t i = 0; i < sizeof(descs) / sizeof(descs[0]); i++)
        tr_msg_type_register(&descs[i]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_lookup_send_and_free_at_stop),
        cmocka_unit_test(test_names_taken_name_is_refused),
        cmocka_unit_test(test_names_too_long_is_refused_not_cut),
        cmocka_unit_test(test_names_send_to_unknown_name_keeps_message),
        cmocka_unit_test(test_names_follow_a_restart),
        cmocka_unit_test(test_names_follow_a_pinned_restart),
    };
    return cmocka_run_group_tests_name("names", tests, NULL, NULL);
}
