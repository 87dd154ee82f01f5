/* savina.c: seven of the Savina actor micro-benchmarks (Imam and Sarkar, AGERE 2014) on
 * Troupe, with Savina's standard parameters. Each follows the message protocol of Savina's
 * own implementations, so the message counts equal those of the CAF peer:
 *
 *   pingpong    two actors, PINGPONG_N ping/pong round trips
 *   counting    a producer sends COUNTING_N increments to a counter, then asks for the total
 *   threadring  a token hops THREADRING_HOPS times around a ring of THREADRING_ACTORS
 *   chameneos   creatures meet in pairs through a mall, CHAMENEOS_MEETINGS meetings in all
 *   big         BIG_ACTORS actors each ping random others BIG_PINGS times, waiting for pongs
 *   fjthrput    the main thread sends FJTHRPUT_N messages to each of FJTHRPUT_ACTORS actors
 *   fib         fib(FIB_N), one actor per call of the recursion
 *
 * Every program checks what it computed (a count, a sum) and fails the run if it is wrong.
 */
#include <math.h>
#include <stdlib.h>

#include "benches.h"

enum {
    MSG_START = TR_MSG_USER,
    MSG_PING,
    MSG_PONG,
    MSG_STOP,
    MSG_INC,
    MSG_GET,
    MSG_RESULT,
    MSG_TOKEN,
    MSG_EXIT,
    MSG_MEET,
    MSG_CHANGE,
    MSG_COUNT,
    MSG_WORK,
    MSG_REQUEST,
    MSG_RESPONSE,
};

/* --- pingpong -------------------------------------------------------------------------- */

typedef struct pp_ping {
    uint64_t left;  /* pings still to send */
    uint64_t pongs; /* pongs received */
    tr_actor_t pong;
} pp_ping_t;

static int pp_ping(tr_ctx_t *ctx, tr_msg_t *m)
{
    pp_ping_t *s = ctx->state;
    if (m->type == MSG_PONG) s->pongs++;
    if (s->left == 0) {
        bench_send(ctx->rt, s->pong, MSG_STOP, NULL, 0);
        return tr_actor_stop(ctx->rt, ctx->self);
    }
    s->left--;
    return bench_send(ctx->rt, s->pong, MSG_PING, NULL, 0);
}

static int pp_pong(tr_ctx_t *ctx, tr_msg_t *m)
{
    if (m->type == MSG_STOP) return tr_actor_stop(ctx->rt, ctx->self);
    return bench_send(ctx->rt, m->sender, MSG_PONG, NULL, 0);
}

int bench_pingpong(const bench_args_t *a, double *ms)
{
    tr_runtime_t *rt;
    if (bench_rt_open(a, &rt) < 0) return -1;
    pp_ping_t ping = {.left = PINGPONG_N};
    tr_actor_t p;
    uint64_t t0 = tr_now_ns();
    int rc = tr_actor_spawn(rt, pp_pong, NULL, NULL, &ping.pong);
    if (rc == 0) rc = tr_actor_spawn(rt, pp_ping, &ping, NULL, &p);
    if (rc == 0) rc = bench_send(rt, p, MSG_START, NULL, 0);
    if (bench_rt_finish(rt, rc, "pingpong", t0, ms) < 0) return -1;
    if (ping.pongs != PINGPONG_N) {
        fprintf(stderr, "pingpong: %llu pongs, expected %d\n", (unsigned long long)ping.pongs,
                PINGPONG_N);
        return -1;
    }
    return 0;
}

/* --- counting -------------------------------------------------------------------------- */

typedef struct count_producer {
    tr_actor_t counter;
    uint64_t result;
} count_producer_t;

static int count_producer(tr_ctx_t *ctx, tr_msg_t *m)
{
    count_producer_t *s = ctx->state;
    if (m->type == MSG_RESULT) {
        s->result = bench_body_u64(m);
        return tr_actor_stop(ctx->rt, ctx->self);
    }
    for (int i = 0; i < COUNTING_N; i++) {
        int rc = bench_send(ctx->rt, s->counter, MSG_INC, NULL, 0);
        if (rc < 0) return rc;
    }
    return bench_send(ctx->rt, s->counter, MSG_GET, NULL, 0);
}

