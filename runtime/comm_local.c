/* comm_local.c: the local backend, a data-parallel group of one. Every collective is the
 * identity (the mean over one rank is the value), and completes at once. */
#include <stdlib.h>
#include <string.h>

#include "runtime/comm.h"
#include "troupe/error.h"

static int local_all_reduce_mean(tr_comm_t *c, void *buf, size_t count, tr_dtype_t dt,
                                 uint64_t *req)
{
    *req = 0;
    return 0;
}

static int local_copy(tr_comm_t *c, const void *send, void *recv, size_t count, tr_dtype_t dt,
                      uint64_t *req)
{
    if (send != recv)
        memmove(recv, send, count * tr_dtype_size(dt));
    *req = 0;
    return 0;
}

static int local_test(tr_comm_t *c, uint64_t req, int *done)
{
    *done = 1;
    return 0;
}

static void local_destroy(tr_comm_t *c)
{
    free(c);
}

static const tr_comm_ops_t local_ops = {"local", local_all_reduce_mean, local_copy, local_copy,
                                        local_test, local_destroy};

int tr_comm_create(const char *name, int rank, int world, tr_comm_t **out)
{
    if (strcmp(name, "local") != 0)
        return TR_ENOTSUP;
    if (world != 1 || rank != 0)
        return TR_EINVAL;
    tr_comm_t *c = calloc(1, sizeof(*c));
    if (!c)
        return TR_ENOMEM;
    *c = (tr_comm_t){&local_ops, rank, world, NULL};
    *out = c;
    return 0;
}

void tr_comm_destroy(tr_comm_t *c)
{
    if (c)
        c->ops->destroy(c);
}
