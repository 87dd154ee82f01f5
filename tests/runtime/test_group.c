/* Grouped activations (runtime/core/actor.c, tr__actor_run_group): a worker that has more actors
 * queued runs up to TR__GROUP_MAX activations interleaved, a message of each in turn.
 *
 * 1. One worker, eight sinks whose mailboxes a producer actor has filled: the handling order
 *    goes round the sinks of a group (without grouping it runs 64 of one sink's messages in a
 *    row); each sink gets its messages once and in order; inside a behaviour tr_actor_self()
 *    is that sink; a message a sink relays carries that sink as its sender; and, each message
 *    taking 2 µs of work, the sinks' run_ns add up to no more than the run's wall time (a
 *    group's time is split among its actors, not counted once for each).
 * 2. Stress: two workers; the producer actor and three threads outside the runtime send runs of
 *    random length to random sinks. Every message arrives once, in each sender's order, and no
 *    sink's behaviour ever runs on two threads at once. The seed is printed; TEST_GROUP_SEED
 *    sets it. argv[1]: messages in all, shared by the senders (sanitizer builds use fewer).
 * 3. The traffic of 1 in deterministic mode: one seed replays the same handling order, to the
 *    message, and another seed gives another.
 * 4. Groups do not keep work from an idle worker: four busy actors, all sent to from one
 *    actor's behaviour (so queued on one worker), with batches that never end (so a group
 *    keeps whatever it takes), are run by both workers (each handles at least a fifth of the
 *    messages; taking the whole queue, one worker handles them all).
 * 5. A generation published in a slot whose activation is still running in the group gets its
 *    init: a supervisor in the group restarting a failed actor of the group, and an actor
 *    spawning into the slot another member of the group just freed. (A watchdog shuts the
 *    runtime down after 5 s, so a lost init fails the test instead of hanging it.)
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "runtime/core/internal.h" /* TR__GROUP_MAX */
#include "stress_testing.h"
#include "troupe.h"

enum { MSG_ITEM = TR_MSG_USER, MSG_GO, MSG_DONE, MSG_RELAY };
#define SINKS       8
#define SENDERS     4 /* sender 0: the producer actor; 1..3: threads outside the runtime */
#define RELAY_EVERY 8 /* in the stress case; the others relay only their MSG_DONE */
#define TRACE_MAX   (1u << 16)

typedef struct item {
    uint32_t sender; /* a sender index, or for MSG_RELAY the sink's index */
    uint64_t seq;    /* per (sender, sink), or per sink for MSG_RELAY */
} item_t;

typedef struct sink {
    uint32_t index, senders; /* senders: how many send it a MSG_DONE */
    tr_actor_t self, relay;
    _Atomic int inside; /* a behaviour of this sink is running */
    int reentered, wrong_self, out_of_order, done;
    uint64_t next[SENDERS], received, checksum, relayed;
    uint64_t run_ns; /* its tr_actor_stats run_ns, read in its last behaviour */
} sink_t;

typedef struct relay {
    const tr_actor_t *sinks;
    uint64_t next[SINKS];
    int wrong_sender, out_of_order, done;
} relay_t;

typedef struct producer {
    uint32_t id;
    uint64_t rng, sent, total, seq[SINKS];
    const tr_actor_t *sinks;
    int fixed; /* 1: fixed rounds in one behaviour (cases 1 and 3); 0: random runs in slices */
} producer_t;

/* The handling order of case 1 and 3 (one thread handles every sink's messages there). */
static uint8_t trace[TRACE_MAX];
static size_t n_trace;
static int tracing;
static uint64_t work_ns;   /* what each item costs a sink (case 1 and 3) */
#define work_done_ns 2000u /* work_ns in case 1 and 3 */
static int relaying;       /* sinks relay every RELAY_EVERY-th item (case 2) */
static uint64_t per_sender = 50000;

static int send_item(tr_runtime_t *rt, tr_actor_t to, uint32_t type, uint32_t who, uint64_t seq)
{
    tr_msg_t *m = tr_msg_alloc(rt, type, sizeof(item_t));
    if (!m) return TR_ENOMEM;
    *(item_t *)tr_msg_body(m) = (item_t){who, seq};
    int rc = tr_actor_send(rt, to, m);
    if (rc < 0) tr_msg_free(rt, m);
    return rc;
}

