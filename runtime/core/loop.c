/* loop.c: the libuv loop thread. It fires timers, owns signals and file-descriptor watches,
 * and turns each event into a message to an actor.
 *
 * Design: other threads never touch libuv handles. tr_poll_* append a command to a
 * mutex-protected list and wake the loop with uv_async_send (the only cross-thread libuv
 * call); the loop thread applies commands in order. A registry of live ids (under the same
 * mutex) lets tr_timer_stop/tr_poll_* answer TR_ENOENT at once. Poll records are owned by
 * the loop thread and freed in their close callbacks.
 *
 * Timers: libuv's timers have millisecond resolution (and fire up to 1 ms early against a
 * nanosecond deadline), so timers are kept in a list sorted by deadline and driven by one
 * timerfd on CLOCK_MONOTONIC, armed for the earliest deadline and watched by the loop: they
 * fire within microseconds of their deadline on an idle machine. Repeats count from the
 * previous deadline, so they do not drift. The list is under the mutex, and the thread that
 * starts a timer inserts it and, when it is the new earliest, arms the timerfd itself: no
 * command and no wake of the loop thread. (Waking it from a worker made the loop thread
 * take the worker's core: an actor that re-armed its timer after each firing waited ~30 us
 * for that, p99 80 us, on a 2-vCPU VM.) The timerfd is armed for the earliest deadline or
 * earlier (a stopped timer's); a firing with nothing due just re-arms. Arming is a system
 * call on the starting thread (~7 us on a VM right after an idle period, ~1.3 us back to
 * back). Leaving it to the worker after its next activation was measured and not kept: an
 * actor the next activation runs (a computation the timer guards) delayed the timer by its
 * whole run. Instead, when a one-shot of 100 us or more fires, the loop thread also arms the
 * timerfd for the firing's time plus its timeout: the earliest a receiver that starts the
 * same timeout again on receipt (periodic work written as one-shots, retries, heartbeats)
 * can ask for, since that start comes after the firing. (Its deadline plus its timeout is in
 * the past when the firing is later than the timeout: a VM's host delays some by 1-3 ms, and
 * each such start then made the call inside its activation, 8-60 us in bench latency's
 * tail.) It does so before it sends the firing, since the woken worker may preempt it on its
 * core (the runtime's threads ask for short slices: threads.c); arming after the firing,
 * bench latency's p50 went from 1.3 to 9-10 us then. Such a start then finds the timerfd
 * armed early enough and makes no call; when it fires early, the loop thread re-arms for the
 * real deadline. A receiver that does not start one again costs the loop thread one wake-up
 * with nothing due.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "runtime/core/internal.h"
#include "troupe/log.h"

#define DEFAULT_SIGNAL_GRACE_MS 30000u
/* a fired one-shot of at least this timeout gets the timerfd armed for its next start (see
 * the design block); a shorter one's early wake-up would cost more than the call it saves */
#define AGAIN_MIN_NS 100000u
/* timer nodes kept for reuse (see tr_timer_start) */
#define SPARE_TIMERS 64u

typedef enum { CMD_POLL_START, CMD_POLL_RESUME, CMD_POLL_STOP } cmd_kind_t;

typedef struct cmd {
    cmd_kind_t kind;
    uint64_t id, tag;
    tr_actor_t to;
    int fd;
    unsigned events;
    struct cmd *next;
} cmd_t;

typedef struct watch { /* a file-descriptor watch, owned by the loop thread */
    union {
        uv_handle_t handle;
        uv_poll_t poll;
    } u;
    tr__loop_t *loop;
    uint64_t id, tag;
    tr_actor_t to;
    int fd;
    unsigned events;
    struct watch *next;
} watch_t;

typedef struct live_id {
    uint64_t id;
    bool timer; /* a timer's id, else a watch's */
    struct live_id *next;
} live_id_t;

typedef struct ltimer { /* a timer: in the list under mu, or being fired by the loop thread */
    live_id_t live;     /* its id's entry in the registry while it is live */
    uint64_t tag, count, deadline_ns, repeat_ns, timeout_ns;
    tr_actor_t to;
    bool ended;          /* its receiver is gone (set while fired) */
    struct ltimer *next; /* sorted by deadline; while fired, the next one due; spare */
} ltimer_t;

