/* The message codec: every built-in type, a registered application type and every tensor
 * reference shape round-trip through msgpack; malformed payloads (truncated at every byte,
 * mistyped, unknown, missing, repeated, too long, too deep, oversize, bad tensor refs,
 * garbage) are rejected with TR_EDECODE and an error naming the field; and an actor that
 * decodes raw payloads rejects a bad one and goes on handling the next. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "troupe.h"

#include "runtime/msg/mpack.h"

static tr_runtime_t *rt; /* the group's runtime: its pool backs decoded messages */

/* --- an application type with every field kind --------------------------------------- */

enum { MSG_SAMPLE = TR_MSG_USER + 7, MSG_RAW = TR_MSG_USER + 8 };

typedef struct sample {
    uint8_t flag;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    float f32;
    double f64;
    char label[16];
    tr_actor_t peer;
    tr_tensor_ref_t grad;
} sample_t;

#define SF(kind, f, doc)                                                                           \
    {                                                                                              \
#f, TR_FIELD_##kind, offsetof(sample_t, f), sizeof(((sample_t *)0)->f), doc                \
    }
static const tr_field_desc_t sample_fields[] = {
    SF(BOOL, flag, "a flag"),     SF(I32, i32, "signed"),        SF(U32, u32, "unsigned"),
    SF(I64, i64, "signed wide"),  SF(U64, u64, "unsigned wide"), SF(F32, f32, "single"),
    SF(F64, f64, "double"),       SF(STR, label, "a label"),     SF(ACTOR, peer, "an actor"),
    SF(TENSOR, grad, "a tensor"),
};
#undef SF
static const tr_msg_desc_t sample_desc = {MSG_SAMPLE,       "sample", "Every field kind.",
                                          sizeof(sample_t), 10,       sample_fields};

/* --- random messages --------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static void random_tensor(tr_tensor_ref_t *t)
{
    memset(t, 0, sizeof(*t));
    t->buffer_id = rnd();
    t->offset = rnd() >> 2;
    t->length = rnd() >> 2;
    t->dtype = (uint8_t)(rnd() % TR_DTYPE_COUNT_);
    t->device_type = (uint8_t)(rnd() % TR_DEVICE_COUNT_);
    t->device_index = (int16_t)(rnd() % 9) - 1;
    t->ndim = (uint8_t)(rnd() % (TR_TENSOR_MAX_DIMS + 1));
    for (unsigned i = 0; i < t->ndim; i++)
        t->shape[i] = (int64_t)(rnd() >> 1);
}

static void random_field(const tr_field_desc_t *f, char *p)
{
    uint64_t v = rnd();
    switch (f->kind) {
    case TR_FIELD_BOOL:
        *p = (char)(v & 1);
        break;
    case TR_FIELD_F32: {
        float x = (float)((double)(int64_t)v / 1e9);
        memcpy(p, &x, 4);
        break;
    }
    case TR_FIELD_F64: {
        double x = (double)(int64_t)v / 1e7;
        memcpy(p, &x, 8);
        break;
    }
    case TR_FIELD_STR: {
        size_t n = v % f->size; /* 0 .. cap-1 characters */
        for (size_t i = 0; i < n; i++)
            p[i] = (char)(' ' + rnd() % 95);
        p[n] = '\0';
        break;
    }
    case TR_FIELD_TENSOR:
        random_tensor((tr_tensor_ref_t *)(void *)p);
        break;
    case TR_FIELD_BYTES: { /* a length within the capacity, any bytes */
        uint32_t n = (uint32_t)(v % (f->size - 4));
        memcpy(p, &n, 4);
        for (uint32_t i = 0; i < n; i++)
            p[4 + i] = (char)rnd();
        break;
    }
    default: /* integers, actors and integer arrays: any bits */
        for (uint32_t i = 0; i < f->size; i += 8, v = rnd())
            memcpy(p + i, &v, f->size - i < 8 ? f->size - i : 8);
        break;
    }
}

static tr_msg_t *random_msg(uint32_t type)
{
    const tr_msg_desc_t *d = tr_msg_desc(type);
    assert_non_null(d);
    tr_msg_t *m = tr_msg_new(rt, type);
    assert_non_null(m);
    m->flags = (uint32_t)rnd();
    m->sender.id = rnd();
    m->receiver.id = rnd();
    m->seq = rnd();
    m->step = rnd();
    m->micro_step = (uint32_t)rnd();
    m->flow_id = rnd();
    m->send_ns = rnd();
    for (uint32_t i = 0; i < d->n_fields; i++)
        random_field(&d->fields[i], (char *)tr_msg_body(m) + d->fields[i].offset);
    return m;
}

/* --- round trips -------------------------------------------------------------------------- */