static int sink_item(tr_ctx_t *ctx, sink_t *s, const item_t *it)
{
    if (it->sender >= SENDERS || it->seq != s->next[it->sender])
        s->out_of_order++;
    else
        s->next[it->sender]++;
    s->checksum += stress_mix(((uint64_t)it->sender << 40) ^ it->seq);
    if (tracing && n_trace < TRACE_MAX) trace[n_trace++] = (uint8_t)s->index;
    for (uint64_t t0 = work_ns ? tr_now_ns() : 0; work_ns && tr_now_ns() - t0 < work_ns;) {
    }
    if (++s->received % RELAY_EVERY || !relaying) return 0;
    return send_item(ctx->rt, s->relay, MSG_RELAY, s->index, s->relayed++);
}

static int sink_done(tr_ctx_t *ctx, sink_t *s)
{
    if (++s->done < (int)s->senders) return 0;
    tr_actor_stats_t st;
    if (tr_actor_stats(ctx->rt, ctx->self, &st) == 0) s->run_ns = st.run_ns;
    int rc = send_item(ctx->rt, s->relay, MSG_DONE, s->index, 0);
    return rc < 0 ? rc : tr_actor_stop(ctx->rt, ctx->self);
}

static int sink_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    sink_t *s = ctx->state;
    if (atomic_exchange(&s->inside, 1)) s->reentered++;
    if (tr_actor_self().id != s->self.id || ctx->self.id != s->self.id) s->wrong_self++;
    int rc = 0;
    if (m->type == MSG_ITEM)
        rc = sink_item(ctx, s, tr_msg_body(m));
    else if (m->type == MSG_DONE) /* after all of that sender's items (per-sender FIFO) */
        rc = sink_done(ctx, s);
    atomic_store(&s->inside, 0);
    return rc;
}

static int relay_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    relay_t *r = ctx->state;
    const item_t *it = tr_msg_body(m);
    if (m->type != MSG_RELAY && m->type != MSG_DONE) return 0;
    if (it->sender >= SINKS || m->sender.id != r->sinks[it->sender].id) {
        r->wrong_sender++;
        return 0;
    }
    if (m->type == MSG_DONE) return ++r->done == SINKS ? tr_actor_stop(ctx->rt, ctx->self) : 0;
    if (it->seq != r->next[it->sender])
        r->out_of_order++;
    else
        r->next[it->sender]++;
    return 0;
}

static int producer_send(tr_runtime_t *rt, producer_t *p, int to)
{
    p->sent++;
    return send_item(rt, p->sinks[to], MSG_ITEM, p->id, p->seq[to]++);
}

/* One run of 1 to 300 messages to a random sink (fewer when the total is reached). */
static int random_run(tr_runtime_t *rt, producer_t *p)
{
    uint64_t r = tr_rng_next(&p->rng);
    int to = (int)(r % SINKS), rc = 0;
    for (uint64_t i = 0, len = 1 + (r >> 8) % 300; i < len && p->sent < p->total && rc == 0; i++)
        rc = producer_send(rt, p, to);
    return rc;
}

/* MSG_DONE to every sink, after all of p's items. */
static int send_done(tr_runtime_t *rt, const producer_t *p)
{
    int rc = 0;
    for (int k = 0; k < SINKS && rc == 0; k++)
        rc = send_item(rt, p->sinks[k], MSG_DONE, p->id, 0);
    return rc;
}

/* Fixed: 50 rounds of 80 messages to each sink in turn, in this one behaviour. Random: one
 * slice of 8 random runs, then MSG_GO to itself. */
static int producer_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    producer_t *p = ctx->state;
    int rc = 0;
    if (p->fixed) {
        for (int round = 0; round < 50 && rc == 0; round++)
            for (int k = 0; k < SINKS && rc == 0; k++)
                for (int i = 0; i < 80 && rc == 0; i++)
                    rc = producer_send(ctx->rt, p, k);
        p->total = p->sent;
    } else {
        for (int run = 0; run < 8 && p->sent < p->total && rc == 0; run++)
            rc = random_run(ctx->rt, p);
    }
    if (rc < 0) return rc;
    if (p->sent < p->total)
        return tr_actor_send(ctx->rt, ctx->self, tr_msg_alloc(ctx->rt, MSG_GO, 0));
    rc = send_done(ctx->rt, p);
    return rc < 0 ? rc : tr_actor_stop(ctx->rt, ctx->self);
}

