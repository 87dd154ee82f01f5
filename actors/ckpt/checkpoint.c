/* checkpoint.c: the checkpointer actor (pinned: it blocks on file I/O and fsync).
 *
 * Layout, after DeepSpeed's (checkpoint.h): <dir>/<tag>/model_states.trck (and, from a pipeline
 * across ranks, model_states_stage<s>.trck for its other stages) and
 * <dir>/<tag>/optim_states_rank<R>.trck, then <dir>/latest holding the tag. Each file is an
 * io/ckpt_file: a msgpack header, then arrays of fp32 (parameters; optimizer moments), with a
 * CRC and written to a temporary name, fsynced and renamed; latest is written last, so a crash
 * at any instant leaves the previous checkpoint whole and latest pointing at it.
 *
 * The model header carries: format and version, the model's description (kind, a GPT-2's
 * config, each layer's kind and widths: a load refuses another model's, naming the field), the
 * layer and parameter table (names and shapes), the counters (global steps and samples, skipped
 * steps, micro-steps), the data position, the seed, world size and ZeRO stage, how many optimizer
 * files the tag has, the resolved config (JSON) and the hash of the part every rank agreed on at
 * start (all but its per-process keys: runtime/config/agree.h), and the optimizer's own state
 * (step, beta powers, scheduler position, loss scaler). An optimizer file's header repeats what
 * ties it to its model file (version, global step, world size, config hash) and says which slice
 * [lo, hi) of the N flat parameters its arrays hold.
 *
 * A save on W ranks, as messages (the save chain executor -> optimizer ends here):
 *   every rank writes its files: rank 0 the model file (a pipeline across ranks: each
 *     stage's first replica its stage's); with ZeRO >= 1 every rank its optimizer partition,
 *     otherwise rank 0 alone the whole optimizer state (every rank's is the same then, so the
 *     others write none; a pipeline: each stage's first replica its stage's);
 *   each rank reports how its part went (WRITTEN) to its executor, which learns every rank's
 *     from values it adds to all-reduces every rank makes anyway (a step's loss, a wait's
 *     rounds: COMM_SCALAR TR__SCALAR_CKPT_SAVE; actors/exec/save_track.h);
 *   once every rank's files are durable, rank 0's executor asks for latest (LATEST): rank 0
 *     removes the temporary files killed saves left (no rank is writing now) and writes it,
 *     and the ranks learn how that went the same way; tr_engine_wait_checkpoint returns the
 *     outcome. A save called on some ranks only is found there, or meets another collective
 *     on the others: the comm actor's header check names both ranks and what each is doing
 *     (or, if the others call nothing, its watchdog after troupe.comm.timeout_s).
 * A load reads and checks everything this rank needs (ckpt_read.c, which re-partitions the
 * optimizer state for this world size), then COMM_SCALAR TR__SCALAR_CKPT_LOAD: only when
 * every rank's checks passed does the restore chain (optimizer -> executor -> back here)
 * change anything, so a refused checkpoint changes no rank. When some rank failed, every rank
 * returns the first failing rank's error code (so every rank of a job ends with the same exit
 * status) and that rank's explanation, which crosses the ranks as a COMM_REDUCE of its text.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <msgpack.h>

#include "actors/ckpt/checkpoint.h"
#include "actors/ckpt/ckpt.h"
#include "base/errf.h"
#include "base/file.h"
#include "runtime/comm/comm.h"
#include "runtime/config/agree.h"
#include "runtime/msg/mpack.h"
#include "troupe/aio.h"

/* A failed load's explanation crosses the ranks as WHY_DOUBLES doubles, each holding 6 bytes
 * of text (an integer below 2^48: exact in a double and in a sum with zeros). */
#define WHY_DOUBLES 128
#define WHY_BYTES   (WHY_DOUBLES * 6)
/* A failing rank's answer to an agreement packs (world - rank) and its error's magnitude: MAX
 * over the ranks picks the first failing rank, and its error with it. */
#define CODE_SPAN 8192.0

struct tr__ckpt_actor {
    const tr__plan_t *eng;
    char err[8192]; /* this rank's reason while its ranks agree; then the reply's */
    /* a save or load waiting for the ranks' agreement */
    int local_rc; /* this rank's part: 0 or TR_E* (with err) */
    char dir[4096], tag[256];
    uint64_t step;
    tr_msg_t *restore;         /* a load: the RESTORE to send once every rank's checks passed */
    tr__ckpt_tag_t *restoring; /* a restore's files, until the executor has taken them */
    uint64_t stage_params, stage_moments; /* their registry ids while restoring */
    /* a save: its snapshot, the files assembled in memory, written after the reply */
    tr_ckpt_image_t model, optim;
    bool has_model, has_optim;
    bool wrote_model, wrote_optim; /* renamed into place by this save (DISCARD removes them) */
    char tagdir[4400];
    tr_aio_t *aio; /* the writer (the config's aio section), made at the first save */
    /* a load that failed on some rank: the failure everyone returns, and the first failing
     * rank's explanation, summed over the ranks (only that rank's is not zeros) */
    int load_rc, load_first;
    double why[WHY_DOUBLES];
    uint64_t why_id; /* its registry id while the sum is in flight */
};

