/* Stress: 8 producers x 1,000,000 messages into one actor lose nothing and duplicate nothing
 * (per-producer sequence numbers and a checksum). Half the producers are actors on the
 * workers, half external threads, so both send paths are loaded at once. The message count
 * per producer may be given as argv[1] (sanitizer builds use fewer). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "troupe.h"

enum { MSG_ITEM = TR_MSG_USER, MSG_GO };
#define PRODUCERS 8

typedef struct item {
    uint32_t producer;
    uint64_t seq;
} item_t;

static uint64_t per_producer = 1000000;

typedef struct sink {
    uint64_t next[PRODUCERS];
    uint64_t received, checksum;
    int out_of_order;
} sink_t;

static tr_actor_t sink_addr;

static uint64_t mix(uint32_t p, uint64_t seq)
{
    uint64_t x = ((uint64_t)p << 40) ^ seq;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    return x ^ (x >> 33);
}

static int sink_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    sink_t *s = ctx->state;
    item_t *it = tr_msg_body(msg);
    if (it->producer >= PRODUCERS || it->seq != s->next[it->producer])
        s->out_of_order++;
    else
        s->next[it->producer]++;
    s->checksum += mix(it->producer, it->seq);
    if (++s->received == PRODUCERS * per_producer) return tr_actor_stop(ctx->rt, ctx->self);
    return 0;
}

static int send_item(tr_runtime_t *rt, uint32_t p, uint64_t seq)
{
    tr_msg_t *m = tr_msg_alloc(rt, MSG_ITEM, sizeof(item_t));
    if (!m) return TR_ENOMEM;
    *(item_t *)tr_msg_body(m) = (item_t){p, seq};
    return tr_actor_send(rt, sink_addr, m);
}

typedef struct producer {
    uint32_t id;
    uint64_t sent;
} producer_t;

/* An actor producer sends in slices, re-sending itself MSG_GO so others get the worker. */
static int producer_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    producer_t *p = ctx->state;
    for (int i = 0; i < 1000 && p->sent < per_producer; i++, p->sent++)
        if (send_item(ctx->rt, p->id, p->sent) < 0) return TR_ENOMEM;
    if (p->sent == per_producer) return tr_actor_stop(ctx->rt, ctx->self);
    return tr_actor_send(ctx->rt, ctx->self, tr_msg_alloc(ctx->rt, MSG_GO, 0));
}

typedef struct thread_arg {
    tr_runtime_t *rt;
    uint32_t id;
} thread_arg_t;

static void *producer_thread(void *arg)
{
    thread_arg_t *t = arg;
    for (uint64_t i = 0; i < per_producer; i++)
        if (send_item(t->rt, t->id, i) < 0) abort();
    return NULL;
}

static void test_stress_fan_in_loses_nothing(void **state)
{
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, NULL), 0);
    sink_t s = {0};
    assert_int_equal(tr_actor_spawn(rt, sink_behaviour, &s, NULL, &sink_addr), 0);
    producer_t actors[PRODUCERS / 2];
    for (uint32_t i = 0; i < PRODUCERS / 2; i++) {
        actors[i] = (producer_t){i, 0};
        tr_actor_t a;
        assert_int_equal(tr_actor_spawn(rt, producer_behaviour, &actors[i], NULL, &a), 0);
        assert_int_equal(tr_actor_send(rt, a, tr_msg_alloc(rt, MSG_GO, 0)), 0);
    }
    pthread_t threads[PRODUCERS / 2];
    thread_arg_t args[PRODUCERS / 2];
    for (uint32_t i = 0; i < PRODUCERS / 2; i++) {
        args[i] = (thread_arg_t){rt, PRODUCERS / 2 + i};
        pthread_create(&threads[i], NULL, producer_thread, &args[i]);
    }
    for (int i = 0; i < PRODUCERS / 2; i++)
        pthread_join(threads[i], NULL);
    uint64_t t0 = tr_now_ns();
    assert_int_equal(tr_runtime_run(rt), 0);
    uint64_t expect = 0;
    for (uint32_t p = 0; p < PRODUCERS; p++)
        for (uint64_t i = 0; i < per_producer; i++)
            expect += mix(p, i);
    assert_int_equal(s.out_of_order, 0);
    assert_int_equal(s.received, PRODUCERS * per_producer);
    for (int p = 0; p < PRODUCERS; p++)
        assert_int_equal(s.next[p], per_producer);
    assert_int_equal(s.checksum, expect);
    tr_runtime_stats_t st;
    tr_runtime_stats(rt, &st);
    printf("stress: %llu messages, %llu dead letters, drained in %.1f ms after producers ended\n",
           (unsigned long long)s.received, (unsigned long long)st.dead_letters,
           (tr_now_ns() - t0) / 1e6);
    assert_int_equal(st.dead_letters, 0);
    tr_runtime_close(rt);
}

int main(int argc, char **argv)
{
    if (argc > 1) per_producer = strtoull(argv[1], NULL, 10);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stress_fan_in_loses_nothing),
    };
    return cmocka_run_group_tests_name("stress", tests, NULL, NULL);
}
