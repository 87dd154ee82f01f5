/* mpi.c: the "mpi" comm backend (built when CMake finds an MPI C library).
 *
 * Each operation is MPI's non-blocking collective (or MPI_Isend / MPI_Irecv) on the group's own
 * communicator, a duplicate of MPI_COMM_WORLD or an MPI_Comm_split of a parent's, with
 * MPI_ERRORS_RETURN, so an MPI error comes back as TR_ECOMM with MPI's own text in c->error.
 * fp16 and bf16 travel as 2-byte datatypes reduced by our own operations (mpi_half.h).
 * Open MPI 4.1 makes no progress between calls, so completions are found by `progress`
 * (MPI_Testsome over everything pending), which the comm actor calls while anything is pending;
 * each completed request is reported through done. MPI is initialised here on first use with
 * MPI_THREAD_SERIALIZED (the comm actor's pinned thread makes the calls, one at a time) and
 * finalised at exit, unless the program initialised it itself.
 */
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/errf.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/mpi_half.h"
#include "troupe/error.h"
#include "troupe/log.h"

typedef struct mpi_impl {
    MPI_Comm comm;
    int n, cap; /* pending operations */
    MPI_Request *reqs;
    uint64_t *ids, *tags;
    int *done_at; /* MPI_Testsome's indices */
    int **vargs;  /* an all_gather_v's counts and displacements, kept until it
                   * completes (NULL for other operations) */
    bool *recv;   /* a point-to-point receive (cancelled at shutdown) */
} mpi_impl_t;

/* --- MPI itself: once per process ---------------------------------------------------------- */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_rc;
static char init_why[256];

static void finalize_at_exit(void)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

static void init_mpi(void)
{
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (inited) { /* the program's: it finalises */
        MPI_Query_thread(&provided);
    } else if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        snprintf(init_why, sizeof(init_why), "comm backend 'mpi': MPI_Init_thread failed");
        init_rc = TR_ECOMM;
        return;
    } else {
        atexit(finalize_at_exit);
        /* Open MPI reports a failed non-blocking collective (a message truncated: the ranks
         * posted different collectives) on MPI_COMM_WORLD, whose default handler would end the
         * job before the comm actor names the divergence from the headers. A program that
         * initialised MPI itself keeps its own handler. */
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        snprintf(init_why, sizeof(init_why),
                 "comm backend 'mpi': MPI gives thread level %d; Troupe needs "
                 "MPI_THREAD_SERIALIZED (its comm actor calls MPI from its own thread)",
                 provided);
        init_rc = TR_ENOTSUP;
    }
}

/* --- operations ---------------------------------------------------------------------------- */

/* dt's MPI datatype, and the MPI operation that reduces it by op; MPI_DATATYPE_NULL when
 * MPI cannot have it. */
static MPI_Datatype mpi_type_op(tr_dtype_t dt, tr_reduce_op_t op, MPI_Op *mpi_op)
{
    MPI_Datatype t = MPI_DATATYPE_NULL;
    *mpi_op = op == TR_REDUCE_MAX ? MPI_MAX : MPI_SUM;
    switch (dt) {
    case TR_DTYPE_F32:
        return MPI_FLOAT;
    case TR_DTYPE_F64:
        return MPI_DOUBLE;
    case TR_DTYPE_I32:
        return MPI_INT32_T;
    case TR_DTYPE_I64:
        return MPI_INT64_T;
    case TR_DTYPE_U16:
        return MPI_UINT16_T;
    case TR_DTYPE_U8:
        return MPI_UINT8_T;
    case TR_DTYPE_F16:
    case TR_DTYPE_BF16: /* MPI has neither: our own type and operations */
        return tr_mpi_half_op(dt, op, &t, mpi_op) < 0 ? MPI_DATATYPE_NULL : t;
    default:
        return MPI_DATATYPE_NULL;
    }
}

static MPI_Datatype mpi_type(tr_dtype_t dt)
{
    MPI_Op unused;
    return mpi_type_op(dt, TR_REDUCE_SUM, &unused);
}