static void assert_same_msg(const tr_msg_t *a, const tr_msg_t *b)
{
    assert_int_equal(a->type, b->type);
    assert_int_equal(a->flags, b->flags);
    assert_int_equal(a->sender.id, b->sender.id);
    assert_int_equal(a->receiver.id, b->receiver.id);
    assert_int_equal(a->seq, b->seq);
    assert_int_equal(a->step, b->step);
    assert_int_equal(a->micro_step, b->micro_step);
    assert_int_equal(a->flow_id, b->flow_id);
    assert_int_equal(a->send_ns, b->send_ns);
    const tr_msg_desc_t *d = tr_msg_desc(a->type);
    assert_int_equal(b->size, d->body_size);
    for (uint32_t i = 0; i < d->n_fields; i++) {
        const tr_field_desc_t *f = &d->fields[i];
        const char *pa = (const char *)tr_msg_body_const(a) + f->offset;
        const char *pb = (const char *)tr_msg_body_const(b) + f->offset;
        if (f->kind == TR_FIELD_STR)
            assert_string_equal(pa, pb);
        else if (f->kind == TR_FIELD_BYTES)
            assert_memory_equal(pa, pb, 4 + *(const uint32_t *)(const void *)pa);
        else
            assert_memory_equal(pa, pb, f->size);
    }
}

/* Encodes m, decodes it, checks every envelope and body field, and frees both. */
static void round_trip(tr_msg_t *m)
{
    static char buf[16384];
    char err[256];
    size_t len = 0;
    assert_int_equal(tr_msg_encode(m, buf, sizeof(buf), &len), 0);
    tr_msg_t *back = NULL;
    int rc = tr_msg_decode(rt, buf, len, &back, err, sizeof(err));
    if (rc != 0)
        fail_msg("decode of a valid %s message failed: %s", tr_msg_type_name(m->type), err);
    assert_string_equal(err, "");
    assert_same_msg(m, back);
    tr_msg_free(rt, back);
    tr_msg_free(rt, m);
}

static void test_codec_builtin_types_round_trip(void **state)
{
    (void)state;
    for (uint32_t t = 1; t < TR_MSG_BUILTIN_COUNT_; t++) {
        round_trip(tr_msg_new(rt, t)); /* all zero */
        for (int i = 0; i < 200; i++)
            round_trip(random_msg(t));
    }
}

static void test_codec_registered_type_round_trips(void **state)
{
    (void)state;
    assert_string_equal(tr_msg_type_name(MSG_SAMPLE), "sample");
    for (int i = 0; i < 500; i++)
        round_trip(random_msg(MSG_SAMPLE));
    tr_msg_t *m = tr_msg_new(rt, MSG_SAMPLE);
    sample_t *s = tr_msg_body(m);
    s->i32 = INT32_MIN;
    s->u32 = UINT32_MAX;
    s->i64 = INT64_MIN;
    s->u64 = UINT64_MAX;
    s->f32 = -3.4e38f;
    s->f64 = 1e308;
    strcpy(s->label, "fifteen chars!!");
    round_trip(m);
}

static void test_codec_tensor_refs_round_trip(void **state)
{
    (void)state;
    for (unsigned dt = 0; dt < TR_DTYPE_COUNT_; dt++)
        for (unsigned dev = 0; dev < TR_DEVICE_COUNT_; dev++)
            for (unsigned nd = 0; nd <= TR_TENSOR_MAX_DIMS; nd++) {
                tr_msg_t *m = random_msg(MSG_SAMPLE);
                tr_tensor_ref_t *t = &((sample_t *)tr_msg_body(m))->grad;
                t->dtype = (uint8_t)dt;
                t->device_type = (uint8_t)dev;
                t->device_index = dev == TR_DEVICE_CPU ? -1 : (int16_t)nd;
                t->ndim = (uint8_t)nd;
                for (unsigned i = 0; i < TR_TENSOR_MAX_DIMS; i++)
                    t->shape[i] = i < nd ? (int64_t)(i + 1) * 1000003 : 0;
                t->offset = UINT64_MAX - 10;
                t->length = 10; /* ends exactly at 2^64 - 1 */
                round_trip(m);
            }
}

/* --- rejection helpers ----------------------------------------------------------------- */

/* Decodes buf and checks it is rejected with TR_EDECODE, an error containing each of the
 * NULL-terminated substrings, and no message. */
static void expect_reject(const void *buf, size_t len, ...)
{
    char err[256];
    tr_msg_t *m = (tr_msg_t *)(uintptr_t)1;
    int rc = tr_msg_decode(rt, buf, len, &m, err, sizeof(err));
    if (rc != TR_EDECODE) fail_msg("expected TR_EDECODE, got %s (%s)", tr_err_name(rc), err);
    assert_null(m);
    assert_true(strncmp(err, "decode", 6) == 0);
    va_list ap;
    va_start(ap, len);
    for (const char *want; (want = va_arg(ap, const char *));)
        if (!strstr(err, want)) fail_msg("error \"%s\" does not contain \"%s\"", err, want);
    va_end(ap);
}

/* A hand-built payload: the tests write malformed ones with msgpack-c's packer. */
typedef struct builder {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} builder_t;

static void b_init(builder_t *b)
{
    msgpack_sbuffer_init(&b->sb);
    msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}

/* version, type, a zero envelope and the field count */
static void b_head(builder_t *b, uint32_t type, uint32_t n_fields)
{
    msgpack_pack_uint32(&b->pk, TR_MSG_WIRE_VERSION);
    msgpack_pack_uint32(&b->pk, type);
    for (int i = 0; i < 8; i++)
        msgpack_pack_uint64(&b->pk, 0);
    msgpack_pack_uint32(&b->pk, n_fields);
}

