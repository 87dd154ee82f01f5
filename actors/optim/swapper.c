/* swapper.c: the swapper actor (pinned: its reads and writes block its thread), which keeps
 * the optimizer's state in a swap file when zero_optimization.offload_optimizer.device is
 * "nvme".
 *
 * It owns the aio engine (troupe/aio.h, configured by the `aio` section), one swap file per
 * rank, nvme_path/troupe_swap/rank<R>/optimizer.swp, and the swap buffers: n_bufs registered,
 * page-aligned buffers of one sub-group's slot each (see tr__swap_layout_t). The optimizer
 * sends SWAP requests naming a sub-group and one of these buffers; the swapper reads the
 * sub-group's slot into the buffer or writes it from there, and answers with the same type.
 * Requests are served in arrival order, so the optimizer can queue the read of sub-group
 * i + 1 and the write of i - 1 while it steps i (its pipeline; see optimizer.c).
 *
 * A slot is the payload (n_arrays arrays of `group` floats) and, in its last 64 bytes, a
 * trailer: a magic, the sub-group's index and the payload's CRC32C, written with the payload
 * and checked on every read. A mismatch, or any I/O error (ENOSPC included), fails the engine
 * with a message naming the file and the offset. At spawn every slot is written once with
 * zeroed state (the optimizer's initial moments), so a disk too small is found at start-up.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "actors/engine/plan.h"
#include "actors/optim/optim.h"
#include "base/crc32c.h"
#include "base/file.h"
#include "troupe/aio.h"
#include "troupe/config.h"

#define TRAILER_BYTES 64
static const char MAGIC[8] = {'T', 'R', 'S', 'W', 'A', 'P', '0', '1'};

typedef struct trailer {
    char magic[8];
    uint64_t group;
    uint64_t payload; /* bytes */
    uint32_t crc;     /* CRC32C of the payload */
} trailer_t;

struct tr__swapper {
    const tr__plan_t *eng;
    tr_aio_t *aio;
    tr_aio_file_t *file;
    char path[512];
    tr__swap_layout_t lay;
    size_t payload; /* bytes of state in a slot */
    bool locked;    /* buffers from tr_aio_buffer_alloc (pin_memory), else posix_memalign */
    void *bufs[TR__MAX_SWAP_BUFS];
    uint64_t bytes_read, bytes_written;
    uint64_t io_ns; /* time in reads and writes, cumulative */
};

static uint64_t slot_offset(const struct tr__swapper *w, uint64_t g)
{
    return g * (uint64_t)w->lay.slot_bytes;
}

static trailer_t *trailer_of(const struct tr__swapper *w, void *buf)
{
    return (trailer_t *)((char *)buf + w->lay.slot_bytes - TRAILER_BYTES);
}

/* Writes sub-group g's slot from buf, with its trailer. */
static int write_group(struct tr__swapper *w, uint64_t g, void *buf, char *why, size_t len)
{
    trailer_t *t = trailer_of(w, buf);
    memset(t, 0, TRAILER_BYTES);
    memcpy(t->magic, MAGIC, sizeof(MAGIC));
    t->group = g;
    t->payload = w->payload;
    t->crc = tr__crc32c(0, buf, w->payload);
    int rc =
        tr_aio_pwrite_sync(w->aio, w->file, buf, w->lay.slot_bytes, slot_offset(w, g), why, len);
    if (rc == 0) w->bytes_written += w->lay.slot_bytes;
    return rc;
}

