/* idle.c: what an idle runtime costs and how fast it wakes up.
 *
 * latency: a thread outside the runtime sends one message every ~1 ms to an actor; between
 *   sends every worker has nothing to do and parks. The message carries its send time; the
 *   actor records (time its behaviour starts - send time). LATENCY_WARMUP sends are dropped,
 *   then LATENCY_SAMPLES are kept: p50, p90, p99 and max in microseconds. Target: p99 < 50 us.
 * idle_cpu: IDLE_ACTORS actors are spawned and each handles one message; then the runtime
 *   sits with nothing to do for IDLE_NS. Process CPU time (every thread) over that window,
 *   as a percentage of one core. Target: < 1%.
 */
#include <pthread.h>
#include <stdlib.h>

#include "benches.h"

enum { MSG_STAMP = TR_MSG_USER + 300, MSG_POKE };

/* --- latency --------------------------------------------------------------------------- */

typedef struct lat_actor {
    uint64_t *samples;
    size_t n; /* messages handled, warm-up included */
} lat_actor_t;

static int lat_actor(tr_ctx_t *ctx, tr_msg_t *m)
{
    uint64_t now = tr_now_ns();
    lat_actor_t *s = ctx->state;
    if (s->n >= LATENCY_WARMUP)
        s->samples[s->n - LATENCY_WARMUP] = now - bench_body_u64(m);
    if (++s->n == LATENCY_WARMUP + LATENCY_SAMPLES)
        return tr_actor_stop(ctx->rt, ctx->self);
    return 0;
}

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
        tr_msg_t *m = tr_msg_alloc(s->rt, MSG_STAMP, sizeof(uint64_t));
        if (!m) {
            s->rc = TR_ENOMEM;
            break;
        }
        uint64_t t = tr_now_ns();
        memcpy(tr_msg_body(m), &t, sizeof(t));
        if ((s->rc = tr_actor_send(s->rt, s->to, m)) < 0)
            tr_msg_free(s->rt, m);
    }
    if (s->rc < 0)
        tr_actor_stop(s->rt, s->to); /* so that tr_runtime_run returns */
    return NULL;
}

int bench_latency(const bench_args_t *a)
{
    tr_runtime_t *rt;
    if (bench_rt_open(a, &rt) < 0)
        return -1;
    static uint64_t samples[LATENCY_SAMPLES];
    lat_actor_t st = {.samples = samples};
    lat_sender_t snd = {.rt = rt};
    pthread_t th;
    int rc = tr_actor_spawn(rt, lat_actor, &st, NULL, &snd.to);
    if (rc == 0 && pthread_create(&th, NULL, lat_send_loop, &snd) != 0)
        rc = TR_EAGAIN;
    if (rc < 0)
        return bench_rt_finish(rt, rc, "latency", 0, NULL);
    int run_rc = tr_runtime_run(rt);
    pthread_join(th, NULL); /* before close: the sender may still be inside its last send */
    tr_runtime_close(rt);
    if (run_rc < 0 || snd.rc < 0 || st.n != LATENCY_WARMUP + LATENCY_SAMPLES) {
        fprintf(stderr, "latency: %zu of %d messages handled (%s)\n", st.n,
                LATENCY_WARMUP + LATENCY_SAMPLES, tr_strerror(snd.rc));
        return -1;
    }
    qsort(samples, LATENCY_SAMPLES, sizeof(samples[0]), bench_cmp_u64);
    bench_print("latency_p50", bench_percentile(samples, LATENCY_SAMPLES, 50) / 1e3, "us");
    bench_print("latency_p90", bench_percentile(samples, LATENCY_SAMPLES, 90) / 1e3, "us");
    bench_print("latency_p99", bench_percentile(samples, LATENCY_SAMPLES, 99) / 1e3, "us");
    bench_print("latency_max", samples[LATENCY_SAMPLES - 1] / 1e3, "us");
    return 0;
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
    if (bench_rt_open(a, &rt) < 0)
        return -1;
    uint64_t pokes[IDLE_ACTORS] = {0};
    tr_actor_t addr[IDLE_ACTORS];
    int n = 0, rc = 0;
    while (n < IDLE_ACTORS && rc == 0 &&
           (rc = tr_actor_spawn(rt, idle_actor, &pokes[n], NULL, &addr[n])) == 0)
        rc = bench_send(rt, addr[n++], MSG_POKE, NULL, 0);
    bench_sleep_ns(100000000); /* let the pokes be handled and the workers park */
    uint64_t c0 = bench_cpu_ns(), t0 = bench_now_ns();
    bench_sleep_ns(IDLE_NS);
    uint64_t c1 = bench_cpu_ns(), t1 = bench_now_ns();
    for (int i = 0; i < n; i++)
        tr_actor_stop(rt, addr[i]);
    if (bench_rt_finish(rt, rc, "idle_cpu", 0, NULL) < 0)
        return -1;
    bench_print("idle_cpu", 100.0 * (double)(c1 - c0) / (double)(t1 - t0), "%");
    return 0;
}
