/* The Troupe runtime: worker threads that run actors, a libuv loop thread for timers,
 * signals and file descriptors, and the actor API.
 *
 * An actor is a behaviour (a function called with one message at a time) plus a state
 * pointer. Messages are delivered through a lock-free mailbox with two lanes: urgent
 * (control: stop, credit, failure notices; drained first, never dropped) and data. An actor is
 * never run by two threads at once, so its behaviour needs no locks for its own state.
 *
 * Lifetime rules, numbered once:
 *  1. tr_runtime_init starts the workers and the loop thread; actors may be spawned and sent
 *     to at once, from any thread.
 *  2. tr_runtime_run blocks until no actor is alive, or an unhandled failure stopped the
 *     runtime. tr_runtime_shutdown asks every actor to stop gracefully (a TR_MSG_STOP).
 *  3. A message belongs to its sender until a send succeeds, then to the runtime, which frees
 *     it after the receiving behaviour returns. A failed send leaves it with the sender.
 *  4. A stopped actor's address stays safe to use: sends fail with TR_ESTOPPED, or, when the
 *     stop races with the send, the message is dropped and counted as a dead letter.
 *  5. tr_runtime_close joins every thread and frees every actor and every message still in a
 *     mailbox. Call it after tr_runtime_run has returned, from the thread that called init.
 *  6. A name (tr_actor_opts_t.name) belongs to one live actor at a time: claimed at spawn,
 *     kept across tr_actor_restart, freed when the actor stops. tr_actor_lookup and
 *     tr_actor_send_name always reach the current generation.
 *
 * Signals (handle_signals): the first SIGINT, SIGTERM or SIGUSR1 (which Open MPI's mpirun
 * forwards to every rank, where it turns SIGINT into an abort) sends TR_MSG_STOP to every actor and
 * gives the process signal_grace_ms to finish; then it exits with status 128 + the signal.
 * A second signal exits at once (as a second Ctrl-C does in PyTorch and DeepSpeed), and so
 * does a signal when no actor is alive (nothing could stop gracefully). One SIGTERM always
 * ends the process. The runtime's own threads start with these signals blocked: the kernel
 * delivers them to the application's threads.
 */
#ifndef TR_INCLUDE_TROUPE_RUNTIME_H
#define TR_INCLUDE_TROUPE_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "troupe/error.h"
#include "troupe/msg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- runtime --------------------------------------------------------------------------- */

typedef struct tr_monitor tr_monitor_t; /* troupe/monitor.h */

/* Trace lanes (troupe/monitor.h): an actor's lane is its slot index; slots from
 * TR_RUNTIME_LANE_EXTERNAL up share TR_RUNTIME_LANE_OVERFLOW. Sends from outside any actor
 * (the caller's threads, the loop thread's timers and polls, cleanups at close) start their
 * arrows on TR_RUNTIME_LANE_EXTERNAL, inside a zero-length span named after the message. */
#define TR_RUNTIME_LANE_EXTERNAL 4094u
#define TR_RUNTIME_LANE_OVERFLOW 4095u

typedef struct tr_runtime_opts {
    unsigned n_workers;       /* worker threads; 0 = online cores */
    int deterministic;        /* 1 worker, seeded choice of the next actor, replayable */
    uint64_t seed;            /* deterministic mode's seed; 0 = pick one (printed to stderr) */
    unsigned batch;           /* most messages an actor handles before yielding; 0 = 64 */
    uint64_t batch_ns;        /* most time an actor runs before yielding; 0 = 1 ms */
    int handle_signals;       /* SIGINT/SIGTERM/SIGUSR1 -> graceful stop (signal_grace_ms) */
    unsigned signal_grace_ms; /* after the first signal, how long the graceful stop may take
                               * before the process exits anyway (128 + the signal); a second
                               * signal, or a signal when no actor is alive, exits at once;
                               * 0 = 30000 (30 s) */
    int timestamps;           /* record each message's send time (tr_msg_t.send_ns) */
    tr_monitor_t *monitor;    /* record a span per handled message, a flow per send, mailbox
                               * depths; borrowed: destroy it after tr_runtime_close. NULL:
                               * no tracing, and the hot path pays one predictable branch */
    const char *flight_path;  /* with a monitor: where tr_runtime_run writes the flight
                               * recorder after an unhandled failure; NULL: no dump; copied */
    int wire_check;           /* every message is encoded to msgpack at send and decoded at
                               * receive; behaviours see only the decoded copy. A type that
                               * cannot be encoded fails its send (TR_ENOTSUP / TR_EINVAL,
                               * with a line naming it); one that does not decode fails the
                               * receiver (TR_EDECODE). Proves that every message would mean
                               * the same in another process. Off by default (it costs an
                               * encode, a decode and a copy per message). */
    unsigned slice_us;        /* the time slice the runtime's threads ask Linux's scheduler for
                               * (6.12 and later; older kernels ignore it), in microseconds:
                               * 100 to 100000; 0 = 100. A short slice lets a worker the
                               * runtime wakes run at once on the waker's core instead of
                               * waiting for the waker to sleep; it is not a priority (the same
                               * CPU share, in shorter turns). Outside the range: TR_EINVAL */
    int kernel_slice;         /* 1: the runtime's threads ask for no slice and keep the one
                               * they inherit from the thread that creates them (the kernel's
                               * default unless that thread chose another); slice_us must
                               * then be 0 */
    int64_t inline_ns;        /* a behaviour that sends a stream (64 or more messages in a row
                               * in one call) to an actor that is idle, fed by one sender at a
                               * time and so far at most this many ns a message runs that actor
                               * itself, inside the send, on its own thread: the pair stays on
                               * one core and the receiver's mailbox stays short
                               * (docs/runtime.md, Mailboxes); 0 = 200; more than 1 s counts as
                               * 1 s; negative: never (the receiver goes to another worker) */
} tr_runtime_opts_t;

