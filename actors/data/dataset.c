/* dataset.c: where micro-batches come from — memory-mapped llm.c token shards, or a user's
 * callback.
 *
 * Shards: every file matching the glob, in sorted order, is mapped read-only and its header
 * checked (magic 20240520, version 1, token count against the file size). For a GPT-2 every
 * token is checked against its vocabulary once, at open (a vectorised max over 64 Ki-token
 * blocks: 15 ms per 100 MB shard in the page cache, measured), so a bad token is refused before
 * the first step instead of when its sample is drawn; the draw still checks its window, since
 * a shard can change on disk under the mapping. A sample is a window
 * of T+1 tokens starting at a multiple of T inside one shard (inputs = the first T, targets =
 * the last T). Samples are numbered across shards; each epoch visits them in an order that is
 * a permutation seeded by (seed, epoch) when shuffling, or in file order otherwise, and rank r
 * of W takes every W-th sample from r. A batch is the next B samples of this rank; when an
 * epoch runs out the next begins (the caller is told, and logs it).
 *
 * The position (epoch, cursor, batch index) is all the state: seeking to a saved position
 * continues the stream exactly.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "actors/data/dataset.h"
#include "actors/engine/plan.h"
#include "troupe/io.h"
#include "troupe/rng.h"

typedef struct shard {
    char *path;
    const uint16_t *tokens;
    size_t n_tokens;
    void *map;
    size_t map_len;
} shard_t;

struct tr__dataset {
    int B, T, x_dim, rank, world, vocab;
    tr_batch_cb cb;
    void *user;
    shard_t *shards;
    size_t n_shards;
    size_t *first_sample; /* per shard: number of the shard's first sample */
    uint64_t n_samples;
    bool shuffle;
    uint64_t seed;
    uint32_t *perm; /* this epoch's order (shuffle only) */
    uint64_t perm_epoch;
    tr__data_pos_t pos;
};

static int map_shard(const char *path, shard_t *s, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tr__errf(err, errlen, -errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tr__errf(err, errlen, TR_EFORMAT, "%s: not a regular file", path);
    }
    size_t header = TR_LLMC_HEADER_INTS * sizeof(int32_t);
    if ((size_t)st.st_size < header) {
        close(fd);
        return tr__errf(err, errlen, TR_EFORMAT, "%s: header: file has %lld bytes, need %zu", path,
                        (long long)st.st_size, header);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return tr__errf(err, errlen, -errno, "%s: cannot map: %s", path, strerror(errno));
    const int32_t *h = map;
    int rc = 0;
    if (h[0] != TR_LLMC_TOKENS_MAGIC)
        rc = tr__errf(err, errlen, TR_EFORMAT, "%s: magic: expected %d (llm.c token shard), got %d",
                      path, TR_LLMC_TOKENS_MAGIC, h[0]);
    else if (h[1] != TR_LLMC_TOKENS_VERSION)
        rc = tr__errf(err, errlen, TR_EFORMAT, "%s: version: expected %d, got %d", path,
                      TR_LLMC_TOKENS_VERSION, h[1]);
    else if (h[2] < 0 || header + (size_t)h[2] * 2 != (size_t)st.st_size)
        rc =
            tr__errf(err, errlen, TR_EFORMAT,
                     "%s: token count: header says %d tokens (%zu bytes), file has %lld bytes",
                     path, h[2], header + (size_t)(h[2] < 0 ? 0 : h[2]) * 2, (long long)st.st_size);
    if (rc) {
        munmap(map, (size_t)st.st_size);
        return rc;
    }
    if (!(s->path = strdup(path))) {
        munmap(map, (size_t)st.st_size);
        return tr__errf(err, errlen, TR_ENOMEM, "%s: no memory for its name", path);
    }
    s->map = map;
    s->map_len = (size_t)st.st_size;
    s->tokens = (const uint16_t *)((const char *)map + header);
    s->n_tokens = (size_t)h[2];
    madvise(map, s->map_len, MADV_WILLNEED);
    return 0;
}

/* The largest token of t[0..n). The lanes make the loop one the compiler vectorises at -O2
 * (a plain max reduction is not: 4x slower). */
static uint16_t max_token(const uint16_t *t, size_t n)
{
    enum { LANES = 32 };
    uint16_t lane[LANES] = {0}, mx = 0;
    size_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++)
            lane[k] = t[i + k] > lane[k] ? t[i + k] : lane[k];
    for (int k = 0; k < LANES; k++)
        mx = lane[k] > mx ? lane[k] : mx;
    for (; i < n; i++)
        mx = t[i] > mx ? t[i] : mx;
    return mx;
}