static void b_name(builder_t *b, const char *name)
{
    msgpack_pack_str_with_body(&b->pk, name, strlen(name));
}

/* A timer body whose field `bad` (an index, or -1 for none) is left for the caller. */
static void b_timer_until(builder_t *b, int bad)
{
    static const char *const names[] = {"timer_id", "tag", "deadline_ns", "fired_ns", "count"};
    b_head(b, TR_MSG_TIMER, 5);
    for (int i = 0; i < 5; i++) {
        b_name(b, names[i]);
        if (i == bad) return;
        msgpack_pack_uint64(&b->pk, (uint64_t)i);
    }
}

static void b_timer_after(builder_t *b, int bad)
{
    static const char *const names[] = {"timer_id", "tag", "deadline_ns", "fired_ns", "count"};
    for (int i = bad + 1; i < 5; i++) {
        b_name(b, names[i]);
        msgpack_pack_uint64(&b->pk, (uint64_t)i);
    }
}

static void b_reject(builder_t *b, ...)
{
    const char *want[4] = {0};
    va_list ap;
    va_start(ap, b);
    for (int i = 0; i < 3 && (want[i] = va_arg(ap, const char *)); i++)
        ;
    va_end(ap);
    expect_reject(b->sb.data, b->sb.size, want[0], want[1], want[2], NULL);
    msgpack_sbuffer_destroy(&b->sb);
}

/* --- malformed payloads ------------------------------------------------------------------ */

/* Which field each byte of an encoded message belongs to, from msgpack-c's own reading. */
static void field_of_each_byte(const tr_msg_t *m, const char *buf, size_t len, char (*label)[40])
{
    static const char *const env[] = {"flags", "sender",     "receiver", "seq",
                                      "step",  "micro_step", "flow_id",  "send_ns"};
    const tr_msg_desc_t *d = tr_msg_desc(m->type);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    for (unsigned obj = 0; off < len; obj++) {
        size_t start = off;
        assert_true(msgpack_unpack_next(&u, buf, len, &off) > 0);
        char name[40];
        if (obj == 0)
            strcpy(name, "'version'");
        else if (obj == 1)
            strcpy(name, "'type'");
        else if (obj < 10)
            snprintf(name, sizeof(name), "'envelope.%s'", env[obj - 2]);
        else if (obj == 10)
            strcpy(name, "'n_fields'");
        else
            snprintf(name, sizeof(name), "'%s'", d->fields[(obj - 11) / 2].name);
        for (size_t i = start; i < off; i++)
            strcpy(label[i], name);
    }
    msgpack_unpacked_destroy(&u);
}

static void test_codec_every_truncation_names_the_field(void **state)
{
    (void)state;
    const uint32_t types[] = {TR_MSG_TIMER, TR_MSG_EXIT, MSG_SAMPLE};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        tr_msg_t *m = random_msg(types[t]);
        char buf[512], label[512][40];
        size_t len;
        assert_int_equal(tr_msg_encode(m, buf, sizeof(buf), &len), 0);
        field_of_each_byte(m, buf, len, label);
        for (size_t cut = 0; cut < len; cut++)
            expect_reject(buf, cut, "truncated", label[cut], NULL);
        tr_msg_free(rt, m);
    }
}

static void test_codec_wrong_kinds_name_the_field(void **state)
{
    (void)state;
    static const char *const names[] = {"'timer_id'", "'tag'", "'deadline_ns'", "'fired_ns'",
                                        "'count'"};
    for (int bad = 0; bad < 5; bad++) { /* a string where each timer field wants a uint */
        builder_t b;
        b_init(&b);
        b_timer_until(&b, bad);
        b_name(&b, "x");
        b_timer_after(&b, bad);
        b_reject(&b, "decode 'timer'", names[bad], "expected unsigned integer, got string", NULL);
    }
    builder_t b;
    b_init(&b); /* a negative number for a uint */
    b_timer_until(&b, 2);
    msgpack_pack_int64(&b.pk, -5);
    b_timer_after(&b, 2);
    b_reject(&b, "'deadline_ns'", "got negative integer", NULL);

    b_init(&b); /* exit.reason: int32 out of range */
    b_head(&b, TR_MSG_EXIT, 1);
    b_name(&b, "reason");
    msgpack_pack_int64(&b.pk, (int64_t)INT32_MIN - 1);
    b_reject(&b, "decode 'exit'", "'reason'", "out of range", NULL);

    b_init(&b); /* exit.msg_type: uint32 out of range */
    b_head(&b, TR_MSG_EXIT, 1);
    b_name(&b, "msg_type");
    msgpack_pack_uint64(&b.pk, 1ull << 32);
    b_reject(&b, "'msg_type'", "out of range", NULL);

    b_init(&b); /* exit.actor: a string */
    b_head(&b, TR_MSG_EXIT, 1);
    b_name(&b, "actor");
    b_name(&b, "pong");
    b_reject(&b, "'actor'", "expected actor id", NULL);

    b_init(&b); /* stop.reason: an integer */
    b_head(&b, TR_MSG_STOP, 1);
    b_name(&b, "reason");
    msgpack_pack_int(&b.pk, 7);
    b_reject(&b, "decode 'stop'", "'reason'", "expected string, got unsigned integer", NULL);

    b_init(&b); /* poll.fd: a float */
    b_head(&b, TR_MSG_POLL, 1);
    b_name(&b, "fd");
    msgpack_pack_double(&b.pk, 3.0);
    b_reject(&b, "decode 'poll'", "'fd'", "got float 64", NULL);
}

