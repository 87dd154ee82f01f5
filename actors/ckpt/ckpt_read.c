/* ckpt_read.c: a checkpoint tag read back for this rank, every check made before anything is
 * used (see checkpoint.h for the layout).
 *
 * The model file is read whole and its model description (version 4 on) compared with this
 * model's field by field, before the parameter table: a GPT-2's heads or vocab change no
 * parameter's shape, so only the description tells another model's checkpoint apart. This
 * rank then needs the optimizer moments of its own slice
 * [lo', hi') of the flat parameters under this run's world size W', which may differ from the
 * saving run's W: it reads the header of every optimizer file of the tag, checks each against
 * the model file (one save: version, step, world, config hash) and against this optimizer
 * (array names, payload length), checks that their slices tile [0, N) exactly (no gap, no
 * overlap), and only then reads in full, with its checksum, each file whose slice meets its
 * own, copying the overlap into place. DeepSpeed needs an offline "universal checkpoint"
 * conversion to change the world size; here the re-partitioning is the load itself. A stage 0
 * file (one slice, [0, N)) and a stage 1 one differ only in how many slices they hold, so
 * either loads under either stage.
 *
 * Counters and the data position are rank 0's. The per-rank ones (micro-steps, the cursor in
 * samples, the batch index in micro-batches) count one rank's share of a global stream that
 * every rank advances equally; at another world size they are rescaled by W / W', and refused,
 * naming the field, when the global position does not split evenly over W' ranks.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/ckpt/checkpoint.h"
#include "base/errf.h"
#include "base/file.h"
#include "runtime/msg/mpack.h"

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

static bool u64_field(const msgpack_object *h, const char *key, uint64_t *out)
{
    const msgpack_object *o = tr__mp_field(h, key);
    if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return false;
    *out = o->via.u64;
    return true;
}

/* The saved parameter table must be this model's, name for name and shape for shape. */
static int check_layers(const tr__plan_t *e, const char *path, const msgpack_object *layers,
                        char *err, size_t errlen)
{
    int n = tr_model_num_layers(e->model);
    if (!layers || layers->type != MSGPACK_OBJECT_ARRAY)
        return tr__errf(err, errlen, TR_EFORMAT, "%s: layers: missing", path);
    if (layers->via.array.size != (uint32_t)n)
        return tr__errf(err, errlen, TR_EMISMATCH,
                        "%s: layers: checkpoint has %u, the model has %d", path,
                        layers->via.array.size, n);
    for (int i = 0; i < n; i++) {
        const tr_layer_t *l = tr_model_layer(e->model, i);
        const msgpack_object *s = &layers->via.array.ptr[i];
        const msgpack_object *ps =
            s->type == MSGPACK_OBJECT_ARRAY && s->via.array.size == 2 ? &s->via.array.ptr[1] : NULL;
        if (!ps || !str_is(&s->via.array.ptr[0], l->name) || ps->type != MSGPACK_OBJECT_ARRAY ||
            ps->via.array.size != (uint32_t)l->n_params)
            return tr__errf(err, errlen, TR_EMISMATCH,
                            "%s: layer %d: the model's is '%s' with %d parameter tensors; the "
                            "checkpoint's differs",
                            path, i, l->name, l->n_params);
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
                return tr__errf(err, errlen, TR_EMISMATCH,
                                "%s: layer '%s' parameter '%s': name or shape differs from the "
                                "model's",
                                path, l->name, l->params[k].name);
        }
    }
    return 0;
}

/* Unpacks a file's header, which must be a troupe `kind` file. */
static int unpack(const char *path, const tr_ckpt_file_t *f, msgpack_unpacked *u, const char *kind,
                  char *err, size_t errlen)
{
    msgpack_unpacked_init(u);
    size_t off = 0;
    if (msgpack_unpack_next(u, f->header, f->header_len, &off) != MSGPACK_UNPACK_SUCCESS ||
        !str_is(tr__mp_field(&u->data, "format"), TR__CKPT_FORMAT) ||
        !str_is(tr__mp_field(&u->data, "kind"), kind))
        return tr__errf(err, errlen, TR_EFORMAT, "%s: header: not a troupe %s file", path, kind);
    return 0;
}

