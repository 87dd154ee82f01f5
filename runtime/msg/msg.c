/* msg.c: message allocation, the built-in message table's descriptors (generated from
 * troupe/msg_types.def) and the registry of application message types. */
#include <stdio.h>
#include <string.h>

#include "runtime/core/internal.h"

/* --- descriptors generated from the table ---------------------------------------------- */

#define FIELD_DESC(S, kind, fname, cap, doc)                                                       \
    {#fname, TR_FIELD_##kind, (uint32_t)offsetof(S, fname), (uint32_t)sizeof(((S *)0)->fname), doc},
#define FIELDS_ARRAY(NAME, name, doc)                                                              \
    static const tr_field_desc_t fields_##name[] = {                                               \
        TR_MSG_FIELDS_##name(FIELD_DESC, tr_msg_##name##_t)};
TR_MSG_TYPES(FIELDS_ARRAY)
#undef FIELDS_ARRAY

static const tr_msg_desc_t builtin[TR_MSG_BUILTIN_COUNT_] = {
#define DESC(NAME, name, doc)                                                                      \
    [TR_MSG_##NAME] = {TR_MSG_##NAME,                                                              \
                       #name,                                                                      \
                       doc,                                                                        \
                       sizeof(tr_msg_##name##_t),                                                  \
                       sizeof(fields_##name) / sizeof(fields_##name[0]),                           \
                       fields_##name},
    TR_MSG_TYPES(DESC)
#undef DESC
};

/* --- application types ----------------------------------------------------------------- */

#define MAX_USER_TYPES 1024
static const tr_msg_desc_t *_Atomic user_types[MAX_USER_TYPES];

const tr_msg_desc_t *tr_msg_desc(uint32_t type)
{
    if (type > TR_MSG_NONE && type < TR_MSG_BUILTIN_COUNT_) return &builtin[type];
    if (type >= TR_MSG_USER && type < TR_MSG_USER + MAX_USER_TYPES)
        /* acquire: pairs with the release in tr_msg_type_register */
        return atomic_load_explicit(&user_types[type - TR_MSG_USER], memory_order_acquire);
    return NULL;
}

const char *tr_msg_type_name(uint32_t type)
{
    const tr_msg_desc_t *d = tr_msg_desc(type);
    return d ? d->name : "unknown";
}

/* The bytes a field of kind k occupies: for an array, one element's; 0 for STR and BYTES,
 * whose size comes from their capacity. */
static uint32_t kind_size(tr_field_kind_t k)
{
    static const uint32_t sizes[TR_FIELD_KIND_COUNT_] = {[TR_FIELD_BOOL] = 1,
                                                         [TR_FIELD_I32] = 4,
                                                         [TR_FIELD_U32] = 4,
                                                         [TR_FIELD_I64] = 8,
                                                         [TR_FIELD_U64] = 8,
                                                         [TR_FIELD_F32] = 4,
                                                         [TR_FIELD_F64] = 8,
                                                         [TR_FIELD_STR] = 0,
                                                         [TR_FIELD_ACTOR] = sizeof(tr_actor_t),
                                                         [TR_FIELD_TENSOR] =
                                                             sizeof(tr_tensor_ref_t),
                                                         [TR_FIELD_BYTES] = 0,
                                                         [TR_FIELD_ARRAY_I32] = 4,
                                                         [TR_FIELD_ARRAY_U32] = 4,
                                                         [TR_FIELD_ARRAY_I64] = 8,
                                                         [TR_FIELD_ARRAY_U64] = 8,
                                                         [TR_FIELD_ARRAY_F32] = 4,
                                                         [TR_FIELD_ARRAY_F64] = 8};
    return sizes[k];
}

/* The size a field of its kind may have: a STR at least 1 byte (the NUL), BYTES more than
 * its length word (and a whole number of them, as TR_BYTES lays it out), an array a whole
 * number of elements, any other kind its own size. */
static bool size_fits_kind(const tr_field_desc_t *f)
{
    if (f->kind == TR_FIELD_STR) return f->size > 0;
    if (f->kind == TR_FIELD_BYTES) return f->size > 4 && f->size % 4 == 0;
    if (f->kind >= TR_FIELD_ARRAY_I32)
        return f->size > 0 && f->size % kind_size(f->kind) == 0 &&
               f->size / kind_size(f->kind) <= TR_MSG_MAX_ARRAY;
    return f->size == kind_size(f->kind);
}

/* A field the codec can read and write: a name unique in its type, a known kind, a size that
 * fits the kind, inside the body. */
static bool field_valid(const tr_msg_desc_t *desc, uint32_t i)
{
    const tr_field_desc_t *f = &desc->fields[i];
    if (!f->name || !f->name[0] || f->kind >= TR_FIELD_KIND_COUNT_ ||
        (uint64_t)f->offset + f->size > desc->body_size || !size_fits_kind(f))
        return false;
    for (uint32_t j = 0; j < i; j++)
        if (!strcmp(desc->fields[j].name, f->name)) return false;
    return true;
}

int tr_msg_type_register(const tr_msg_desc_t *desc)
{
    if (!desc || !desc->name || desc->type < TR_MSG_USER ||
        desc->type >= TR_MSG_USER + MAX_USER_TYPES || (desc->n_fields && !desc->fields) ||
        desc->n_fields > TR_MSG_MAX_FIELDS)
        return TR_EINVAL;
    for (uint32_t i = 0; i < desc->n_fields; i++)
        if (!field_valid(desc, i)) return TR_EINVAL;
    const tr_msg_desc_t *expected = NULL;
    /* release: publishes *desc to tr_msg_desc's acquire load */
    if (!atomic_compare_exchange_strong_explicit(&user_types[desc->type - TR_MSG_USER], &expected,
                                                 desc, memory_order_release, memory_order_relaxed))
        return TR_EEXIST;
    return 0;
}

/* --- allocation ------------------------------------------------------------------------ */

tr_msg_t *tr_msg_alloc(tr_runtime_t *rt, uint32_t type, size_t body_size)
{
    if (!rt || body_size > UINT32_MAX) return NULL;
    tr_msg_t *m = tr__pool_alloc(tr__thread_pool(rt), body_size);
    if (!m) return NULL;
    m->type = type;
    m->size = (uint32_t)body_size;
    if (body_size) /* no call for the many messages without a body */
        memset(tr_msg_body(m), 0, body_size);
    return m;
}

tr_msg_t *tr_msg_new(tr_runtime_t *rt, uint32_t type)
{
    const tr_msg_desc_t *d = tr_msg_desc(type);
    return d ? tr_msg_alloc(rt, type, d->body_size) : NULL;
}

void tr_msg_free(tr_runtime_t *rt, tr_msg_t *m)
{
    if (rt && m) tr__pool_free(tr__thread_pool(rt), m);
}