static void test_codec_wrong_kinds_in_registered_type(void **state)
{
    (void)state;
    builder_t b;
    b_init(&b); /* bool given an integer */
    b_head(&b, MSG_SAMPLE, 1);
    b_name(&b, "flag");
    msgpack_pack_int(&b.pk, 1);
    b_reject(&b, "decode 'sample'", "'flag'", "expected boolean", NULL);

    b_init(&b); /* f32 given a string */
    b_head(&b, MSG_SAMPLE, 1);
    b_name(&b, "f32");
    b_name(&b, "1.5");
    b_reject(&b, "'f32'", "expected float, got string", NULL);

    b_init(&b); /* f32 given a float 64 beyond its range */
    b_head(&b, MSG_SAMPLE, 1);
    b_name(&b, "f32");
    msgpack_pack_double(&b.pk, 1e300);
    b_reject(&b, "'f32'", "out of range", NULL);

    b_init(&b); /* tensor given an integer */
    b_head(&b, MSG_SAMPLE, 1);
    b_name(&b, "grad");
    msgpack_pack_int(&b.pk, 3);
    b_reject(&b, "'grad'", "expected tensor ref (ext 1), got unsigned integer", NULL);

    b_init(&b); /* tensor given another extension type */
    b_head(&b, MSG_SAMPLE, 1);
    b_name(&b, "grad");
    msgpack_pack_ext_with_body(&b.pk, "\x90", 1, 2);
    b_reject(&b, "'grad'", "got ext 2", NULL);

    b_init(&b); /* i64 given a map */
    b_head(&b, MSG_SAMPLE, 1);
    b_name(&b, "i64");
    msgpack_pack_map(&b.pk, 0);
    b_reject(&b, "'i64'", "got map", NULL);
}

static void test_codec_bad_structure_is_rejected(void **state)
{
    (void)state;
    builder_t b;
    b_init(&b); /* unknown type id */
    b_head(&b, 77, 0);
    b_reject(&b, "field 'type'", "unknown message type 77", NULL);

    b_init(&b); /* unknown application type id */
    b_head(&b, TR_MSG_USER + 999, 0);
    b_reject(&b, "field 'type'", "unknown message type", NULL);

    b_init(&b); /* a future format version */
    msgpack_pack_uint32(&b.pk, 2);
    b_reject(&b, "field 'version'", "format version 2 not supported", NULL);

    b_init(&b); /* version given as a string */
    b_name(&b, "1");
    b_reject(&b, "field 'version'", "expected unsigned integer, got string", NULL);

    b_init(&b); /* a missing field */
    b_head(&b, TR_MSG_TIMER, 4);
    for (int i = 0; i < 4; i++) {
        static const char *const names[] = {"timer_id", "tag", "deadline_ns", "fired_ns"};
        b_name(&b, names[i]);
        msgpack_pack_uint64(&b.pk, 1);
    }
    b_reject(&b, "decode 'timer'", "field 'count'", "missing");

    b_init(&b); /* an extra field: more than the type has */
    b_head(&b, TR_MSG_TIMER, 6);
    b_reject(&b, "field 'n_fields'", "got 6", NULL);

    b_init(&b); /* an unknown field name */
    b_head(&b, TR_MSG_TIMER, 5);
    b_name(&b, "bogus");
    msgpack_pack_uint64(&b.pk, 1);
    b_reject(&b, "decode 'timer'", "field 'bogus'", "unknown field");

    b_init(&b); /* a field given twice */
    b_timer_until(&b, 1);
    msgpack_pack_uint64(&b.pk, 1);
    b_name(&b, "tag");
    msgpack_pack_uint64(&b.pk, 1);
    b_reject(&b, "field 'tag'", "appears twice", NULL);

    b_init(&b); /* an envelope field mistyped */
    msgpack_pack_uint32(&b.pk, 1);
    msgpack_pack_uint32(&b.pk, TR_MSG_TIMER);
    for (int i = 0; i < 3; i++)
        msgpack_pack_uint64(&b.pk, 0);
    b_name(&b, "seq");
    b_reject(&b, "decode 'timer'", "field 'envelope.seq'", "got string");

    b_init(&b); /* micro_step beyond 32 bits */
    msgpack_pack_uint32(&b.pk, 1);
    msgpack_pack_uint32(&b.pk, TR_MSG_TIMER);
    for (int i = 0; i < 5; i++)
        msgpack_pack_uint64(&b.pk, 0);
    msgpack_pack_uint64(&b.pk, 1ull << 40);
    b_reject(&b, "field 'envelope.micro_step'", "out of range", NULL);

    b_init(&b); /* trailing bytes after a valid message */
    b_timer_until(&b, -1);
    msgpack_pack_nil(&b.pk);
    b_reject(&b, "decode 'timer'", "1 trailing bytes", NULL);
}

