/* The comm backends' registry and the local backend: operations are non-blocking and report
 * completion through the done callback with the request id they returned; reductions and
 * broadcasts check their arguments; a backend this build lacks, or the local backend asked for
 * more than one rank, is refused with a sentence naming what exists; a registered backend is
 * found by name; point-to-point messages from rank 0 to itself match by tag in either order;
 * a split gives a group of one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/comm/comm.h"
#include "troupe.h"

typedef struct done_log {
    int n;
    uint64_t last_req, last_tag;
    int last_rc;
} done_log_t;

static void on_done(void *arg, uint64_t req, uint64_t tag, int rc)
{
    done_log_t *d = arg;
    d->n++;
    d->last_req = req;
    d->last_tag = tag;
    d->last_rc = rc;
}

static void test_comm_local_operations_complete_through_the_callback(void **state)
{
    (void)state;
    done_log_t log = {0};
    tr_comm_t *c;
    char why[256];
    assert_int_equal(tr_comm_create("local", 0, 1, on_done, &log, &c, why, sizeof(why)), 0);
    float buf[4] = {1, -2, 3.5f, 4};
    uint64_t req;
    c->op_tag = 52; /* the caller's tag (the comm actor's step) comes back with the completion */
    assert_int_equal(c->ops->all_reduce(c, buf, 4, TR_DTYPE_F32, TR_REDUCE_SUM, &req), 0);
    assert_int_equal(log.n, 1);
    assert_int_equal(log.last_req, req);
    assert_int_equal(log.last_tag, 52);
    assert_int_equal(log.last_rc, 0);
    assert_true(buf[2] == 3.5f); /* the sum over one rank is the value: no scaling */
    uint64_t req2;
    assert_int_equal(c->ops->all_reduce(c, buf, 4, TR_DTYPE_F32, TR_REDUCE_MAX, &req2), 0);
    assert_true(req2 > req); /* ids are unique */
    double v = 2.5;
    assert_int_equal(tr_comm_all_reduce_scalar(c, &v, TR_REDUCE_MAX, &req), 0);
    assert_true(v == 2.5);
    float out[4];
    assert_int_equal(c->ops->reduce_scatter(c, buf, out, 4, TR_DTYPE_F32, &req), 0);
    assert_memory_equal(out, buf, sizeof(out));
    assert_int_equal(c->ops->all_gather(c, buf, out, 4, TR_DTYPE_F32, &req), 0);
    assert_int_equal(c->ops->broadcast(c, buf, 4, TR_DTYPE_F32, 0, &req), 0);
    assert_int_equal(log.n, 6);
    /* bad arguments: refused before starting, no completion */
    assert_int_equal(c->ops->broadcast(c, buf, 4, TR_DTYPE_F32, 1, &req), TR_EINVAL);
    assert_int_equal(c->ops->all_reduce(c, buf, 4, TR_DTYPE_F32, (tr_reduce_op_t)7, &req),
                     TR_EINVAL);
    assert_int_equal(c->ops->all_reduce(c, NULL, 4, TR_DTYPE_F32, TR_REDUCE_SUM, &req), TR_EINVAL);
    assert_int_equal(c->ops->all_reduce(c, buf, 4, (tr_dtype_t)99, TR_REDUCE_SUM, &req), TR_EINVAL);
    assert_int_equal(log.n, 6);
    tr_comm_destroy(c);
}

static void test_comm_unknown_backend_and_bad_world_are_named(void **state)
{
    (void)state;
    done_log_t log = {0};
    tr_comm_t *c = NULL;
    char why[256];
    assert_int_equal(tr_comm_create("nccl-ish", 0, 1, on_done, &log, &c, why, sizeof(why)),
                     TR_ENOTSUP);
    assert_null(c);
    assert_non_null(strstr(why, "no comm backend 'nccl-ish' in this build (it has: local"));
    assert_int_equal(tr_comm_create("local", 1, 2, on_done, &log, &c, why, sizeof(why)), TR_EINVAL);
    assert_non_null(strstr(why, "world size 2 needs the mpi backend"));
    assert_int_equal(tr_comm_create("local", 2, 2, on_done, &log, &c, why, sizeof(why)),
                     TR_EINVAL); /* rank outside the world */
}