struct tr__loop {
    /* Under mu, written by whichever thread starts or stops a timer or posts a command; the
     * fields a timer start needs on mu's own cache line, and the loop thread's own fields on
     * lines of their own (a worker starting its next timer on another core otherwise waited
     * for lines the loop thread had just written beside them). */
    _Alignas(64) pthread_mutex_t mu;
    int stopping;
    unsigned n_spare;
    ltimer_t *timers;  /* earliest first */
    uint64_t armed_ns; /* the timerfd's deadline; 0: not armed since it last fired */
    ltimer_t *spare;   /* timer nodes to reuse, at most SPARE_TIMERS (n_spare) */
    live_id_t *live;
    uint64_t next_id;
    cmd_t *cmds, *cmds_tail;
    /* set before the loop thread starts, or the loop thread's own */
    _Alignas(64) tr_runtime_t *rt;
    ltimer_t *retired; /* fired one-shots, spare at the next firing */
    watch_t *watches;
    int tfd; /* timerfd armed for timers->deadline_ns or earlier */
    int signals_seen;
    int first_signal;
    pthread_t thread;
    uv_loop_t uv;
    uv_async_t async;
    uv_signal_t sigint, sigterm, sigusr1;
    uv_timer_t grace; /* armed by the first signal: exit when it fires */
    uv_poll_t tpoll;
};

/* --- registry of live ids (under mu) --------------------------------------------------- */

/* Takes id's entry out of the registry and returns it (a watch's is the caller's to free; a
 * timer's is part of its node), or NULL when id is not live. */
static live_id_t *live_unlink(tr__loop_t *l, uint64_t id)
{
    for (live_id_t **p = &l->live; *p; p = &(*p)->next)
        if ((*p)->id == id) {
            live_id_t *dead = *p;
            *p = dead->next;
            return dead;
        }
    return NULL;
}

static bool live_has(tr__loop_t *l, uint64_t id, bool timer)
{
    for (live_id_t *p = l->live; p; p = p->next)
        if (p->id == id) return p->timer == timer;
    return false;
}

/* A new id in the registry (under mu). */
static uint64_t live_add(tr__loop_t *l, live_id_t *live, bool timer)
{
    live->id = ++l->next_id;
    live->timer = timer;
    live->next = l->live;
    l->live = live;
    return live->id;
}

/* The error for a call the loop cannot take: the runtime is closing or closed. */
static int closing(const char *fn)
{
    return tr__error(TR_ESHUTDOWN, "%s: the runtime is closing", fn);
}

/* *l = rt's loop for the call fn; TR_EINVAL for a NULL rt, TR_ESHUTDOWN once close has
 * stopped the loop (a cleanup's call at close). */
static int loop_of(const char *fn, tr_runtime_t *rt, tr__loop_t **l)
{
    if (!rt) return tr__error(TR_EINVAL, "%s: rt is NULL", fn);
    if (!(*l = rt->loop)) return closing(fn);
    return 0;
}

/* Queues a watch command for the loop thread. */
static int post(const char *fn, tr_runtime_t *rt, cmd_t c, bool new_id, uint64_t *id_out)
{
    tr__loop_t *l;
    int rc = loop_of(fn, rt, &l);
    if (rc < 0) return rc;
    cmd_t *cmd = malloc(sizeof(*cmd));
    live_id_t *live = new_id ? malloc(sizeof(*live)) : NULL;
    if (!cmd || (new_id && !live)) {
        free(cmd);
        free(live);
        return tr__error(TR_ENOMEM, "%s: out of memory", fn);
    }
    *cmd = c;
    cmd->next = NULL;
    pthread_mutex_lock(&l->mu);
    if (l->stopping) {
        rc = TR_ESHUTDOWN;
    } else if (new_id) {
        cmd->id = *id_out = live_add(l, live, false);
    } else if (!live_has(l, c.id, false)) {
        rc = TR_ENOENT;
    } else if (c.kind == CMD_POLL_STOP) {
        free(live_unlink(l, c.id));
    }
    if (rc == 0) {
        if (l->cmds_tail)
            l->cmds_tail->next = cmd;
        else
            l->cmds = cmd;
        l->cmds_tail = cmd;
    }
    pthread_mutex_unlock(&l->mu);
    if (rc < 0) {
        free(cmd);
        free(live);
        if (rc == TR_ESHUTDOWN) return closing(fn);
        return tr__error(rc, "%s: no live poll has id %llu", fn, (unsigned long long)c.id);
    }
    uv_async_send(&l->async);
    return 0;
}

