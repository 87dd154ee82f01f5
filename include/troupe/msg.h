/* Troupe messages: the envelope every actor receives, tensor references, and the typed
 * bodies of the built-in message types.
 *
 * A message is an envelope (type, sender, receiver, sequence number, step, micro-step, flow
 * id, send time) followed by an inline body. Between actors of one process the body travels
 * as its C struct; msgpack is its canonical form, produced by tr_msg_encode() and read back by
 * tr_msg_decode() whenever a message crosses a process boundary or is stored. Large data never
 * travels in a body: a tr_tensor_ref_t names it (buffer id, offset, length, dtype, shape,
 * device) and travels as a msgpack extension type.
 *
 * Message types and their fields are declared once, in troupe/msg_types.def; that table
 * generates the body structs below, the codec's descriptors, the type names used in traces
 * and the reference page docs/messages.md.
 *
 * Ownership: a message belongs to whoever allocated it until a send succeeds; then it belongs
 * to the runtime, which frees it after the receiving behaviour returns. A failed send leaves
 * it with the sender, who may retry or tr_msg_free() it.
 */
#ifndef TR_INCLUDE_TROUPE_MSG_H
#define TR_INCLUDE_TROUPE_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "troupe/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_runtime tr_runtime_t;

/* An actor's address: a slot index (low 32 bits) and that slot's generation (high 32 bits).
 * A value type, cheap to copy; it never dangles: once the actor has stopped, sends to it fail
 * with TR_ESTOPPED or are dropped as dead letters. {0} is "no actor". */
typedef struct tr_actor {
    uint64_t id;
} tr_actor_t;

#define TR_ACTOR_NONE ((tr_actor_t){0})
static inline int tr_actor_is_none(tr_actor_t a)
{
    return a.id == 0;
}
static inline int tr_actor_eq(tr_actor_t a, tr_actor_t b)
{
    return a.id == b.id;
}

/* --- tensor references ---------------------------------------------------------------- */

#define TR_TENSOR_MAX_DIMS 6

/* Names bytes that live elsewhere: a registered buffer, a byte range in it, its element
 * type and shape, and the device that holds it. Never the bytes themselves. */
typedef struct tr_tensor_ref {
    uint64_t buffer_id;
    uint64_t offset;     /* bytes from the start of the buffer */
    uint64_t length;     /* bytes */
    uint8_t dtype;       /* tr_dtype_t */
    uint8_t device_type; /* tr_device_kind_t */
    int16_t device_index;
    uint8_t ndim;
    uint8_t pad_[3];
    int64_t shape[TR_TENSOR_MAX_DIMS];
} tr_tensor_ref_t;

/* The msgpack extension type number a tensor reference travels as. */
#define TR_MSGPACK_EXT_TENSOR 1

/* --- the envelope ---------------------------------------------------------------------- */

#define TR_MSG_F_URGENT 0x1u /* travelled on the urgent lane */
#define TR_MSG_F_WIRE   0x2u /* private: the body is the msgpack form (wire-check mode) */

typedef struct tr_msg {
    /* Private to the runtime: the mailbox link and the memory pool's bookkeeping. */
    struct tr_msg *_Atomic tr_next_;
    void *tr_pool_;
    uint32_t tr_class_;
    uint32_t tr_cap_; /* body capacity in bytes */

    /* The envelope. The runtime fills sender, receiver, seq, flow_id and send_ns on send;
     * type, step, micro_step and size are the sender's. */
    uint32_t type;     /* a tr_msg_type_t, or an application type >= TR_MSG_USER */
    uint32_t flags;    /* TR_MSG_F_* */
    tr_actor_t sender; /* TR_ACTOR_NONE when sent from outside any actor */
    tr_actor_t receiver;
    uint64_t seq;  /* per-sender sequence number, from 1 (sends from outside any actor:
                    * per thread) */
    uint64_t step; /* training step the message belongs to (0 when none) */
    uint32_t micro_step;
    uint32_t size;    /* bytes of the body in use */
    uint64_t flow_id; /* unique per message; binds a send to its handling in traces */
    uint64_t send_ns; /* monotonic send time, when the runtime records timestamps */
    /* The body follows, 16-byte aligned. */
} tr_msg_t;

