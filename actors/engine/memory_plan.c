/* memory_plan.c: the memory a configuration takes on each rank, predicted before anything is
 * allocated (troupe/engine.h, "predicting memory"), and the check that refuses at create a
 * configuration that would not fit this machine.
 *
 * One estimator, tr_engine_memory_predict, says by kind what the engine's actors allocate for
 * a config and a model's shapes (a tr_memory_model_t: per layer, its parameter floats and what
 * it keeps at (B, T)). It follows each allocation in the engine as it is built:
 *   parameters      4N; ZeRO 3: 4 (S + P + min(N - P, M + Lmax))  slice, persistent, window
 *                   (offload_param nvme: without S, which is on disk)
 *   gradients       4N; ZeRO 2: 4 (min(N, k b + Lmax) + Tt) the backward's window (below)
 *   grad_partition  ZeRO 2: 4 (hi - lo); 0 when swapped  the optimizer's reduced partition
 *   optimizer       4 a (hi - lo), 0 with nvme           the optimizer's moments
 *   swap            nvme: n_bufs x slot (+ the parameters' and gradients' slots with
 *                   offload_param nvme) + its cache      actors/optim/swapper.c's layout()
 *   comm            on W > 1, a 16-bit wire: 2 B x the window (ZeRO 2, 3) or N   its copies
 *                   + MPI's copies of what is in flight  the window (ZeRO 2) or N, 2 or 4 B
 *   batches         one batch x (1 + prefetch)           the client's staging, loader slots
 *   bf16_copies     2N with bf16 (ZeRO 3: of those held)  the model's bf16 weights
 *   activations     model.c's layout at (B, T)           kept activations, scratch, dbufs
 * with N parameters, a optimizer arrays, [lo, hi) this rank's ZeRO partition (tr__zero_owned),
 * b = reduce_bucket_size, k = 2 with overlap_comm else 1 (buckets in flight), Lmax the largest
 * layer's parameters and Tt the tied ranges' total: at stage 2 the backward holds a window of
 * the gradient, not all of it; at stage 3 the parameters are the slice, the persistent layers
 * and the fetcher's window (tr__zero3_params_of). With offload_param nvme and one micro-step
 * per step the reduced partition is swapped too (plan.swap_grads). Where this build does less
 * than the config asks (offload_param on one rank, a pipeline's stages), the note says so and
 * the figures are what the build does.
 *
 * The engine uses the estimator twice: tr__memory_check before the model's parameters are
 * written and before any actor exists, and at the start-up line, which prints what the
 * actors made beside the prediction when the two differ (tests/actors/test_memory_plan.c
 * keeps them equal).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/engine/engine_internal.h"
#include "actors/engine/memory_plan.h"
#include "base/errf.h"

/* --- a model's shapes ------------------------------------------------------------------- */

static int alloc_layers(tr_memory_model_t *out, int n, int B, int T)
{
    memset(out, 0, sizeof(*out));
    out->layers = calloc((size_t)n, sizeof(*out->layers));
    if (!out->layers) return TR_ENOMEM;
    out->n_layers = n;
    out->B = B;
    out->T = T;
    return 0;
}

/* One layer made by a create function (or held by a model): its table, at (B, T). */
static tr_memory_layer_t describe(const tr_layer_t *l, int B, int T)
{
    return (tr_memory_layer_t){
        .params = l->param_count,
        .tied = l->tie_param[0] ? l->tie_count : 0,
        .acts = l->ops->act_size(l, B, T),
        .scratch = l->ops->scratch_size ? l->ops->scratch_size(l, B, T) : 0,
        .in_dim = l->in_dim,
        .out_dim = l->out_dim,
    };
}

int tr_memory_model_of(tr_memory_model_t *out, const tr_model_t *model, int B, int T)
{
    if (!out || !model || B < 1 || T < 1) return TR_EINVAL;
    int n = tr_model_num_layers(model), rc = alloc_layers(out, n, B, T);
    if (rc < 0) return rc;
    for (int i = 0; i < n; i++)
        out->layers[i] = describe(tr_model_layer(model, i), B, T);
    out->x_dim = tr_model_layer(model, 0)->in_dim;
    tr_model_targets(model, &out->y_dim);
    return 0;
}

