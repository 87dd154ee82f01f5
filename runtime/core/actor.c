/* actor.c: actor slots, spawn, send, stop, supervision, and running an actor.
 *
 * Design:
 * - An address is (generation, slot). Slots live in chunks that exist until close, so any
 *   address may be looked up at any time. gen is odd while an actor lives in the slot.
 * - Senders check gen (relaxed, a fast refusal for stopped actors) and push. A send that
 *   races with a stop may still land; the message's receiver generation no longer matches
 *   when popped, and it is dropped as a dead letter. So a slot can be reused at once.
 * - Exactly one thread runs an actor at a time: whoever observes the data lane's idle mark
 *   (a sender's exchange, or an unmark CAS) schedules it; the thread running it gives it up
 *   only by marking the data lane empty again.
 * - Urgent lane: no idle mark of its own. An urgent send pushes, then tries to unmark the
 *   data lane; the running thread, after marking the data lane empty (seq_cst CAS), checks the
 *   urgent lane (seq_cst load) and unmarks it again if something arrived. Both sides do a
 *   store then a load on the other's word, so at least one sees the other (Dekker), and the
 *   unmark CAS lets exactly one of them schedule.
 * - Slots of supervised actors are kept after stop for tr_actor_restart, which reuses them;
 *   pinned actors get fresh slots and keep them (their thread may still be leaving).
 *   A pinned actor's thread is created before the actor is published, so a spawn whose thread
 *   cannot be created fails with nothing started.
 * - Names (runtime/core/names.c) are claimed before publish and freed before the gen bump that
 *   ends a generation; a restart claims the name again, so lookups follow restarts.
 * - Restart intensity: tr_actor_restart records its time in a ring of the last max_restarts
 *   restarts; a failure when another restart would exceed the window is reported to the
 *   supervisor as TR_ERESTARTS and the slot refuses further restarts. The ring is written by
 *   restart (slot dead) and read by finish (slot alive); gen's release/acquire orders them.
 * - Inline runs: a behaviour's stream (TR__OUTBOX_MAX or more sends in a row to one actor)
 *   to a receiver that is idle or in this worker's run-next slot, and that has cost at most
 *   opts.inline_ns a message so far, runs one activation of the receiver on this thread inside
 *   the send (run_inline), as a full channel hands the core to its consumer in Go: the pair
 *   stays on one core and the mailbox short. Not for a receiver fed by several senders at a
 *   time (note_inline). Never nested, never for pinned receivers or in
 *   deterministic mode; the inline time is the receiver's run_ns, not the sender's (its
 *   trace spans lie inside the sender's).
 * - Tracing (rt->monitor set at init, never changed): each send records the start of its
 *   flow, each handled message (and each init) a span on the actor's lane, and an activation
 *   samples the mailbox depth at most every TR__DEPTH_SAMPLE_NS. Spans and flows need
 *   CLOCK_MONOTONIC, so tr_now_ns() is read only on the traced paths; without a monitor the
 *   cost is one predictable branch per send and per message.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "runtime/core/futex.h"
#include "runtime/core/internal.h"
#include "troupe/log.h"
#include "troupe/monitor.h"

#define TR__DEPTH_SAMPLE_NS   100000u /* mailbox depth counters: at most one per 100 us per actor */
#define TR__NO_SENDER         UINT64_MAX /* last_sender before the first message */
#define TR__MANY_SENDERS_HOLD 8 /* activations without a change of sender before inline again */

_Thread_local tr__tls_t tr__tls;

static _Atomic uint32_t next_thread_no = 1;
static _Thread_local unsigned tls_empty_runs; /* see after_empty_run */

/* What a thread's sends number: flow ids (the thread's number in the top 20 bits, 0 until its
 * first send) and, for sends from outside any actor, the per-thread seq. */
typedef struct send_ids {
    uint64_t flow;
    uint64_t external_seq;
} send_ids_t;
static _Thread_local send_ids_t tls_ids;

/* The running behaviour's outbox: its consecutive data sends to one actor, linked into one
 * chain and pushed with a single exchange on the receiver's head (send design below). */
#define TR__OUTBOX_MAX       64
#define TR__EMPTY_RUNS_YIELD 4 /* activations in a row that find a push in flight: yield */
typedef struct outbox {
    tr_runtime_t *rt;
    tr__actor_t *from, *to;
    tr_msg_t *first, *last;
    uint64_t n;      /* messages in the chain */
    uint64_t streak; /* messages from `from` to `to` in a row, pushed ones included */
} outbox_t;
static _Thread_local outbox_t tls_out;

/* --- slots ----------------------------------------------------------------------------- */

static int ensure_chunk(tr_runtime_t *rt, uint32_t slot)
{
    uint32_t c = slot >> TR__CHUNK_SHIFT;
    if (atomic_load_explicit(&rt->chunks[c], memory_order_acquire)) return 0;
    pthread_mutex_lock(&rt->mu);
    int rc = 0;
    if (!atomic_load_explicit(&rt->chunks[c], memory_order_relaxed)) {
        size_t bytes = TR__CHUNK_SLOTS * sizeof(tr__actor_t);
        tr__actor_t *chunk = aligned_alloc(TR__CACHE_LINE, bytes);
        if (chunk) {
            memset(chunk, 0, bytes);
            for (uint32_t i = 0; i < TR__CHUNK_SLOTS; i++) {
                tr__actor_t *a = &chunk[i];
                tr__mpscq_init(&a->data_in, &a->data_out, true);
                tr__mpscq_init(&a->urgent_in, &a->urgent_out, false);
                atomic_init(&a->gen, 0);
                a->slot = (c << TR__CHUNK_SHIFT) | i;
            }
            /* release: publishes the initialised chunk to tr__slot's acquire load */
            atomic_store_explicit(&rt->chunks[c], chunk, memory_order_release);
        } else {
            rc = TR_ENOMEM;
        }
    }
    pthread_mutex_unlock(&rt->mu);
    return rc;
}

/* The first chunk of slots, made by tr_runtime_init: writing its 1.5 MiB (zeroing and
 * initialising 4096 slots of 384 bytes) faulted in 384 fresh pages, ~4 ms on a 2-vCPU VM,
 * which the first tr_actor_spawn paid, inside whatever it started (bench pingpong's and
 * threadring's first runtimes in a process: 9.5-12 ms against 5.1-7.4 with the chunk made
 * at start-up). */
int tr__actor_slots_init(tr_runtime_t *rt)
{
    return ensure_chunk(rt, 0);
}

static tr__actor_t *fresh_slot(tr_runtime_t *rt)
{
    /* seq_cst: tr__actor_for_each_alive's read after a failure sees it (publish) */
    uint32_t slot = atomic_fetch_add_explicit(&rt->next_slot, 1, memory_order_seq_cst);
    if (slot >= TR__MAX_CHUNKS * TR__CHUNK_SLOTS || ensure_chunk(rt, slot) < 0) return NULL;
    return tr__slot(rt, slot);
}

/* Moves up to n slots from the global free list into w's cache. Called with rt->mu held. */
static void refill_slot_cache(tr_runtime_t *rt, tr__worker_t *w, unsigned n)
{
    while (n-- && rt->free_head) {
        tr__actor_t *a = tr__slot(rt, rt->free_head - 1);
        rt->free_head = a->next_free;
        rt->n_free--;
        w->free_slots[w->n_free_slots++] = a->slot;
    }
}

static tr__actor_t *alloc_slot(tr_runtime_t *rt, bool reuse)
{
    tr__worker_t *w = tr__tls.rt == rt ? tr__tls.worker : NULL;
    if (reuse && w && w->n_free_slots) return tr__slot(rt, w->free_slots[--w->n_free_slots]);
    if (reuse) {
        tr__actor_t *a = NULL;
        pthread_mutex_lock(&rt->mu);
        if (w)
            refill_slot_cache(rt, w, TR__SLOT_CACHE / 2);
        else if (rt->free_head) {
            a = tr__slot(rt, rt->free_head - 1);
            rt->free_head = a->next_free;
            rt->n_free--;
        }
        pthread_mutex_unlock(&rt->mu);
        if (w && w->n_free_slots) return tr__slot(rt, w->free_slots[--w->n_free_slots]);
        if (a) return a;
    }
    return fresh_slot(rt);
}

