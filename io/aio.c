/* aio.c: the engine: I/O threads, requests cut into slices, completions.
 *
 * Design. A request of size bytes is cut into nworkers slices of size / nworkers bytes;
 * slice i goes to worker i's queue. Producers: any thread calling tr_aio_pread/pwrite (or
 * the _sync variants), under the engine's mutex. Consumers: the workers, each popping its
 * own queue in FIFO order and moving its slice with tr__aio_xfer_run outside the mutex. The
 * worker that finishes a request's last slice (request->left reaching 0, under the mutex)
 * completes it: a synchronous request wakes its caller through the `done` condition; an
 * asynchronous one is appended to the done list and the eventfd is written. Callbacks run
 * in tr_aio_poll on the caller's thread, never on a worker, so a callback may touch its
 * actor's state. Nothing spins: workers sleep on their condition and in io_getevents,
 * callers on `done` or on the eventfd.
 */
#include "io/aio_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "troupe/error.h"
#include "troupe/log.h"
#include "base/errf.h"

#define WHY_MAX 384

struct tr__aio_slice {
    tr__aio_slice_t *next;
    tr__aio_request_t *req;
    int index;
};

struct tr__aio_request {
    tr__aio_request_t *next; /* on the done list */
    tr_aio_file_t *f;
    int write;
    char *buf;
    size_t size;
    uint64_t off;
    tr_aio_cb cb;
    void *user;
    int sync, finished; /* finished: a sync request is done (under the mutex) */
    int left;           /* slices not finished (under the mutex) */
    int status;         /* the lowest failing slice's error */
    int err_slice;
    char why[WHY_MAX];
    tr__aio_slice_t slices[];
};

void tr__aio_warn_once(tr_aio_t *aio, int *flag, const char *msg)
{
    pthread_mutex_lock(&aio->mu);
    int first = !*flag;
    *flag = 1;
    pthread_mutex_unlock(&aio->mu);
    if (first) tr_log(TR_LOG_WARN, "%s", msg);
}

void tr_aio_options_default(tr_aio_options_t *o)
{
    o->block_size = 1048576;
    o->queue_depth = 8;
    o->intra_op_parallelism = 1;
    o->single_submit = 0;
    o->overlap_events = 1;
}

/* ---- a slice on its worker ---------------------------------------------------------- */

/* A buffer aligned for O_DIRECT, for slices whose memory, offset or size is not. */
static char *bounce_alloc(size_t size)
{
    void *p = NULL;
    return posix_memalign(&p, 4096, size ? size : 1) == 0 ? p : NULL;
}

/* Records that no bounce buffer could be had for the slice at off; returns -ENOMEM. */
static int bounce_failed(tr__aio_result_t *res, uint64_t off, size_t len)
{
    res->err = -ENOMEM;
    res->err_off = off;
    res->err_len = len;
    return -ENOMEM;
}

/* Reads the aligned range around an unaligned slice into a bounce buffer, then copies. */
static int read_bounced(tr__aio_ctx_t *ctx, tr__aio_range_t r, tr__aio_result_t *res)
{
    uint64_t lo = r.off - r.off % r.align;
    uint64_t hi = (r.off + r.len + r.align - 1) / r.align * r.align;
    char *user = r.buf;
    uint64_t off = r.off;
    size_t len = r.len;
    if (!(r.buf = bounce_alloc((size_t)(hi - lo)))) return bounce_failed(res, off, len);
    r.off = lo;
    r.len = (size_t)(hi - lo);
    tr__aio_xfer_run(ctx, &r, res);
    if (!res->err && res->end > off) {
        size_t got = res->end - off < len ? (size_t)(res->end - off) : len;
        memcpy(user, r.buf + (off - lo), got);
    }
    if (res->end > off + len) res->end = off + len;
    free(r.buf);
    return res->err;
}

/* Copies a slice whose offset and size are aligned but whose memory is not, then writes. */
static int write_bounced(tr__aio_ctx_t *ctx, tr__aio_range_t r, tr__aio_result_t *res)
{
    char *b = bounce_alloc(r.len);
    if (!b) return bounce_failed(res, r.off, r.len);
    memcpy(b, r.buf, r.len);
    r.buf = b;
    tr__aio_xfer_run(ctx, &r, res);
    free(b);
    return res->err;
}

