/* Wire-check mode, the fixed-array and byte-string field kinds, and the buffer registry.
 *
 * With wire_check on, every message crosses its msgpack form: a user payload described with
 * the new kinds (float v[16], a byte string) arrives intact as a decoded copy; a type without
 * a descriptor, or a body that would not decode, fails its send and stays with the sender.
 * The registry resolves references only inside registered buffers, with the dtype and device
 * they were registered with, and never again after unregistration. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "troupe.h"

enum { MSG_VEC = TR_MSG_USER + 40, MSG_UNDESCRIBED = TR_MSG_USER + 41 };

typedef struct vec_msg {
    float v[16];
    uint64_t ids[3];
    TR_BYTES(40) blob;
    char label[8];
} vec_msg_t;

#define VF(kind, f, doc)                                                                           \
    {                                                                                              \
#f, TR_FIELD_##kind, offsetof(vec_msg_t, f), sizeof(((vec_msg_t *)0)->f), doc              \
    }
static const tr_field_desc_t vec_fields[] = {
    VF(ARRAY_F32, v, "a user's float v[16]"),
    VF(ARRAY_U64, ids, "three ids"),
    VF(BYTES, blob, "up to 40 bytes"),
    VF(STR, label, "a label"),
};
#undef VF
static const tr_msg_desc_t vec_desc = {
    MSG_VEC, "vec", "A user payload with arrays and bytes.", sizeof(vec_msg_t), 4, vec_fields};

static void fill(vec_msg_t *b)
{
    for (int i = 0; i < 16; i++)
        b->v[i] = (float)i * 0.5f - 3.25f;
    b->ids[0] = 1;
    b->ids[1] = UINT64_MAX;
    b->ids[2] = 42;
    b->blob.len = 5;
    memcpy(b->blob.data, "a\0b\xff", 5);
    strcpy(b->label, "seven");
}

/* --- the codec ------------------------------------------------------------------------- */

static void test_wire_array_and_bytes_round_trip(void **state)
{
    tr_runtime_t *rt = *state;
    tr_msg_t *m = tr_msg_new(rt, MSG_VEC);
    assert_non_null(m);
    fill(tr_msg_body(m));
    unsigned char buf[1024];
    size_t len;
    assert_int_equal(tr_msg_encode(m, buf, sizeof(buf), &len), 0);
    tr_msg_t *d;
    assert_int_equal(tr_msg_decode(rt, buf, len, &d, NULL, 0), 0);
    assert_memory_equal(tr_msg_body(d), tr_msg_body(m), offsetof(vec_msg_t, blob) + 4 + 5);
    assert_string_equal(((vec_msg_t *)tr_msg_body(d))->label, "seven");
    tr_msg_free(rt, d);
    tr_msg_free(rt, m);
}

/* Re-encodes a vec body with one field's value replaced by raw msgpack bytes. */
static size_t encode_with(tr_runtime_t *rt, const char *field, const unsigned char *raw,
                          size_t raw_len, unsigned char *out)
{
    tr_msg_t *m = tr_msg_new(rt, MSG_VEC);
    fill(tr_msg_body(m));
    unsigned char buf[1024];
    size_t len;
    assert_int_equal(tr_msg_encode(m, buf, sizeof(buf), &len), 0);
    tr_msg_free(rt, m);
    /* find "<field>" as a msgpack fixstr and the value after it */
    size_t fl = strlen(field);
    for (size_t i = 0; i + fl + 1 < len; i++)
        if (buf[i] == (0xa0 | fl) && !memcmp(buf + i + 1, field, fl)) {
            size_t at = i + 1 + fl;
            /* v: array16 (0xdc 00 10) of 16 float32 (5 bytes each); blob: bin8 of 5 bytes */
            size_t vlen = !strcmp(field, "v") ? 3 + 16 * 5 : 2 + 5;
            memcpy(out, buf, at);
            memcpy(out + at, raw, raw_len);
            memcpy(out + at + raw_len, buf + at + vlen, len - at - vlen);
            return len - vlen + raw_len;
        }
    fail_msg("field %s not found", field);
    return 0;
}