static int count_counter(tr_ctx_t *ctx, tr_msg_t *m)
{
    uint64_t *count = ctx->state;
    if (m->type == MSG_INC) {
        ++*count;
        return 0;
    }
    tr_actor_stop(ctx->rt, ctx->self);
    return bench_send_u64(ctx->rt, m->sender, MSG_RESULT, *count);
}

int bench_counting(const bench_args_t *a, double *ms)
{
    tr_runtime_t *rt;
    if (bench_rt_open(a, &rt) < 0) return -1;
    uint64_t count = 0;
    count_producer_t prod = {0};
    tr_actor_t p;
    uint64_t t0 = tr_now_ns();
    int rc = tr_actor_spawn(rt, count_counter, &count, NULL, &prod.counter);
    if (rc == 0) rc = tr_actor_spawn(rt, count_producer, &prod, NULL, &p);
    if (rc == 0) rc = bench_send(rt, p, MSG_START, NULL, 0);
    if (bench_rt_finish(rt, rc, "counting", t0, ms) < 0) return -1;
    if (prod.result != COUNTING_N) {
        fprintf(stderr, "counting: counted %llu, expected %d\n", (unsigned long long)prod.result,
                COUNTING_N);
        return -1;
    }
    return 0;
}

/* --- threadring ------------------------------------------------------------------------ */

typedef struct ring_node {
    tr_actor_t next;
    uint64_t tokens; /* tokens handled here */
} ring_node_t;

/* A token carries the hops left; at 0 the holder starts an exit message around the ring,
 * which carries how many actors it has still to stop. */
static int ring_node(tr_ctx_t *ctx, tr_msg_t *m)
{
    ring_node_t *s = ctx->state;
    uint64_t left = bench_body_u64(m);
    if (m->type == MSG_TOKEN) {
        s->tokens++;
        return left > 0 ? bench_send_u64(ctx->rt, s->next, MSG_TOKEN, left - 1)
                        : bench_send_u64(ctx->rt, s->next, MSG_EXIT, THREADRING_ACTORS);
    }
    if (left > 1) {
        int rc = bench_send_u64(ctx->rt, s->next, MSG_EXIT, left - 1);
        if (rc < 0) return rc;
    }
    return tr_actor_stop(ctx->rt, ctx->self);
}

int bench_threadring(const bench_args_t *a, double *ms)
{
    tr_runtime_t *rt;
    if (bench_rt_open(a, &rt) < 0) return -1;
    ring_node_t nodes[THREADRING_ACTORS];
    memset(nodes, 0, sizeof(nodes));
    tr_actor_t addr[THREADRING_ACTORS];
    uint64_t t0 = tr_now_ns();
    int rc = 0;
    for (int i = 0; i < THREADRING_ACTORS && rc == 0; i++)
        rc = tr_actor_spawn(rt, ring_node, &nodes[i], NULL, &addr[i]);
    /* the ring is closed before any token moves: nothing runs until the first send */
    for (int i = 0; i < THREADRING_ACTORS && rc == 0; i++)
        nodes[i].next = addr[(i + 1) % THREADRING_ACTORS];
    if (rc == 0) rc = bench_send_u64(rt, addr[0], MSG_TOKEN, THREADRING_HOPS);
    if (bench_rt_finish(rt, rc, "threadring", t0, ms) < 0) return -1;
    uint64_t tokens = 0;
    for (int i = 0; i < THREADRING_ACTORS; i++)
        tokens += nodes[i].tokens;
    if (tokens != THREADRING_HOPS + 1) {
        fprintf(stderr, "threadring: %llu token messages, expected %d\n",
                (unsigned long long)tokens, THREADRING_HOPS + 1);
        return -1;
    }
    return 0;
}

/* --- chameneos ------------------------------------------------------------------------- */

enum { RED, YELLOW, BLUE, FADED };

static uint32_t complement(uint32_t c, uint32_t other)
{
    if (c == FADED || other == FADED) return FADED;
    return c == other ? c : 3 - c - other; /* the third colour */
}

typedef struct meet {
    uint32_t color;
    tr_actor_t from; /* the creature that asked to meet (the mall forwards it) */
} meet_t;

