/* client.c: the client endpoint (client.h): the caller's reply slot, the engine's supervisor,
 * failure and the resolution of tensor references.
 *
 * Design. One caller thread waits at a time (engine.c's enter_call refuses a concurrent call
 * with TR_EBUSY). It sets `waiting` under mu, sends its request and sleeps on cv; the actor
 * that ends the request (tr__reply), an actor that fails the engine (tr__engine_fail) or the
 * supervisor hearing a child's failed exit writes rc, the reply and the explanation under mu,
 * clears `waiting` and broadcasts. The first failure stands: what follows it changes neither the
 * code nor the text, and every later call returns it.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/engine/client.h"
#include "actors/engine/plan.h"

struct tr__client {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool waiting;
    int rc;
    tr__reply_t reply;
    char error[1024];
    int failed;                    /* an actor failed: every call returns this */
    bool destroying;               /* tr_engine_destroy is stopping the actors */
    int n_children, exits;         /* actors to hear from at destroy; exit notices heard */
    _Atomic uint64_t bucket_bytes; /* a gauge for the trace (relaxed; any actor) */
    _Atomic int stop_requested;    /* the supervisor saw a signal's STOP */
    _Atomic int stop_agreed;       /* on several ranks: a step's sum said some rank's had */
};

void *tr__resolve(const tr__plan_t *eng, const tr_tensor_ref_t *ref, char *why, size_t whylen)
{
    void *p;
    if (tr_buffer_resolve(eng->rt, ref, &p, why, whylen) != 0) return NULL;
    return p;
}

/* --- the reply slot -------------------------------------------------------------------- */

/* The explanation of rc, from fmt: never empty, and never ending in a bare ": ". Under mu. */
static void set_error(tr__client_t *c, int rc, const char *fmt, va_list ap)
{
    c->error[0] = '\0';
    if (fmt) vsnprintf(c->error, sizeof(c->error), fmt, ap);
    size_t n = strlen(c->error);
    if (n == 0 || c->error[n - 1] == ' ' || c->error[n - 1] == ':')
        snprintf(c->error + n, sizeof(c->error) - n, "%s%s (%s)",
                 n ? " " : "engine: ", tr_err_name(rc), tr_strerror(rc));
}