/* --- writing ------------------------------------------------------------------------------ */

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

/* The model's description (checkpoint.h): its kind, a GPT-2's config, and each layer's kind,
 * widths and targets; what a load compares before anything else. */
static void pack_model_desc(msgpack_packer *pk, const tr_model_t *model)
{
    const tr_gpt2_config_t *g = tr_model_gpt2_config(model);
    int n = tr_model_num_layers(model);
    msgpack_pack_map(pk, g ? 8 : 2);
    tr__mp_pack_kv_str(pk, "kind", g ? "gpt2" : "layers");
    if (g) {
        tr__mp_pack_kv_int(pk, "vocab", g->vocab_size);
        tr__mp_pack_kv_int(pk, "padded_vocab", g->padded_vocab_size);
        tr__mp_pack_kv_int(pk, "context", g->max_seq_len);
        tr__mp_pack_kv_int(pk, "channels", g->channels);
        tr__mp_pack_kv_int(pk, "layers", g->num_layers);
        tr__mp_pack_kv_int(pk, "heads", g->num_heads);
    }
    tr__mp_pack_str(pk, "blocks");
    msgpack_pack_array(pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        const tr_layer_t *l = tr_model_layer(model, i);
        msgpack_pack_array(pk, 5);
        tr__mp_pack_str(pk, l->ops && l->ops->kind ? l->ops->kind : "");
        msgpack_pack_int(pk, l->in_dim);
        msgpack_pack_int(pk, l->out_dim);
        msgpack_pack_int(pk, l->targets);
        msgpack_pack_int(pk, l->y_dim);
    }
}

/* How many optimizer files a save writes: one per rank when the ranks' slices are disjoint
 * (partitioned), one per pipeline stage when a stage's replicas hold the same state (a
 * pipeline across ranks at ZeRO 0), else rank 0's alone. The files' slices tile the model. */
static int optim_files(const tr__plan_t *e)
{
    return e->optim_slice.partitioned ? e->world : e->stage >= 0 ? e->stages : 1;
}

/* This rank's optimizer file's number k (optim_states_rank<k>.trck), -1: it writes none. */
static int optim_file(const tr__plan_t *e)
{
    if (e->optim_slice.partitioned) return e->rank;
    if (e->stage >= 0) return e->replica == 0 ? e->stage : -1;
    return e->rank == 0 ? 0 : -1;
}

/* The version a save's files say: the first that has what they hold (a pipeline's stage files
 * need 5; any other save reads as 4, so builds before 5 still load it). */
static int save_version(const tr__plan_t *e)
{
    return e->stage >= 0 ? TR__CKPT_VERSION : 4;
}

/* This rank's model file: 0 (model_states.trck, rank 0's), s >= 1 (model_states_stage<s>.trck:
 * with a pipeline across ranks each stage's first replica writes its layers' parameters), or
 * -1: none. */
static int model_file(const tr__plan_t *e)
{
    if (e->stage >= 0) return e->replica == 0 ? e->stage : -1;
    return e->rank == 0 ? 0 : -1;
}

static void pack_model_header(msgpack_packer *pk, msgpack_sbuffer *sb, const tr__plan_t *e,
                              const tr_msg_engine_state_t *st, const char *config_json,
                              uint64_t hash)
{
    msgpack_pack_map(pk, e->stage >= 0 ? 21 : 17);
    if (e->stage >= 0) { /* version 5: the parameters in one file per stage */
        tr__mp_pack_kv_int(pk, "stage_files", e->stages);
        tr__mp_pack_kv_uint(pk, "lo", e->own_lo);
        tr__mp_pack_kv_uint(pk, "hi", e->own_hi);
        tr__mp_pack_kv_uint(pk, "step", st->global_step);
    }
    tr__mp_pack_kv_str(pk, "format", TR__CKPT_FORMAT);
    tr__mp_pack_kv_int(pk, "version", save_version(e));
    tr__mp_pack_kv_str(pk, "kind", "model_states");
    tr__mp_pack_str(pk, "model");
    pack_model_desc(pk, e->model);
    tr__mp_pack_kv_uint(pk, "n_params", e->n_params);
    tr__mp_pack_str(pk, "layers");
    pack_layers(pk, e->model);
    tr__mp_pack_str(pk, "counters");
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint64(pk, st->global_step);
    msgpack_pack_uint64(pk, st->global_samples);
    msgpack_pack_uint64(pk, st->skipped_steps);
    msgpack_pack_uint64(pk, st->micro_steps);
    tr__mp_pack_str(pk, "data");
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint64(pk, st->epoch);
    msgpack_pack_uint64(pk, st->cursor);
    msgpack_pack_uint64(pk, st->batch_index);
    tr__mp_pack_kv_uint(pk, "seed", e->seed);
    tr__mp_pack_kv_int(pk, "world", e->world);
    tr__mp_pack_kv_int(pk, "replicas", e->replicas); /* the data position is per replica */
    tr__mp_pack_kv_int(pk, "zero_stage", e->cfg->zero.stage);
    tr__mp_pack_kv_int(pk, "optim_files", optim_files(e));
    tr__mp_pack_str(pk, "micro_batch");
    msgpack_pack_array(pk, 3);
    msgpack_pack_int(pk, e->B);
    msgpack_pack_int(pk, e->T);
    msgpack_pack_int(pk, e->GAS);
    tr__mp_pack_kv_str(pk, "config", config_json ? config_json : "");
    tr__mp_pack_kv_uint(pk, "config_hash", hash);
    tr__mp_pack_str(pk, "optimizer"); /* the optimizer's own msgpack map, as it packed it */
    msgpack_sbuffer_write(sb, (const char *)st->optim.data, st->optim.len);
}

