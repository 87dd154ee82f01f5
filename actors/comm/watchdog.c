/* watchdog.c: the hang diagnosis across ranks (see watchdog.h for the protocol).
 *
 * A control message is one msgpack map: "k" (its kind: "alarm", "ask", "table", "verdict"),
 * "rank" (the sender), and for a table "started", "last" (an operation) and "ops" (an array of
 * operations, oldest first), an operation being a map of the header's fields ("op", "seq",
 * "bytes", "dtype", "step", "micro_step", "bucket"), "exchange" and "pending_s", and a
 * pipeline transfer's "peer", "stage", "peer_stage", "grad" and "tensor". Receives go
 * into one fixed buffer; msgpack delimits the message, so its length need not travel.
 */
#include "actors/comm/watchdog.h"

#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/engine/plan.h"
#include "base/errf.h"
#include "runtime/msg/mpack.h"
#include "troupe/error.h"
#include "troupe/log.h"
#include "troupe/types.h"

#define CTL_TAG   1
#define CTL_BYTES 16384 /* a table of TR__WATCH_MAX_OPS operations is ~5 KiB */

typedef struct outgoing {
    uint64_t req; /* 0: free */
    char *data;   /* the message, until its send completes */
} outgoing_t;

struct tr__watch {
    tr_comm_t *ctl;
    int rank, world;
    uint64_t recv_req;
    unsigned char in[CTL_BYTES];
    outgoing_t out[64];
    bool alarmed, asked, ended;
    bool verdict;      /* it ended on rank 0's verdict */
    uint64_t alarm_ns; /* when this rank alarmed or was asked */
    bool diagnosing;   /* rank 0: gathering tables until deadline */
    uint64_t deadline;
    tr__watch_table_t *tables; /* rank 0: one per rank */
    bool *answered;
};

/* --- describing an operation ------------------------------------------------------------ */

/* "the pipeline's receive from rank 1 (stage 1 to stage 0) of the gradient of micro-batch 0,
 * step 5 (its tensor, 2048 bytes of f32)". */
static void describe_pipe(const tr__watch_op_t *o, char *out, size_t len)
{
    bool recv = o->op == TR__COLL_PIPE_RECV;
    char part[64] = "its header";
    if (o->tensor)
        snprintf(part, sizeof(part), "its tensor, %llu bytes of %s", (unsigned long long)o->bytes,
                 tr_dtype_name((int)o->dtype));
    snprintf(out, len,
             "the pipeline's %s rank %d (stage %u to stage %u) of the %s of micro-batch %u, "
             "step %llu (%s)",
             recv ? "receive from" : "send to", o->peer, recv ? o->peer_stage : o->stage,
             recv ? o->stage : o->peer_stage, o->grad ? "gradient" : "activation", o->micro_step,
             (unsigned long long)o->step, part);
}

void tr__watch_describe(const tr__watch_op_t *o, char *out, size_t len)
{
    if (tr__watch_is_pipe(o)) {
        describe_pipe(o, out, len);
        return;
    }
    char what[64];
    if (o->op == TR__COLL_ALL_REDUCE || o->op == TR__COLL_REDUCE_SCATTER)
        snprintf(what, sizeof(what), "the %s of bucket %u",
                 o->op == TR__COLL_ALL_REDUCE ? "all-reduce" : "reduce-scatter", o->bucket);
    else if (o->op == TR__COLL_ALL_GATHER)
        snprintf(what, sizeof(what), "the parameter all-gather");
    else if (o->op == TR__COLL_VECTOR)
        snprintf(what, sizeof(what), "a vector all-reduce");
    else if (o->bucket == TR__SCALAR_CKPT_SAVE)
        snprintf(what, sizeof(what), "a wait for a checkpoint save (every rank must call it)");
    else if (o->bucket == TR__SCALAR_CKPT_LOAD)
        snprintf(what, sizeof(what), "a checkpoint load (every rank must call it)");
    else
        snprintf(what, sizeof(what), "a scalar all-reduce");
    snprintf(out, len, "%scollective #%llu, %s, %llu bytes of %s, step %llu, micro-step %u",
             o->exchange ? "the header exchange before " : "", (unsigned long long)o->seq, what,
             (unsigned long long)o->bytes, tr_dtype_name((int)o->dtype),
             (unsigned long long)o->step, o->micro_step);
}

/* --- encoding ----------------------------------------------------------------------------- */

