/* A behaviour's sends gathered into one chain per receiver (the outbox, runtime/core/actor.c):
 * producer actors send runs of random length (1 to 300: below, at and past the outbox's 64)
 * to randomly chosen sinks, interleaving receivers mid-run; every sink gets every message of
 * every producer once, in each producer's order (per-sender FIFO), with a checksum over all.
 * Then the same traffic in deterministic mode: one seed replays the same handling order, to
 * the message, and another seed gives another. The seed is printed; TEST_OUTBOX_SEED sets
 * it. A pinned actor's sends are delivered while its behaviour runs. argv[1]: messages per
 * producer (sanitizer builds use fewer). */
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "stress_testing.h"
#include "troupe.h"

enum { MSG_ITEM = TR_MSG_USER, MSG_GO, MSG_DONE };
#define PRODUCERS 4
#define SINKS     3

typedef struct item {
    uint32_t producer;
    uint64_t seq; /* per (producer, sink) */
} item_t;

typedef struct sink {
    uint64_t next[PRODUCERS];
    uint64_t received, checksum, order; /* order: a hash of the handling order */
    int out_of_order, done;
} sink_t;

typedef struct producer {
    uint32_t id;
    uint64_t rng, sent, total;
    uint64_t seq[SINKS];
    const tr_actor_t *sinks;
} producer_t;

static uint64_t per_producer = 200000;

static int sink_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    sink_t *s = ctx->state;
    if (m->type == MSG_DONE) /* after all of that producer's items (per-sender FIFO) */
        return ++s->done == PRODUCERS ? tr_actor_stop(ctx->rt, ctx->self) : 0;
    const item_t *it = tr_msg_body(m);
    if (it->producer >= PRODUCERS || it->seq != s->next[it->producer])
        s->out_of_order++;
    else
        s->next[it->producer]++;
    uint64_t h = stress_mix(((uint64_t)it->producer << 40) ^ it->seq);
    s->checksum += h;
    s->order = stress_mix(s->order ^ h);
    s->received++;
    return 0;
}

/* One slice: runs of random length to random sinks, then MSG_GO to itself (so producers and
 * sinks interleave on the workers) until the producer's share is sent. */
static int producer_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    producer_t *p = ctx->state;
    for (int run = 0; run < 8 && p->sent < p->total; run++) {
        uint64_t r = tr_rng_next(&p->rng);
        int to = (int)(r % SINKS);
        uint64_t len = 1 + (r >> 8) % 300;
        for (uint64_t i = 0; i < len && p->sent < p->total; i++, p->sent++) {
            tr_msg_t *x = tr_msg_alloc(ctx->rt, MSG_ITEM, sizeof(item_t));
            if (!x) return TR_ENOMEM;
            *(item_t *)tr_msg_body(x) = (item_t){p->id, p->seq[to]++};
            int rc = tr_actor_send(ctx->rt, p->sinks[to], x);
            if (rc < 0) return rc;
        }
    }
    if (p->sent == p->total) {
        for (int k = 0; k < SINKS; k++) {
            int rc = tr_actor_send(ctx->rt, p->sinks[k], tr_msg_alloc(ctx->rt, MSG_DONE, 0));
            if (rc < 0) return rc;
        }
        return tr_actor_stop(ctx->rt, ctx->self);
    }
    return tr_actor_send(ctx->rt, ctx->self, tr_msg_alloc(ctx->rt, MSG_GO, 0));
}

