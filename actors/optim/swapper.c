/* swapper.c: the swapper actor (pinned: its reads and writes block its thread), which keeps
 * the optimizer's state in a swap file when zero_optimization.offload_optimizer.device is
 * "nvme", and ZeRO 3's parameter partition in another when offload_param.device is "nvme".
 *
 * It owns the aio engine (troupe/aio.h, configured by the `aio` section), the swap files,
 * nvme_path/troupe_swap/rank<R>/optimizer.swp and (offload_param's nvme_path)
 * .../params.swp, and the swap buffers: n_bufs registered, page-aligned buffers of one
 * sub-group each (see tr__swap_layout_t). The optimizer sends SWAP requests naming a sub-group
 * and one of these buffers; the swapper reads the sub-group's slots into the buffer or writes
 * them from there, and answers with the same type. Requests are served in arrival order, so the
 * optimizer can queue the read of sub-group i + 1 and the write of i - 1 while it steps i (its
 * pipeline; see optimizer.c), and a read always sees every write asked for before it.
 *
 * The fetcher asks for ranges of the parameter file (READ_PARAMS, WRITE_PARAMS) in any
 * registered buffer: the layer slices it gathers, in the parameter buffer itself. The swapper
 * serves them through a cache of offload_param.buffer_count sub-groups (the least recently used
 * goes first): a forward reads each sub-group once, and the backward starts on what the forward
 * left there. An optimizer write replaces a cached sub-group's copy.
 *
 * With plan.swap_grads the reduced gradient partition has a third file, grads.swp, in the same
 * sub-groups: the optimizer hands each reduced part over as it arrives (PUT_GRADS, naming its
 * range of the gradient buffer); a sub-group waits in one of a few open slots until every
 * element of it came, and is written then. A step's READ brings the sub-group's gradients back
 * after its parameters.
 *
 * A slot is the payload (the arrays of `group` floats) and, in its last 64 bytes, a trailer: a
 * magic, the sub-group's index and the payload's CRC32C, written with the payload and checked
 * on every read. A mismatch, a swap file deleted or replaced while in use, or any I/O error
 * (ENOSPC included) fails the engine with a message naming the file and the offset. At spawn
 * every slot is written once (the optimizer's zeroed moments, the initial parameters), so a
 * disk too small is found at start-up.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* One swap file: its slots of `payload` bytes of data and the trailer, `slot` bytes each. */
typedef struct swap_file {
    tr_aio_file_t *file;
    char path[512];
    dev_t dev; /* the file opened, to find it deleted or replaced */
    ino_t ino;
    size_t payload, slot;
} swap_file_t;

/* A cached sub-group of the parameter file (group -1: free). */
typedef struct cached {
    void *buf; /* a slot's bytes */
    int64_t group;
    uint64_t used; /* the request count when last used */
} cached_t;

#define OPEN_GRADS 4 /* gradient sub-groups filling at once (the parts come in order: 2) */

/* A gradient sub-group being filled (group -1: free). */
typedef struct filling {
    void *buf;
    int64_t group;
    size_t have; /* elements received this step */
} filling_t;

struct tr__swapper {
    const tr__plan_t *eng;
    tr_aio_t *aio;
    swap_file_t state, params; /* params.file: NULL unless the parameters are swapped */
    swap_file_t grads;         /* NULL file unless plan.swap_grads */
    filling_t fill[OPEN_GRADS];
    tr__swap_layout_t lay;
    size_t lo, hi; /* the partition, in elements of the flat parameters */
    bool locked;   /* buffers from tr_aio_buffer_alloc (pin_memory), else posix_memalign */
    void *bufs[TR__MAX_SWAP_BUFS];
    cached_t *cache;
    int n_cache;
    uint64_t requests;
    uint64_t bytes_read, bytes_written;
    uint64_t io_ns; /* time in reads and writes, cumulative */
};

static size_t group_n(const struct tr__swapper *w, uint64_t g)
{
    size_t a = g * w->lay.group, S = w->hi - w->lo;
    return S - a < w->lay.group ? S - a : w->lay.group;
}

/* Fails unless the file at s->path is still the one opened (deleted, or replaced by a copy,
 * while troupe used it: what is on disk is no longer what the swapper wrote). */
