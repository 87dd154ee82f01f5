/* llmc.c: llm.c's GPT-2 checkpoint and token shard formats (layout in troupe/io.h).
 *
 * A checkpoint stores each tensor kind for all layers at once; Troupe's GPT-2 keeps each
 * block's tensors together. Loading and saving walk the file's order (the table `order`
 * below) and, for the per-layer kinds, visit the L block layers in turn, so tensors move
 * straight between the file and their place in the model with no staging copy. Sizes are
 * checked against the header before any parameter is read, so a truncated or padded file
 * is reported as such instead of leaving a half-loaded model.
 */
#include "troupe/io.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "troupe/error.h"
#include "base/errf.h"

/* Opens path and reads its header; on success *f is open and *size is the file's size. */
static int open_header(const char *path, FILE **f, int32_t *h, long long *size, char *why,
                       size_t why_len)
{
    *f = fopen(path, "rb");
    if (!*f) return tr__errf(why, why_len, -errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(*f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(*f);
        return tr__errf(why, why_len, TR_EISDIR, "%s: is a directory; expected an llm.c file",
                        path);
    }
    if (fstat(fileno(*f), &st) != 0 ||
        fread(h, sizeof(int32_t), TR_LLMC_HEADER_INTS, *f) != TR_LLMC_HEADER_INTS) {
        fclose(*f);
        return tr__errf(why, why_len, TR_EFORMAT,
                        "%s: truncated header: the file has fewer than %d bytes", path,
                        TR_LLMC_HEADER_INTS * 4);
    }
    *size = (long long)st.st_size;
    return 0;
}

static int check_magic(const char *path, const int32_t *h, int magic, int version, char *why,
                       size_t why_len)
{
    if (h[0] != magic)
        return tr__errf(why, why_len, TR_EFORMAT, "%s: header[0] (magic) is %d, expected %d", path,
                        h[0], magic);
    if (h[1] != version)
        return tr__errf(why, why_len, TR_EFORMAT, "%s: header[1] (version) is %d, expected %d%s",
                        path, h[1], version,
                        magic == TR_LLMC_MODEL_MAGIC && h[1] == 5
                            ? " (version 5 is bf16; only fp32 "
                              "checkpoints are supported)"
                            : "");
    return 0;
}

static int check_size(const char *path, long long size, long long want, char *why, size_t why_len)
{
    if (size < want)
        return tr__errf(why, why_len, TR_EFORMAT,
                        "%s: truncated: %lld bytes, the header implies %lld", path, size, want);
    if (size > want)
        return tr__errf(why, why_len, TR_EFORMAT,
                        "%s: %lld bytes, the header implies %lld (trailing data)", path, size,
                        want);
    return 0;
}

/* ---- GPT-2 checkpoints ----------------------------------------------------------------------- */

static long long gpt2_floats(const tr_gpt2_config_t *g)
{
    long long C = g->channels, L = g->num_layers;
    return (long long)g->padded_vocab_size * C + (long long)g->max_seq_len * C +
           L * (12 * C * C + 13 * C) + 2 * C;
}

static int header_config(const char *path, const int32_t *h, tr_gpt2_config_t *g, char *why,
                         size_t why_len)
{
    static const char *fields[] = {"max_seq_len", "vocab_size", "num_layers",
                                   "num_heads",   "channels",   "padded_vocab_size"};
    for (int i = 2; i < 8; i++)
        if (h[i] < 1 || h[i] > (1 << 24))
            return tr__errf(why, why_len, TR_EFORMAT, "%s: header[%d] (%s) is %d, expected 1..%d",
                            path, i, fields[i - 2], h[i], 1 << 24);
    *g = (tr_gpt2_config_t){.max_seq_len = h[2],
                            .vocab_size = h[3],
                            .num_layers = h[4],
                            .num_heads = h[5],
                            .channels = h[6],
                            .padded_vocab_size = h[7]};
    if (g->channels % g->num_heads)
        return tr__errf(why, why_len, TR_EFORMAT,
                        "%s: header[6] (channels) %d is not a multiple of header[5] (num_heads) %d",
                        path, g->channels, g->num_heads);
    if (g->padded_vocab_size < g->vocab_size)
        return tr__errf(
            why, why_len, TR_EFORMAT,
            "%s: header[7] (padded_vocab_size) %d is less than header[3] (vocab_size) %d", path,
            g->padded_vocab_size, g->vocab_size);
    return 0;
}

static int open_checkpoint(const char *path, FILE **f, tr_gpt2_config_t *g, char *why,
                           size_t why_len)
{
    int32_t h[TR_LLMC_HEADER_INTS];
    long long size;
    int err = open_header(path, f, h, &size, why, why_len);
    if (err) return err;
    err = check_magic(path, h, TR_LLMC_MODEL_MAGIC, TR_LLMC_MODEL_VERSION, why, why_len);
    if (!err) err = header_config(path, h, g, why, why_len);
    if (!err)
        err = check_size(path, size, 4LL * TR_LLMC_HEADER_INTS + 4 * gpt2_floats(g), why, why_len);
    if (err) fclose(*f);
    return err;
}

int tr_llmc_gpt2_read_config(const char *path, tr_gpt2_config_t *config, char *why, size_t why_len)
{
    FILE *f;
    int err = open_checkpoint(path, &f, config, why, why_len);
    if (!err) fclose(f);
    return err;
}

/* The file's order: (layer, tensor) pairs, layer -1 meaning "each block, 1..L in turn". */
static const struct {
    int layer; /* 0 embed, -1 every block, -2 the head */
    const char *name;
} order[] = {
    {0, "wte"},       {0, "wpe"},       {-1, "ln1w"}, {-1, "ln1b"}, {-1, "qkvw"}, {-1, "qkvb"},
    {-1, "attprojw"}, {-1, "attprojb"}, {-1, "ln2w"}, {-1, "ln2b"}, {-1, "fcw"},  {-1, "fcb"},
    {-1, "fcprojw"},  {-1, "fcprojb"},  {-2, "lnfw"}, {-2, "lnfb"},
};

typedef int (*tensor_fn)(float *p, size_t n, FILE *f);

static int read_tensor(float *p, size_t n, FILE *f)
{
    return fread(p, sizeof(float), n, f) != n;
}
static int write_tensor(float *p, size_t n, FILE *f)
{
    return fwrite(p, sizeof(float), n, f) != n;
}

/* Calls fn on every parameter tensor of model in the file's order. */
static int walk(const tr_model_t *m, tensor_fn fn, FILE *f)
{
    int L = tr_model_gpt2_config(m)->num_layers;
    float *params = tr_model_params(m);
    for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++) {
        int first = order[k].layer == -1 ? 1 : order[k].layer == -2 ? L + 1 : 0;
        int last = order[k].layer == -1 ? L : first;
        for (int li = first; li <= last; li++) {
            const tr_layer_t *l = tr_model_layer(m, li);
            const tr_param_info_t *p = tr_layer_find_param(l, order[k].name);
            if (!p || fn(params + l->param_offset + p->offset, p->numel, f)) return TR_EIO;
        }
    }
    return 0;
}

