/* fanin.c: many producers, one consumer. P producer actors (P = 1, 2, 4, 8) share
 * FANIN_TOTAL messages and send them to one consumer, FANIN_CHUNK per activation (a
 * producer sends itself a GO message to continue, so producers and the consumer interleave
 * instead of one producer filling the mailbox in a single call). The consumer counts and
 * stops at FANIN_TOTAL. Result: messages per second, from the first spawn to the last
 * actor's stop, as `fanin_P: X Mmsg/s`. Target: at least 5 M messages/s.
 */
#include "benches.h"

enum { MSG_GO = TR_MSG_USER + 200, MSG_DATA };

typedef struct producer {
    tr_actor_t consumer;
    uint64_t left;
} producer_t;

typedef struct consumer {
    uint64_t received;
    uint64_t sum; /* of the producers' sequence numbers, to check nothing was lost */
} consumer_t;

static int producer(tr_ctx_t *ctx, tr_msg_t *m)
{
    producer_t *s = ctx->state;
    uint64_t n = s->left < FANIN_CHUNK ? s->left : FANIN_CHUNK;
    for (uint64_t i = 0; i < n; i++) {
        int rc = bench_send_u64(ctx->rt, s->consumer, MSG_DATA, s->left - i);
        if (rc < 0) return rc;
    }
    s->left -= n;
    if (s->left == 0) return tr_actor_stop(ctx->rt, ctx->self);
    return bench_send(ctx->rt, ctx->self, MSG_GO, NULL, 0);
}

static int consumer(tr_ctx_t *ctx, tr_msg_t *m)
{
    consumer_t *s = ctx->state;
    s->sum += bench_body_u64(m);
    if (++s->received == FANIN_TOTAL) return tr_actor_stop(ctx->rt, ctx->self);
    return 0;
}

/* One run with p producers; 0 and *ms, or -1. */
static int fanin_once(const bench_args_t *a, unsigned p, double *ms)
{
    tr_runtime_t *rt;
    if (bench_rt_open(a, &rt) < 0) return -1;
    consumer_t cs = {0};
    producer_t ps[8];
    tr_actor_t c, addr[8];
    uint64_t per = FANIN_TOTAL / p;
    uint64_t t0 = tr_now_ns();
    int rc = tr_actor_spawn(rt, consumer, &cs, NULL, &c);
    for (unsigned i = 0; i < p && rc == 0; i++) {
        ps[i] = (producer_t){.consumer = c, .left = per};
        rc = tr_actor_spawn(rt, producer, &ps[i], NULL, &addr[i]);
    }
    for (unsigned i = 0; i < p && rc == 0; i++)
        rc = bench_send(rt, addr[i], MSG_GO, NULL, 0);
    if (bench_rt_finish(rt, rc, "fanin", t0, ms) < 0) return -1;
    uint64_t want = p * (per * (per + 1) / 2);
    if (cs.received != FANIN_TOTAL || cs.sum != want) {
        fprintf(stderr, "fanin_%u: received %llu (sum %llu), expected %d (sum %llu)\n", p,
                (unsigned long long)cs.received, (unsigned long long)cs.sum, FANIN_TOTAL,
                (unsigned long long)want);
        return -1;
    }
    return 0;
}

int bench_fanin(const bench_args_t *a)
{
    static const unsigned producers[] = {1, 2, 4, 8};
    for (size_t k = 0; k < sizeof(producers) / sizeof(producers[0]); k++) {
        unsigned p = producers[k];
        char name[32];
        snprintf(name, sizeof(name), "fanin_%u", p);
        if (!bench_selected(a, name)) continue;
        double ms[BENCH_MAX_REPS];
        for (int r = 0; r < a->reps; r++)
            if (fanin_once(a, p, &ms[r]) < 0) return -1;
        double med = bench_median(ms, a->reps);
        bench_print(name, FANIN_TOTAL / (med / 1e3) / 1e6, "Mmsg/s");
    }
    return 0;
}
