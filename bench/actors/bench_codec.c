/* bench_codec: what the msgpack codec costs next to a mailbox hop, measured in one run.
 *
 *   bench_codec [iterations] [workers]
 *
 * Prints `name: value unit` lines: tr_msg_encode, tr_msg_decode (including the pooled
 * message it allocates and its free) and both, for a small message (a TR_MSG_TIMER); the same
 * five integers through plain msgpack-c (sbuffer + msgpack_unpack_next) as the anchor; a
 * mailbox hop (two actors ping-ponging, ns per one-way hop); the same ping-pong with an
 * encode and decode on every hop, which is what the hop would cost were the codec on the
 * in-process path; and codec_share_of_hop, the codec's cost in hops. Best of three runs each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include <troupe.h>

#define RUNS 3

static tr_msg_t *timer_msg(tr_runtime_t *rt)
{
    tr_msg_t *m = tr_msg_new(rt, TR_MSG_TIMER);
    tr_msg_timer_t *t = TR_MSG_AS(m, timer);
    t->timer_id = 17;
    t->tag = 0xfeedull;
    t->deadline_ns = 123456789012ull;
    t->fired_ns = 123456790000ull;
    t->count = 3;
    m->sender.id = (1ull << 32) | 5;
    m->receiver.id = (1ull << 32) | 6;
    m->seq = 1000;
    m->flow_id = 77777;
    return m;
}

static double encode_ns(const tr_msg_t *m, long n)
{
    char buf[256];
    size_t len;
    uint64_t t0 = tr_now_ns();
    for (long i = 0; i < n; i++)
        if (tr_msg_encode(m, buf, sizeof(buf), &len) < 0) abort();
    return (double)(tr_now_ns() - t0) / (double)n;
}

static double decode_ns(tr_runtime_t *rt, const char *buf, size_t len, long n)
{
    uint64_t t0 = tr_now_ns();
    for (long i = 0; i < n; i++) {
        tr_msg_t *out;
        if (tr_msg_decode(rt, buf, len, &out, NULL, 0) < 0) abort();
        tr_msg_free(rt, out);
    }
    return (double)(tr_now_ns() - t0) / (double)n;
}

static double round_trip_ns(tr_runtime_t *rt, const tr_msg_t *m, long n)
{
    char buf[256];
    size_t len;
    uint64_t t0 = tr_now_ns();
    for (long i = 0; i < n; i++) {
        tr_msg_t *out;
        if (tr_msg_encode(m, buf, sizeof(buf), &len) < 0 ||
            tr_msg_decode(rt, buf, len, &out, NULL, 0) < 0)
            abort();
        tr_msg_free(rt, out);
    }
    return (double)(tr_now_ns() - t0) / (double)n;
}

/* The anchor: five uints packed as an array with an sbuffer and unpacked to an object. */
static double plain_msgpack_ns(long n)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    uint64_t sum = 0, t0 = tr_now_ns();
    for (long i = 0; i < n; i++) {
        msgpack_sbuffer_clear(&sb);
        msgpack_pack_array(&pk, 5);
        for (int k = 0; k < 5; k++)
            msgpack_pack_uint64(&pk, (uint64_t)i * 1000003u + (uint64_t)k);
        size_t off = 0;
        if (msgpack_unpack_next(&u, sb.data, sb.size, &off) != MSGPACK_UNPACK_SUCCESS) abort();
        sum += u.data.via.array.ptr[4].via.u64;
    }
    double ns = (double)(tr_now_ns() - t0) / (double)n;
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    return sum ? ns : ns; /* sum keeps the loop honest */
}

/* --- the hop -------------------------------------------------------------------------- */

typedef struct player {
    long limit;
    int codec; /* encode and decode every message received */
    tr_actor_t partner;
    uint64_t t0, t1;
} player_t;

/* Sends a timer message carrying count to `to`; with codec, what arrives is first encoded
 * and decoded, as if it had crossed a process boundary. */
