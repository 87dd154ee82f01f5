/* aio_xfer.c: one I/O thread's share of a request (see aio_xfer.h for the design). */
#include "io/aio_xfer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* io_submit may refuse with EAGAIN while nothing of ours is in flight (the kernel's request
 * pool is shared): sleep this long between tries, and give up after this many. */
#define EAGAIN_SLEEP_NS 100000L
#define EAGAIN_TRIES    20000

struct tr__aio_slot {
    struct iocb cb;
    char *buf;
    size_t len;
    uint64_t off;
};

/* The state of one tr__aio_xfer_run. */
typedef struct run {
    tr__aio_ctx_t *c;
    const tr__aio_range_t *r;
    tr__aio_result_t *res;
    size_t next;  /* first byte of the range not yet cut into an iocb */
    int inflight; /* submitted, not reaped */
    int npending; /* prepared, not submitted */
    int nfree;
} run_t;

int tr__aio_ctx_init(tr__aio_ctx_t *c, const tr_aio_options_t *o)
{
    memset(c, 0, sizeof *c);
    c->depth = o->queue_depth;
    c->block_size = o->block_size;
    c->single_submit = o->single_submit;
    c->overlap_events = o->overlap_events;
    c->slots = calloc((size_t)c->depth, sizeof *c->slots);
    c->pending = calloc((size_t)c->depth, sizeof *c->pending);
    c->events = calloc((size_t)c->depth, sizeof *c->events);
    c->free = calloc((size_t)c->depth, sizeof *c->free);
    if (!c->slots || !c->pending || !c->events || !c->free) {
        tr__aio_ctx_close(c);
        return -ENOMEM;
    }
    int rc = io_setup(c->depth, &c->io);
    if (rc < 0) {
        c->io = 0;
        tr__aio_ctx_close(c);
    }
    return rc;
}

void tr__aio_ctx_close(tr__aio_ctx_t *c)
{
    if (c->io) io_destroy(c->io);
    free(c->slots);
    free(c->pending);
    free(c->events);
    free(c->free);
    memset(c, 0, sizeof *c);
}

static void fail(run_t *s, int err, uint64_t off, size_t len)
{
    if (s->res->err) return;
    s->res->err = err;
    s->res->err_off = off;
    s->res->err_len = len;
}

static void prep(run_t *s, tr__aio_slot_t *slot, char *buf, size_t len, uint64_t off)
{
    slot->buf = buf;
    slot->len = len;
    slot->off = off;
    if (s->r->write)
        io_prep_pwrite(&slot->cb, s->r->fd, buf, len, (long long)off);
    else
        io_prep_pread(&slot->cb, s->r->fd, buf, len, (long long)off);
    slot->cb.data = slot;
    s->c->pending[s->npending++] = &slot->cb;
}

static void release(run_t *s, tr__aio_slot_t *slot)
{
    s->c->free[s->nfree++] = (int)(slot - s->c->slots);
}

/* Cuts the next blocks of the range into free slots. */
static void fill(run_t *s)
{
    while (s->nfree > 0 && s->next < s->r->len) {
        size_t n = s->r->len - s->next;
        if (n > s->c->block_size) n = s->c->block_size;
        prep(s, &s->c->slots[s->c->free[--s->nfree]], s->r->buf + s->next, n, s->r->off + s->next);
        s->next += n;
    }
}

static void drop_pending(run_t *s)
{
    for (int i = 0; i < s->npending; i++)
        release(s, (tr__aio_slot_t *)s->c->pending[i]->data);
    s->npending = 0;
}

/* Submits what is pending; stops early on EAGAIN (the caller reaps or sleeps, then calls
 * again). Another error fails the run at the first unsubmitted iocb. */
static void submit(run_t *s)
{
    int done = 0;
    while (done < s->npending) {
        int n = s->c->single_submit ? 1 : s->npending - done;
        int rc = io_submit(s->c->io, n, s->c->pending + done);
        if (rc == -EINTR) continue;
        if (rc == -EAGAIN || rc == 0) break;
        if (rc < 0) {
            tr__aio_slot_t *slot = s->c->pending[done]->data;
            fail(s, rc, slot->off, slot->len);
            break;
        }
        done += rc;
        s->inflight += rc;
    }
    memmove(s->c->pending, s->c->pending + done,
            (size_t)(s->npending - done) * sizeof *s->c->pending);
    s->npending -= done;
}

