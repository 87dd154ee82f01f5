/* local.c: the registry of comm backends, what every backend shares (argument checks,
 * splitting a group), and the local backend, a data-parallel group of one: every collective is
 * the identity (the sum or maximum over one rank is the value, a reduce-scatter or all-gather a
 * copy, a broadcast nothing) and completes at once. Its point-to-point messages go from rank 0
 * to itself: a send is copied and completes at once; a recv completes when a matching message
 * is there (at once, or when the send that matches it starts). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errf.h"
#include "runtime/comm/comm.h"
#include "tr_build_config.h"
#include "troupe/error.h"

/* --- the registry ------------------------------------------------------------------------ */

#define MAX_BACKENDS 16

static int local_create(tr_comm_t *c, char *why, size_t whylen);

static struct {
    pthread_mutex_t mu;
    int n;
    const char *names[MAX_BACKENDS];
    tr_comm_backend_fn create[MAX_BACKENDS];
#if TR_HAVE_MPI
} reg = {PTHREAD_MUTEX_INITIALIZER, 2, {"local", "mpi"}, {local_create, tr__comm_mpi_create}};
#else
} reg = {PTHREAD_MUTEX_INITIALIZER, 1, {"local"}, {local_create}};
#endif

int tr_comm_backend_register(const char *name, tr_comm_backend_fn create)
{
    if (!name || !*name || !create) return TR_EINVAL;
    pthread_mutex_lock(&reg.mu);
    int rc = reg.n < MAX_BACKENDS ? 0 : TR_ENOSPC;
    for (int i = 0; i < reg.n && rc == 0; i++)
        if (!strcmp(reg.names[i], name)) rc = TR_EEXIST;
    if (rc == 0) {
        reg.names[reg.n] = name;
        reg.create[reg.n++] = create;
    }
    pthread_mutex_unlock(&reg.mu);
    return rc;
}

static tr_comm_backend_fn find_backend(const char *name, char *why, size_t whylen)
{
    tr_comm_backend_fn fn = NULL;
    size_t used =
        (size_t)snprintf(why, whylen, "no comm backend '%s' in this build (it has:", name);
    pthread_mutex_lock(&reg.mu);
    for (int i = 0; i < reg.n; i++) {
        if (!strcmp(reg.names[i], name)) fn = reg.create[i];
        if (used < whylen) used += (size_t)snprintf(why + used, whylen - used, " %s", reg.names[i]);
    }
    pthread_mutex_unlock(&reg.mu);
    if (used < whylen) snprintf(why + used, whylen - used, ")");
    return fn;
}