/* Checks what every operation shares; TR_EINVAL / TR_ENOTSUP / TR_EOVERFLOW with c->error. */
static int check(tr_comm_t *c, const void *buf, size_t count, tr_dtype_t dt, int v, int is_root)
{
    if (tr_comm_check(c, buf, count, dt, v, is_root) < 0)
        return tr__errf(c->error, sizeof(c->error), TR_EINVAL,
                        "comm 'mpi': bad arguments (buffer, dtype %s (%d), %s %d)",
                        tr_dtype_name((int)dt), (int)dt, is_root ? "root" : "op", v);
    if (mpi_type(dt) == MPI_DATATYPE_NULL)
        return tr__errf(c->error, sizeof(c->error), TR_ECOMM,
                        "comm 'mpi': dtype %s (%d): MPI could not create its datatype or reduction",
                        tr_dtype_name((int)dt), (int)dt);
    if (count > INT_MAX)
        return tr__errf(c->error, sizeof(c->error), TR_EOVERFLOW,
                        "comm 'mpi': %zu elements in one operation, more than MPI's int count (%d)",
                        count, INT_MAX);
    return 0;
}

/* Records a started operation, or turns MPI's error into ours. */
static int started_v(tr_comm_t *c, int mpi_rc, MPI_Request r, const char *what, uint64_t *req,
                     int *vargs);

/* MPI's error code mpi_rc from call `what`, in MPI's words, as c->error; TR_ECOMM. */
static int mpi_error(tr_comm_t *c, int mpi_rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(mpi_rc, text, &len);
    return tr__errf(c->error, sizeof(c->error), TR_ECOMM, "comm 'mpi': rank %d: %s: %.160s",
                    c->rank, what, text);
}

static int started(tr_comm_t *c, int mpi_rc, MPI_Request r, const char *what, uint64_t *req)
{
    return started_v(c, mpi_rc, r, what, req, NULL);
}

/* Grows the tables of pending operations to hold one more; false: no memory (the tables that
 * did grow stay grown). */
static bool grow(mpi_impl_t *m)
{
    if (m->n < m->cap) return true;
    int cap = m->cap ? 2 * m->cap : 64;
    MPI_Request *reqs = realloc(m->reqs, (size_t)cap * sizeof(*reqs));
    if (reqs) m->reqs = reqs;
    uint64_t *ids = realloc(m->ids, (size_t)cap * sizeof(*ids));
    if (ids) m->ids = ids;
    uint64_t *tags = realloc(m->tags, (size_t)cap * sizeof(*tags));
    if (tags) m->tags = tags;
    int *at = realloc(m->done_at, (size_t)cap * sizeof(*at));
    if (at) m->done_at = at;
    int **va = realloc(m->vargs, (size_t)cap * sizeof(*va));
    if (va) m->vargs = va;
    bool *rv = realloc(m->recv, (size_t)cap * sizeof(*rv));
    if (rv) m->recv = rv;
    if (!reqs || !ids || !tags || !at || !va || !rv) return false;
    m->cap = cap;
    return true;
}

/* Records a started operation (vargs: its own arrays, freed when it completes), or turns
 * MPI's error into ours. */
static int started_v(tr_comm_t *c, int mpi_rc, MPI_Request r, const char *what, uint64_t *req,
                     int *vargs)
{
    mpi_impl_t *m = c->impl;
    if (mpi_rc != MPI_SUCCESS) {
        free(vargs);
        return mpi_error(c, mpi_rc, what);
    }
    if (!grow(m)) { /* the operation runs; wait for it here */
        MPI_Wait(&r, MPI_STATUS_IGNORE);
        free(vargs);
        return tr__errf(c->error, sizeof(c->error), TR_ENOMEM,
                        "comm 'mpi': out of memory tracking operations");
    }
    *req = tr_comm_next_req(c);
    m->reqs[m->n] = r;
    m->ids[m->n] = *req;
    m->vargs[m->n] = vargs;
    m->recv[m->n] = false;
    m->tags[m->n++] = c->op_tag;
    return 0;
}

