/* pingpong: two actors bounce a counter back and forth; a timer reports progress.
 *
 *   pingpong [round-trips] [workers]
 *
 * Uses only the public API: spawn, send, reply to the sender, a repeating timer, stop.
 */
#include <stdio.h>
#include <stdlib.h>

#include <troupe.h>

enum { MSG_BALL = TR_MSG_USER };

typedef struct ball {
    uint64_t hits;
} ball_t;

typedef struct player {
    uint64_t limit; /* round trips to play */
    uint64_t timer; /* progress timer (ping only) */
    uint64_t t0;
    uint64_t last_hits;
    tr_actor_t partner;
} player_t;

static int serve(tr_runtime_t *rt, tr_actor_t to, uint64_t hits)
{
    tr_msg_t *m = tr_msg_alloc(rt, MSG_BALL, sizeof(ball_t));
    if (!m) return TR_ENOMEM;
    ((ball_t *)tr_msg_body(m))->hits = hits;
    int rc = tr_actor_send(rt, to, m);
    if (rc < 0) tr_msg_free(rt, m);
    return rc;
}

static int ping(tr_ctx_t *ctx, tr_msg_t *msg)
{
    player_t *p = ctx->state;
    if (msg->type == TR_MSG_TIMER) {
        uint64_t hits = p->last_hits;
        printf("pingpong: %llu round trips so far\n", (unsigned long long)hits);
        return 0;
    }
    if (msg->type != MSG_BALL) return 0;
    uint64_t hits = ((ball_t *)tr_msg_body(msg))->hits;
    p->last_hits = hits;
    if (hits >= p->limit) {
        double s = (tr_now_ns() - p->t0) / 1e9;
        printf("pingpong: %llu round trips in %.3f s: %.0f ns per round trip\n",
               (unsigned long long)hits, s, s * 1e9 / (double)hits);
        tr_timer_stop(ctx->rt, p->timer);
        tr_actor_stop(ctx->rt, p->partner);
        return tr_actor_stop(ctx->rt, ctx->self);
    }
    return serve(ctx->rt, p->partner, hits + 1);
}

static int pong(tr_ctx_t *ctx, tr_msg_t *msg)
{
    if (msg->type != MSG_BALL) return 0;
    return serve(ctx->rt, msg->sender, ((ball_t *)tr_msg_body(msg))->hits);
}

int main(int argc, char **argv)
{
    uint64_t rounds = argc > 1 ? strtoull(argv[1], NULL, 10) : 2000000;
    unsigned workers = argc > 2 ? (unsigned)atoi(argv[2]) : 0;
    tr_runtime_t *rt;
    tr_runtime_opts_t opts = {.n_workers = workers, .handle_signals = 1};
    int rc = tr_runtime_init(&rt, &opts);
    if (rc < 0) {
        fprintf(stderr, "pingpong: %s\n", tr_strerror(rc));
        return 1;
    }
    player_t ping_state = {.limit = rounds, .t0 = tr_now_ns()};
    tr_actor_t a, b;
    tr_actor_opts_t ping_opts = {.name = "ping"}, pong_opts = {.name = "pong"};
    rc = tr_actor_spawn(rt, pong, NULL, &pong_opts, &b);
    if (rc >= 0) {
        ping_state.partner = b;
        rc = tr_actor_spawn(rt, ping, &ping_state, &ping_opts, &a);
    }
    if (rc >= 0) rc = tr_timer_start(rt, a, 0, 250000000, 250000000, &ping_state.timer);
    if (rc < 0) {
        fprintf(stderr, "pingpong: %s\n", tr_strerror(rc));
        return 1;
    }
    printf("pingpong: %llu round trips between two actors on %u workers\n",
           (unsigned long long)rounds, tr_runtime_workers(rt));
    /* the first ball comes from outside any actor, to ping, which serves it to pong */
    if (serve(rt, a, 0) < 0) return 1;
    rc = tr_runtime_run(rt);
    tr_runtime_close(rt);
    return rc < 0 ? 1 : 0;
}