static void test_wire_decoder_checks_counts_and_capacity(void **state)
{
    tr_runtime_t *rt = *state;
    unsigned char raw[256], out[1200];
    char why[256];
    tr_msg_t *d = NULL;
    /* an array of 2 where 16 are declared */
    raw[0] = 0x92;
    raw[1] = 0x01;
    raw[2] = 0x02;
    size_t n = encode_with(rt, "v", raw, 3, out);
    assert_int_equal(tr_msg_decode(rt, out, n, &d, why, sizeof(why)), TR_EDECODE);
    assert_non_null(strstr(why, "'v'"));
    assert_non_null(strstr(why, "expected array of 16 elements, got 2"));
    /* bin8 of 41 bytes: one more than the capacity */
    raw[0] = 0xc4;
    raw[1] = 41;
    memset(raw + 2, 7, 41);
    n = encode_with(rt, "blob", raw, 43, out);
    assert_int_equal(tr_msg_decode(rt, out, n, &d, why, sizeof(why)), TR_EDECODE);
    assert_non_null(strstr(why, "byte string of 41 bytes, longer than its capacity (40)"));
    /* a string where bytes are declared */
    raw[0] = 0xa3;
    memcpy(raw + 1, "abc", 3);
    n = encode_with(rt, "blob", raw, 4, out);
    assert_int_equal(tr_msg_decode(rt, out, n, &d, why, sizeof(why)), TR_EDECODE);
    assert_non_null(strstr(why, "expected bin"));
    /* encoding refuses a length past the capacity */
    tr_msg_t *m = tr_msg_new(rt, MSG_VEC);
    ((vec_msg_t *)tr_msg_body(m))->blob.len = 41;
    size_t len;
    assert_int_equal(tr_msg_encode(m, out, sizeof(out), &len), TR_EINVAL);
    tr_msg_free(rt, m);
}

static void test_wire_register_checks_array_and_bytes_sizes(void **state)
{
    (void)state;
    tr_field_desc_t f[1] = {{"v", TR_FIELD_ARRAY_F32, 0, 6, "not whole floats"}};
    tr_msg_desc_t d = {TR_MSG_USER + 50, "bad", "", 64, 1, f};
    assert_int_equal(tr_msg_type_register(&d), TR_EINVAL);
    f[0] = (tr_field_desc_t){"b", TR_FIELD_BYTES, 0, 4, "no room for a byte"};
    assert_int_equal(tr_msg_type_register(&d), TR_EINVAL);
    f[0] = (tr_field_desc_t){"v", TR_FIELD_ARRAY_F64, 0, 64, "eight doubles"};
    assert_int_equal(tr_msg_type_register(&d), 0);
}

/* --- wire-check mode -------------------------------------------------------------------- */

typedef struct seen {
    int count;
    uint32_t flags;
    vec_msg_t body;
    tr_actor_t sender;
    uint64_t step;
} seen_t;

static int record(tr_ctx_t *ctx, tr_msg_t *msg)
{
    seen_t *s = ctx->state;
    if (msg->type != MSG_VEC) return 0;
    s->count++;
    s->flags = msg->flags;
    s->sender = msg->sender;
    s->step = msg->step;
    memcpy(&s->body, tr_msg_body(msg), sizeof(s->body));
    return tr_actor_stop(ctx->rt, ctx->self);
}