static inline void *tr_msg_body(tr_msg_t *m)
{
    return (void *)((char *)m + ((sizeof(tr_msg_t) + 15u) & ~(size_t)15u));
}
static inline const void *tr_msg_body_const(const tr_msg_t *m)
{
    return (const void *)((const char *)m + ((sizeof(tr_msg_t) + 15u) & ~(size_t)15u));
}

/* --- the message table ----------------------------------------------------------------- */

/* The kinds of field a table-declared body may hold. */
typedef enum {
    TR_FIELD_BOOL,
    TR_FIELD_I32,
    TR_FIELD_U32,
    TR_FIELD_I64,
    TR_FIELD_U64,
    TR_FIELD_F32,
    TR_FIELD_F64,
    TR_FIELD_STR,       /* char[cap], NUL-terminated */
    TR_FIELD_ACTOR,     /* tr_actor_t */
    TR_FIELD_TENSOR,    /* tr_tensor_ref_t, as msgpack ext TR_MSGPACK_EXT_TENSOR */
    TR_FIELD_BYTES,     /* TR_BYTES(cap): a length and up to cap bytes, as msgpack bin */
    TR_FIELD_ARRAY_I32, /* a fixed array, e.g. int32_t v[16]: a msgpack array of exactly */
    TR_FIELD_ARRAY_U32, /* that many elements (the table's cap is the element count) */
    TR_FIELD_ARRAY_I64,
    TR_FIELD_ARRAY_U64,
    TR_FIELD_ARRAY_F32,
    TR_FIELD_ARRAY_F64,
    TR_FIELD_KIND_COUNT_
} tr_field_kind_t;

/* A byte-string field's C type: `TR_BYTES(64) blob;` holds blob.len (<= 64) bytes. */
#define TR_BYTES(cap)                                                                              \
    struct {                                                                                       \
        uint32_t len;                                                                              \
        uint8_t data[cap];                                                                         \
    }

typedef struct tr_field_desc {
    const char *name;
    tr_field_kind_t kind;
    uint32_t offset; /* in the body struct */
    uint32_t size;   /* bytes the field occupies (sizeof): for TR_FIELD_STR the buffer's
                      * capacity, for TR_FIELD_BYTES 4 + capacity, for an array the element
                      * size times the count */
    const char *doc;
} tr_field_desc_t;

typedef struct tr_msg_desc {
    uint32_t type;
    const char *name;
    const char *doc;
    uint32_t body_size;
    uint32_t n_fields;
    const tr_field_desc_t *fields;
} tr_msg_desc_t;

/* Built-in body structs and type ids, generated from troupe/msg_types.def. */
#define TR__CTYPE_BOOL(n, cap)               uint8_t n
#define TR__CTYPE_I32(n, cap)                int32_t n
#define TR__CTYPE_U32(n, cap)                uint32_t n
#define TR__CTYPE_I64(n, cap)                int64_t n
#define TR__CTYPE_U64(n, cap)                uint64_t n
#define TR__CTYPE_F32(n, cap)                float n
#define TR__CTYPE_F64(n, cap)                double n
#define TR__CTYPE_STR(n, cap)                char n[cap]
#define TR__CTYPE_ACTOR(n, cap)              tr_actor_t n
#define TR__CTYPE_TENSOR(n, cap)             tr_tensor_ref_t n
#define TR__CTYPE_BYTES(n, cap)              TR_BYTES(cap) n
#define TR__CTYPE_ARRAY_I32(n, cap)          int32_t n[cap]
#define TR__CTYPE_ARRAY_U32(n, cap)          uint32_t n[cap]
#define TR__CTYPE_ARRAY_I64(n, cap)          int64_t n[cap]
#define TR__CTYPE_ARRAY_U64(n, cap)          uint64_t n[cap]
#define TR__CTYPE_ARRAY_F32(n, cap)          float n[cap]
#define TR__CTYPE_ARRAY_F64(n, cap)          double n[cap]
#define TR__FIELD_DECL(S, kind, n, cap, doc) TR__CTYPE_##kind(n, cap);

#include "troupe/msg_types.def"