int tr_llmc_gpt2_load_into(tr_model_t *model, const char *path, char *why, size_t why_len)
{
    const tr_gpt2_config_t *have = tr_model_gpt2_config(model);
    if (!have) return tr__errf(why, why_len, TR_EINVAL, "%s: the model is not a GPT-2", path);
    FILE *f;
    tr_gpt2_config_t g;
    int err = open_checkpoint(path, &f, &g, why, why_len);
    if (err) return err;
    if (memcmp(&g, have, sizeof(g)) != 0) {
        fclose(f);
        return tr__errf(
            why, why_len, TR_EMISMATCH,
            "%s: checkpoint is maxT %d V %d Vp %d L %d NH %d C %d, the model maxT %d V %d "
            "Vp %d L %d NH %d C %d",
            path, g.max_seq_len, g.vocab_size, g.padded_vocab_size, g.num_layers, g.num_heads,
            g.channels, have->max_seq_len, have->vocab_size, have->padded_vocab_size,
            have->num_layers, have->num_heads, have->channels);
    }
    err = walk(model, read_tensor, f);
    fclose(f);
    return err ? tr__errf(why, why_len, TR_EIO, "%s: read error in the parameters", path) : 0;
}

int tr_llmc_gpt2_load(const char *path, tr_model_t **out, char *why, size_t why_len)
{
    tr_gpt2_config_t g;
    tr_model_t *m = NULL;
    int err = tr_llmc_gpt2_read_config(path, &g, why, why_len);
    if (!err) err = tr_model_gpt2_create(&m, &g, why, why_len);
    if (!err) err = tr_llmc_gpt2_load_into(m, path, why, why_len);
    if (!err)
        *out = m;
    else if (m)
        tr_model_destroy(m);
    return err;
}

