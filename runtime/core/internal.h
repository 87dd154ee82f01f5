/* internal.h: the runtime's private structures, shared by the files of runtime/.
 *
 * Fields of shared structs are grouped by the thread that writes them, with cache-line
 * padding between groups (after Pony's runtime).
 */
#ifndef TR_RUNTIME_CORE_INTERNAL_H
#define TR_RUNTIME_CORE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "base/errf.h"
#include "mailbox/mpscq.h"
#include "mailbox/pool.h"
#include "mailbox/runq.h"
#include "troupe/runtime.h"

#define TR__CACHE_LINE   64
#define TR__POLL_NS      300000 /* a worker out of work polls this long before it parks */
#define TR__INLINE_NS    200    /* opts.inline_ns's default (actor.c, run_inline) */
#define TR__SLICE_US     100    /* opts.slice_us's default (threads.c) */
#define TR__SLICE_US_MIN 100    /* Linux's range for a custom slice */
#define TR__SLICE_US_MAX 100000
#define TR__CHUNK_SHIFT  12 /* 4096 actor slots per chunk */
#define TR__CHUNK_SLOTS  (1u << TR__CHUNK_SHIFT)
#define TR__MAX_CHUNKS   (1u << 16)
#define TR__SLOT_CACHE   128 /* free slots a worker keeps for itself */
#define TR__NAME_MAX     32
#define TR__GROUP_MAX    4          /* activations a worker interleaves (tr__actor_run_group) */
#define TR__SUP_CLOSED   UINT64_MAX /* tr__actor_t.supervisor: see tr_actor_link */
#define TR__SUP_LINKING  (UINT64_MAX - 1)

typedef struct tr__pinned tr__pinned_t;
typedef struct tr__worker tr__worker_t;

/* An actor slot. Slots live in chunks that are never freed before tr_runtime_close, so an
 * address never dangles. A slot's generation `gen` is odd while an actor lives in it; it is
 * bumped at spawn (to odd) and at stop (to even). The mailbox persists across generations:
 * messages addressed to an older generation are dropped as dead letters when popped. */
typedef struct tr__actor {
    /* --- written by senders (any thread) and by the one that schedules it --- */
    tr__mpscq_head_t data_in;
    tr__mpscq_head_t urgent_in;
    tr__qnode_t qnode; /* link in the inject queue while queued there */

    /* --- read by every send (gen, pinned, pin, inline_ok); written only by spawn, restart
     * and stop, while the slot changes hands, and read after gen (acquire), except inline_ok,
     * a hint the running thread writes when it changes. Apart from the running thread's
     * counters, so a send does not miss on a line the receiver keeps writing --- */
    _Alignas(TR__CACHE_LINE) _Atomic uint32_t gen;
    _Atomic uint8_t pinned;
    _Atomic uint8_t inline_ok; /* a stream may run it inline (actor.c, note_inline): written
                                * by the running thread, only when it changes */
    uint8_t defer_stop;
    uint8_t lane_kind;  /* tr_lane_kind_t, kept for a pinned restart */
    uint8_t recyclable; /* the slot returns to the free list at stop */
    tr__pinned_t *pin;  /* the dedicated thread of a pinned actor */
    uint32_t slot;
    unsigned batch;
    tr_behaviour_cb behaviour;
    void *state;
    tr_actor_init_cb init;
    tr_actor_cleanup_cb cleanup;
    _Atomic uint64_t supervisor; /* tr_actor_t.id, or TR__SUP_LINKING / TR__SUP_CLOSED
                                  * (tr_actor_link's protocol, actor.c) */
    uint64_t sup_taken;          /* what finish took from supervisor, for a restart */
    char name[TR__NAME_MAX];     /* "" or its registered name (runtime/core/names.c) */
    uint32_t next_free;          /* free-list link (slot index + 1, 0 = end) */

    /* --- written by the thread running the actor --- */
    _Alignas(TR__CACHE_LINE) tr__mpscq_tail_t data_out;
    tr__mpscq_tail_t urgent_out;
    uint64_t seq; /* messages sent by this actor (envelope seq) */
    _Atomic uint64_t msgs_in, msgs_out, run_ns, activations, peak_depth;
    uint8_t stop_requested;
    uint8_t init_pending;      /* written by spawn before gen is published */
    uint8_t many_senders;      /* activations to go before it may run inline again: set
                                * when one sees the sender change (from last_sender on),
                                * counted down by those that do not (fed by several senders
                                * at a time, it is not run inline) */
    uint64_t last_sender;      /* the sender of the last message it handled */
    uint64_t depth_sampled_ns; /* tracing: when the mailbox depth was last recorded */

    /* --- restart intensity: written by spawn/restart while the slot is dead and by finish
     * on the actor's thread; each side reads the other's writes after gen (acq/rel) --- */
    int max_restarts; /* < 0: no limit */
    uint64_t restart_window_ns;
    uint64_t *restart_times; /* ring of the last max_restarts restarts; lazily */
    uint32_t n_restart_times, restart_head;
    uint8_t restarts_exhausted;   /* finish found the intensity reached: no restart */
    uint8_t restarted;            /* a pinned actor's dead slot, restarted elsewhere */
    _Atomic uint8_t restart_busy; /* one tr_actor_restart at a time (CAS) */
} tr__actor_t;

