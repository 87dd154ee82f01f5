/* The buffer registry: every block of memory a tensor reference may name.
 *
 * A message never carries a pointer. When an actor hands data to another (a loader slot, a
 * gradient range, a client's batch, later a swap or staging buffer), the memory is registered
 * here once, with its device, element type, size, alignment, owner and lifetime, and messages
 * carry a tr_tensor_ref_t naming the registry id and a byte range. The receiver resolves the
 * reference through the registry, which checks the range, element type and device, so a
 * reference means the same on any thread and a stale or out-of-range one is an error, not a
 * wild read. (Across ranks, the bytes themselves move through the comm backend; the id names
 * the same role on every rank because each rank registers its buffers in the same order.)
 *
 * Ids are never reused within a runtime: an id is a slot index (low 32 bits) and the slot's
 * generation (high 32 bits), so a reference to an unregistered buffer fails to resolve.
 * Ownership of the bytes is not transferred by registering: the owner allocates and frees
 * them, and unregisters before freeing.
 */
#ifndef TR_INCLUDE_TROUPE_BUFFER_H
#define TR_INCLUDE_TROUPE_BUFFER_H

#include <stddef.h>
#include <stdint.h>

#include "troupe/msg.h"
#include "troupe/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How long a registered buffer lives. */
typedef enum {
    TR_BUFFER_RUNTIME = 0, /* until the runtime closes (parameters, gradients, loader slots) */
    TR_BUFFER_REQUEST = 1, /* one request at a time, reused (a client's staging batch) */
    TR_BUFFER_STEP = 2,    /* one training step (activations, staging for a collective) */
} tr_buffer_lifetime_t;

#define TR_BUFFER_NAME_MAX 32

typedef struct tr_buffer_info {
    char name[TR_BUFFER_NAME_MAX]; /* "grads", "loader/slot3": for errors and traces */
    void *base;
    uint64_t bytes;
    uint32_t alignment;  /* of base, in bytes (a power of two) */
    uint8_t dtype;       /* tr_dtype_t of the elements */
    uint8_t device_type; /* tr_device_kind_t */
    int16_t device_index;
    tr_actor_t owner; /* the actor that allocated it (NONE: the caller's thread) */
    uint8_t lifetime; /* tr_buffer_lifetime_t */
} tr_buffer_info_t;

/* Registers info->base .. +bytes (name, dtype, device, owner, lifetime as given; alignment is
 * measured from base when 0). *id gets its id (never 0). TR_EINVAL for a NULL base with
 * bytes > 0, a bad dtype or device, or an over-long name; TR_ENOSPC past TR_BUFFER_MAX.
 * Any thread. */
#define TR_BUFFER_MAX 4096
int tr_buffer_register(tr_runtime_t *rt, const tr_buffer_info_t *info, uint64_t *id);

/* Allocates info->bytes of host memory aligned to 64 bytes (rounded up to a multiple of 64)
 * and registers it as info says (name, dtype, owner, lifetime; base, device and alignment are
 * set here). *mem gets the memory whenever it was allocated, also when the registration
 * fails: the caller owns it and frees it (after tr_buffer_unregister, once registered).
 * 0; TR_ENOMEM with *mem NULL; or tr_buffer_register's error. Any thread. */
int tr_buffer_alloc_host(tr_runtime_t *rt, tr_buffer_info_t *info, void **mem, uint64_t *id);

/* Removes a registration; references to it stop resolving. TR_ENOENT for an unknown id.
 * Any thread. */
int tr_buffer_unregister(tr_runtime_t *rt, uint64_t id);

/* A copy of a registration. TR_ENOENT for an unknown id. Any thread. */
int tr_buffer_info(tr_runtime_t *rt, uint64_t id, tr_buffer_info_t *out);

/* A reference to [offset, offset + length) bytes of buffer id, as `dtype` with a 1-D shape
 * (length / element size). Fills nothing and returns TR_ENOENT / TR_ERANGE when the range is
 * not inside the buffer. Any thread. */
int tr_buffer_ref(tr_runtime_t *rt, uint64_t id, uint64_t offset, uint64_t length, int dtype,
                  tr_tensor_ref_t *out);

/* The address a reference names, after checking that its buffer is registered, the range
 * lies inside it, and its dtype and device match the registration. *out is NULL on failure:
 * TR_ENOENT (unknown or unregistered id), TR_ERANGE (outside the buffer), TR_EMISMATCH
 * (dtype or device differ). When why is not NULL it gets a sentence naming the buffer and
 * what was wrong. Any thread. */
int tr_buffer_resolve(tr_runtime_t *rt, const tr_tensor_ref_t *ref, void **out, char *why,
                      size_t whylen);

#ifdef __cplusplus
}
#endif
#endif