/* This rank's optimizer file header: its slice [lo, hi) of the n_params flat parameters
 * (hi clipped to n_params: a padded tail is not saved). */
static void pack_optim_header(msgpack_packer *pk, const tr__plan_t *e, uint64_t step, uint64_t hash,
                              const char *const *names, int n)
{
    size_t hi = e->optim_slice.hi < e->n_params ? e->optim_slice.hi : e->n_params;
    msgpack_pack_map(pk, 12);
    tr__mp_pack_kv_str(pk, "format", TR__CKPT_FORMAT);
    tr__mp_pack_kv_int(pk, "version", save_version(e));
    tr__mp_pack_kv_str(pk, "kind", "optim_states");
    tr__mp_pack_kv_uint(pk, "step", step);
    tr__mp_pack_kv_int(pk, "world", e->world);
    tr__mp_pack_kv_uint(pk, "config_hash", hash);
    tr__mp_pack_kv_int(pk, "rank", e->rank);
    tr__mp_pack_kv_int(pk, "zero_stage", e->cfg->zero.stage);
    tr__mp_pack_kv_uint(pk, "n_params", e->n_params);
    tr__mp_pack_kv_uint(pk, "lo", e->optim_slice.lo < hi ? e->optim_slice.lo : hi);
    tr__mp_pack_kv_uint(pk, "hi", hi);
    tr__mp_pack_str(pk, "arrays");
    msgpack_pack_array(pk, (size_t)n);
    for (int i = 0; i < n; i++)
        tr__mp_pack_str(pk, names[i]);
}

/* The `floats` floats a save reads through ref (the parameters, or the optimizer's moments as
 * the optimizer named them); NULL with c->err when the reference does not hold them. */
static const float *saved_array(struct tr__ckpt_actor *c, const tr_tensor_ref_t *ref, size_t floats)
{
    char why[256] = "the state arrays do not match the model";
    const float *p =
        ref->length == floats * sizeof(float) ? tr__resolve(c->eng, ref, why, sizeof(why)) : NULL;
    if (!p) snprintf(c->err, sizeof(c->err), "%s", why);
    return p;
}

/* Lays out im with the header in sb and n arrays of `each` bytes from `from` (spaced `stride`
 * floats apart) as its payload: the snapshot's copy. */
static int snap(struct tr__ckpt_actor *c, tr_ckpt_image_t *im, msgpack_sbuffer *sb,
                const float *from, int n, size_t each, size_t stride)
{
    size_t cap = im->cap;
    int rc = tr__ckpt_image_begin(im, sb->data, sb->size, (size_t)n * each, c->err, sizeof(c->err));
    msgpack_sbuffer_destroy(sb);
    if (rc == 0 && im->cap > cap) /* kept for the next saves: their copy faults no page in */
        tr_log(TR_LOG_INFO,
               "checkpointer: rank %d holds %.1f MiB for a file's copy in background "
               "saves (checkpoint.writer.decoupled), from now on",
               c->eng->rank, (double)im->cap / 1048576.0);
    for (int i = 0; rc == 0 && i < n; i++)
        memcpy(tr__ckpt_image_payload(im) + (size_t)i * each, from + (size_t)i * stride, each);
    return rc;
}

/* This rank's model file: the parameters (with a pipeline across ranks, its stage's
 * layers'), copied. */
static int snap_model(struct tr__ckpt_actor *c, const tr_msg_engine_state_t *st,
                      const char *config_json, uint64_t hash)
{
    const tr__plan_t *e = c->eng;
    size_t n = e->own_hi - e->own_lo;
    tr_tensor_ref_t all = {0}; /* stays empty (refused below) if the registry refuses */
    tr_buffer_ref(e->rt, e->buf_params, e->own_lo * sizeof(float), n * sizeof(float), TR_DTYPE_F32,
                  &all);
    const float *params = saved_array(c, &all, n);
    if (!params) return TR_EINVAL;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_model_header(&pk, &sb, e, st, config_json, hash);
    c->has_model = true;
    return snap(c, &c->model, &sb, params, 1, n * sizeof(float), 0);
}