static int still_there(const swap_file_t *s, char *why, size_t len)
{
    struct stat st;
    if (stat(s->path, &st) < 0)
        return tr__errf(why, len, TR_ENOENT,
                        "%s: the swap file is gone (deleted while training used it): the state "
                        "in it is lost; resume from the last checkpoint",
                        s->path);
    if (st.st_dev != s->dev || st.st_ino != s->ino)
        return tr__errf(why, len, TR_EMISMATCH,
                        "%s: the swap file was replaced by another file while training used it; "
                        "resume from the last checkpoint",
                        s->path);
    return 0;
}

static trailer_t *trailer_of(const swap_file_t *s, void *buf)
{
    return (trailer_t *)((char *)buf + s->slot - TRAILER_BYTES);
}

/* Writes sub-group g's slot of s from buf, with its trailer. */
static int write_slot(struct tr__swapper *w, swap_file_t *s, uint64_t g, void *buf, char *why,
                      size_t len)
{
    int rc = still_there(s, why, len);
    if (rc < 0) return rc;
    trailer_t *t = trailer_of(s, buf);
    memset(t, 0, TRAILER_BYTES);
    memcpy(t->magic, MAGIC, sizeof(MAGIC));
    t->group = g;
    t->payload = s->payload;
    t->crc = tr__crc32c(0, buf, s->payload);
    rc = tr_aio_pwrite_sync(w->aio, s->file, buf, s->slot, g * (uint64_t)s->slot, why, len);
    if (rc == 0) w->bytes_written += s->slot;
    return rc;
}

/* Reads sub-group g's slot of s into buf and checks its trailer. */
static int read_slot(struct tr__swapper *w, swap_file_t *s, uint64_t g, void *buf, char *why,
                     size_t len)
{
    uint64_t at = g * (uint64_t)s->slot;
    int rc = still_there(s, why, len);
    if (rc == 0) rc = tr_aio_pread_sync(w->aio, s->file, buf, s->slot, at, why, len);
    if (rc < 0) return rc;
    w->bytes_read += s->slot;
    const trailer_t *t = trailer_of(s, buf);
    if (memcmp(t->magic, MAGIC, sizeof(MAGIC)) || t->group != g || t->payload != s->payload) {
        return tr__errf(why, len, TR_EFORMAT,
                        "%s: sub-group %llu at offset %llu: the slot's trailer (at offset %llu) "
                        "does not describe this sub-group: the swap file was changed or damaged "
                        "outside troupe",
                        s->path, (unsigned long long)g, (unsigned long long)at,
                        (unsigned long long)(at + s->slot - TRAILER_BYTES));
    }
    uint32_t crc = tr__crc32c(0, buf, s->payload);
    if (crc != t->crc) {
        return tr__errf(why, len, TR_EFORMAT,
                        "%s: sub-group %llu at offset %llu (%zu bytes): CRC32C mismatch "
                        "(stored %08x, read %08x): the swap file was changed or damaged outside "
                        "troupe",
                        s->path, (unsigned long long)g, (unsigned long long)at, s->payload, t->crc,
                        crc);
    }
    return 0;
}

/* The cache entry holding parameter sub-group g, or NULL. */
static cached_t *cached(struct tr__swapper *w, uint64_t g)
{
    for (int i = 0; i < w->n_cache; i++)
        if (w->cache[i].group == (int64_t)g) return &w->cache[i];
    return NULL;
}

/* Parameter sub-group g in the cache: read and checked if it was not there, unless `whole`
 * (the caller writes all of it). */
static int param_group(struct tr__swapper *w, uint64_t g, bool whole, cached_t **out, char *why,
                       size_t len)
{
    cached_t *c = cached(w, g);
    if (!c) { /* the least recently used entry (a free one first) */
        c = &w->cache[0];
        for (int i = 1; i < w->n_cache; i++)
            if (w->cache[i].group < 0 ? c->group >= 0 || w->cache[i].used < c->used
                                      : c->group >= 0 && w->cache[i].used < c->used)
                c = &w->cache[i];
        c->group = -1;
        int rc = whole ? 0 : read_slot(w, &w->params, g, c->buf, why, len);
        if (rc < 0) return rc;
        if (whole) memset(c->buf, 0, w->params.slot); /* the last sub-group's tail stays 0 */
        c->group = (int64_t)g;
    }
    c->used = w->requests;
    *out = c;
    return 0;
}