static void free_slot(tr_runtime_t *rt, tr__actor_t *a)
{
    tr__worker_t *w = tr__tls.rt == rt ? tr__tls.worker : NULL;
    if (w && w->n_free_slots < TR__SLOT_CACHE) {
        w->free_slots[w->n_free_slots++] = a->slot;
        return;
    }
    pthread_mutex_lock(&rt->mu);
    if (w) { /* spill half of the cache to the global list */
        while (w->n_free_slots > TR__SLOT_CACHE / 2) {
            tr__actor_t *s = tr__slot(rt, w->free_slots[--w->n_free_slots]);
            s->next_free = rt->free_head;
            rt->free_head = s->slot + 1;
            rt->n_free++;
        }
        w->free_slots[w->n_free_slots++] = a->slot;
    } else {
        a->next_free = rt->free_head;
        rt->free_head = a->slot + 1;
        rt->n_free++;
    }
    pthread_mutex_unlock(&rt->mu);
}

static inline tr_actor_t current_id(tr__actor_t *a)
{
    return tr__actor_id(atomic_load_explicit(&a->gen, memory_order_relaxed), a->slot);
}

/* --- tracing -------------------------------------------------------------------------- */

static inline uint32_t lane_of(const tr__actor_t *a)
{
    return a->slot < TR_RUNTIME_LANE_EXTERNAL ? a->slot : TR_RUNTIME_LANE_OVERFLOW;
}

/* The start of m's flow. A send from outside any actor gets a zero-length span on the
 * external lane, so the arrow has a span to start from. */
__attribute__((noinline, cold)) static void trace_send(tr_runtime_t *rt, tr__actor_t *self,
                                                       const tr_msg_t *m)
{
    uint64_t now = tr_now_ns();
    const char *name = tr_msg_type_name(m->type);
    uint32_t lane = self ? lane_of(self) : TR_RUNTIME_LANE_EXTERNAL;
    if (!self)
        tr_monitor_span(rt->monitor,
                        &(tr_span_t){name, now, now, m->step, m->micro_step, lane, m->size, 0});
    tr_monitor_send(rt->monitor, lane, m->flow_id, name, now);
}

/* --- spawn ----------------------------------------------------------------------------- */

static void reset_counters(tr__actor_t *a)
{
    atomic_store_explicit(&a->msgs_in, 0, memory_order_relaxed);
    atomic_store_explicit(&a->msgs_out, 0, memory_order_relaxed);
    atomic_store_explicit(&a->run_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&a->activations, 0, memory_order_relaxed);
    atomic_store_explicit(&a->peak_depth, 0, memory_order_relaxed);
    atomic_store_explicit(&a->inline_ok, 1, memory_order_relaxed); /* no history: cheap */
    a->many_senders = 0;
    a->last_sender = TR__NO_SENDER;
    a->seq = 0;
    a->stop_requested = 0;
}

static int send_kill(tr_runtime_t *rt, tr_actor_t a, int reason);
static void dead_letter(tr_runtime_t *rt, tr_msg_t *m);
static void fail_on_queued_notices(tr_runtime_t *rt, tr__actor_t *a, uint32_t gen);

/* Publishes a prepared slot as a new generation and schedules its init if it has one. */
static tr_actor_t publish(tr_runtime_t *rt, tr__actor_t *a)
{
    uint32_t gen = atomic_load_explicit(&a->gen, memory_order_relaxed) + 1;
    a->init_pending = a->init != NULL;
    reset_counters(a);
    atomic_fetch_add_explicit(&rt->alive, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&rt->spawned, 1, memory_order_relaxed);
    /* seq_cst (a release, and ordered before the unmark's load): either the unmark below
     * finds the slot idle and schedules the init, or the activation still running on the slot
     * (an actor stopped in it; a restart, or a spawn reusing the slot, came before it ended)
     * sees this generation after marking idle (activation_end) and schedules it */
    atomic_store_explicit(&a->gen, gen, memory_order_seq_cst);
    if (a->init && tr__mpscq_unmark(&a->data_in)) tr__sched_schedule(rt, a);
    tr_actor_t id = tr__actor_id(gen, a->slot);
    /* seq_cst: a failure stores `failed`, then kills every generation it reads as alive
     * (tr__runtime_fail); a spawn or restart that checked `failed` before it was set may
     * publish after its slot was read. Either the failure's read sees this generation or this
     * load sees `failed` (a second KILL is a dead letter). */
    if (atomic_load_explicit(&rt->failed, memory_order_seq_cst)) send_kill(rt, id, TR_ESHUTDOWN);
    /* seq_cst: likewise with a shutdown's flag and its scan (tr_runtime_shutdown) */
    else if (atomic_load_explicit(&rt->shut_down, memory_order_seq_cst))
        tr__runtime_stop_late(rt, id);
    return id;
}

#define TR__MAX_RESTARTS_CAP          65536 /* the ring of restart times is this long at most */
#define TR__DEFAULT_RESTART_WINDOW_MS 5000u /* OTP's default period */

static int check_opts(const tr_actor_opts_t *o)
{
    const char *name = o->name ? o->name : "";
    size_t len = strlen(name);
    if (len >= TR__NAME_MAX)
        return tr__error(TR_EINVAL,
                         "cannot spawn actor '%.24s...': its name is %zu bytes; at "
                         "most %d fit",
                         name, len, TR__NAME_MAX - 1);
    if (o->lane_kind < 0 || o->lane_kind >= TR_LANE_KIND_COUNT_)
        return tr__error(TR_EINVAL,
                         "cannot spawn actor '%s': lane_kind %d is not a "
                         "tr_lane_kind_t (0 to %d)",
                         name, o->lane_kind, TR_LANE_KIND_COUNT_ - 1);
    if (o->max_restarts < TR_ACTOR_RESTARTS_UNLIMITED || o->max_restarts > TR__MAX_RESTARTS_CAP)
        return tr__error(TR_EINVAL,
                         "cannot spawn actor '%s': max_restarts %d is out of range "
                         "(0 for the default 1, 1 to %d, or "
                         "TR_ACTOR_RESTARTS_UNLIMITED)",
                         name, o->max_restarts, TR__MAX_RESTARTS_CAP);
    return 0;
}

/* Writes a dead slot's fields for a new actor (before publish). */
static void fill_slot(tr_runtime_t *rt, tr__actor_t *a, tr_behaviour_cb behaviour, void *state,
                      const tr_actor_opts_t *o, bool pinned)
{
    a->behaviour = behaviour;
    a->state = state;
    a->init = o->init;
    a->cleanup = o->cleanup;
    /* release: a stale link that takes this value (tr_actor_link) then sees the gen bump of
     * the generation before, which came before the slot was freed */
    atomic_store_explicit(&a->supervisor, o->supervisor.id, memory_order_release);
    a->batch = o->batch ? o->batch : rt->batch;
    a->defer_stop = (uint8_t)(o->defer_stop != 0);
    a->recyclable = !pinned && tr_actor_is_none(o->supervisor);
    atomic_store_explicit(&a->pinned, (uint8_t)pinned, memory_order_relaxed);
    const char *name = o->name ? o->name : ""; /* check_opts refused a longer one */
    size_t len = strnlen(name, sizeof(a->name) - 1);
    memcpy(a->name, name, len); /* not snprintf: 3% of skynet's time */
    a->name[len] = '\0';
    a->lane_kind = (uint8_t)o->lane_kind;
    a->max_restarts = o->max_restarts ? o->max_restarts : 1;
    a->restart_window_ns =
        (uint64_t)(o->restart_window_ms ? o->restart_window_ms : TR__DEFAULT_RESTART_WINDOW_MS) *
        1000000u;
    free(a->restart_times); /* a reused slot's history is the previous actor's */
    a->restart_times = NULL;
    a->n_restart_times = a->restart_head = 0;
    a->restarts_exhausted = a->restarted = 0;
}

/* Gives an unpublished slot back (a spawn that failed after taking it). */
static tr_actor_t take_supervisor(tr__actor_t *a);

