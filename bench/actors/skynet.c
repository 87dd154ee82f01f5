/* skynet.c: the skynet benchmark (github.com/atemerev/skynet) on Troupe: a tree of actors,
 * SKYNET_FANOUT children each, down to SKYNET_LEAVES leaves (1,111,111 actors in all). A
 * request (num, size) tells an actor which leaf ids it covers; a leaf answers with its id, an
 * inner actor spawns its children, sends each its request, sums their answers and answers its
 * parent. The root's sum must be 0 + 1 + ... + 999,999 = 499,999,500,000.
 *
 * Messages per run: one request and one answer per actor, the same as the CAF peer.
 */
#include <stdlib.h>

#include "benches.h"

enum { MSG_REQUEST = TR_MSG_USER + 100, MSG_ANSWER };

typedef struct sky_request {
    uint64_t num;  /* first leaf id covered */
    uint64_t size; /* leaves covered */
} sky_request_t;

/* An inner actor's state; leaves have none. */
typedef struct sky_node {
    tr_actor_t parent;
    uint32_t answers;
    uint64_t sum;
    uint64_t *result; /* the root only: where the total goes */
} sky_node_t;

static int sky_node(tr_ctx_t *ctx, tr_msg_t *m);

static int sky_leaf(tr_ctx_t *ctx, tr_msg_t *m)
{
    const sky_request_t *rq = tr_msg_body(m);
    tr_actor_stop(ctx->rt, ctx->self);
    return bench_send_u64(ctx->rt, m->sender, MSG_ANSWER, rq->num);
}

static void sky_cleanup(tr_ctx_t *ctx, int reason)
{
    free(ctx->state);
}

static int sky_spawn_child(tr_ctx_t *ctx, sky_request_t rq)
{
    static const tr_actor_opts_t opts = {.cleanup = sky_cleanup};
    tr_actor_t child;
    sky_node_t *st = NULL;
    int rc;
    if (rq.size == 1) {
        rc = tr_actor_spawn(ctx->rt, sky_leaf, NULL, NULL, &child);
    } else {
        if (!(st = calloc(1, sizeof(*st)))) return TR_ENOMEM;
        rc = tr_actor_spawn(ctx->rt, sky_node, st, &opts, &child);
    }
    if (rc < 0) {
        free(st);
        return rc;
    }
    return bench_send(ctx->rt, child, MSG_REQUEST, &rq, sizeof(rq));
}

static int sky_node(tr_ctx_t *ctx, tr_msg_t *m)
{
    sky_node_t *s = ctx->state;
    if (m->type == MSG_REQUEST) {
        const sky_request_t *rq = tr_msg_body(m);
        s->parent = m->sender;
        uint64_t step = rq->size / SKYNET_FANOUT;
        for (uint64_t i = 0; i < SKYNET_FANOUT; i++) {
            int rc = sky_spawn_child(ctx, (sky_request_t){rq->num + i * step, step});
            if (rc < 0) return rc;
        }
        return 0;
    }
    s->sum += bench_body_u64(m);
    if (++s->answers < SKYNET_FANOUT) return 0;
    tr_actor_stop(ctx->rt, ctx->self);
    if (s->result) {
        *s->result = s->sum;
        return 0;
    }
    return bench_send_u64(ctx->rt, s->parent, MSG_ANSWER, s->sum);
}

int bench_skynet(const bench_args_t *a, double *ms)
{
    tr_runtime_t *rt;
    if (bench_rt_open(a, &rt) < 0) return -1;
    uint64_t result = 0;
    sky_node_t root = {.result = &result};
    sky_request_t rq = {0, SKYNET_LEAVES};
    tr_actor_t r;
    uint64_t t0 = tr_now_ns();
    int rc = tr_actor_spawn(rt, sky_node, &root, NULL, &r);
    if (rc == 0) rc = bench_send(rt, r, MSG_REQUEST, &rq, sizeof(rq));
    if (bench_rt_finish(rt, rc, "skynet", t0, ms) < 0) return -1;
    if (result != SKYNET_EXPECT) {
        fprintf(stderr, "skynet: sum %llu, expected %llu\n", (unsigned long long)result,
                SKYNET_EXPECT);
        return -1;
    }
    return 0;
}