/* A file's n_params must be this model's. */
static int check_n_params(const tr__plan_t *e, const char *path, const msgpack_object *h, char *err,
                          size_t errlen)
{
    uint64_t n = 0;
    if (!u64_field(h, "n_params", &n) || n != e->n_params)
        return tr__errf(err, errlen, TR_EMISMATCH,
                        "%s: n_params: checkpoint has %llu parameters, the model has %zu", path,
                        (unsigned long long)n, e->n_params);
    return 0;
}

/* The format version of a tag's file (name) from its header; 1 when it has none (version 1
 * optimizer files). */
static int header_version(const char *tagdir, const char *name, const msgpack_object *h,
                          uint64_t *v, char *err, size_t errlen)
{
    const msgpack_object *o = tr__mp_field(h, "version");
    *v = 1;
    if (!o) return 0;
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 < 1 ||
        o->via.u64 > TR__CKPT_VERSION)
        return tr__errf(err, errlen, TR_EFORMAT,
                        "%s/%s: version: expected an integer from 1 to %d (this build's), got %s",
                        tagdir, name, TR__CKPT_VERSION,
                        o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? "a later one"
                                                                   : "another type");
    *v = o->via.u64;
    return 0;
}

/* The files of a tag come from one save: same version, and from version 2 on the same global
 * step, world size and config hash. A mix is refused naming the tag, both files and the
 * field where they differ; files of one step and world whose config hashes differ are said to
 * be of different configs (ranks that ran with different ones before the ranks' configs were
 * agreed on at start, or two runs), not of different saves. */
static int check_same_save(const char *tagdir, const char *oname, const tr__ckpt_tag_t *t,
                           const msgpack_object *oh, char *err, size_t errlen)
{
    static const char *const fields[] = {"version", "step", "world", "config_hash"};
    const msgpack_object *mh = &t->mh.data;
    uint64_t m[4] = {1, t->counters[0], 0, 0}, o[4] = {1, 0, 0, 0};
    int rc = header_version(tagdir, "model_states.trck", mh, &m[0], err, errlen);
    if (!rc) rc = header_version(tagdir, oname, oh, &o[0], err, errlen);
    if (rc) return rc;
    for (int i = 1; m[0] >= 2 && m[0] == o[0] && i < 4; i++) {
        bool have_m = i == 1 || u64_field(mh, fields[i], &m[i]);
        bool have_o = u64_field(oh, fields[i], &o[i]);
        if (!have_m || !have_o)
            return tr__errf(err, errlen, TR_EFORMAT, "%s/%s: %s: missing from a version %llu file",
                            tagdir, have_m ? oname : "model_states.trck", fields[i],
                            (unsigned long long)m[0]);
    }
    for (int i = 0; i < 4 && (i == 0 || m[0] >= 2); i++)
        if (m[i] != o[i] && i == 3) /* one step of one world: the configs differ */
            return tr__errf(
                err, errlen, TR_EMISMATCH,
                "%s: model_states.trck and %s are of the same step %llu and world size %llu but "
                "of different configs (config_hash %llu and %llu): the rank that wrote %s ran "
                "with another config than rank 0 (a job whose ranks' configs were not checked "
                "at start), or the files are of different runs; this tag cannot be resumed, "
                "resume an earlier one or start again with one config on every rank",
                tagdir, oname, (unsigned long long)m[1], (unsigned long long)m[2],
                (unsigned long long)m[3], (unsigned long long)o[3], oname);
        else if (m[i] != o[i])
            return tr__errf(
                err, errlen, TR_EMISMATCH,
                "%s: model_states.trck has %s %llu but %s has %s %llu: the tag mixes the "
                "files of different saves; restore the tag's files together",
                tagdir, fields[i], (unsigned long long)m[i], oname, fields[i],
                (unsigned long long)o[i]);
    return 0;
}

/* --- the model file ---------------------------------------------------------------------- */

