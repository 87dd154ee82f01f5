/* runtime.c: creating, running and closing a runtime; failure reporting (with the flight
 * recorder's dump when a monitor is attached); counters. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "runtime/core/internal.h"
#include "tr_build_config.h"
#include "troupe/log.h"
#include "troupe/monitor.h"

void tr_build_info(tr_build_info_t *info)
{
    info->version = TR_VERSION_STRING;
    info->mpi = TR_HAVE_MPI;
    info->cuda = TR_HAVE_CUDA;
    info->nccl = TR_HAVE_NCCL;
}

tr__pool_t *tr__thread_pool_slow(tr_runtime_t *rt)
{
    tr__pool_t *p = tr__pool_get(rt->pools);
    if (!p) {
        tr_log(TR_LOG_ERROR, "out of memory creating a thread's message pool");
        abort();
    }
    return p;
}

static uint64_t pick_seed(void)
{
    uint64_t s = tr_now_ns() ^ ((uint64_t)getpid() << 32);
    return s ? s : 1;
}

static int setup(tr_runtime_t *rt, const tr_runtime_opts_t *opts)
{
    if (opts) rt->opts = *opts;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    rt->deterministic = rt->opts.deterministic != 0;
    rt->n_workers = rt->deterministic    ? 1
                    : rt->opts.n_workers ? rt->opts.n_workers
                                         : (unsigned)(cores > 0 ? cores : 1);
    rt->batch = rt->deterministic ? 1 : rt->opts.batch ? rt->opts.batch : 64;
    rt->batch_ns = rt->opts.batch_ns ? rt->opts.batch_ns : 1000000;
    rt->batch_ticks = tr__ns_to_ticks(rt->batch_ns);
    rt->steal_next_ticks = tr__ns_to_ticks(50000);
    int64_t inline_ns = rt->opts.inline_ns ? rt->opts.inline_ns : TR__INLINE_NS;
    if (inline_ns > 1000000000) inline_ns = 1000000000; /* 1 s: anything longer is "always" */
    rt->inline_ticks = inline_ns < 0 ? 0 : tr__ns_to_ticks((uint64_t)inline_ns);
    rt->inline_n_max = rt->inline_ticks ? UINT64_MAX / rt->inline_ticks : 0;
    rt->poll_ticks = tr__ns_to_ticks(TR__POLL_NS);
    rt->timestamps = rt->opts.timestamps != 0;
    const char *wc = getenv("TROUPE_WIRE_CHECK"); /* a test run forces it on everywhere */
    rt->wire_check = rt->opts.wire_check != 0 || (wc && !strcmp(wc, "1"));
    rt->monitor = rt->opts.monitor;
    if (rt->opts.flight_path && !(rt->flight_path = strdup(rt->opts.flight_path))) return TR_ENOMEM;
    rt->opts.flight_path = rt->flight_path;
    tr_monitor_lane_set(rt->monitor, TR_RUNTIME_LANE_EXTERNAL, "external", TR_LANE_CONTROL);
    tr_monitor_lane_set(rt->monitor, TR_RUNTIME_LANE_OVERFLOW, "overflow", TR_LANE_COMPUTE);
    if (rt->deterministic) {
        rt->seed = rt->opts.seed ? rt->opts.seed : pick_seed();
        tr_log(TR_LOG_INFO, "deterministic scheduler, seed %llu", (unsigned long long)rt->seed);
    }
    pthread_mutex_init(&rt->mu, NULL);
    pthread_mutex_init(&rt->idle_mu, NULL);
    pthread_cond_init(&rt->done_cv, NULL);
    tr__inject_init(&rt->inject);
    rt->pools = tr__pool_set_create();
    rt->pools_id = rt->pools ? tr__pool_set_id(rt->pools) : 0;
    tr__pool_prefault(rt->n_workers + 2); /* the workers, the loop thread and the caller */
    if (tr__actor_slots_init(rt) < 0) return TR_ENOMEM;
    if (tr__names_create(rt) < 0) return TR_ENOMEM;
    size_t wbytes = rt->n_workers * sizeof(tr__worker_t);
    rt->workers = aligned_alloc(TR__CACHE_LINE, (wbytes + TR__CACHE_LINE - 1) & ~(size_t)63);
    if (rt->workers) memset(rt->workers, 0, wbytes); /* release() reads them on failure */
    if (!rt->pools || !rt->workers || tr__buffers_init(rt) < 0) return TR_ENOMEM;
    for (unsigned i = 0; i < rt->n_workers; i++) {
        tr__worker_t *w = &rt->workers[i];
        tr__runq_init(&w->runq);
        w->rt = rt;
        w->index = i;
        w->rng = (rt->deterministic ? rt->seed : pick_seed()) + i * 0x9e3779b97f4a7c15ull;
        w->deterministic = rt->deterministic;
        if (!(w->next_seen = calloc(rt->n_workers, sizeof(*w->next_seen)))) return TR_ENOMEM;
    }
    tr__spread_init(rt);
    return 0;
}