/* --- timers (the list under mu; fired by the loop thread) ------------------------------ */

/* a + b, or UINT64_MAX (584 years of nanoseconds: never) where it would wrap round to a
 * deadline in the past, which would fire at once */
static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* Under mu: a timer node to reuse, or NULL. Nodes are kept rather than freed because the
 * thread that starts a timer is rarely the one that frees it (the loop thread, after the
 * firing): each start's malloc took memory and allocator state the loop thread had just
 * written on its core (with the layout of struct tr__loop: tr_timer_start 650-700 -> 540-590
 * ns at the median, a worker and the loop thread pinned to far cores of a VM). */
static ltimer_t *spare_take(tr__loop_t *l)
{
    ltimer_t *t = l->spare;
    if (t) {
        l->spare = t->next;
        l->n_spare--;
    }
    return t;
}

/* Under mu: keeps a node that is no longer a live timer's for reuse, or frees it. */
static void spare_keep(tr__loop_t *l, ltimer_t *t)
{
    if (l->n_spare == SPARE_TIMERS) {
        free(t);
        return;
    }
    t->next = l->spare;
    l->spare = t;
    l->n_spare++;
}

static void timers_insert(tr__loop_t *l, ltimer_t *t)
{
    ltimer_t **p = &l->timers;
    while (*p && (*p)->deadline_ns <= t->deadline_ns)
        p = &(*p)->next;
    t->next = *p;
    *p = t;
}

/* Under mu: arms the timerfd for the earliest deadline unless it is armed for that or
 * earlier. */
static void arm_at(tr__loop_t *l, uint64_t d)
{
    if (l->armed_ns && l->armed_ns <= d) return;
    struct itimerspec its = {{0, 0}, {(time_t)(d / 1000000000u), (long)(d % 1000000000u)}};
    if (timerfd_settime(l->tfd, TFD_TIMER_ABSTIME, &its, NULL) == 0)
        l->armed_ns = d;
    else /* not armed: the next start or firing tries again */
        tr_log(TR_LOG_ERROR, "loop: arming the timerfd: %s", strerror(errno));
}

static void arm_tfd(tr__loop_t *l)
{
    if (!l->timers) return; /* whatever is armed fires with nothing due, and nothing is re-armed */
    arm_at(l, l->timers->deadline_ns ? l->timers->deadline_ns : 1); /* 0 would disarm */
}

/* Sends one firing; false when the receiver is gone (the timer then ends). */
static bool fire(tr__loop_t *l, ltimer_t *t)
{
    tr_msg_t *m = tr_msg_new(l->rt, TR_MSG_TIMER);
    if (!m) return true; /* out of memory: this firing is lost, the timer goes on */
    tr_msg_timer_t *b = TR_MSG_AS(m, timer);
    b->timer_id = t->live.id;
    b->tag = t->tag;
    b->deadline_ns = t->deadline_ns;
    b->fired_ns = tr_now_ns();
    b->count = ++t->count;
    return tr__actor_send_internal(l->rt, t->to, m, false) == 0;
}

uint64_t tr__timer_next_arm(uint64_t deadline_ns, uint64_t repeat_ns, uint64_t timeout_ns,
                            uint64_t now)
{
    if (repeat_ns) return sat_add(deadline_ns, repeat_ns);
    return timeout_ns >= AGAIN_MIN_NS ? sat_add(now, timeout_ns) : 0;
}