/* Moves slice s's bytes: straight with O_DIRECT when address, offset and size are aligned;
 * otherwise a read goes through a bounce buffer, and so does a write at an aligned offset and
 * size; a write at an unaligned offset or size goes through the page cache (the kernel does
 * the read-modify-write of the shared blocks, which neighbouring slices could not do safely
 * each on their own). */
static void move_slice(tr__aio_worker_t *w, tr__aio_slice_t *s, tr__aio_result_t *res)
{
    tr__aio_request_t *q = s->req;
    tr_aio_file_t *f = q->f;
    size_t len = q->size / (size_t)w->aio->nworkers;
    tr__aio_range_t r = {.write = q->write,
                         .fd = f->fd,
                         .direct = f->direct,
                         .align = f->align,
                         .buf = q->buf + (size_t)s->index * len,
                         .len = len,
                         .off = q->off + (uint64_t)s->index * len};
    int place_ok = r.off % f->align == 0 && r.len % f->align == 0;
    int mem_ok = (uintptr_t)r.buf % f->mem_align == 0;
    if (!f->direct || (place_ok && mem_ok)) {
        tr__aio_xfer_run(&w->ctx, &r, res);
    } else if (!r.write) {
        read_bounced(&w->ctx, r, res);
    } else if (place_ok) {
        write_bounced(&w->ctx, r, res);
    } else {
        r.fd = f->fd_buffered;
        r.direct = 0;
        tr__aio_xfer_run(&w->ctx, &r, res);
    }
}

/* Records a slice's outcome; the last slice completes the request. Under the mutex. */
static void finish_slice(tr_aio_t *aio, tr__aio_slice_t *s, const tr__aio_result_t *res,
                         uint64_t slice_end)
{
    tr__aio_request_t *q = s->req;
    const char *op = q->write ? "pwrite" : "pread";
    if ((res->err || res->end < slice_end) && (!q->status || s->index < q->err_slice)) {
        q->err_slice = s->index;
        if (res->err)
            q->status = tr__errf(q->why, sizeof q->why, res->err,
                                 "%s '%s': offset %" PRIu64 ", size %zu: %s", op, q->f->path,
                                 res->err_off, res->err_len, tr_strerror(res->err));
        else
            q->status =
                tr__errf(q->why, sizeof q->why, TR_ERANGE,
                         "%s '%s': offset %" PRIu64 ", size %zu: the file ends at byte %" PRIu64,
                         op, q->f->path, q->off, q->size, res->end);
    }
    if (--q->left > 0) return;
    if (q->sync) {
        q->finished = 1;
    } else {
        q->next = NULL;
        if (aio->done_tail)
            aio->done_tail->next = q;
        else
            aio->done_head = q;
        aio->done_tail = q;
        aio->inflight--;
        uint64_t one = 1;
        ssize_t n = write(aio->efd, &one, sizeof one); /* cannot overflow: polls drain it */
        (void)n;
    }
    pthread_cond_broadcast(&aio->done);
}

static void *worker_main(void *arg)
{
    tr__aio_worker_t *w = arg;
    tr_aio_t *aio = w->aio;
    pthread_mutex_lock(&aio->mu);
    for (;;) {
        while (!w->head && !aio->stop)
            pthread_cond_wait(&w->cv, &aio->mu);
        tr__aio_slice_t *s = w->head;
        if (!s) break;
        if (!(w->head = s->next)) w->tail = NULL;
        pthread_mutex_unlock(&aio->mu);
        tr__aio_result_t res;
        move_slice(w, s, &res);
        size_t len = s->req->size / (size_t)aio->nworkers;
        uint64_t end = s->req->off + (uint64_t)(s->index + 1) * len;
        pthread_mutex_lock(&aio->mu);
        finish_slice(aio, s, &res, s->req->write ? 0 : end);
    }
    pthread_mutex_unlock(&aio->mu);
    return NULL;
}

/* ---- the engine ----------------------------------------------------------------------- */