/* A sender outside the runtime: random runs to random sinks, then MSG_DONE to each. */
typedef struct outsider {
    tr_runtime_t *rt;
    producer_t p;
    int rc;
} outsider_t;

static void *outsider_main(void *arg)
{
    outsider_t *o = arg;
    while (o->p.sent < o->p.total && o->rc == 0)
        o->rc = random_run(o->rt, &o->p);
    if (o->rc == 0) o->rc = send_done(o->rt, &o->p);
    return NULL;
}

typedef struct world {
    tr_runtime_t *rt;
    sink_t sinks[SINKS];
    tr_actor_t addr[SINKS];
    relay_t relay;
    producer_t producer;
    outsider_t out[SENDERS - 1];
    uint64_t wall_ns;
} world_t;

/* Spawns the sinks and the relay; `senders` of them send (the producer actor always). */
static void world_open(world_t *w, const tr_runtime_opts_t *o, uint32_t senders)
{
    memset(w, 0, sizeof(*w));
    assert_int_equal(tr_runtime_init(&w->rt, o), 0);
    tr_actor_t relay;
    w->relay.sinks = w->addr;
    assert_int_equal(tr_actor_spawn(w->rt, relay_behaviour, &w->relay, NULL, &relay), 0);
    for (uint32_t k = 0; k < SINKS; k++) {
        w->sinks[k] = (sink_t){.index = k, .senders = senders, .relay = relay};
        assert_int_equal(tr_actor_spawn(w->rt, sink_behaviour, &w->sinks[k], NULL, &w->addr[k]), 0);
        w->sinks[k].self = w->addr[k];
    }
}

/* Runs until every actor stopped, then checks what every sink and the relay saw. */
static void world_finish(world_t *w, uint32_t senders, uint64_t t0)
{
    assert_int_equal(tr_runtime_run(w->rt), 0);
    w->wall_ns = tr_now_ns() - t0;
    tr_runtime_close(w->rt);
    const producer_t *ps[SENDERS] = {&w->producer, &w->out[0].p, &w->out[1].p, &w->out[2].p};
    for (uint32_t k = 0; k < SINKS; k++) {
        const sink_t *s = &w->sinks[k];
        assert_int_equal(s->reentered, 0);
        assert_int_equal(s->wrong_self, 0);
        assert_int_equal(s->out_of_order, 0);
        uint64_t want = 0, sum = 0;
        for (uint32_t i = 0; i < senders; i++) {
            assert_int_equal(s->next[i], ps[i]->seq[k]); /* all of i's to k, once, in order */
            want += ps[i]->seq[k];
            for (uint64_t q = 0; q < ps[i]->seq[k]; q++)
                sum += stress_mix(((uint64_t)i << 40) ^ q);
        }
        assert_int_equal(s->received, want);
        assert_int_equal(s->checksum, sum);
        assert_int_equal(w->relay.next[k], s->relayed);
    }
    assert_int_equal(w->relay.wrong_sender, 0);
    assert_int_equal(w->relay.out_of_order, 0);
}

static void send_go(tr_runtime_t *rt, tr_actor_t *out, producer_t *p)
{
    assert_int_equal(tr_actor_spawn(rt, producer_behaviour, p, NULL, out), 0);
    assert_int_equal(tr_actor_send(rt, *out, tr_msg_alloc(rt, MSG_GO, 0)), 0);
}

/* Case 1's and 3's traffic: the producer fills eight mailboxes, one worker empties them.
 * Returns a hash of the handling order. */
static uint64_t fixed_traffic(world_t *w, const tr_runtime_opts_t *o)
{
    world_open(w, o, 1);
    w->producer = (producer_t){.id = 0, .sinks = w->addr, .fixed = 1};
    n_trace = 0;
    tracing = 1;
    work_ns = work_done_ns;
    uint64_t t0 = tr_now_ns();
    tr_actor_t p;
    send_go(w->rt, &p, &w->producer);
    world_finish(w, 1, t0);
    tracing = 0;
    work_ns = 0;
    uint64_t h = 0;
    for (size_t i = 0; i < n_trace; i++)
        h = stress_mix(h ^ ((uint64_t)trace[i] << 32) ^ i);
    return h;
}