/* The optimizer wrote parameter sub-group g from buf: a cached copy is replaced. */
static void param_written(struct tr__swapper *w, uint64_t g, const void *buf)
{
    cached_t *c = cached(w, g);
    if (c) memcpy(c->buf, buf, w->params.slot);
}

/* READ_PARAMS and WRITE_PARAMS: the elements [at, at + n) of the flat parameters (inside this
 * rank's partition) between the parameter file and p. A write of part of a sub-group reads the
 * rest first. */
static int param_range(struct tr__swapper *w, bool write, size_t at, size_t n, float *p, char *why,
                       size_t len)
{
    if (at < w->lo || at + n > w->hi || at + n < at)
        return tr__errf(why, len, TR_EINVAL,
                        "parameters [%zu, +%zu) lie outside this rank's partition [%zu, %zu)", at,
                        n, w->lo, w->hi);
    size_t G = w->lay.group;
    for (size_t e = at - w->lo; e < at - w->lo + n;) {
        uint64_t g = e / G;
        size_t in = e - g * G, k = group_n(w, g) - in;
        if (k > at - w->lo + n - e) k = at - w->lo + n - e;
        cached_t *c;
        int rc = param_group(w, g, write && in == 0 && k == group_n(w, g), &c, why, len);
        if (rc < 0) return rc;
        float *slot = (float *)c->buf + in, *mine = p + (e - (at - w->lo));
        if (!write) {
            memcpy(mine, slot, k * sizeof(float));
        } else {
            memcpy(slot, mine, k * sizeof(float));
            if ((rc = write_slot(w, &w->params, g, c->buf, why, len)) < 0) {
                c->group = -1; /* its bytes are not the file's */
                return rc;
            }
        }
        e += k;
    }
    return 0;
}

/* PUT_GRADS: the reduced gradients [at, at + n) (this step's only: one micro-step) at p. A
 * sub-group is written once all of it has come. */
static int put_grads(struct tr__swapper *w, size_t at, size_t n, const float *p, char *why,
                     size_t len)
{
    if (at < w->lo || at + n > w->hi || at + n < at)
        return tr__errf(why, len, TR_EINVAL,
                        "gradients [%zu, +%zu) lie outside this rank's partition [%zu, %zu)", at, n,
                        w->lo, w->hi);
    size_t G = w->lay.group;
    for (size_t e = at - w->lo; e < at - w->lo + n;) {
        uint64_t g = e / G;
        size_t in = e - g * G, k = group_n(w, g) - in;
        if (k > at - w->lo + n - e) k = at - w->lo + n - e;
        filling_t *f = NULL;
        for (int i = 0; i < OPEN_GRADS && !f; i++)
            if (w->fill[i].group == (int64_t)g) f = &w->fill[i];
        for (int i = 0; i < OPEN_GRADS && !f; i++)
            if (w->fill[i].group < 0) {
                f = &w->fill[i];
                f->group = (int64_t)g;
                f->have = 0;
                memset(f->buf, 0, w->grads.slot);
            }
        if (!f)
            return tr__errf(why, len, TR_EINVAL,
                            "gradients for sub-group %llu while %d others are still incomplete: "
                            "the reduced parts did not come in order",
                            (unsigned long long)g, OPEN_GRADS);
        memcpy((float *)f->buf + in, p + (e - (at - w->lo)), k * sizeof(float));
        f->have += k;
        if (f->have >= group_n(w, g)) {
            f->group = -1;
            int rc = write_slot(w, &w->grads, g, f->buf, why, len);
            if (rc < 0) return rc;
        }
        e += k;
    }
    return 0;
}

/* The swapper buffer a reference names (-1 if none). */
static int buffer_index(const struct tr__swapper *w, const tr_tensor_ref_t *ref)
{
    for (int b = 0; b < w->lay.n_bufs; b++)
        if (ref->buffer_id == w->lay.buf_ids[b] && ref->offset == 0 &&
            ref->length == w->lay.buf_bytes)
            return b;
    return -1;
}