/* Runs the traffic; returns the sinks' combined handling-order hash. */
static uint64_t traffic(uint64_t seed, int deterministic, uint64_t n)
{
    tr_runtime_t *rt;
    tr_runtime_opts_t o = {.deterministic = deterministic, .seed = seed};
    assert_int_equal(tr_runtime_init(&rt, &o), 0);
    sink_t s[SINKS];
    tr_actor_t sinks[SINKS];
    memset(s, 0, sizeof(s));
    for (int k = 0; k < SINKS; k++)
        assert_int_equal(tr_actor_spawn(rt, sink_behaviour, &s[k], NULL, &sinks[k]), 0);
    producer_t p[PRODUCERS];
    for (uint32_t i = 0; i < PRODUCERS; i++) {
        p[i] = (producer_t){.id = i, .rng = seed * 131 + i, .total = n, .sinks = sinks};
        tr_actor_t a;
        assert_int_equal(tr_actor_spawn(rt, producer_behaviour, &p[i], NULL, &a), 0);
        assert_int_equal(tr_actor_send(rt, a, tr_msg_alloc(rt, MSG_GO, 0)), 0);
    }
    uint64_t want = PRODUCERS * n;
    assert_int_equal(tr_runtime_run(rt), 0); /* until every actor has stopped */
    tr_runtime_close(rt);
    uint64_t got = 0, sum = 0, expect = 0, order = 0;
    for (int k = 0; k < SINKS; k++) {
        assert_int_equal(s[k].out_of_order, 0);
        got += s[k].received;
        sum += s[k].checksum;
        order = stress_mix(order ^ s[k].order);
    }
    for (uint32_t i = 0; i < PRODUCERS; i++)
        for (int k = 0; k < SINKS; k++) {
            for (uint64_t q = 0; q < p[i].seq[k]; q++)
                expect += stress_mix(((uint64_t)i << 40) ^ q);
            assert_int_equal(s[k].next[i], p[i].seq[k]); /* all of i's to k, once, in order */
        }
    assert_int_equal(got, want);
    assert_int_equal(sum, expect);
    return order;
}

static void test_bursts_to_interleaved_receivers(void **state)
{
    (void)state;
    uint64_t seed = stress_seed("outbox stress", "TEST_OUTBOX_SEED");
    printf("outbox stress: %d producers x %llu messages to %d sinks\n", PRODUCERS,
           (unsigned long long)per_producer, SINKS);
    traffic(seed, 0, per_producer);
}

static void test_deterministic_replay(void **state)
{
    (void)state;
    uint64_t seed = stress_seed("outbox replay", "TEST_OUTBOX_SEED"), n = 3000;
    uint64_t a = traffic(seed, 1, n), b = traffic(seed, 1, n), c = traffic(seed + 1, 1, n);
    assert_true(stress_replayed("outbox replay", seed, a, b, c));
}

/* A pinned actor's sends are not gathered: one it makes is handled while its behaviour still
 * runs (a pinned executor hands out gradients during its backward; a pipeline stage computes
 * after a send). The behaviour waits for the receiver's answer to its send; gathered until
 * the behaviour returned, that would never come. */
static _Atomic int seen, seen_in_time;

static int r_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)ctx;
    (void)m;
    atomic_store(&seen, 1);
    return 0;
}

static int p_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    const tr_actor_t *r = ctx->state;
    if (m->type != MSG_GO) /* the shutdown's STOP */
        return 0;
    int rc = tr_actor_send(ctx->rt, *r, tr_msg_alloc(ctx->rt, MSG_ITEM, sizeof(item_t)));
    uint64_t t0 = tr_now_ns();
    while (rc == 0 && !atomic_load(&seen) && tr_now_ns() - t0 < 2000000000ull)
        ;
    atomic_store(&seen_in_time, atomic_load(&seen)); /* before this behaviour returned */
    tr_runtime_shutdown(ctx->rt, "done");
    return rc;
}

static void test_pinned_sends_go_at_once(void **state)
{
    (void)state;
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, NULL), 0);
    tr_actor_t r, p;
    assert_int_equal(tr_actor_spawn(rt, r_behaviour, NULL, NULL, &r), 0);
    tr_actor_opts_t o = {.name = "pinned", .pinned = 1};
    assert_int_equal(tr_actor_spawn(rt, p_behaviour, &r, &o, &p), 0);
    assert_int_equal(tr_actor_send(rt, p, tr_msg_alloc(rt, MSG_GO, 0)), 0);
    tr_runtime_run(rt);
    tr_runtime_close(rt);
    assert_int_equal(atomic_load(&seen_in_time), 1);
}

int main(int argc, char **argv)
{
    if (argc > 1) per_producer = strtoull(argv[1], NULL, 10);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bursts_to_interleaved_receivers),
        cmocka_unit_test(test_deterministic_replay),
        cmocka_unit_test(test_pinned_sends_go_at_once),
    };
    return cmocka_run_group_tests_name("outbox", tests, NULL, NULL);
}