static int check_options(const tr_aio_options_t *o, char *why, size_t why_len)
{
    if (o->block_size < 512 || o->block_size % 512)
        return tr__errf(why, why_len, TR_EINVAL,
                        "aio.block_size is %zu: expected a multiple of 512 bytes, at least 512",
                        o->block_size);
    if (o->queue_depth < 1 || o->queue_depth > 65536)
        return tr__errf(why, why_len, TR_EINVAL, "aio.queue_depth is %d: expected 1 to 65536",
                        o->queue_depth);
    if (o->intra_op_parallelism < 1 || o->intra_op_parallelism > 1024)
        return tr__errf(why, why_len, TR_EINVAL,
                        "aio.intra_op_parallelism is %d: expected 1 to 1024",
                        o->intra_op_parallelism);
    return 0;
}

static int start_workers(tr_aio_t *aio, char *why, size_t why_len)
{
    for (int i = 0; i < aio->nworkers; i++) {
        tr__aio_worker_t *w = &aio->workers[i];
        w->aio = aio;
        pthread_cond_init(&w->cv, NULL);
        int rc = tr__aio_ctx_init(&w->ctx, &aio->o);
        if (rc)
            return tr__errf(why, why_len, rc, "io_setup(%d) for I/O thread %d: %s%s",
                            aio->o.queue_depth, i, tr_strerror(rc),
                            rc == -EAGAIN ? " (/proc/sys/fs/aio-max-nr is reached)" : "");
        rc = -pthread_create(&w->thread, NULL, worker_main, w);
        if (rc)
            return tr__errf(why, why_len, rc, "cannot start I/O thread %d: %s", i, tr_strerror(rc));
        w->started = 1;
    }
    return 0;
}

int tr_aio_create(const tr_aio_options_t *o, tr_aio_t **out, char *why, size_t why_len)
{
    int rc = check_options(o, why, why_len);
    if (rc) return rc;
    tr_aio_t *aio =
        calloc(1, sizeof *aio + (size_t)o->intra_op_parallelism * sizeof(tr__aio_worker_t));
    if (!aio) return tr__errf(why, why_len, TR_ENOMEM, "no memory for the aio engine");
    aio->o = *o;
    aio->nworkers = o->intra_op_parallelism;
    pthread_mutex_init(&aio->mu, NULL);
    pthread_cond_init(&aio->done, NULL);
    aio->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (aio->efd < 0) {
        rc = tr__errf(why, why_len, -errno, "eventfd: %s", tr_strerror(-errno));
        aio->efd = -1;
    } else {
        rc = start_workers(aio, why, why_len);
    }
    if (rc) {
        tr_aio_destroy(aio);
        return rc;
    }
    *out = aio;
    return 0;
}

void tr_aio_destroy(tr_aio_t *aio)
{
    if (!aio) return;
    pthread_mutex_lock(&aio->mu);
    while (aio->inflight > 0)
        pthread_cond_wait(&aio->done, &aio->mu);
    aio->stop = 1;
    for (int i = 0; i < aio->nworkers; i++)
        pthread_cond_signal(&aio->workers[i].cv);
    pthread_mutex_unlock(&aio->mu);
    for (int i = 0; i < aio->nworkers; i++) {
        tr__aio_worker_t *w = &aio->workers[i];
        if (w->started) pthread_join(w->thread, NULL);
        if (w->ctx.slots) tr__aio_ctx_close(&w->ctx);
        pthread_cond_destroy(&w->cv);
    }
    if (aio->efd >= 0) {
        tr_aio_poll(aio);
        close(aio->efd);
    }
    pthread_cond_destroy(&aio->done);
    pthread_mutex_destroy(&aio->mu);
    free(aio);
}

int tr_aio_fd(const tr_aio_t *aio)
{
    return aio->efd;
}

int tr_aio_parallelism(const tr_aio_t *aio)
{
    return aio->nworkers;
}

/* ---- requests ------------------------------------------------------------------------ */

