/* wire.c: wire-check mode (tr_runtime_opts_t.wire_check). Each message sent is replaced by
 * its msgpack form, and the receiver's behaviour is handed a message decoded from it, so a
 * body that holds anything but self-contained values (a pointer, a string without its NUL, a
 * tensor reference that would not survive the trip) shows up as a failed send or a failed
 * receive instead of working by accident inside one process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/core/internal.h"

/* The wire form of m, its envelope copied so that delivery, dead letters and traces treat it
 * as m. */
static int encode_one(tr_runtime_t *rt, const tr_msg_t *m, tr_msg_t **out)
{
    size_t len = 0;
    int rc = tr_msg_encode(m, NULL, 0, &len);
    if (rc == TR_ENOSPC) {
        tr_msg_t *w = tr_msg_alloc(rt, m->type, len);
        if (!w) return TR_ENOMEM;
        rc = tr_msg_encode(m, tr_msg_body(w), len, &len);
        if (rc < 0) {
            tr_msg_free(rt, w);
            return rc;
        }
        w->flags = m->flags | TR_MSG_F_WIRE;
        w->sender = m->sender;
        w->receiver = m->receiver;
        w->seq = m->seq;
        w->step = m->step;
        w->micro_step = m->micro_step;
        w->flow_id = m->flow_id;
        w->send_ns = m->send_ns;
        *out = w;
        return 0;
    }
    fprintf(stderr, "troupe: wire check: message type %u '%s' cannot be encoded: %s\n", m->type,
            tr_msg_type_name(m->type),
            rc == TR_ENOTSUP     ? "no descriptor (register it with tr_msg_type_register)"
            : rc == TR_EOVERFLOW ? "its encoding is larger than TR_MSG_MAX_ENCODED"
                                 : "a field holds a value the decoder would refuse (a string "
                                   "without its NUL, a malformed tensor reference, a short body)");
    return rc < 0 ? rc : TR_EINVAL;
}

int tr__wire_encode(tr_runtime_t *rt, tr_msg_t **msgs, size_t n)
{
    tr_msg_t *wire[64], **w = wire;
    if (n > 64 && !(w = malloc(n * sizeof(*w)))) return TR_ENOMEM;
    int rc = 0;
    size_t done = 0;
    for (; done < n && rc == 0; done++)
        rc = encode_one(rt, msgs[done], &w[done]);
    if (rc < 0) done--;
    for (size_t i = 0; i < done; i++) {
        if (rc < 0) {
            tr_msg_free(rt, w[i]);
        } else {
            tr_msg_free(rt, msgs[i]);
            msgs[i] = w[i];
        }
    }
    if (w != wire) free(w);
    return rc;
}

int tr__wire_decode(tr_runtime_t *rt, const tr_msg_t *wire, tr_msg_t **out)
{
    char why[256];
    int rc = tr_msg_decode(rt, tr_msg_body_const(wire), wire->size, out, why, sizeof(why));
    if (rc == 0 && (*out)->type != wire->type) {
        fprintf(stderr, "troupe: wire check: a '%s' message decoded as type %u\n",
                tr_msg_type_name(wire->type), (*out)->type);
        tr_msg_free(rt, *out);
        *out = NULL;
        rc = TR_EDECODE;
    }
    return rc;
}