/* This rank's optimizer file: each moment array's part inside [0, n_params), copied. */
static int snap_optim(struct tr__ckpt_actor *c, const tr_msg_engine_state_t *st, uint64_t hash)
{
    const tr__plan_t *e = c->eng;
    const char *const *names = e->array_names;
    int n = e->n_arrays;
    size_t S = e->optim_slice.hi - e->optim_slice.lo;
    size_t keep = e->optim_slice.hi < e->n_params   ? S
                  : e->optim_slice.lo < e->n_params ? e->n_params - e->optim_slice.lo
                                                    : 0;
    const float *moments = n ? saved_array(c, &st->moments, (size_t)n * S) : NULL;
    if (n && !moments) return TR_EINVAL;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_optim_header(&pk, e, st->global_step, hash, names, n);
    c->has_optim = true;
    return snap(c, &c->optim, &sb, moments, n, keep * sizeof(float), S);
}

/* This rank's part of a save (the tag in c->tag), copied into c->model and c->optim; 0 or
 * TR_E* with c->err. */
static int snapshot(struct tr__ckpt_actor *c, const tr_msg_engine_state_t *st)
{
    const tr__plan_t *e = c->eng;
    c->has_model = c->has_optim = false;
    c->wrote_model = c->wrote_optim = false;
    c->tagdir[0] = '\0';
    if (strchr(c->tag, '/') || !strcmp(c->tag, ".") || !strcmp(c->tag, ".."))
        return tr__errf(c->err, sizeof(c->err), TR_EINVAL, "tag '%s' is not a directory name",
                        c->tag);
    if (tr__path_join(c->tagdir, sizeof(c->tagdir), c->dir, c->tag))
        return tr__errf(c->err, sizeof(c->err), TR_EINVAL, "%s/%s: path too long", c->dir, c->tag);
    /* the hash is of what the ranks agreed on at start (runtime/config/agree.h): the same in
     * every rank's file, whatever per-process keys (workers, tracing, ...) differ */
    char *config_json = tr_config_dump(e->cfg, 0), *shared = tr__config_shared_json(e->cfg);
    if (!config_json || !shared) {
        free(config_json);
        free(shared);
        return tr__errf(c->err, sizeof(c->err), TR_ENOMEM,
                        "%s: out of memory for the config's text", c->tagdir);
    }
    uint64_t hash = tr__config_hash_text(shared); /* ties a tag's files to one config */
    int rc = model_file(e) >= 0 ? snap_model(c, st, config_json, hash) : 0;
    free(config_json);
    free(shared);
    if (rc == 0 && optim_file(e) >= 0) rc = snap_optim(c, st, hash);
    return rc;
}

static void model_path(const struct tr__ckpt_actor *c, char *path, size_t cap)
{
    int k = model_file(c->eng);
    if (k > 0)
        snprintf(path, cap, "%s/model_states_stage%d.trck", c->tagdir, k);
    else
        snprintf(path, cap, "%s/model_states.trck", c->tagdir);
}

static void optim_path(const struct tr__ckpt_actor *c, char *path, size_t cap)
{
    snprintf(path, cap, "%s/optim_states_rank%d.trck", c->tagdir, optim_file(c->eng));
}

/* The snapshot's files, written (the checkpointer's thread; training goes on meanwhile). */
static int write_files(struct tr__ckpt_actor *c)
{
    const tr__plan_t *e = c->eng;
    int rc = tr__mkdir_p(c->tagdir);
    if (rc < 0)
        return tr__errf(c->err, sizeof(c->err), rc, "cannot create %s: %s", c->tagdir,
                        tr_strerror(rc));
    if (!c->aio) {
        tr_aio_options_t o;
        tr_aio_options_from_config(&e->cfg->aio, &o);
        rc = tr_aio_create(&o, &c->aio, c->err, sizeof(c->err));
        if (rc < 0) return rc;
    }
    char path[4500];
    if (c->has_model) {
        tr__ckpt_image_end(&c->model);
        model_path(c, path, sizeof(path));
        rc = tr__ckpt_image_write(&c->model, c->aio, path, c->err, sizeof(c->err));
        c->wrote_model = rc == 0;
    }
    if (rc == 0 && c->has_optim) {
        tr__ckpt_image_end(&c->optim);
        optim_path(c, path, sizeof(path));
        rc = tr__ckpt_image_write(&c->optim, c->aio, path, c->err, sizeof(c->err));
        c->wrote_optim = rc == 0;
    }
    return rc;
}

/* A save that failed on some rank (DISCARD, or this rank's own write failing): the files this
 * rank renamed into place for it are removed, and the tag folder when nothing else is left in
 * it (rmdir: whatever another rank or an earlier save put there stays), so the half-written
 * tag does not look like a checkpoint. latest, written only after every rank's files, still
 * names the last good save. Removing twice does nothing. */