typedef struct mall {
    uint64_t meetings_left;
    tr_actor_t waiting; /* TR_ACTOR_NONE when nobody waits */
    uint64_t sum, faded;
} mall_t;

typedef struct creature {
    tr_actor_t mall;
    uint32_t color;
    uint64_t meetings;
} creature_t;

static int mall(tr_ctx_t *ctx, tr_msg_t *m)
{
    mall_t *s = ctx->state;
    if (m->type == MSG_COUNT) {
        s->sum += bench_body_u64(m);
        if (++s->faded == CHAMENEOS_CREATURES) return tr_actor_stop(ctx->rt, ctx->self);
        return 0;
    }
    meet_t *mt = tr_msg_body(m);
    if (s->meetings_left == 0) return bench_send(ctx->rt, mt->from, MSG_EXIT, NULL, 0);
    if (tr_actor_is_none(s->waiting)) {
        s->waiting = mt->from;
        return 0;
    }
    s->meetings_left--;
    tr_actor_t w = s->waiting;
    s->waiting = TR_ACTOR_NONE;
    return bench_send(ctx->rt, w, MSG_MEET, mt, sizeof(*mt));
}

static int creature_meet(tr_ctx_t *ctx, creature_t *s)
{
    meet_t mt = {.color = s->color, .from = ctx->self};
    return bench_send(ctx->rt, s->mall, MSG_MEET, &mt, sizeof(mt));
}

static int creature_init(tr_ctx_t *ctx)
{
    return creature_meet(ctx, ctx->state);
}

static int creature(tr_ctx_t *ctx, tr_msg_t *m)
{
    creature_t *s = ctx->state;
    if (m->type == MSG_MEET) {
        meet_t *mt = tr_msg_body(m);
        s->color = complement(s->color, mt->color);
        s->meetings++;
        int rc = bench_send(ctx->rt, mt->from, MSG_CHANGE, &s->color, sizeof(s->color));
        return rc < 0 ? rc : creature_meet(ctx, s);
    }
    if (m->type == MSG_CHANGE) {
        memcpy(&s->color, tr_msg_body(m), sizeof(s->color));
        s->meetings++;
        return creature_meet(ctx, s);
    }
    s->color = FADED;
    tr_actor_stop(ctx->rt, ctx->self);
    return bench_send_u64(ctx->rt, s->mall, MSG_COUNT, s->meetings);
}

int bench_chameneos(const bench_args_t *a, double *ms)
{
    tr_runtime_t *rt;
    if (bench_rt_open(a, &rt) < 0) return -1;
    mall_t ms_state = {.meetings_left = CHAMENEOS_MEETINGS};
    creature_t cs[CHAMENEOS_CREATURES];
    tr_actor_opts_t copts = {.init = creature_init};
    tr_actor_t m, c;
    uint64_t t0 = tr_now_ns();
    int rc = tr_actor_spawn(rt, mall, &ms_state, NULL, &m);
    for (int i = 0; i < CHAMENEOS_CREATURES && rc == 0; i++) {
        cs[i] = (creature_t){.mall = m, .color = (uint32_t)(i % 3)};
        rc = tr_actor_spawn(rt, creature, &cs[i], &copts, &c);
    }
    if (bench_rt_finish(rt, rc, "chameneos", t0, ms) < 0) return -1;
    if (ms_state.sum != 2ull * CHAMENEOS_MEETINGS) {
        fprintf(stderr, "chameneos: %llu meetings counted, expected %d\n",
                (unsigned long long)ms_state.sum, 2 * CHAMENEOS_MEETINGS);
        return -1;
    }
    return 0;
}

/* --- big ------------------------------------------------------------------------------- */

typedef struct big_actor {
    uint32_t id;
    int32_t expected; /* the neighbour the last ping went to */
    uint64_t pings, pongs, errors;
    uint64_t rng;
    const tr_actor_t *all; /* every big actor, by id */
    tr_actor_t sink;
} big_actor_t;

typedef struct big_sink {
    uint64_t exits;
    const tr_actor_t *all;
} big_sink_t;

