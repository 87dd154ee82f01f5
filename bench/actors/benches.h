/* benches.h: the Troupe side of the actor benchmarks: one function per benchmark and the few
 * helpers they share (open a runtime, send a small body, run to completion). Public headers
 * only (<troupe.h>), as every program under bench/ must.
 *
 * Every benchmark creates its own runtime, times from the first spawn to the return of
 * tr_runtime_run (every actor stopped), closes the runtime untimed, and checks its result.
 * The CAF peer (bench/peers/caf/savina_caf.cpp) times the same span the same way.
 */
#ifndef TR_BENCH_ACTORS_BENCHES_H
#define TR_BENCH_ACTORS_BENCHES_H

#include <stdio.h>
#include <string.h>

#include <troupe.h>

#include "harness.h"

/* Savina's standard parameters (shamsimam/savina, the *Config.java files), and skynet's. */
#define PINGPONG_N          40000   /* pings */
#define COUNTING_N          1000000 /* increments */
#define THREADRING_ACTORS   100
#define THREADRING_HOPS     100000
#define CHAMENEOS_CREATURES 100
#define CHAMENEOS_MEETINGS  200000
#define BIG_ACTORS          120
#define BIG_PINGS           20000 /* pings per actor */
#define FJTHRPUT_ACTORS     60
#define FJTHRPUT_N          10000 /* messages per actor */
#define FIB_N               25
#define FIB_EXPECT          75025ull
#define SKYNET_LEAVES       1000000
#define SKYNET_FANOUT       10
#define SKYNET_EXPECT       499999500000ull
#define FANIN_TOTAL         2000000 /* messages per fan-in run, split among the producers */
#define FANIN_CHUNK         1000    /* messages a producer sends per activation */
#define LATENCY_SAMPLES     2000
#define LATENCY_WARMUP      20
#define LATENCY_GAP_NS      1000000 /* ~1 ms between wake-ups: the runtime parks in between */
#define IDLE_ACTORS         4
#define IDLE_MS             2000u

/* --- helpers (static inline: each file keeps its own copy, nothing to link) ------------ */

/* Sends a message of `type` whose body is a copy of body[0..len). The message is freed
 * again if the send fails. 0 or a negative TR_E* code. Any thread. */
static inline int bench_send(tr_runtime_t *rt, tr_actor_t to, uint32_t type, const void *body,
                             size_t len)
{
    tr_msg_t *m = tr_msg_alloc(rt, type, len);
    if (!m) return TR_ENOMEM;
    if (len) memcpy(tr_msg_body(m), body, len);
    int rc = tr_actor_send(rt, to, m);
    if (rc < 0) tr_msg_free(rt, m);
    return rc;
}

static inline int bench_send_u64(tr_runtime_t *rt, tr_actor_t to, uint32_t type, uint64_t v)
{
    return bench_send(rt, to, type, &v, sizeof(v));
}

static inline uint64_t bench_body_u64(tr_msg_t *m)
{
    uint64_t v;
    memcpy(&v, tr_msg_body(m), sizeof(v));
    return v;
}

/* A runtime with the benchmark's worker count. Prints why on failure. */
static inline int bench_rt_open(const bench_args_t *a, tr_runtime_t **rt)
{
    tr_runtime_opts_t o = {.n_workers = a->workers};
    int rc = tr_runtime_init(rt, &o);
    if (rc < 0) fprintf(stderr, "bench: tr_runtime_init: %s\n", tr_strerror(rc));
    return rc;
}

/* Waits for every actor to stop, then closes the runtime. When ms is not NULL it gets the
 * time from t0 to the return of tr_runtime_run: closing (joining threads, freeing slots and
 * pools) is not timed, as the CAF peer does not time its actor_system's destructor. A
 * negative setup_rc (a failed spawn or send while setting up) is reported, and the runtime
 * shut down first so that run returns. 0, or -1 after printing what went wrong. */
static inline int bench_rt_finish(tr_runtime_t *rt, int setup_rc, const char *name, uint64_t t0,
                                  double *ms)
{
    if (setup_rc < 0) {
        fprintf(stderr, "%s: setup failed: %s\n", name, tr_strerror(setup_rc));
        tr_runtime_shutdown(rt, "setup failed");
    }
    int rc = tr_runtime_run(rt);
    if (ms) *ms = (double)(tr_now_ns() - t0) / 1e6;
    if (rc < 0) fprintf(stderr, "%s: %s\n", name, tr_runtime_failure(rt));
    tr_runtime_close(rt);
    return rc < 0 || setup_rc < 0 ? -1 : 0;
}

/* --- the benchmarks -------------------------------------------------------------------- */

/* savina.c: one repetition each; 0 and *ms, or -1 when the result was wrong. */
int bench_pingpong(const bench_args_t *a, double *ms);
int bench_counting(const bench_args_t *a, double *ms);
int bench_threadring(const bench_args_t *a, double *ms);
int bench_chameneos(const bench_args_t *a, double *ms);
int bench_big(const bench_args_t *a, double *ms);
int bench_fjthrput(const bench_args_t *a, double *ms);
int bench_fib(const bench_args_t *a, double *ms);

/* skynet.c */
int bench_skynet(const bench_args_t *a, double *ms);

/* fanin.c: prints fanin_1, fanin_2, fanin_4, fanin_8 in Mmsg/s. */
int bench_fanin(const bench_args_t *a);

/* idle.c: prints latency_p50/p90/p99/max and wakeup_p50/p90/p99/max in us, and idle_cpu in
 * percent of one core. */
int bench_latency(const bench_args_t *a);
int bench_wakeup(const bench_args_t *a);
int bench_idle_cpu(const bench_args_t *a);

/* wake_floor.c: prints wakeup_floor_p50/p90/p99/max in us: wakeup's sending pattern with no
 * runtime, a bare futex wake of a parked thread, the machine's floor under wakeup. */
int bench_wakeup_floor(const bench_args_t *a);

#endif