#define TR__MSG_STRUCT(NAME, name, doc)                                                            \
    typedef struct tr_msg_##name {                                                                 \
        TR_MSG_FIELDS_##name(TR__FIELD_DECL, tr_msg_##name##_t)                                    \
    } tr_msg_##name##_t;
TR_MSG_TYPES(TR__MSG_STRUCT)
#undef TR__MSG_STRUCT

typedef enum {
    TR_MSG_NONE = 0,
#define TR__MSG_ENUM(NAME, name, doc) TR_MSG_##NAME,
    TR_MSG_TYPES(TR__MSG_ENUM)
#undef TR__MSG_ENUM
        TR_MSG_BUILTIN_COUNT_,
    TR_MSG_USER = 1024 /* application types start here */
} tr_msg_type_t;

/* The body of a built-in message, typed: TR_MSG_AS(m, timer)->tag. */
#define TR_MSG_AS(m, name) ((tr_msg_##name##_t *)tr_msg_body(m))

/* --- allocation ------------------------------------------------------------------------ */

/* A message with room for body_size bytes of body, zeroed, from the calling thread's pool
 * (no malloc on the steady-state path). type is stored in the envelope and size set to
 * body_size. NULL when memory is exhausted. Any thread. */
tr_msg_t *tr_msg_alloc(tr_runtime_t *rt, uint32_t type, size_t body_size);

/* A message of a built-in or registered type, its body sized from the table. */
tr_msg_t *tr_msg_new(tr_runtime_t *rt, uint32_t type);

/* Frees a message that was never sent, or whose send failed. Any thread; NULL does nothing. */
void tr_msg_free(tr_runtime_t *rt, tr_msg_t *m);

/* --- the codec ------------------------------------------------------------------------- */

/* The descriptor of a built-in or registered type; NULL when unknown. Any thread. */
const tr_msg_desc_t *tr_msg_desc(uint32_t type);

/* The type's name for traces and logs ("timer"); "user:<n>" style names are not stored, an
 * unknown type gives "unknown". Any thread. */
const char *tr_msg_type_name(uint32_t type);

/* Registers an application message type (desc->type >= TR_MSG_USER) so that it can be
 * encoded, decoded and named. desc must outlive the process's use of it. TR_EEXIST when the
 * type is taken, TR_EINVAL for a malformed descriptor (more than TR_MSG_MAX_FIELDS fields, a
 * field without a name or with a repeated one, outside the body, or whose size does not match
 * its kind). Call before starting runtimes. */
int tr_msg_type_register(const tr_msg_desc_t *desc);

/* The wire format (docs/messages.md describes it): its version, the largest encoded message
 * tr_msg_decode accepts, and the deepest nesting of msgpack arrays and maps it accepts. */
#define TR_MSG_WIRE_VERSION 1
#define TR_MSG_MAX_ENCODED  (1u << 20)
#define TR_MSG_MAX_DEPTH    8
/* Most fields a registered type may declare (the decoder tracks them in a 64-bit mask). */
#define TR_MSG_MAX_FIELDS 64
/* Most elements a fixed-array field may hold. */
#define TR_MSG_MAX_ARRAY 65536

/* Encodes m (envelope and body) as msgpack into buf. On success *len is the encoded size.
 * TR_ENOSPC when cap is too small (*len then says how much is needed), TR_ENOTSUP for a type
 * without a descriptor, TR_EINVAL for a body the decoder would reject (a string without its
 * NUL, a malformed tensor reference, a body smaller than the type's), TR_EOVERFLOW when the
 * encoding would exceed TR_MSG_MAX_ENCODED. Any thread. */
int tr_msg_encode(const tr_msg_t *m, void *buf, size_t cap, size_t *len);

/* Decodes a msgpack message into a new message from rt's pool; *out is the caller's, to send
 * or tr_msg_free. A truncated, mistyped, too-deep or oversize payload, an unknown type, or a
 * missing, unknown or repeated field gives TR_EDECODE and one log line on stderr naming the
 * type and field ("decode 'timer': field 'tag': expected unsigned integer, got string");
 * when errbuf is not NULL the same text is written there. TR_ENOMEM when the pool is
 * exhausted. Any thread. */
int tr_msg_decode(tr_runtime_t *rt, const void *buf, size_t len, tr_msg_t **out, char *errbuf,
                  size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