static void reply_v(tr__client_t *c, int rc, bool fail_engine, const tr__reply_t *r,
                    const char *fmt, va_list ap)
{
    pthread_mutex_lock(&c->mu);
    if (c->failed) {
        /* the first failure stands: what follows it (a peer that can no longer send to a
         * failed actor, a request it cut short) changes neither the code nor the text */
        c->rc = c->failed;
    } else {
        c->rc = rc;
        if (r) c->reply = *r;
        /* an actor failed between calls (the loader, ahead), or for good: keep why */
        if (rc < 0 && (fail_engine || !c->waiting)) c->failed = rc;
        if (rc < 0) set_error(c, rc, fmt, ap);
    }
    c->waiting = false;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void tr__reply(const tr__plan_t *eng, int rc, const tr__reply_t *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_v(eng->client, rc, false, r, fmt, ap);
    va_end(ap);
}

void tr__engine_fail(const tr__plan_t *eng, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_v(eng->client, rc, true, NULL, fmt, ap);
    va_end(ap);
}

tr_msg_t *tr__request_new(tr_runtime_t *rt, tr__req_kind_t kind)
{
    tr_msg_t *m = tr_msg_new(rt, TR_MSG_ENGINE_REQ);
    if (m) TR_MSG_AS(m, engine_req)->kind = kind;
    return m;
}

void tr__engine_bucket_bytes(const tr__plan_t *eng, int64_t delta)
{
    /* relaxed: a gauge for the trace, ordered with nothing */
    uint64_t v = atomic_fetch_add_explicit(&eng->client->bucket_bytes, (uint64_t)delta,
                                           memory_order_relaxed);
    v += (uint64_t)delta;
    if (tr_monitor_recording(eng->mon))
        tr_monitor_counter(eng->mon, -1, TR_COUNTER_BUCKET_BYTES, (double)v, tr_now_ns());
}

/* --- the caller's side ------------------------------------------------------------------ */

tr__client_t *tr__client_create(void)
{
    tr__client_t *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    return c;
}

void tr__client_destroy(tr__client_t *c)
{
    if (!c) return;
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int tr__client_call(tr__client_t *c, tr_runtime_t *rt, tr_actor_t to, tr_msg_t *m,
                    tr__reply_t *last, char *err, size_t errlen)
{
    pthread_mutex_lock(&c->mu);
    int failed = c->failed; /* under mu: actors write it */
    if (!failed) {
        c->waiting = true;
        c->error[0] = '\0';
    }
    pthread_mutex_unlock(&c->mu);
    if (failed) {
        tr_msg_free(rt, m);
        pthread_mutex_lock(&c->mu);
        snprintf(err, errlen, "%s", c->error);
        pthread_mutex_unlock(&c->mu);
        return failed;
    }
    m->step = last->global_step;
    int rc = tr_actor_send(rt, to, m);
    if (rc < 0) {
        tr_msg_free(rt, m);
        pthread_mutex_lock(&c->mu);
        c->waiting = false;
        pthread_mutex_unlock(&c->mu);
        return tr__errf(err, errlen, rc, "engine: cannot send the request: %s", tr_strerror(rc));
    }
    pthread_mutex_lock(&c->mu);
    while (c->waiting)
        pthread_cond_wait(&c->cv, &c->mu);
    rc = c->rc;
    if (rc >= 0) *last = c->reply;
    snprintf(err, errlen, "%s", rc < 0 ? c->error : "");
    if (!c->failed) c->error[0] = '\0'; /* a later failure between calls brings its own */
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* --- supervision ------------------------------------------------------------------------ */

/* A child's exit notice: a failure fails the engine (unless a peer merely stopped first
 * while destroy stops them all). Under mu. */
static void child_exited(tr__client_t *c, const tr_msg_exit_t *x)
{
    c->exits++;
    if (x->reason >= 0 ||
        (c->destroying && (x->reason == TR_ESTOPPED || x->reason == TR_ESHUTDOWN)))
        return;
    if (!c->failed) {
        c->failed = x->reason;
        if (!c->error[0])
            snprintf(c->error, sizeof(c->error), "actor '%s' failed handling '%s': %s (%s)",
                     x->name, tr_msg_type_name(x->msg_type), tr_err_name(x->reason),
                     tr_strerror(x->reason));
    }
    c->rc = c->failed;
    c->waiting = false;
    pthread_cond_broadcast(&c->cv);
}

int tr__client_supervise(tr_ctx_t *ctx, tr_msg_t *msg)
{
    tr__client_t *c = ctx->state;
    pthread_mutex_lock(&c->mu);
    if (msg->type == TR_MSG_STOP && !c->destroying)
        atomic_store(&c->stop_requested, 1); /* a signal: finish the step, then stop */
    if (msg->type == TR_MSG_EXIT) child_exited(c, TR_MSG_AS(msg, exit));
    bool done = c->destroying && c->exits >= c->n_children;
    pthread_mutex_unlock(&c->mu);
    if (done) tr_actor_stop(ctx->rt, ctx->self);
    return 0;
}

void tr__client_destroying(tr__client_t *c, int n_children)
{
    pthread_mutex_lock(&c->mu);
    c->destroying = true;
    c->n_children = n_children;
    pthread_mutex_unlock(&c->mu);
}

int tr__client_failed(tr__client_t *c)
{
    pthread_mutex_lock(&c->mu);
    int failed = c->failed;
    pthread_mutex_unlock(&c->mu);
    return failed;
}

const char *tr__client_error(const tr__client_t *c)
{
    return c->error;
}

int tr__client_stop_requested(tr__client_t *c)
{
    return atomic_load(&c->stop_requested);
}

void tr__client_stop_agree(tr__client_t *c)
{
    atomic_store(&c->stop_agreed, 1); /* before the step's reply: the caller reads it after */
}

int tr__client_stop_agreed(tr__client_t *c)
{
    return atomic_load(&c->stop_agreed);
}