/* One reaped iocb: done, resubmitted for the rest (short, EAGAIN, EINTR), the end of the
 * file (a read), or the run's error. */
static void complete(run_t *s, tr__aio_slot_t *slot, long got)
{
    int retry = got == -EAGAIN || got == -EINTR;
    if (retry && !s->res->err) {
        prep(s, slot, slot->buf, slot->len, slot->off);
        return;
    }
    if (!retry && got < 0) fail(s, (int)got, slot->off, slot->len);
    if (got < 0 || (size_t)got >= slot->len || s->res->err) {
        release(s, slot);
        return;
    }
    uint64_t at = slot->off + (uint64_t)got;
    /* The kernel shortens an O_DIRECT read only at the end of the file; its tail is then
     * unaligned and cannot be asked for again. */
    if (!s->r->write && (got == 0 || at % s->r->align)) {
        if (at < s->res->end) s->res->end = at;
        release(s, slot);
    } else if (got == 0) {
        fail(s, -EIO, slot->off, slot->len); /* a write that moves nothing would never end */
        release(s, slot);
    } else {
        prep(s, slot, slot->buf + got, slot->len - (size_t)got, at);
    }
}

/* Waits for at least min_nr completions and handles them. */
static void reap(run_t *s, int min_nr)
{
    int n = io_getevents(s->c->io, min_nr, s->inflight, s->c->events, NULL);
    if (n == -EINTR || n == -EAGAIN) return;
    if (n < 0) { /* EFAULT/EINVAL: our bug; the in-flight iocbs cannot be found again */
        fail(s, n, s->r->off, s->r->len);
        s->inflight = 0;
        return;
    }
    s->inflight -= n;
    for (int i = 0; i < n; i++)
        complete(s, s->c->events[i].data, (long)s->c->events[i].res);
}

static void nap(void)
{
    struct timespec ts = {0, EAGAIN_SLEEP_NS};
    nanosleep(&ts, NULL);
}

static int run_libaio(tr__aio_ctx_t *c, const tr__aio_range_t *r, tr__aio_result_t *res)
{
    run_t s = {.c = c, .r = r, .res = res};
    for (int i = 0; i < c->depth; i++)
        c->free[s.nfree++] = i;
    int refused = 0;
    for (;;) {
        if (res->err)
            drop_pending(&s);
        else if (c->overlap_events || (s.inflight == 0 && s.npending == 0))
            fill(&s);
        int before = s.inflight;
        if (s.npending) submit(&s);
        if (res->err) drop_pending(&s);
        if (s.inflight == 0) {
            if (s.npending == 0) break;
            if (++refused > EAGAIN_TRIES) {
                tr__aio_slot_t *slot = c->pending[0]->data;
                fail(&s, -EAGAIN, slot->off, slot->len);
                continue;
            }
            nap();
            continue;
        }
        if (s.inflight > before) refused = 0;
        reap(&s, c->overlap_events ? 1 : s.inflight);
    }
    return res->err;
}

/* pread/pwrite for a file system without O_DIRECT: the same range, completed through short
 * transfers, EINTR and EAGAIN. */
static int run_posix(const tr__aio_range_t *r, tr__aio_result_t *res)
{
    size_t done = 0;
    while (done < r->len) {
        ssize_t n = r->write ? pwrite(r->fd, r->buf + done, r->len - done, (off_t)(r->off + done))
                             : pread(r->fd, r->buf + done, r->len - done, (off_t)(r->off + done));
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0 || (n == 0 && r->write)) {
            res->err = n < 0 ? -errno : -EIO;
            res->err_off = r->off + done;
            res->err_len = r->len - done;
            break;
        }
        if (n == 0) {
            res->end = r->off + done;
            break;
        }
        done += (size_t)n;
    }
    return res->err;
}

int tr__aio_xfer_run(tr__aio_ctx_t *c, const tr__aio_range_t *r, tr__aio_result_t *res)
{
    memset(res, 0, sizeof *res);
    res->end = r->off + r->len;
    if (r->len == 0) return 0;
    return r->direct ? run_libaio(c, r, res) : run_posix(r, res);
}