/* Reads sub-group g's slot into buf and checks its trailer. */
static int read_group(struct tr__swapper *w, uint64_t g, void *buf, char *why, size_t len)
{
    uint64_t at = slot_offset(w, g);
    int rc = tr_aio_pread_sync(w->aio, w->file, buf, w->lay.slot_bytes, at, why, len);
    if (rc < 0) return rc;
    w->bytes_read += w->lay.slot_bytes;
    const trailer_t *t = trailer_of(w, buf);
    if (memcmp(t->magic, MAGIC, sizeof(MAGIC)) || t->group != g || t->payload != w->payload) {
        return tr__errf(why, len, TR_EFORMAT,
                        "%s: sub-group %llu at offset %llu: the slot's trailer (at offset %llu) "
                        "does not describe this sub-group: the swap file was changed or damaged "
                        "outside troupe",
                        w->path, (unsigned long long)g, (unsigned long long)at,
                        (unsigned long long)(at + w->lay.slot_bytes - TRAILER_BYTES));
    }
    uint32_t crc = tr__crc32c(0, buf, w->payload);
    if (crc != t->crc) {
        return tr__errf(why, len, TR_EFORMAT,
                        "%s: sub-group %llu at offset %llu (%zu bytes): CRC32C mismatch "
                        "(stored %08x, read %08x): the swap file was changed or damaged outside "
                        "troupe",
                        w->path, (unsigned long long)g, (unsigned long long)at, w->payload, t->crc,
                        crc);
    }
    return 0;
}

/* The swapper buffer a reference names (-1 if none). */
static int buffer_index(const struct tr__swapper *w, const tr_tensor_ref_t *ref)
{
    for (int b = 0; b < w->lay.n_bufs; b++)
        if (ref->buffer_id == w->lay.buf_ids[b] && ref->offset == 0 &&
            ref->length == w->lay.slot_bytes)
            return b;
    return -1;
}

static int on_swap(tr_ctx_t *ctx, struct tr__swapper *w, const tr_msg_t *msg)
{
    const tr_msg_swap_t *q = (const tr_msg_swap_t *)tr_msg_body((tr_msg_t *)msg);
    char why[1024] = "";
    int b = buffer_index(w, &q->buf), rc;
    if (b < 0 || q->group >= w->lay.n_groups ||
        (q->op != TR__SWAP_READ && q->op != TR__SWAP_WRITE)) {
        snprintf(why, sizeof(why),
                 "a SWAP request for sub-group %llu of %zu, op %u, names no "
                 "swap buffer or sub-group of %s",
                 (unsigned long long)q->group, w->lay.n_groups, q->op, w->path);
        rc = TR_EINVAL;
    } else {
        uint64_t t0 = tr_now_ns();
        rc = q->op == TR__SWAP_READ ? read_group(w, q->group, w->bufs[b], why, sizeof(why))
                                    : write_group(w, q->group, w->bufs[b], why, sizeof(why));
        w->io_ns += tr_now_ns() - t0;
    }
    if (rc < 0)
        tr__engine_fail(w->eng, rc, "swapper: %s %s",
                        q->op == TR__SWAP_READ ? "reading" : "writing", why);
    if (w->eng->mon) { /* the trace's I/O: bytes so far, beside this lane's spans */
        uint64_t now = tr_now_ns();
        tr_monitor_counter(w->eng->mon, -1, TR_COUNTER_SWAP_READ, (double)w->bytes_read, now);
        tr_monitor_counter(w->eng->mon, -1, TR_COUNTER_SWAP_WRITTEN, (double)w->bytes_written, now);
        tr_monitor_counter(w->eng->mon, -1, TR_COUNTER_SWAP_IO_MS, (double)w->io_ns / 1e6, now);
    }
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_SWAP);
    if (!m) return TR_ENOMEM;
    *TR_MSG_AS(m, swap) = *q;
    TR_MSG_AS(m, swap)->rc = rc;
    m->step = msg->step;
    int src = tr_actor_send(ctx->rt, msg->sender, m);
    if (src < 0) tr_msg_free(ctx->rt, m);
    return src;
}

static int swapper_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    struct tr__swapper *w = ctx->state;
    return msg->type == TR_MSG_SWAP ? on_swap(ctx, w, msg) : 0;
}

/* --- set-up ----------------------------------------------------------------------------- */

/* The sub-groups and the slot size: slots hold the payload and the trailer, rounded up so
 * that every request divides into intra_op_parallelism 4096-byte-aligned slices. */