/* GPT-2's layers, from model/gpt2.c's size tables (N = B T): embed wte (Vp, C) + wpe
 * (maxT, C), output (N, C); a block's twelve tensors 12 C^2 + 13 C, activations N (16 C + 4)
 * + B NH T^2, scratch N 12 C + B NH T^2 (its stash of 11 N C and datty); the head lnf (2 C),
 * tied to wte, activations N (3 + C + Vp), scratch N (Vp + C). test_memory_plan checks these
 * against tr_model_gpt2_create's layers. */
int tr_memory_model_gpt2(tr_memory_model_t *out, const tr_gpt2_config_t *config, int B, int T,
                         char *why, size_t why_len)
{
    if (!out || !config || B < 1 || T < 1)
        return tr__errf(why, why_len, TR_EINVAL, "GPT-2 shapes: a NULL argument or B, T < 1");
    tr_gpt2_config_t g = *config;
    if (g.padded_vocab_size == 0) g.padded_vocab_size = (g.vocab_size + 127) / 128 * 128;
    if (g.max_seq_len < 1 || g.vocab_size < 1 || g.num_layers < 1 || g.num_heads < 1 ||
        g.channels < 1)
        return tr__errf(why, why_len, TR_EINVAL,
                        "GPT-2 config: max_seq_len %d, vocab_size %d, num_layers %d, num_heads "
                        "%d, channels %d must all be >= 1",
                        g.max_seq_len, g.vocab_size, g.num_layers, g.num_heads, g.channels);
    if (g.channels % g.num_heads)
        return tr__errf(why, why_len, TR_EINVAL,
                        "GPT-2 config: channels %d is not a multiple of num_heads %d", g.channels,
                        g.num_heads);
    if (g.padded_vocab_size < g.vocab_size)
        return tr__errf(why, why_len, TR_EINVAL,
                        "GPT-2 config: padded_vocab_size %d < vocab_size %d", g.padded_vocab_size,
                        g.vocab_size);
    int L = g.num_layers, rc = alloc_layers(out, L + 2, B, T);
    if (rc < 0) return tr__errf(why, why_len, rc, "GPT-2 shapes: out of memory");
    size_t N = (size_t)B * T, C = (size_t)g.channels, Vp = (size_t)g.padded_vocab_size;
    size_t att = (size_t)B * g.num_heads * T * T;
    out->layers[0] = (tr_memory_layer_t){.params = Vp * C + (size_t)g.max_seq_len * C,
                                         .acts = N * C,
                                         .in_dim = 0,
                                         .out_dim = (int)C};
    for (int i = 1; i <= L; i++)
        out->layers[i] = (tr_memory_layer_t){.params = 12 * C * C + 13 * C,
                                             .acts = N * (16 * C + 4) + att,
                                             .scratch = N * 12 * C + att,
                                             .in_dim = (int)C,
                                             .out_dim = (int)C};
    out->layers[L + 1] = (tr_memory_layer_t){.params = 2 * C,
                                             .tied = Vp * C,
                                             .acts = N * (3 + C + Vp),
                                             .scratch = N * (Vp + C),
                                             .in_dim = (int)C,
                                             .out_dim = 1};
    return 0;
}

/* The MLP's layers are made (small structs; no parameter buffer exists without a model),
 * read and freed: the create functions are the size tables. */
int tr_memory_model_mlp(tr_memory_model_t *out, const int *widths, int n, int B, int T, char *why,
                        size_t why_len)
{
    if (!out || !widths || B < 1 || T < 1)
        return tr__errf(why, why_len, TR_EINVAL, "MLP shapes: a NULL argument or B, T < 1");
    if (n < 2) return tr__errf(why, why_len, TR_EINVAL, "MLP: %d widths given, need at least 2", n);
    for (int i = 0; i < n; i++)
        if (widths[i] < 1)
            return tr__errf(why, why_len, TR_EINVAL, "MLP: widths[%d] = %d, need >= 1", i,
                            widths[i]);
    int rc = alloc_layers(out, 2 * (n - 1), B, T), k = 0;
    for (int i = 0; rc == 0 && i + 1 < n; i++) {
        tr_layer_t *l = NULL;
        rc = tr_layer_linear_create(&l, "fc", widths[i], widths[i + 1], 1);
        if (rc == 0) out->layers[k++] = describe(l, B, T);
        if (l && l->ops->destroy) l->ops->destroy(l);
        free(l);
        l = NULL;
        if (rc == 0 && i + 2 < n) rc = tr_layer_gelu_create(&l, "gelu", widths[i + 1]);
        if (l) out->layers[k++] = describe(l, B, T);
        if (l && l->ops->destroy) l->ops->destroy(l);
        free(l);
    }
    tr_layer_t *loss = NULL;
    if (rc == 0) rc = tr_layer_crossentropy_create(&loss, "loss", widths[n - 1], TR_IGNORE_INDEX);
    if (loss) out->layers[k++] = describe(loss, B, T);
    if (loss && loss->ops->destroy) loss->ops->destroy(loss);
    free(loss);
    if (rc < 0) {
        tr_memory_model_close(out);
        return tr__errf(why, why_len, rc, "MLP shapes: out of memory");
    }
    out->x_dim = widths[0];
    return 0;
}