static void unclaim_slot(tr_runtime_t *rt, tr__actor_t *a)
{
    take_supervisor(a); /* a free slot's word is closed (see tr_actor_link) */
    atomic_store_explicit(&a->pinned, 0, memory_order_relaxed);
    a->recyclable = 1;
    free_slot(rt, a);
}

/* Claims name for slot a; TR_EEXIST (with the text) when another actor holds it. */
static int claim_name(tr_runtime_t *rt, tr__actor_t *a, const char *verb)
{
    uint32_t holder = 0;
    if (!a->name[0]) return 0;
    int rc = tr__names_claim(rt, a->name, a->slot, &holder);
    if (rc == TR_EEXIST)
        return tr__error(rc, "cannot %s actor '%s': the name is taken by actor #%u", verb, a->name,
                         holder);
    if (rc < 0) return tr__error(rc, "cannot %s actor '%s': %s", verb, a->name, tr_strerror(rc));
    return 0;
}

/* Starts a pinned actor's thread before the actor is published (the thread waits for the
 * first generation); on failure nothing of it remains. */
static int start_pinned(tr_runtime_t *rt, tr__actor_t *a)
{
    int rc = tr__pinned_prepare(rt, a);
    if (rc == 0) rc = tr__pinned_launch(rt, a);
    if (rc < 0)
        return tr__error(rc, "cannot spawn actor '%s': cannot create its thread: %s",
                         a->name[0] ? a->name : "(unnamed)", tr_strerror(rc));
    return 0;
}

/* Moves a's restart history to b (a pinned actor restarts in a fresh slot). */
static void move_history(tr__actor_t *a, tr__actor_t *b)
{
    free(b->restart_times);
    b->restart_times = a->restart_times;
    b->n_restart_times = a->n_restart_times;
    b->restart_head = a->restart_head;
    a->restart_times = NULL;
    a->n_restart_times = a->restart_head = 0;
}

/* tr_actor_spawn; a pinned restart passes the dead slot `from`, whose restart history the
 * new slot takes over before it is published. */
static int spawn_impl(tr_runtime_t *rt, tr_behaviour_cb behaviour, void *state,
                      const tr_actor_opts_t *opts, tr__actor_t *from, tr_actor_t *out)
{
    int rc = check_opts(opts);
    if (rc < 0) return rc;
    if (atomic_load_explicit(&rt->failed, memory_order_relaxed) ||
        atomic_load_explicit(&rt->stopping, memory_order_relaxed))
        return tr__error(TR_ESHUTDOWN, "cannot spawn actor '%s': the runtime is %s",
                         opts->name ? opts->name : "",
                         atomic_load(&rt->failed) ? "stopping after a failure" : "closing");
    bool pinned = opts->pinned && !rt->deterministic;
    tr__actor_t *a = alloc_slot(rt, !pinned);
    if (!a)
        return tr__error(TR_ENOMEM, "cannot spawn actor '%s': no memory for its slot",
                         opts->name ? opts->name : "");
    fill_slot(rt, a, behaviour, state, opts, pinned);
    if ((rc = claim_name(rt, a, "spawn")) < 0) {
        unclaim_slot(rt, a);
        return rc;
    }
    if (pinned && (rc = start_pinned(rt, a)) < 0) {
        if (a->name[0]) tr__names_release(rt, a->name, a->slot);
        unclaim_slot(rt, a);
        return rc;
    }
    if (from) move_history(from, a);
    if (rt->monitor)
        tr_monitor_lane_set(rt->monitor, lane_of(a), a->name[0] ? a->name : "actor",
                            (tr_lane_kind_t)opts->lane_kind);
    *out = publish(rt, a);
    return 0;
}

int tr_actor_spawn(tr_runtime_t *rt, tr_behaviour_cb behaviour, void *state,
                   const tr_actor_opts_t *opts, tr_actor_t *out)
{
    static const tr_actor_opts_t defaults = {0};
    if (!rt || !behaviour || !out)
        return tr__error(TR_EINVAL, "tr_actor_spawn: %s is NULL",
                         !rt          ? "the runtime"
                         : !behaviour ? "the behaviour"
                                      : "out");
    return spawn_impl(rt, behaviour, state, opts ? opts : &defaults, NULL, out);
}

/* --- restart and its intensity ----------------------------------------------------------- */

/* True when a restart at time t would make more than max_restarts within the window. The
 * ring holds the last max_restarts restart times, oldest at restart_head. */
static bool intensity_reached(const tr__actor_t *a, uint64_t t)
{
    if (a->max_restarts < 0 || a->n_restart_times < (uint32_t)a->max_restarts) return false;
    return t - a->restart_times[a->restart_head] < a->restart_window_ns;
}

static int note_restart(tr__actor_t *a, uint64_t t)
{
    uint32_t cap = (uint32_t)a->max_restarts;
    if (a->max_restarts < 0) return 0;
    if (!a->restart_times && !(a->restart_times = malloc(cap * sizeof(uint64_t)))) return TR_ENOMEM;
    if (a->n_restart_times < cap) {
        a->restart_times[(a->restart_head + a->n_restart_times++) % cap] = t;
    } else {
        a->restart_times[a->restart_head] = t;
        a->restart_head = (a->restart_head + 1) % cap;
    }
    return 0;
}

static int restart_pinned(tr_runtime_t *rt, tr__actor_t *a, tr_actor_t *out)
{
    tr_actor_opts_t o = {.name = a->name,
                         .pinned = 1,
                         .defer_stop = a->defer_stop,
                         .supervisor = {a->sup_taken},
                         .init = a->init,
                         .cleanup = a->cleanup,
                         .batch = a->batch,
                         .lane_kind = a->lane_kind,
                         .max_restarts = a->max_restarts,
                         .restart_window_ms = (unsigned)(a->restart_window_ns / 1000000u)};
    int rc = spawn_impl(rt, a->behaviour, a->state, &o, a, out);
    if (rc == 0) a->restarted = 1;
    return rc; /* on failure tr_last_error already says why */
}

/* The restart proper, with a's restart_busy held. */
static int restart_claimed(tr_runtime_t *rt, tr__actor_t *a, uint32_t gen, tr_actor_t *out)
{
    if (a->restarted || atomic_load_explicit(&a->gen, memory_order_acquire) != gen + 1)
        return tr__error(TR_ENOACTOR,
                         "cannot restart actor '%s' (#%u): it was already "
                         "restarted",
                         a->name, a->slot);
    uint64_t t = tr_now_ns();
    if (a->restarts_exhausted || intensity_reached(a, t))
        return tr__error(TR_ERESTARTS,
                         "cannot restart actor '%s' (#%u): restart intensity "
                         "reached (at most %d restart%s in %llu ms)",
                         a->name, a->slot, a->max_restarts, a->max_restarts == 1 ? "" : "s",
                         (unsigned long long)(a->restart_window_ns / 1000000u));
    if (note_restart(a, t) < 0)
        return tr__error(TR_ENOMEM, "cannot restart actor '%s': out of memory", a->name);
    if (atomic_load_explicit(&a->pinned, memory_order_relaxed)) return restart_pinned(rt, a, out);
    int rc = claim_name(rt, a, "restart");
    if (rc < 0) return rc;
    atomic_store_explicit(&a->supervisor, a->sup_taken, memory_order_release); /* see fill_slot */
    *out = publish(rt, a);
    return 0;
}