static int layout(struct tr__swapper *w, const tr_aio_options_t *ao, char *err, size_t errlen)
{
    const tr__plan_t *e = w->eng;
    const tr_config_t *c = e->cfg;
    size_t S = e->optim_slice.hi - e->optim_slice.lo, sg = (size_t)c->zero.sub_group_size;
    tr__swap_layout_t *l = &w->lay;
    l->n_arrays = e->n_arrays;
    if (sg == 0)
        return tr__errf(err, errlen, TR_ECONFIG,
                        "%s: zero_optimization.sub_group_size is 0; "
                        "with offload_optimizer.device \"nvme\" it is the number of elements "
                        "swapped at a time and must be at least 1",
                        c->source);
    l->group = sg < S ? sg : S;
    if (l->group == 0) l->group = 1; /* an empty partition: no sub-group, any size */
    l->n_groups = (S + l->group - 1) / l->group;
    w->payload = (size_t)l->n_arrays * l->group * sizeof(float);
    size_t unit = 4096 * (size_t)ao->intra_op_parallelism;
    l->slot_bytes = (w->payload + TRAILER_BYTES + unit - 1) / unit * unit;
    const tr_config_offload_optimizer_t *oo = &c->zero.offload_optimizer;
    int need = 1 + oo->pipeline_read + oo->pipeline_write;
    l->n_bufs = oo->pipeline_read || oo->pipeline_write ? (int)oo->buffer_count : 1;
    if (oo->buffer_count < need || l->n_bufs > TR__MAX_SWAP_BUFS)
        return tr__errf(err, errlen, TR_ECONFIG,
                        "%s: zero_optimization.offload_optimizer."
                        "buffer_count is %lld; the swap pipeline (pipeline_read %s, "
                        "pipeline_write %s) needs at least %d and at most %d buffers",
                        c->source, (long long)oo->buffer_count, oo->pipeline_read ? "on" : "off",
                        oo->pipeline_write ? "on" : "off", need, TR__MAX_SWAP_BUFS);
    return 0;
}

static int open_file(struct tr__swapper *w, char *err, size_t errlen)
{
    const tr__plan_t *e = w->eng;
    char dir[480];
    if (snprintf(dir, sizeof(dir), "%s/troupe_swap/rank%d",
                 e->cfg->zero.offload_optimizer.nvme_path, e->rank) >= (int)sizeof(dir))
        return tr__errf(err, errlen, TR_ECONFIG,
                        "%s: zero_optimization.offload_optimizer."
                        "nvme_path: longer than %zu bytes",
                        e->cfg->source, sizeof(dir) - 40);
    int rc = tr__mkdir_p(dir);
    if (rc < 0)
        return tr__errf(err, errlen, rc,
                        "%s: zero_optimization.offload_optimizer.nvme_path: "
                        "cannot make the folder %s: %s",
                        e->cfg->source, dir, tr_strerror(rc));
    snprintf(w->path, sizeof(w->path), "%s/optimizer.swp", dir);
    unlink(w->path); /* a previous run's state is not this run's */
    char why[512];
    rc = tr_aio_open(w->aio, w->path, TR_AIO_READ | TR_AIO_WRITE | TR_AIO_CREATE, &w->file, why,
                     sizeof(why));
    if (rc < 0) return tr__errf(err, errlen, rc, "swapper: %s", why);
    return 0;
}

static int alloc_buffers(struct tr__swapper *w, tr_actor_t owner)
{
    w->locked = w->eng->cfg->zero.offload_optimizer.pin_memory;
    for (int b = 0; b < w->lay.n_bufs; b++) {
        int rc = w->locked ? tr_aio_buffer_alloc(w->aio, w->lay.slot_bytes, &w->bufs[b])
                           : (posix_memalign(&w->bufs[b], 4096, w->lay.slot_bytes) ? TR_ENOMEM : 0);
        if (rc < 0) {
            w->bufs[b] = NULL;
            return rc;
        }
        memset(w->bufs[b], 0, w->lay.slot_bytes);
        char name[TR_BUFFER_NAME_MAX];
        snprintf(name, sizeof(name), "swapper/buf%d", b);
        tr_buffer_info_t info = {.base = w->bufs[b],
                                 .bytes = w->lay.slot_bytes,
                                 .dtype = TR_DTYPE_U8,
                                 .device_type = TR_DEVICE_CPU,
                                 .owner = owner,
                                 .lifetime = TR_BUFFER_RUNTIME};
        memcpy(info.name, name, sizeof(name));
        rc = tr_buffer_register(w->eng->rt, &info, &w->lay.buf_ids[b]);
        if (rc < 0) return rc;
    }
    return 0;
}