void tr_memory_model_close(tr_memory_model_t *m)
{
    if (!m) return;
    free(m->layers);
    m->layers = NULL;
    m->n_layers = 0;
}

/* --- the estimator ---------------------------------------------------------------------- */

/* The activation floats of model.c's layout(): every layer's region one after another, or
 * checkpointed in groups of k, the outputs of every group but the last and the largest
 * group's regions (one work area); plus reserve()'s scratch (the largest layer's), two
 * boundary-gradient buffers (the widest layer's) and the model's copy of the batch (tokens,
 * targets, x, y). */
static size_t activation_floats(const tr_memory_model_t *m, int k)
{
    size_t N = (size_t)m->B * m->T, total = 0, most = 0, g = 0, scratch = 1, dbuf = 1;
    int n = m->n_layers, groups = k ? (n - 1) / k : 0;
    for (int j = 0; j < groups; j++)
        total += N * (size_t)m->layers[(j + 1) * k - 1].out_dim;
    for (int i = 0; i < n; i++) {
        const tr_memory_layer_t *l = &m->layers[i];
        if (k && i % k == 0) g = 0;
        g += l->acts;
        most = g > most ? g : most;
        if (!k) total += l->acts;
        scratch = l->scratch > scratch ? l->scratch : scratch;
        size_t d = N * (size_t)(l->in_dim > l->out_dim ? l->in_dim : l->out_dim);
        dbuf = d > dbuf ? d : dbuf;
    }
    size_t batch = N * (2 + (size_t)(m->x_dim ? m->x_dim : 1) + (size_t)(m->y_dim ? m->y_dim : 1));
    return (k ? total + most : total) + scratch + 2 * dbuf + batch;
}

/* Parameters, the largest layer's and the tied ranges' totals. */
static void param_figures(const tr_memory_model_t *m, size_t *n, size_t *largest, size_t *tied)
{
    *n = *largest = *tied = 0;
    for (int i = 0; i < m->n_layers; i++) {
        *n += m->layers[i].params;
        *largest = m->layers[i].params > *largest ? m->layers[i].params : *largest;
        *tied += m->layers[i].tied;
    }
}

/* actors/optim/swapper.c's layout(): the rank's partition in sub-groups of sub_group_size,
 * each slot the moment arrays and a 64-byte trailer rounded up to 4096 x
 * intra_op_parallelism, and buffer_count slots in memory (one without a read or write
 * pipeline). */
static uint64_t swap_bytes(const tr_config_t *c, int n_arrays, size_t part, bool swaps, bool params,
                           bool grads)
{
    const tr_config_offload_optimizer_t *oo = &c->zero.offload_optimizer;
    size_t sg = c->zero.sub_group_size > 0 ? (size_t)c->zero.sub_group_size : 1;
    if (params && c->zero.offload_param.buffer_size > 0 &&
        (size_t)c->zero.offload_param.buffer_size < sg)
        sg = (size_t)c->zero.offload_param.buffer_size; /* swapper.c's layout */
    size_t group = sg < part ? sg : part;
    if (group == 0) group = 1;
    size_t unit =
        4096 * (size_t)(c->aio.intra_op_parallelism > 0 ? c->aio.intra_op_parallelism : 1);
    size_t slot = ((size_t)n_arrays * group * sizeof(float) + 64 + unit - 1) / unit * unit;
    size_t pslot = (group * sizeof(float) + 64 + unit - 1) / unit * unit;
    int n_bufs = oo->pipeline_read || oo->pipeline_write ? (int)oo->buffer_count : 1;
    uint64_t bytes =
        swaps ? (uint64_t)n_bufs * (slot + (params ? pslot : 0) + (grads ? pslot : 0)) : 0;
    if (grads) bytes += 4 * (uint64_t)pslot; /* the gradient sub-groups filling (swapper.c) */
    if (params) { /* the cache: buffer_count sub-groups, max_in_cpu elements (swapper.c) */
        size_t n = (size_t)c->zero.offload_param.buffer_count,
               fit = (size_t)c->zero.offload_param.max_in_cpu / group;
        bytes += (uint64_t)(n < fit ? n : fit > 1 ? fit : 1) * pslot;
    }
    return bytes;
}