int tr_actor_restart(tr_runtime_t *rt, tr_actor_t dead, tr_actor_t *out)
{
    uint32_t slot = (uint32_t)dead.id;
    uint32_t gen = (uint32_t)(dead.id >> 32);
    tr__actor_t *a = rt && slot < atomic_load_explicit(&rt->next_slot, memory_order_relaxed)
                         ? tr__slot(rt, slot)
                         : NULL;
    if (!a || !(gen & 1) || !out)
        return tr__error(TR_EINVAL, "tr_actor_restart: %s",
                         !out ? "out is NULL" : "not an actor's address");
    uint32_t now = atomic_load_explicit(&a->gen, memory_order_acquire);
    if (now == gen)
        return tr__error(TR_EBUSY, "cannot restart actor '%s' (#%u): it is still running", a->name,
                         slot);
    if (now != gen + 1 || a->recyclable) /* reused, or never kept for restart */
        return tr__error(TR_ENOACTOR, "cannot restart actor #%u: its slot %s", slot,
                         a->recyclable ? "was not kept (no supervisor)" : "was reused");
    if (atomic_load_explicit(&rt->failed, memory_order_relaxed))
        return tr__error(TR_ESHUTDOWN,
                         "cannot restart actor '%s': the runtime is stopping "
                         "after a failure",
                         a->name);
    uint8_t idle = 0;
    /* acquire/release: one restart at a time; the next sees what this one wrote */
    if (!atomic_compare_exchange_strong_explicit(&a->restart_busy, &idle, 1, memory_order_acquire,
                                                 memory_order_relaxed))
        return tr__error(TR_EBUSY,
                         "cannot restart actor '%s' (#%u): another restart of it "
                         "is under way",
                         a->name, slot);
    int rc = restart_claimed(rt, a, gen, out);
    atomic_store_explicit(&a->restart_busy, 0, memory_order_release);
    return rc;
}

/* --- send ------------------------------------------------------------------------------ */

__attribute__((always_inline)) static inline void fill_envelope(tr_runtime_t *rt, tr_msg_t *m,
                                                                tr_actor_t to, bool urgent)
{
    tr__actor_t *self = tr__tls.rt == rt ? tr__tls.actor : NULL;
    send_ids_t *ids = &tls_ids;
    if (__builtin_expect(!ids->flow, 0))
        ids->flow = (uint64_t)atomic_fetch_add_explicit(&next_thread_no, 1, memory_order_relaxed)
                    << 44;
    m->receiver = to;
    m->flags = urgent ? (m->flags | TR_MSG_F_URGENT) : (m->flags & ~TR_MSG_F_URGENT);
    if (self) {
        m->sender = current_id(self);
        m->seq = ++self->seq;
        atomic_store_explicit(&self->msgs_out,
                              atomic_load_explicit(&self->msgs_out, memory_order_relaxed) + 1,
                              memory_order_relaxed);
    } else {
        m->sender = TR_ACTOR_NONE;
        m->seq = ++ids->external_seq; /* per thread: no locked add, which fences the stores */
    }
    m->flow_id = ++ids->flow;
    if (__builtin_expect(rt->timestamps, 0)) m->send_ns = tr_now_ns();
    if (__builtin_expect(rt->monitor != NULL, 0)) trace_send(rt, self, m);
}

static bool can_run_inline(tr_runtime_t *rt, tr__actor_t *a);
static void run_inline(tr_runtime_t *rt, tr__actor_t *a);

/* Pushes the outbox's chain. A stream (TR__OUTBOX_MAX or more messages to the receiver in a
 * row from this behaviour) to a cheap receiver that is idle, or waiting in this worker's
 * run-next slot, runs it here at once (run_inline). Otherwise a receiver that was idle is
 * scheduled: in parallel with the sender when the behaviour is still sending (burst: the
 * outbox filled up), else in the worker's run-next slot, to run when the activation ends. */
static void outbox_flush(bool burst)
{
    outbox_t *o = &tls_out;
    if (!o->n) return;
    tr__actor_t *to = o->to;
    tr_runtime_t *rt = o->rt;
    bool idle = tr__mpscq_push(&to->data_in, o->first, o->last, o->n);
    o->n = 0;
    /* A receiver that was not idle runs inline only from this worker's run-next slot */
    bool stream = o->streak >= TR__OUTBOX_MAX;
    if (idle) {
        if (stream && can_run_inline(rt, to))
            run_inline(rt, to);
        else
            tr__sched_schedule_as(rt, to, burst);
    } else if (stream && tr__sched_is_next(tr__tls.worker, to) && can_run_inline(rt, to) &&
               tr__sched_take_next(tr__tls.worker, to)) {
        run_inline(rt, to);
    }
}

/* Adds a linked chain to the outbox: after the chain to another actor is pushed, or pushed
 * itself once the outbox holds TR__OUTBOX_MAX messages. */
static void outbox_add(tr_runtime_t *rt, tr__actor_t *a, tr_msg_t *first, tr_msg_t *last, size_t n)
{
    outbox_t *o = &tls_out;
    if (o->to != a || o->from != tr__tls.actor || o->rt != rt) {
        outbox_flush(false);
        *o = (outbox_t){.rt = rt, .from = tr__tls.actor, .to = a};
    }
    if (o->n)
        atomic_store_explicit(&o->last->tr_next_, first, memory_order_relaxed);
    else
        o->first = first;
    o->last = last;
    o->n += n;
    o->streak += n;
    if (o->n >= TR__OUTBOX_MAX) outbox_flush(true);
}

/* The slot `to` names, if its actor still lives: a send's refusals. */
static inline int check_receiver(tr_runtime_t *rt, tr_actor_t to, tr__actor_t **out)
{
    tr__actor_t *a = tr__actor_lookup(rt, to);
    if (!a) return TR_ENOACTOR;
    /* relaxed: a fast refusal only; a stop racing with this send is handled at pop */
    if (atomic_load_explicit(&a->gen, memory_order_relaxed) != (uint32_t)(to.id >> 32))
        return TR_ESTOPPED;
    *out = a;
    return 0;
}

/* Hands the filled chain first..last (n messages) to a: the outbox, or a push. */
__attribute__((always_inline)) static inline void
deliver(tr_runtime_t *rt, tr__actor_t *a, tr_msg_t *first, tr_msg_t *last, size_t n, bool urgent)
{
    if (!urgent && tr__tls.worker && tr__tls.actor && tr__tls.rt == rt) {
        outbox_add(rt, a, first, last, n);
    } else if (!urgent) {
        if (tr__mpscq_push(&a->data_in, first, last, n)) tr__sched_schedule(rt, a);
    } else {
        tr__mpscq_push(&a->urgent_in, first, last, n);
        if (tr__mpscq_unmark(&a->data_in)) tr__sched_schedule(rt, a);
    }
}

/* A send's first half: the envelopes (the sending actor's address, seq and counters) and, in
 * wire-check mode, the encoding. */
static int fill_all(tr_runtime_t *rt, tr_actor_t to, tr_msg_t **msgs, size_t n, bool urgent)
{
    for (size_t i = 0; i < n; i++)
        fill_envelope(rt, msgs[i], to, urgent);
    if (rt->wire_check && msgs[0]->type != TR_MSG_KILL) return tr__wire_encode(rt, msgs, n);
    return 0;
}

/* A send's second half: the filled messages linked and handed to a, the receiver's slot. */
static void push_filled(tr_runtime_t *rt, tr__actor_t *a, tr_msg_t **msgs, size_t n, bool urgent)
{
    for (size_t i = 0; i + 1 < n; i++)
        atomic_store_explicit(&msgs[i]->tr_next_, msgs[i + 1], memory_order_relaxed);
    deliver(rt, a, msgs[0], msgs[n - 1], n, urgent);
}

/* A send pushes the messages onto the receiver's data (or urgent) lane. Inside a behaviour
 * running on a worker, consecutive data sends to one actor gather in the thread's outbox and go
 * as one chain (one exchange, one scheduling check) when the behaviour returns, when it sends
 * to another actor, or every TR__OUTBOX_MAX messages: the line transfers a push costs are paid
 * per chain, and per-sender FIFO holds (one outbox per thread, pushed in order). A pinned
 * actor's sends go at once: pinned actors are the long-running ones (an executor handing out
 * gradients during a backward, a pipeline stage computing after a send), whose sends must not
 * wait for the behaviour to return. An urgent send is pushed at once. */
static int send_impl(tr_runtime_t *rt, tr_actor_t to, tr_msg_t **msgs, size_t n, bool urgent)
{
    if (!rt || !msgs || n == 0) return TR_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!msgs[i]) return TR_EINVAL;
    tr__actor_t *a;
    int rc = check_receiver(rt, to, &a);
    if (rc < 0 || (rc = fill_all(rt, to, msgs, n, urgent)) < 0) return rc;
    push_filled(rt, a, msgs, n, urgent);
    return 0;
}

