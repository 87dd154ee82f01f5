/* pack_text: packs text files into llm.c token shards of byte tokens (vocab 256), for the
 * byte-level GPT that `make demo` trains. The files are concatenated in the order given, each
 * followed by a blank line; the last VAL_PERCENT percent of the bytes become the val shard,
 * the rest the train shard.
 *
 *   pack_text TRAIN.bin VAL.bin VAL_PERCENT FILE...
 *
 * Exit 0, or 2 with a message naming the file that could not be read or written. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "troupe/io.h"

typedef struct text {
    uint16_t *tok;
    size_t n, cap;
} text_t;

static int append_byte(text_t *t, unsigned char c)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 1 << 16;
        uint16_t *p = realloc(t->tok, cap * sizeof(uint16_t));
        if (!p) return -1;
        t->tok = p;
        t->cap = cap;
    }
    t->tok[t->n++] = c;
    return 0;
}

static int append_file(text_t *t, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "pack_text: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int c, rc = 0;
    while (rc == 0 && (c = fgetc(f)) != EOF)
        rc = append_byte(t, (unsigned char)c);
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, "pack_text: %s: read error\n", path);
        rc = -1;
    }
    fclose(f);
    for (int i = 0; i < 2 && rc == 0; i++)
        rc = append_byte(t, '\n');
    return rc;
}

static int save(const char *path, const uint16_t *tok, size_t n)
{
    char why[512];
    if (tr_llmc_tokens_save(path, tok, n, why, sizeof(why)) < 0) {
        fprintf(stderr, "pack_text: %s\n", why);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    char *end;
    long pct = argc > 3 ? strtol(argv[3], &end, 10) : -1;
    if (argc < 5 || *end || pct < 1 || pct > 50) {
        fprintf(stderr, "usage: pack_text TRAIN.bin VAL.bin VAL_PERCENT(1-50) FILE...\n");
        return 2;
    }
    text_t t = {0};
    for (int i = 4; i < argc; i++)
        if (append_file(&t, argv[i]) < 0) return 2;
    size_t n_val = t.n * (size_t)pct / 100, n_train = t.n - n_val;
    if (save(argv[1], t.tok, n_train) < 0 || save(argv[2], t.tok + n_train, n_val) < 0) return 2;
    printf("pack_text: %d files, %zu bytes: %zu train tokens in %s, %zu val tokens in %s\n",
           argc - 4, t.n, n_train, argv[1], n_val, argv[2]);
    free(t.tok);
    return 0;
}