static void discard_files(struct tr__ckpt_actor *c)
{
    char path[4500];
    int removed = 0;
    if (c->wrote_model) {
        model_path(c, path, sizeof(path));
        removed += unlink(path) == 0;
    }
    if (c->wrote_optim) {
        optim_path(c, path, sizeof(path));
        removed += unlink(path) == 0;
    }
    c->wrote_model = c->wrote_optim = false;
    bool gone = c->tagdir[0] && rmdir(c->tagdir) == 0;
    if (removed)
        tr_log(TR_LOG_INFO, "checkpoint: rank %d removed %d file(s) of the failed save%s %s",
               c->eng->rank, removed, gone ? " and its folder" : " from", c->tagdir);
    else if (gone)
        tr_log(TR_LOG_INFO, "checkpoint: rank %d removed the failed save's empty folder %s",
               c->eng->rank, c->tagdir);
}

/* --- the ranks' agreement ------------------------------------------------------------------ */

/* Asks every rank (through the comm actor) whether its part of `what` succeeded: rc is this
 * rank's. The answer, a COMM_SCALAR with the same `what`, names the first and last rank that
 * failed (0: none). Fails the engine if the question cannot be sent. */
static int agree(tr_ctx_t *ctx, struct tr__ckpt_actor *c, uint32_t what, int rc)
{
    const tr__plan_t *e = c->eng;
    c->local_rc = rc;
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_COMM_SCALAR);
    if (!m) {
        tr__engine_fail(e, TR_ENOMEM, "checkpoint: out of message memory");
        return 0;
    }
    bool failed = rc < 0;
    double code = -rc > 0 && -rc < CODE_SPAN ? -rc : -TR_EFAILED;
    *TR_MSG_AS(m, comm_scalar) = (tr_msg_comm_scalar_t){
        .op = TR_REDUCE_MAX,
        .n = 2,
        .what = what,
        .values = {failed ? (e->world - e->rank) * CODE_SPAN + code : 0, failed ? e->rank + 1 : 0}};
    m->step = c->step;
    int sent = tr_actor_send(ctx->rt, e->comm, m);
    if (sent < 0) {
        tr_msg_free(ctx->rt, m);
        tr__engine_fail(e, sent, "checkpoint: cannot reach the comm actor: %s", tr_strerror(sent));
    }
    return 0;
}

/* The first failing rank of an agreement's answer s, and its error (TR_E*); -1 and 0 when
 * every rank succeeded. */
static int first_failure(const struct tr__ckpt_actor *c, const tr_msg_comm_scalar_t *s, int *rc)
{
    if (s->values[0] <= 0) {
        *rc = 0;
        return -1;
    }
    double span = floor(s->values[0] / CODE_SPAN);
    *rc = -(int)(s->values[0] - span * CODE_SPAN);
    return c->eng->world - (int)span;
}

/* The answer to agree() when some rank failed, before the explanation has crossed: the error
 * every rank returns (the first failing rank's, so every rank's exit status is the same) and,
 * on a rank that did not fail, c->err naming the ranks that did (the first one's explanation
 * is added once it arrives: why_arrived). */
static int agreed_failure(struct tr__ckpt_actor *c, const tr_msg_comm_scalar_t *s,
                          const char *doing)
{
    int code, first = first_failure(c, s, &code), last = (int)s->values[1] - 1;
    c->load_first = first;
    if (c->local_rc < 0) return code;
    if (first == last)
        snprintf(c->err, sizeof(c->err), "rank %d could not %s", first, doing);
    else
        snprintf(c->err, sizeof(c->err), "ranks %d to %d (some or all) could not %s", first, last,
                 doing);
    return code;
}

/* The first failing rank's explanation to every rank: its text in c->why (zeros elsewhere),
 * summed over the ranks (COMM_REDUCE). 0 once asked. */
static int ask_why(tr_ctx_t *ctx, struct tr__ckpt_actor *c)
{
    const tr__plan_t *e = c->eng;
    unsigned char text[WHY_BYTES] = {0};
    if (e->rank == c->load_first) /* text keeps a NUL: at most WHY_BYTES - 1 bytes */
        memcpy(text, c->err, strnlen(c->err, WHY_BYTES - 1));
    for (int i = 0; i < WHY_DOUBLES; i++) {
        uint64_t v = 0;
        for (int k = 5; k >= 0; k--)
            v = v << 8 | text[i * 6 + k];
        c->why[i] = (double)v;
    }
    tr_buffer_info_t info = {.base = c->why,
                             .bytes = sizeof(c->why),
                             .dtype = TR_DTYPE_F64,
                             .device_type = TR_DEVICE_CPU,
                             .owner = e->checkpointer,
                             .lifetime = TR_BUFFER_REQUEST};
    snprintf(info.name, sizeof(info.name), "checkpointer/why");
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_COMM_REDUCE);
    int rc = m ? tr_buffer_register(e->rt, &info, &c->why_id) : TR_ENOMEM;
    if (rc == 0)
        rc = tr_buffer_ref(e->rt, c->why_id, 0, sizeof(c->why), TR_DTYPE_F64,
                           &TR_MSG_AS(m, comm_reduce)->buf);
    if (rc == 0) {
        TR_MSG_AS(m, comm_reduce)->op = TR_REDUCE_SUM;
        TR_MSG_AS(m, comm_reduce)->what = TR__SCALAR_CKPT_LOAD;
        m->step = c->step;
        rc = tr_actor_send(ctx->rt, e->comm, m);
    }
    if (rc < 0 && m) tr_msg_free(ctx->rt, m);
    if (rc < 0 && c->why_id) { /* registered, but not sent: nothing will unregister it */
        tr_buffer_unregister(e->rt, c->why_id);
        c->why_id = 0;
    }
    return rc;
}