/* send_impl for one data message, without its loops and its wire-check branch: the send almost
 * every message makes (62 fewer instructions a message with tr_msg_alloc's path, and fjthrput
 * 10% faster: bench/RESULTS.md). */
int tr_actor_send(tr_runtime_t *rt, tr_actor_t to, tr_msg_t *msg)
{
    if (!rt || !msg) return TR_EINVAL;
    if (__builtin_expect(rt->wire_check, 0)) return send_impl(rt, to, &msg, 1, false);
    tr__actor_t *a;
    int rc = check_receiver(rt, to, &a);
    if (rc < 0) return rc;
    fill_envelope(rt, msg, to, false);
    deliver(rt, a, msg, msg, 1, false);
    return 0;
}

int tr_actor_send_chain(tr_runtime_t *rt, tr_actor_t to, tr_msg_t **msgs, size_t n)
{
    return send_impl(rt, to, msgs, n, false);
}

int tr_actor_send_urgent(tr_runtime_t *rt, tr_actor_t to, tr_msg_t *msg)
{
    return send_impl(rt, to, &msg, 1, true);
}

int tr__actor_send_internal(tr_runtime_t *rt, tr_actor_t to, tr_msg_t *m, bool urgent)
{
    int rc = send_impl(rt, to, &m, 1, urgent);
    if (rc < 0) tr_msg_free(rt, m);
    return rc;
}

static int send_kill(tr_runtime_t *rt, tr_actor_t a, int reason)
{
    tr_msg_t *m = tr_msg_new(rt, TR_MSG_KILL);
    if (!m) return TR_ENOMEM;
    TR_MSG_AS(m, kill)->reason = reason;
    return tr__actor_send_internal(rt, a, m, true);
}

/* --- stop, link ------------------------------------------------------------------------ */

int tr_actor_stop(tr_runtime_t *rt, tr_actor_t addr)
{
    tr__actor_t *a = tr__actor_lookup(rt, addr);
    if (!a) return TR_ENOACTOR;
    if (atomic_load_explicit(&a->gen, memory_order_relaxed) != (uint32_t)(addr.id >> 32))
        return TR_ESTOPPED;
    if (tr__tls.rt == rt && tr__tls.actor == a) {
        a->stop_requested = 1;
        return 0;
    }
    return send_kill(rt, addr, 0);
}

/* The supervisor word's protocol. tr_actor_link and finish (the child's stop) race: a link
 * must either reach finish's read of the supervisor or fail with TR_ESTOPPED, and must never
 * land on a later generation of the slot. A plain check-then-store did neither: a link
 * between finish's read and its generation bump returned 0 and nobody was told (test_link:
 * 3,000-5,200 of 54,000-69,000 links that returned 0, the link spread over the child's stop),
 * and one after the slot was reused went to the new actor. So the word has two more states.
 * finish swaps the value for TR__SUP_CLOSED (a compare-and-swap: it waits out
 * TR__SUP_LINKING). A link swaps the value it read for TR__SUP_LINKING, which holds finish
 * off, then checks the generation: if it is still the child's, finish has not begun and will
 * read what the link stores; otherwise the slot moved on and its word happened to hold the
 * same value again, which the link puts back. So the word of every free slot is closed, a
 * failed spawn's too (unclaim_slot): a link never holds a closed word, and the next spawn's
 * plain store cannot overwrite a link in progress. Valid ids never have these low 32 bits
 * (slots < 2^28). */

static void wait_a_little(unsigned *spins)
{
    if (++*spins % 64 == 0)
        sched_yield(); /* the other side may have been preempted */
    else
        tr__cpu_relax();
}

int tr_actor_link(tr_runtime_t *rt, tr_actor_t supervisor, tr_actor_t child)
{
    tr__actor_t *a = tr__actor_lookup(rt, child);
    if (!a || !tr__actor_lookup(rt, supervisor)) return TR_ENOACTOR;
    uint32_t gen = (uint32_t)(child.id >> 32);
    uint64_t v = atomic_load_explicit(&a->supervisor, memory_order_relaxed);
    for (unsigned spins = 0;;) {
        if (v == TR__SUP_CLOSED || atomic_load_explicit(&a->gen, memory_order_acquire) != gen)
            return TR_ESTOPPED;
        if (v == TR__SUP_LINKING) { /* another link is under way */
            wait_a_little(&spins);
            v = atomic_load_explicit(&a->supervisor, memory_order_relaxed);
        } else if (atomic_compare_exchange_weak_explicit(&a->supervisor, &v, TR__SUP_LINKING,
                                                         memory_order_acquire,
                                                         memory_order_relaxed)) {
            break;
        }
    }
    bool ours = atomic_load_explicit(&a->gen, memory_order_acquire) == gen;
    /* release: pairs with finish's acquire compare-and-swap */
    atomic_store_explicit(&a->supervisor, ours ? supervisor.id : v, memory_order_release);
    return ours ? 0 : TR_ESTOPPED;
}

/* finish's side: closes the word and returns the supervisor it held. */
static tr_actor_t take_supervisor(tr__actor_t *a)
{
    uint64_t v = atomic_load_explicit(&a->supervisor, memory_order_relaxed);
    for (unsigned spins = 0;;) {
        if (v == TR__SUP_LINKING) {
            wait_a_little(&spins);
            v = atomic_load_explicit(&a->supervisor, memory_order_relaxed);
        } else if (atomic_compare_exchange_weak_explicit(&a->supervisor, &v, TR__SUP_CLOSED,
                                                         memory_order_acquire,
                                                         memory_order_relaxed)) {
            a->sup_taken = v; /* published to a restart by the gen bump (release) */
            return (tr_actor_t){v};
        }
    }
}

static void kill_one(tr_runtime_t *rt, tr_actor_t a, void *arg)
{
    send_kill(rt, a, *(int *)arg);
}

/* "actor 'name' (#slot) failed handling message 'type': TR_E... (text)": how every report of
 * a failure begins (a log line, the runtime's failure text). Returns buf. */
static const char *failure_text(char *buf, size_t len, const char *name, uint32_t slot,
                                uint32_t msg_type, int reason)
{
    snprintf(buf, len, "actor '%s' (#%u) failed handling message '%s': %s (%s)", name, slot,
             msg_type ? tr_msg_type_name(msg_type) : "(init)", tr_err_name(reason),
             tr_strerror(reason));
    return buf;
}

/* The TR_MSG_EXIT notice of the stop of `self` for its supervisor, filled for sending; NULL
 * when there is no memory for it or (wire-check mode) it does not encode. */
static tr_msg_t *exit_notice(tr_runtime_t *rt, tr_actor_t sup, tr_actor_t self, int reason,
                             uint32_t msg_type, const char *name)
{
    tr_msg_t *m = tr_msg_new(rt, TR_MSG_EXIT);
    if (!m) return NULL;
    tr_msg_exit_t *e = TR_MSG_AS(m, exit);
    e->actor = self;
    e->reason = reason;
    e->msg_type = msg_type;
    memcpy(e->name, name, sizeof(e->name));
    if (fill_all(rt, sup, &m, 1, true) < 0) {
        tr_msg_free(rt, m);
        return NULL;
    }
    return m;
}

/* Ends the current generation: cleanup, gen bump, supervisor notice, slot reuse. Runs on
 * the thread running the actor; after the gen bump it touches only the mailbox. */