/* Every slot gets zeroed state: the optimizer's moments before its first step. */
static int initialise_file(struct tr__swapper *w, char *err, size_t errlen)
{
    memset(w->bufs[0], 0, w->lay.slot_bytes);
    for (size_t g = 0; g < w->lay.n_groups; g++) {
        char why[1024];
        int rc = write_group(w, g, w->bufs[0], why, sizeof(why));
        if (rc < 0)
            return tr__errf(err, errlen, rc, "swapper: initialising the swap file: %s%s", why,
                            rc == TR_ENOSPC
                                ? " (the disk is full: "
                                  "zero_optimization.offload_optimizer.nvme_path needs room for "
                                  "this rank's optimizer state)"
                                : "");
    }
    return 0;
}

int tr__swapper_spawn(const tr__plan_t *eng, struct tr__swapper **state, tr_actor_t *self,
                      tr__swap_layout_t *lay, uint64_t *bytes, char *err, size_t errlen)
{
    struct tr__swapper *w = calloc(1, sizeof(*w));
    if (!w) return TR_ENOMEM;
    *state = w;
    w->eng = eng;
    tr_aio_options_t ao;
    tr_aio_options_from_config(&eng->cfg->aio, &ao);
    char why[512];
    int rc = layout(w, &ao, err, errlen);
    if (rc < 0) return rc;
    if ((rc = tr_aio_create(&ao, &w->aio, why, sizeof(why))) < 0)
        return tr__errf(err, errlen, rc, "%s: aio: %s", eng->cfg->source, why);
    if ((rc = open_file(w, err, errlen)) < 0) return rc;
    tr_actor_opts_t o = {.name = "swapper",
                         .pinned = 1,
                         .defer_stop = 1, /* a signal's stop: the engine stops it after the
                                           * step and the save, which need the swapped state */
                         .supervisor = eng->supervisor,
                         /* its handlers are the reads and writes: the trace's "io" */
                         .lane_kind = TR_LANE_IO};
    rc = tr_actor_spawn(eng->rt, swapper_behaviour, w, &o, self);
    if (rc == 0) rc = alloc_buffers(w, *self);
    if (rc == 0) rc = initialise_file(w, err, errlen);
    if (rc < 0) return rc;
    *lay = w->lay;
    *bytes = (uint64_t)w->lay.n_bufs * w->lay.slot_bytes; /* the rest is on disk */
    tr_log(TR_LOG_INFO,
           "swapper: rank %d: optimizer state in %s: %zu sub-groups of %zu "
           "elements, %d buffer(s) of %zu bytes (%s)",
           eng->rank, w->path, w->lay.n_groups, w->lay.group, w->lay.n_bufs, w->lay.slot_bytes,
           tr_aio_file_direct(w->file) ? "O_DIRECT" : "through the page cache");
    return 0;
}

void tr__swapper_free(struct tr__swapper *w)
{
    if (!w) return;
    tr_aio_close(w->file);
    if (w->file) unlink(w->path); /* scratch: the state a run keeps is in its checkpoints */
    for (int b = 0; b < w->lay.n_bufs; b++) {
        if (!w->bufs[b]) continue;
        if (w->locked)
            tr_aio_buffer_free(w->aio, w->bufs[b], w->lay.slot_bytes);
        else
            free(w->bufs[b]);
    }
    tr_aio_destroy(w->aio);
    free(w);
}