/* The first failing rank's explanation arrived: a rank that did not fail adds it to c->err. */
static void why_arrived(struct tr__ckpt_actor *c, int rc)
{
    char text[WHY_BYTES + 1];
    for (int i = 0; i < WHY_DOUBLES; i++) {
        uint64_t v = (uint64_t)c->why[i];
        for (int k = 0; k < 6; k++, v >>= 8)
            text[i * 6 + k] = (char)(v & 0xff);
    }
    text[WHY_BYTES] = '\0';
    if (c->why_id) tr_buffer_unregister(c->eng->rt, c->why_id);
    c->why_id = 0;
    if (c->local_rc < 0) return; /* its own explanation stays */
    size_t n = strlen(c->err);
    if (rc < 0 || !text[0])
        snprintf(c->err + n, sizeof(c->err) - n, " (its own error says why)");
    else
        snprintf(c->err + n, sizeof(c->err) - n, "; rank %d's error: %s", c->load_first, text);
}

/* --- saving -------------------------------------------------------------------------------- */

/* Tells the executor how this rank's part of the save's phase went (it keeps the ranks in
 * step: actors/exec/save_track.c). */
static void report(tr_ctx_t *ctx, struct tr__ckpt_actor *c, int rc)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_ENGINE_STATE);
    if (!m) {
        tr__engine_fail(c->eng, TR_ENOMEM, "checkpoint: out of message memory");
        return;
    }
    tr_msg_engine_state_t *s = TR_MSG_AS(m, engine_state);
    s->kind = TR__STATE_WRITTEN;
    s->rc = rc;
    s->global_step = c->step;
    if (rc < 0) snprintf(s->error, sizeof(s->error), "%.511s", c->err);
    char why[256]; /* the tag latest names now, for a failure's message ("": none, unreadable) */
    if (tr__ckpt_latest_read(c->dir, s->tag, sizeof(s->tag), why, sizeof(why)) < 0)
        s->tag[0] = '\0';
    m->step = c->step;
    if (tr_actor_send(ctx->rt, c->eng->executor, m) < 0) {
        tr_msg_free(ctx->rt, m);
        tr__engine_fail(c->eng, TR_ESTOPPED, "checkpoint: cannot reach the executor");
    }
}

/* SAVE, from the optimizer: the snapshot, then the caller's reply (training goes on), then
 * the write (WRITE, to itself: its own span in the trace). */
static void save(tr_ctx_t *ctx, struct tr__ckpt_actor *c, const tr_msg_engine_state_t *st)
{
    snprintf(c->dir, sizeof(c->dir), "%s", st->dir);
    if (st->tag[0])
        snprintf(c->tag, sizeof(c->tag), "%s", st->tag);
    else
        snprintf(c->tag, sizeof(c->tag), "global_step%llu", (unsigned long long)st->global_step);
    c->step = st->global_step;
    int rc = st->rc < 0 ? tr__errf(c->err, sizeof(c->err), st->rc, "%s", st->error)
                        : snapshot(c, st); /* the optimizer's refusal, or the copy */
    tr_msg_t *w = rc == 0 ? tr_msg_new(ctx->rt, TR_MSG_ENGINE_STATE) : NULL;
    if (rc == 0 && !w) rc = tr__errf(c->err, sizeof(c->err), TR_ENOMEM, "out of message memory");
    if (rc == 0) {
        TR_MSG_AS(w, engine_state)->kind = TR__STATE_WRITE;
        w->step = c->step;
        if ((rc = tr_actor_send(ctx->rt, ctx->self, w)) < 0) {
            tr_msg_free(ctx->rt, w);
            snprintf(c->err, sizeof(c->err), "cannot queue the write: %s", tr_strerror(rc));
        }
    }
    /* The call returns either way: a failure here is this rank's part of the save failing,
     * which the ranks learn together (actors/exec/save_track.h) and tr_engine_wait_checkpoint
     * returns. */
    tr__reply(c->eng, 0, &(tr__reply_t){.global_step = c->step}, NULL);
    if (rc < 0) report(ctx, c, rc);
}