static int big_actor(tr_ctx_t *ctx, tr_msg_t *m)
{
    big_actor_t *s = ctx->state;
    int64_t from;
    switch (m->type) {
    case MSG_PING:
        return bench_send_u64(ctx->rt, s->all[bench_body_u64(m)], MSG_PONG, s->id);
    case MSG_PONG:
        from = (int64_t)bench_body_u64(m);
        if (from >= 0) s->pongs++;
        if (from != s->expected) s->errors++;
        if (s->pings == BIG_PINGS) return bench_send(ctx->rt, s->sink, MSG_EXIT, NULL, 0);
        s->expected = (int32_t)bench_rand(&s->rng, BIG_ACTORS);
        s->pings++;
        return bench_send_u64(ctx->rt, s->all[s->expected], MSG_PING, s->id);
    default:
        return tr_actor_stop(ctx->rt, ctx->self);
    }
}

static int big_sink(tr_ctx_t *ctx, tr_msg_t *m)
{
    big_sink_t *s = ctx->state;
    if (++s->exits < BIG_ACTORS) return 0;
    for (int i = 0; i < BIG_ACTORS; i++) {
        int rc = bench_send(ctx->rt, s->all[i], MSG_EXIT, NULL, 0);
        if (rc < 0) return rc;
    }
    return tr_actor_stop(ctx->rt, ctx->self);
}

int bench_big(const bench_args_t *a, double *ms)
{
    tr_runtime_t *rt;
    if (bench_rt_open(a, &rt) < 0) return -1;
    static big_actor_t st[BIG_ACTORS];
    static tr_actor_t all[BIG_ACTORS];
    big_sink_t sink_state = {.all = all};
    tr_actor_t sink;
    uint64_t t0 = tr_now_ns();
    int rc = tr_actor_spawn(rt, big_sink, &sink_state, NULL, &sink);
    for (uint32_t i = 0; i < BIG_ACTORS && rc == 0; i++) {
        st[i] = (big_actor_t){.id = i, .expected = -1, .rng = i + 1, .all = all, .sink = sink};
        rc = tr_actor_spawn(rt, big_actor, &st[i], NULL, &all[i]);
    }
    /* every address is known before the first pong starts the pinging */
    for (int i = 0; i < BIG_ACTORS && rc == 0; i++)
        rc = bench_send_u64(rt, all[i], MSG_PONG, (uint64_t)-1);
    if (bench_rt_finish(rt, rc, "big", t0, ms) < 0) return -1;
    uint64_t pongs = 0, errors = 0;
    for (int i = 0; i < BIG_ACTORS; i++) {
        pongs += st[i].pongs;
        errors += st[i].errors;
    }
    if (pongs != (uint64_t)BIG_ACTORS * BIG_PINGS || errors) {
        fprintf(stderr, "big: %llu pongs (expected %d), %llu from the wrong actor\n",
                (unsigned long long)pongs, BIG_ACTORS * BIG_PINGS, (unsigned long long)errors);
        return -1;
    }
    return 0;
}

/* --- fjthrput -------------------------------------------------------------------------- */

/* Savina's per-message work: sin(theta)^2, theta read at run time so it is really done. */
static volatile double fj_theta = 37.2;

typedef struct fj_actor {
    uint64_t handled;
    double acc;
} fj_actor_t;

static int fj_actor(tr_ctx_t *ctx, tr_msg_t *m)
{
    fj_actor_t *s = ctx->state;
    double sint = sin(fj_theta);
    s->acc += sint * sint;
    if (++s->handled == FJTHRPUT_N) return tr_actor_stop(ctx->rt, ctx->self);
    return 0;
}

