/* Inline runs (runtime/core/actor.c, outbox_flush): a behaviour streaming to a cheap actor that is
 * idle (or waiting in its worker's run-next slot) runs that actor on its own thread, inside
 * the send, every TR__OUTBOX_MAX messages.
 * - A stream's receiver never has more than a burst or two queued, on one worker or two (a
 *   behaviour's whole stream does not pile up in its mailbox); with opts.inline_ns negative,
 *   on one worker, it does.
 * - An expensive receiver (50 us a message) runs inline only while it has no history (its
 *   first chain) and then is scheduled; the time it ran inline is its own, not its sender's.
 * - Rules, on one worker: an inline run never runs another inline (B, run inline by A's
 *   stream, streams to C: C is scheduled); a stream takes its receiver out of the run-next
 *   slot; a receiver that stops inside an inline run stops there, and the sender's next
 *   sends are refused (TR_ESTOPPED); a receiver two producers stream to in turns is
 *   scheduled, not run inline, once it has seen both, and runs inline again 8 activations
 *   after a single sender took over.
 * - Stress: producers stream runs of random length to relays that forward every item to a
 *   sink (a stream from inside an inline activation: never nested) and acknowledge it to the
 *   producer (a send to an actor whose behaviour is running the relay); one relay is pinned,
 *   one is slow. The sink gets every item of every (producer, relay) pair once, in order;
 *   every producer gets all its acknowledgements. Then the same traffic in deterministic mode
 *   (no inline runs there): one seed replays the same handling order, another differs. The
 *   seed is printed; TEST_INLINE_SEED sets it. argv[1]: items per producer. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "stress_testing.h"
#include "troupe.h"

enum { MSG_ITEM = TR_MSG_USER, MSG_GO, MSG_ACK, MSG_DONE, MSG_GET };

static uint64_t per_producer = 100000;

/* --- a stream's receiver stays drained ------------------------------------------------- */

typedef struct counter {
    uint64_t count;
    tr_actor_stats_t stats; /* its own, taken when the stream ends */
} counter_t;

static int counter_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    counter_t *c = ctx->state;
    if (m->type == MSG_ITEM) {
        c->count++;
        return 0;
    }
    tr_actor_stats(ctx->rt, ctx->self, &c->stats);
    return tr_actor_stop(ctx->rt, ctx->self);
}

typedef struct streamer {
    tr_actor_t to;
    uint64_t n;
} streamer_t;

static int streamer_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    streamer_t *s = ctx->state;
    for (uint64_t i = 0; i < s->n; i++) {
        int rc = tr_actor_send(ctx->rt, s->to, tr_msg_alloc(ctx->rt, MSG_ITEM, 0));
        if (rc < 0) return rc;
    }
    int rc = tr_actor_send(ctx->rt, s->to, tr_msg_alloc(ctx->rt, MSG_DONE, 0));
    return rc < 0 ? rc : tr_actor_stop(ctx->rt, ctx->self);
}

