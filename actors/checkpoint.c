/* checkpoint.c: the checkpointer actor (pinned: it blocks on file I/O and fsync).
 *
 * Layout, after DeepSpeed's: <dir>/<tag>/model_states.trck and
 * <dir>/<tag>/optim_states_rank<R>.trck, then <dir>/latest holding the tag. Each file is an
 * io/ckpt_file: a msgpack header, then arrays of fp32 (parameters; optimizer moments), with a
 * CRC and written to a temporary name, fsynced and renamed; latest is written last, so a crash
 * at any instant leaves the previous checkpoint whole and latest pointing at it.
 *
 * The model header carries: format and version, the layer and parameter table (names and
 * shapes), the counters (global steps and samples, skipped steps, micro-steps), the data
 * position, the seed and world size, the resolved config (JSON) and its hash, and the
 * optimizer's own state (step, beta powers, scheduler position, loss scaler). The optimizer
 * file's header repeats what ties it to its model file: version, global step, world size and
 * config hash. Loading reads and checks everything first — sizes, checksums, the two files
 * of the tag against each other (a tag mixing the files of two saves is refused, naming both
 * files and the field), the parameter table against this model, the optimizer type and
 * world size against this config — and only then writes into the engine, so a refused
 * checkpoint changes nothing. Version 1 files (no cross-check fields) still load.
 *
 * A save first removes the temporary files that a process killed during an earlier save of
 * the same folder left behind (io/ckpt_file's tr__ckpt_clean_tmp).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <msgpack.h>

#include "actors/engine_internal.h"
#include "io/ckpt_file.h"
#include "io/mkdir_p.h"
#include "runtime/mpack.h"

#define FORMAT     "troupe-checkpoint"
#define VERSION    2 /* 2: config_hash in both files; version, step, world in the optimizer's */
#define KEY(pk, s) tr__mp_pack_str(pk, s)

typedef struct loaded loaded_t;

struct tr__ckpt_actor {
    const tr_engine_t *eng;
    char err[8192];
    loaded_t *restoring;          /* a restore's files, until the executor has taken them */
    uint64_t stage_params, stage_moments; /* their registry ids while restoring */
};

static void pack_layers(msgpack_packer *pk, const tr_model_t *model)
{
    int n = tr_model_num_layers(model);
    msgpack_pack_array(pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        tr_layer_t *l = tr_model_layer(model, i);
        msgpack_pack_array(pk, 2);
        tr__mp_pack_str(pk, l->name);
        msgpack_pack_array(pk, (size_t)l->n_params);
        for (int k = 0; k < l->n_params; k++) {
            msgpack_pack_array(pk, 2);
            tr__mp_pack_str(pk, l->params[k].name);
            msgpack_pack_array(pk, (size_t)l->params[k].ndim);
            for (int d = 0; d < l->params[k].ndim; d++)
                msgpack_pack_int64(pk, l->params[k].shape[d]);
        }
    }
}

/* FNV-1a, 64 bits, of the resolved config's JSON: ties a tag's files to one config. */
static uint64_t config_hash(const char *json)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)(json ? json : ""); *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return h;
}

static void pack_model_header(msgpack_packer *pk, msgpack_sbuffer *sb, const tr_engine_t *e,
                              const tr_msg_engine_state_t *st, const char *config_json)
{
    msgpack_pack_map(pk, 13);
    KEY(pk, "format");
    tr__mp_pack_str(pk, FORMAT);
    KEY(pk, "version");
    msgpack_pack_int(pk, VERSION);
    KEY(pk, "kind");
    tr__mp_pack_str(pk, "model_states");
    KEY(pk, "n_params");
    msgpack_pack_uint64(pk, e->n_params);
    KEY(pk, "layers");
    pack_layers(pk, e->model);
    KEY(pk, "counters");
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint64(pk, st->global_step);
    msgpack_pack_uint64(pk, st->global_samples);
    msgpack_pack_uint64(pk, st->skipped_steps);
    msgpack_pack_uint64(pk, st->micro_steps);
    KEY(pk, "data");
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint64(pk, st->epoch);
    msgpack_pack_uint64(pk, st->cursor);
    msgpack_pack_uint64(pk, st->batch_index);
    KEY(pk, "seed");
    msgpack_pack_uint64(pk, e->seed);
    KEY(pk, "world");
    msgpack_pack_int(pk, e->world);
    KEY(pk, "micro_batch");
    msgpack_pack_array(pk, 3);
    msgpack_pack_int(pk, e->B);
    msgpack_pack_int(pk, e->T);
    msgpack_pack_int(pk, e->GAS);
    KEY(pk, "config");
    tr__mp_pack_str(pk, config_json ? config_json : "");
    KEY(pk, "config_hash");
    msgpack_pack_uint64(pk, config_hash(config_json));
    KEY(pk, "optimizer"); /* the optimizer's own msgpack map, as it packed it */
    msgpack_sbuffer_write(sb, (const char *)st->optim.data, st->optim.len);
}