static int serve(tr_ctx_t *ctx, tr_actor_t to, uint64_t count)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_TIMER);
    if (!m) return TR_ENOMEM;
    TR_MSG_AS(m, timer)->count = count;
    int rc = tr_actor_send(ctx->rt, to, m);
    if (rc < 0) tr_msg_free(ctx->rt, m);
    return rc;
}

static int play(tr_ctx_t *ctx, tr_msg_t *msg)
{
    player_t *p = ctx->state;
    uint64_t count = TR_MSG_AS(msg, timer)->count;
    if (p->codec) {
        char buf[256];
        size_t len;
        tr_msg_t *copy;
        int rc = tr_msg_encode(msg, buf, sizeof(buf), &len);
        if (rc < 0 || (rc = tr_msg_decode(ctx->rt, buf, len, &copy, NULL, 0)) < 0) return rc;
        count = TR_MSG_AS(copy, timer)->count;
        tr_msg_free(ctx->rt, copy);
    }
    if ((long)count >= p->limit) {
        p->t1 = tr_now_ns();
        tr_actor_stop(ctx->rt, p->partner);
        return tr_actor_stop(ctx->rt, ctx->self);
    }
    return serve(ctx, p->partner, count + 1);
}

/* ns per one-way hop over hops messages between two actors. */
static double hop_ns(long hops, unsigned workers, int codec)
{
    tr_runtime_t *rt;
    tr_runtime_opts_t opts = {.n_workers = workers};
    if (tr_runtime_init(&rt, &opts) < 0) abort();
    player_t a = {.limit = hops, .codec = codec}, b = a;
    tr_actor_t pa, pb;
    if (tr_actor_spawn(rt, play, &b, NULL, &pb) < 0) abort();
    a.partner = pb;
    if (tr_actor_spawn(rt, play, &a, NULL, &pa) < 0) abort();
    b.partner = pa;
    tr_msg_t *first = tr_msg_new(rt, TR_MSG_TIMER);
    a.t0 = b.t0 = tr_now_ns();
    if (tr_actor_send(rt, pb, first) < 0) abort();
    tr_runtime_run(rt);
    tr_runtime_close(rt);
    uint64_t end = a.t1 > b.t1 ? a.t1 : b.t1;
    return (double)(end - a.t0) / (double)hops;
}

static double best(double a, double b)
{
    return a < b ? a : b;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    unsigned workers = argc > 2 ? (unsigned)atoi(argv[2]) : 1;
    tr_runtime_t *rt;
    tr_runtime_opts_t opts = {.n_workers = 1};
    if (n <= 0 || tr_runtime_init(&rt, &opts) < 0) return 2;
    tr_msg_t *m = timer_msg(rt);
    char buf[256];
    size_t len;
    if (tr_msg_encode(m, buf, sizeof(buf), &len) < 0) return 1;
    double enc = 1e30, dec = 1e30, both = 1e30, plain = 1e30, hop = 1e30, hop_codec = 1e30;
    for (int r = 0; r < RUNS; r++) {
        enc = best(enc, encode_ns(m, n));
        dec = best(dec, decode_ns(rt, buf, len, n));
        both = best(both, round_trip_ns(rt, m, n));
        plain = best(plain, plain_msgpack_ns(n));
    }
    tr_msg_free(rt, m);
    tr_runtime_run(rt);
    tr_runtime_close(rt);
    for (int r = 0; r < RUNS; r++) {
        hop = best(hop, hop_ns(n, workers, 0));
        hop_codec = best(hop_codec, hop_ns(n, workers, 1));
    }
    printf("message: timer (%zu bytes encoded)\n", len);
    printf("iterations: %ld count\n", n);
    printf("workers: %u count\n", workers);
    printf("encode_ns: %.1f ns\n", enc);
    printf("decode_ns: %.1f ns\n", dec);
    printf("encode_decode_ns: %.1f ns\n", both);
    printf("msgpack_c_array5_encode_decode_ns: %.1f ns\n", plain);
    printf("mailbox_hop_ns: %.1f ns\n", hop);
    printf("mailbox_hop_with_codec_ns: %.1f ns\n", hop_codec);
    printf("codec_share_of_hop: %.2f x\n", both / hop);
    return 0;
}