static int mpi_all_reduce(tr_comm_t *c, void *buf, size_t count, tr_dtype_t dt, tr_reduce_op_t op,
                          uint64_t *req)
{
    int rc = check(c, buf, count, dt, (int)op, 0);
    if (rc < 0) return rc;
    mpi_impl_t *m = c->impl;
    MPI_Request r;
    MPI_Op mop;
    MPI_Datatype t = mpi_type_op(dt, op, &mop);
    rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, t, mop, m->comm, &r);
    return started(c, rc, r, "MPI_Iallreduce", req);
}

static int mpi_reduce_scatter(tr_comm_t *c, const void *send, void *recv, size_t count,
                              tr_dtype_t dt, uint64_t *req)
{
    int rc = check(c, send, count * (size_t)c->world, dt, 0, 0);
    if (rc == 0 && !recv && count) rc = TR_EINVAL;
    if (rc < 0) return rc;
    mpi_impl_t *m = c->impl;
    MPI_Request r;
    MPI_Op mop;
    MPI_Datatype t = mpi_type_op(dt, TR_REDUCE_SUM, &mop);
    rc = MPI_Ireduce_scatter_block(send, recv, (int)count, t, mop, m->comm, &r);
    return started(c, rc, r, "MPI_Ireduce_scatter_block", req);
}

static int mpi_all_gather(tr_comm_t *c, const void *send, void *recv, size_t count, tr_dtype_t dt,
                          uint64_t *req)
{
    int rc = check(c, send, count, dt, 0, 0); /* send may be recv's own slice: in place */
    if (rc == 0 && !recv && count) rc = TR_EINVAL;
    if (rc < 0) return rc;
    mpi_impl_t *m = c->impl;
    MPI_Request r;
    size_t es = tr_dtype_size(dt);
    bool in_place = (const char *)send == (const char *)recv + (size_t)c->rank * count * es;
    rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send, (int)count, mpi_type(dt), recv, (int)count,
                        mpi_type(dt), m->comm, &r);
    return started(c, rc, r, "MPI_Iallgather", req);
}

/* counts (world entries) as MPI's ints, then (with displs) their displacements; NULL after
 * setting c->error. */
static int *int_counts(tr_comm_t *c, const size_t *counts, bool displs)
{
    int *v = malloc((displs ? 2 : 1) * (size_t)c->world * sizeof(int));
    if (!v) {
        snprintf(c->error, sizeof(c->error), "comm 'mpi': out of memory");
        return NULL;
    }
    for (int r = 0, d = 0; r < c->world; r++) {
        v[r] = (int)counts[r];
        if (displs) v[c->world + r] = d;
        d += (int)counts[r];
    }
    return v;
}

static size_t sum_counts(const tr_comm_t *c, const size_t *counts)
{
    size_t total = 0;
    for (int r = 0; counts && r < c->world; r++)
        total += counts[r];
    return total;
}

static int mpi_reduce_scatter_v(tr_comm_t *c, void *buf, const size_t *counts, tr_dtype_t dt,
                                uint64_t *req)
{
    int rc = check(c, buf, sum_counts(c, counts), dt, 0, 0);
    if (rc == 0 && !counts) rc = TR_EINVAL;
    if (rc < 0) return rc;
    int *v = int_counts(c, counts, false);
    if (!v) return TR_ENOMEM;
    mpi_impl_t *m = c->impl;
    MPI_Request r;
    MPI_Op mop;
    MPI_Datatype t = mpi_type_op(dt, TR_REDUCE_SUM, &mop);
    rc = MPI_Ireduce_scatter(MPI_IN_PLACE, buf, v, t, mop, m->comm, &r);
    return started_v(c, rc, r, "MPI_Ireduce_scatter", req, v);
}