static void test_codec_strings_are_bounded(void **state)
{
    (void)state;
    char reason[49];
    memset(reason, 'r', 48);
    reason[48] = '\0';
    builder_t b;
    b_init(&b); /* 48 bytes do not fit char[48] with its NUL */
    b_head(&b, TR_MSG_STOP, 1);
    b_name(&b, "reason");
    b_name(&b, reason);
    b_reject(&b, "decode 'stop'", "field 'reason'", "longer than its capacity");

    b_init(&b); /* a NUL inside would silently cut the C string */
    b_head(&b, TR_MSG_STOP, 1);
    b_name(&b, "reason");
    msgpack_pack_str_with_body(&b.pk, "ab\0cd", 5);
    b_reject(&b, "field 'reason'", "NUL", NULL);

    b_init(&b); /* 47 bytes fit */
    b_head(&b, TR_MSG_STOP, 1);
    b_name(&b, "reason");
    b_name(&b, reason + 1);
    tr_msg_t *m = NULL;
    assert_int_equal(tr_msg_decode(rt, b.sb.data, b.sb.size, &m, NULL, 0), 0);
    assert_string_equal(TR_MSG_AS(m, stop)->reason, reason + 1);
    tr_msg_free(rt, m);
    msgpack_sbuffer_destroy(&b.sb);
}

static void pack_nested(msgpack_packer *pk, int depth)
{
    for (int i = 0; i < depth; i++)
        msgpack_pack_array(pk, 1);
    msgpack_pack_int(pk, 1);
}

static void test_codec_nesting_and_size_are_bounded(void **state)
{
    (void)state;
    builder_t b;
    b_init(&b); /* 9 levels: more than TR_MSG_MAX_DEPTH */
    b_timer_until(&b, 1);
    pack_nested(&b.pk, TR_MSG_MAX_DEPTH + 1);
    b_reject(&b, "field 'tag'", "nesting deeper than 8", NULL);

    b_init(&b); /* 8 levels: within the bound, but still not an integer */
    b_timer_until(&b, 1);
    pack_nested(&b.pk, TR_MSG_MAX_DEPTH);
    b_reject(&b, "field 'tag'", "expected unsigned integer, got array", NULL);

    b_init(&b); /* 100 levels: beyond msgpack-c's own stack */
    b_timer_until(&b, 1);
    pack_nested(&b.pk, 100);
    b_reject(&b, "field 'tag'", "nesting deeper than 8", NULL);

    b_init(&b); /* a map claiming 2^32-1 pairs in a few bytes */
    b_timer_until(&b, 1);
    msgpack_sbuffer_write(&b.sb, "\xdf\xff\xff\xff\xff\x01", 6);
    b_reject(&b, "field 'tag'", "claims more elements than the 6 bytes left", NULL);

    b_init(&b); /* the same, nested in an array */
    b_timer_until(&b, 1);
    msgpack_sbuffer_write(&b.sb, "\x91\xdd\xff\xff\xff\xff\x01", 7);
    b_reject(&b, "field 'tag'", "claims more elements", NULL);

    b_init(&b); /* and inside a tensor reference's payload */
    b_head(&b, MSG_SAMPLE, 1);
    b_name(&b, "grad");
    msgpack_pack_ext_with_body(&b.pk, "\x97\x01\x02\x03\x00\x00\x00\xdc\xff\xff", 10,
                               TR_MSGPACK_EXT_TENSOR);
    b_reject(&b, "field 'grad'", "claims more elements", NULL);

    char *big = calloc(TR_MSG_MAX_ENCODED + 1, 1);
    assert_non_null(big);
    expect_reject(big, TR_MSG_MAX_ENCODED + 1, "1048577 bytes", "more than the 1048576", NULL);
    free(big);
}

/* A sample message whose grad is the ext payload p[0..n) (ext type `ext`). */
static void b_sample_tensor(builder_t *b, const char *p, size_t n, int8_t ext)
{
    b_init(b);
    b_head(b, MSG_SAMPLE, 1);
    b_name(b, "grad");
    msgpack_pack_ext_with_body(&b->pk, p, n, ext);
}

/* The payload [buffer_id, offset, length, dtype, device_type, device_index, shape]. */
static size_t tensor_payload(char *out, uint64_t off, uint64_t len, uint64_t dtype, uint64_t dev,
                             int64_t idx, int ndim, int64_t dim)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 7);
    msgpack_pack_uint64(&pk, 42);
    msgpack_pack_uint64(&pk, off);
    msgpack_pack_uint64(&pk, len);
    msgpack_pack_uint64(&pk, dtype);
    msgpack_pack_uint64(&pk, dev);
    msgpack_pack_int64(&pk, idx);
    msgpack_pack_array(&pk, (size_t)ndim);
    for (int i = 0; i < ndim; i++)
        msgpack_pack_int64(&pk, dim);
    size_t n = sb.size;
    memcpy(out, sb.data, n);
    msgpack_sbuffer_destroy(&sb);
    return n;
}