/* An integer of the saved description (from version 4: checkpoint.h) against this model's. */
static int desc_int(const char *path, const msgpack_object *d, const char *field, int has,
                    char *err, size_t errlen)
{
    const msgpack_object *o = tr__mp_field(d, field);
    if (!o ||
        (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER && o->type != MSGPACK_OBJECT_NEGATIVE_INTEGER))
        return tr__errf(err, errlen, TR_EFORMAT, "%s: model: %s: missing or not an integer", path,
                        field);
    if (o->via.i64 != has)
        return tr__errf(err, errlen, TR_EMISMATCH,
                        "%s: %s %lld, this model has %d (the checkpoint is another model's)", path,
                        field, (long long)o->via.i64, has);
    return 0;
}

/* One layer's saved [kind, in_dim, out_dim, targets, y_dim] against this model's layer i. */
static int desc_block(const char *path, const msgpack_object *b, int i, const tr_layer_t *l,
                      char *err, size_t errlen)
{
    static const char *const fields[] = {"kind", "in_dim", "out_dim", "targets", "y_dim"};
    const char *kind = l->ops && l->ops->kind ? l->ops->kind : "";
    const int has[5] = {0, l->in_dim, l->out_dim, l->targets, l->y_dim};
    if (b->type != MSGPACK_OBJECT_ARRAY || b->via.array.size != 5 ||
        b->via.array.ptr[0].type != MSGPACK_OBJECT_STR)
        return tr__errf(err, errlen, TR_EFORMAT, "%s: model: blocks: layer %d malformed", path, i);
    const msgpack_object *f = b->via.array.ptr;
    if (!str_is(&f[0], kind))
        return tr__errf(err, errlen, TR_EMISMATCH,
                        "%s: layer %d ('%s') kind '%.*s', this model's is '%s' (the checkpoint is "
                        "another model's)",
                        path, i, l->name, (int)f[0].via.str.size, f[0].via.str.ptr, kind);
    for (int k = 1; k < 5; k++)
        if (f[k].type != MSGPACK_OBJECT_POSITIVE_INTEGER &&
            f[k].type != MSGPACK_OBJECT_NEGATIVE_INTEGER)
            return tr__errf(err, errlen, TR_EFORMAT,
                            "%s: model: layer %d ('%s') %s: not an integer (a corrupted header)",
                            path, i, l->name, fields[k]);
        else if (f[k].via.i64 != has[k])
            return tr__errf(err, errlen, TR_EMISMATCH,
                            "%s: layer %d ('%s') %s %lld, this model has %d (the checkpoint is "
                            "another model's)",
                            path, i, l->name, fields[k], (long long)f[k].via.i64, has[k]);
    return 0;
}

/* The saved model description (version 4 on) must be this model's, field by field: the kind,
 * a GPT-2's config (heads and vocab change no parameter's shape), then each layer. */
static int check_model_desc(const tr__plan_t *e, const char *path, const msgpack_object *d,
                            char *err, size_t errlen)
{
    const tr_gpt2_config_t *g = tr_model_gpt2_config(e->model);
    const char *kind = g ? "gpt2" : "layers";
    const msgpack_object *k = d && d->type == MSGPACK_OBJECT_MAP ? tr__mp_field(d, "kind") : NULL;
    if (!k || k->type != MSGPACK_OBJECT_STR)
        return tr__errf(err, errlen, TR_EFORMAT, "%s: model: missing or malformed", path);
    if (!str_is(k, kind))
        return tr__errf(err, errlen, TR_EMISMATCH,
                        "%s: model kind '%.*s', this model is '%s' (the checkpoint is another "
                        "model's)",
                        path, (int)k->via.str.size, k->via.str.ptr, kind);
    int rc = 0;
    if (g) {
        const char *const names[] = {"vocab",    "padded_vocab", "context",
                                     "channels", "layers",       "heads"};
        const int has[] = {g->vocab_size, g->padded_vocab_size, g->max_seq_len,
                           g->channels,   g->num_layers,        g->num_heads};
        for (int i = 0; i < 6 && !rc; i++)
            rc = desc_int(path, d, names[i], has[i], err, errlen);
    }
    const msgpack_object *b = tr__mp_field(d, "blocks");
    int n = tr_model_num_layers(e->model);
    if (!rc && (!b || b->type != MSGPACK_OBJECT_ARRAY))
        rc = tr__errf(err, errlen, TR_EFORMAT, "%s: model: blocks: missing", path);
    if (!rc && b->via.array.size != (uint32_t)n)
        rc = tr__errf(err, errlen, TR_EMISMATCH,
                      "%s: model: %u layers, this model has %d (the checkpoint is another "
                      "model's)",
                      path, b->via.array.size, n);
    for (int i = 0; i < n && !rc; i++)
        rc = desc_block(path, &b->via.array.ptr[i], i, tr_model_layer(e->model, i), err, errlen);
    return rc;
}