static void finish(tr_runtime_t *rt, tr__actor_t *a, int reason, uint32_t msg_type)
{
    tr_ctx_t ctx = {rt, current_id(a), a->state};
    if (a->cleanup) a->cleanup(&ctx, reason);
    tr_actor_t sup = take_supervisor(a);
    char name[TR__NAME_MAX], why[sizeof(rt->failure)];
    memcpy(name, a->name, sizeof(name));
    /* a supervisor given by tr_actor_link after the spawn keeps the slot for a restart too */
    bool recycle = a->recyclable && tr_actor_is_none(sup);
    int told = reason;
    if (reason < 0 && !tr_actor_is_none(sup) && !recycle && intensity_reached(a, tr_now_ns())) {
        a->restarts_exhausted = 1;
        told = TR_ERESTARTS;
        tr_log(TR_LOG_ERROR,
               "%s; restart intensity reached (at most %d restart%s in %llu ms): "
               "its supervisor is told TR_ERESTARTS",
               failure_text(why, sizeof(why), name, a->slot, msg_type, reason), a->max_restarts,
               a->max_restarts == 1 ? "" : "s",
               (unsigned long long)(a->restart_window_ns / 1000000u));
    }
    /* The supervisor's notice is filled while this generation is current: its sender is the
     * actor that stopped, and seq and msgs_out are this generation's (once gen moves on, a
     * restart on another thread may reset them). It is pushed after the generation ends, so
     * that a restart made on receiving it finds the actor stopped. */
    tr_msg_t *exit =
        tr_actor_is_none(sup) ? NULL : exit_notice(rt, sup, ctx.self, told, msg_type, name);
    a->recyclable = recycle; /* read by tr_actor_restart after gen (acquire) */
    if (name[0]) /* freed before the generation ends: whoever learns of the stop may reuse it */
        tr__names_release(rt, name, a->slot);
    /* release: cleanup's effects happen-before a restart that reads gen with acquire */
    atomic_store_explicit(&a->gen, atomic_load_explicit(&a->gen, memory_order_relaxed) + 1,
                          memory_order_release);
    tr__actor_t *to;
    if (exit && check_receiver(rt, sup, &to) == 0) {
        push_filled(rt, to, &exit, 1, true);
    } else if (!tr_actor_is_none(sup)) {
        tr_msg_free(rt, exit);
        sup = TR_ACTOR_NONE; /* the supervisor is gone: nobody is told */
    }
    if (tr_actor_is_none(sup) && reason < 0)
        tr__runtime_fail(rt, "%s", failure_text(why, sizeof(why), name, a->slot, msg_type, reason));
    fail_on_queued_notices(rt, a, (uint32_t)(ctx.self.id >> 32));
    if (recycle) free_slot(rt, a);
    tr__runtime_actor_stopped(rt);
}

void tr__runtime_kill_all(tr_runtime_t *rt, int reason)
{
    tr__actor_for_each_alive(rt, kill_one, &reason);
}

/* --- running an actor ------------------------------------------------------------------ */

static bool run_init(tr_runtime_t *rt, tr__actor_t *a)
{
    a->init_pending = 0;
    tr_ctx_t ctx = {rt, current_id(a), a->state};
    int rc = a->init(&ctx);
    if (rc < 0) {
        finish(rt, a, rc, 0);
        return false;
    }
    return true;
}

/* A failure notice (TR_MSG_EXIT) that its supervisor's generation will never handle (it
 * stopped, or was restarted, first) is an unhandled failure, as if the supervisor had been
 * gone when the actor failed (finish). tr__runtime_fail keeps the first failure only. */
static void fail_on_notice(tr_runtime_t *rt, tr_msg_t *m)
{
    tr_msg_t *plain = m;
    if ((m->flags & TR_MSG_F_WIRE) && tr__wire_decode(rt, m, &plain) < 0) return;
    const tr_msg_exit_t *e = TR_MSG_AS(plain, exit);
    char why[sizeof(rt->failure)];
    if (e->reason < 0)
        tr__runtime_fail(
            rt, "%s; its supervisor stopped before it was told",
            failure_text(why, sizeof(why), e->name, (uint32_t)e->actor.id, e->msg_type, e->reason));
    if (plain != m) tr_msg_free(rt, plain);
}

/* A message its receiver's generation will never handle. */
static void dead_letter(tr_runtime_t *rt, tr_msg_t *m)
{
    atomic_fetch_add_explicit(&rt->dead_letters, 1, memory_order_relaxed);
    if (m->type == TR_MSG_EXIT) fail_on_notice(rt, m);
}

/* At the stop of generation gen (finish, on the thread running it, the queue's consumer):
 * the failure notices queued for it, read in place, fail the runtime now, before the stop
 * counts; popped later as dead letters, they could come after tr_runtime_run returned.
 * Notices travel on the urgent lane. */
static void fail_on_queued_notices(tr_runtime_t *rt, tr__actor_t *a, uint32_t gen)
{
    /* acquire: pairs with the pushes' release link stores, as a pop's does */
    for (tr_msg_t *m = atomic_load_explicit(&a->urgent_out.tail->tr_next_, memory_order_acquire); m;
         m = atomic_load_explicit(&m->tr_next_, memory_order_acquire))
        if (m->type == TR_MSG_EXIT && (uint32_t)(m->receiver.id >> 32) == gen)
            fail_on_notice(rt, m);
}