static void test_wire_check_delivers_a_decoded_copy(void **state)
{
    (void)state;
    tr_runtime_t *rt;
    tr_runtime_opts_t o = {.n_workers = 2, .wire_check = 1};
    assert_int_equal(tr_runtime_init(&rt, &o), 0);
    seen_t s = {0};
    tr_actor_t a;
    assert_int_equal(tr_actor_spawn(rt, record, &s, NULL, &a), 0);
    tr_msg_t *m = tr_msg_new(rt, MSG_VEC);
    fill(tr_msg_body(m));
    m->step = 77;
    vec_msg_t sent = *(vec_msg_t *)tr_msg_body(m);
    assert_int_equal(tr_actor_send(rt, a, m), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    assert_int_equal(s.count, 1);
    assert_int_equal(s.flags & TR_MSG_F_WIRE, 0); /* the behaviour sees the decoded message */
    assert_int_equal(s.step, 77);
    assert_memory_equal(&s.body, &sent, offsetof(vec_msg_t, blob) + 4 + 5);
    tr_runtime_close(rt);
}

static int ignore(tr_ctx_t *ctx, tr_msg_t *msg)
{
    (void)msg;
    return tr_actor_stop(ctx->rt, ctx->self);
}

static void test_wire_check_refuses_what_cannot_leave_the_process(void **state)
{
    (void)state;
    tr_runtime_t *rt;
    tr_runtime_opts_t o = {.n_workers = 1, .wire_check = 1};
    assert_int_equal(tr_runtime_init(&rt, &o), 0);
    tr_actor_t a;
    assert_int_equal(tr_actor_spawn(rt, ignore, NULL, NULL, &a), 0);
    /* a raw payload with no descriptor: the send fails and the message stays the sender's */
    tr_msg_t *raw = tr_msg_alloc(rt, MSG_UNDESCRIBED, 8);
    assert_int_equal(tr_actor_send(rt, a, raw), TR_ENOTSUP);
    assert_int_equal(raw->type, MSG_UNDESCRIBED);
    tr_msg_free(rt, raw);
    /* a string that fills its capacity without a NUL could not be decoded elsewhere */
    tr_msg_t *m = tr_msg_new(rt, MSG_VEC);
    memset(((vec_msg_t *)tr_msg_body(m))->label, 'x', 8);
    assert_int_equal(tr_actor_send(rt, a, m), TR_EINVAL);
    tr_msg_free(rt, m);
    /* a chain is all or nothing */
    tr_msg_t *chain[2] = {tr_msg_new(rt, MSG_VEC), tr_msg_alloc(rt, MSG_UNDESCRIBED, 4)};
    assert_int_equal(tr_actor_send_chain(rt, a, chain, 2), TR_ENOTSUP);
    tr_msg_free(rt, chain[0]);
    tr_msg_free(rt, chain[1]);
    assert_int_equal(tr_actor_send(rt, a, tr_msg_new(rt, MSG_VEC)), 0);
    assert_int_equal(tr_runtime_run(rt), 0);
    tr_runtime_close(rt);
}

/* --- the buffer registry ---------------------------------------------------------------- */

/* tr_buffer_alloc_host: 64-byte aligned host memory, registered as the caller named it, that
 * resolves whole; a bad argument is refused and allocates nothing. */
static void test_buffer_alloc_host_registers_aligned_memory(void **state)
{
    tr_runtime_t *rt = *state;
    tr_buffer_info_t info = {
        .name = "test/host", .bytes = 100, .dtype = TR_DTYPE_I32, .lifetime = TR_BUFFER_STEP};
    void *mem = NULL;
    uint64_t id = 0;
    assert_int_equal(tr_buffer_alloc_host(rt, &info, &mem, &id), 0);
    assert_non_null(mem);
    assert_int_equal((uintptr_t)mem % 64, 0);
    tr_buffer_info_t got;
    assert_int_equal(tr_buffer_info(rt, id, &got), 0);
    assert_string_equal(got.name, "test/host");
    assert_ptr_equal(got.base, mem);
    assert_int_equal(got.bytes, 100);
    assert_int_equal(got.alignment, 64);
    assert_int_equal(got.device_type, TR_DEVICE_CPU);
    assert_int_equal(got.lifetime, TR_BUFFER_STEP);
    tr_tensor_ref_t r;
    assert_int_equal(tr_buffer_ref(rt, id, 0, 100, TR_DTYPE_I32, &r), 0);
    void *p;
    char why[200];
    assert_int_equal(tr_buffer_resolve(rt, &r, &p, why, sizeof(why)), 0);
    assert_ptr_equal(p, mem);
    assert_int_equal(tr_buffer_unregister(rt, id), 0);
    free(mem);
    assert_int_equal(tr_buffer_alloc_host(rt, &info, NULL, &id), TR_EINVAL);
    /* a bad dtype: allocated, refused by the registry, and handed back to be freed */
    info.dtype = 200;
    mem = NULL;
    assert_int_equal(tr_buffer_alloc_host(rt, &info, &mem, &id), TR_EINVAL);
    assert_non_null(mem);
    free(mem);
}

static void test_buffer_registry_resolves_only_what_is_registered(void **state)
{
    tr_runtime_t *rt = *state;
    float data[64];
    tr_buffer_info_t info = {.name = "test/data",
                             .base = data,
                             .bytes = sizeof(data),
                             .dtype = TR_DTYPE_F32,
                             .device_type = TR_DEVICE_CPU};
    uint64_t id;
    assert_int_equal(tr_buffer_register(rt, &info, &id), 0);
    tr_buffer_info_t got;
    assert_int_equal(tr_buffer_info(rt, id, &got), 0);
    assert_string_equal(got.name, "test/data");
    assert_true(got.alignment >= 4);
    tr_tensor_ref_t r;
    assert_int_equal(tr_buffer_ref(rt, id, 16, 32, TR_DTYPE_F32, &r), 0);
    assert_int_equal(r.shape[0], 8);
    void *p;
    char why[200];
    assert_int_equal(tr_buffer_resolve(rt, &r, &p, why, sizeof(why)), 0);
    assert_ptr_equal(p, (char *)data + 16);
    assert_int_equal(tr_buffer_ref(rt, id, 200, 100, TR_DTYPE_F32, &r), TR_ERANGE);
    r.length = 1000;
    assert_int_equal(tr_buffer_resolve(rt, &r, &p, why, sizeof(why)), TR_ERANGE);
    assert_null(p);
    assert_non_null(strstr(why, "buffer 'test/data': bytes [16, 1016) are outside its 256 bytes"));
    r.length = 32;
    r.dtype = TR_DTYPE_I32;
    assert_int_equal(tr_buffer_resolve(rt, &r, &p, why, sizeof(why)), TR_EMISMATCH);
    assert_non_null(strstr(why, "test/data"));
    assert_non_null(strstr(why, "the reference says i32 on device 0:0, the buffer is f32 on"));
    r.dtype = TR_DTYPE_F32;
    assert_int_equal(tr_buffer_unregister(rt, id), 0);
    assert_int_equal(tr_buffer_resolve(rt, &r, &p, why, sizeof(why)), TR_ENOENT);
    assert_non_null(strstr(why, "is not registered"));
    /* the slot is reused with a new generation: the old id stays dead */
    uint64_t id2;
    assert_int_equal(tr_buffer_register(rt, &info, &id2), 0);
    assert_true(id2 != id);
    assert_int_equal(tr_buffer_resolve(rt, &r, &p, NULL, 0), TR_ENOENT);
    assert_int_equal(tr_buffer_unregister(rt, id), TR_ENOENT);
    assert_int_equal(tr_buffer_unregister(rt, id2), 0);
    info.dtype = 99;
    assert_int_equal(tr_buffer_register(rt, &info, &id), TR_EINVAL);
}

static int setup(void **state)
{
    tr_runtime_t *rt;
    tr_runtime_opts_t o = {.n_workers = 1};
    if (tr_runtime_init(&rt, &o) < 0) return -1;
    *state = rt;
    return tr_msg_type_register(&vec_desc);
}

static int teardown(void **state)
{
    tr_runtime_close(*state);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_array_and_bytes_round_trip),
        cmocka_unit_test(test_wire_decoder_checks_counts_and_capacity),
        cmocka_unit_test(test_wire_register_checks_array_and_bytes_sizes),
        cmocka_unit_test(test_wire_check_delivers_a_decoded_copy),
        cmocka_unit_test(test_wire_check_refuses_what_cannot_leave_the_process),
        cmocka_unit_test(test_buffer_registry_resolves_only_what_is_registered),
        cmocka_unit_test(test_buffer_alloc_host_registers_aligned_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