/* Whether the message at i follows another sink's and its own sink had one among the
 * TR__GROUP_MAX before (A B A B, A B C A B C, ...). Runs of one sink give none. */
static int interleaved(size_t i)
{
    if (trace[i] == trace[i - 1]) return 0;
    for (size_t j = 2; j <= TR__GROUP_MAX; j++)
        if (trace[i - j] == trace[i]) return 1;
    return 0;
}

static void test_groups_interleave_mailboxes(void **state)
{
    (void)state;
    static world_t w;
    fixed_traffic(&w, &(tr_runtime_opts_t){.n_workers = 1});
    assert_int_equal(n_trace, w.producer.total);
    size_t n_interleaved = 0;
    for (size_t i = TR__GROUP_MAX; i < n_trace; i++)
        n_interleaved += (size_t)interleaved(i);
    printf("groups: %zu of %zu messages handled in turn with other sinks'\n", n_interleaved,
           n_trace);
    assert_true(n_interleaved > n_trace / 2);
    uint64_t run_ns = 0;
    for (int k = 0; k < SINKS; k++)
        run_ns += w.sinks[k].run_ns;
    printf("groups: the sinks' run_ns add up to %.2f ms of a %.2f ms run\n", run_ns / 1e6,
           w.wall_ns / 1e6);
    /* at least the work done, at most the run's wall time (10% for the tick calibration):
     * counting a group's time once for each of its actors would give about twice the work */
    assert_true(run_ns >= (uint64_t)n_trace * work_done_ns * 9 / 10);
    assert_true(run_ns <= w.wall_ns + w.wall_ns / 10);
}

static void test_stress_two_workers_outside_senders(void **state)
{
    (void)state;
    uint64_t seed = stress_seed("group stress", "TEST_GROUP_SEED");
    printf("group stress: %d senders x %llu messages to %d sinks\n", SENDERS,
           (unsigned long long)per_sender, SINKS);
    static world_t w;
    relaying = 1;
    world_open(&w, &(tr_runtime_opts_t){.n_workers = 2}, SENDERS);
    w.producer = (producer_t){.id = 0, .rng = seed, .total = per_sender, .sinks = w.addr};
    pthread_t th[SENDERS - 1];
    for (uint32_t i = 0; i < SENDERS - 1; i++) {
        w.out[i] = (outsider_t){
            .rt = w.rt,
            .p = {.id = i + 1, .rng = seed * 131 + i + 1, .total = per_sender, .sinks = w.addr}};
        assert_int_equal(pthread_create(&th[i], NULL, outsider_main, &w.out[i]), 0);
    }
    tr_actor_t p;
    uint64_t t0 = tr_now_ns();
    send_go(w.rt, &p, &w.producer);
    for (uint32_t i = 0; i < SENDERS - 1; i++) {
        pthread_join(th[i], NULL); /* before close: a thread may still be inside a send */
        assert_int_equal(w.out[i].rc, 0);
    }
    world_finish(&w, SENDERS, t0);
    relaying = 0;
}

static void test_deterministic_replay(void **state)
{
    (void)state;
    uint64_t seed = stress_seed("group replay", "TEST_GROUP_SEED");
    static world_t w;
    uint64_t a = fixed_traffic(&w, &(tr_runtime_opts_t){.deterministic = 1, .seed = seed});
    uint64_t b = fixed_traffic(&w, &(tr_runtime_opts_t){.deterministic = 1, .seed = seed});
    uint64_t c = fixed_traffic(&w, &(tr_runtime_opts_t){.deterministic = 1, .seed = seed + 1});
    assert_true(stress_replayed("group replay", seed, a, b, c));
}

/* Case 4: each message is 50 µs of work; which worker thread handled it is counted. */
static _Atomic uint64_t by_thread[2];
static _Atomic int threads_seen;
static _Thread_local int thread_slot = -1;

typedef struct busy {
    uint64_t left;
} busy_t;