/* A model file's slice [*lo, *hi) of the flat parameters (version 5, a pipeline's stage
 * files), which its payload holds. */
static int stage_slice(const tr__plan_t *e, const char *path, const msgpack_object *h,
                       size_t payload_len, uint64_t *lo, uint64_t *hi, char *err, size_t errlen)
{
    if (!u64_field(h, "lo", lo) || !u64_field(h, "hi", hi) || *lo > *hi || *hi > e->n_params)
        return tr__errf(err, errlen, TR_EFORMAT,
                        "%s: lo/hi: expected a slice lo <= hi of the %zu parameters", path,
                        e->n_params);
    if (payload_len != (*hi - *lo) * sizeof(float))
        return tr__errf(err, errlen, TR_EFORMAT,
                        "%s: payload: %zu bytes, its slice [%llu, %llu) of the parameters needs "
                        "%llu",
                        path, payload_len, (unsigned long long)*lo, (unsigned long long)*hi,
                        (unsigned long long)(*hi - *lo) * sizeof(float));
    return 0;
}

/* Copies into params the part of src (the flat parameters [lo, hi)) that lies in [a, b). */
static void copy_part(float *params, const float *src, uint64_t lo, uint64_t hi, size_t a, size_t b)
{
    size_t x = a > lo ? a : lo, y = b < hi ? b : hi;
    if (x < y) memcpy(params + x, src + (x - lo), (y - x) * sizeof(float));
}

/* Whether [lo, hi) of the flat parameters meets what this rank holds: everything, or with a
 * pipeline across ranks its stage's layers and the tied tensors they use; with params, copies
 * that part of src into it. */
static bool held_part(const tr__plan_t *e, float *params, const float *src, uint64_t lo,
                      uint64_t hi)
{
    bool meets = lo < e->own_hi && hi > e->own_lo;
    if (params) copy_part(params, src, lo, hi, e->own_lo, e->own_hi);
    for (int i = e->stage_first; e->stage >= 0 && i <= e->stage_last; i++) {
        const tr_layer_t *l = tr_model_layer(e->model, i);
        if (!l->tie_count || (l->tie_layer >= e->stage_first && l->tie_layer <= e->stage_last))
            continue;
        meets |= lo < l->tie_offset + l->tie_count && hi > l->tie_offset;
        if (params) copy_part(params, src, lo, hi, l->tie_offset, l->tie_offset + l->tie_count);
    }
    return meets;
}

/* Version 5 from a pipeline across ranks: model_states.trck holds stage 0's parameters and
 * model_states_stage<s>.trck stage s's, each its slice [lo, hi) of one save; their slices
 * tile [0, n_params) in stage order. Every file's header is checked; the parameters this rank
 * holds (held_part) are copied into t->params from the files that have them, which alone are
 * read whole (and their checksums checked): the rest of t->params is never touched. */