/* Tests: TROUPE_TEST_CKPT_WRITE_GATE=FILE holds a background write until FILE exists (60 s
 * at most), so a test can train while a save is known to be unwritten. */
static void write_gate(void)
{
    const char *gate = getenv("TROUPE_TEST_CKPT_WRITE_GATE");
    for (int i = 0; gate && i < 6000 && access(gate, F_OK) != 0; i++)
        usleep(10000);
}

/* Every rank's files are durable (the executor heard it from every rank): rank 0 clears what
 * killed saves left and writes latest. */
static int write_latest(struct tr__ckpt_actor *c)
{
    uint64_t stale_bytes;
    int stale = tr__ckpt_clean_tmp(c->dir, &stale_bytes);
    if (stale > 0)
        tr_log(TR_LOG_INFO,
               "checkpoint: removed %d temporary file(s) (%llu bytes) that processes killed "
               "during a save left in %s",
               stale, (unsigned long long)stale_bytes, c->dir);
    return tr__ckpt_latest_write(c->dir, c->tag, c->err, sizeof(c->err));
}

/* --- loading ------------------------------------------------------------------------------- */

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

static void end_restore(tr_ctx_t *ctx, struct tr__ckpt_actor *c)
{
    if (c->stage_params) tr_buffer_unregister(c->eng->rt, c->stage_params);
    if (c->stage_moments) tr_buffer_unregister(c->eng->rt, c->stage_moments);
    c->stage_params = c->stage_moments = 0;
    tr__ckpt_tag_free(c->restoring);
    free(c->restoring);
    c->restoring = NULL;
    if (c->restore) tr_msg_free(ctx->rt, c->restore);
    c->restore = NULL;
}

/* The RESTORE message for a tag read and checked (t), its arrays staged. */
static int restore_msg(tr_ctx_t *ctx, struct tr__ckpt_actor *c, const tr__ckpt_tag_t *t,
                       const char *tagdir)
{
    tr_msg_t *m = tr_msg_new(ctx->rt, TR_MSG_ENGINE_STATE);
    if (!m) return tr__errf(c->err, sizeof(c->err), TR_ENOMEM, "out of message memory");
    c->restore = m;
    tr_msg_engine_state_t *s = TR_MSG_AS(m, engine_state);
    *s = (tr_msg_engine_state_t){.kind = TR__STATE_RESTORE,
                                 .global_step = t->counters[0],
                                 .global_samples = t->counters[1],
                                 .skipped_steps = t->counters[2],
                                 .micro_steps = t->counters[3],
                                 .epoch = t->data[0],
                                 .cursor = t->data[1],
                                 .batch_index = t->data[2]};
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_object(&pk, *t->optim_state);
    int rc = 0;
    if (sb.size > sizeof(s->optim.data)) {
        rc = tr__errf(c->err, sizeof(c->err), TR_EFORMAT,
                      "%s: optimizer state of %zu bytes, more than %zu", tagdir, sb.size,
                      sizeof(s->optim.data));
    } else {
        s->optim.len = (uint32_t)sb.size;
        memcpy(s->optim.data, sb.data, s->optim.len);
    }
    msgpack_sbuffer_destroy(&sb);
    if (!rc)
        rc = stage(c, "params", t->params, c->eng->n_params * sizeof(float), &c->stage_params,
                   &s->params);
    if (!rc && t->moments)
        rc = stage(c, "moments", t->moments, t->moments_bytes, &c->stage_moments, &s->moments);
    if (rc < 0 && !c->err[0]) snprintf(c->err, sizeof(c->err), "%s", tr_strerror(rc));
    return rc;
}

/* LOAD: reads and checks this rank's part of a tag and stages it; then the agreement. */
static int load(tr_ctx_t *ctx, struct tr__ckpt_actor *c, const tr_msg_engine_req_t *r,
                uint64_t step)
{
    char tagdir[4400];
    int rc = 0;
    c->step = step; /* the request's: the chain is classed with the step it was asked in */
    snprintf(c->dir, sizeof(c->dir), "%s", r->dir);
    if (r->tag[0])
        snprintf(c->tag, sizeof(c->tag), "%s", r->tag);
    else
        rc = tr__ckpt_latest_read(c->dir, c->tag, sizeof(c->tag), c->err, sizeof(c->err));
    if (!rc && tr__path_join(tagdir, sizeof(tagdir), c->dir, c->tag))
        rc = tr__errf(c->err, sizeof(c->err), TR_EINVAL, "%s/%s: path too long", c->dir, c->tag);
    if (!rc && !(c->restoring = calloc(1, sizeof(*c->restoring))))
        rc = tr__errf(c->err, sizeof(c->err), TR_ENOMEM, "out of memory");
    if (!rc) rc = tr__ckpt_tag_read(c->eng, tagdir, c->restoring, c->err, sizeof(c->err));
    if (!rc) rc = restore_msg(ctx, c, c->restoring, tagdir);
    return agree(ctx, c, TR__SCALAR_CKPT_LOAD, rc);
}