static int write_file(struct tr__ckpt_actor *c, const char *path, msgpack_sbuffer *hdr,
                      const tr_ckpt_blob_t *blobs, size_t n)
{
    return tr__ckpt_file_write(path, hdr->data, hdr->size, blobs, n, c->err, sizeof(c->err));
}

/* The `floats` floats a save reads through ref (the parameters, or the optimizer's moments as
 * the optimizer named them); NULL with c->err when the reference does not hold them. */
static const float *saved_array(struct tr__ckpt_actor *c, const tr_tensor_ref_t *ref,
                                size_t floats)
{
    char why[256] = "the state arrays do not match the model";
    const float *p = ref->length == floats * sizeof(float)
                         ? tr__resolve(c->eng, ref, why, sizeof(why))
                         : NULL;
    if (!p) snprintf(c->err, sizeof(c->err), "%s", why);
    return p;
}

static int save(struct tr__ckpt_actor *c, const tr_msg_engine_state_t *st)
{
    const tr_engine_t *e = c->eng;
    char tag[256], tagdir[4400], path[4500];
    const char *dir = st->dir;
    if (st->tag[0])
        snprintf(tag, sizeof(tag), "%s", st->tag);
    else
        snprintf(tag, sizeof(tag), "global_step%llu", (unsigned long long)st->global_step);
    if (strchr(tag, '/') || !strcmp(tag, ".") || !strcmp(tag, ".."))
        return snprintf(c->err, sizeof(c->err), "tag '%s' is not a directory name", tag),
               TR_EINVAL;
    const char *names[3];
    int n = tr__optimizer_array_names(e, names, 3);
    tr_tensor_ref_t all = {0}; /* stays empty (refused below) if the registry refuses */
    tr_buffer_ref(e->rt, e->buf_params, 0, e->n_params * sizeof(float), TR_DTYPE_F32, &all);
    const float *params = saved_array(c, &all, e->n_params);
    const float *moments = n ? saved_array(c, &st->moments, (size_t)n * e->n_params) : NULL;
    if (!params || (n && !moments)) return TR_EINVAL;
    snprintf(tagdir, sizeof(tagdir), "%s/%s", dir, tag);
    int mk = tr__mkdir_p(tagdir);
    if (mk < 0)
        return snprintf(c->err, sizeof(c->err), "cannot create %s: %s", tagdir,
                        tr_strerror(mk)),
               mk;
    uint64_t stale_bytes;
    int stale = tr__ckpt_clean_tmp(dir, &stale_bytes);
    if (stale > 0)
        tr_log(TR_LOG_INFO,
               "checkpoint: removed %d temporary file(s) (%llu bytes) that processes killed "
               "during a save left in %s",
               stale, (unsigned long long)stale_bytes, dir);
    char *config_json = tr_config_dump(e->cfg, 0);
    uint64_t hash = config_hash(config_json);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_model_header(&pk, &sb, e, st, config_json);
    free(config_json);
    tr_ckpt_blob_t blob = {params, e->n_params * sizeof(float)};
    snprintf(path, sizeof(path), "%s/model_states.trck", tagdir);
    int rc = write_file(c, path, &sb, &blob, 1);
    if (rc == 0) { /* the optimizer's moments, one file per data-parallel rank */
        msgpack_sbuffer_clear(&sb);
        tr_ckpt_blob_t blobs[3];
        msgpack_pack_map(&pk, 9);
        KEY(&pk, "format");
        tr__mp_pack_str(&pk, FORMAT);
        KEY(&pk, "version");
        msgpack_pack_int(&pk, VERSION);
        KEY(&pk, "kind");
        tr__mp_pack_str(&pk, "optim_states");
        KEY(&pk, "step");
        msgpack_pack_uint64(&pk, st->global_step);
        KEY(&pk, "world");
        msgpack_pack_int(&pk, e->world);
        KEY(&pk, "config_hash");
        msgpack_pack_uint64(&pk, hash);
        KEY(&pk, "rank");
        msgpack_pack_int(&pk, e->rank);
        KEY(&pk, "n_params");
        msgpack_pack_uint64(&pk, e->n_params);
        KEY(&pk, "arrays");
        msgpack_pack_array(&pk, (size_t)n);
        for (int i = 0; i < n; i++) {
            tr__mp_pack_str(&pk, names[i]);
            blobs[i] = (tr_ckpt_blob_t){moments + (size_t)i * e->n_params,
                                        e->n_params * sizeof(float)};
        }
        snprintf(path, sizeof(path), "%s/optim_states_rank%d.trck", tagdir, e->rank);
        rc = write_file(c, path, &sb, blobs, (size_t)n);
    }
    msgpack_sbuffer_destroy(&sb);
    if (rc == 0) rc = tr__ckpt_latest_write(dir, tag, c->err, sizeof(c->err));
    return rc;
}