/* Every token of shard s is below vocab; the first one that is not is named
 * with its position and value. */
static int scan_tokens(const shard_t *s, int vocab, char *err, size_t errlen)
{
    enum { BLOCK = 1 << 16 };
    for (size_t i = 0; i < s->n_tokens; i += BLOCK) {
        size_t n = s->n_tokens - i < BLOCK ? s->n_tokens - i : BLOCK;
        if (max_token(s->tokens + i, n) < vocab) continue;
        size_t j = i;
        while (s->tokens[j] < vocab)
            j++;
        return tr__errf(
            err, errlen, TR_EMISMATCH,
            "%s: token %zu (byte offset %zu) is %u, outside the model's vocabulary of %d "
            "(tokens 0..%d)",
            s->path, j, TR_LLMC_HEADER_INTS * sizeof(int32_t) + 2 * j, s->tokens[j], vocab,
            vocab - 1);
    }
    return 0;
}

static int open_shards(tr__dataset_t *ds, const char *pattern, char *err, size_t errlen)
{
    glob_t g;
    int grc = glob(pattern, 0, NULL, &g);
    if (grc != 0) {
        if (grc != GLOB_NOMATCH) globfree(&g);
        return tr__errf(err, errlen, TR_ENOENT, "%s: no file matches", pattern);
    }
    ds->shards = calloc(g.gl_pathc, sizeof(shard_t));
    ds->first_sample = calloc(g.gl_pathc + 1, sizeof(size_t));
    int rc = ds->shards && ds->first_sample
                 ? 0
                 : tr__errf(err, errlen, TR_ENOMEM, "%s: no memory for the table of %zu shards",
                            pattern, g.gl_pathc);
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; i++) {
        rc = map_shard(g.gl_pathv[i], &ds->shards[i], err, errlen);
        if (rc) break;
        ds->n_shards++;
        if (ds->vocab && (rc = scan_tokens(&ds->shards[i], ds->vocab, err, errlen))) break;
        size_t n = ds->shards[i].n_tokens;
        ds->first_sample[i] = ds->n_samples;
        ds->n_samples += n > (size_t)ds->T ? (n - 1) / (size_t)ds->T : 0;
    }
    if (ds->first_sample) ds->first_sample[ds->n_shards] = ds->n_samples;
    globfree(&g);
    return rc;
}

int tr__dataset_open(tr__dataset_t **out, const tr_dataset_t *spec, const tr__plan_t *eng,
                     bool shuffle, uint64_t seed, char *err, size_t errlen)
{
    tr__dataset_t *ds = calloc(1, sizeof(*ds));
    if (!ds)
        return tr__errf(err, errlen, TR_ENOMEM, "dataset: no memory for %zu bytes", sizeof(*ds));
    *ds = (tr__dataset_t){.B = eng->B,
                          .T = eng->T,
                          .x_dim = spec->x_dim,
                          .rank = eng->replica, /* a replica's stages read the same */
                          .world = eng->replicas,
                          .cb = spec->batch,
                          .user = spec->user,
                          .shuffle = shuffle,
                          .seed = seed,
                          .perm_epoch = UINT64_MAX};
    const tr_gpt2_config_t *g = tr_model_gpt2_config(eng->model);
    ds->vocab = g ? g->vocab_size : 0;
    int rc = 0;
    if (!ds->cb) {
        if (!spec->shards)
            rc = tr__errf(err, errlen, TR_EINVAL, "dataset: neither token shards nor a callback");
        else if (ds->x_dim)
            rc =
                tr__errf(err, errlen, TR_EINVAL,
                         "%s: token shards feed token models; a float-input model needs a callback",
                         spec->shards);
        else if ((rc = open_shards(ds, spec->shards, err, errlen)) == 0 &&
                 ds->n_samples < (uint64_t)ds->B * (uint64_t)ds->world)
            rc = tr__errf(err, errlen, TR_EINVAL,
                          "%s: %llu samples of %d+1 tokens; one batch needs %d per rank x %d ranks",
                          spec->shards, (unsigned long long)ds->n_samples, ds->T, ds->B, ds->world);
    }
    if (rc) {
        tr__dataset_close(ds);
        return rc;
    }
    *out = ds;
    return 0;
}

void tr__dataset_close(tr__dataset_t *ds)
{
    if (!ds) return;
    for (size_t i = 0; i < ds->n_shards; i++) {
        munmap(ds->shards[i].map, ds->shards[i].map_len);
        free(ds->shards[i].path);
    }
    free(ds->shards);
    free(ds->first_sample);
    free(ds->perm);
    free(ds);
}

uint64_t tr__dataset_samples_per_epoch(const tr__dataset_t *ds)
{
    return ds->cb ? 0 : ds->n_samples / (uint64_t)ds->world;
}