/* Under l->mu: unlinks the timers due at now and returns them in deadline order; arms the
 * timerfd, in one call, for the earliest of what is left, of the due repeats' next deadlines
 * and of the due one-shots' earliest next starts, now plus their timeouts (see the design
 * block). Before the firings go out: the worker a firing wakes may preempt the loop thread
 * on its core, and its receiver's start must find it armed. */
static ltimer_t *take_due(tr__loop_t *l, uint64_t now)
{
    ltimer_t *due = NULL, **tail = &due;
    uint64_t again = UINT64_MAX;
    while (l->timers && l->timers->deadline_ns <= now) {
        ltimer_t *t = l->timers;
        l->timers = t->next;
        *tail = t;
        tail = &t->next;
        if (!t->repeat_ns) live_unlink(l, t->live.id); /* fired from here on: a stop is too late */
        uint64_t next = tr__timer_next_arm(t->deadline_ns, t->repeat_ns, t->timeout_ns, now);
        if (next > now && next < again) again = next;
    }
    *tail = NULL;
    if (l->timers && l->timers->deadline_ns < again) again = l->timers->deadline_ns;
    if (again != UINT64_MAX) arm_at(l, again); /* one call for both */
    return due;
}

/* The timerfd fired: takes the timers that are due, sends their firings without the lock,
 * then puts the repeating ones back (unless stopped meanwhile) and re-arms. One-shots alone
 * need no second turn of the lock (take_due armed the timerfd and removed their ids): the
 * worker a firing wakes on the other core starts its next timer just when this thread would
 * be in it. */
static void on_tfd(uv_poll_t *p, int status, int events)
{
    tr__loop_t *l = p->data;
    uint64_t expirations;
    if (read(l->tfd, &expirations, sizeof(expirations)) < 0 && errno != EAGAIN)
        tr_log(TR_LOG_ERROR, "loop: reading the timerfd: %s", strerror(errno));
    pthread_mutex_lock(&l->mu);
    l->armed_ns = 0; /* it fired: no longer armed */
    ltimer_t *due = take_due(l, tr_now_ns());
    while (l->retired) { /* the one-shots of the last firing: spare now */
        ltimer_t *t = l->retired;
        l->retired = t->next;
        spare_keep(l, t);
    }
    pthread_mutex_unlock(&l->mu);
    bool repeats = false;
    for (ltimer_t *t = due; t; t = t->next) {
        t->ended = !fire(l, t);
        repeats |= t->repeat_ns != 0;
    }
    if (!repeats) {       /* spare at the next firing, which takes the lock anyway */
        l->retired = due; /* emptied above; only this thread writes it */
        return;
    }
    pthread_mutex_lock(&l->mu);
    while (due) {
        ltimer_t *t = due;
        due = t->next;
        if (!t->ended && t->repeat_ns && live_has(l, t->live.id, true)) {
            t->deadline_ns = sat_add(t->deadline_ns, t->repeat_ns);
            timers_insert(l, t);
        } else {
            live_unlink(l, t->live.id); /* a one-shot's, or a stopped repeat's: already gone */
            spare_keep(l, t);
        }
    }
    arm_tfd(l);
    pthread_mutex_unlock(&l->mu);
}

/* --- file descriptors (loop thread) -------------------------------------------------------- */

static void close_watch(watch_t *w);

static void on_poll(uv_poll_t *p, int status, int events)
{
    watch_t *w = (watch_t *)p;
    uv_poll_stop(p); /* one message per readiness; tr_poll_resume re-arms */
    tr_msg_t *m = tr_msg_new(w->loop->rt, TR_MSG_POLL);
    if (!m) return;
    tr_msg_poll_t *b = TR_MSG_AS(m, poll);
    b->poll_id = w->id;
    b->tag = w->tag;
    b->fd = w->fd;
    b->events = status < 0 ? 0 : (unsigned)events;
    tr__actor_send_internal(w->loop->rt, w->to, m, false);
}

static void on_watch_closed(uv_handle_t *h)
{
    free(h);
}