/* --- loading ---------------------------------------------------------------------------- */

static bool u64_array(const msgpack_object *o, uint64_t *out, uint32_t n)
{
    if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != n) return false;
    for (uint32_t i = 0; i < n; i++) {
        if (o->via.array.ptr[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER) return false;
        out[i] = o->via.array.ptr[i].via.u64;
    }
    return true;
}

static bool str_is(const msgpack_object *o, const char *s)
{
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           !memcmp(o->via.str.ptr, s, o->via.str.size);
}

/* The saved parameter table must be this model's, name for name and shape for shape. */
static int check_layers(struct tr__ckpt_actor *c, const char *path, const msgpack_object *layers)
{
    const tr_model_t *model = c->eng->model;
    int n = tr_model_num_layers(model);
    if (!layers || layers->type != MSGPACK_OBJECT_ARRAY)
        return snprintf(c->err, sizeof(c->err), "%s: layers: missing", path), TR_EFORMAT;
    if (layers->via.array.size != (uint32_t)n)
        return snprintf(c->err, sizeof(c->err), "%s: layers: checkpoint has %u, the model has %d",
                        path, layers->via.array.size, n),
               TR_EMISMATCH;
    for (int i = 0; i < n; i++) {
        const tr_layer_t *l = tr_model_layer(model, i);
        const msgpack_object *s = &layers->via.array.ptr[i];
        const msgpack_object *ps =
            s->type == MSGPACK_OBJECT_ARRAY && s->via.array.size == 2 ? &s->via.array.ptr[1] : NULL;
        if (!ps || !str_is(&s->via.array.ptr[0], l->name) || ps->type != MSGPACK_OBJECT_ARRAY ||
            ps->via.array.size != (uint32_t)l->n_params)
            return snprintf(c->err, sizeof(c->err),
                            "%s: layer %d: the model's is '%s' with %d parameter tensors; the "
                            "checkpoint's differs",
                            path, i, l->name, l->n_params),
                   TR_EMISMATCH;
        for (int k = 0; k < l->n_params; k++) {
            const msgpack_object *p = &ps->via.array.ptr[k];
            uint64_t shape[TR_PARAM_MAX_DIMS];
            int nd = l->params[k].ndim;
            bool ok = p->type == MSGPACK_OBJECT_ARRAY && p->via.array.size == 2 &&
                      str_is(&p->via.array.ptr[0], l->params[k].name) &&
                      u64_array(&p->via.array.ptr[1], shape, (uint32_t)nd);
            for (int d = 0; ok && d < nd; d++)
                ok = shape[d] == (uint64_t)l->params[k].shape[d];
            if (!ok)
                return snprintf(c->err, sizeof(c->err),
                                "%s: layer '%s' parameter '%s': name or shape differs from the "
                                "model's",
                                path, l->name, l->params[k].name),
                       TR_EMISMATCH;
        }
    }
    return 0;
}

struct loaded {
    tr_ckpt_file_t model, optim;
    msgpack_unpacked mh, oh;
    uint64_t counters[4], data[3], seed;
};