/* The epoch's order: Fisher-Yates over all samples, seeded by (seed, epoch). */
static int make_perm(tr__dataset_t *ds, uint64_t epoch)
{
    if (ds->perm_epoch == epoch) return 0;
    if (!ds->perm && !(ds->perm = malloc(ds->n_samples * sizeof(uint32_t)))) return TR_ENOMEM;
    for (uint64_t i = 0; i < ds->n_samples; i++)
        ds->perm[i] = (uint32_t)i;
    uint64_t rng = ds->seed * 0x2545f4914f6cdd1dull + epoch;
    for (uint64_t i = ds->n_samples - 1; i > 0; i--) {
        uint64_t j = tr_rng_next(&rng) % (i + 1);
        uint32_t t = ds->perm[i];
        ds->perm[i] = ds->perm[j];
        ds->perm[j] = t;
    }
    ds->perm_epoch = epoch;
    return 0;
}

/* The tokens of sample number s: T+1 of them; its shard in *shard. */
static const uint16_t *sample_tokens(const tr__dataset_t *ds, uint64_t s, const shard_t **shard)
{
    size_t lo = 0, hi = ds->n_shards - 1;
    while (lo < hi) { /* the last shard whose first sample <= s */
        size_t mid = (lo + hi + 1) / 2;
        if (ds->first_sample[mid] <= s)
            lo = mid;
        else
            hi = mid - 1;
    }
    *shard = &ds->shards[lo];
    return ds->shards[lo].tokens + (s - ds->first_sample[lo]) * (uint64_t)ds->T;
}

static int next_from_shards(tr__dataset_t *ds, int *tokens, int *targets, bool *wrapped, char *err,
                            size_t errlen)
{
    uint64_t per_epoch = tr__dataset_samples_per_epoch(ds);
    for (int b = 0; b < ds->B; b++) {
        if (ds->pos.cursor >= per_epoch) {
            ds->pos.epoch++;
            ds->pos.cursor = 0;
            *wrapped = true;
        }
        if (ds->shuffle && make_perm(ds, ds->pos.epoch) < 0)
            return tr__errf(err, errlen, TR_ENOMEM,
                            "token shards: no memory for the shuffled order of %llu samples (%llu "
                            "bytes)",
                            (unsigned long long)ds->n_samples,
                            (unsigned long long)ds->n_samples * sizeof(uint32_t));
        uint64_t k = ds->pos.cursor++ * (uint64_t)ds->world + (uint64_t)ds->rank;
        const shard_t *sh;
        const uint16_t *w = sample_tokens(ds, ds->shuffle ? ds->perm[k] : k, &sh);
        for (int t = 0; t < ds->T; t++) {
            tokens[b * ds->T + t] = w[t];
            targets[b * ds->T + t] = w[t + 1];
        }
        if (ds->vocab)
            for (int t = 0; t <= ds->T; t++)
                if (w[t] >= ds->vocab)
                    return tr__errf(
                        err, errlen, TR_EINVAL,
                        "%s: token %zu is %u, outside the model's vocabulary of %d (the "
                        "file changed after it was opened and checked)",
                        sh->path, (size_t)(w + t - sh->tokens), w[t], ds->vocab);
    }
    return 0;
}

int tr__dataset_next(tr__dataset_t *ds, int *tokens, float *x, int *targets, float *y,
                     bool *wrapped, char *err, size_t errlen)
{
    *wrapped = false;
    int rc;
    if (ds->cb) {
        /* rank r of W asks for batches r, W + r, 2W + r, ...: the ranks' micro-batches of one
         * step are the micro-batches of a one-process run with W times the accumulation */
        uint64_t index = ds->pos.batch_index * (uint64_t)ds->world + (uint64_t)ds->rank;
        rc = ds->cb(ds->user, index, ds->B, ds->T, tokens, x, targets, y);
        if (rc < 0)
            return tr__errf(err, errlen, rc, "dataset callback: batch %llu: %s",
                            (unsigned long long)index, tr_strerror(rc));
    } else {
        rc = next_from_shards(ds, tokens, targets, wrapped, err, errlen);
        if (rc < 0) return rc;
    }
    ds->pos.batch_index++;
    return 0;
}

tr__data_pos_t tr__dataset_pos(const tr__dataset_t *ds)
{
    return ds->pos;
}

int tr__dataset_seek(tr__dataset_t *ds, tr__data_pos_t pos)
{
    if (!ds->cb && pos.cursor > tr__dataset_samples_per_epoch(ds)) return TR_ERANGE;
    ds->pos = pos;
    return 0;
}