static void close_watch(watch_t *w)
{
    for (watch_t **p = &w->loop->watches; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    uv_close(&w->u.handle, on_watch_closed);
}

static watch_t *find_watch(tr__loop_t *l, uint64_t id)
{
    for (watch_t *w = l->watches; w; w = w->next)
        if (w->id == id) return w;
    return NULL;
}

static void start_watch(tr__loop_t *l, cmd_t *c)
{
    watch_t *w = calloc(1, sizeof(*w));
    if (!w) {
        tr_log(TR_LOG_ERROR, "out of memory starting poll %llu", (unsigned long long)c->id);
        return;
    }
    w->loop = l;
    w->id = c->id;
    w->tag = c->tag;
    w->to = c->to;
    w->fd = c->fd;
    w->events = c->events;
    int rc = uv_poll_init(&l->uv, &w->u.poll, c->fd);
    if (rc < 0) {
        tr_log(TR_LOG_ERROR, "cannot watch fd %d: %s", c->fd, uv_strerror(rc));
        free(w);
        return;
    }
    int ev = (c->events & TR_POLL_READABLE ? UV_READABLE : 0) |
             (c->events & TR_POLL_WRITABLE ? UV_WRITABLE : 0);
    uv_poll_start(&w->u.poll, ev, on_poll);
    w->next = l->watches;
    l->watches = w;
}

static void apply(tr__loop_t *l, cmd_t *c)
{
    watch_t *w =
        c->kind == CMD_POLL_RESUME || c->kind == CMD_POLL_STOP ? find_watch(l, c->id) : NULL;
    switch (c->kind) {
    case CMD_POLL_START:
        start_watch(l, c);
        break;
    case CMD_POLL_RESUME:
        if (w) {
            int ev = (w->events & TR_POLL_READABLE ? UV_READABLE : 0) |
                     (w->events & TR_POLL_WRITABLE ? UV_WRITABLE : 0);
            uv_poll_start(&w->u.poll, ev, on_poll);
        }
        break;
    case CMD_POLL_STOP:
        if (w) close_watch(w);
        break;
    }
}

static void close_all(uv_handle_t *h, void *arg)
{
    if (!uv_is_closing(h)) uv_close(h, h->data == arg ? NULL : on_watch_closed);
}

static void on_async(uv_async_t *a)
{
    tr__loop_t *l = a->data;
    pthread_mutex_lock(&l->mu);
    cmd_t *c = l->cmds;
    l->cmds = l->cmds_tail = NULL;
    int stopping = l->stopping;
    pthread_mutex_unlock(&l->mu);
    while (c) {
        cmd_t *next = c->next;
        if (!stopping) apply(l, c);
        free(c);
        c = next;
    }
    if (stopping) {
        l->watches = NULL;
        uv_walk(&l->uv, close_all, l); /* handles we own (async, signals) carry data == l */
    }
}

static const char *signal_name(int signum)
{
    return signum == SIGINT ? "SIGINT" : signum == SIGUSR1 ? "SIGUSR1" : "SIGTERM";
}

static unsigned grace_ms(const tr__loop_t *l)
{
    return l->rt->opts.signal_grace_ms ? l->rt->opts.signal_grace_ms : DEFAULT_SIGNAL_GRACE_MS;
}

static void on_grace_over(uv_timer_t *t)
{
    tr__loop_t *l = t->data;
    tr_log(TR_LOG_ERROR,
           "%s: the graceful stop did not end the process within %u ms: exiting "
           "now",
           signal_name(l->first_signal), grace_ms(l));
    _exit(128 + l->first_signal);
}

/* The signal rule (troupe/runtime.h): the first signal stops the actors gracefully and arms
 * the grace timer; a second signal, or a first one with no actor alive to stop, exits. */
static void on_signal(uv_signal_t *s, int signum)
{
    tr__loop_t *l = s->data;
    const char *name = signal_name(signum);
    if (++l->signals_seen > 1) {
        tr_log(TR_LOG_WARN, "second %s: exiting now", name);
        _exit(128 + signum);
    }
    if (atomic_load_explicit(&l->rt->alive, memory_order_relaxed) == 0) {
        tr_log(TR_LOG_WARN, "%s received and no actor is running: exiting now", name);
        _exit(128 + signum);
    }
    l->first_signal = signum;
    tr_log(TR_LOG_INFO,
           "%s received: stopping gracefully (send it again to exit now; exiting "
           "anyway in %u ms)",
           name, grace_ms(l));
    uv_timer_start(&l->grace, on_grace_over, grace_ms(l), 0);
    tr_runtime_shutdown(l->rt, name);
}

static void *loop_main(void *arg)
{
    tr__loop_t *l = arg;
    uv_run(&l->uv, UV_RUN_DEFAULT);
    tr__pool_flush(tr__thread_pool(l->rt));
    return NULL;
}

int tr__loop_start(tr_runtime_t *rt)
{
    tr__loop_t *l = aligned_alloc(_Alignof(tr__loop_t), sizeof(*l)); /* its lines as laid out */
    if (!l) return TR_ENOMEM;
    memset(l, 0, sizeof(*l));
    l->rt = rt;
    pthread_mutex_init(&l->mu, NULL);
    int rc = uv_loop_init(&l->uv);
    if (rc < 0) goto fail;
    uv_async_init(&l->uv, &l->async, on_async);
    l->async.data = l;
    l->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (l->tfd < 0) {
        rc = -errno;
        uv_close((uv_handle_t *)&l->async, NULL);
        uv_run(&l->uv, UV_RUN_DEFAULT);
        uv_loop_close(&l->uv);
        goto fail;
    }
    uv_poll_init(&l->uv, &l->tpoll, l->tfd);
    l->tpoll.data = l;
    uv_poll_start(&l->tpoll, UV_READABLE, on_tfd);
    if (rt->opts.handle_signals) {
        uv_signal_init(&l->uv, &l->sigint);
        uv_signal_init(&l->uv, &l->sigterm);
        uv_signal_init(&l->uv, &l->sigusr1);
        uv_timer_init(&l->uv, &l->grace);
        l->sigint.data = l->sigterm.data = l->sigusr1.data = l->grace.data = l;
        uv_signal_start(&l->sigint, on_signal, SIGINT);
        uv_signal_start(&l->sigterm, on_signal, SIGTERM);
        uv_signal_start(&l->sigusr1, on_signal, SIGUSR1); /* what mpirun forwards */
    }
    rt->loop = l;
    rc = -tr__thread_create(rt, &l->thread, loop_main, l, "tr-loop");
    if (rc == 0) return 0;
    rt->loop = NULL;
    uv_walk(&l->uv, close_all, l);
    uv_run(&l->uv, UV_RUN_DEFAULT);
    uv_loop_close(&l->uv);
    close(l->tfd);
fail:
    pthread_mutex_destroy(&l->mu);
    free(l);
    return rc;
}

void tr__loop_stop(tr_runtime_t *rt)
{
    tr__loop_t *l = rt->loop;
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stopping = 1;
    pthread_mutex_unlock(&l->mu);
    uv_async_send(&l->async);
    pthread_join(l->thread, NULL);
    uv_loop_close(&l->uv);
    close(l->tfd);
    cmd_t *c = l->cmds;
    while (c) {
        cmd_t *next = c->next;
        free(c);
        c = next;
    }
    while (l->live) { /* first: a timer's entry is part of its node */
        live_id_t *e = live_unlink(l, l->live->id);
        if (!e->timer) free(e);
    }
    ltimer_t *lists[] = {l->timers, l->spare, l->retired};
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++)
        while (lists[i]) {
            ltimer_t *t = lists[i];
            lists[i] = t->next;
            free(t);
        }
    pthread_mutex_destroy(&l->mu);
    free(l);
    rt->loop = NULL;
}