static void pack_op(msgpack_packer *pk, const tr__watch_op_t *o)
{
    msgpack_pack_map(pk, 14);
    tr__mp_pack_kv_uint(pk, "op", o->op);
    tr__mp_pack_kv_uint(pk, "seq", o->seq);
    tr__mp_pack_kv_uint(pk, "bytes", o->bytes);
    tr__mp_pack_kv_uint(pk, "dtype", o->dtype);
    tr__mp_pack_kv_uint(pk, "step", o->step);
    tr__mp_pack_kv_uint(pk, "micro_step", o->micro_step);
    tr__mp_pack_kv_uint(pk, "bucket", o->bucket);
    tr__mp_pack_kv_uint(pk, "exchange", o->exchange);
    tr__mp_pack_kv_double(pk, "pending_s", o->pending_s);
    tr__mp_pack_kv_uint(pk, "peer", o->peer < 0 ? 0 : (uint64_t)o->peer);
    tr__mp_pack_kv_uint(pk, "stage", o->stage);
    tr__mp_pack_kv_uint(pk, "peer_stage", o->peer_stage);
    tr__mp_pack_kv_uint(pk, "grad", o->grad);
    tr__mp_pack_kv_uint(pk, "tensor", o->tensor);
}

/* The message of kind k from this rank (with a table: mine) into sb. */
static void pack_msg(msgpack_sbuffer *sb, const char *k, int rank, const tr__watch_table_t *t)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, t ? 5 : 2);
    tr__mp_pack_kv_str(&pk, "k", k);
    tr__mp_pack_kv_uint(&pk, "rank", (uint64_t)rank);
    if (!t) return;
    tr__mp_pack_kv_uint(&pk, "started", t->started);
    tr__mp_pack_str(&pk, "last");
    pack_op(&pk, &t->last);
    tr__mp_pack_str(&pk, "ops");
    msgpack_pack_array(&pk, (size_t)t->n);
    for (int i = 0; i < t->n; i++)
        pack_op(&pk, &t->ops[i]);
}

/* --- decoding ----------------------------------------------------------------------------- */

