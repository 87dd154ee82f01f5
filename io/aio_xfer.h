/* aio_xfer.h: one I/O thread's share of a request, moved with libaio (O_DIRECT) or with
 * pread/pwrite. Private to io/aio*.c.
 *
 * A context is one libaio io_context_t with queue_depth iocb slots. tr__aio_xfer_run cuts a
 * contiguous range into block_size iocbs and keeps up to queue_depth in flight: a sliding
 * window refilled after every reap (overlap_events) or lock-step batches that are reaped
 * whole before the next is prepared; one io_submit per iocb (single_submit) or per batch.
 * Short completions are resubmitted for the rest, EAGAIN and EINTR (from io_submit,
 * io_getevents or an iocb's result) are retried, and the first other error stops the
 * range: in-flight iocbs are reaped, then the error is returned with the failing iocb's
 * offset and size. Blocking waits are io_getevents with min_nr >= 1: no spinning.
 */
#ifndef TR_IO_AIO_XFER_H
#define TR_IO_AIO_XFER_H

#include <libaio.h>
#include <stddef.h>
#include <stdint.h>

#include "troupe/aio.h"

typedef struct tr__aio_slot tr__aio_slot_t;

typedef struct tr__aio_ctx {
    io_context_t io;
    int depth;
    size_t block_size;
    int single_submit;
    int overlap_events;
    tr__aio_slot_t *slots;   /* depth */
    struct iocb **pending;   /* prepared, not yet submitted (depth) */
    struct io_event *events; /* depth */
    int *free;               /* stack of free slot indices (depth) */
} tr__aio_ctx_t;

/* One contiguous range of a file and of memory. */
typedef struct tr__aio_range {
    int write; /* 0: read into buf; 1: write from buf */
    int fd;
    int direct;   /* 1: libaio on an O_DIRECT fd; 0: pread/pwrite */
    size_t align; /* the file's offset alignment when direct */
    char *buf;
    size_t len;
    uint64_t off;
} tr__aio_range_t;

typedef struct tr__aio_result {
    int err;          /* 0 or -errno */
    uint64_t err_off; /* the failing operation's offset and size */
    size_t err_len;
    uint64_t end; /* a read: the offset where the file ended, or off + len */
} tr__aio_result_t;

/* io_setup and the slot arrays. -errno from io_setup (-EAGAIN: aio-max-nr reached),
 * -ENOMEM. Any thread; the context then belongs to one thread at a time. */
int tr__aio_ctx_init(tr__aio_ctx_t *c, const tr_aio_options_t *o);
void tr__aio_ctx_close(tr__aio_ctx_t *c);

/* Moves r's bytes (see the top of this file). Returns r->err's value. The context's thread. */
int tr__aio_xfer_run(tr__aio_ctx_t *c, const tr__aio_range_t *r, tr__aio_result_t *res);

#endif