static int mpi_all_gather_v(tr_comm_t *c, void *buf, const size_t *counts, tr_dtype_t dt,
                            uint64_t *req)
{
    int rc = check(c, buf, sum_counts(c, counts), dt, 0, 0);
    if (rc == 0 && !counts) rc = TR_EINVAL;
    if (rc < 0) return rc;
    int *v = int_counts(c, counts, true); /* counts, then displacements */
    if (!v) return TR_ENOMEM;
    mpi_impl_t *m = c->impl;
    MPI_Request r;
    rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, v, v + c->world, mpi_type(dt),
                         m->comm, &r);
    return started_v(c, rc, r, "MPI_Iallgatherv", req, v);
}

static int mpi_broadcast(tr_comm_t *c, void *buf, size_t count, tr_dtype_t dt, int root,
                         uint64_t *req)
{
    int rc = check(c, buf, count, dt, root, 1);
    if (rc < 0) return rc;
    mpi_impl_t *m = c->impl;
    MPI_Request r;
    rc = MPI_Ibcast(buf, (int)count, mpi_type(dt), root, m->comm, &r);
    return started(c, rc, r, "MPI_Ibcast", req);
}

static int mpi_send(tr_comm_t *c, const void *buf, size_t count, tr_dtype_t dt, int peer, int tag,
                    uint64_t *req)
{
    int rc = tr_comm_check_p2p(c, buf, count, dt, peer, tag, 0);
    if (rc == 0) rc = check(c, buf, count, dt, 0, 0);
    if (rc < 0) return rc;
    MPI_Request r;
    rc = MPI_Isend(buf, (int)count, mpi_type(dt), peer, tag, ((mpi_impl_t *)c->impl)->comm, &r);
    return started(c, rc, r, "MPI_Isend", req);
}

static int mpi_recv(tr_comm_t *c, void *buf, size_t count, tr_dtype_t dt, int peer, int tag,
                    uint64_t *req)
{
    int rc = tr_comm_check_p2p(c, buf, count, dt, peer, tag, 1);
    if (rc == 0) rc = check(c, buf, count, dt, 0, 0);
    if (rc < 0) return rc;
    mpi_impl_t *m = c->impl;
    MPI_Request r;
    rc = MPI_Irecv(buf, (int)count, mpi_type(dt),
                   peer == TR_COMM_ANY_SOURCE ? MPI_ANY_SOURCE : peer, tag, m->comm, &r);
    rc = started(c, rc, r, "MPI_Irecv", req);
    if (rc == 0) m->recv[m->n - 1] = true;
    return rc;
}

static const tr_comm_ops_t mpi_ops;

/* A group's own communicator (taken over: freed at destroy), as c's impl. */
static int adopt(tr_comm_t *c, MPI_Comm comm, char *why, size_t whylen)
{
    mpi_impl_t *m = calloc(1, sizeof(*m));
    if (!m) {
        MPI_Comm_free(&comm);
        return tr__errf(why, whylen, TR_ENOMEM, "comm backend 'mpi': out of memory");
    }
    m->comm = comm;
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &c->rank);
    MPI_Comm_size(comm, &c->world);
    c->impl = m;
    c->ops = &mpi_ops;
    return 0;
}

static int mpi_split(tr_comm_t *c, int color, int key, tr_comm_t *child, char *why, size_t whylen)
{
    MPI_Comm sub;
    int rc = MPI_Comm_split(((mpi_impl_t *)c->impl)->comm, color, key, &sub);
    if (rc != MPI_SUCCESS) {
        mpi_error(c, rc, "MPI_Comm_split");
        return tr__errf(why, whylen, TR_ECOMM, "%s", c->error);
    }
    return adopt(child, sub, why, whylen);
}

/* One MPI_Testsome over everything pending: completed operations are reported through done
 * (when report), their arrays freed, and the table compacted. Returns how many are still
 * pending, or TR_ECOMM with c->error. */