static int unpack(struct tr__ckpt_actor *c, const char *path, const tr_ckpt_file_t *f,
                  msgpack_unpacked *u, const char *kind)
{
    msgpack_unpacked_init(u);
    size_t off = 0;
    if (msgpack_unpack_next(u, f->header, f->header_len, &off) != MSGPACK_UNPACK_SUCCESS ||
        !str_is(tr__mp_field(&u->data, "format"), FORMAT) ||
        !str_is(tr__mp_field(&u->data, "kind"), kind))
        return snprintf(c->err, sizeof(c->err), "%s: header: not a troupe %s file", path, kind),
               TR_EFORMAT;
    const msgpack_object *n = tr__mp_field(&u->data, "n_params");
    if (!n || n->type != MSGPACK_OBJECT_POSITIVE_INTEGER || n->via.u64 != c->eng->n_params)
        return snprintf(c->err, sizeof(c->err),
                        "%s: n_params: checkpoint has %llu parameters, the model has %zu", path,
                        n ? (unsigned long long)n->via.u64 : 0ull, c->eng->n_params),
               TR_EMISMATCH;
    return 0;
}

static bool u64_field(const msgpack_object *h, const char *key, uint64_t *out)
{
    const msgpack_object *o = tr__mp_field(h, key);
    if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return false;
    *out = o->via.u64;
    return true;
}

/* The format version of a tag's file (name) from its header; 1 when it has none (version 1
 * optimizer files). */
static int header_version(struct tr__ckpt_actor *c, const char *tagdir, const char *name,
                         const msgpack_object *h, uint64_t *v)
{
    const msgpack_object *o = tr__mp_field(h, "version");
    *v = 1;
    if (!o) return 0;
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 < 1 || o->via.u64 > VERSION)
        return snprintf(c->err, sizeof(c->err),
                        "%s/%s: version: expected an integer from 1 to %d (this build's), got %s",
                        tagdir, name, VERSION,
                        o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? "a later one" : "another type"),
               TR_EFORMAT;
    *v = o->via.u64;
    return 0;
}

/* The two files of a tag come from one save: same version, and from version 2 on the same
 * global step, world size and config hash. A mix is refused naming the tag, both files and
 * the field where they differ. */
static int check_same_save(struct tr__ckpt_actor *c, const char *tagdir, const char *oname,
                           const loaded_t *L)
{
    static const char *const fields[] = {"version", "step", "world", "config_hash"};
    const msgpack_object *mh = &L->mh.data, *oh = &L->oh.data;
    uint64_t m[4] = {1, L->counters[0], 0, 0}, o[4] = {1, 0, 0, 0};
    int rc = header_version(c, tagdir, "model_states.trck", mh, &m[0]);
    if (!rc) rc = header_version(c, tagdir, oname, oh, &o[0]);
    if (rc) return rc;
    for (int i = 1; m[0] >= 2 && m[0] == o[0] && i < 4; i++) {
        bool have_m = i == 1 || u64_field(mh, fields[i], &m[i]);
        bool have_o = u64_field(oh, fields[i], &o[i]);
        if (!have_m || !have_o)
            return snprintf(c->err, sizeof(c->err), "%s/%s: %s: missing from a version %llu file",
                            tagdir, have_m ? oname : "model_states.trck", fields[i],
                            (unsigned long long)m[0]),
                   TR_EFORMAT;
    }
    for (int i = 0; i < 4 && (i == 0 || m[0] >= 2); i++)
        if (m[i] != o[i])
            return snprintf(c->err, sizeof(c->err),
                            "%s: model_states.trck has %s %llu but %s has %s %llu: the tag mixes "
                            "the files of different saves; restore the tag's files together",
                            tagdir, fields[i], (unsigned long long)m[i], oname, fields[i],
                            (unsigned long long)o[i]),
                   TR_EMISMATCH;
    return 0;
}

