/* idle.c: how fast a sleeping runtime answers, and what an idle one costs.
 *
 * latency: an actor woken by a runtime timer every ~1 ms stamps a message and sends it to
 *   another actor, which records (time its behaviour starts - stamp). The same program as the
 *   Go, Erlang and CAF peers' (a goroutine or process that sleeps 1 ms and sends; a CAF actor
 *   woken by delayed_send): one actor to another inside the runtime, right after a wake-up.
 * wakeup: a thread outside the runtime (a trainer's thread) sends one message every ~1 ms to
 *   an actor; between sends every worker has nothing to do and parks, so each message must
 *   wake one. Same recording. Target: p99 < 50 us. CAF's peer sends from its main thread the
 *   same way; Go and Erlang have no thread outside their runtimes to send from.
 *   Both: LATENCY_WARMUP messages are dropped, then LATENCY_SAMPLES are kept: p50, p90, p99
 *   and max in microseconds, each the median over --reps runs (harness.h), a fresh runtime
 *   each.
 * idle_cpu: IDLE_ACTORS actors are spawned and each handles one message; then the runtime
 *   sits with nothing to do for IDLE_MS. Process CPU time (every thread) over that window,
 *   as a percentage of one core, read from outside (bench_idle_pct). Target: < 1%.
 */
#include <pthread.h>
#include <stdlib.h>

#include "benches.h"

enum { MSG_STAMP = TR_MSG_USER + 300, MSG_POKE };

/* --- the receiving end of both latency programs ---------------------------------------- */

typedef struct lat_actor {
    uint64_t *samples;
    size_t n; /* messages handled, warm-up included */
} lat_actor_t;

static int lat_actor(tr_ctx_t *ctx, tr_msg_t *m)
{
    uint64_t now = tr_now_ns();
    lat_actor_t *s = ctx->state;
    if (s->n >= LATENCY_WARMUP) s->samples[s->n - LATENCY_WARMUP] = now - bench_body_u64(m);
    if (++s->n == LATENCY_WARMUP + LATENCY_SAMPLES) return tr_actor_stop(ctx->rt, ctx->self);
    return 0;
}

/* Runs the runtime until the receiver has its samples (sender_rc: the sending side's
 * outcome, read after run returns). 0, or -1 after saying what went wrong. */
static int lat_finish(tr_runtime_t *rt, const char *name, lat_actor_t *st, const int *sender_rc,
                      pthread_t *joined)
{
    int run_rc = tr_runtime_run(rt);
    if (joined)
        pthread_join(*joined, NULL); /* before close: it may still be inside its last send */
    if (run_rc < 0) fprintf(stderr, "%s: %s\n", name, tr_runtime_failure(rt));
    tr_runtime_close(rt);
    if (run_rc < 0 || *sender_rc < 0 || st->n != LATENCY_WARMUP + LATENCY_SAMPLES) {
        fprintf(stderr, "%s: %zu of %d messages handled (%s)\n", name, st->n,
                LATENCY_WARMUP + LATENCY_SAMPLES, tr_strerror(*sender_rc));
        return -1;
    }
    return 0;
}

/* --- latency: a timer wakes one actor, which sends to another -------------------------- */

typedef struct tick_actor {
    tr_actor_t to;
    int sent, rc;
} tick_actor_t;

/* Each firing stamps and sends, then arms the next one-shot, in the peers' order (Go's and
 * Erlang's sender sends, then sleeps; the receiver runs after the next sleep is armed). */
static int tick_actor(tr_ctx_t *ctx, tr_msg_t *m)
{
    tick_actor_t *s = ctx->state;
    uint64_t timer; /* not kept: each one-shot ends by firing */
    if (m->type != TR_MSG_TIMER) return s->rc = TR_EINVAL;
    if ((s->rc = bench_send_u64(ctx->rt, s->to, MSG_STAMP, tr_now_ns())) < 0) return s->rc;
    if (++s->sent == LATENCY_WARMUP + LATENCY_SAMPLES) return tr_actor_stop(ctx->rt, ctx->self);
    return s->rc = tr_timer_start(ctx->rt, ctx->self, 0, LATENCY_GAP_NS, 0, &timer);
}