/* Writes header + body to path.tmp, then renames it over path. */
static int save_atomically(const char *path, const int32_t *h, int (*body)(FILE *, const void *),
                           const void *arg, char *why, size_t why_len)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
        return tr__errf(why, why_len, TR_EINVAL, "%s: path too long", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return tr__errf(why, why_len, -errno, "%s: cannot create: %s", tmp, strerror(errno));
    int bad = fwrite(h, sizeof(int32_t), TR_LLMC_HEADER_INTS, f) != TR_LLMC_HEADER_INTS;
    bad = bad || body(f, arg);
    int err = bad ? (errno ? -errno : TR_EIO) : 0;
    if (fclose(f) != 0 && !err) err = -errno;
    if (!err && rename(tmp, path) != 0) err = -errno;
    if (err) {
        remove(tmp);
        return tr__errf(why, why_len, err, "%s: write failed: %s", path, tr_strerror(err));
    }
    return 0;
}

static int gpt2_body(FILE *f, const void *model)
{
    return walk(model, write_tensor, f);
}

int tr_llmc_gpt2_save(const tr_model_t *model, const char *path, char *why, size_t why_len)
{
    const tr_gpt2_config_t *g = tr_model_gpt2_config(model);
    if (!g) return tr__errf(why, why_len, TR_EINVAL, "%s: the model is not a GPT-2", path);
    int32_t h[TR_LLMC_HEADER_INTS] = {TR_LLMC_MODEL_MAGIC, TR_LLMC_MODEL_VERSION, g->max_seq_len,
                                      g->vocab_size,       g->num_layers,         g->num_heads,
                                      g->channels,         g->padded_vocab_size};
    return save_atomically(path, h, gpt2_body, model, why, why_len);
}

/* ---- token shards -----------------------------------------------------------------------------
 */

int tr_llmc_tokens_load(const char *path, uint16_t **tokens, size_t *count, char *why,
                        size_t why_len)
{
    FILE *f;
    int32_t h[TR_LLMC_HEADER_INTS];
    long long size;
    int err = open_header(path, &f, h, &size, why, why_len);
    if (err) return err;
    err = check_magic(path, h, TR_LLMC_TOKENS_MAGIC, TR_LLMC_TOKENS_VERSION, why, why_len);
    if (!err && h[2] < 0)
        err = tr__errf(why, why_len, TR_EFORMAT, "%s: header[2] (token count) is %d, expected >= 0",
                       path, h[2]);
    if (!err) err = check_size(path, size, 4LL * TR_LLMC_HEADER_INTS + 2LL * h[2], why, why_len);
    uint16_t *t = err ? NULL : malloc(h[2] ? (size_t)h[2] * 2 : 1);
    if (!err && !t) err = TR_ENOMEM;
    if (!err && fread(t, 2, (size_t)h[2], f) != (size_t)h[2])
        err = tr__errf(why, why_len, TR_EIO, "%s: read error in the tokens", path);
    fclose(f);
    if (err) {
        free(t);
        return err;
    }
    *tokens = t;
    *count = (size_t)h[2];
    return 0;
}

typedef struct {
    const uint16_t *tokens;
    size_t count;
} token_body;

static int tokens_body(FILE *f, const void *arg)
{
    const token_body *b = arg;
    return fwrite(b->tokens, 2, b->count, f) != b->count;
}

int tr_llmc_tokens_save(const char *path, const uint16_t *tokens, size_t count, char *why,
                        size_t why_len)
{
    if (count > INT32_MAX)
        return tr__errf(why, why_len, TR_EINVAL, "%s: %zu tokens, a shard holds at most %d", path,
                        count, INT32_MAX);
    int32_t h[TR_LLMC_HEADER_INTS] = {TR_LLMC_TOKENS_MAGIC, TR_LLMC_TOKENS_VERSION, (int32_t)count};
    token_body b = {tokens, count};
    return save_atomically(path, h, tokens_body, &b, why, why_len);
}