int tr_comm_create(const char *name, int rank, int world, tr_comm_done_cb done, void *arg,
                   tr_comm_t **out, char *why, size_t whylen)
{
    char scratch[8];
    if (!why) {
        why = scratch;
        whylen = sizeof(scratch);
    }
    *out = NULL;
    if (!name || !done || world < 1 || rank < 0 || rank >= world)
        return tr__errf(why, whylen, TR_EINVAL, "comm: rank %d of world %d", rank, world);
    tr_comm_backend_fn create = find_backend(name, why, whylen);
    if (!create) return TR_ENOTSUP;
    tr_comm_t *c = calloc(1, sizeof(*c));
    if (!c) return TR_ENOMEM;
    *c = (tr_comm_t){.name = name, .rank = rank, .world = world, .done = done, .done_arg = arg};
    int rc = create(c, why, whylen);
    if (rc < 0) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void tr_comm_destroy(tr_comm_t *c)
{
    if (c) c->ops->destroy(c);
}

uint64_t tr_comm_next_req(tr_comm_t *c)
{
    return ++c->next_req;
}

int tr_comm_check(const tr_comm_t *c, const void *buf, size_t count, tr_dtype_t dt, int op_or_root,
                  int is_root)
{
    if ((!buf && count) || !tr_dtype_size(dt)) return TR_EINVAL;
    if (is_root ? op_or_root < 0 || op_or_root >= c->world
                : op_or_root < 0 || op_or_root >= TR_REDUCE_COUNT_)
        return TR_EINVAL;
    return 0;
}

int tr_comm_check_p2p(tr_comm_t *c, const void *buf, size_t count, tr_dtype_t dt, int peer, int tag,
                      int is_recv)
{
    const char *bad = (!buf && count) || !tr_dtype_size(dt) ? "buffer or dtype"
                      : tag < 0 || tag > TR_COMM_TAG_MAX    ? "tag"
                      : (peer < 0 || peer >= c->world) && !(is_recv && peer == TR_COMM_ANY_SOURCE)
                          ? "peer"
                          : NULL;
    if (!bad) return 0;
    snprintf(c->error, sizeof(c->error),
             "comm '%s': %s: bad %s (peer %d of %d ranks, tag %d, "
             "dtype %s (%d), %zu elements)",
             c->name, is_recv ? "recv" : "send", bad, peer, c->world, tag, tr_dtype_name((int)dt),
             (int)dt, count);
    return TR_EINVAL;
}

int tr_comm_split(tr_comm_t *parent, int color, int key, tr_comm_t **child, char *why,
                  size_t whylen)
{
    char scratch[8];
    if (!why) {
        why = scratch;
        whylen = sizeof(scratch);
    }
    *child = NULL;
    if (color < 0)
        return tr__errf(why, whylen, TR_EINVAL, "comm '%s': split: color %d (>= 0 expected)",
                        parent->name, color);
    tr_comm_t *c = calloc(1, sizeof(*c));
    if (!c) return tr__errf(why, whylen, TR_ENOMEM, "comm: split: out of memory");
    *c = (tr_comm_t){.name = parent->name, .done = parent->done, .done_arg = parent->done_arg};
    int rc = parent->ops->split(parent, color, key, c, why, whylen);
    if (rc < 0) {
        free(c);
        return rc;
    }
    *child = c;
    return 0;
}

int tr_comm_all_reduce_scalar(tr_comm_t *c, double *v, tr_reduce_op_t op, uint64_t *req)
{
    return c->ops->all_reduce(c, v, 1, TR_DTYPE_F64, op, req);
}

/* --- the local backend ---------------------------------------------------------------------- */

/* Starts and at once completes an operation. */
static int complete(tr_comm_t *c, uint64_t *req)
{
    *req = tr_comm_next_req(c);
    c->done(c->done_arg, *req, c->op_tag, 0);
    return 0;
}

static int local_all_reduce(tr_comm_t *c, void *buf, size_t count, tr_dtype_t dt, tr_reduce_op_t op,
                            uint64_t *req)
{
    int rc = tr_comm_check(c, buf, count, dt, (int)op, 0);
    return rc < 0 ? rc : complete(c, req);
}

static int local_copy(tr_comm_t *c, const void *send, void *recv, size_t count, tr_dtype_t dt,
                      uint64_t *req)
{
    int rc = tr_comm_check(c, send, count, dt, 0, 0);
    if (rc == 0 && !recv && count) rc = TR_EINVAL;
    if (rc < 0) return rc;
    if (send != recv && count) memmove(recv, send, count * tr_dtype_size(dt));
    return complete(c, req);
}

static int local_broadcast(tr_comm_t *c, void *buf, size_t count, tr_dtype_t dt, int root,
                           uint64_t *req)
{
    int rc = tr_comm_check(c, buf, count, dt, root, 1);
    return rc < 0 ? rc : complete(c, req);
}

/* A message of the local backend: a send waiting for its recv, or a recv waiting for its
 * send (buf NULL: the message's bytes are in data). */
typedef struct local_msg {
    struct local_msg *next;
    int tag;
    size_t bytes;
    void *buf; /* a waiting recv's buffer (bytes: its capacity) */
    uint64_t req, op_tag;
    unsigned char data[]; /* a waiting send's copy */
} local_msg_t;

typedef struct local_impl {
    local_msg_t *sends, *recvs; /* unmatched, oldest first */
} local_impl_t;

/* Unlinks and returns the oldest message of *list with tag, or NULL. */
static local_msg_t *take(local_msg_t **list, int tag)
{
    for (; *list; list = &(*list)->next)
        if ((*list)->tag == tag) {
            local_msg_t *m = *list;
            *list = m->next;
            return m;
        }
    return NULL;
}

static void append(local_msg_t **list, local_msg_t *m)
{
    while (*list)
        list = &(*list)->next;
    m->next = NULL;
    *list = m;
}

/* A recv (into buf, cap bytes; req, op_tag) meets a message of `bytes` bytes. */
static void deliver(tr_comm_t *c, void *buf, size_t cap, uint64_t req, uint64_t op_tag,
                    const void *data, size_t bytes)
{
    int rc = 0;
    if (bytes > cap) {
        snprintf(c->error, sizeof(c->error),
                 "comm 'local': recv: a message of %zu bytes for a "
                 "buffer of %zu",
                 bytes, cap);
        rc = TR_EOVERFLOW;
    } else if (bytes) {
        memcpy(buf, data, bytes);
    }
    c->done(c->done_arg, req, op_tag, rc);
}

static int local_send(tr_comm_t *c, const void *buf, size_t count, tr_dtype_t dt, int peer, int tag,
                      uint64_t *req)
{
    int rc = tr_comm_check_p2p(c, buf, count, dt, peer, tag, 0);
    if (rc < 0) return rc;
    local_impl_t *l = c->impl;
    size_t bytes = count * tr_dtype_size(dt);
    local_msg_t *r = take(&l->recvs, tag);
    if (r) {
        deliver(c, r->buf, r->bytes, r->req, r->op_tag, buf, bytes);
        free(r);
        return complete(c, req);
    }
    local_msg_t *m = malloc(sizeof(*m) + bytes);
    if (!m) return tr__errf(c->error, sizeof(c->error), TR_ENOMEM, "comm 'local': out of memory");
    *m = (local_msg_t){.tag = tag, .bytes = bytes};
    if (bytes) memcpy(m->data, buf, bytes);
    append(&l->sends, m);
    return complete(c, req); /* buffered: the caller's buffer is free again */
}

static int local_recv(tr_comm_t *c, void *buf, size_t count, tr_dtype_t dt, int peer, int tag,
                      uint64_t *req)
{
    int rc = tr_comm_check_p2p(c, buf, count, dt, peer, tag, 1);
    if (rc < 0) return rc;
    local_impl_t *l = c->impl;
    size_t cap = count * tr_dtype_size(dt);
    *req = tr_comm_next_req(c);
    local_msg_t *s = take(&l->sends, tag);
    if (s) {
        deliver(c, buf, cap, *req, c->op_tag, s->data, s->bytes);
        free(s);
        return 0;
    }
    local_msg_t *m = malloc(sizeof(*m));
    if (!m) return tr__errf(c->error, sizeof(c->error), TR_ENOMEM, "comm 'local': out of memory");
    *m = (local_msg_t){.tag = tag, .bytes = cap, .buf = buf, .req = *req, .op_tag = c->op_tag};
    append(&l->recvs, m);
    return 0;
}

static int local_split(tr_comm_t *c, int color, int key, tr_comm_t *child, char *why, size_t whylen)
{
    /* one rank: every split is that rank alone */
    (void)c;
    (void)color;
    (void)key;
    child->rank = 0;
    child->world = 1;
    return local_create(child, why, whylen);
}

static void free_list(local_msg_t *m)
{
    while (m) {
        local_msg_t *next = m->next;
        free(m);
        m = next;
    }
}

/* Recvs still waiting are dropped without a completion (nobody can send them anything). */
static void local_destroy(tr_comm_t *c)
{
    local_impl_t *l = c->impl;
    if (l) {
        free_list(l->sends);
        free_list(l->recvs);
        free(l);
    }
    free(c);
}

static int local_all_gather_v(tr_comm_t *c, void *buf, const size_t *counts, tr_dtype_t dt,
                              uint64_t *req)
{
    int rc = tr_comm_check(c, buf, counts ? counts[0] : 0, dt, 0, 0);
    return rc < 0 ? rc : complete(c, req); /* one rank: its part is the whole */
}

static const tr_comm_ops_t local_ops = {.all_reduce = local_all_reduce,
                                        .reduce_scatter = local_copy,
                                        .all_gather = local_copy,
                                        .all_gather_v = local_all_gather_v,
                                        .reduce_scatter_v = local_all_gather_v, /* one rank */
                                        .broadcast = local_broadcast,
                                        .send = local_send,
                                        .recv = local_recv,
                                        .split = local_split,
                                        .destroy = local_destroy};

static int local_create(tr_comm_t *c, char *why, size_t whylen)
{
    if (c->world != 1)
        return tr__errf(why, whylen, TR_EINVAL,
                        "comm backend 'local' is a group of one rank; world size %d needs the "
                        "mpi backend",
                        c->world);
    c->impl = calloc(1, sizeof(local_impl_t));
    if (!c->impl) return tr__errf(why, whylen, TR_ENOMEM, "comm backend 'local': out of memory");
    c->ops = &local_ops;
    return 0;
}