static int read_stage_files(const tr__plan_t *e, const char *tagdir, tr__ckpt_tag_t *t, int S,
                            char *err, size_t errlen)
{
    uint64_t lo, hi;
    const msgpack_object *h = &t->mh.data;
    int rc = stage_slice(e, "model_states.trck", h, t->model.payload_len, &lo, &hi, err, errlen);
    if (rc) return rc;
    if (lo != 0)
        return tr__errf(err, errlen, TR_EFORMAT,
                        "%s/model_states.trck: lo: %llu; stage 0's parameters start at 0", tagdir,
                        (unsigned long long)lo);
    if (!(t->assembled = malloc(e->n_params ? e->n_params * sizeof(float) : 1)))
        return tr__errf(err, errlen, TR_ENOMEM, "%s: out of memory for the parameters", tagdir);
    t->params = t->assembled;
    held_part(e, t->params, (const float *)t->model.payload, lo, hi);
    for (int s = 1; rc == 0 && s < S; s++) {
        char name[64], path[4500];
        snprintf(name, sizeof(name), "model_states_stage%d.trck", s);
        if (tr__path_join(path, sizeof(path), tagdir, name))
            return tr__errf(err, errlen, TR_EINVAL, "%s/%s: path too long", tagdir, name);
        tr_ckpt_file_t f;
        msgpack_unpacked u;
        uint64_t at = hi;
        rc = tr__ckpt_file_read_header(path, &f, err, errlen);
        if (rc) return rc;
        rc = unpack(path, &f, &u, "model_states", err, errlen);
        if (!rc) rc = check_same_save(tagdir, name, t, &u.data, err, errlen);
        if (!rc) rc = stage_slice(e, path, &u.data, f.payload_len, &lo, &hi, err, errlen);
        if (!rc && lo != at)
            rc = tr__errf(err, errlen, TR_EFORMAT,
                          "%s: lo: %llu; stage %d's parameters start where stage %d's end, at "
                          "%llu",
                          path, (unsigned long long)lo, s, s - 1, (unsigned long long)at);
        msgpack_unpacked_destroy(&u);
        tr__ckpt_file_free(&f);
        if (!rc && held_part(e, NULL, NULL, lo, hi)) { /* this rank needs it: whole, checked */
            rc = tr__ckpt_file_read(path, &f, err, errlen);
            if (!rc && f.payload_len != (hi - lo) * sizeof(float))
                rc = tr__errf(err, errlen, TR_EFORMAT, "%s: changed while it was read", path);
            if (!rc) held_part(e, t->params, (const float *)f.payload, lo, hi);
            tr__ckpt_file_free(&f);
        }
    }
    if (rc == 0 && hi != e->n_params)
        rc = tr__errf(err, errlen, TR_EFORMAT,
                      "%s: the %d stage files hold parameters [0, %llu) of %zu (a stage file "
                      "missing?)",
                      tagdir, S, (unsigned long long)hi, e->n_params);
    return rc;
}