/* Creates a runtime and starts its threads. opts may be NULL for the defaults.
 * TR_ENOMEM, or an error from thread or loop creation. Any thread. */
int tr_runtime_init(tr_runtime_t **rt, const tr_runtime_opts_t *opts);

/* Blocks until every actor has stopped. 0 when all stopped normally; TR_EFAILED when an actor
 * failed with no supervisor to tell (tr_runtime_failure says which and why); then, with a
 * monitor and a flight_path, the monitor is flushed and its flight recorder written to
 * flight_path (once). Returns at once if no actor is alive. One thread at a time, not a
 * worker. */
int tr_runtime_run(tr_runtime_t *rt);

/* Sends TR_MSG_STOP with reason to every live actor, and to every actor spawned or restarted
 * after (with the first call's reason), so that tr_runtime_run returns once they have
 * stopped. Returns at once. Any thread (not a signal handler: signals are the runtime's own
 * job, see handle_signals). */
void tr_runtime_shutdown(tr_runtime_t *rt, const char *reason);

/* Joins the threads and frees everything; messages still queued are freed unread. Lifetime
 * rule 5. NULL does nothing. The thread that called init. */
void tr_runtime_close(tr_runtime_t *rt);

/* After tr_runtime_run returned TR_EFAILED: a line naming the actor, the message type and
 * the error; "" otherwise. Valid until close. Any thread. */
const char *tr_runtime_failure(tr_runtime_t *rt);

/* The seed deterministic mode uses (0 when not deterministic). Any thread. */
uint64_t tr_runtime_seed(const tr_runtime_t *rt);

/* Workers actually started. Any thread. */
unsigned tr_runtime_workers(const tr_runtime_t *rt);

/* Monotonic clock in nanoseconds. Any thread. */
uint64_t tr_now_ns(void);

/* What this library was built as: its version ("0.1.0") and which optional parts it has
 * (1 or 0), as the configure summary said. */
typedef struct tr_build_info {
    const char *version;
    int mpi, cuda, nccl;
} tr_build_info_t;

/* Fills info. Never fails. Any thread. */
void tr_build_info(tr_build_info_t *info);

typedef struct tr_runtime_stats {
    uint64_t actors_spawned;
    uint64_t actors_alive;
    uint64_t dead_letters; /* messages dropped because their receiver had stopped */
    uint64_t parks;        /* times a worker went to sleep */
    uint64_t steals;       /* actors taken from another worker's queue */
    uint64_t worker_moves; /* times a busy worker left a CPU it shared with another busy
                            * worker for one with none (docs/runtime.md, Scheduling) */
} tr_runtime_stats_t;

/* A snapshot of runtime-wide counters. Any thread. */
void tr_runtime_stats(tr_runtime_t *rt, tr_runtime_stats_t *out);

/* --- actors ---------------------------------------------------------------------------- */

/* What a behaviour sees besides the message. */
typedef struct tr_ctx {
    tr_runtime_t *rt;
    tr_actor_t self;
    void *state;
} tr_ctx_t;

/* Handles one message. Return 0 to go on; a negative TR_E* code fails the actor: it stops,
 * and its supervisor is told (or, with none, the runtime stops with a message naming the
 * actor and the message type). The message is freed by the runtime after the call. */
