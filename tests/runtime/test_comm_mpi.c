/* The "mpi" comm backend, run by mpirun on 1, 2 and 4 ranks: each collective gives on every
 * rank what the same collective computed by hand from every rank's inputs gives, its
 * completion comes through progress with the request id and the tag it started with, several
 * operations may be pending at once, and bad arguments are refused on every rank alike
 * before MPI is called. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/comm.h"
#include "runtime/ranks.h"
#include "troupe.h"

#define N 1000 /* elements per rank */

typedef struct log {
    int n;
    uint64_t reqs[16], tags[16];
} log_t;

static void on_done(void *arg, uint64_t req, uint64_t tag, int rc)
{
    log_t *l = arg;
    assert_int_equal(rc, 0);
    l->reqs[l->n] = req;
    l->tags[l->n++] = tag;
}

static tr_comm_t *comm;
static log_t done_log;

/* Progresses until every pending operation has completed. */
static void finish(void)
{
    int pending;
    while ((pending = comm->ops->progress(comm)) > 0)
        ;
    assert_int_equal(pending, 0);
}

static void test_comm_mpi_collectives_match_the_hand_computed_ones(void **state)
{
    (void)state;
    int r = comm->rank, w = comm->world;
    float *sum = malloc(N * sizeof(float)), *max = malloc(N * sizeof(float));
    float *send = malloc((size_t)N * (size_t)w * sizeof(float)), *part = malloc(N * sizeof(float));
    float *all = malloc((size_t)N * (size_t)w * sizeof(float)), *bc = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) {
        sum[i] = (float)(r + i);
        max[i] = (float)((r * 7 + i) % 11);
        bc[i] = (float)(r * 100 + i);
    }
    for (int i = 0; i < N * w; i++)
        send[i] = (float)(r * 3 + i % 17);
    double scalar = 1.5 * r;
    uint64_t q[6];
    log_t before = done_log;
    comm->op_tag = 41; /* all six pending at once, tags travel with them */
    assert_int_equal(comm->ops->all_reduce(comm, sum, N, TR_DTYPE_F32, TR_REDUCE_SUM, &q[0]), 0);
    assert_int_equal(comm->ops->all_reduce(comm, max, N, TR_DTYPE_F32, TR_REDUCE_MAX, &q[1]), 0);
    assert_int_equal(comm->ops->reduce_scatter(comm, send, part, N, TR_DTYPE_F32, &q[2]), 0);
    assert_int_equal(comm->ops->all_gather(comm, bc, all, N, TR_DTYPE_F32, &q[3]), 0);
    comm->op_tag = 42;
    assert_int_equal(comm->ops->broadcast(comm, bc, N, TR_DTYPE_F32, w - 1, &q[4]), 0);
    assert_int_equal(tr_comm_all_reduce_scalar(comm, &scalar, TR_REDUCE_MAX, &q[5]), 0);
    finish();
    assert_int_equal(done_log.n - before.n, 6);
    for (int k = before.n; k < done_log.n; k++) {
        int found = 0;
        for (int j = 0; j < 6; j++)
            if (done_log.reqs[k] == q[j]) {
                found = 1;
                assert_int_equal(done_log.tags[k], j < 4 ? 41 : 42);
            }
        assert_true(found);
    }
    for (int i = 0; i < N; i++) {
        assert_true(sum[i] == (float)(w * i + w * (w - 1) / 2));
        float m = 0;
        for (int k = 0; k < w; k++)
            m = (float)((k * 7 + i) % 11) > m ? (float)((k * 7 + i) % 11) : m;
        assert_true(max[i] == m);
        float p = 0; /* rank r's part: element r*N+i of every rank's send, summed */
        for (int k = 0; k < w; k++)
            p += (float)(k * 3 + (r * N + i) % 17);
        assert_true(part[i] == p);
        for (int k = 0; k < w; k++) /* the gather was started before the broadcast */
            assert_true(all[k * N + i] == (float)(k * 100 + i));
        assert_true(bc[i] == (float)((w - 1) * 100 + i));
    }
    assert_true(scalar == 1.5 * (w - 1));
    free(sum), free(max), free(send), free(part), free(all), free(bc);
}

