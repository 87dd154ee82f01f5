/* mpack: small helpers over msgpack-c for files and messages built by hand (checkpoint
 * headers, the comm watchdog's tables): pack a C string or one key: value entry of a map, and
 * find a key in a map object. */
#ifndef TR_RUNTIME_MSG_MPACK_H
#define TR_RUNTIME_MSG_MPACK_H

#include <string.h>

#include <msgpack.h>

static inline void tr__mp_pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

/* One entry of a map packed by hand: the key, then the value. msgpack-c packs every integer in
 * its shortest form, so the C type a value had (int, int64_t, uint64_t) does not show in the
 * bytes. */
static inline void tr__mp_pack_kv_str(msgpack_packer *pk, const char *key, const char *s)
{
    tr__mp_pack_str(pk, key);
    tr__mp_pack_str(pk, s);
}

static inline void tr__mp_pack_kv_int(msgpack_packer *pk, const char *key, int64_t v)
{
    tr__mp_pack_str(pk, key);
    msgpack_pack_int64(pk, v);
}

static inline void tr__mp_pack_kv_uint(msgpack_packer *pk, const char *key, uint64_t v)
{
    tr__mp_pack_str(pk, key);
    msgpack_pack_uint64(pk, v);
}

static inline void tr__mp_pack_kv_double(msgpack_packer *pk, const char *key, double v)
{
    tr__mp_pack_str(pk, key);
    msgpack_pack_double(pk, v);
}

/* The value stored under key in a map object; NULL when absent or map is not a map. */
static inline const msgpack_object *tr__mp_field(const msgpack_object *map, const char *key)
{
    if (map->type != MSGPACK_OBJECT_MAP) return NULL;
    size_t n = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == n &&
            !memcmp(kv->key.via.str.ptr, key, n))
            return &kv->val;
    }
    return NULL;
}

#endif
