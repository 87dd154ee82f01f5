/* comm: the communication backend interface the comm actor drives.
 *
 * A backend reduces, gathers and broadcasts buffers among the ranks of a data-parallel group.
 * Operations are started with a request id and completed through `test`, so an asynchronous
 * engine (MPI non-blocking collectives, NCCL on a stream) is polled by the comm actor and its
 * completions become messages; a synchronous backend completes at once. The local backend is
 * world size 1. MPI and NCCL backends implement the same operations.
 */
#ifndef TR_RUNTIME_COMM_H
#define TR_RUNTIME_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "troupe/types.h"

typedef struct tr_comm tr_comm_t;

typedef struct tr_comm_ops {
    const char *name;
    /* In place: buf (count elements of dt) becomes the element-wise mean over the ranks. */
    int (*all_reduce_mean)(tr_comm_t *c, void *buf, size_t count, tr_dtype_t dt, uint64_t *req);
    /* send (count * world elements) -> recv (count elements): this rank's part of the sum. */
    int (*reduce_scatter)(tr_comm_t *c, const void *send, void *recv, size_t count, tr_dtype_t dt,
                          uint64_t *req);
    /* send (count elements) -> recv (count * world elements), rank order. */
    int (*all_gather)(tr_comm_t *c, const void *send, void *recv, size_t count, tr_dtype_t dt,
                      uint64_t *req);
    /* *done = 1 when request req has completed. */
    int (*test)(tr_comm_t *c, uint64_t req, int *done);
    void (*destroy)(tr_comm_t *c);
} tr_comm_ops_t;

struct tr_comm {
    const tr_comm_ops_t *ops;
    int rank, world;
    void *impl;
};

/* The backend named `name` ("local"), for this process's rank and world size. TR_ENOTSUP for
 * a backend this build lacks; TR_EINVAL when the local backend is asked for world > 1. */
int tr_comm_create(const char *name, int rank, int world, tr_comm_t **out);
void tr_comm_destroy(tr_comm_t *c);

#endif