static void test_comm_local_send_and_recv_match_by_tag_in_either_order(void **state)
{
    (void)state;
    done_log_t log = {0};
    tr_comm_t *c;
    char why[256];
    assert_int_equal(tr_comm_create("local", 0, 1, on_done, &log, &c, why, sizeof(why)), 0);
    int a[3] = {1, 2, 3}, b[3] = {7, 8, 9}, got[4] = {0}, got2[3] = {0};
    uint64_t rs, rr, rr2;
    /* recv first: it waits until a send of its tag starts, then both complete */
    c->op_tag = 5;
    assert_int_equal(c->ops->recv(c, got, 4, TR_DTYPE_I32, 0, 11, &rr), 0);
    assert_int_equal(log.n, 0);
    assert_int_equal(c->ops->send(c, b, 3, TR_DTYPE_I32, 0, 12, &rs), 0); /* another tag */
    assert_int_equal(log.n, 1);                                           /* the send only */
    assert_int_equal(c->ops->send(c, a, 3, TR_DTYPE_I32, 0, 11, &rs), 0);
    assert_int_equal(log.n, 3);
    assert_memory_equal(got, a, sizeof(a));
    assert_int_equal(got[3], 0); /* a shorter message leaves the rest */
    /* send first: buffered, the recv of its tag takes it at once */
    a[0] = 100; /* the send's buffer is free again once it completed */
    assert_int_equal(c->ops->recv(c, got2, 3, TR_DTYPE_I32, TR_COMM_ANY_SOURCE, 12, &rr2), 0);
    assert_int_equal(log.n, 4);
    assert_int_equal(log.last_req, rr2);
    assert_int_equal(log.last_tag, 5);
    assert_memory_equal(got2, b, sizeof(b));
    /* too long for the buffer: the recv completes with an error */
    assert_int_equal(c->ops->send(c, a, 3, TR_DTYPE_I32, 0, 13, &rs), 0);
    assert_int_equal(c->ops->recv(c, got2, 2, TR_DTYPE_I32, 0, 13, &rr), 0);
    assert_int_equal(log.last_rc, TR_EOVERFLOW);
    assert_non_null(strstr(c->error, "a message of 12 bytes for a buffer of 8"));
    /* bad peers and tags are refused before anything starts */
    int n = log.n;
    assert_int_equal(c->ops->send(c, a, 3, TR_DTYPE_I32, 1, 0, &rs), TR_EINVAL);
    assert_non_null(strstr(c->error, "send: bad peer"));
    assert_non_null(strstr(c->error, "dtype i32 (4)")); /* named, its number beside */
    assert_int_equal(c->ops->send(c, a, 3, TR_DTYPE_I32, TR_COMM_ANY_SOURCE, 0, &rs), TR_EINVAL);
    assert_int_equal(c->ops->recv(c, got, 3, TR_DTYPE_I32, 0, -1, &rr), TR_EINVAL);
    assert_non_null(strstr(c->error, "recv: bad tag"));
    assert_int_equal(log.n, n);
    assert_int_equal(c->ops->recv(c, got, 3, TR_DTYPE_I32, 0, 14, &rr), 0); /* never matched: */
    tr_comm_destroy(c);                                                     /* dropped */
}

static void test_comm_local_split_is_a_group_of_one(void **state)
{
    (void)state;
    done_log_t log = {0};
    tr_comm_t *c, *sub;
    char why[256];
    assert_int_equal(tr_comm_create("local", 0, 1, on_done, &log, &c, why, sizeof(why)), 0);
    assert_int_equal(tr_comm_split(c, -1, 0, &sub, why, sizeof(why)), TR_EINVAL);
    assert_non_null(strstr(why, "split: color -1"));
    assert_int_equal(tr_comm_split(c, 3, 0, &sub, why, sizeof(why)), 0);
    assert_int_equal(sub->rank, 0);
    assert_int_equal(sub->world, 1);
    uint16_t h[2] = {0x3f80, 0x4000}; /* bf16 1 and 2: the sum over one rank is the value */
    uint64_t req;
    assert_int_equal(sub->ops->all_reduce(sub, h, 2, TR_DTYPE_BF16, TR_REDUCE_SUM, &req), 0);
    assert_int_equal(req, 1);   /* its own request ids */
    assert_int_equal(log.n, 1); /* the parent's callback */
    assert_true(h[0] == 0x3f80 && h[1] == 0x4000);
    tr_comm_destroy(c); /* either order */
    tr_comm_destroy(sub);
}

/* A backend of the test's own: a group of any size whose operations complete at once. */
static int fake_all_reduce(tr_comm_t *c, void *buf, size_t n, tr_dtype_t dt, tr_reduce_op_t op,
                           uint64_t *req)
{
    int rc = tr_comm_check(c, buf, n, dt, (int)op, 0);
    if (rc < 0) return rc;
    *req = tr_comm_next_req(c);
    c->done(c->done_arg, *req, c->op_tag, TR_ECOMM); /* and reports a failure */
    return 0;
}

static void fake_destroy(tr_comm_t *c)
{
    free(c);
}

static const tr_comm_ops_t fake_ops = {.all_reduce = fake_all_reduce, .destroy = fake_destroy};

static int fake_create(tr_comm_t *c, char *why, size_t whylen)
{
    (void)why;
    (void)whylen;
    c->ops = &fake_ops;
    return 0;
}

static void test_comm_registered_backend_is_found_by_name(void **state)
{
    (void)state;
    assert_int_equal(tr_comm_backend_register("fake", fake_create), 0);
    assert_int_equal(tr_comm_backend_register("fake", fake_create), TR_EEXIST);
    assert_int_equal(tr_comm_backend_register("local", fake_create), TR_EEXIST);
    done_log_t log = {0};
    tr_comm_t *c;
    char why[256];
    assert_int_equal(tr_comm_create("fake", 3, 4, on_done, &log, &c, why, sizeof(why)), 0);
    assert_int_equal(c->world, 4);
    assert_int_equal(c->rank, 3);
    float x = 1;
    uint64_t req;
    assert_int_equal(c->ops->all_reduce(c, &x, 1, TR_DTYPE_F32, TR_REDUCE_SUM, &req), 0);
    assert_int_equal(log.last_rc, TR_ECOMM); /* a failure arrives as a completion */
    tr_comm_destroy(c);
    assert_int_equal(tr_comm_create("nope", 0, 1, on_done, &log, &c, why, sizeof(why)), TR_ENOTSUP);
    assert_non_null(strstr(why, "(it has: local"));
    assert_non_null(strstr(why, " fake)")); /* the last registered, after any built in */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_comm_local_operations_complete_through_the_callback),
        cmocka_unit_test(test_comm_unknown_backend_and_bad_world_are_named),
        cmocka_unit_test(test_comm_registered_backend_is_found_by_name),
        cmocka_unit_test(test_comm_local_send_and_recv_match_by_tag_in_either_order),
        cmocka_unit_test(test_comm_local_split_is_a_group_of_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