/* Uneven parts gathered in place: 10 floats over the ranks in slices of ceil(10 / W). */
static void test_comm_mpi_all_gather_v_in_place(void **state)
{
    (void)state;
    int r = comm->rank, w = comm->world;
    size_t n = 10, S = (n + (size_t)w - 1) / (size_t)w, counts[8];
    float buf[10];
    for (int k = 0; k < w; k++)
        counts[k] = (size_t)k * S >= n ? 0 : ((size_t)k + 1) * S <= n ? S : n - (size_t)k * S;
    for (size_t i = 0; i < n; i++)
        buf[i] = i / S == (size_t)r ? (float)(100 * r + (int)i) : -1.0f; /* ours; others junk */
    uint64_t req;
    assert_int_equal(comm->ops->all_gather_v(comm, buf, counts, TR_DTYPE_F32, &req), 0);
    finish();
    for (size_t i = 0; i < n; i++)
        assert_true(buf[i] == (float)(100 * (int)(i / S) + (int)i));
}

/* Uneven parts summed in place (ZeRO 2's bucket): rank k's part has k + 2 floats, except the
 * last rank's, which is empty; the result lands at the start of the buffer. */
static void test_comm_mpi_reduce_scatter_v_in_place(void **state)
{
    (void)state;
    int r = comm->rank, w = comm->world;
    size_t counts[8], total = 0, mine_at = 0;
    for (int k = 0; k < w; k++) {
        counts[k] = w > 1 && k == w - 1 ? 0 : (size_t)k + 2;
        if (k < r) mine_at += counts[k];
        total += counts[k];
    }
    float buf[64];
    for (size_t i = 0; i < total; i++)
        buf[i] = (float)(r + 1) * (float)i; /* summed: i * w (w + 1) / 2 */
    uint64_t req;
    assert_int_equal(comm->ops->reduce_scatter_v(comm, buf, counts, TR_DTYPE_F32, &req), 0);
    finish();
    for (size_t i = 0; i < counts[r]; i++)
        assert_true(buf[i] == (float)(mine_at + i) * (float)(w * (w + 1) / 2));
}

static void test_comm_mpi_refuses_bad_arguments_before_mpi(void **state)
{
    (void)state;
    float x[4] = {0};
    uint64_t req;
    assert_int_equal(comm->ops->broadcast(comm, x, 4, TR_DTYPE_F32, comm->world, &req), TR_EINVAL);
    assert_non_null(strstr(comm->error, "root"));
    assert_int_equal(comm->ops->all_reduce(comm, x, 4, TR_DTYPE_BF16, TR_REDUCE_SUM, &req),
                     TR_ENOTSUP);
    assert_non_null(strstr(comm->error, "is not supported on the wire yet"));
    assert_int_equal(comm->ops->progress(comm), 0); /* nothing was started */
}

static int setup(void **state)
{
    (void)state;
    tr_ranks_t ranks;
    char why[256];
    if (tr_ranks_discover(NULL, &ranks, why, sizeof(why)) < 0 ||
        tr_comm_create("mpi", ranks.rank, ranks.world, on_done, &done_log, &comm, why,
                       sizeof(why)) < 0) {
        fprintf(stderr, "test_comm_mpi: %s\n", why);
        return -1;
    }
    printf("rank %d of %d (%s)\n", ranks.rank, ranks.world, ranks.source);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tr_comm_destroy(comm);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_comm_mpi_collectives_match_the_hand_computed_ones),
        cmocka_unit_test(test_comm_mpi_all_gather_v_in_place),
        cmocka_unit_test(test_comm_mpi_reduce_scatter_v_in_place),
        cmocka_unit_test(test_comm_mpi_refuses_bad_arguments_before_mpi),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