static uint64_t get_u64(const msgpack_object *map, const char *key, bool *ok)
{
    const msgpack_object *v = tr__mp_field(map, key);
    if (v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return v->via.u64;
    *ok = false;
    return 0;
}

static bool unpack_op(const msgpack_object *m, tr__watch_op_t *o)
{
    bool ok = m && m->type == MSGPACK_OBJECT_MAP;
    if (!ok) return false;
    o->op = (tr__coll_op_t)get_u64(m, "op", &ok); /* another rank's: described as it is */
    o->seq = get_u64(m, "seq", &ok);
    o->bytes = get_u64(m, "bytes", &ok);
    o->dtype = (uint32_t)get_u64(m, "dtype", &ok);
    o->step = get_u64(m, "step", &ok);
    o->micro_step = (uint32_t)get_u64(m, "micro_step", &ok);
    o->bucket = (uint32_t)get_u64(m, "bucket", &ok);
    o->exchange = get_u64(m, "exchange", &ok) != 0;
    o->peer = (int)(uint32_t)get_u64(m, "peer", &ok);
    o->stage = (uint32_t)get_u64(m, "stage", &ok);
    o->peer_stage = (uint32_t)get_u64(m, "peer_stage", &ok);
    o->grad = get_u64(m, "grad", &ok) != 0;
    o->tensor = get_u64(m, "tensor", &ok) != 0;
    const msgpack_object *p = tr__mp_field(m, "pending_s");
    if (!p || (p->type != MSGPACK_OBJECT_FLOAT64 && p->type != MSGPACK_OBJECT_FLOAT32))
        return false;
    o->pending_s = p->via.f64;
    return ok;
}

static bool unpack_table(const msgpack_object *m, tr__watch_table_t *t)
{
    bool ok = true;
    t->started = get_u64(m, "started", &ok);
    const msgpack_object *ops = tr__mp_field(m, "ops");
    if (!ok || !unpack_op(tr__mp_field(m, "last"), &t->last) || !ops ||
        ops->type != MSGPACK_OBJECT_ARRAY || ops->via.array.size > TR__WATCH_MAX_OPS)
        return false;
    t->n = (int)ops->via.array.size;
    for (int i = 0; i < t->n; i++)
        if (!unpack_op(&ops->via.array.ptr[i], &t->ops[i])) return false;
    return true;
}

/* --- the channel -------------------------------------------------------------------------- */

static int post_recv(tr__watch_t *w)
{
    return w->ctl->ops->recv(w->ctl, w->in, sizeof(w->in), TR_DTYPE_U8, TR_COMM_ANY_SOURCE, CTL_TAG,
                             &w->recv_req);
}

/* Sends a message of kind k (with table t) to peer; a failure is logged (the diagnosis goes on
 * without that peer). */
static void send_msg(tr__watch_t *w, int peer, const char *k, const tr__watch_table_t *t)
{
    outgoing_t *slot = NULL;
    for (size_t i = 0; i < sizeof(w->out) / sizeof(w->out[0]) && !slot; i++)
        if (!w->out[i].req) slot = &w->out[i];
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_msg(&sb, k, w->rank, t);
    uint64_t req = 0;
    int rc = !slot ? TR_ENOSPC
             : sb.size > CTL_BYTES
                 ? TR_EOVERFLOW
                 : w->ctl->ops->send(w->ctl, sb.data, sb.size, TR_DTYPE_U8, peer, CTL_TAG, &req);
    if (rc < 0) {
        tr_log(TR_LOG_ERROR, "comm watchdog: rank %d: sending '%s' to rank %d: %s", w->rank, k,
               peer, w->ctl->error[0] ? w->ctl->error : tr_strerror(rc));
        msgpack_sbuffer_destroy(&sb);
        return;
    }
    *slot = (outgoing_t){.req = req, .data = msgpack_sbuffer_release(&sb)};
}

int tr__watch_create(tr_comm_t *data, tr_comm_done_cb done, void *arg, tr__watch_t **out, char *why,
                     size_t whylen)
{
    *out = NULL;
    if (data->world == 1 || !data->ops->send || !data->ops->recv || !data->ops->split) return 0;
    tr__watch_t *w = calloc(1, sizeof(*w));
    if (!w) return tr__errf(why, whylen, TR_ENOMEM, "comm watchdog: out of memory");
    int rc = tr_comm_split(data, 0, data->rank, &w->ctl, why, whylen);
    if (rc < 0) {
        free(w);
        return rc;
    }
    w->ctl->done = done;
    w->ctl->done_arg = arg;
    w->rank = w->ctl->rank;
    w->world = w->ctl->world;
    rc = post_recv(w);
    if (rc < 0) {
        snprintf(why, whylen, "comm watchdog: posting the control channel's receive: %s",
                 w->ctl->error);
        tr__watch_destroy(w);
        return rc;
    }
    *out = w;
    return 0;
}

void tr__watch_destroy(tr__watch_t *w)
{
    if (!w) return;
    tr_comm_destroy(w->ctl); /* cancels the posted receive */
    for (size_t i = 0; i < sizeof(w->out) / sizeof(w->out[0]); i++)
        free(w->out[i].data);
    free(w->tables);
    free(w->answered);
    free(w);
}

bool tr__watch_ended_here(const tr__watch_t *w)
{
    return w && w->ended && !w->verdict;
}

bool tr__watch_busy(const tr__watch_t *w)
{
    return w && (w->alarmed || w->asked || w->diagnosing);
}

/* --- rank 0: the diagnosis ---------------------------------------------------------------- */

static void start_diagnosis(tr__watch_t *w, const tr__watch_table_t *mine, uint64_t now)
{
    if (w->diagnosing || w->ended) return;
    if (!w->tables) {
        w->tables = calloc((size_t)w->world, sizeof(*w->tables));
        w->answered = calloc((size_t)w->world, sizeof(*w->answered));
        if (!w->tables || !w->answered) {
            tr_log(TR_LOG_ERROR, "comm watchdog: out of memory for %d tables", w->world);
            return;
        }
    }
    w->diagnosing = true;
    w->deadline = now + TR__WATCH_GRACE_NS;
    w->tables[0] = *mine;
    w->answered[0] = true;
    for (int r = 1; r < w->world; r++)
        send_msg(w, r, "ask", NULL);
}

/* Appends to out (len, *used) like snprintf. */
#define ADD(...)                                                                                   \
    do {                                                                                           \
        if (*used < len) *used += (size_t)snprintf(out + *used, len - *used, __VA_ARGS__);         \
    } while (0)

/* The operation a rank waits in longest: its oldest pending one. */
static void name_wait(const tr__watch_table_t *t, char *out, size_t len, size_t *used)
{
    char d[240];
    tr__watch_describe(&t->ops[0], d, sizeof(d));
    ADD("rank %d has waited %.1f s in %s", t->rank, t->ops[0].pending_s, d);
}

/* Whether rank r answered and waits longest in a pipeline transfer: it waits on one peer
 * (named in the transfer), not on every rank. */
static bool waits_in_pipe(const tr__watch_t *w, int r)
{
    return w->answered[r] && w->tables[r].n && tr__watch_is_pipe(&w->tables[r].ops[0]);
}

/* Names the ranks that did not answer, and those whose last started collective is behind the
 * others' (with what they last started and whether anything is pending on them); then each
 * rank that waits in a pipeline transfer, with the transfer (its peer rank and stage: a
 * point-to-point wait, so such a rank is not named as diverged even when it is behind in
 * collectives), and the collective the others wait in. */
static void diagnose(const tr__watch_t *w, char *out, size_t len)
{
    size_t used0 = 0, *used = &used0;
    uint64_t most = 0;
    int ahead = -1, named = 0, piped = 0;
    for (int r = 0; r < w->world; r++)
        if (w->answered[r] && w->tables[r].started >= most) most = w->tables[r].started;
    for (int r = 0; r < w->world; r++)
        if (w->answered[r] && w->tables[r].started == most && w->tables[r].n &&
            !waits_in_pipe(w, r) &&
            (ahead < 0 || w->tables[r].ops[0].pending_s > w->tables[ahead].ops[0].pending_s))
            ahead = r;
    ADD("comm: watchdog: ");
    for (int r = 0; r < w->world; r++) {
        const tr__watch_table_t *t = &w->tables[r];
        char d[200] = "none";
        if (!w->answered[r]) {
            ADD("%srank %d diverged: it did not answer within %.0f s (dead, or its comm actor is "
                "blocked)",
                named++ ? "; " : "", r, TR__WATCH_GRACE_NS / 1e9);
        } else if (waits_in_pipe(w, r)) {
            piped++; /* named with its transfer below */
        } else if (t->started < most) {
            if (t->started) tr__watch_describe(&t->last, d, sizeof(d));
            ADD("%srank %d diverged: the last collective it started is %s", named++ ? "; " : "", r,
                d);
            if (t->n) {
                tr__watch_describe(&t->ops[0], d, sizeof(d));
                ADD(", and it waits in %s", d);
            } else {
                ADD(", and nothing is pending on it (it stopped posting collectives: stuck in "
                    "compute, or it skipped one)");
            }
        }
    }
    if (!named && piped)
        ADD("every rank answered: a pipeline transfer between ranks is stuck");
    else if (!named)
        ADD("no rank is behind (every rank started collective #%llu): the collective "
            "itself is stuck",
            (unsigned long long)most);
    for (int r = 0; r < w->world; r++)
        if (waits_in_pipe(w, r)) {
            ADD("; ");
            name_wait(&w->tables[r], out, len, used);
        }
    if (ahead >= 0) {
        ADD("; ");
        name_wait(&w->tables[ahead], out, len, used);
    }
    ADD("; the job ends on every rank");
}

/* Rank 0, once every table is in or the grace period is over: the diagnosis, printed once,
 * and the verdict to every rank. */
static int conclude(tr__watch_t *w, uint64_t now, char *fail, size_t faillen)
{
    int missing = 0;
    for (int r = 0; r < w->world; r++)
        missing += !w->answered[r];
    if (missing && now < w->deadline) return 0;
    diagnose(w, fail, faillen);
    for (int r = 1; r < w->world; r++)
        send_msg(w, r, "verdict", NULL);
    w->diagnosing = false;
    w->ended = true;
    return 1;
}

/* --- the entry points --------------------------------------------------------------------- */

void tr__watch_alarm(tr__watch_t *w, const tr__watch_table_t *mine, uint64_t now_ns)
{
    if (w->alarmed || w->ended) return;
    w->alarmed = true;
    if (!w->asked) w->alarm_ns = now_ns;
    if (w->rank == 0)
        start_diagnosis(w, mine, now_ns);
    else
        send_msg(w, 0, "alarm", NULL);
}

/* The alarm's (or the ask's) fallback: no verdict came. */
static int alone(tr__watch_t *w, uint64_t now, char *fail, size_t faillen)
{
    if (w->rank == 0 || w->ended || !(w->alarmed || w->asked) ||
        now - w->alarm_ns < 2 * TR__WATCH_GRACE_NS)
        return 0;
    w->ended = true;
    snprintf(fail, faillen,
             "comm: watchdog: rank %d: no verdict from rank 0 within %.0f s of "
             "the alarm: rank 0 is dead or blocked; the job ends on every rank",
             w->rank, 2 * TR__WATCH_GRACE_NS / 1e9);
    return 1;
}

int tr__watch_tick(tr__watch_t *w, const tr__watch_table_t *mine, uint64_t now_ns, char *fail,
                   size_t faillen)
{
    int left = w->ctl->ops->progress ? w->ctl->ops->progress(w->ctl) : 0;
    if (left < 0) /* the completions that did arrive still come as messages */
        tr_log(TR_LOG_ERROR, "comm watchdog: rank %d: %s", w->rank, w->ctl->error);
    if (w->diagnosing) return conclude(w, now_ns, fail, faillen);
    return alone(w, now_ns, fail, faillen);
}

/* A received message: decodes and acts on it. */
static int on_message(tr__watch_t *w, const tr__watch_table_t *mine, uint64_t now, char *fail,
                      size_t faillen)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int result = 0;
    bool ok =
        msgpack_unpack_next(&u, (const char *)w->in, sizeof(w->in), NULL) == MSGPACK_UNPACK_SUCCESS;
    const msgpack_object *k = ok ? tr__mp_field(&u.data, "k") : NULL;
    uint64_t from = ok ? get_u64(&u.data, "rank", &ok) : 0;
    if (!k || k->type != MSGPACK_OBJECT_STR || from >= (uint64_t)w->world) ok = false;
    const char *kind = ok ? k->via.str.ptr : "";
    size_t klen = ok ? k->via.str.size : 0;
#define IS(s) (klen == strlen(s) && !memcmp(kind, s, klen))
    if (!ok) {
        tr_log(TR_LOG_ERROR,
               "comm watchdog: rank %d: a control message that is not a msgpack "
               "map with \"k\" and \"rank\" (ignored)",
               w->rank);
    } else if (IS("alarm") && w->rank == 0) {
        start_diagnosis(w, mine, now);
    } else if (IS("ask")) {
        if (!w->asked && !w->alarmed) w->alarm_ns = now;
        w->asked = true;
        send_msg(w, 0, "table", mine);
    } else if (IS("table") && w->diagnosing) {
        tr__watch_table_t *t = &w->tables[from];
        t->rank = (int)from;
        if (!unpack_table(&u.data, t))
            tr_log(TR_LOG_ERROR,
                   "comm watchdog: rank %llu's table is malformed (counted as no "
                   "answer)",
                   (unsigned long long)from);
        else
            w->answered[from] = true;
        result = conclude(w, now, fail, faillen);
    } else if (IS("verdict") && !w->ended) {
        w->ended = true;
        w->verdict = true;
        snprintf(fail, faillen,
                 "comm: rank %d: the job ends: rank 0's watchdog diagnosed a hang "
                 "(its message names the rank that diverged)",
                 w->rank);
        result = 1;
    }
#undef IS
    msgpack_unpacked_destroy(&u);
    return result;
}

int tr__watch_done(tr__watch_t *w, uint64_t req, int rc, const tr__watch_table_t *mine,
                   uint64_t now_ns, char *fail, size_t faillen)
{
    for (size_t i = 0; i < sizeof(w->out) / sizeof(w->out[0]); i++)
        if (w->out[i].req == req) { /* a send: its buffer is free */
            free(w->out[i].data);
            w->out[i] = (outgoing_t){0};
            return 0;
        }
    if (req != w->recv_req) return 0;
    int result = rc < 0 ? 0 : on_message(w, mine, now_ns, fail, faillen);
    if (rc < 0)
        tr_log(TR_LOG_ERROR, "comm watchdog: rank %d: the control receive failed: %s", w->rank,
               w->ctl->error[0] ? w->ctl->error : tr_strerror(rc));
    memset(w->in, 0, sizeof(w->in));
    if (post_recv(w) < 0)
        tr_log(TR_LOG_ERROR, "comm watchdog: rank %d: posting the control receive again: %s",
               w->rank, w->ctl->error);
    return result;
}