/* One optimizer request on swap buffer b. */
static int serve_group(struct tr__swapper *w, uint32_t op, uint64_t g, int b, char *why, size_t len)
{
    char *buf = w->bufs[b], *pbuf = buf + w->lay.slot_bytes, *gbuf = pbuf + w->lay.param_bytes;
    bool params = w->params.file && op != TR__SWAP_WRITE_STATE;
    int rc = 0;
    if (op == TR__SWAP_READ) {
        rc = read_slot(w, &w->state, g, buf, why, len);
        cached_t *c = params && rc == 0 ? cached(w, g) : NULL;
        if (c)
            memcpy(pbuf, c->buf, w->params.slot);
        else if (params && rc == 0)
            rc = read_slot(w, &w->params, g, pbuf, why, len);
        if (rc == 0 && w->grads.file) rc = read_slot(w, &w->grads, g, gbuf, why, len);
        return rc;
    }
    rc = write_slot(w, &w->state, g, buf, why, len);
    if (rc == 0 && params) {
        rc = write_slot(w, &w->params, g, pbuf, why, len);
        if (rc == 0) param_written(w, g, pbuf);
    }
    return rc;
}

static const char *op_name(uint32_t op)
{
    return op == TR__SWAP_READ || op == TR__SWAP_READ_PARAMS ? "reading" : "writing";
}