/* --- public API ------------------------------------------------------------------------ */

/* A start naming an actor that is not alive: TR_ENOACTOR, saying which. */
static int no_actor(const char *fn, tr_actor_t to)
{
    return tr__error(TR_ENOACTOR, "%s: actor #%u (generation %u) is not alive", fn, (unsigned)to.id,
                     (unsigned)(to.id >> 32));
}

int tr_timer_start(tr_runtime_t *rt, tr_actor_t to, uint64_t tag, uint64_t timeout_ns,
                   uint64_t repeat_ns, uint64_t *timer_id)
{
    if (rt && !timer_id) return tr__error(TR_EINVAL, "tr_timer_start: timer_id is NULL");
    tr__loop_t *l;
    int rc = loop_of("tr_timer_start", rt, &l);
    if (rc < 0) return rc;
    if (!tr__actor_lookup(rt, to)) return no_actor("tr_timer_start", to);
    uint64_t deadline_ns = sat_add(tr_now_ns(), timeout_ns); /* it counts from this call */
    pthread_mutex_lock(&l->mu);
    ltimer_t *t = spare_take(l);
    if (!t && !l->stopping) { /* none to reuse: allocated outside the lock */
        pthread_mutex_unlock(&l->mu);
        if (!(t = malloc(sizeof(*t)))) return tr__error(TR_ENOMEM, "tr_timer_start: out of memory");
        pthread_mutex_lock(&l->mu);
    }
    bool stopping = l->stopping;
    if (!stopping) {
        *t = (ltimer_t){.tag = tag,
                        .deadline_ns = deadline_ns,
                        .repeat_ns = repeat_ns,
                        .timeout_ns = timeout_ns,
                        .to = to};
        *timer_id = live_add(l, &t->live, true);
        timers_insert(l, t);
        arm_tfd(l);
    } else if (t) {
        spare_keep(l, t);
    }
    pthread_mutex_unlock(&l->mu);
    return stopping ? closing("tr_timer_start") : 0;
}