static int busy_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    busy_t *b = ctx->state;
    if (thread_slot < 0) thread_slot = atomic_fetch_add(&threads_seen, 1);
    if (thread_slot < 2) atomic_fetch_add(&by_thread[thread_slot], 1);
    for (uint64_t t0 = tr_now_ns(); tr_now_ns() - t0 < 50000;) {
    }
    return --b->left ? 0 : tr_actor_stop(ctx->rt, ctx->self);
}

/* Sends every busy actor its messages from one behaviour, so that all of them are queued on
 * the starter's worker. */
typedef struct starter {
    tr_actor_t *busy;
    int n, each;
} starter_t;

static int starter_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    starter_t *st = ctx->state;
    for (int j = 0; j < st->each; j++)
        for (int i = 0; i < st->n; i++) {
            int rc = tr_actor_send(ctx->rt, st->busy[i], tr_msg_alloc(ctx->rt, MSG_ITEM, 0));
            if (rc < 0) return rc;
        }
    return tr_actor_stop(ctx->rt, ctx->self);
}

static void test_groups_leave_work_to_steal(void **state)
{
    (void)state;
    tr_runtime_t *rt;
    /* batches that never end: the actors stay in whatever group takes them */
    tr_runtime_opts_t o = {.n_workers = 2, .batch = 100000, .batch_ns = 1000000000};
    assert_int_equal(tr_runtime_init(&rt, &o), 0);
    enum { BUSY = 4, EACH = 400 }; /* 20 ms of work each: time for the idle worker to steal */
    busy_t b[BUSY];
    tr_actor_t addr[BUSY], s;
    for (int i = 0; i < BUSY; i++) {
        b[i].left = EACH;
        assert_int_equal(tr_actor_spawn(rt, busy_behaviour, &b[i], NULL, &addr[i]), 0);
    }
    starter_t st = {addr, BUSY, EACH};
    assert_int_equal(tr_actor_spawn(rt, starter_behaviour, &st, NULL, &s), 0);
    assert_int_equal(tr_actor_send(rt, s, tr_msg_alloc(rt, MSG_GO, 0)), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
    uint64_t n0 = atomic_load(&by_thread[0]), n1 = atomic_load(&by_thread[1]);
    printf("groups: the two workers handled %llu and %llu of %d messages\n", (unsigned long long)n0,
           (unsigned long long)n1, BUSY * EACH);
    assert_int_equal(n0 + n1, BUSY * EACH);
    assert_true(n0 >= BUSY * EACH / 5 && n1 >= BUSY * EACH / 5);
}

/* Case 5. */
enum { MSG_FAIL = MSG_RELAY + 1, MSG_NOOP };
static tr_actor_t c5, s5, x5, a5;
static int inits5, exits5, slot_reused;
static _Atomic int watchdog_fired;

static uint64_t alive(tr_runtime_t *rt)
{
    tr_runtime_stats_t st;
    tr_runtime_stats(rt, &st);
    return st.actors_alive;
}

static void *watchdog(void *arg)
{
    tr_runtime_t *rt = arg;
    for (int i = 0; i < 500 && alive(rt); i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    if (alive(rt)) {
        atomic_store(&watchdog_fired, 1);
        tr_runtime_shutdown(rt, "watchdog: an actor never ran");
    }
    return NULL;
}

/* Runs rt until every actor stopped, under the watchdog. */
static void run_watched(tr_runtime_t *rt)
{
    pthread_t th;
    atomic_store(&watchdog_fired, 0);
    assert_int_equal(pthread_create(&th, NULL, watchdog, rt), 0);
    int rc = tr_runtime_run(rt);
    pthread_join(th, NULL);
    tr_runtime_close(rt);
    assert_int_equal(atomic_load(&watchdog_fired), 0);
    assert_int_equal(rc, 0);
}

static int c5_init(tr_ctx_t *ctx)
{
    (void)ctx;
    return ++inits5 >= 2 ? TR_EIO : 0; /* the restarted generation fails in its init */
}

static int c5_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)ctx;
    return m->type == MSG_FAIL ? TR_EIO : 0;
}

static int s5_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    if (m->type != TR_MSG_EXIT) return 0;
    if (++exits5 == 1) return tr_actor_restart(ctx->rt, c5, &c5);
    return tr_actor_stop(ctx->rt, ctx->self);
}

static int stop_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    return tr_actor_stop(ctx->rt, ctx->self);
}