static int on_swap(tr_ctx_t *ctx, struct tr__swapper *w, const tr_msg_t *msg)
{
    const tr_msg_swap_t *q = (const tr_msg_swap_t *)tr_msg_body((tr_msg_t *)msg);
    char why[1024] = "";
    int rc;
    uint64_t t0 = tr_now_ns();
    w->requests++;
    if (q->op == TR__SWAP_PUT_GRADS) {
        void *p = NULL;
        if (!w->grads.file)
            snprintf(why, sizeof(why), "gradients, but the gradients are not swapped");
        else if (tr_buffer_resolve(w->eng->rt, &q->buf, &p, why, sizeof(why)) != 0)
            p = NULL;
        rc = !p ? TR_EINVAL
                : put_grads(w, (size_t)q->group, (size_t)(q->buf.length / sizeof(float)), p, why,
                            sizeof(why));
    } else if (q->op == TR__SWAP_READ_PARAMS || q->op == TR__SWAP_WRITE_PARAMS) {
        void *p = NULL;
        if (!w->params.file)
            snprintf(why, sizeof(why), "a parameter request, but the parameters are not swapped");
        else if (tr_buffer_resolve(w->eng->rt, &q->buf, &p, why, sizeof(why)) != 0)
            p = NULL;
        rc = !p ? TR_EINVAL
                : param_range(w, q->op == TR__SWAP_WRITE_PARAMS, (size_t)q->group,
                              (size_t)(q->buf.length / sizeof(float)), p, why, sizeof(why));
    } else {
        int b = buffer_index(w, &q->buf);
        if (b < 0 || q->group >= w->lay.n_groups ||
            (q->op != TR__SWAP_READ && q->op != TR__SWAP_WRITE && q->op != TR__SWAP_WRITE_STATE)) {
            snprintf(why, sizeof(why),
                     "a SWAP request for sub-group %llu of %zu, op %u, names no "
                     "swap buffer or sub-group of %s",
                     (unsigned long long)q->group, w->lay.n_groups, q->op, w->state.path);
            rc = TR_EINVAL;
        } else {
            rc = serve_group(w, q->op, q->group, b, why, sizeof(why));
        }
    }
    w->io_ns += tr_now_ns() - t0;
    if (rc < 0) tr__engine_fail(w->eng, rc, "swapper: %s %s", op_name(q->op), why);
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

/* The sub-groups and the slot sizes: slots hold the payload and the trailer, rounded up so
 * that every request divides into intra_op_parallelism 4096-byte-aligned slices. With the
 * parameters swapped, a sub-group is at most offload_param.buffer_size elements too. */
static int layout(struct tr__swapper *w, const tr_aio_options_t *ao, char *err, size_t errlen)
{
    const tr__plan_t *e = w->eng;
    const tr_config_t *c = e->cfg;
    bool params = e->param_offload == TR_OFFLOAD_NVME;
    if (params)
        tr__zero_owned(e->n_params, e->world, e->rank, &w->lo, &w->hi);
    else
        w->lo = e->optim_slice.lo, w->hi = e->optim_slice.hi;
    size_t S = w->hi - w->lo, sg = (size_t)c->zero.sub_group_size;
    tr__swap_layout_t *l = &w->lay;
    l->n_arrays = e->swaps ? e->n_arrays : 0;
    if (sg == 0)
        return tr__errf(err, errlen, TR_ECONFIG,
                        "%s: zero_optimization.sub_group_size is 0; "
                        "with offload_optimizer.device \"nvme\" it is the number of elements "
                        "swapped at a time and must be at least 1",
                        c->source);
    if (params && (size_t)c->zero.offload_param.buffer_size < sg)
        sg = (size_t)c->zero.offload_param.buffer_size;
    if (params && sg == 0)
        return tr__errf(err, errlen, TR_ECONFIG,
                        "%s: zero_optimization.offload_param.buffer_size is 0; with "
                        "offload_param.device \"nvme\" it is the number of parameters swapped "
                        "at a time and must be at least 1",
                        c->source);
    l->group = sg < S ? sg : S;
    if (l->group == 0) l->group = 1; /* an empty partition: no sub-group, any size */
    l->n_groups = (S + l->group - 1) / l->group;
    size_t unit = 4096 * (size_t)ao->intra_op_parallelism;
    w->state.payload = (size_t)l->n_arrays * l->group * sizeof(float);
    w->state.slot = (w->state.payload + TRAILER_BYTES + unit - 1) / unit * unit;
    l->slot_bytes = e->swaps ? w->state.slot : 0;
    w->params.payload = l->group * sizeof(float);
    w->params.slot = (w->params.payload + TRAILER_BYTES + unit - 1) / unit * unit;
    l->param_bytes = params && e->swaps ? w->params.slot : 0;
    w->grads.payload = w->params.payload;
    w->grads.slot = w->params.slot;
    l->grad_bytes = e->swap_grads ? w->grads.slot : 0;
    l->buf_bytes = l->slot_bytes + l->param_bytes + l->grad_bytes;
    if (params) {
        int64_t n = c->zero.offload_param.buffer_count;
        if (n < 1 || n > 1024)
            return tr__errf(err, errlen, TR_ECONFIG,
                            "%s: zero_optimization.offload_param.buffer_count is %lld; the "
                            "parameter swap needs between 1 and 1024 buffers of buffer_size "
                            "elements",
                            c->source, (long long)n);
        size_t fit = (size_t)c->zero.offload_param.max_in_cpu / l->group; /* max_in_cpu */
        w->n_cache = (size_t)n < fit ? (int)n : fit > 1 ? (int)fit : 1;
    }
    if (!e->swaps) return 0;
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

/* Opens nvme_path/troupe_swap/rank<R>/<name> afresh (`key`: the config section naming it). */
static int open_file(struct tr__swapper *w, swap_file_t *s, const char *key, const char *nvme_path,
                     const char *name, char *err, size_t errlen)
{
    const tr__plan_t *e = w->eng;
    char dir[480];
    if (snprintf(dir, sizeof(dir), "%s/troupe_swap/rank%d", nvme_path, e->rank) >= (int)sizeof(dir))
        return tr__errf(err, errlen, TR_ECONFIG, "%s: %s.nvme_path: longer than %zu bytes",
                        e->cfg->source, key, sizeof(dir) - 40);
    int rc = tr__mkdir_p(dir);
    if (rc < 0)
        return tr__errf(err, errlen, rc, "%s: %s.nvme_path: cannot make the folder %s: %s",
                        e->cfg->source, key, dir, tr_strerror(rc));
    snprintf(s->path, sizeof(s->path), "%s/%s", dir, name);
    unlink(s->path); /* a previous run's state is not this run's */
    char why[512];
    rc = tr_aio_open(w->aio, s->path, TR_AIO_READ | TR_AIO_WRITE | TR_AIO_CREATE, &s->file, why,
                     sizeof(why));
    if (rc < 0) return tr__errf(err, errlen, rc, "swapper: %s", why);
    struct stat st;
    if (stat(s->path, &st) < 0)
        return tr__errf(err, errlen, TR_EIO, "swapper: %s: cannot stat the file just made",
                        s->path);
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    return 0;
}

static int alloc_one(struct tr__swapper *w, size_t bytes, void **out)
{
    int rc = w->locked ? tr_aio_buffer_alloc(w->aio, bytes, out)
                       : (posix_memalign(out, 4096, bytes) ? TR_ENOMEM : 0);
    if (rc < 0) {
        *out = NULL;
        return rc;
    }
    memset(*out, 0, bytes);
    return 0;
}

static void free_one(struct tr__swapper *w, void *p, size_t bytes)
{
    if (!p) return;
    if (w->locked)
        tr_aio_buffer_free(w->aio, p, bytes);
    else
        free(p);
}

static int alloc_buffers(struct tr__swapper *w, tr_actor_t owner)
{
    const tr_config_zero_t *z = &w->eng->cfg->zero;
    w->locked = w->eng->swaps ? z->offload_optimizer.pin_memory : z->offload_param.pin_memory;
    for (int b = 0; b < w->lay.n_bufs; b++) {
        int rc = alloc_one(w, w->lay.buf_bytes, &w->bufs[b]);
        if (rc < 0) return rc;
        char name[TR_BUFFER_NAME_MAX];
        snprintf(name, sizeof(name), "swapper/buf%d", b);
        tr_buffer_info_t info = {.base = w->bufs[b],
                                 .bytes = w->lay.buf_bytes,
                                 .dtype = TR_DTYPE_U8,
                                 .device_type = TR_DEVICE_CPU,
                                 .owner = owner,
                                 .lifetime = TR_BUFFER_RUNTIME};
        memcpy(info.name, name, sizeof(name));
        rc = tr_buffer_register(w->eng->rt, &info, &w->lay.buf_ids[b]);
        if (rc < 0) return rc;
    }
    for (int i = 0; i < OPEN_GRADS; i++) {
        w->fill[i].group = -1;
        int rc = w->grads.file ? alloc_one(w, w->grads.slot, &w->fill[i].buf) : 0;
        if (rc < 0) return rc;
    }
    if (!w->n_cache) return 0;
    if (!(w->cache = calloc((size_t)w->n_cache, sizeof(*w->cache)))) return TR_ENOMEM;
    for (int i = 0; i < w->n_cache; i++) {
        w->cache[i].group = -1;
        int rc = alloc_one(w, w->params.slot, &w->cache[i].buf);
        if (rc < 0) return rc;
    }
    return 0;
}

static int full_disk(int rc, char *err, size_t errlen, const char *key, const char *what,
                     const char *why)
{
    return tr__errf(err, errlen, rc, "swapper: initialising the swap file: %s%s%s%s%s", why,
                    rc == TR_ENOSPC ? " (the disk is full: zero_optimization." : "",
                    rc == TR_ENOSPC ? key : "", rc == TR_ENOSPC ? ".nvme_path needs room for " : "",
                    rc == TR_ENOSPC ? what : "");
}

/* Every slot is written once: zeroed state (the optimizer's moments before its first step),
 * and the parameters as the engine made them (initialised or loaded), from the parameter
 * buffer's slice, which the fetcher then hands back to the kernel. */
static int initialise_files(struct tr__swapper *w, char *err, size_t errlen)
{
    char why[1024];
    void *buf = w->n_cache ? w->cache[0].buf : w->bufs[0];
    for (size_t g = 0; w->lay.n_arrays && g < w->lay.n_groups; g++) {
        memset(w->bufs[0], 0, w->lay.slot_bytes);
        int rc = write_slot(w, &w->state, g, w->bufs[0], why, sizeof(why));
        if (rc < 0)
            return full_disk(rc, err, errlen, "offload_optimizer", "this rank's optimizer state",
                             why);
    }
    for (size_t g = 0; w->grads.file && g < w->lay.n_groups; g++) {
        memset(buf, 0, w->grads.slot);
        int rc = write_slot(w, &w->grads, g, buf, why, sizeof(why));
        if (rc < 0)
            return full_disk(rc, err, errlen, "offload_optimizer", "this rank's reduced gradients",
                             why);
    }
    if (!w->params.file) return 0;
    tr_buffer_info_t info;
    int rc = tr_buffer_info(w->eng->rt, w->eng->buf_params, &info);
    for (size_t g = 0; rc == 0 && g < w->lay.n_groups; g++) {
        memset(buf, 0, w->params.slot);
        memcpy(buf, (const float *)info.base + w->lo + g * w->lay.group,
               group_n(w, g) * sizeof(float));
        if ((rc = write_slot(w, &w->params, g, buf, why, sizeof(why))) < 0)
            return full_disk(rc, err, errlen, "offload_param", "this rank's parameters", why);
    }
    return rc;
}

int tr__swapper_spawn(const tr__plan_t *eng, struct tr__swapper **state, tr_actor_t *self,
                      tr__swap_layout_t *lay, uint64_t *bytes, char *err, size_t errlen)
{
    struct tr__swapper *w = calloc(1, sizeof(*w));
    if (!w) return TR_ENOMEM;
    *state = w;
    w->eng = eng;
    const tr_config_zero_t *z = &eng->cfg->zero;
    tr_aio_options_t ao;
    tr_aio_options_from_config(&eng->cfg->aio, &ao);
    char why[512];
    int rc = layout(w, &ao, err, errlen);
    if (rc < 0) return rc;
    if ((rc = tr_aio_create(&ao, &w->aio, why, sizeof(why))) < 0)
        return tr__errf(err, errlen, rc, "%s: aio: %s", eng->cfg->source, why);
    if (eng->swaps &&
        (rc = open_file(w, &w->state, "zero_optimization.offload_optimizer",
                        z->offload_optimizer.nvme_path, "optimizer.swp", err, errlen)) < 0)
        return rc;
    if (eng->param_offload == TR_OFFLOAD_NVME &&
        (rc = open_file(w, &w->params, "zero_optimization.offload_param",
                        z->offload_param.nvme_path, "params.swp", err, errlen)) < 0)
        return rc;
    if (eng->swap_grads &&
        (rc = open_file(w, &w->grads, "zero_optimization.offload_optimizer",
                        z->offload_optimizer.nvme_path, "grads.swp", err, errlen)) < 0)
        return rc;
    tr_actor_opts_t o = {.name = "swapper",
                         .pinned = 1,
                         .defer_stop = 1, /* a signal's stop: the engine stops it after the
                                           * step and the save, which need the swapped state */
                         .supervisor = eng->supervisor,
                         /* its handlers are the reads and writes: the trace's "io" */
                         .lane_kind = TR_LANE_IO};
    rc = tr_actor_spawn(eng->rt, swapper_behaviour, w, &o, self);
    if (rc == 0) rc = alloc_buffers(w, *self);
    if (rc == 0) rc = initialise_files(w, err, errlen);
    if (rc < 0) return rc;
    *lay = w->lay;
    /* the rest is on disk */
    *bytes = (uint64_t)w->lay.n_bufs * w->lay.buf_bytes + (uint64_t)w->n_cache * w->params.slot +
             (w->grads.file ? (uint64_t)OPEN_GRADS * w->grads.slot : 0);
    if (eng->swaps)
        tr_log(TR_LOG_INFO,
               "swapper: rank %d: optimizer state in %s: %zu sub-groups of %zu "
               "elements, %d buffer(s) of %zu bytes (%s)",
               eng->rank, w->state.path, w->lay.n_groups, w->lay.group, w->lay.n_bufs,
               w->lay.buf_bytes,
               tr_aio_file_direct(w->state.file) ? "O_DIRECT" : "through the page cache");
    if (w->params.file)
        tr_log(TR_LOG_INFO,
               "swapper: rank %d: parameters [%zu, %zu) in %s: %zu sub-groups of %zu elements, "
               "a cache of %d (%s)",
               eng->rank, w->lo, w->hi, w->params.path, w->lay.n_groups, w->lay.group, w->n_cache,
               tr_aio_file_direct(w->params.file) ? "O_DIRECT" : "through the page cache");
    return 0;
}

/* The swap files are scratch: the state a run keeps is in its checkpoints. */
static void close_file(swap_file_t *s)
{
    tr_aio_close(s->file);
    if (s->file) unlink(s->path);
}

void tr__swapper_free(struct tr__swapper *w)
{
    if (!w) return;
    close_file(&w->state);
    close_file(&w->params);
    close_file(&w->grads);
    for (int i = 0; i < OPEN_GRADS; i++)
        free_one(w, w->fill[i].buf, w->grads.slot);
    for (int b = 0; b < w->lay.n_bufs; b++)
        free_one(w, w->bufs[b], w->lay.buf_bytes);
    for (int i = 0; w->cache && i < w->n_cache; i++)
        free_one(w, w->cache[i].buf, w->params.slot);
    free(w->cache);
    tr_aio_destroy(w->aio);
    free(w);
}