static void stream_once(unsigned workers, int64_t inline_ns)
{
    tr_runtime_t *rt;
    /* cheap on any build (a sanitizer's makes each message cost more than 200 ns), and a
     * batch that ends by count, not by the clock of a loaded machine */
    tr_runtime_opts_t o = {
        .n_workers = workers, .inline_ns = inline_ns, .batch_ns = 10000000000ull};
    assert_int_equal(tr_runtime_init(&rt, &o), 0);
    counter_t c = {0};
    streamer_t s = {.n = per_producer};
    tr_actor_t p;
    assert_int_equal(tr_actor_spawn(rt, counter_behaviour, &c, NULL, &s.to), 0);
    assert_int_equal(tr_actor_spawn(rt, streamer_behaviour, &s, NULL, &p), 0);
    assert_int_equal(tr_actor_send(rt, p, tr_msg_alloc(rt, MSG_GO, 0)), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
    printf("stream on %u worker(s), inline_ns %lld: %llu messages, peak mailbox depth %llu\n",
           workers, (long long)inline_ns, (unsigned long long)c.count,
           (unsigned long long)c.stats.peak_depth);
    assert_int_equal(c.count, s.n);
    if (inline_ns < 0) /* never inline: on one worker the whole stream waits */
        assert_true(workers > 1 || c.stats.peak_depth == s.n + 1);
    else /* the bursts of 64 and the stream's tail */
        assert_true(c.stats.peak_depth <= 256);
}

static void test_stream_receiver_stays_drained(void **state)
{
    (void)state;
    stream_once(1, 1000000);
    stream_once(2, 1000000);
    stream_once(1, -1);
}

/* --- an expensive receiver --------------------------------------------------------------- */

typedef struct slow {
    _Atomic int sending; /* the sender is inside its send loop */
    pthread_t sender_thread;
    uint64_t handled, inline_handled;
    tr_actor_stats_t sender_stats;
} slow_t;

static slow_t slow;

static void spin_us(uint64_t us)
{
    uint64_t t0 = tr_now_ns();
    while (tr_now_ns() - t0 < us * 1000)
        ;
}

static int slow_receiver(tr_ctx_t *ctx, tr_msg_t *m)
{
    if (m->type == MSG_DONE) return tr_actor_stop(ctx->rt, ctx->self);
    slow.handled++;
    if (atomic_load(&slow.sending) && pthread_equal(pthread_self(), slow.sender_thread))
        slow.inline_handled++;
    spin_us(50);
    return 0;
}

static int slow_sender(tr_ctx_t *ctx, tr_msg_t *m)
{
    const tr_actor_t *to = ctx->state;
    if (m->type == MSG_GET) { /* the next activation: the first one's time is counted */
        tr_actor_stats(ctx->rt, ctx->self, &slow.sender_stats);
        int rc = tr_actor_send(ctx->rt, *to, tr_msg_alloc(ctx->rt, MSG_DONE, 0));
        return rc < 0 ? rc : tr_actor_stop(ctx->rt, ctx->self);
    }
    slow.sender_thread = pthread_self();
    atomic_store(&slow.sending, 1);
    int rc = 0;
    for (int i = 0; i < 128 && rc == 0; i++)
        rc = tr_actor_send(ctx->rt, *to, tr_msg_alloc(ctx->rt, MSG_ITEM, 0));
    atomic_store(&slow.sending, 0);
    return rc < 0 ? rc : tr_actor_send(ctx->rt, ctx->self, tr_msg_alloc(ctx->rt, MSG_GET, 0));
}

static void test_expensive_receiver_runs_inline_once(void **state)
{
    (void)state;
    tr_runtime_t *rt;
    /* one worker (no second one to take the sender's core while it runs); batches end by
     * count, not by a loaded machine's clock; the sender's GET comes in a second activation,
     * after the first one's time is counted */
    tr_runtime_opts_t o = {.n_workers = 1, .batch_ns = 10000000000ull};
    assert_int_equal(tr_runtime_init(&rt, &o), 0);
    tr_actor_t r, p;
    tr_actor_opts_t one = {.batch = 1};
    assert_int_equal(tr_actor_spawn(rt, slow_receiver, NULL, NULL, &r), 0);
    assert_int_equal(tr_actor_spawn(rt, slow_sender, &r, &one, &p), 0);
    assert_int_equal(tr_actor_send(rt, p, tr_msg_alloc(rt, MSG_GO, 0)), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
    printf("slow receiver: %llu handled, %llu inline; sender ran %llu us\n",
           (unsigned long long)slow.handled, (unsigned long long)slow.inline_handled,
           (unsigned long long)(slow.sender_stats.run_ns / 1000));
    assert_int_equal(slow.handled, 128);
    assert_int_equal(slow.inline_handled, 64); /* the first burst, before it was measured */
    /* 64 x 50 us ran inside the sender's sends; its own time is its 128 sends */
    assert_true(slow.sender_stats.run_ns > 0);
    assert_true(slow.sender_stats.run_ns < 64 * 50000 / 2);
}

/* --- the rules: no nesting, the run-next slot, a stop inside an inline run --------------- */

static _Thread_local int in_stream; /* this thread is inside a test behaviour's send loop */

typedef struct rules {
    tr_actor_t b, c;
    uint64_t b_handled, b_inline, c_handled, c_nested, c_inline;
    uint64_t sent_ok;
    int first_error;
} rules_t;

static rules_t rules;

/* A streams 200 messages to B; B streams 70 to C for each (from inside its inline runs). */
static int nest_c(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    rules.c_nested += in_stream == 2; /* run inside B's send, itself inside A's */
    return ++rules.c_handled == 200 * 70 ? tr_actor_stop(ctx->rt, ctx->self) : 0;
}

static int nest_b(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    rules.b_inline += in_stream == 1;
    int saved = in_stream, rc = 0;
    in_stream = 2;
    for (int i = 0; i < 70 && rc == 0; i++)
        rc = tr_actor_send(ctx->rt, rules.c, tr_msg_alloc(ctx->rt, MSG_ITEM, 0));
    in_stream = saved;
    if (rc == 0 && ++rules.b_handled == 200) return tr_actor_stop(ctx->rt, ctx->self);
    return rc;
}

static int nest_a(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    int rc = 0;
    in_stream = 1;
    for (int i = 0; i < 200 && rc == 0; i++)
        rc = tr_actor_send(ctx->rt, rules.b, tr_msg_alloc(ctx->rt, MSG_ITEM, 0));
    in_stream = 0;
    return rc < 0 ? rc : tr_actor_stop(ctx->rt, ctx->self);
}

/* Runs a's behaviour once on one worker, with b and c; inline_ns high (any build is cheap). */
static void run_rules(tr_behaviour_cb a, tr_behaviour_cb b, tr_behaviour_cb c)
{
    memset(&rules, 0, sizeof(rules));
    tr_runtime_t *rt;
    tr_runtime_opts_t o = {.n_workers = 1, .inline_ns = 1000000000, .batch_ns = 10000000000ull};
    assert_int_equal(tr_runtime_init(&rt, &o), 0);
    tr_actor_t pa;
    assert_int_equal(tr_actor_spawn(rt, c, NULL, NULL, &rules.c), 0);
    if (b) assert_int_equal(tr_actor_spawn(rt, b, NULL, NULL, &rules.b), 0);
    assert_int_equal(tr_actor_spawn(rt, a, NULL, NULL, &pa), 0);
    assert_int_equal(tr_actor_send(rt, pa, tr_msg_alloc(rt, MSG_GO, 0)), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
}

static void test_inline_runs_do_not_nest(void **state)
{
    (void)state;
    run_rules(nest_a, nest_b, nest_c);
    printf("nesting: B handled %llu (%llu inline), C %llu (%llu inside B's inline run)\n",
           (unsigned long long)rules.b_handled, (unsigned long long)rules.b_inline,
           (unsigned long long)rules.c_handled, (unsigned long long)rules.c_nested);
    assert_int_equal(rules.c_handled, 200 * 70);
    assert_true(rules.b_inline >= 128); /* A's chains of 64 (the tail may run after A) */
    assert_int_equal(rules.c_nested, 0);
}

/* A sends 10 to C (C waits in the run-next slot once A sends to itself), then streams 100:
 * its first chain takes C out of the slot and runs it inline for a batch (64: the 10 and 54
 * of the chain); left in the slot, C would run only after A's behaviour returned. */
static int slot_c(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    rules.c_inline += in_stream == 1;
    return ++rules.c_handled == 110 ? tr_actor_stop(ctx->rt, ctx->self) : 0;
}

static int slot_a(tr_ctx_t *ctx, tr_msg_t *m)
{
    if (m->type != MSG_GO) return tr_actor_stop(ctx->rt, ctx->self); /* its own note */
    int rc = 0;
    for (int i = 0; i < 10 && rc == 0; i++)
        rc = tr_actor_send(ctx->rt, rules.c, tr_msg_alloc(ctx->rt, MSG_ITEM, 0));
    if (rc == 0) rc = tr_actor_send(ctx->rt, ctx->self, tr_msg_alloc(ctx->rt, MSG_DONE, 0));
    in_stream = 1;
    for (int i = 0; i < 100 && rc == 0; i++)
        rc = tr_actor_send(ctx->rt, rules.c, tr_msg_alloc(ctx->rt, MSG_ITEM, 0));
    in_stream = 0;
    return rc;
}

static void test_stream_takes_receiver_from_run_next(void **state)
{
    (void)state;
    run_rules(slot_a, NULL, slot_c);
    printf("run-next: C handled %llu, %llu inside A's stream\n",
           (unsigned long long)rules.c_handled, (unsigned long long)rules.c_inline);
    assert_int_equal(rules.c_handled, 110);
    assert_int_equal(rules.c_inline, 64);
}

/* C stops at its 100th message, inside an inline run; A's later sends are refused. */
static int stop_c(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    return ++rules.c_handled == 100 ? tr_actor_stop(ctx->rt, ctx->self) : 0;
}

static int stop_a(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    for (uint64_t i = 0; i < 1000; i++) {
        int rc = tr_actor_send(ctx->rt, rules.c, tr_msg_alloc(ctx->rt, MSG_ITEM, 0));
        if (rc < 0) {
            rules.first_error = rc;
            break;
        }
        rules.sent_ok++;
    }
    return tr_actor_stop(ctx->rt, ctx->self);
}

static void test_receiver_stops_inside_inline_run(void **state)
{
    (void)state;
    run_rules(stop_a, NULL, stop_c);
    printf("stop: C handled %llu; A's sends accepted %llu, then %s\n",
           (unsigned long long)rules.c_handled, (unsigned long long)rules.sent_ok,
           tr_strerror(rules.first_error));
    assert_int_equal(rules.c_handled, 100);
    assert_int_equal(rules.first_error, TR_ESTOPPED);
    assert_int_equal(rules.sent_ok, 128); /* the chain that held the 100th was the second */
}

/* Two producers take turns (a token passed between them), a chain of 64 to C each turn: once
 * C has seen both, it is fed by several senders at a time and is scheduled, not run inline
 * (the first two chains are). Then a third streams alone, a chain each time C acknowledges
 * the last: after C's activations have seen one sender 8 times in a row, it runs inline again. */
#define TURNS 20 /* each of the two */
#define ALONE 16 /* chains of the third */

typedef struct turn {
    int left, id;
    tr_actor_t other;
    const struct turn *peer;
} turn_t;

static tr_actor_t third;
static uint64_t inline_alone; /* C's messages handled inside the third's send */

static int turns_c(tr_ctx_t *ctx, tr_msg_t *m)
{
    rules.c_inline += in_stream != 0;
    inline_alone += in_stream == 3;
    uint64_t n = ++rules.c_handled;
    if (n == (2 * TURNS + ALONE) * 64) return tr_actor_stop(ctx->rt, ctx->self);
    if (n == 2 * TURNS * 64) /* the turns are over: the third begins */
        return tr_actor_send(ctx->rt, third, tr_msg_alloc(ctx->rt, MSG_GO, 0));
    if (n > 2 * TURNS * 64 && n % 64 == 0) /* the third's chain is handled: the next */
        return tr_actor_send(ctx->rt, m->sender, tr_msg_alloc(ctx->rt, MSG_ACK, 0));
    return 0;
}

static int send_chain(tr_ctx_t *ctx, int id)
{
    int rc = 0;
    in_stream = id;
    for (int i = 0; i < 64 && rc == 0; i++)
        rc = tr_actor_send(ctx->rt, rules.c, tr_msg_alloc(ctx->rt, MSG_ITEM, 0));
    in_stream = 0;
    return rc;
}

static int turns_p(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    turn_t *t = ctx->state;
    int rc = send_chain(ctx, t->id);
    --t->left;
    if (rc == 0 && t->peer->left) /* the token, while the other has turns left */
        rc = tr_actor_send(ctx->rt, t->other, tr_msg_alloc(ctx->rt, MSG_GO, 0));
    return rc < 0 || t->left > 0 ? rc : tr_actor_stop(ctx->rt, ctx->self);
}

static int alone_p(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    int *left = ctx->state, rc = send_chain(ctx, 3);
    return rc < 0 || --*left > 0 ? rc : tr_actor_stop(ctx->rt, ctx->self);
}

static void test_receiver_of_several_streams_is_scheduled(void **state)
{
    (void)state;
    memset(&rules, 0, sizeof(rules));
    inline_alone = 0;
    tr_runtime_t *rt;
    tr_runtime_opts_t o = {.n_workers = 1, .inline_ns = 1000000000, .batch_ns = 10000000000ull};
    assert_int_equal(tr_runtime_init(&rt, &o), 0);
    turn_t t[2] = {{.left = TURNS, .id = 1, .peer = &t[1]},
                   {.left = TURNS, .id = 2, .peer = &t[0]}};
    int alone_left = ALONE;
    tr_actor_t p[2];
    tr_actor_opts_t c64 = {.batch = 64}; /* an activation of C takes a chain */
    assert_int_equal(tr_actor_spawn(rt, turns_c, NULL, &c64, &rules.c), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(tr_actor_spawn(rt, turns_p, &t[i], NULL, &p[i]), 0);
    assert_int_equal(tr_actor_spawn(rt, alone_p, &alone_left, NULL, &third), 0);
    t[0].other = p[1];
    t[1].other = p[0];
    assert_int_equal(tr_actor_send(rt, p[0], tr_msg_alloc(rt, MSG_GO, 0)), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
    printf("streams: C handled %llu, %llu inline while two took turns, %llu of the third's\n",
           (unsigned long long)rules.c_handled, (unsigned long long)(rules.c_inline - inline_alone),
           (unsigned long long)inline_alone);
    assert_int_equal(rules.c_handled, (2 * TURNS + ALONE) * 64);
    assert_int_equal(rules.c_inline - inline_alone, 2 * 64); /* the first two chains */
    /* the third's first chain sets the hold again (a new sender); 8 single-sender
     * activations later its chains run inline: chains 10 to 16 */
    assert_int_equal(inline_alone, (ALONE - 9) * 64);
}

/* --- stress: producers -> relays -> sink, acknowledged ----------------------------------- */

#define PRODUCERS 3
#define RELAYS    4 /* relay 0 is pinned, relay 1 slow, relay 3 fed by producer 0 alone */

static _Atomic uint64_t relay_inline; /* items a relay handled inside a producer's send */

typedef struct item {
    uint32_t producer, relay;
    uint64_t seq; /* per (producer, relay) */
} item_t;

typedef struct sink {
    uint64_t next[PRODUCERS][RELAYS];
    uint64_t received, checksum, order;
    int out_of_order, done;
} sink_t;

typedef struct relay {
    uint32_t id;
    tr_actor_t sink;
    const tr_actor_t *producers;
    int done;
} relay_t;

typedef struct producer {
    uint32_t id;
    uint64_t rng, sent, total, acks;
    uint64_t seq[RELAYS];
    const tr_actor_t *relays;
    int finished;
} producer_t;

static int sink_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    sink_t *s = ctx->state;
    if (m->type == MSG_DONE) return ++s->done == RELAYS ? tr_actor_stop(ctx->rt, ctx->self) : 0;
    const item_t *it = tr_msg_body(m);
    if (it->producer >= PRODUCERS || it->relay >= RELAYS ||
        it->seq != s->next[it->producer][it->relay])
        s->out_of_order++;
    else
        s->next[it->producer][it->relay]++;
    uint64_t h = stress_mix(((uint64_t)it->producer << 40) ^ ((uint64_t)it->relay << 32) ^ it->seq);
    s->checksum += h;
    s->order = stress_mix(s->order ^ h);
    s->received++;
    return 0;
}

static int relay_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    relay_t *r = ctx->state;
    if (m->type == MSG_DONE) {
        if (++r->done < PRODUCERS) return 0;
        int rc = tr_actor_send(ctx->rt, r->sink, tr_msg_alloc(ctx->rt, MSG_DONE, 0));
        return rc < 0 ? rc : tr_actor_stop(ctx->rt, ctx->self);
    }
    if (m->type != MSG_ITEM) return 0;
    const item_t *it = tr_msg_body(m);
    if (in_stream) atomic_fetch_add(&relay_inline, 1);
    if (r->id == 1 && it->seq % 64 == 0) spin_us(5);
    tr_msg_t *f = tr_msg_alloc(ctx->rt, MSG_ITEM, sizeof(item_t));
    tr_msg_t *ack = tr_msg_alloc(ctx->rt, MSG_ACK, 0);
    if (!f || !ack) return TR_ENOMEM;
    *(item_t *)tr_msg_body(f) = *it;
    int rc = tr_actor_send(ctx->rt, r->sink, f);
    if (rc == 0) rc = tr_actor_send(ctx->rt, r->producers[it->producer], ack);
    return rc;
}

static int producer_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    producer_t *p = ctx->state;
    if (m->type == MSG_ACK) {
        if (++p->acks == p->total && p->finished) return tr_actor_stop(ctx->rt, ctx->self);
        return 0;
    }
    for (int run = 0; run < 4 && p->sent < p->total; run++) {
        uint64_t r = tr_rng_next(&p->rng);
        uint32_t to = (uint32_t)(r % RELAYS);
        if (to == RELAYS - 1 && p->id != 0) to = 2; /* the last relay has one sender */
        uint64_t len = 1 + (r >> 8) % 400;
        in_stream = 1;
        for (uint64_t i = 0; i < len && p->sent < p->total; i++, p->sent++) {
            tr_msg_t *x = tr_msg_alloc(ctx->rt, MSG_ITEM, sizeof(item_t));
            if (!x) return TR_ENOMEM;
            *(item_t *)tr_msg_body(x) = (item_t){p->id, to, p->seq[to]++};
            int rc = tr_actor_send(ctx->rt, p->relays[to], x);
            if (rc < 0) {
                in_stream = 0;
                return rc;
            }
        }
        in_stream = 0;
    }
    if (p->sent < p->total)
        return tr_actor_send(ctx->rt, ctx->self, tr_msg_alloc(ctx->rt, MSG_GO, 0));
    for (int k = 0; k < RELAYS; k++) {
        int rc = tr_actor_send(ctx->rt, p->relays[k], tr_msg_alloc(ctx->rt, MSG_DONE, 0));
        if (rc < 0) return rc;
    }
    p->finished = 1;
    return p->acks == p->total ? tr_actor_stop(ctx->rt, ctx->self) : 0;
}

/* Runs the traffic; returns the sink's handling-order hash. */
static uint64_t traffic(uint64_t seed, int deterministic, uint64_t n)
{
    tr_runtime_t *rt;
    /* inline runs for any relay fed by one producer, on any build */
    tr_runtime_opts_t o = {.deterministic = deterministic, .seed = seed, .inline_ns = 1000000000};
    assert_int_equal(tr_runtime_init(&rt, &o), 0);
    sink_t s;
    memset(&s, 0, sizeof(s));
    tr_actor_t sink, relays[RELAYS], producers[PRODUCERS];
    relay_t r[RELAYS];
    producer_t p[PRODUCERS];
    assert_int_equal(tr_actor_spawn(rt, sink_behaviour, &s, NULL, &sink), 0);
    for (uint32_t k = 0; k < RELAYS; k++) {
        r[k] = (relay_t){.id = k, .sink = sink, .producers = producers};
        tr_actor_opts_t ro = {.name = "pinned relay", .pinned = 1};
        assert_int_equal(tr_actor_spawn(rt, relay_behaviour, &r[k],
                                        k == 0 && !deterministic ? &ro : NULL, &relays[k]),
                         0);
    }
    for (uint32_t i = 0; i < PRODUCERS; i++) {
        p[i] = (producer_t){.id = i, .rng = seed * 131 + i, .total = n, .relays = relays};
        assert_int_equal(tr_actor_spawn(rt, producer_behaviour, &p[i], NULL, &producers[i]), 0);
    }
    for (uint32_t i = 0; i < PRODUCERS; i++)
        assert_int_equal(tr_actor_send(rt, producers[i], tr_msg_alloc(rt, MSG_GO, 0)), 0);
    assert_int_equal(tr_runtime_run(rt), 0); /* until every actor has stopped */
    tr_runtime_close(rt);
    assert_int_equal(s.out_of_order, 0);
    assert_int_equal(s.received, PRODUCERS * n);
    uint64_t expect = 0;
    for (uint32_t i = 0; i < PRODUCERS; i++) {
        assert_int_equal(p[i].acks, n);
        for (uint32_t k = 0; k < RELAYS; k++) {
            assert_int_equal(s.next[i][k], p[i].seq[k]); /* all of (i, k)'s, once, in order */
            for (uint64_t q = 0; q < p[i].seq[k]; q++)
                expect += stress_mix(((uint64_t)i << 40) ^ ((uint64_t)k << 32) ^ q);
        }
    }
    assert_int_equal(s.checksum, expect);
    return s.order;
}

static void test_relay_stress(void **state)
{
    (void)state;
    uint64_t seed = stress_seed("inline stress", "TEST_INLINE_SEED");
    printf("inline stress: %d producers x %llu items through %d relays\n", PRODUCERS,
           (unsigned long long)per_producer, RELAYS);
    atomic_store(&relay_inline, 0);
    traffic(seed, 0, per_producer);
    printf("inline stress: %llu items handled by a relay inside a producer's send\n",
           (unsigned long long)atomic_load(&relay_inline));
    assert_true(atomic_load(&relay_inline) > 0); /* the path under stress was taken */
}

static void test_deterministic_replay(void **state)
{
    (void)state;
    uint64_t seed = stress_seed("inline replay", "TEST_INLINE_SEED"), n = 3000;
    uint64_t a = traffic(seed, 1, n), b = traffic(seed, 1, n), c = traffic(seed + 1, 1, n);
    assert_true(stress_replayed("inline replay", seed, a, b, c));
}

int main(int argc, char **argv)
{
    if (argc > 1) per_producer = strtoull(argv[1], NULL, 10);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_receiver_stays_drained),
        cmocka_unit_test(test_expensive_receiver_runs_inline_once),
        cmocka_unit_test(test_inline_runs_do_not_nest),
        cmocka_unit_test(test_stream_takes_receiver_from_run_next),
        cmocka_unit_test(test_receiver_stops_inside_inline_run),
        cmocka_unit_test(test_receiver_of_several_streams_is_scheduled),
        cmocka_unit_test(test_relay_stress),
        cmocka_unit_test(test_deterministic_replay),
    };
    return cmocka_run_group_tests_name("inline", tests, NULL, NULL);
}
