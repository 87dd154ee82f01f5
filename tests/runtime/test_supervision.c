/* Supervision: a failing actor's supervisor is told why and restarts it; a failure nobody
 * supervises stops the runtime with a message naming the actor and the message type. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "troupe.h"

enum { MSG_WORK = TR_MSG_USER, MSG_BOOM };

static const tr_msg_desc_t boom_desc = {MSG_BOOM, "boom", "makes a worker fail", 0, 0, NULL};

typedef struct worker {
    int handled;
    int inits;
} worker_t;

static int worker_init(tr_ctx_t *ctx)
{
    ((worker_t *)ctx->state)->inits++;
    return 0;
}

static int worker_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    worker_t *w = ctx->state;
    if (msg->type == MSG_BOOM)
        return TR_EIO;
    if (++w->handled == 2)
        return tr_actor_stop(ctx->rt, ctx->self);
    return 0;
}

typedef struct supervisor {
    tr_actor_t child;
    int exits;
    int reason;
    uint32_t msg_type;
    char name[32];
    int restart_rc;
} supervisor_t;

static int supervisor_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    supervisor_t *s = ctx->state;
    if (msg->type != TR_MSG_EXIT)
        return 0;
    tr_msg_exit_t *e = TR_MSG_AS(msg, exit);
    s->exits++;
    if (s->exits == 1) { /* the failure: restart and give the new one work */
        assert_true(tr_actor_eq(e->actor, s->child));
        s->reason = e->reason;
        s->msg_type = e->msg_type;
        snprintf(s->name, sizeof(s->name), "%s", e->name);
        tr_actor_t fresh;
        s->restart_rc = tr_actor_restart(ctx->rt, e->actor, &fresh);
        if (s->restart_rc == 0) {
            s->child = fresh;
            tr_actor_send(ctx->rt, fresh, tr_msg_alloc(ctx->rt, MSG_WORK, 0));
            tr_actor_send(ctx->rt, fresh, tr_msg_alloc(ctx->rt, MSG_WORK, 0));
        }
        return 0;
    }
    /* the restarted child stopped normally after its two messages */
    assert_int_equal(e->reason, 0);
    return tr_actor_stop(ctx->rt, ctx->self);
}

static void test_supervision_failure_is_reported_and_restarted(void **state)
{
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, NULL), 0);
    supervisor_t s = {0};
    worker_t w = {0};
    tr_actor_t sup;
    assert_int_equal(tr_actor_spawn(rt, supervisor_behaviour, &s, NULL, &sup), 0);
    tr_actor_opts_t o = {.name = "worker", .supervisor = sup, .init = worker_init};
    assert_int_equal(tr_actor_spawn(rt, worker_behaviour, &w, &o, &s.child), 0);
    tr_actor_t first = s.child;
    assert_int_equal(tr_actor_send(rt, first, tr_msg_alloc(rt, MSG_BOOM, 0)), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    assert_int_equal(s.exits, 2);
    assert_int_equal(s.reason, TR_EIO);
    assert_int_equal(s.msg_type, MSG_BOOM);
    assert_string_equal(s.name, "worker");
    assert_int_equal(s.restart_rc, 0);
    assert_int_equal(w.inits, 2);         /* init ran again on restart */
    assert_int_equal(w.handled, 2);
    assert_false(tr_actor_eq(first, s.child)); /* the old address stays stopped */
    tr_msg_t *m = tr_msg_alloc(rt, MSG_WORK, 0);
    assert_int_equal(tr_actor_send(rt, first, m), TR_ESTOPPED);
    tr_msg_free(rt, m);
    tr_runtime_close(rt);
}

static int bystander(tr_ctx_t *ctx, tr_msg_t *msg)
{
    return 0; /* never stops by itself: the failure must stop it */
}

static void test_supervision_unhandled_failure_stops_runtime(void **state)
{
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, NULL), 0);
    worker_t w = {0};
    tr_actor_opts_t o = {.name = "loader"};
    tr_actor_t a, b;
    assert_int_equal(tr_actor_spawn(rt, worker_behaviour, &w, &o, &a), 0);
    assert_int_equal(tr_actor_spawn(rt, bystander, NULL, NULL, &b), 0);
    assert_int_equal(tr_actor_send(rt, a, tr_msg_alloc(rt, MSG_BOOM, 0)), 0);
    assert_int_equal(tr_runtime_run(rt), TR_EFAILED);
    const char *why = tr_runtime_failure(rt);
    assert_non_null(strstr(why, "'loader'"));
    assert_non_null(strstr(why, "'boom'"));
    assert_non_null(strstr(why, "TR_EIO"));
    tr_actor_t c;
    assert_int_equal(tr_actor_spawn(rt, bystander, NULL, NULL, &c), TR_ESHUTDOWN);
    tr_runtime_close(rt);
}

static int failing_init(tr_ctx_t *ctx)
{
    return TR_ENOENT;
}

static void test_supervision_failing_init_is_a_failure(void **state)
{
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, NULL), 0);
    tr_actor_opts_t o = {.name = "reader", .init = failing_init};
    tr_actor_t a;
    assert_int_equal(tr_actor_spawn(rt, bystander, NULL, &o, &a), 0);
    assert_int_equal(tr_runtime_run(rt), TR_EFAILED);
    assert_non_null(strstr(tr_runtime_failure(rt), "'reader'"));
    assert_non_null(strstr(tr_runtime_failure(rt), "(init)"));
    tr_runtime_close(rt);
}

int main(void)
{
    tr_msg_type_register(&boom_desc);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_supervision_failure_is_reported_and_restarted),
        cmocka_unit_test(test_supervision_unhandled_failure_stops_runtime),
        cmocka_unit_test(test_supervision_failing_init_is_a_failure),
    };
    return cmocka_run_group_tests_name("supervision", tests, NULL, NULL);
}