static int latency_once(const bench_args_t *a, uint64_t *samples)
{
    tr_runtime_t *rt;
    if (bench_rt_open(a, &rt) < 0) return -1;
    lat_actor_t st = {.samples = samples};
    tick_actor_t tick = {.rc = 0};
    tr_actor_t ticker;
    uint64_t timer;
    int rc = tr_actor_spawn(rt, lat_actor, &st, NULL, &tick.to);
    if (rc == 0) rc = tr_actor_spawn(rt, tick_actor, &tick, NULL, &ticker);
    if (rc == 0) rc = tr_timer_start(rt, ticker, 0, LATENCY_GAP_NS, 0, &timer);
    if (rc < 0) return bench_rt_finish(rt, rc, "latency", 0, NULL);
    return lat_finish(rt, "latency", &st, &tick.rc, NULL);
}

int bench_latency(const bench_args_t *a)
{
    return bench_latency_reps(a, "latency", LATENCY_SAMPLES, latency_once);
}

/* --- wakeup: a thread outside the runtime sends --------------------------------------- */

typedef struct lat_sender {
    tr_runtime_t *rt;
    tr_actor_t to;
    int rc;
} lat_sender_t;

static void *lat_send_loop(void *arg)
{
    lat_sender_t *s = arg;
    for (int i = 0; i < LATENCY_WARMUP + LATENCY_SAMPLES && s->rc == 0; i++) {
        bench_sleep_ns(LATENCY_GAP_NS);
        s->rc = bench_send_u64(s->rt, s->to, MSG_STAMP, tr_now_ns());
    }
    if (s->rc < 0) tr_actor_stop(s->rt, s->to); /* so that tr_runtime_run returns */
    return NULL;
}

static int wakeup_once(const bench_args_t *a, uint64_t *samples)
{
    tr_runtime_t *rt;
    if (bench_rt_open(a, &rt) < 0) return -1;
    lat_actor_t st = {.samples = samples};
    lat_sender_t snd = {.rt = rt};
    pthread_t th;
    int rc = tr_actor_spawn(rt, lat_actor, &st, NULL, &snd.to);
    if (rc == 0 && pthread_create(&th, NULL, lat_send_loop, &snd) != 0) rc = TR_EAGAIN;
    if (rc < 0) return bench_rt_finish(rt, rc, "wakeup", 0, NULL);
    return lat_finish(rt, "wakeup", &st, &snd.rc, &th);
}

int bench_wakeup(const bench_args_t *a)
{
    return bench_latency_reps(a, "wakeup", LATENCY_SAMPLES, wakeup_once);
}

/* --- idle CPU -------------------------------------------------------------------------- */

static int idle_actor(tr_ctx_t *ctx, tr_msg_t *m)
{
    ++*(uint64_t *)ctx->state; /* this actor's own counter */
    return 0;
}

int bench_idle_cpu(const bench_args_t *a)
{
    tr_runtime_t *rt;
    if (bench_rt_open(a, &rt) < 0) return -1;
    uint64_t pokes[IDLE_ACTORS] = {0};
    tr_actor_t addr[IDLE_ACTORS];
    int n = 0, rc = 0;
    while (n < IDLE_ACTORS && rc == 0 &&
           (rc = tr_actor_spawn(rt, idle_actor, &pokes[n], NULL, &addr[n])) == 0)
        rc = bench_send(rt, addr[n++], MSG_POKE, NULL, 0);
    /* 100 ms to let the pokes be handled and the workers park, then the window */
    double pct = rc == 0 ? bench_idle_pct(100, IDLE_MS) : -1;
    for (int i = 0; i < n; i++)
        tr_actor_stop(rt, addr[i]);
    if (bench_rt_finish(rt, rc, "idle_cpu", 0, NULL) < 0 || pct < 0) return -1;
    bench_print_idle(pct);
    return 0;
}