static void test_codec_bad_tensor_refs_are_rejected(void **state)
{
    (void)state;
    char p[256];
    size_t n;
    builder_t b;
    n = tensor_payload(p, 0, 64, 0, 0, 0, 2, 4); /* valid, as a control */
    b_sample_tensor(&b, p, n, TR_MSGPACK_EXT_TENSOR);
    b_reject(&b, "field 'flag'", "missing", NULL); /* the tensor itself passed */

    n = tensor_payload(p, 0, 64, TR_DTYPE_COUNT_, 0, 0, 1, 4);
    b_sample_tensor(&b, p, n, TR_MSGPACK_EXT_TENSOR);
    b_reject(&b, "decode 'sample'", "field 'grad'", "dtype 8 out of range");

    n = tensor_payload(p, 0, 64, 0, TR_DEVICE_COUNT_, 0, 1, 4);
    b_sample_tensor(&b, p, n, TR_MSGPACK_EXT_TENSOR);
    b_reject(&b, "field 'grad'", "device_type 3 out of range", NULL);

    n = tensor_payload(p, 0, 64, 0, 1, -2, 1, 4);
    b_sample_tensor(&b, p, n, TR_MSGPACK_EXT_TENSOR);
    b_reject(&b, "field 'grad'", "device_index -2", NULL);

    n = tensor_payload(p, 0, 64, 0, 1, 70000, 1, 4);
    b_sample_tensor(&b, p, n, TR_MSGPACK_EXT_TENSOR);
    b_reject(&b, "field 'grad'", "device_index (int16)", "out of range");

    n = tensor_payload(p, 0, 64, 0, 0, 0, TR_TENSOR_MAX_DIMS + 1, 4);
    b_sample_tensor(&b, p, n, TR_MSGPACK_EXT_TENSOR);
    b_reject(&b, "field 'grad'", "7 dimensions, more than 6", NULL);

    n = tensor_payload(p, 0, 64, 0, 0, 0, 2, -4);
    b_sample_tensor(&b, p, n, TR_MSGPACK_EXT_TENSOR);
    b_reject(&b, "field 'grad'", "negative", NULL);

    n = tensor_payload(p, UINT64_MAX - 3, 4, 0, 0, 0, 1, 4);
    b_sample_tensor(&b, p, n, TR_MSGPACK_EXT_TENSOR);
    b_reject(&b, "field 'grad'", "overflows", NULL);

    n = tensor_payload(p, 0, 64, 0, 0, 0, 1, 4);
    b_sample_tensor(&b, p, n - 3, TR_MSGPACK_EXT_TENSOR); /* cut inside the shape */
    b_reject(&b, "field 'grad'", "tensor ref", NULL);

    n = tensor_payload(p, 0, 64, 0, 0, 0, 1, 4);
    p[n] = '\xc0'; /* a nil after the array */
    b_sample_tensor(&b, p, n + 1, TR_MSGPACK_EXT_TENSOR);
    b_reject(&b, "field 'grad'", "1 bytes after its array", NULL);

    b_sample_tensor(&b, "\x93\x01\x02\x03", 4, TR_MSGPACK_EXT_TENSOR); /* 3 elements */
    b_reject(&b, "field 'grad'", "expected 7 elements, got 3", NULL);

    b_sample_tensor(&b, "\x05", 1, TR_MSGPACK_EXT_TENSOR); /* not an array */
    b_reject(&b, "field 'grad'", "expected array, got unsigned integer", NULL);

    b_sample_tensor(&b, "\x97\x01\x02\x03\x00\x00\x00\x05", 8, TR_MSGPACK_EXT_TENSOR);
    b_reject(&b, "field 'grad'", "expected shape array", NULL);

    b_sample_tensor(&b, "\x97\xa1x\x02\x03\x00\x00\x00\x90", 9, TR_MSGPACK_EXT_TENSOR);
    b_reject(&b, "field 'grad'", "buffer_id", "got string");
}

static void test_codec_garbage_is_rejected(void **state)
{
    (void)state;
    expect_reject("", 0, "field 'version'", "truncated", NULL);
    expect_reject("\xc1", 1, "field 'version'", "malformed msgpack in the message at byte 0", NULL);
    expect_reject("\x01\xc1", 2, "field 'type'", "malformed", NULL);
    expect_reject("\x01\x03\xc1", 3, "decode 'timer'", "field 'envelope.flags'", NULL);
    char junk[300];
    for (int i = 0; i < 2000; i++) { /* random bytes: never a crash, never a message */
        size_t n = rnd() % sizeof(junk);
        for (size_t j = 0; j < n; j++)
            junk[j] = (char)rnd();
        if (n > 1 && (i & 1)) { /* a good start, so the envelope and body see junk too */
            junk[0] = 1;
            junk[1] = (char)(1 + rnd() % (TR_MSG_BUILTIN_COUNT_ - 1));
        }
        expect_reject(junk, n, NULL);
    }
}