/* A thief's last look at a victim's run-next slot: the victim's next_placed then, and when
 * (ticks) that value was first seen. */
typedef struct tr__next_seen {
    uint64_t placed, since;
} tr__next_seen_t;

/* One worker thread and its queues. */
struct tr__worker {
    /* --- read and written by thieves --- */
    tr__runq_t runq;                 /* its own padding inside */
    _Atomic(tr__actor_t *) run_next; /* woken by the running actor's send; runs next */
    _Atomic uint64_t next_placed;    /* actors put in run_next so far (an epoch) */
    char pad0_[TR__CACHE_LINE - sizeof(void *) - sizeof(uint64_t)];

    /* --- park word: written by the worker and by wakers --- */
    _Atomic uint32_t parked;
    _Atomic int32_t busy_cpu; /* the CPU it runs actors on, -1 when out of work (spread.c);
                               * written by the worker about once a millisecond */
    char pad1_[TR__CACHE_LINE - 2 * sizeof(uint32_t)];

    /* --- the worker's own --- */
    tr_runtime_t *rt;
    unsigned index;
    pthread_t thread;
    uint32_t tick;
    uint64_t rng;
    tr__pool_t *pool;
    uint32_t free_slots[TR__SLOT_CACHE];
    unsigned n_free_slots;
    uint64_t spread_at;         /* ticks: when it next looks at its CPU (spread.c) */
    unsigned stacked;           /* looks in a row that found a worker on its CPU */
    tr__next_seen_t *next_seen; /* per victim: its run_next as last seen (steal) */
    tr__worker_t *next_idle;    /* under rt->idle_mu */
    bool in_idle_list;          /* under rt->idle_mu */
    bool deterministic;
    tr__actor_t **ready; /* deterministic mode: the ready set */
    size_t n_ready, cap_ready;
};

/* A pinned actor's thread. state: IDLE (asleep, waiting), SIGNALED (must run the actor),
 * EXITED (gone; the actor is dead and whatever still reaches it runs on the workers). */
enum { TR__PIN_IDLE = 0, TR__PIN_SIGNALED = 1, TR__PIN_EXITED = 2 };
struct tr__pinned {
    _Atomic uint32_t state; /* futex word; CAS by signallers and by the thread to exit */
    uint32_t gen0;          /* the slot's gen before the actor was first published */
    pthread_t thread;
    tr_runtime_t *rt;
    tr__actor_t *actor;
    tr__pinned_t *next; /* under rt->mu */
};

typedef struct tr__loop tr__loop_t;
typedef struct tr__names tr__names_t;

struct tr_runtime {
    /* --- read-mostly --- */
    tr_runtime_opts_t opts;
    unsigned n_workers;
    unsigned batch;
    uint64_t batch_ns;
    uint64_t batch_ticks;      /* batch_ns in base/clock.h ticks */
    uint64_t steal_next_ticks; /* how long a run-next actor waits before others may take it */
    uint64_t inline_ticks;     /* a receiver at most this a message may run inline; 0: none */
    uint64_t inline_n_max;     /* UINT64_MAX / inline_ticks: msgs_in * inline_ticks fits */
    uint64_t poll_ticks;       /* TR__POLL_NS: how long a worker out of work polls (sched.c) */
    uint64_t spread_ticks;     /* how often a busy worker looks at its CPU (spread.c) */
    uint64_t seed;
    bool deterministic;
    bool timestamps;
    bool wire_check;       /* opts.wire_check: runtime/msg/wire.c */
    tr_monitor_t *monitor; /* NULL: tracing off (opts.monitor) */
    char *flight_path;     /* opts.flight_path, copied */
    bool flight_dumped;    /* under mu */
    tr__worker_t *workers; /* n_workers; in deterministic mode one, run by tr_runtime_run */
    tr__pool_set_t *pools;
    uint64_t pools_id; /* tr__pool_set_id(pools), for tr__thread_pool's inline check */
    _Atomic(tr__actor_t *) chunks[TR__MAX_CHUNKS];
    char pad0_[TR__CACHE_LINE];