typedef int (*tr_behaviour_cb)(tr_ctx_t *ctx, tr_msg_t *msg);

/* Called on the actor's thread before its first message (and again after a restart);
 * a negative return fails the actor as a behaviour would. */
typedef int (*tr_actor_init_cb)(tr_ctx_t *ctx);

/* Called once after the actor has stopped, to release its state; at tr_runtime_close, for
 * each actor still alive whose init ran (one whose init never ran gets no cleanup). */
typedef void (*tr_actor_cleanup_cb)(tr_ctx_t *ctx, int reason);

/* tr_actor_opts_t.max_restarts: no restart limit. */
#define TR_ACTOR_RESTARTS_UNLIMITED (-1)

typedef struct tr_actor_opts {
    const char *name;      /* unique in the runtime (rule 6), for tr_actor_lookup, logs and
                            * traces; NULL or "" for none; at most 31 bytes; copied */
    int pinned;            /* a dedicated thread, for blocking work; same API */
    int defer_stop;        /* TR_MSG_STOP is only delivered; the actor stops itself */
    tr_actor_t supervisor; /* linked at spawn; TR_ACTOR_NONE for none */
    tr_actor_init_cb init;
    tr_actor_cleanup_cb cleanup;
    unsigned batch;             /* override the runtime's batch for this actor; 0 = default */
    int lane_kind;              /* its trace lane's tr_lane_kind_t; 0 = TR_LANE_COMPUTE */
    int max_restarts;           /* restart intensity, as Erlang/OTP's: at most max_restarts
                                 * tr_actor_restart calls within restart_window_ms; 0 = 1 (OTP's
                                 * default); TR_ACTOR_RESTARTS_UNLIMITED for no limit */
    unsigned restart_window_ms; /* 0 = 5000 (OTP's 5 s) */
} tr_actor_opts_t;

/* Creates an actor running behaviour with state. opts may be NULL. *out gets its address.
 * With a monitor, names its trace lane (a reused slot keeps the lane's first name).
 * TR_EINVAL for a name over 31 bytes or another option out of range; TR_EEXIST when a live
 * actor has the name; for a pinned actor, the error of creating its thread (TR_EAGAIN under
 * a memory or thread limit): nothing was started and the runtime is as before; TR_ENOMEM;
 * TR_ESHUTDOWN after an unhandled failure or once close has begun. Every error leaves a line
 * naming the actor in tr_last_error(). Any thread. */
int tr_actor_spawn(tr_runtime_t *rt, tr_behaviour_cb behaviour, void *state,
                   const tr_actor_opts_t *opts, tr_actor_t *out);

/* Queues msg on to's data lane. One atomic exchange; the first message to an idle actor
 * schedules it (from an actor, to run next on the same worker). From inside a behaviour on a
 * worker (not pinned), consecutive sends to one actor are gathered and pushed as one chain
 * when the behaviour returns, when it sends to another actor, or every 64 messages:
 * per-sender order holds, but such a behaviour must not send and then block on, or compute
 * long before, the receiver's effect (pin an actor that does). TR_ESTOPPED or TR_ENOACTOR
 * leave msg with the caller. Any thread. */
int tr_actor_send(tr_runtime_t *rt, tr_actor_t to, tr_msg_t *msg);

/* Queues n messages, in order, with a single exchange. All or nothing. Any thread. */
int tr_actor_send_chain(tr_runtime_t *rt, tr_actor_t to, tr_msg_t **msgs, size_t n);

/* Queues msg on the urgent lane, handled before any queued data message. Any thread. */
int tr_actor_send_urgent(tr_runtime_t *rt, tr_actor_t to, tr_msg_t *msg);

/* Stops an actor: from its own behaviour, after the current message; from elsewhere, before
 * its next message. Queued messages are dropped (dead letters); the supervisor gets
 * TR_MSG_EXIT with reason 0. TR_ESTOPPED if already stopped. Any thread. */
int tr_actor_stop(tr_runtime_t *rt, tr_actor_t a);

/* Links child to supervisor: when child stops or fails, supervisor receives TR_MSG_EXIT
 * (its sender and its `actor` are the child's address) and may tr_actor_restart it, as if
 * the supervisor had been given at spawn. TR_ESTOPPED when child has already stopped; a link
 * racing the stop either returns 0 and the notice comes, or returns TR_ESTOPPED. Any
 * thread. */
int tr_actor_link(tr_runtime_t *rt, tr_actor_t supervisor, tr_actor_t child);