static void release(tr_runtime_t *rt)
{
    for (unsigned c = 0; c < TR__MAX_CHUNKS; c++) {
        tr__actor_t *chunk = atomic_load(&rt->chunks[c]);
        if (!chunk) break;
        free(chunk);
    }
    if (rt->workers)
        for (unsigned i = 0; i < rt->n_workers; i++) {
            free(rt->workers[i].ready);
            free(rt->workers[i].next_seen);
        }
    free(rt->workers);
    tr__pool_set_destroy(rt->pools);
    tr__buffers_close(rt);
    tr__inject_destroy(&rt->inject);
    pthread_cond_destroy(&rt->done_cv);
    pthread_mutex_destroy(&rt->idle_mu);
    pthread_mutex_destroy(&rt->mu);
    free(rt->flight_path);
    tr__names_destroy(rt);
    free(rt);
}

/* What can be checked before anything is allocated. */
static int check_opts(const tr_runtime_opts_t *o)
{
    if (!o || !o->slice_us) return 0; /* the default slice, or kernel_slice alone */
    if (o->kernel_slice)
        return tr__error(TR_EINVAL,
                         "tr_runtime_init: slice_us is %u and kernel_slice is set: "
                         "give one or the other",
                         o->slice_us);
    if (o->slice_us < TR__SLICE_US_MIN || o->slice_us > TR__SLICE_US_MAX)
        return tr__error(TR_EINVAL,
                         "tr_runtime_init: slice_us is %u: expected %u to %u "
                         "(microseconds), or 0 for %u",
                         o->slice_us, TR__SLICE_US_MIN, TR__SLICE_US_MAX, TR__SLICE_US);
    return 0;
}

int tr_runtime_init(tr_runtime_t **out, const tr_runtime_opts_t *opts)
{
    if (!out) return TR_EINVAL;
    *out = NULL;
    int rc = check_opts(opts);
    if (rc < 0) return rc;
    tr_runtime_t *rt = aligned_alloc(TR__CACHE_LINE, (sizeof(*rt) + 63) & ~(size_t)63);
    if (!rt) return TR_ENOMEM;
    memset(rt, 0, sizeof(*rt));
    rc = setup(rt, opts);
    if (rc == 0) rc = tr__sched_start(rt);
    if (rc == 0 && (rc = tr__loop_start(rt)) < 0) tr__sched_stop(rt);
    if (rc < 0) {
        release(rt);
        return rc;
    }
    *out = rt;
    return 0;
}

/* After an unhandled failure, with every actor stopped (so no thread records a span): what
 * the trace buffers hold goes to the trace file, and the last spans per thread to
 * flight_path. Once per runtime. */
static void dump_flight(tr_runtime_t *rt)
{
    pthread_mutex_lock(&rt->mu);
    bool first = !rt->flight_dumped;
    rt->flight_dumped = true;
    pthread_mutex_unlock(&rt->mu);
    if (!first || !rt->monitor || !rt->flight_path) return;
    tr_monitor_flush(rt->monitor);
    int rc = tr_monitor_flight_dump(rt->monitor, rt->flight_path);
    if (rc == TR_EINVAL) return; /* the monitor keeps no flight ring */
    if (rc < 0)
        tr_log(TR_LOG_ERROR, "flight recorder: cannot write %s: %s", rt->flight_path,
               tr_strerror(rc));
    else
        tr_log(TR_LOG_INFO, "flight recorder written to %s", rt->flight_path);
}

int tr_runtime_run(tr_runtime_t *rt)
{
    if (!rt) return TR_EINVAL;
    if (rt->deterministic) {
        tr__sched_run_deterministic(rt);
    } else {
        pthread_mutex_lock(&rt->mu);
        while (atomic_load_explicit(&rt->alive, memory_order_acquire) > 0)
            pthread_cond_wait(&rt->done_cv, &rt->mu);
        pthread_mutex_unlock(&rt->mu);
    }
    if (!atomic_load(&rt->failed)) return 0;
    dump_flight(rt);
    return TR_EFAILED;
}