    /* --- shared words, a line per way they are written: a counter that every spawn writes
     * must not share a line with what every send reads (skynet's lookups, a tenth of its
     * time, waited for that line while a million spawns moved it between the workers) --- */
    _Atomic uint32_t next_slot; /* fresh slots handed out; read by every lookup */
    _Atomic int stopping;       /* close has begun: threads exit; read by every worker loop */
    _Atomic int failed;         /* an unhandled failure: no more spawns */
    _Atomic int shut_down;      /* tr_runtime_shutdown was called: new actors get a stop too */
    char pad1_[TR__CACHE_LINE];
    _Atomic uint64_t alive; /* written by every spawn and every stop */
    _Atomic uint64_t spawned;
    char pad2_[TR__CACHE_LINE];
    _Atomic int n_idle; /* written by parking and woken workers; read by every wake */
    _Atomic uint64_t parks;
    char pad3_[TR__CACHE_LINE];
    _Atomic uint64_t dead_letters; /* statistics */
    _Atomic uint64_t steals;
    _Atomic uint64_t worker_moves; /* spread.c */
    char pad4_[TR__CACHE_LINE];

    tr__inject_t inject;

    /* --- under mu --- */
    pthread_mutex_t mu;
    pthread_cond_t done_cv; /* alive reached 0, or deterministic work arrived */
    uint32_t free_head;     /* global free slots (index + 1) */
    uint32_t n_free;
    tr__pinned_t *pinned;
    char failure[512];
    char shutdown_reason[48]; /* the first tr_runtime_shutdown's (TR_MSG_STOP's reason) */

    /* --- under idle_mu --- */
    pthread_mutex_t idle_mu;
    tr__worker_t *idle;

    tr__loop_t *loop;
    struct tr__buffers *buffers; /* runtime/msg/buffer.c: the registry, its own lock */
    tr__names_t *names;          /* the name registry, its own lock inside */
};

/* Thread-local: which runtime, worker and actor this thread is serving. */
typedef struct tr__tls {
    tr_runtime_t *rt;
    tr__worker_t *worker; /* NULL on non-worker threads (pinned, loop, main) */
    tr__actor_t *actor;   /* the actor whose behaviour is running */
} tr__tls_t;

extern _Thread_local tr__tls_t tr__tls;

/* --- runtime/msg/wire.c: wire-check mode --- */
/* Replaces each of msgs[0..n) by its msgpack form (a message of the same envelope whose body is
 * the encoding, flagged TR_MSG_F_WIRE). All or nothing: on failure msgs are unchanged and a
 * line names the type. On success the originals are freed. */
int tr__wire_encode(tr_runtime_t *rt, tr_msg_t **msgs, size_t n);
/* The message a TR_MSG_F_WIRE message carries, decoded into a new message (the caller frees
 * it); TR_EDECODE with a line naming the type and field. */
int tr__wire_decode(tr_runtime_t *rt, const tr_msg_t *wire, tr_msg_t **out);

/* --- runtime/msg/buffer.c --- */
int tr__buffers_init(tr_runtime_t *rt);
void tr__buffers_close(tr_runtime_t *rt);

/* --- actor.c --- */
/* k (1..TR__GROUP_MAX) actors' activations on w (NULL: a pinned actor's thread), interleaved
 * a message at a time. Returns the clock (tr__ticks) as it last read it, when the last
 * activation ended: a caller that needs the time then reads it no second time. */
uint64_t tr__actor_run_group(tr_runtime_t *rt, tr__worker_t *w, tr__actor_t **actors, int k);
/* One actor's activation. */
static inline void tr__actor_run(tr_runtime_t *rt, tr__worker_t *w, tr__actor_t *a)
{
    (void)tr__actor_run_group(rt, w, &a, 1);
}
void tr__actor_drain_all(tr_runtime_t *rt);
/* Makes the first chunk of actor slots (tr_runtime_init: start-up work, not the first
 * spawn's). TR_ENOMEM. */
int tr__actor_slots_init(tr_runtime_t *rt);
void tr__runtime_kill_all(tr_runtime_t *rt, int reason);
int tr__actor_send_internal(tr_runtime_t *rt, tr_actor_t to, tr_msg_t *m, bool urgent);
void tr__actor_for_each_alive(tr_runtime_t *rt, void (*fn)(tr_runtime_t *, tr_actor_t, void *),
                              void *arg);

/* --- sched.c --- */
int tr__sched_start(tr_runtime_t *rt);
void tr__sched_stop(tr_runtime_t *rt);
void tr__sched_schedule(tr_runtime_t *rt, tr__actor_t *a);
/* As tr__sched_schedule; parallel: never into the running sender's run-next slot (where it
 * would wait for the sender's activation to end) but onto its worker's queue, an idle worker
 * woken to take it: for the receiver of a sender that is still sending (a burst). */