/* Reads and checks both files; nothing in the engine changes. */
static int read_checked(struct tr__ckpt_actor *c, const char *tagdir, loaded_t *L)
{
    const tr_engine_t *e = c->eng;
    char mpath[4500], opath[4500];
    snprintf(mpath, sizeof(mpath), "%s/model_states.trck", tagdir);
    snprintf(opath, sizeof(opath), "%s/optim_states_rank%d.trck", tagdir, e->rank);
    int rc = tr__ckpt_file_read(mpath, &L->model, c->err, sizeof(c->err));
    if (!rc) rc = tr__ckpt_file_read(opath, &L->optim, c->err, sizeof(c->err));
    if (!rc) rc = unpack(c, mpath, &L->model, &L->mh, "model_states");
    if (!rc) rc = unpack(c, opath, &L->optim, &L->oh, "optim_states");
    if (rc) return rc;
    const msgpack_object *h = &L->mh.data, *w = tr__mp_field(h, "world");
    if (!w || w->type != MSGPACK_OBJECT_POSITIVE_INTEGER || w->via.u64 != (uint64_t)e->world)
        return snprintf(c->err, sizeof(c->err), "%s: world: saved by %llu ranks, this run has %d",
                        mpath, w ? (unsigned long long)w->via.u64 : 0ull, e->world),
               TR_EMISMATCH;
    if ((rc = check_layers(c, mpath, tr__mp_field(h, "layers")))) return rc;
    if (!u64_array(tr__mp_field(h, "counters"), L->counters, 4) ||
        !u64_array(tr__mp_field(h, "data"), L->data, 3))
        return snprintf(c->err, sizeof(c->err), "%s: counters/data: missing or malformed", mpath),
               TR_EFORMAT;
    char oname[64];
    snprintf(oname, sizeof(oname), "optim_states_rank%d.trck", e->rank);
    if ((rc = check_same_save(c, tagdir, oname, L))) return rc;
    const msgpack_object *arrays = tr__mp_field(&L->oh.data, "arrays");
    const char *names[3];
    int n = tr__optimizer_array_names(e, names, 3);
    if (!arrays || arrays->type != MSGPACK_OBJECT_ARRAY || arrays->via.array.size != (uint32_t)n ||
        L->optim.payload_len != (size_t)n * e->n_params * sizeof(float) ||
        L->model.payload_len != e->n_params * sizeof(float))
        return snprintf(c->err, sizeof(c->err),
                        "%s: arrays: the optimizer keeps %d state arrays of %zu floats; the "
                        "checkpoint's differ (another optimizer type?)",
                        opath, n, e->n_params),
               TR_EMISMATCH;
    return 0;
}

static void loaded_free(loaded_t *L)
{
    if (L->model.mem) msgpack_unpacked_destroy(&L->mh);
    if (L->optim.mem) msgpack_unpacked_destroy(&L->oh);
    tr__ckpt_file_free(&L->model);
    tr__ckpt_file_free(&L->optim);
}

/* Registers one of a restore's staging arrays (the loaded file's payload). */
static int stage(struct tr__ckpt_actor *c, const char *name, const void *p, size_t bytes,
                 uint64_t *id, tr_tensor_ref_t *ref)
{
    tr_buffer_info_t info = {.base = (void *)p,
                             .bytes = bytes,
                             .dtype = TR_DTYPE_F32,
                             .device_type = TR_DEVICE_CPU,
                             .owner = c->eng->checkpointer,
                             .lifetime = TR_BUFFER_REQUEST};
    snprintf(info.name, sizeof(info.name), "checkpointer/%s", name);
    int rc = tr_buffer_register(c->eng->rt, &info, id);
    if (rc == 0) rc = tr_buffer_ref(c->eng->rt, *id, 0, bytes, TR_DTYPE_F32, ref);
    return rc;
}

static void end_restore(struct tr__ckpt_actor *c)
{
    if (c->stage_params) tr_buffer_unregister(c->eng->rt, c->stage_params);
    if (c->stage_moments) tr_buffer_unregister(c->eng->rt, c->stage_moments);
    c->stage_params = c->stage_moments = 0;
    if (c->restoring) loaded_free(c->restoring);
    free(c->restoring);
    c->restoring = NULL;
}

/* Reads and checks a tag, stages its arrays and sends the restore on its way (optimizer,
 * executor, back here): nothing in the engine changes unless every check passed. */