int bench_fjthrput(const bench_args_t *a, double *ms)
{
    tr_runtime_t *rt;
    if (bench_rt_open(a, &rt) < 0) return -1;
    fj_actor_t st[FJTHRPUT_ACTORS];
    memset(st, 0, sizeof(st));
    tr_actor_t addr[FJTHRPUT_ACTORS];
    uint64_t t0 = tr_now_ns();
    int rc = 0;
    for (int i = 0; i < FJTHRPUT_ACTORS && rc == 0; i++)
        rc = tr_actor_spawn(rt, fj_actor, &st[i], NULL, &addr[i]);
    for (int n = 0; n < FJTHRPUT_N && rc == 0; n++)
        for (int i = 0; i < FJTHRPUT_ACTORS && rc == 0; i++)
            rc = bench_send(rt, addr[i], MSG_WORK, NULL, 0);
    if (bench_rt_finish(rt, rc, "fjthrput", t0, ms) < 0) return -1;
    uint64_t handled = 0;
    for (int i = 0; i < FJTHRPUT_ACTORS; i++)
        handled += st[i].handled;
    if (handled != (uint64_t)FJTHRPUT_ACTORS * FJTHRPUT_N || !(st[0].acc > 0)) {
        fprintf(stderr, "fjthrput: %llu messages handled, expected %d\n",
                (unsigned long long)handled, FJTHRPUT_ACTORS * FJTHRPUT_N);
        return -1;
    }
    return 0;
}

/* --- fib ------------------------------------------------------------------------------- */

/* An inner call: spawns its two sub-calls and sums their responses. Calls with n <= 2 are
 * leaves (fib_leaf), which need no state. The root has no parent and stores its sum. */
typedef struct fib_call {
    tr_actor_t parent;
    uint32_t responses;
    uint64_t sum;
    uint64_t *result; /* root only */
} fib_call_t;

static int fib_call(tr_ctx_t *ctx, tr_msg_t *m);

static int fib_leaf(tr_ctx_t *ctx, tr_msg_t *m)
{
    tr_actor_stop(ctx->rt, ctx->self);
    return bench_send_u64(ctx->rt, m->sender, MSG_RESPONSE, 1);
}

static void fib_cleanup(tr_ctx_t *ctx, int reason)
{
    free(ctx->state);
}

static int fib_spawn_call(tr_ctx_t *ctx, uint64_t n)
{
    tr_actor_t child;
    fib_call_t *st = NULL;
    int rc;
    if (n <= 2) {
        rc = tr_actor_spawn(ctx->rt, fib_leaf, NULL, NULL, &child);
    } else {
        static const tr_actor_opts_t opts = {.cleanup = fib_cleanup};
        if (!(st = calloc(1, sizeof(*st)))) return TR_ENOMEM;
        rc = tr_actor_spawn(ctx->rt, fib_call, st, &opts, &child);
    }
    if (rc < 0) {
        free(st);
        return rc;
    }
    return bench_send_u64(ctx->rt, child, MSG_REQUEST, n);
}

static int fib_call(tr_ctx_t *ctx, tr_msg_t *m)
{
    fib_call_t *s = ctx->state;
    uint64_t v = bench_body_u64(m);
    if (m->type == MSG_REQUEST) {
        s->parent = m->sender;
        if (v <= 2) {
            s->responses = 1; /* a root leaf: answer at once */
            s->sum = 0;
            v = 1;
        } else {
            int rc = fib_spawn_call(ctx, v - 1);
            return rc < 0 ? rc : fib_spawn_call(ctx, v - 2);
        }
    }
    s->sum += v;
    if (++s->responses < 2) return 0;
    tr_actor_stop(ctx->rt, ctx->self);
    if (s->result) {
        *s->result = s->sum;
        return 0;
    }
    return bench_send_u64(ctx->rt, s->parent, MSG_RESPONSE, s->sum);
}

int bench_fib(const bench_args_t *a, double *ms)
{
    tr_runtime_t *rt;
    if (bench_rt_open(a, &rt) < 0) return -1;
    uint64_t result = 0;
    fib_call_t root = {.result = &result};
    tr_actor_t r;
    uint64_t t0 = tr_now_ns();
    int rc = tr_actor_spawn(rt, fib_call, &root, NULL, &r);
    if (rc == 0) rc = bench_send_u64(rt, r, MSG_REQUEST, FIB_N);
    if (bench_rt_finish(rt, rc, "fib", t0, ms) < 0) return -1;
    if (result != FIB_EXPECT) {
        fprintf(stderr, "fib: fib(%d) = %llu, expected %llu\n", FIB_N, (unsigned long long)result,
                FIB_EXPECT);
        return -1;
    }
    return 0;
}