/* Reads model_states.trck whole and checks it; *n_files: the optimizer files it names. */
static int read_model(const tr__plan_t *e, const char *tagdir, tr__ckpt_tag_t *t, uint64_t *n_files,
                      char *err, size_t errlen)
{
    char path[4500];
    snprintf(path, sizeof(path), "%s/model_states.trck", tagdir);
    int rc = tr__ckpt_file_read(path, &t->model, err, errlen);
    if (rc) return rc;
    if ((rc = unpack(path, &t->model, &t->mh, "model_states", err, errlen))) return rc;
    const msgpack_object *h = &t->mh.data;
    uint64_t version;
    if ((rc = header_version(tagdir, "model_states.trck", h, &version, err, errlen))) return rc;
    if (version >= 4 && (rc = check_model_desc(e, path, tr__mp_field(h, "model"), err, errlen)))
        return rc;
    if ((rc = check_n_params(e, path, h, err, errlen))) return rc;
    uint64_t world = 0;
    if (!u64_field(h, "world", &world) || world < 1 || world > INT32_MAX)
        return tr__errf(err, errlen, TR_EFORMAT, "%s: world: missing or not a positive integer",
                        path);
    t->saved_world = (int)world;
    uint64_t replicas = world; /* saved before pipelines spanned ranks: one per rank */
    if (tr__mp_field(h, "replicas") &&
        (!u64_field(h, "replicas", &replicas) || replicas < 1 || replicas > world))
        return tr__errf(err, errlen, TR_EFORMAT, "%s: replicas: expected 1 to %llu (the world)",
                        path, (unsigned long long)world);
    t->saved_replicas = (int)replicas;
    if ((rc = check_layers(e, path, tr__mp_field(h, "layers"), err, errlen))) return rc;
    if (!u64_array(tr__mp_field(h, "counters"), t->counters, 4) ||
        !u64_array(tr__mp_field(h, "data"), t->data, 3))
        return tr__errf(err, errlen, TR_EFORMAT, "%s: counters/data: missing or malformed", path);
    if (!(t->optim_state = tr__mp_field(h, "optimizer")))
        return tr__errf(err, errlen, TR_EFORMAT, "%s: optimizer: the optimizer's state is missing",
                        path);
    uint64_t stage_files = 0;
    if (tr__mp_field(h, "stage_files") &&
        (!u64_field(h, "stage_files", &stage_files) || stage_files < 1 || stage_files > world))
        return tr__errf(err, errlen, TR_EFORMAT, "%s: stage_files: expected 1 to %llu (the world)",
                        path, (unsigned long long)world);
    if (stage_files) {
        rc = read_stage_files(e, tagdir, t, (int)stage_files, err, errlen);
        if (rc) return rc;
    } else if (t->model.payload_len != e->n_params * sizeof(float)) {
        return tr__errf(err, errlen, TR_EFORMAT,
                        "%s: payload: %zu bytes, the model's %zu parameters need %zu", path,
                        t->model.payload_len, e->n_params, e->n_params * sizeof(float));
    } else {
        t->params = (float *)t->model.payload;
    }
    *n_files = 1; /* before version 3: one optimizer file (world size 1) */
    if (tr__mp_field(h, "optim_files") &&
        (!u64_field(h, "optim_files", n_files) || *n_files < 1 || *n_files > world))
        return tr__errf(
            err, errlen, TR_EFORMAT,
            "%s: optim_files: expected 1 to %llu (the saving world size) optimizer files", path,
            (unsigned long long)world);
    return 0;
}

/* --- the optimizer files ----------------------------------------------------------------- */

/* One optimizer file of the tag: the slice [lo, hi) of the flat state its arrays hold. */
typedef struct part {
    char name[64], path[4500];
    uint64_t lo, hi;
} part_t;

/* A header that does not parse may be a damaged file: its checksum says so more precisely. */
static int damaged_or(int rc, const char *path, char *err, size_t errlen)
{
    tr_ckpt_file_t whole;
    char why[512];
    int crc = tr__ckpt_file_read(path, &whole, why, sizeof(why));
    tr__ckpt_file_free(&whole);
    if (crc == TR_ECHECKSUM || crc == TR_EFORMAT) return tr__errf(err, errlen, crc, "%s", why);
    return rc;
}

/* The arrays of an optimizer file: this optimizer's names, in order, over its slice. */
static int check_arrays(const tr__plan_t *e, const part_t *p, const msgpack_object *arrays,
                        size_t payload_len, char *err, size_t errlen)
{
    const char *const *names = e->array_names;
    int n = e->n_arrays;
    bool ok = arrays && arrays->type == MSGPACK_OBJECT_ARRAY &&
              arrays->via.array.size == (uint32_t)n &&
              payload_len == (size_t)n * (p->hi - p->lo) * sizeof(float);
    for (int i = 0; ok && i < n; i++)
        ok = str_is(&arrays->via.array.ptr[i], names[i]);
    if (!ok)
        return tr__errf(
            err, errlen, TR_EMISMATCH,
            "%s: arrays: this optimizer keeps %d state array(s) (%s%s%s%s%s) of its slice; "
            "the file's differ (another optimizer type?)",
            p->path, n, n > 0 ? names[0] : "none", n > 1 ? ", " : "", n > 1 ? names[1] : "",
            n > 2 ? ", " : "", n > 2 ? names[2] : "");
    return 0;
}