static int start(tr_aio_t *aio, tr_aio_file_t *f, int write, void *buf, size_t size, uint64_t off,
                 tr_aio_cb cb, void *user, int sync, tr__aio_request_t **out, char *why,
                 size_t why_len)
{
    const char *op = write ? "pwrite" : "pread";
    int n = aio->nworkers;
    if (!(f->flags & (write ? TR_AIO_WRITE : TR_AIO_READ)))
        return tr__errf(why, why_len, TR_EBADF, "%s '%s': the file is not open for %s", op, f->path,
                        write ? "writing" : "reading");
    if (size % (size_t)n)
        return tr__errf(why, why_len, TR_EINVAL,
                        "%s '%s': offset %" PRIu64 ", size %zu does not divide by "
                        "aio.intra_op_parallelism %d (each I/O thread moves an equal share)",
                        op, f->path, off, size, n);
    tr__aio_request_t *q = calloc(1, sizeof *q + (size_t)n * sizeof(tr__aio_slice_t));
    if (!q)
        return tr__errf(why, why_len, TR_ENOMEM, "%s '%s': no memory for the request", op, f->path);
    *q = (tr__aio_request_t){.f = f,
                             .write = write,
                             .buf = buf,
                             .size = size,
                             .off = off,
                             .cb = cb,
                             .user = user,
                             .sync = sync,
                             .left = n};
    pthread_mutex_lock(&aio->mu);
    aio->inflight += !sync;
    for (int i = 0; i < n; i++) {
        tr__aio_worker_t *w = &aio->workers[i];
        tr__aio_slice_t *s = &q->slices[i];
        *s = (tr__aio_slice_t){.req = q, .index = i};
        if (w->tail)
            w->tail->next = s;
        else
            w->head = s;
        w->tail = s;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&aio->mu);
    *out = q;
    return 0;
}

int tr_aio_pread(tr_aio_t *aio, tr_aio_file_t *f, void *buf, size_t size, uint64_t offset,
                 tr_aio_cb cb, void *user, char *why, size_t why_len)
{
    tr__aio_request_t *q;
    return start(aio, f, 0, buf, size, offset, cb, user, 0, &q, why, why_len);
}

int tr_aio_pwrite(tr_aio_t *aio, tr_aio_file_t *f, const void *buf, size_t size, uint64_t offset,
                  tr_aio_cb cb, void *user, char *why, size_t why_len)
{
    tr__aio_request_t *q;
    return start(aio, f, 1, (void *)buf, size, offset, cb, user, 0, &q, why, why_len);
}

static int run_sync(tr_aio_t *aio, tr_aio_file_t *f, int write, void *buf, size_t size,
                    uint64_t off, char *why, size_t why_len)
{
    tr__aio_request_t *q;
    int rc = start(aio, f, write, buf, size, off, NULL, NULL, 1, &q, why, why_len);
    if (rc) return rc;
    pthread_mutex_lock(&aio->mu);
    while (!q->finished)
        pthread_cond_wait(&aio->done, &aio->mu);
    pthread_mutex_unlock(&aio->mu);
    rc = q->status;
    if (rc) tr__errf(why, why_len, rc, "%s", q->why);
    free(q);
    return rc;
}

int tr_aio_pread_sync(tr_aio_t *aio, tr_aio_file_t *f, void *buf, size_t size, uint64_t offset,
                      char *why, size_t why_len)
{
    return run_sync(aio, f, 0, buf, size, offset, why, why_len);
}

int tr_aio_pwrite_sync(tr_aio_t *aio, tr_aio_file_t *f, const void *buf, size_t size,
                       uint64_t offset, char *why, size_t why_len)
{
    return run_sync(aio, f, 1, (void *)buf, size, offset, why, why_len);
}

int tr_aio_poll(tr_aio_t *aio)
{
    uint64_t count;
    ssize_t n = read(aio->efd, &count, sizeof count); /* clears readiness before the take */
    (void)n;
    pthread_mutex_lock(&aio->mu);
    tr__aio_request_t *q = aio->done_head;
    aio->done_head = aio->done_tail = NULL;
    pthread_mutex_unlock(&aio->mu);
    int ran = 0;
    while (q) {
        tr__aio_request_t *next = q->next;
        if (q->cb) q->cb(q->user, q->status, q->status ? q->why : "");
        free(q);
        q = next;
        ran++;
    }
    return ran;
}

int tr_aio_wait(tr_aio_t *aio)
{
    pthread_mutex_lock(&aio->mu);
    while (aio->inflight > 0)
        pthread_cond_wait(&aio->done, &aio->mu);
    pthread_mutex_unlock(&aio->mu);
    return tr_aio_poll(aio);
}
