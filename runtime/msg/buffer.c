/* buffer.c: the buffer registry (troupe/buffer.h).
 *
 * A fixed table of TR_BUFFER_MAX slots, allocated lazily on the first registration. Writers
 * (register, unregister) and readers (resolve, info) take `lock` (a reader-writer lock): a
 * registration happens at start-up and a resolve a few times per step, so the lock is never
 * contended enough to matter, and it makes a registration visible to every thread that then
 * resolves it. A slot's generation grows at each unregistration, so an id is never reused.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errf.h"
#include "runtime/core/internal.h"
#include "troupe/buffer.h"

typedef struct slot {
    tr_buffer_info_t info;
    uint32_t gen; /* generation of the current (or next) registration, from 1 */
    bool used;
} slot_t;

struct tr__buffers {
    pthread_rwlock_t lock;
    uint32_t n_slots;   /* slots ever used: the next fresh one */
    uint32_t free_head; /* a freed slot's index + 1, chained through info.bytes */
    slot_t slots[TR_BUFFER_MAX];
};

int tr__buffers_init(tr_runtime_t *rt)
{
    rt->buffers = calloc(1, sizeof(*rt->buffers));
    if (!rt->buffers) return TR_ENOMEM;
    pthread_rwlock_init(&rt->buffers->lock, NULL);
    return 0;
}

void tr__buffers_close(tr_runtime_t *rt)
{
    if (!rt->buffers) return;
    pthread_rwlock_destroy(&rt->buffers->lock);
    free(rt->buffers);
    rt->buffers = NULL;
}

static uint64_t make_id(uint32_t index, uint32_t gen)
{
    return ((uint64_t)gen << 32) | (uint64_t)(index + 1);
}

/* The slot an id names while registered, or NULL. Under lock. */
static slot_t *find(struct tr__buffers *b, uint64_t id)
{
    uint32_t index = (uint32_t)id - 1u, gen = (uint32_t)(id >> 32);
    if ((uint32_t)id == 0 || index >= b->n_slots) return NULL;
    slot_t *s = &b->slots[index];
    return s->used && s->gen == gen ? s : NULL;
}

static uint32_t alignment_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    return a ? (uint32_t)(a & -a) > 4096u ? 4096u : (uint32_t)(a & -a) : 4096u;
}

int tr_buffer_alloc_host(tr_runtime_t *rt, tr_buffer_info_t *info, void **mem, uint64_t *id)
{
    if (!info || !mem) return TR_EINVAL;
    *mem = aligned_alloc(64, (info->bytes + 63) & ~(size_t)63);
    if (!*mem) return TR_ENOMEM;
    info->base = *mem;
    info->device_type = TR_DEVICE_CPU;
    info->alignment = 64;
    return tr_buffer_register(rt, info, id);
}

int tr_buffer_register(tr_runtime_t *rt, const tr_buffer_info_t *info, uint64_t *id)
{
    if (!rt || !info || !id || (!info->base && info->bytes) || !tr_dtype_size(info->dtype) ||
        info->device_type >= TR_DEVICE_COUNT_ || !memchr(info->name, '\0', sizeof(info->name)))
        return TR_EINVAL;
    struct tr__buffers *b = rt->buffers;
    pthread_rwlock_wrlock(&b->lock);
    uint32_t index;
    if (b->free_head) {
        index = b->free_head - 1;
        b->free_head = (uint32_t)b->slots[index].info.bytes;
    } else if (b->n_slots < TR_BUFFER_MAX) {
        index = b->n_slots++;
        b->slots[index].gen = 1;
    } else {
        pthread_rwlock_unlock(&b->lock);
        return TR_ENOSPC;
    }
    slot_t *s = &b->slots[index];
    s->info = *info;
    if (!s->info.alignment) s->info.alignment = alignment_of(info->base);
    s->used = true;
    *id = make_id(index, s->gen);
    pthread_rwlock_unlock(&b->lock);
    return 0;
}

int tr_buffer_unregister(tr_runtime_t *rt, uint64_t id)
{
    struct tr__buffers *b = rt->buffers;
    pthread_rwlock_wrlock(&b->lock);
    slot_t *s = find(b, id);
    if (s) {
        s->used = false;
        s->gen++;
        s->info.bytes = b->free_head; /* the free chain */
        b->free_head = (uint32_t)(s - b->slots) + 1;
    }
    pthread_rwlock_unlock(&b->lock);
    return s ? 0 : TR_ENOENT;
}

int tr_buffer_info(tr_runtime_t *rt, uint64_t id, tr_buffer_info_t *out)
{
    struct tr__buffers *b = rt->buffers;
    pthread_rwlock_rdlock(&b->lock);
    slot_t *s = find(b, id);
    if (s) *out = s->info;
    pthread_rwlock_unlock(&b->lock);
    return s ? 0 : TR_ENOENT;
}

int tr_buffer_ref(tr_runtime_t *rt, uint64_t id, uint64_t offset, uint64_t length, int dtype,
                  tr_tensor_ref_t *out)
{
    tr_buffer_info_t info;
    int rc = tr_buffer_info(rt, id, &info);
    if (rc < 0) return rc;
    size_t es = tr_dtype_size(dtype);
    if (!es || offset > info.bytes || length > info.bytes - offset || length % es) return TR_ERANGE;
    *out = (tr_tensor_ref_t){.buffer_id = id,
                             .offset = offset,
                             .length = length,
                             .dtype = (uint8_t)dtype,
                             .device_type = info.device_type,
                             .device_index = info.device_index,
                             .ndim = 1};
    out->shape[0] = (int64_t)(length / es);
    return 0;
}

int tr_buffer_resolve(tr_runtime_t *rt, const tr_tensor_ref_t *ref, void **out, char *why,
                      size_t whylen)
{
    *out = NULL;
    tr_buffer_info_t info;
    char scratch[8];
    if (!why) {
        why = scratch;
        whylen = sizeof(scratch);
    }
    if (tr_buffer_info(rt, ref->buffer_id, &info) < 0)
        return tr__errf(why, whylen, TR_ENOENT, "buffer id %#llx is not registered",
                        (unsigned long long)ref->buffer_id);
    if (ref->offset > info.bytes || ref->length > info.bytes - ref->offset)
        return tr__errf(
            why, whylen, TR_ERANGE, "buffer '%s': bytes [%llu, %llu) are outside its %llu bytes",
            info.name, (unsigned long long)ref->offset,
            (unsigned long long)(ref->offset + ref->length), (unsigned long long)info.bytes);
    if (ref->dtype != info.dtype || ref->device_type != info.device_type ||
        ref->device_index != info.device_index)
        return tr__errf(why, whylen, TR_EMISMATCH,
                        "buffer '%s': the reference says %s on device %u:%d, the buffer "
                        "is %s on device %u:%d",
                        info.name, tr_dtype_name(ref->dtype), ref->device_type, ref->device_index,
                        tr_dtype_name(info.dtype), info.device_type, info.device_index);
    *out = (char *)info.base + ref->offset;
    return 0;
}