static void test_codec_mutations_never_crash(void **state)
{
    (void)state;
    const uint32_t types[] = {TR_MSG_STOP, TR_MSG_EXIT, TR_MSG_TIMER, TR_MSG_POLL, MSG_SAMPLE};
    for (int i = 0; i < 5000; i++) {
        tr_msg_t *m = random_msg(types[rnd() % 5]), *back = NULL;
        char buf[512];
        size_t len;
        assert_int_equal(tr_msg_encode(m, buf, sizeof(buf), &len), 0);
        for (int k = 0; k < 3; k++)
            buf[rnd() % len] = (char)rnd();
        int rc = tr_msg_decode(rt, buf, len, &back, NULL, 0);
        assert_true(rc == 0 || rc == TR_EDECODE);
        assert_true((rc == 0) == (back != NULL));
        tr_msg_free(rt, back);
        tr_msg_free(rt, m);
    }
}

/* --- encoder errors and registration checks ------------------------------------------------ */

static void test_codec_encode_reports_errors(void **state)
{
    (void)state;
    tr_msg_t *m = random_msg(TR_MSG_TIMER);
    char buf[256];
    size_t need = 0, len = 0;
    assert_int_equal(tr_msg_encode(m, buf, 4, &need), TR_ENOSPC);
    assert_int_equal(tr_msg_encode(m, buf, sizeof(buf), &len), 0);
    assert_int_equal(need, len);
    assert_int_equal(tr_msg_encode(m, buf, len, &len), 0);
    tr_msg_free(rt, m);

    m = tr_msg_alloc(rt, TR_MSG_USER + 500, 8); /* no descriptor */
    assert_int_equal(tr_msg_encode(m, buf, sizeof(buf), &len), TR_ENOTSUP);
    tr_msg_free(rt, m);

    m = tr_msg_new(rt, TR_MSG_STOP); /* a string without its NUL */
    memset(TR_MSG_AS(m, stop)->reason, 'x', sizeof(TR_MSG_AS(m, stop)->reason));
    assert_int_equal(tr_msg_encode(m, buf, sizeof(buf), &len), TR_EINVAL);
    tr_msg_free(rt, m);

    m = tr_msg_new(rt, MSG_SAMPLE); /* a tensor ref the decoder would refuse */
    ((sample_t *)tr_msg_body(m))->grad.ndim = TR_TENSOR_MAX_DIMS + 1;
    assert_int_equal(tr_msg_encode(m, buf, sizeof(buf), &len), TR_EINVAL);
    tr_msg_free(rt, m);

    m = tr_msg_alloc(rt, TR_MSG_TIMER, 8); /* a body smaller than the type's */
    assert_int_equal(tr_msg_encode(m, buf, sizeof(buf), &len), TR_EINVAL);
    tr_msg_free(rt, m);
}

static void test_codec_register_checks_descriptors(void **state)
{
    (void)state;
    tr_field_desc_t f[2] = {{"a", TR_FIELD_U64, 0, 4, ""}, {"b", TR_FIELD_U64, 8, 8, ""}};
    tr_msg_desc_t d = {TR_MSG_USER + 300, "bad", "", 16, 2, f};
    assert_int_equal(tr_msg_type_register(&d), TR_EINVAL); /* u64 of 4 bytes */
    f[0].size = 8;
    f[1].name = "a";
    assert_int_equal(tr_msg_type_register(&d), TR_EINVAL); /* repeated name */
    f[1].name = "b";
    f[1].offset = 12;
    assert_int_equal(tr_msg_type_register(&d), TR_EINVAL); /* outside the body */
    assert_int_equal(tr_msg_type_register(&sample_desc), TR_EEXIST);
}

/* --- an actor that decodes what it receives -------------------------------------------- */

typedef struct receiver {
    int handled, rejected;
    uint64_t u64s[4];
    char last_error[256];
} receiver_t;

/* Receives MSG_RAW messages whose body is an encoded message; a bad one is logged and
 * dropped, a good one handled; a sample with flag set ends the run. */
static int receive(tr_ctx_t *ctx, tr_msg_t *msg)
{
    receiver_t *r = ctx->state;
    if (msg->type != MSG_RAW) return 0;
    tr_msg_t *m;
    char err[256];
    int rc = tr_msg_decode(ctx->rt, tr_msg_body(msg), msg->size, &m, err, sizeof(err));
    if (rc == TR_EDECODE) {
        r->rejected++;
        strcpy(r->last_error, err);
        return 0; /* logged by the codec; keep running */
    }
    if (rc < 0) return rc;
    sample_t *s = tr_msg_body(m);
    if (m->type == MSG_SAMPLE && r->handled < 4) r->u64s[r->handled] = s->u64;
    r->handled++;
    int last = m->type == MSG_SAMPLE && s->flag;
    tr_msg_free(ctx->rt, m);
    return last ? tr_actor_stop(ctx->rt, ctx->self) : 0;
}

/* Sends the encoding of a sample message (u64 = value, flag = last), cut to `cut` bytes
 * when cut is not 0, as a MSG_RAW. */