/* Every rank read its part (then the restore begins), or some failed: every rank returns the
 * first failing rank's error, with its explanation (ask_why, then load_failed). */
static void on_load_agreed(tr_ctx_t *ctx, struct tr__ckpt_actor *c, const tr_msg_comm_scalar_t *s)
{
    int rc = s->values[0] > 0 ? agreed_failure(c, s, "read its part of the checkpoint") : 0;
    c->load_rc = rc;
    if (rc < 0 && c->eng->world > 1 && ask_why(ctx, c) == 0) return;
    if (rc < 0 && c->local_rc >= 0) why_arrived(c, TR_EFAILED); /* it could not be asked */
    if (rc == 0) {
        rc = tr_actor_send(ctx->rt, c->eng->optimizer, c->restore);
        if (rc == 0)
            c->restore = NULL; /* the runtime's now */
        else
            snprintf(c->err, sizeof(c->err), "%s", tr_strerror(rc));
    }
    if (rc < 0) {
        end_restore(ctx, c);
        tr__reply(c->eng, rc, NULL, "load: %s", c->err);
    }
}

/* A failed load's explanation crossed the ranks (COMM_REDUCE): the load's reply. */
static void load_failed(tr_ctx_t *ctx, struct tr__ckpt_actor *c, const tr_msg_comm_reduce_t *v)
{
    why_arrived(c, v->rc);
    end_restore(ctx, c);
    tr__reply(c->eng, c->load_rc, NULL, "load: %s", c->err);
}

/* The end of a restore: the executor has taken the state (or the optimizer refused it). */
static void restored(tr_ctx_t *ctx, struct tr__ckpt_actor *c, const tr_msg_engine_state_t *s)
{
    end_restore(ctx, c);
    if (s->rc < 0)
        tr__reply(c->eng, s->rc, NULL, "load: %s", s->error);
    else
        tr__reply(c->eng, 0, &(tr__reply_t){.global_step = s->global_step}, NULL);
}

static int checkpointer_behaviour(tr_ctx_t *ctx, tr_msg_t *msg)
{
    struct tr__ckpt_actor *c = ctx->state;
    if (msg->type == TR_MSG_COMM_SCALAR) { /* an agreement's answer: c->err is still ours */
        const tr_msg_comm_scalar_t *s = TR_MSG_AS(msg, comm_scalar);
        if (s->what == TR__SCALAR_CKPT_LOAD) on_load_agreed(ctx, c, s);
        return 0;
    }
    if (msg->type == TR_MSG_COMM_REDUCE) { /* a failed load's explanation */
        if (TR_MSG_AS(msg, comm_reduce)->what == TR__SCALAR_CKPT_LOAD)
            load_failed(ctx, c, TR_MSG_AS(msg, comm_reduce));
        return 0;
    }
    c->err[0] = '\0';
    if (msg->type == TR_MSG_ENGINE_STATE) {
        tr_msg_engine_state_t *s = TR_MSG_AS(msg, engine_state);
        if (s->kind == TR__STATE_RESTORED) restored(ctx, c, s);
        if (s->kind == TR__STATE_SAVE) save(ctx, c, s);
        if (s->kind == TR__STATE_WRITE) {
            write_gate();
            int rc = write_files(c);
            if (rc < 0) discard_files(c); /* the save has failed: its tag goes now */
            report(ctx, c, rc);
        }
        if (s->kind == TR__STATE_DISCARD) discard_files(c);
        if (s->kind == TR__STATE_LATEST) report(ctx, c, write_latest(c));
        return 0;
    }
    if (msg->type != TR_MSG_ENGINE_REQ) return 0;
    if (c->restoring) {
        tr__reply(c->eng, TR_EBUSY, NULL, "load: a restore is still in progress");
        return 0;
    }
    return load(ctx, c, TR_MSG_AS(msg, engine_req), msg->step);
}

int tr__checkpointer_spawn(const tr__plan_t *eng, struct tr__ckpt_actor **state, tr_actor_t *self)
{
    struct tr__ckpt_actor *c = calloc(1, sizeof(*c));
    if (!c) return TR_ENOMEM;
    c->eng = eng;
    *state = c;
    tr_actor_opts_t o = {.name = "checkpointer",
                         .pinned = 1,
                         .defer_stop = 1,
                         .supervisor = eng->supervisor,
                         .lane_kind = TR_LANE_IO};
    return tr_actor_spawn(eng->rt, checkpointer_behaviour, c, &o, self);
}

void tr__checkpointer_free(struct tr__ckpt_actor *c)
{
    if (!c) return;
    tr__ckpt_tag_free(c->restoring);
    free(c->restoring); /* c->restore, if any, went with the runtime's message pools */
    tr__ckpt_image_free(&c->model);
    tr__ckpt_image_free(&c->optim);
    tr_aio_destroy(c->aio);
    free(c);
}
