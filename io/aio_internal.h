/* aio_internal.h: the engine's and a file's state, shared by io/aio.c (requests, threads,
 * completions) and io/aio_file.c (opening files, alignment, buffers). Private to io/. */
#ifndef TR_IO_AIO_INTERNAL_H
#define TR_IO_AIO_INTERNAL_H

#include <pthread.h>

#include "io/aio_xfer.h"
#include "troupe/aio.h"

struct tr_aio_file {
    tr_aio_t *aio;
    int flags;       /* TR_AIO_READ | TR_AIO_WRITE */
    int fd;          /* O_DIRECT when direct */
    int fd_buffered; /* the same file without O_DIRECT: unaligned writes (-1 when !direct) */
    int direct;
    size_t align;     /* offset and size alignment for O_DIRECT (1 when !direct) */
    size_t mem_align; /* buffer address alignment for O_DIRECT (1 when !direct) */
    char path[];
};

typedef struct tr__aio_request tr__aio_request_t;
typedef struct tr__aio_slice tr__aio_slice_t;

/* One I/O thread: its libaio context and its queue of slices (under the engine's mutex). */
typedef struct tr__aio_worker {
    tr_aio_t *aio;
    pthread_t thread;
    int started;
    tr__aio_ctx_t ctx;
    tr__aio_slice_t *head, *tail;
    pthread_cond_t cv; /* a slice was queued, or the engine stops */
} tr__aio_worker_t;

struct tr_aio {
    tr_aio_options_t o;
    int efd;             /* eventfd: readable while done_head is not empty */
    pthread_mutex_t mu;  /* guards everything below and the workers' queues */
    pthread_cond_t done; /* a request finished (sync callers, tr_aio_wait, destroy) */
    int stop;
    int inflight; /* asynchronous requests not yet on the done list */
    tr__aio_request_t *done_head, *done_tail;
    int warned_direct; /* one warning per engine each */
    int warned_mlock;
    int nworkers;
    tr__aio_worker_t workers[];
};

/* Logs msg once per engine: *flag is under aio->mu. Any thread. */
void tr__aio_warn_once(tr_aio_t *aio, int *flag, const char *msg);

#endif