/* What the build does differently from the config, in words. */
static void write_note(const tr_config_t *c, int world, char *note, size_t len)
{
    size_t used = 0;
    note[0] = '\0';
#define SAY(...)                                                                                   \
    do {                                                                                           \
        if (used < len) used += (size_t)snprintf(note + used, len - used, __VA_ARGS__);            \
    } while (0)
    if (c->zero.offload_param.device != TR_OFFLOAD_NONE && (c->zero.stage != 3 || world == 1))
        SAY("zero_optimization.offload_param takes effect at stage 3 on 2 ranks or more: the "
            "parameters stay in memory. ");
    if (c->zero.offload_param.device == TR_OFFLOAD_CPU && c->zero.stage == 3 && world > 1)
        SAY("offload_param cpu: the partition lives in its own host buffer, the parameter "
            "buffer holds only the gathered layers. ");
    if (c->zero.stage >= 1 && world == 1)
        SAY("On one rank ZeRO partitions nothing: the figures are stage 0's. ");
    if (c->pipeline.stages > 1)
        SAY("pipeline.stages %lld: across ranks each rank holds only its stage's layers (and "
            "the tied tensors they use), their gradients and optimizer state; the figures shown "
            "are the whole model's, and the activations one unpipelined pass's (the stages' "
            "cut is not predicted yet). ",
            (long long)c->pipeline.stages);
    if (c->zero.offload_optimizer.device == TR_OFFLOAD_CPU)
        SAY("offload_optimizer cpu: the moments stay in host memory, as without it (the "
            "optimizer runs on the CPU either way). ");
#undef SAY
    if (used && used < len && note[used - 1] == ' ') note[used - 1] = '\0';
}