static void send_raw(tr_runtime_t *r, tr_actor_t to, uint64_t value, int last, size_t cut)
{
    tr_msg_t *m = tr_msg_new(r, MSG_SAMPLE);
    sample_t *s = tr_msg_body(m);
    s->u64 = value;
    s->flag = (uint8_t)last;
    strcpy(s->label, "raw");
    char buf[512];
    size_t len;
    assert_int_equal(tr_msg_encode(m, buf, sizeof(buf), &len), 0);
    tr_msg_free(r, m);
    if (cut) len = cut;
    tr_msg_t *raw = tr_msg_alloc(r, MSG_RAW, len);
    assert_non_null(raw);
    memcpy(tr_msg_body(raw), buf, len);
    assert_int_equal(tr_actor_send(r, to, raw), 0);
}

static void test_codec_receiver_survives_a_malformed_payload(void **state)
{
    (void)state;
    tr_runtime_t *r;
    tr_runtime_opts_t opts = {.n_workers = 2};
    assert_int_equal(tr_runtime_init(&r, &opts), 0);
    receiver_t st = {0};
    tr_actor_t a;
    assert_int_equal(tr_actor_spawn(r, receive, &st, NULL, &a), 0);
    send_raw(r, a, 11, 0, 0);
    send_raw(r, a, 22, 0, 40); /* truncated */
    send_raw(r, a, 33, 0, 0);
    tr_msg_t *junk = tr_msg_alloc(r, MSG_RAW, 4);
    memcpy(tr_msg_body(junk), "\x01\x03\xa1x", 4); /* a timer whose flags are a string */
    assert_int_equal(tr_actor_send(r, a, junk), 0);
    send_raw(r, a, 44, 1, 0);
    assert_int_equal(tr_runtime_run(r), 0);
    tr_runtime_close(r);
    assert_int_equal(st.rejected, 2);
    assert_int_equal(st.handled, 3);
    assert_int_equal(st.u64s[0], 11);
    assert_int_equal(st.u64s[1], 33);
    assert_int_equal(st.u64s[2], 44);
    assert_non_null(strstr(st.last_error, "field 'envelope.flags'"));
    assert_non_null(strstr(st.last_error, "got string"));
}

/* --- the group ----------------------------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    tr_runtime_opts_t opts = {.n_workers = 1};
    if (tr_runtime_init(&rt, &opts) < 0) return -1;
    return tr_msg_type_register(&sample_desc);
}

static int teardown(void **state)
{
    (void)state;
    tr_runtime_run(rt);
    tr_runtime_close(rt);
    return 0;
}

/* Checkpoint headers pack int fields with tr__mp_pack_kv_int (int64) and unsigned ones with
 * tr__mp_pack_kv_uint; the files must stay the bytes msgpack_pack_int wrote before. */
static void test_codec_mpack_kv_helpers_pack_the_shortest_form(void **state)
{
    (void)state;
    static const int64_t values[] = {0,   1,   127,  128,  255,    256,    65535,     65536,    -1,
                                     -32, -33, -128, -129, -32768, -32769, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        int v = (int)values[i];
        msgpack_sbuffer a, b, c;
        msgpack_packer pa, pb, pc;
        msgpack_sbuffer_init(&a);
        msgpack_sbuffer_init(&b);
        msgpack_sbuffer_init(&c);
        msgpack_packer_init(&pa, &a, msgpack_sbuffer_write);
        msgpack_packer_init(&pb, &b, msgpack_sbuffer_write);
        msgpack_packer_init(&pc, &c, msgpack_sbuffer_write);
        tr__mp_pack_str(&pa, "world");
        msgpack_pack_int(&pa, v);
        tr__mp_pack_kv_int(&pb, "world", v);
        if (v >= 0) tr__mp_pack_kv_uint(&pc, "world", (uint64_t)v);
        assert_int_equal(a.size, b.size);
        assert_memory_equal(a.data, b.data, a.size);
        if (v >= 0) {
            assert_int_equal(a.size, c.size);
            assert_memory_equal(a.data, c.data, a.size);
        }
        msgpack_sbuffer_destroy(&a);
        msgpack_sbuffer_destroy(&b);
        msgpack_sbuffer_destroy(&c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codec_builtin_types_round_trip),
        cmocka_unit_test(test_codec_registered_type_round_trips),
        cmocka_unit_test(test_codec_tensor_refs_round_trip),
        cmocka_unit_test(test_codec_every_truncation_names_the_field),
        cmocka_unit_test(test_codec_wrong_kinds_name_the_field),
        cmocka_unit_test(test_codec_wrong_kinds_in_registered_type),
        cmocka_unit_test(test_codec_bad_structure_is_rejected),
        cmocka_unit_test(test_codec_strings_are_bounded),
        cmocka_unit_test(test_codec_nesting_and_size_are_bounded),
        cmocka_unit_test(test_codec_bad_tensor_refs_are_rejected),
        cmocka_unit_test(test_codec_garbage_is_rejected),
        cmocka_unit_test(test_codec_mutations_never_crash),
        cmocka_unit_test(test_codec_encode_reports_errors),
        cmocka_unit_test(test_codec_register_checks_descriptors),
        cmocka_unit_test(test_codec_receiver_survives_a_malformed_payload),
        cmocka_unit_test(test_codec_mpack_kv_helpers_pack_the_shortest_form),
    };
    return cmocka_run_group_tests_name("codec", tests, setup, teardown);
}
