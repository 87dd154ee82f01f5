/* Troupe's asynchronous file I/O engine: libaio with O_DIRECT, to DeepNVMe's semantics.
 *
 * An engine owns intra_op_parallelism I/O threads, each with its own libaio context. Every
 * request (one pread or pwrite of `size` bytes) is cut into intra_op_parallelism equal slices,
 * one per thread; each thread cuts its slice into block_size iocbs and keeps at most
 * queue_depth of them in flight, either as a sliding window refilled as completions arrive
 * (overlap_events) or in lock-step batches, submitting them one io_submit per iocb
 * (single_submit) or one per batch. These are the keys of the config's `aio` section.
 *
 * Alignment comes from statx (STATX_DIOALIGN) per file, else 4096 bytes. Buffers from
 * tr_aio_buffer_alloc are page-aligned and locked in memory. A request whose buffer address,
 * offset or size is not aligned still works: reads and unaligned-address writes go through a
 * bounce buffer; writes at an unaligned offset or of an unaligned size go through the page
 * cache (see docs/io.md for why). A file system that refuses O_DIRECT is used through
 * pread/pwrite on the I/O threads, with one warning.
 *
 * Completions: each asynchronous request's callback runs on the thread that calls
 * tr_aio_poll, tr_aio_wait or tr_aio_destroy, never on an I/O thread. tr_aio_fd is an eventfd
 * that becomes readable when completions are waiting, for a poller (tr_poll_start in an
 * actor): nobody busy-waits.
 *
 * Errors: 0 or a negative TR_E* code (libaio's -errno pass through). A failed request's `why`
 * names the operation, the file, the offset and the size.
 */
#ifndef TR_INCLUDE_TROUPE_AIO_H
#define TR_INCLUDE_TROUPE_AIO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_aio tr_aio_t;
typedef struct tr_aio_file tr_aio_file_t;

/* The `aio` config section's knobs (the defaults are the config's). */
typedef struct tr_aio_options {
    size_t block_size;        /* bytes per iocb: a multiple of each file's alignment */
    int queue_depth;          /* iocbs in flight per I/O thread, >= 1 */
    int intra_op_parallelism; /* I/O threads; every request's size must divide by it */
    int single_submit;        /* 1: one io_submit per iocb; 0: one per batch */
    int overlap_events;       /* 1: sliding window; 0: lock-step batches */
} tr_aio_options_t;

/* A finished request: status 0 (every byte moved) or a negative TR_E* code, and `why` (""
 * on success) naming the operation, file, offset and size. Runs on the polling thread. */
typedef void (*tr_aio_cb)(void *user, int status, const char *why);

/* Open flags. */
enum { TR_AIO_READ = 1, TR_AIO_WRITE = 2, TR_AIO_CREATE = 4 };

/* Fills o with the config's defaults (1 MiB blocks, depth 8, 1 thread, batches, window). */
void tr_aio_options_default(tr_aio_options_t *o);

/* tr_aio_options_from_config (troupe/config.h) fills the options from a config's `aio`
 * section. */

/* Starts an engine and its I/O threads. TR_EINVAL for options out of range, an error from
 * io_setup (TR_EAGAIN when /proc/sys/fs/aio-max-nr is reached) or thread creation; why names
 * the option or the call. *out is set only on success. Any thread. */
int tr_aio_create(const tr_aio_options_t *o, tr_aio_t **out, char *why, size_t why_len);

/* Waits for every request, runs the callbacks not yet run, stops the threads and frees the
 * engine. Files must be closed first. NULL does nothing. Not from a callback. Any thread. */
void tr_aio_destroy(tr_aio_t *aio);

/* The engine's intra_op_parallelism: every request's size must divide by it. Any thread. */
int tr_aio_parallelism(const tr_aio_t *aio);

/* Opens path (TR_AIO_READ and/or TR_AIO_WRITE, optionally TR_AIO_CREATE: mode 0600) with
 * O_DIRECT, or without it when the file system refuses O_DIRECT (one warning per engine).
 * Reads its alignment. Errors from open as -errno; TR_EINVAL when block_size is not a
 * multiple of the file's alignment. Any thread. */
int tr_aio_open(tr_aio_t *aio, const char *path, int flags, tr_aio_file_t **out, char *why,
                size_t why_len);

/* Closes a file; no request on it may be in flight. NULL does nothing. Any thread. */
void tr_aio_close(tr_aio_file_t *f);

/* 1 if the file is read and written with O_DIRECT, 0 if through pread/pwrite. */
int tr_aio_file_direct(const tr_aio_file_t *f);

/* The file's offset and size alignment for O_DIRECT (bytes; 1 when not direct). */
size_t tr_aio_file_alignment(const tr_aio_file_t *f);

/* Starts reading size bytes at offset into buf (or writing them from buf); cb(user, ...)
 * runs later on the polling thread. buf must stay valid until then. TR_EINVAL, with why,
 * when size does not divide by intra_op_parallelism or the file lacks the access; the
 * callback then never runs. A read past the end of the file completes with TR_ERANGE.
 * Any thread. */
int tr_aio_pread(tr_aio_t *aio, tr_aio_file_t *f, void *buf, size_t size, uint64_t offset,
                 tr_aio_cb cb, void *user, char *why, size_t why_len);
int tr_aio_pwrite(tr_aio_t *aio, tr_aio_file_t *f, const void *buf, size_t size, uint64_t offset,
                  tr_aio_cb cb, void *user, char *why, size_t why_len);

/* As above, blocking the caller (on a condition variable) until the request is done;
 * returns its status, why naming the file, offset and size on failure. Any thread. */
int tr_aio_pread_sync(tr_aio_t *aio, tr_aio_file_t *f, void *buf, size_t size, uint64_t offset,
                      char *why, size_t why_len);
int tr_aio_pwrite_sync(tr_aio_t *aio, tr_aio_file_t *f, const void *buf, size_t size,
                       uint64_t offset, char *why, size_t why_len);

/* The eventfd that is readable while finished requests wait for tr_aio_poll. Owned by the
 * engine. Any thread. */
int tr_aio_fd(const tr_aio_t *aio);

/* Runs the callbacks of the requests finished so far, without blocking; returns how many.
 * One thread at a time. */
int tr_aio_poll(tr_aio_t *aio);

/* Blocks until no asynchronous request is in flight, then runs their callbacks; returns how
 * many ran. One thread at a time, not from a callback. */
int tr_aio_wait(tr_aio_t *aio);

/* Allocates size bytes aligned to the page size and locked in memory (mlock). When locking
 * fails (RLIMIT_MEMLOCK), the buffer is returned unlocked with one warning per engine.
 * TR_ENOMEM when there is no memory. Free with tr_aio_buffer_free. Any thread. */
int tr_aio_buffer_alloc(tr_aio_t *aio, size_t size, void **out);
void tr_aio_buffer_free(tr_aio_t *aio, void *p, size_t size);

#ifdef __cplusplus
}
#endif
#endif