int tr_engine_memory_predict(const tr_config_t *c, const tr_memory_model_t *m, int rank,
                             int training, tr_engine_memory_t *out, char *note, size_t note_len)
{
    if (!c || !m || !out || !m->layers || m->n_layers < 1) return TR_EINVAL;
    int world = c->ranks > 0 ? (int)c->ranks : 1;
    if (rank < 0 || rank >= world) return TR_EINVAL;
    size_t n, largest, tied;
    param_figures(m, &n, &largest, &tied);
    int zero = world > 1 ? (int)c->zero.stage : 0;
    const char *names[3];
    int n_arrays = tr__optimizer_array_names(c, names, 3);
    size_t lo = 0, hi = n;
    bool partitioned = zero >= 1 && c->optimizer.type != TR_OPTIMIZER_NONE;
    if (partitioned) tr__zero_owned(n, world, rank, &lo, &hi);
    bool swaps = c->zero.offload_optimizer.device == TR_OFFLOAD_NVME && n_arrays > 0;
    bool swapped_params = zero == 3 && c->zero.offload_param.device == TR_OFFLOAD_NVME;
    bool swapped_grads = swapped_params && swaps && c->gradient_accumulation_steps == 1;
    memset(out, 0, sizeof(*out));
    out->params = (uint64_t)n * sizeof(float);
    if (zero == 3) { /* the slice, the persistent layers, the fetcher's gathered window */
        int64_t k = c->pipeline.activation_checkpoint_interval, L = m->n_layers;
        size_t kept = 0, position = 0; /* the most one layer's pass reads (plan.h) */
        for (int i = 0; i < L; i++) {
            kept += tr__persists(m->layers[i].params, kept, c) ? m->layers[i].params : 0;
            bool recompute = k > 0 && k < L && i % k == k - 1 && i / k < (L - 1) / k;
            size_t group = 0;
            for (int64_t j = recompute ? i / k * k : i; j <= i; j++) /* tr__backward_from */
                group += m->layers[j].params + m->layers[j].tied;
            position = group > position ? group : position;
        }
        out->params = (uint64_t)tr__zero3_params_of(n, world, kept, position, c) * sizeof(float);
    }
    /* ZeRO 2's resident gradient (plan.h): k buckets in flight and the largest layer, at most
     * the whole; the tied ranges come on top, as the engine counts them */
    size_t window =
        zero >= 2 ? tr__grad_window_of(n, largest, c->zero.reduce_bucket_size, c->zero.overlap_comm)
                  : 0;
    out->grads = (uint64_t)(window ? window + tied : n) * sizeof(float);
    out->grad_partition =
        zero >= 2 && partitioned && !swapped_grads ? (uint64_t)(hi - lo) * sizeof(float) : 0;
    out->optimizer = swaps ? 0 : (uint64_t)n_arrays * (hi - lo) * sizeof(float);
    if (swaps || swapped_params) {
        size_t plo, phi; /* the parameter partition (the optimizer's at stage 3) */
        tr__zero_owned(n, world, rank, &plo, &phi);
        out->swap = swap_bytes(c, n_arrays, swapped_params ? phi - plo : hi - lo, swaps,
                               swapped_params, swapped_grads);
    }
    bool wire16 = c->communication_data_type != TR_DTYPE_F32;
    /* the 16-bit wire's copies of the buckets in flight (comm.c hands a bucket's back) */
    out->comm = world > 1 && wire16 ? (uint64_t)(window ? window : n) * 2 : 0;
    if (world > 1) /* MPI's copies of the collectives in flight (libnbc): the window, or all */
        out->comm += (uint64_t)(window ? window : n) * (wire16 ? 2 : 4);
    size_t bt = (size_t)m->B * m->T;
    size_t batch = bt * (size_t)(m->x_dim ? m->x_dim : 1) * 4 +
                   (m->y_dim ? bt * (size_t)m->y_dim * 4 : bt * sizeof(int));
    int64_t prefetch = c->troupe.data.prefetch;
    if (c->pipeline.stages > 1 && prefetch < c->gradient_accumulation_steps)
        prefetch = c->gradient_accumulation_steps; /* setup_check.c's check_pipeline */
    out->batches = (uint64_t)batch * (uint64_t)(1 + (training ? prefetch : 0));
    out->bf16_copies = c->bf16.enabled ? out->params / 2 : 0; /* of the parameters held */
    int64_t k = c->pipeline.activation_checkpoint_interval;
    int interval = k > 0 && k < m->n_layers ? (int)k : 0; /* one group: nothing recomputed */
    out->activations = (uint64_t)activation_floats(m, interval) * sizeof(float);
    if (note && note_len) write_note(c, world, note, note_len);
    return 0;
}

uint64_t tr_engine_memory_total(const tr_engine_memory_t *m)
{
    return m->params + m->grads + m->grad_partition + m->optimizer + m->swap + m->comm +
           m->batches + m->bf16_copies + m->activations;
}

void tr_engine_memory_format(const tr_engine_memory_t *m, char *buf, size_t len)
{
    double mib = 1048576.0;
    char swap[64] = "", bf16[64] = "";
    if (m->swap) snprintf(swap, sizeof(swap), ", swap buffers %.1f MiB", m->swap / mib);
    if (m->bf16_copies)
        snprintf(bf16, sizeof(bf16), ", bf16 weight copies %.1f MiB", m->bf16_copies / mib);
    snprintf(buf, len,
             "parameters %.1f MiB, gradients %.1f MiB (the backward's) + %.1f MiB (this rank's "
             "reduced partition), optimizer states %.1f MiB%s, communication buffers %.1f MiB, "
             "batches %.1f MiB%s, activations %.1f MiB; total %.1f MiB",
             m->params / mib, m->grads / mib, m->grad_partition / mib, m->optimizer / mib, swap,
             m->comm / mib, m->batches / mib, bf16, m->activations / mib,
             (double)tr_engine_memory_total(m) / mib);
}

/* --- what the machine has --------------------------------------------------------------- */

