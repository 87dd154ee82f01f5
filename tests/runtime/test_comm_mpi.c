/* The "mpi" comm backend, run by mpirun on 1, 2 and 4 ranks: each collective gives on every
 * rank what the same collective computed by hand from every rank's inputs gives, its
 * completion comes through progress with the request id and the tag it started with, several
 * operations may be pending at once, and bad arguments are refused on every rank alike
 * before MPI is called. Point-to-point messages go round a ring and to rank 0 from any rank;
 * fp16 and bf16 sums and maxima give the hand-computed values (exact ones, and the rounding of
 * a sum of two ranks checked against the scalar conversion and against ties-to-even by hand);
 * a split into groups of the even and the odd ranks all-reduces within each group. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/half.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/ranks.h"
#include "troupe.h"

#define N 1000 /* elements per rank */

typedef struct log {
    int n;
    uint64_t reqs[256], tags[256];
} log_t;

static void on_done(void *arg, uint64_t req, uint64_t tag, int rc)
{
    log_t *l = arg;
    assert_int_equal(rc, 0);
    assert_true(l->n < 256);
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
    free(sum);
    free(max);
    free(send);
    free(part);
    free(all);
    free(bc);
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
    assert_int_equal(comm->ops->send(comm, x, 4, TR_DTYPE_F32, comm->world, 0, &req), TR_EINVAL);
    assert_non_null(strstr(comm->error, "send: bad peer"));
    assert_int_equal(comm->ops->recv(comm, x, 4, TR_DTYPE_F32, 0, TR_COMM_TAG_MAX + 1, &req),
                     TR_EINVAL);
    assert_int_equal(comm->ops->progress(comm), 0); /* nothing was started */
}

/* Each rank sends to the next and receives from the previous; every rank but 0 also sends
 * its rank to 0, which receives them from any source. */
static void test_comm_mpi_send_recv_round_a_ring(void **state)
{
    (void)state;
    int r = comm->rank, w = comm->world;
    double out[N], in[N];
    for (int i = 0; i < N; i++) {
        out[i] = r * 1000.0 + i;
        in[i] = -1;
    }
    uint64_t q[2];
    log_t before = done_log;
    assert_int_equal(comm->ops->recv(comm, in, N, TR_DTYPE_F64, (r + w - 1) % w, 3, &q[0]), 0);
    assert_int_equal(comm->ops->send(comm, out, N, TR_DTYPE_F64, (r + 1) % w, 3, &q[1]), 0);
    finish();
    assert_int_equal(done_log.n - before.n, 2);
    for (int i = 0; i < N; i++)
        assert_true(in[i] == ((r + w - 1) % w) * 1000.0 + i);
    int32_t mine = r, got[8] = {0}, seen = 0;
    if (r == 0)
        for (int k = 1; k < w; k++)
            assert_int_equal(
                comm->ops->recv(comm, &got[k], 1, TR_DTYPE_I32, TR_COMM_ANY_SOURCE, 4, &q[0]), 0);
    else
        assert_int_equal(comm->ops->send(comm, &mine, 1, TR_DTYPE_I32, 0, 4, &q[1]), 0);
    finish();
    for (int k = 1; r == 0 && k < w; k++)
        seen |= 1 << got[k];
    if (r == 0) assert_int_equal(seen, ((1 << w) - 1) & ~1);
}

typedef uint16_t (*from_fn)(float);
typedef float (*to_fn)(uint16_t);

/* Exact values (small integers, sums below 2^8) summed and maximised in dt, all-reduced and
 * reduce-scattered. */
static void check_exact(tr_dtype_t dt, from_fn from, to_fn to)
{
    int r = comm->rank, w = comm->world;
    uint16_t sum[N], max[N], send[N * 4], part[N];
    for (int i = 0; i < N; i++) {
        sum[i] = from((float)(i % 16 + r));
        max[i] = from((float)((r * 7 + i) % 11) - 5.0f);
    }
    for (int i = 0; i < N * w; i++)
        send[i] = from((float)(r * 3 + i % 17));
    uint64_t q;
    assert_int_equal(comm->ops->all_reduce(comm, sum, N, dt, TR_REDUCE_SUM, &q), 0);
    assert_int_equal(comm->ops->all_reduce(comm, max, N, dt, TR_REDUCE_MAX, &q), 0);
    assert_int_equal(comm->ops->reduce_scatter(comm, send, part, N, dt, &q), 0);
    finish();
    for (int i = 0; i < N; i++) {
        assert_true(to(sum[i]) == (float)(w * (i % 16) + w * (w - 1) / 2));
        float m = -100;
        for (int k = 0; k < w; k++)
            m = (float)((k * 7 + i) % 11) - 5.0f > m ? (float)((k * 7 + i) % 11) - 5.0f : m;
        assert_true(to(max[i]) == m);
        float p = 0;
        for (int k = 0; k < w; k++)
            p += (float)(k * 3 + (r * N + i) % 17);
        assert_true(to(part[i]) == p);
    }
}