static int test_some(tr_comm_t *c, bool report)
{
    mpi_impl_t *m = c->impl;
    if (m->n == 0) return 0;
    int done = 0;
    int rc = MPI_Testsome(m->n, m->reqs, &done, m->done_at, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_error(c, rc, "MPI_Testsome");
    for (int k = 0; k < done && done != MPI_UNDEFINED; k++) {
        int i = m->done_at[k];
        if (report) c->done(c->done_arg, m->ids[i], m->tags[i], 0);
        m->ids[i] = 0; /* completed: compacted below */
        free(m->vargs[i]);
        m->vargs[i] = NULL;
    }
    int keep = 0;
    for (int i = 0; i < m->n; i++)
        if (m->ids[i]) {
            m->reqs[keep] = m->reqs[i];
            m->ids[keep] = m->ids[i];
            m->vargs[keep] = m->vargs[i];
            m->recv[keep] = m->recv[i];
            m->tags[keep++] = m->tags[i];
        }
    m->n = keep;
    return keep;
}

static int mpi_progress(tr_comm_t *c)
{
    return test_some(c, true);
}

/* At shutdown: cancels pending receives (a posted receive is no promise to another rank) and
 * lets the operations every rank posted finish (up to 2 s), without reporting them (the comm
 * actor is gone). Returns how many are still pending. */
static int drain(tr_comm_t *c)
{
    mpi_impl_t *m = c->impl;
    for (int i = 0; i < m->n; i++)
        if (m->recv[i]) MPI_Cancel(&m->reqs[i]); /* completes (cancelled or received) */
    int left = test_some(c, false);
    for (int round = 0; left > 0 && round < 20000; round++) {
        nanosleep(&(struct timespec){0, 100000}, NULL);
        left = test_some(c, false);
    }
    return left < 0 ? ((mpi_impl_t *)c->impl)->n : left;
}

static void mpi_destroy(tr_comm_t *c)
{
    mpi_impl_t *m = c->impl;
    if (m && m->n > 0 && drain(c) > 0) {
        /* collectives that can no longer complete: MPI cannot free or cancel them, and the
         * other ranks would wait for them forever. The job ends here, on every rank. */
        tr_log(TR_LOG_ERROR,
               "comm 'mpi': rank %d: %d operation(s) still pending at shutdown "
               "(a rank diverged or failed): aborting the MPI job so that no rank waits forever",
               c->rank, m->n);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (m && c->abort_job) { /* MPI_Finalize would wait for the stopped rank */
        tr_log(TR_LOG_ERROR,
               "comm 'mpi': rank %d: a rank is dead or stopped (the watchdog ended the job): "
               "aborting the MPI job so that no rank waits for it",
               c->rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (m) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Comm_free(&m->comm);
        for (int i = 0; i < m->n; i++)
            free(m->vargs[i]);
        free(m->reqs);
        free(m->ids);
        free(m->tags);
        free(m->done_at);
        free(m->vargs);
        free(m->recv);
        free(m);
    }
    free(c);
}

static const tr_comm_ops_t mpi_ops = {.all_reduce = mpi_all_reduce,
                                      .reduce_scatter = mpi_reduce_scatter,
                                      .all_gather = mpi_all_gather,
                                      .all_gather_v = mpi_all_gather_v,
                                      .reduce_scatter_v = mpi_reduce_scatter_v,
                                      .broadcast = mpi_broadcast,
                                      .send = mpi_send,
                                      .recv = mpi_recv,
                                      .split = mpi_split,
                                      .progress = mpi_progress,
                                      .destroy = mpi_destroy};

int tr__comm_mpi_create(tr_comm_t *c, char *why, size_t whylen)
{
    pthread_once(&init_once, init_mpi);
    if (init_rc < 0) return tr__errf(why, whylen, init_rc, "%s", init_why);
    int rank = -1, world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (rank != c->rank || world != c->world)
        return tr__errf(why, whylen, TR_EINVAL,
                        "comm backend 'mpi': the launcher said rank %d of %d, MPI says rank %d "
                        "of %d (was the program started by mpirun, once per rank?)",
                        c->rank, c->world, rank, world);
    MPI_Comm comm;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &comm) != MPI_SUCCESS)
        return tr__errf(why, whylen, TR_ECOMM, "comm backend 'mpi': MPI_Comm_dup failed");
    return adopt(c, comm, why, whylen);
}