/* Reads and checks the header of optimizer file k. */
static int read_part(const tr__plan_t *e, const char *tagdir, const tr__ckpt_tag_t *t, int k,
                     part_t *p, char *err, size_t errlen)
{
    snprintf(p->name, sizeof(p->name), "optim_states_rank%d.trck", k);
    if (tr__path_join(p->path, sizeof(p->path), tagdir, p->name))
        return tr__errf(err, errlen, TR_EINVAL, "%s/%s: path too long", tagdir, p->name);
    tr_ckpt_file_t f;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int rc = tr__ckpt_file_read_header(p->path, &f, err, errlen);
    if (rc) return rc;
    rc = unpack(p->path, &f, &u, "optim_states", err, errlen);
    if (rc == TR_EFORMAT) rc = damaged_or(rc, p->path, err, errlen);
    if (!rc) rc = check_n_params(e, p->path, &u.data, err, errlen);
    if (!rc) rc = check_same_save(tagdir, p->name, t, &u.data, err, errlen);
    const msgpack_object *h = &u.data;
    p->lo = 0; /* before version 3: the whole state */
    p->hi = e->n_params;
    if (!rc && tr__mp_field(h, "lo") &&
        (!u64_field(h, "lo", &p->lo) || !u64_field(h, "hi", &p->hi) || p->lo > p->hi))
        rc = tr__errf(err, errlen, TR_EFORMAT, "%s: lo/hi: expected a slice lo <= hi", p->path);
    if (!rc) rc = check_arrays(e, p, tr__mp_field(h, "arrays"), f.payload_len, err, errlen);
    msgpack_unpacked_destroy(&u);
    tr__ckpt_file_free(&f);
    return rc;
}