/* A "Key:   123 kB" line of /proc/meminfo, in bytes. */
static int meminfo(const char *key, uint64_t *bytes)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return TR_ENOENT;
    char line[256];
    size_t klen = strlen(key);
    int rc = TR_ENOENT;
    while (rc < 0 && fgets(line, sizeof(line), f)) {
        unsigned long long kb;
        if (!strncmp(line, key, klen) && line[klen] == ':' &&
            sscanf(line + klen + 1, "%llu", &kb) == 1) {
            *bytes = (uint64_t)kb * 1024;
            rc = 0;
        }
    }
    fclose(f);
    return rc;
}

/* A cgroup v2 file of this process's group holding one number ("max": no limit). */
static int cgroup_value(const char *file, uint64_t *value)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return TR_ENOENT;
    char line[1024], path[1200] = "";
    while (!path[0] && fgets(line, sizeof(line), f)) {
        if (strncmp(line, "0::", 3)) continue; /* v2's unified hierarchy */
        line[strcspn(line, "\n")] = '\0';
        snprintf(path, sizeof(path), "/sys/fs/cgroup%s/%s", strcmp(line + 3, "/") ? line + 3 : "",
                 file);
    }
    fclose(f);
    if (!path[0] || !(f = fopen(path, "r"))) return TR_ENOENT;
    unsigned long long v;
    int rc = fscanf(f, "%llu", &v) == 1 ? 0 : TR_ENOENT; /* "max" reads as no number */
    fclose(f);
    if (rc == 0) *value = v;
    return rc;
}

int tr_engine_memory_available(uint64_t *bytes, char *where, size_t where_len)
{
    uint64_t avail = 0, max = 0, cur = 0;
    int have_mem = meminfo("MemAvailable", &avail) == 0;
    int have_cg = cgroup_value("memory.max", &max) == 0;
    if (have_cg && cgroup_value("memory.current", &cur) == 0) max = max > cur ? max - cur : 0;
    if (!have_mem && !have_cg) {
        if (where && where_len) snprintf(where, where_len, "unknown");
        return TR_ENOENT;
    }
    bool cg_lower = have_cg && (!have_mem || max < avail);
    *bytes = cg_lower ? max : avail;
    if (where && where_len)
        snprintf(where, where_len, "%s",
                 cg_lower ? "the cgroup's memory.max less its memory.current"
                          : "MemAvailable in /proc/meminfo");
    return 0;
}

/* --- the check at create ---------------------------------------------------------------- */

/* The ranks on this node: the launcher's count (Open MPI, MPICH/Hydra), else this one. */
static int node_ranks(void)
{
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        char *end;
        long n = v ? strtol(v, &end, 10) : 0;
        if (v && *v && !*end && n > 0 && n < 1 << 20) return (int)n;
    }
    return 1;
}

/* The prediction's total for config c at micro-batch B, or 0 when it cannot be made. */
static uint64_t total_at(const tr_config_t *c, const tr_model_t *model, int B, int T, int rank,
                         int training)
{
    tr_memory_model_t m;
    tr_engine_memory_t mem;
    if (tr_memory_model_of(&m, model, B, T) < 0) return 0;
    int rc = tr_engine_memory_predict(c, &m, rank, training, &mem, NULL, 0);
    tr_memory_model_close(&m);
    return rc < 0 ? 0 : tr_engine_memory_total(&mem);
}

/* Appends one knob's text when it cuts the prediction (need < now): what to set and what a
 * rank would then need. */
__attribute__((format(printf, 6, 7))) static void
knob(char *buf, size_t len, size_t *used, uint64_t now, uint64_t need, const char *fmt, ...)
{
    if (*used >= len || !need || need >= now) return;
    if (*used) *used += (size_t)snprintf(buf + *used, len - *used, "; ");
    va_list ap;
    va_start(ap, fmt);
    *used += (size_t)vsnprintf(buf + *used, len - *used, fmt, ap);
    va_end(ap);
    if (*used < len)
        *used += (size_t)snprintf(buf + *used, len - *used, " (%.2f GiB per rank)",
                                  (double)need / (1 << 30));
}