/* A sum that rounds: ranks 0 and 1 give a and b, the others 0 (so any order of combination
 * rounds once): the result is from(to(a) + to(b)), and the three hand-checked cases are ties
 * to even (down, then up) and a round-up that truncation would miss. */
static void check_rounding(tr_dtype_t dt, from_fn from, to_fn to, const float hand[3][3])
{
    int r = comm->rank, w = comm->world;
    if (w < 2) return;
    enum { M = 515 };
    uint16_t x[M], a[M], b[M];
    unsigned seed = 12345;
    for (int i = 0; i < M; i++) {
        seed = seed * 1103515245u + 12345u;
        a[i] = from(1.0f + (float)(seed >> 8) / (float)(1u << 24)); /* [1, 2) */
        seed = seed * 1103515245u + 12345u;
        b[i] = from((float)(seed >> 8) / (float)(1u << 30)); /* small: rounding matters */
    }
    for (int k = 0; k < 3; k++) {
        a[M - 3 + k] = from(hand[k][0]);
        b[M - 3 + k] = from(hand[k][1]);
    }
    for (int i = 0; i < M; i++)
        x[i] = r == 0 ? a[i] : r == 1 ? b[i] : 0;
    uint64_t q;
    assert_int_equal(comm->ops->all_reduce(comm, x, M, dt, TR_REDUCE_SUM, &q), 0);
    finish();
    int rounded = 0;
    for (int i = 0; i < M; i++) {
        assert_int_equal(x[i], from(to(a[i]) + to(b[i])));
        rounded += to(x[i]) != to(a[i]) + to(b[i]);
    }
    assert_true(rounded > M / 2); /* the case is one that rounds */
    for (int k = 0; k < 3; k++)
        assert_true(to(x[M - 3 + k]) == hand[k][2]);
}

static void test_comm_mpi_bf16_and_fp16_reduce_in_fp32_and_round_to_nearest_even(void **state)
{
    (void)state;
    check_exact(TR_DTYPE_BF16, tr_bf16_from_float, tr_bf16_to_float);
    check_exact(TR_DTYPE_F16, tr_half_from_float, tr_half_to_float);
    /* bf16 keeps 7 mantissa bits, fp16 10: a + b, and the sum rounded by hand */
    const float bf[3][3] = {{1.0f, 0x1p-8f, 1.0f},
                            {1.0f + 0x1p-7f, 0x1p-8f, 1.0f + 0x1p-6f},
                            {1.0f, 3 * 0x1p-9f, 1.0f + 0x1p-7f}};
    const float hf[3][3] = {{1.0f, 0x1p-11f, 1.0f},
                            {1.0f + 0x1p-10f, 0x1p-11f, 1.0f + 0x1p-9f},
                            {1.0f, 3 * 0x1p-12f, 1.0f + 0x1p-10f}};
    check_rounding(TR_DTYPE_BF16, tr_bf16_from_float, tr_bf16_to_float, bf);
    check_rounding(TR_DTYPE_F16, tr_half_from_float, tr_half_to_float, hf);
}

/* Groups of the even and the odd ranks (on 4 ranks: two groups of 2), each all-reducing its
 * members' ranks. */
static void test_comm_mpi_split_groups_reduce_among_themselves(void **state)
{
    (void)state;
    int r = comm->rank, w = comm->world;
    tr_comm_t *sub;
    char why[256];
    assert_int_equal(tr_comm_split(comm, r % 2, r, &sub, why, sizeof(why)), 0);
    assert_int_equal(sub->world, (w - r % 2 + 1) / 2);
    assert_int_equal(sub->rank, r / 2);
    double v[2] = {r, 1};
    uint64_t q;
    assert_int_equal(sub->ops->all_reduce(sub, v, 2, TR_DTYPE_F64, TR_REDUCE_SUM, &q), 0);
    int pending;
    while ((pending = sub->ops->progress(sub)) > 0)
        ;
    assert_int_equal(pending, 0);
    double want = 0;
    for (int k = r % 2; k < w; k += 2)
        want += k;
    assert_true(v[0] == want);
    assert_true(v[1] == sub->world);
    tr_comm_destroy(sub);
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
        cmocka_unit_test(test_comm_mpi_send_recv_round_a_ring),
        cmocka_unit_test(test_comm_mpi_bf16_and_fp16_reduce_in_fp32_and_round_to_nearest_even),
        cmocka_unit_test(test_comm_mpi_split_groups_reduce_among_themselves),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