/* Delivers one message to the current generation, or drops it. */
static void handle(tr_runtime_t *rt, tr__actor_t *a, tr_msg_t *m)
{
    /* acquire: pairs with publish()'s release, making the generation's fields visible */
    uint32_t gen = atomic_load_explicit(&a->gen, memory_order_acquire);
    if ((uint32_t)(m->receiver.id >> 32) != gen) {
        dead_letter(rt, m);
        return;
    }
    if (a->init_pending && !run_init(rt, a)) {
        dead_letter(rt, m);
        return;
    }
    if (m->type == TR_MSG_KILL) {
        finish(rt, a, TR_MSG_AS(m, kill)->reason, 0);
        return;
    }
    tr_msg_t *wire = NULL;
    if (m->flags & TR_MSG_F_WIRE) { /* wire-check mode: the behaviour sees the decoded copy */
        wire = m;
        int rc = tr__wire_decode(rt, wire, &m);
        if (rc < 0) {
            finish(rt, a, rc, wire->type);
            return;
        }
    }
    tr_ctx_t ctx = {rt, tr__actor_id(gen, a->slot), a->state};
    int rc = a->behaviour(&ctx, m);
    if (wire) {
        tr_msg_free(rt, m);
        m = wire;
    }
    atomic_store_explicit(&a->msgs_in, atomic_load_explicit(&a->msgs_in, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    if (rc < 0)
        finish(rt, a, rc, m->type);
    else if (a->stop_requested || (m->type == TR_MSG_STOP && !a->defer_stop))
        finish(rt, a, 0, 0);
}

static inline tr_msg_t *next_message(tr__actor_t *a, tr__pool_t *pool)
{
    tr_msg_t *done;
    tr_msg_t *m = tr__mpscq_pop(&a->urgent_out, &done);
    if (!m) m = tr__mpscq_pop(&a->data_out, &done);
    if (done) tr__pool_free(pool, done);
    return m;
}

/* Messages queued now. It reads the senders' line (the push counters beside the heads), so
 * the running thread calls it only when tracing, or when an activation ends with messages
 * left (note_backlog): never once per message. */
static uint64_t queued(tr__actor_t *a)
{
    uint64_t in = atomic_load_explicit(&a->data_in.pushed, memory_order_relaxed) +
                  atomic_load_explicit(&a->urgent_in.pushed, memory_order_relaxed);
    uint64_t out = atomic_load_explicit(&a->data_out.popped, memory_order_relaxed) +
                   atomic_load_explicit(&a->urgent_out.popped, memory_order_relaxed);
    return in - out;
}

/* A mailbox-depth counter sample, at most one per TR__DEPTH_SAMPLE_NS per actor, and only
 * while the step window records. depth_sampled_ns is the running thread's own field. */
static void trace_depth(tr_runtime_t *rt, tr__actor_t *a, uint64_t depth)
{
    if (!tr_monitor_recording(rt->monitor)) return;
    uint64_t now = tr_now_ns();
    if (now - a->depth_sampled_ns < TR__DEPTH_SAMPLE_NS) return;
    a->depth_sampled_ns = now;
    tr_monitor_counter(rt->monitor, (int)lane_of(a), TR_COUNTER_MAILBOX_DEPTH, (double)depth, now);
}

/* handle() inside a span (and an NVTX range) named after the message type. The span covers
 * a stop's cleanup and exit notice too, so every send the actor makes lies inside one. */
static void handle_traced(tr_runtime_t *rt, tr__actor_t *a, tr_msg_t *m)
{
    tr_monitor_t *mon = rt->monitor;
    tr_span_t s = {tr_msg_type_name(m->type),
                   tr_now_ns(),
                   0,
                   m->step,
                   m->micro_step,
                   lane_of(a),
                   m->size,
                   m->flow_id};
    tr_monitor_range_push(mon, s.name);
    handle(rt, a, m);
    tr_monitor_range_pop(mon);
    s.end_ns = tr_now_ns();
    tr_monitor_span(mon, &s);
}

/* The actor's init at the start of an activation, inside an "init" span when traced. */
static void activation_init(tr_runtime_t *rt, tr__actor_t *a)
{
    if (!rt->monitor) {
        run_init(rt, a);
        return;
    }
    tr_span_t s = {"init", tr_now_ns(), 0, 0, 0, lane_of(a), 0, 0};
    run_init(rt, a);
    s.end_ns = tr_now_ns();
    tr_monitor_span(rt->monitor, &s);
}

/* Called after an activation that popped nothing although a push was under way: a sender
 * between its exchange and its link (mailbox/mpscq.h). The link usually lands within
 * nanoseconds and the actor runs again at once; but a sender preempted in that window (more
 * threads than cores: a thread outside the runtime beside the workers) leaves the actor
 * scheduled with nothing to run, and running it again and again takes the core the sender
 * needs to finish its push. Measured on fjthrput: a process that made 330,000 such empty
 * activations for its 600,000 messages took 80 ms against 42. So every TR__EMPTY_RUNS_YIELD
 * in a row, the thread yields its core. Linux's scheduler moves a yielding thread's deadline
 * by one slice, which is 100 us for the runtime's threads (threads.c): every 16 empty runs,
 * test_inflight's sender got 60 ms of CPU in 77-91 ms of wall time under ThreadSanitizer (each
 * activation slower there), against 62-63 with the kernel's 1.4 ms slice; every 4, 65-68. In a
 * release build both take 61-64, and fjthrput and counting did not move. */
static void after_empty_run(void)
{
    if (++tls_empty_runs % TR__EMPTY_RUNS_YIELD == 0) sched_yield();
}

/* An activation in progress: one actor's turn on a thread, up to a batch of messages. */
typedef struct activation {
    tr__actor_t *a;
    uint64_t t0;
    uint32_t gen; /* the slot's generation when it began */
    unsigned limit, n;
    bool drained;    /* it ended because nothing was left to pop */
    bool inline_run; /* inside a sender's send (run_inline) */
    bool mixed;      /* messages from more than one sender so far */
    uint64_t sender; /* the last message's sender */
} activation_t;

static void activation_begin(tr_runtime_t *rt, activation_t *x, tr__actor_t *a, uint64_t t0)
{
    /* acquire: the generation's fields (batch among them) as its spawn wrote them */
    uint32_t gen = atomic_load_explicit(&a->gen, memory_order_acquire);
    *x = (activation_t){.a = a,
                        .t0 = t0,
                        .gen = gen,
                        .limit = a->batch ? a->batch : rt->batch,
                        .sender = (gen & 1) ? a->last_sender : TR__NO_SENDER};
    tr__tls.actor = a;
    if (rt->monitor) trace_depth(rt, a, queued(a));
    if ((x->gen & 1) && a->init_pending) activation_init(rt, a);
    outbox_flush(false);
}

/* Handles the actor's next message (urgent first). False when the activation is over: nothing
 * is queued, or its batch (count or time) is used up. */
__attribute__((always_inline)) static inline bool activation_step(tr_runtime_t *rt,
                                                                  tr__pool_t *pool, activation_t *x)
{
    tr__actor_t *a = x->a;
    tr_msg_t *m = next_message(a, pool);
    if (!m) {
        x->drained = true;
        return false;
    }
    x->mixed |= m->sender.id != x->sender && x->sender != TR__NO_SENDER;
    x->sender = m->sender.id;
    /* relaxed: only an address to prefetch; the pop that takes it reads the link (acquire) */
    tr_msg_t *ahead = atomic_load_explicit(&m->tr_next_, memory_order_relaxed);
    if (ahead) __builtin_prefetch(ahead, 0, 3);
    tr__tls.actor = a;
    tls_out.streak = 0; /* a stream is one behaviour's (outbox_flush) */
    if (__builtin_expect(rt->monitor != NULL, 0))
        handle_traced(rt, a, m);
    else
        handle(rt, a, m);
    if (tls_out.n) outbox_flush(false);
    return !(++x->n >= x->limit || ((x->n & 7) == 0 && tr__ticks() - x->t0 > rt->batch_ticks));
}

/* After an activation that handled messages: whether a stream may run the actor inline
 * (can_run_inline) from now on. It may while it has been fed by one sender at a time and
 * has cost at most rt->inline_ticks a message so far. Kept in the line every send reads,
 * written only when it changes. */
static void note_inline(tr_runtime_t *rt, tr__actor_t *a, const activation_t *x)
{
    a->last_sender = x->sender;
    a->many_senders = x->mixed ? TR__MANY_SENDERS_HOLD : a->many_senders ? a->many_senders - 1 : 0;
    uint64_t ran = atomic_load_explicit(&a->run_ns, memory_order_relaxed);
    uint64_t n = atomic_load_explicit(&a->msgs_in, memory_order_relaxed);
    /* n * inline_ticks only where it cannot wrap: past inline_n_max any run time fits */
    uint8_t ok = !a->many_senders && (!n || n > rt->inline_n_max || ran <= n * rt->inline_ticks);
    if (ok != atomic_load_explicit(&a->inline_ok, memory_order_relaxed))
        atomic_store_explicit(&a->inline_ok, ok, memory_order_relaxed);
}

/* Puts an activation's actor back to run again: in the run queue, or after an inline run in
 * the sender's run-next slot (its next burst, or the end of its activation, runs it). */
static void give_back(tr_runtime_t *rt, tr__worker_t *w, const activation_t *x)
{
    if (x->inline_run)
        tr__sched_schedule(rt, x->a); /* tr__tls.actor is the sender again */
    else
        tr__sched_reschedule(rt, w, x->a);
}

/* The peak depth statistic: the largest backlog an activation met, the messages it handled
 * plus those still queued when it ended (at least the depth it started with). One that
 * emptied the mailbox left none, so only one that stopped at its batch reads the senders'
 * counters. A read at every activation's start, as before, pulled the senders' line over once
 * an activation: fjthrput with the vCPUs near, 21.9-22.7 ms against 22.7-24.7 (Go 18.5-21.6;
 * four alternating processes). */
static void note_backlog(tr__actor_t *a, const activation_t *x)
{
    uint64_t backlog = x->n + (x->drained ? 0 : queued(a));
    if (backlog > atomic_load_explicit(&a->peak_depth, memory_order_relaxed))
        atomic_store_explicit(&a->peak_depth, backlog, memory_order_relaxed);
}

/* Gives the actor up: marks it idle, or puts it back in a run queue. */
static void activation_end(tr_runtime_t *rt, tr__worker_t *w, activation_t *x, uint64_t ran)
{
    tr__actor_t *a = x->a;
    if (x->n) tls_empty_runs = 0;
    /* the activation's time and count, unless a new generation was published in the slot
     * meanwhile (its counters start from zero: publish) */
    if (atomic_load_explicit(&a->gen, memory_order_relaxed) == x->gen) {
        /* run_ns holds ticks; tr_actor_stats converts */
        atomic_store_explicit(&a->run_ns,
                              atomic_load_explicit(&a->run_ns, memory_order_relaxed) + ran,
                              memory_order_relaxed);
        atomic_store_explicit(&a->activations,
                              atomic_load_explicit(&a->activations, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        if (x->n) note_backlog(a, x);
        /* a live generation's only (a dead slot's stray activation races with a publish
         * that resets these fields); not at all where inline runs cannot happen */
        if (x->n && (x->gen & 1) && rt->inline_ticks && !rt->deterministic) note_inline(rt, a, x);
    }
    /* The urgent lane's tail, taken while this thread still owns the actor: once the data
     * lane is marked idle another thread may run it, so only the head may be read after. */
    const tr_msg_t *urgent_tail = a->urgent_out.tail;
    if (!tr__mpscq_mark_empty(&a->data_in, &a->data_out)) {
        if (x->n == 0) after_empty_run();
        give_back(rt, w, x);
        return;
    }
    /* Idle now. An urgent send that missed the mark is seen here (see design block), and so
     * is a generation published in the slot while this activation ran (a restart, or a spawn
     * reusing the slot of an actor stopped here: its init waits for a scheduling that the
     * publisher could not do, see publish). A spurious unmark after another thread ran the
     * actor meanwhile only schedules it once more. */
    /* seq_cst: after the mark (store-load), pairs with publish's store of gen */
    uint32_t gen = atomic_load_explicit(&a->gen, memory_order_seq_cst);
    bool published = gen != x->gen && (gen & 1);
    if ((published || tr__mpscq_pushed_since(&a->urgent_in, urgent_tail)) &&
        tr__mpscq_unmark(&a->data_in))
        give_back(rt, w, x);
}

static _Thread_local bool tls_inline;           /* an inline activation is running */
static _Thread_local uint64_t tls_inline_ticks; /* ticks spent in inline activations */

/* Whether a stream's receiver may run inline: not from inside another inline activation, on
 * a worker, not the sender itself, not pinned, and its verdict (inline_ok, note_inline): fed
 * by one sender at a time and cheap, at most rt->inline_ticks a message so far (opts.inline_ns;
 * an actor that has handled none yet counts as cheap). */
static bool can_run_inline(tr_runtime_t *rt, tr__actor_t *a)
{
    return !tls_inline && rt->inline_ticks && !rt->deterministic && tr__tls.worker &&
           a != tr__tls.actor && !atomic_load_explicit(&a->pinned, memory_order_relaxed) &&
           atomic_load_explicit(&a->inline_ok, memory_order_relaxed);
}

/* One activation of a, the receiver of the running behaviour's stream (outbox_flush), on
 * this thread inside the sender's send. Its time is its own: the sender's activation does not
 * count it (tls_inline_ticks, tr__actor_run_group). */
static void run_inline(tr_runtime_t *rt, tr__actor_t *a)
{
    tr__actor_t *self = tr__tls.actor;
    outbox_t streaming = tls_out; /* empty: the sender's streak, kept for its next flush */
    tls_inline = true;
    uint64_t t0 = tr__ticks();
    activation_t x;
    activation_begin(rt, &x, a, t0);
    x.inline_run = true;
    while (activation_step(rt, tr__thread_pool(rt), &x))
        ;
    tr__tls.actor = self;
    uint64_t ran = tr__ticks() - t0;
    activation_end(rt, tr__tls.worker, &x, ran);
    tls_inline_ticks += ran;
    tls_out = streaming;
    tls_inline = false;
}

/* k activations (1..TR__GROUP_MAX) interleaved, a message of each in turn; each ends after
 * a batch of messages (urgent first) and gives its actor up (marks it idle or puts it back in
 * a run queue). With several, each actor's messages still run in order and one at a time;
 * what changes is that several mailboxes' chains are walked side by side. A queued message's
 * address is in the message before it, so one actor's backlog is fetched a message (a cache
 * miss) at a time; with several, the next message of one is on its way while the others'
 * run. The time is split evenly among the activations running at each moment (they alternate
 * message by message). w is NULL on a pinned actor's thread. */
uint64_t tr__actor_run_group(tr_runtime_t *rt, tr__worker_t *w, tr__actor_t **actors, int k)
{
    tr__pool_t *pool = tr__thread_pool(rt);
    activation_t x[TR__GROUP_MAX];
    uint64_t ran[TR__GROUP_MAX] = {0};
    bool live[TR__GROUP_MAX];
    uint64_t t0 = tr__ticks();
    uint64_t now = t0;
    uint64_t last = t0 - tls_inline_ticks; /* the activations' own clock: inline runs excluded */
    for (int i = 0; i < k; i++) {
        activation_begin(rt, &x[i], actors[i], t0);
        live[i] = true;
    }
    for (int n_live = k; n_live > 0;) {
        for (int i = 0; i < k; i++) {
            if (!live[i] || activation_step(rt, pool, &x[i])) continue;
            tr__tls.actor = NULL;
            now = tr__ticks();
            uint64_t t = now - tls_inline_ticks;
            for (int j = 0; j < k; j++)
                if (live[j]) ran[j] += (t - last) / (uint64_t)n_live;
            last = t;
            live[i] = false;
            n_live--;
            activation_end(rt, w, &x[i], ran[i]);
        }
    }
    return now;
}

/* --- queries --------------------------------------------------------------------------- */

const char *tr_actor_name(tr_runtime_t *rt, tr_actor_t addr)
{
    tr__actor_t *a = tr__actor_lookup(rt, addr);
    if (!a || atomic_load_explicit(&a->gen, memory_order_acquire) != (uint32_t)(addr.id >> 32))
        return NULL;
    return a->name;
}

tr_actor_t tr_actor_self(void)
{
    return tr__tls.actor ? current_id(tr__tls.actor) : TR_ACTOR_NONE;
}

int tr_actor_stats(tr_runtime_t *rt, tr_actor_t addr, tr_actor_stats_t *out)
{
    tr__actor_t *a = tr__actor_lookup(rt, addr);
    if (!a || !out) return a ? TR_EINVAL : TR_ENOACTOR;
    if (atomic_load_explicit(&a->gen, memory_order_acquire) != (uint32_t)(addr.id >> 32))
        return TR_ESTOPPED;
    out->msgs_in = atomic_load_explicit(&a->msgs_in, memory_order_relaxed);
    out->msgs_out = atomic_load_explicit(&a->msgs_out, memory_order_relaxed);
    out->run_ns = tr__ticks_to_ns(atomic_load_explicit(&a->run_ns, memory_order_relaxed));
    out->activations = atomic_load_explicit(&a->activations, memory_order_relaxed);
    uint64_t in = atomic_load_explicit(&a->data_in.pushed, memory_order_relaxed) +
                  atomic_load_explicit(&a->urgent_in.pushed, memory_order_relaxed);
    uint64_t popped = atomic_load_explicit(&a->data_out.popped, memory_order_relaxed) +
                      atomic_load_explicit(&a->urgent_out.popped, memory_order_relaxed);
    out->depth = in > popped ? in - popped : 0;
    out->peak_depth = atomic_load_explicit(&a->peak_depth, memory_order_relaxed);
    if (out->depth > out->peak_depth) out->peak_depth = out->depth;
    return 0;
}

void tr__actor_for_each_alive(tr_runtime_t *rt, void (*fn)(tr_runtime_t *, tr_actor_t, void *),
                              void *arg)
{
    /* seq_cst: after a failure's store of `failed`, paired with publish (see there) */
    uint32_t n = atomic_load_explicit(&rt->next_slot, memory_order_seq_cst);
    for (uint32_t s = 0; s < n; s++) {
        tr__actor_t *a = tr__slot(rt, s);
        if (!a) continue;
        uint32_t gen = atomic_load_explicit(&a->gen, memory_order_seq_cst);
        if (gen & 1) fn(rt, tr__actor_id(gen, s), arg);
    }
}

/* At close, with every thread joined: runs cleanup for actors still alive and frees every
 * queued message and every mailbox's last popped message. */
void tr__actor_drain_all(tr_runtime_t *rt)
{
    tr__pool_t *pool = tr__thread_pool(rt);
    uint32_t n = atomic_load_explicit(&rt->next_slot, memory_order_relaxed);
    for (uint32_t s = 0; s < n; s++) {
        tr__actor_t *a = tr__slot(rt, s);
        if (!a) continue;
        uint32_t gen = atomic_load_explicit(&a->gen, memory_order_relaxed);
        if ((gen & 1) && a->cleanup && !a->init_pending) { /* cleanup pairs with an init that ran */
            tr_ctx_t ctx = {rt, tr__actor_id(gen, s), a->state};
            a->cleanup(&ctx, TR_ESHUTDOWN);
        }
        free(a->restart_times);
        a->restart_times = NULL;
        while (next_message(a, pool))
            ;
        tr__mpscq_tail_t *tails[2] = {&a->data_out, &a->urgent_out};
        for (int i = 0; i < 2; i++)
            if (tails[i]->tail != tr__mpscq_stub(tails[i])) tr__pool_free(pool, tails[i]->tail);
    }
}