static int load(tr_ctx_t *ctx, struct tr__ckpt_actor *c, const char *dir, const char *tag_in,
                uint64_t step)
{
    const tr_engine_t *e = c->eng;
    char tag[256], tagdir[4400];
    int rc = 0;
    if (tag_in && tag_in[0])
        snprintf(tag, sizeof(tag), "%s", tag_in);
    else if ((rc = tr__ckpt_latest_read(dir, tag, sizeof(tag), c->err, sizeof(c->err))) < 0)
        return rc;
    snprintf(tagdir, sizeof(tagdir), "%s/%s", dir, tag);
    loaded_t *L = calloc(1, sizeof(*L));
    if (!L) return snprintf(c->err, sizeof(c->err), "out of memory"), TR_ENOMEM;
    c->restoring = L;
    rc = read_checked(c, tagdir, L);
    const msgpack_object *ost = rc ? NULL : tr__mp_field(&L->mh.data, "optimizer");
    if (!rc && !ost)
        rc = (snprintf(c->err, sizeof(c->err), "%s: optimizer state missing", tagdir), TR_EFORMAT);
    tr_msg_t *m = rc ? NULL : tr_msg_new(ctx->rt, TR_MSG_ENGINE_STATE);
    if (!rc && !m) rc = (snprintf(c->err, sizeof(c->err), "out of message memory"), TR_ENOMEM);
    if (rc) return rc;
    tr_msg_engine_state_t *s = TR_MSG_AS(m, engine_state);
    *s = (tr_msg_engine_state_t){.kind = TR__STATE_RESTORE,
                                 .global_step = L->counters[0],
                                 .global_samples = L->counters[1],
                                 .skipped_steps = L->counters[2],
                                 .micro_steps = L->counters[3],
                                 .epoch = L->data[0],
                                 .cursor = L->data[1],
                                 .batch_index = L->data[2]};
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_object(&pk, *ost);
    if (sb.size > sizeof(s->optim.data))
        rc = (snprintf(c->err, sizeof(c->err), "%s: optimizer state of %zu bytes, more than %zu",
                       tagdir, sb.size, sizeof(s->optim.data)), TR_EFORMAT);
    else
        memcpy(s->optim.data, sb.data, s->optim.len = (uint32_t)sb.size);
    msgpack_sbuffer_destroy(&sb);
    if (!rc) rc = stage(c, "params", L->model.payload, L->model.payload_len, &c->stage_params,
                        &s->params);
    if (!rc && L->optim.payload_len)
        rc = stage(c, "moments", L->optim.payload, L->optim.payload_len, &c->stage_moments,
                   &s->moments);
    m->step = step; /* the request's: the chain is classed with the step it was asked in */
    if (!rc) rc = tr_actor_send(ctx->rt, e->optimizer, m);
    if (rc < 0) {
        tr_msg_free(ctx->rt, m);
        if (!c->err[0]) snprintf(c->err, sizeof(c->err), "%s", tr_strerror(rc));
    }
    return rc;
}

/* The end of a restore: the executor has taken the state (or the optimizer refused it). */
static void restored(struct tr__ckpt_actor *c, const tr_msg_engine_state_t *s)
{
    end_restore(c);
    if (s->rc < 0)
        tr__reply(c->eng, s->rc, NULL, "load: %s", s->error);
    else
        tr__reply(c->eng, 0, &(tr__reply_t){.global_step = s->global_step}, NULL);
}

static int checkpointer_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    struct tr__ckpt_actor *c = ctx->state;
    c->err[0] = '\0';
    if (msg->type == TR_MSG_ENGINE_STATE) {
        tr_msg_engine_state_t *s = TR_MSG_AS(msg, engine_state);
        if (s->kind == TR__STATE_RESTORED) {
            restored(c, s);
            return 0;
        }
        int rc = save(c, s);
        if (rc < 0)
            tr__reply(c->eng, rc, NULL, "save: %s", c->err);
        else
            tr__reply(c->eng, 0, &(tr__reply_t){.global_step = s->global_step}, NULL);
        return 0;
    }
    if (msg->type != TR_MSG_ENGINE_REQ) return 0;
    tr_msg_engine_req_t *r = TR_MSG_AS(msg, engine_req);
    if (c->restoring) {
        tr__reply(c->eng, TR_EBUSY, NULL, "load: a restore is still in progress");
        return 0;
    }
    int rc = load(ctx, c, r->dir, r->tag, msg->step);
    if (rc < 0) {
        end_restore(c);
        tr__reply(c->eng, rc, NULL, "load: %s", c->err);
    }
    return 0;
}

int tr__checkpointer_spawn(tr_engine_t *eng)
{
    struct tr__ckpt_actor *c = calloc(1, sizeof(*c));
    if (!c) return TR_ENOMEM;
    c->eng = eng;
    eng->ck = c;
    tr_actor_opts_t o = {.name = "checkpointer",
                         .pinned = 1,
                         .defer_stop = 1,
                         .supervisor = eng->supervisor,
                         .lane_kind = TR_LANE_IO};
    return tr_actor_spawn(eng->rt, checkpointer_behaviour, c, &o, &eng->checkpointer);
}

void tr__checkpointer_free(tr_engine_t *eng)
{
    struct tr__ckpt_actor *c = eng->ck;
    if (!c) return;
    if (c->restoring) loaded_free(c->restoring);
    free(c->restoring);
    free(c);
    eng->ck = NULL;
}