static int by_lo(const void *a, const void *b)
{
    const part_t *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The slices, clipped to [0, N), must tile it: sorted by lo, each starts where the last
 * ended, and the last reaches N. */
static int check_tiling(const char *tagdir, part_t *parts, int n, size_t N, char *err,
                        size_t errlen)
{
    qsort(parts, (size_t)n, sizeof(*parts), by_lo);
    uint64_t at = 0;
    for (int k = 0; k < n; k++) {
        uint64_t lo = parts[k].lo < N ? parts[k].lo : N, hi = parts[k].hi < N ? parts[k].hi : N;
        if (lo != at)
            return tr__errf(err, errlen, TR_EFORMAT,
                            "%s: %s: lo: its slice [%llu, %llu) %s at %llu; the optimizer files "
                            "must cover parameters [0, %zu) exactly once",
                            tagdir, parts[k].name, (unsigned long long)parts[k].lo,
                            (unsigned long long)parts[k].hi, lo > at ? "leaves a gap" : "overlaps",
                            (unsigned long long)at, N);
        at = hi;
    }
    if (at != N)
        return tr__errf(err, errlen, TR_EFORMAT,
                        "%s: the optimizer files cover parameters [0, %llu) of %zu (a file missing "
                        "from optim_files?)",
                        tagdir, (unsigned long long)at, N);
    return 0;
}

/* Copies the overlap of part p's slice and this rank's [lo, hi) into t->moments (n arrays,
 * each hi - lo floats), reading p whole and verifying its checksum. */
static int copy_overlap(const tr__plan_t *e, const part_t *p, int n, tr__ckpt_tag_t *t, char *err,
                        size_t errlen)
{
    size_t lo = e->optim_slice.lo, hi = e->optim_slice.hi, N = e->n_params;
    size_t a = p->lo > lo ? p->lo : lo, b = p->hi < hi ? p->hi : hi;
    if (b > N) b = N;
    if (a >= b) return 0;
    tr_ckpt_file_t f;
    int rc = tr__ckpt_file_read(p->path, &f, err, errlen);
    if (rc) return rc;
    const float *src = f.payload;
    size_t S = hi - lo, Sp = p->hi - p->lo;
    for (int i = 0; i < n; i++)
        memcpy(t->moments + (size_t)i * S + (a - lo), src + (size_t)i * Sp + (a - p->lo),
               (b - a) * sizeof(float));
    tr__ckpt_file_free(&f);
    return 0;
}

/* Every optimizer file's header checked, the tiling checked, then this rank's slice built. */
static int read_moments(const tr__plan_t *e, const char *tagdir, tr__ckpt_tag_t *t,
                        uint64_t n_files, char *err, size_t errlen)
{
    int n = e->n_arrays;
    part_t *parts = calloc(n_files, sizeof(*parts));
    if (!parts)
        return tr__errf(err, errlen, TR_ENOMEM, "no memory for %llu file names",
                        (unsigned long long)n_files);
    int rc = 0;
    for (uint64_t k = 0; k < n_files && !rc; k++)
        rc = read_part(e, tagdir, t, (int)k, &parts[k], err, errlen);
    if (!rc) rc = check_tiling(tagdir, parts, (int)n_files, e->n_params, err, errlen);
    t->moments_bytes = (size_t)n * (e->optim_slice.hi - e->optim_slice.lo) * sizeof(float);
    if (!rc && n && !(t->moments = calloc(1, t->moments_bytes ? t->moments_bytes : 1)))
        rc = tr__errf(err, errlen, TR_ENOMEM, "no memory for %zu bytes of optimizer state",
                      t->moments_bytes);
    for (uint64_t k = 0; k < n_files && !rc && n; k++)
        rc = copy_overlap(e, &parts[k], n, t, err, errlen);
    free(parts);
    return rc;
}

/* --- the per-rank position ---------------------------------------------------------------- */

/* A count of one replica's share saved with W replicas, as one replica's share now. */
static int rescale(const char *tagdir, const char *field, uint64_t *v, int W, int now, char *err,
                   size_t errlen)
{
    uint64_t global = *v * (uint64_t)W;
    if (global % (uint64_t)now)
        return tr__errf(err, errlen, TR_EMISMATCH,
                        "%s/model_states.trck: %s: %llu per replica on %d data-parallel replicas "
                        "(%llu in all) does not split evenly over %d; resume with a data-parallel "
                        "degree that divides it",
                        tagdir, field, (unsigned long long)*v, W, (unsigned long long)global, now);
    *v = global / (uint64_t)now;
    return 0;
}

static int rescale_position(const tr__plan_t *e, const char *tagdir, tr__ckpt_tag_t *t, char *err,
                            size_t errlen)
{
    int W = t->saved_replicas, now = e->replicas;
    if (W == now) return 0;
    int rc = rescale(tagdir, "counters: micro_steps", &t->counters[3], W, now, err, errlen);
    if (!rc) rc = rescale(tagdir, "data: cursor", &t->data[1], W, now, err, errlen);
    if (!rc) rc = rescale(tagdir, "data: batch_index", &t->data[2], W, now, err, errlen);
    if (!rc)
        tr_log(TR_LOG_INFO,
               "checkpoint: %s was saved by %d data-parallel replica(s); rank %d "
               "of %d takes optimizer state [%zu, %zu) and the data position rescaled to %llu "
               "samples, %llu batches",
               tagdir, W, e->rank, e->world, e->optim_slice.lo, e->optim_slice.hi,
               (unsigned long long)t->data[1], (unsigned long long)t->data[2]);
    return rc;
}

int tr__ckpt_tag_read(const tr__plan_t *eng, const char *tagdir, tr__ckpt_tag_t *t, char *err,
                      size_t errlen)
{
    uint64_t n_files = 0;
    memset(t, 0, sizeof(*t));
    msgpack_unpacked_init(&t->mh);
    int rc = read_model(eng, tagdir, t, &n_files, err, errlen);
    if (!rc) rc = read_moments(eng, tagdir, t, n_files, err, errlen);
    if (!rc) rc = rescale_position(eng, tagdir, t, err, errlen);
    return rc;
}

void tr__ckpt_tag_free(tr__ckpt_tag_t *t)
{
    if (!t) return;
    msgpack_unpacked_destroy(&t->mh);
    tr__ckpt_file_free(&t->model);
    free(t->assembled);
    free(t->moments);
    memset(t, 0, sizeof(*t));
}