void tr__sched_schedule_as(tr_runtime_t *rt, tr__actor_t *a, bool parallel);
void tr__sched_reschedule(tr_runtime_t *rt, tr__worker_t *w, tr__actor_t *a);
/* Whether a is in w's run-next slot now (a hint: a thief may take it). */
bool tr__sched_is_next(tr__worker_t *w, const tr__actor_t *a);
/* Takes a out of w's run-next slot if it is there: the caller then runs it (w is its own). */
bool tr__sched_take_next(tr__worker_t *w, tr__actor_t *a);
void tr__sched_run_deterministic(tr_runtime_t *rt);
int tr__pinned_prepare(tr_runtime_t *rt, tr__actor_t *a);
int tr__pinned_launch(tr_runtime_t *rt, tr__actor_t *a);

/* --- spread.c: busy workers sharing a CPU move apart --- */
void tr__spread_init(tr_runtime_t *rt);
/* A busy worker, after its activations (now: tr__ticks()): looks at its CPU when due. */
void tr__spread_look(tr_runtime_t *rt, tr__worker_t *w, uint64_t now);
/* A worker out of work: not busy on any CPU. */
void tr__spread_idle(tr__worker_t *w);

/* --- names.c: the name registry. A name maps to a slot; lookup answers the slot's live
 * generation, so a restarted actor (same slot) is found under its name at once. --- */
int tr__names_create(tr_runtime_t *rt);
void tr__names_destroy(tr_runtime_t *rt);
/* Claims name for slot: 0, or TR_EEXIST with *holder the slot holding it. */
int tr__names_claim(tr_runtime_t *rt, const char *name, uint32_t slot, uint32_t *holder);
/* Frees name if slot holds it. */
void tr__names_release(tr_runtime_t *rt, const char *name, uint32_t slot);

/* --- loop.c --- */
int tr__loop_start(tr_runtime_t *rt);
void tr__loop_stop(tr_runtime_t *rt);
/* What a timer that fires at now asks the timerfd to be armed for next (loop.c's design
 * block): a repeat's next deadline; a one-shot's earliest next start, now plus its timeout,
 * since a receiver that starts it again does so after the firing; 0 (nothing) for a
 * one-shot under 100 us. */
uint64_t tr__timer_next_arm(uint64_t deadline_ns, uint64_t repeat_ns, uint64_t timeout_ns,
                            uint64_t now);

/* --- runtime.c --- */
/* Sends actor a the TR_MSG_STOP of a tr_runtime_shutdown that came before its publication. */
void tr__runtime_stop_late(tr_runtime_t *rt, tr_actor_t a);
/* The calling thread's message pool for rt, created on first use (aborts when out of memory).
 * Inline for the common case: every message's allocation and free asks for it. */
tr__pool_t *tr__thread_pool_slow(tr_runtime_t *rt);
static inline tr__pool_t *tr__thread_pool(tr_runtime_t *rt)
{
    if (tr__pool_tls_set_id == rt->pools_id) return tr__pool_tls_pool;
    return tr__thread_pool_slow(rt);
}
void tr__runtime_actor_stopped(tr_runtime_t *rt);
void tr__runtime_fail(tr_runtime_t *rt, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* pthread_create for the runtime's threads: they start with the signals it handles blocked. */
int tr__thread_create(const tr_runtime_t *rt, pthread_t *thread, void *(*fn)(void *), void *arg,
                      const char *name);

static inline tr__actor_t *tr__slot(tr_runtime_t *rt, uint32_t slot)
{
    /* acquire: pairs with the release store that publishes a new chunk */
    tr__actor_t *chunk =
        atomic_load_explicit(&rt->chunks[slot >> TR__CHUNK_SHIFT], memory_order_acquire);
    return chunk ? &chunk[slot & (TR__CHUNK_SLOTS - 1)] : NULL;
}

static inline tr_actor_t tr__actor_id(uint32_t gen, uint32_t slot)
{
    return (tr_actor_t){((uint64_t)gen << 32) | slot};
}

/* The slot an address names (any generation: callers compare gen), or NULL for an address no
 * slot was handed out for. Inline: every send asks. */
static inline tr__actor_t *tr__actor_lookup(tr_runtime_t *rt, tr_actor_t addr)
{
    uint32_t slot = (uint32_t)addr.id;
    uint32_t gen = (uint32_t)(addr.id >> 32);
    if (!(gen & 1) || slot >= atomic_load_explicit(&rt->next_slot, memory_order_relaxed))
        return NULL;
    return tr__slot(rt, slot);
}

#endif