/* Sends its first message's three receivers one message each from one behaviour, so that
 * with one worker the three are queued together and run as one group. */
static int three_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    const tr_actor_t *to = ctx->state;
    uint32_t types[3] = {MSG_FAIL, MSG_NOOP, MSG_NOOP};
    for (int i = 0; i < 3; i++) {
        int rc = tr_actor_send(ctx->rt, to[i], tr_msg_alloc(ctx->rt, types[i], 0));
        if (rc < 0) return rc;
    }
    return tr_actor_stop(ctx->rt, ctx->self);
}

static void start_three(tr_runtime_t *rt, tr_actor_t *three)
{
    tr_actor_t st;
    assert_int_equal(tr_actor_spawn(rt, three_behaviour, three, NULL, &st), 0);
    assert_int_equal(tr_actor_send(rt, st, tr_msg_alloc(rt, MSG_GO, 0)), 0);
}

static void test_restart_in_a_group_runs_init(void **state)
{
    (void)state;
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 1}), 0);
    inits5 = exits5 = 0;
    assert_int_equal(tr_actor_spawn(rt, s5_behaviour, NULL, NULL, &s5), 0);
    tr_actor_opts_t o = {.supervisor = s5, .init = c5_init};
    assert_int_equal(tr_actor_spawn(rt, c5_behaviour, NULL, &o, &c5), 0);
    assert_int_equal(tr_actor_spawn(rt, stop_behaviour, NULL, NULL, &x5), 0);
    tr_actor_t three[3] = {c5, s5, x5};
    start_three(rt, three);
    run_watched(rt);
    assert_int_equal(inits5, 2); /* the first generation's, and the restarted one's */
    assert_int_equal(exits5, 2);
}

static int n5_init(tr_ctx_t *ctx)
{
    inits5++;
    return tr_actor_send(ctx->rt, ctx->self, tr_msg_alloc(ctx->rt, MSG_NOOP, 0));
}

/* The spawned generation's first message, handled in its first activation: none counted yet
 * (the stopped actor's activation that ended in the slot meanwhile is not its own). */
static uint64_t n5_activations = 99;

static int n5_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    tr_actor_stats_t st;
    if (tr_actor_stats(ctx->rt, ctx->self, &st) == 0) n5_activations = st.activations;
    return stop_behaviour(ctx, m);
}

static int spawner_behaviour(tr_ctx_t *ctx, tr_msg_t *m)
{
    (void)m;
    tr_actor_t n;
    int rc = tr_actor_spawn(ctx->rt, n5_behaviour, NULL, &(tr_actor_opts_t){.init = n5_init}, &n);
    if (rc < 0) return rc;
    slot_reused = (uint32_t)n.id == (uint32_t)a5.id; /* the slot a5 freed in this group */
    return tr_actor_stop(ctx->rt, ctx->self);
}

static void test_spawn_into_a_freed_slot_in_a_group_runs_init(void **state)
{
    (void)state;
    tr_runtime_t *rt;
    assert_int_equal(tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 1}), 0);
    inits5 = slot_reused = 0;
    tr_actor_t b, x;
    assert_int_equal(tr_actor_spawn(rt, stop_behaviour, NULL, NULL, &a5), 0);
    assert_int_equal(tr_actor_spawn(rt, spawner_behaviour, NULL, NULL, &b), 0);
    assert_int_equal(tr_actor_spawn(rt, stop_behaviour, NULL, NULL, &x), 0);
    tr_actor_t three[3] = {a5, b, x};
    start_three(rt, three);
    run_watched(rt);
    assert_true(slot_reused);
    assert_int_equal(inits5, 1);
    assert_int_equal(n5_activations, 0);
}

int main(int argc, char **argv)
{
    if (argc > 1) per_sender = strtoull(argv[1], NULL, 10) / SENDERS;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_groups_interleave_mailboxes),
        cmocka_unit_test(test_stress_two_workers_outside_senders),
        cmocka_unit_test(test_deterministic_replay),
        cmocka_unit_test(test_groups_leave_work_to_steal),
        cmocka_unit_test(test_restart_in_a_group_runs_init),
        cmocka_unit_test(test_spawn_into_a_freed_slot_in_a_group_runs_init),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