static void stop_one(tr_runtime_t *rt, tr_actor_t a, void *arg)
{
    tr_msg_t *m = tr_msg_new(rt, TR_MSG_STOP);
    if (!m) {
        tr_log(TR_LOG_ERROR, "shutdown: out of memory: actor #%u gets no stop request",
               (uint32_t)a.id);
        return;
    }
    snprintf(TR_MSG_AS(m, stop)->reason, sizeof(TR_MSG_AS(m, stop)->reason), "%s",
             (const char *)arg);
    tr__actor_send_internal(rt, a, m, true);
}

/* An actor published after a shutdown began also gets a stop: a spawn racing the shutdown (a
 * behaviour handling its stop, another thread) would otherwise live on, and tr_runtime_run
 * would wait for it forever. shut_down is set before the scan and read after each
 * publication (both seq_cst): either the scan sees the new actor or its publication sees the
 * flag (then it may get two stops, as from two shutdowns). */
void tr_runtime_shutdown(tr_runtime_t *rt, const char *reason)
{
    if (!rt) return;
    reason = reason ? reason : "shutdown";
    pthread_mutex_lock(&rt->mu);
    if (!atomic_load_explicit(&rt->shut_down, memory_order_relaxed))
        snprintf(rt->shutdown_reason, sizeof(rt->shutdown_reason), "%s", reason);
    /* seq_cst: before the scan's reads of each slot's generation (see publish) */
    atomic_store_explicit(&rt->shut_down, 1, memory_order_seq_cst);
    pthread_mutex_unlock(&rt->mu);
    tr__actor_for_each_alive(rt, stop_one, (void *)reason);
}

void tr__runtime_stop_late(tr_runtime_t *rt, tr_actor_t a)
{
    stop_one(rt, a, rt->shutdown_reason); /* written before shut_down, which was read */
}

void tr_runtime_close(tr_runtime_t *rt)
{
    if (!rt) return;
    tr__sched_stop(rt); /* first: a behaviour still running may call tr_timer_* / tr_poll_* */
    tr__loop_stop(rt);
    tr__actor_drain_all(rt);
    release(rt);
}

const char *tr_runtime_failure(tr_runtime_t *rt)
{
    return rt ? rt->failure : "";
}

uint64_t tr_runtime_seed(const tr_runtime_t *rt)
{
    return rt && rt->deterministic ? rt->seed : 0;
}

unsigned tr_runtime_workers(const tr_runtime_t *rt)
{
    return rt ? rt->n_workers : 0;
}

void tr_runtime_stats(tr_runtime_t *rt, tr_runtime_stats_t *out)
{
    out->actors_spawned = atomic_load_explicit(&rt->spawned, memory_order_relaxed);
    out->actors_alive = atomic_load_explicit(&rt->alive, memory_order_relaxed);
    out->dead_letters = atomic_load_explicit(&rt->dead_letters, memory_order_relaxed);
    out->parks = atomic_load_explicit(&rt->parks, memory_order_relaxed);
    out->steals = atomic_load_explicit(&rt->steals, memory_order_relaxed);
    out->worker_moves = atomic_load_explicit(&rt->worker_moves, memory_order_relaxed);
}

void tr__runtime_actor_stopped(tr_runtime_t *rt)
{
    /* acq_rel: the last stop's effects happen-before tr_runtime_run's return */
    if (atomic_fetch_sub_explicit(&rt->alive, 1, memory_order_acq_rel) == 1) {
        pthread_mutex_lock(&rt->mu);
        pthread_cond_broadcast(&rt->done_cv);
        pthread_mutex_unlock(&rt->mu);
    }
}

void tr__runtime_fail(tr_runtime_t *rt, const char *fmt, ...)
{
    int first = 0;
    pthread_mutex_lock(&rt->mu);
    if (!atomic_load(&rt->failed)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(rt->failure, sizeof(rt->failure), fmt, ap);
        va_end(ap);
        atomic_store(&rt->failed, 1);
        first = 1;
    }
    pthread_mutex_unlock(&rt->mu);
    if (first) {
        tr_log(TR_LOG_ERROR, "%s; no supervisor: stopping the runtime", rt->failure);
        tr__runtime_kill_all(rt, TR_ESHUTDOWN);
    }
}