/* The largest micro-batch below B whose prediction fits `room` (1 when none does). */
static int fitting_batch(const tr_config_t *c, const tr_model_t *model, int B, int T, int rank,
                         int training, double room)
{
    int lo = 1, hi = B - 1; /* the answer is in [lo, hi]; lo may not fit */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if ((double)total_at(c, model, mid, T, rank, training) <= room)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* The knobs that cut this rank's memory, each alone, with the prediction it gives: a higher
 * ZeRO stage, the optimizer's state on NVMe, a smaller micro-batch, activation checkpointing.
 * room: what a rank may take. */
static void list_knobs(const tr_config_t *c, const tr_model_t *model, int B, int T, int rank,
                       int training, uint64_t now, double room, char *buf, size_t len)
{
    size_t used = 0;
    tr_config_t alt = *c;
    int world = c->ranks > 0 ? (int)c->ranks : 1;
    buf[0] = '\0';
    if (world > 1 && c->zero.stage < 2) {
        alt.zero.stage = 2;
        knob(buf, len, &used, now, total_at(&alt, model, B, T, rank, training),
             "zero_optimization.stage 2");
        alt = *c;
    } else if (world == 1) {
        used += (size_t)snprintf(buf, len,
                                 "more ranks with zero_optimization.stage 2 (each keeps 1/N of "
                                 "the optimizer states and gradients)");
    }
    const char *names[3];
    if (c->zero.offload_optimizer.device != TR_OFFLOAD_NVME &&
        tr__optimizer_array_names(c, names, 3) > 0) {
        alt.zero.offload_optimizer.device = TR_OFFLOAD_NVME;
        if (alt.zero.sub_group_size > 10000000) alt.zero.sub_group_size = 10000000;
        knob(buf, len, &used, now, total_at(&alt, model, B, T, rank, training),
             "zero_optimization.offload_optimizer {\"device\": \"nvme\", \"nvme_path\": ...} "
             "with sub_group_size %lld",
             (long long)alt.zero.sub_group_size);
        alt = *c;
    }
    if (B > 1) {
        int b = fitting_batch(c, model, B, T, rank, training, room);
        knob(buf, len, &used, now, total_at(c, model, b, T, rank, training),
             "train_micro_batch_size_per_gpu %d%s, with gradient_accumulation_steps raised to "
             "keep the batch",
             b, b > 1 ? " or less" : "");
    }
    if (c->pipeline.activation_checkpoint_interval != 1 && tr_model_num_layers(model) > 1) {
        alt.pipeline.activation_checkpoint_interval = 1;
        knob(buf, len, &used, now, total_at(&alt, model, B, T, rank, training),
             "pipeline.activation_checkpoint_interval 1 (activation checkpointing)");
    }
    if (!used) snprintf(buf, len, "none of them cuts it: a smaller model");
}

int tr__memory_check(const tr_config_t *c, const tr_model_t *model, int B, int T, int rank,
                     int training, char *err, size_t errlen)
{
    tr_memory_model_t m;
    tr_engine_memory_t mem;
    char note[512], where[96], what[768], knobs[1024];
    int rc = tr_memory_model_of(&m, model, B, T);
    if (rc < 0) return tr__errf(err, errlen, rc, "engine: predicting the memory: out of memory");
    rc = tr_engine_memory_predict(c, &m, rank, training, &mem, note, sizeof(note));
    tr_memory_model_close(&m);
    uint64_t avail;
    if (rc < 0 || !c->troupe.memory_check ||
        tr_engine_memory_available(&avail, where, sizeof(where)) < 0)
        return 0; /* nothing to compare with: the machine does not say */
    int local = node_ranks();
    uint64_t need = tr_engine_memory_total(&mem);
    if ((double)need * local <= (double)avail) return 0;
    tr_engine_memory_format(&mem, what, sizeof(what));
    list_knobs(c, model, B, T, rank, training, need, (double)avail / local, knobs, sizeof(knobs));
    double gib = 1 << 30;
    return tr__errf(
        err, errlen, TR_ECONFIG,
        "%s: this configuration needs %.2f GiB on rank %d (%s)%s%s x %d rank(s) on "
        "this node = %.2f GiB, more than this machine has: %.2f GiB (%s). The knobs that "
        "cut it, each alone: %s; or troupe.memory_check false to start anyway",
        c->source, need / gib, rank, what, note[0] ? "; " : "", note, local,
        need * (double)local / gib, avail / gib, where, knobs);
}