/* Starts a new actor with a stopped actor's behaviour, state, options, name and supervisor;
 * its init runs again. The old address stays stopped; *out gets the new one, which
 * tr_actor_lookup answers for the name from now on. TR_EBUSY while the old one is still
 * running (or another restart of it is under way); TR_ENOACTOR when its slot has been reused
 * or it was already restarted; TR_ERESTARTS when this restart would exceed the restart
 * intensity (max_restarts within restart_window_ms): the failure that made it so was then
 * reported to the supervisor as TR_MSG_EXIT with reason TR_ERESTARTS (the original error is
 * logged); TR_EEXIST when another actor took the name meanwhile. Errors leave a line in
 * tr_last_error(). Any thread. */
int tr_actor_restart(tr_runtime_t *rt, tr_actor_t dead, tr_actor_t *out);

/* The live actor registered under name (rule 6); TR_ACTOR_NONE when there is none (never
 * spawned, stopped, or stopped and not yet restarted). Any thread. */
tr_actor_t tr_actor_lookup(tr_runtime_t *rt, const char *name);

/* tr_actor_send to the actor tr_actor_lookup(rt, name) answers, so a client never holds a
 * stale address. TR_ENOACTOR (with tr_last_error naming the name) when there is none; the
 * message then stays with the caller, as after any failed send. Any thread. */
int tr_actor_send_name(tr_runtime_t *rt, const char *name, tr_msg_t *msg);

/* The actor's name ("" if none); NULL for an unknown address. Valid while the actor lives. */
const char *tr_actor_name(tr_runtime_t *rt, tr_actor_t a);

/* The actor whose behaviour is running on this thread, or TR_ACTOR_NONE. */
tr_actor_t tr_actor_self(void);

typedef struct tr_actor_stats {
    uint64_t msgs_in;     /* messages handled */
    uint64_t msgs_out;    /* messages sent */
    uint64_t run_ns;      /* time spent running it (in an interleaved group: its even share) */
    uint64_t activations; /* times it was scheduled */
    uint64_t depth;       /* messages queued now */
    uint64_t peak_depth;  /* the largest backlog an activation met: the messages it
                           * handled plus those still queued when it ended */
} tr_actor_stats_t;

/* A snapshot of an actor's counters; values are read without stopping it, so they are each
 * exact but not a consistent cut. TR_ENOACTOR for an address never used. Any thread. */
int tr_actor_stats(tr_runtime_t *rt, tr_actor_t a, tr_actor_stats_t *out);

/* --- timers and file descriptors (served by the loop thread) --------------------------- */
/* Each call below returns 0, or a negative TR_E* code and then leaves a line in
 * tr_last_error() naming the call and what was wrong: TR_EINVAL for a NULL rt or id pointer,
 * a negative fd or no events; TR_ENOACTOR for an actor that is not alive; TR_ENOENT for an id
 * that names no live timer (tr_timer_stop) or watch (tr_poll_resume/stop); TR_ENOMEM;
 * TR_ESHUTDOWN once tr_runtime_close has begun (a cleanup's call at close included). */

/* After timeout_ns, and then every repeat_ns if not 0, sends TR_MSG_TIMER carrying tag to
 * `to`; never before the deadline. A deadline past 2^64 - 1 ns of the monotonic clock (a
 * timeout of UINT64_MAX, ~584 years) is never reached. *timer_id names it for tr_timer_stop.
 * Any thread. */
int tr_timer_start(tr_runtime_t *rt, tr_actor_t to, uint64_t tag, uint64_t timeout_ns,
                   uint64_t repeat_ns, uint64_t *timer_id);

/* Stops a timer; a firing already sent is still delivered. TR_ENOENT for an unknown id, and
 * for a one-shot that has fired or is firing (its firing will arrive). */
int tr_timer_stop(tr_runtime_t *rt, uint64_t timer_id);

#define TR_POLL_READABLE 1u
#define TR_POLL_WRITABLE 2u

/* Watches fd for events; when ready, sends TR_MSG_POLL carrying tag to `to` and pauses
 * until tr_poll_resume (one message per readiness, never a flood). fd stays the caller's.
 * Any thread. */
int tr_poll_start(tr_runtime_t *rt, int fd, unsigned events, tr_actor_t to, uint64_t tag,
                  uint64_t *poll_id);
int tr_poll_resume(tr_runtime_t *rt, uint64_t poll_id);
int tr_poll_stop(tr_runtime_t *rt, uint64_t poll_id);

#ifdef __cplusplus
}
#endif
#endif