int tr_timer_stop(tr_runtime_t *rt, uint64_t timer_id)
{
    tr__loop_t *l;
    int rc = loop_of("tr_timer_stop", rt, &l);
    if (rc < 0) return rc;
    pthread_mutex_lock(&l->mu);
    bool live = live_has(l, timer_id, true);
    if (live) {
        live_unlink(l, timer_id);
        /* a repeat is not in the list while the loop thread fires it: it then sees the id
         * gone and does not put it back (a one-shot's id is gone once it is taken to fire) */
        for (ltimer_t **p = &l->timers; *p; p = &(*p)->next)
            if ((*p)->live.id == timer_id) {
                ltimer_t *gone = *p;
                *p = gone->next;
                spare_keep(l, gone); /* the timerfd may stay armed for it: that firing finds
                                        nothing due */
                break;
            }
    }
    pthread_mutex_unlock(&l->mu);
    if (live) return 0;
    return tr__error(TR_ENOENT, "tr_timer_stop: no live timer has id %llu",
                     (unsigned long long)timer_id);
}

int tr_poll_start(tr_runtime_t *rt, int fd, unsigned events, tr_actor_t to, uint64_t tag,
                  uint64_t *poll_id)
{
    if (!rt || !poll_id)
        return tr__error(TR_EINVAL, "tr_poll_start: %s is NULL", rt ? "poll_id" : "rt");
    if (fd < 0) return tr__error(TR_EINVAL, "tr_poll_start: fd %d is not a file descriptor", fd);
    if (!(events & (TR_POLL_READABLE | TR_POLL_WRITABLE)))
        return tr__error(TR_EINVAL,
                         "tr_poll_start: events 0x%x asks for neither "
                         "TR_POLL_READABLE nor TR_POLL_WRITABLE",
                         events);
    if (!tr__actor_lookup(rt, to)) return no_actor("tr_poll_start", to);
    cmd_t c = {.kind = CMD_POLL_START, .tag = tag, .to = to, .fd = fd, .events = events};
    return post("tr_poll_start", rt, c, true, poll_id);
}

int tr_poll_resume(tr_runtime_t *rt, uint64_t poll_id)
{
    return post("tr_poll_resume", rt, (cmd_t){.kind = CMD_POLL_RESUME, .id = poll_id}, false, NULL);
}

int tr_poll_stop(tr_runtime_t *rt, uint64_t poll_id)
{
    return post("tr_poll_stop", rt, (cmd_t){.kind = CMD_POLL_STOP, .id = poll_id}, false, NULL);
}
