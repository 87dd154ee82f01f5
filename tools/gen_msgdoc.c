/* gen_msgdoc: prints docs/messages.md, the reference page of Troupe's messages, from the
 * message table (troupe/msg_types.def, through tr_msg_desc) and the codec's wire layout.
 *
 *   gen_msgdoc                 write the page to stdout
 *   gen_msgdoc --check FILE    exit 1 (saying how to regenerate) when FILE differs from it
 *
 * Built with the tools, never installed; the test test_msgdoc runs the --check form against
 * the committed page, so the page cannot go stale. Exit status: 0 same or written, 1
 * different, 2 bad usage or I/O error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <troupe.h>

static const char *kind_name(tr_field_kind_t k)
{
    static const char *const names[TR_FIELD_KIND_COUNT_] = {
        [TR_FIELD_BOOL] = "bool",       [TR_FIELD_I32] = "i32",
        [TR_FIELD_U32] = "u32",         [TR_FIELD_I64] = "i64",
        [TR_FIELD_U64] = "u64",         [TR_FIELD_F32] = "f32",
        [TR_FIELD_F64] = "f64",         [TR_FIELD_STR] = "str",
        [TR_FIELD_ACTOR] = "actor",     [TR_FIELD_TENSOR] = "tensor",
        [TR_FIELD_BYTES] = "bytes",     [TR_FIELD_ARRAY_I32] = "i32[]",
        [TR_FIELD_ARRAY_U32] = "u32[]", [TR_FIELD_ARRAY_I64] = "i64[]",
        [TR_FIELD_ARRAY_U64] = "u64[]", [TR_FIELD_ARRAY_F32] = "f32[]",
        [TR_FIELD_ARRAY_F64] = "f64[]"};
    return k < TR_FIELD_KIND_COUNT_ ? names[k] : "?";
}

static const char *wire_kind(tr_field_kind_t k)
{
    static const char *const wire[TR_FIELD_KIND_COUNT_] = {
        [TR_FIELD_BOOL] = "bool",
        [TR_FIELD_I32] = "int in [-2^31, 2^31)",
        [TR_FIELD_U32] = "uint < 2^32",
        [TR_FIELD_I64] = "int",
        [TR_FIELD_U64] = "uint",
        [TR_FIELD_F32] = "float 32 (float 64 accepted when in range)",
        [TR_FIELD_F64] = "float 64 (float 32 accepted)",
        [TR_FIELD_STR] = "str, shorter than the capacity, no NUL byte",
        [TR_FIELD_ACTOR] = "uint, the actor's id",
        [TR_FIELD_TENSOR] = "ext " /* number appended */,
        [TR_FIELD_BYTES] = "bin, at most the capacity",
        [TR_FIELD_ARRAY_I32] = "array of exactly the declared count of i32 values",
        [TR_FIELD_ARRAY_U32] = "array of exactly the declared count of u32 values",
        [TR_FIELD_ARRAY_I64] = "array of exactly the declared count of i64 values",
        [TR_FIELD_ARRAY_U64] = "array of exactly the declared count of u64 values",
        [TR_FIELD_ARRAY_F32] = "array of exactly the declared count of f32 values",
        [TR_FIELD_ARRAY_F64] = "array of exactly the declared count of f64 values"};
    return k < TR_FIELD_KIND_COUNT_ ? wire[k] : "?";
}

static void print_layout(FILE *f)
{
    fprintf(f,
            "## Wire layout (format %d)\n\n"
            "A message is a stream of consecutive msgpack objects (no enclosing container), so "
            "a decoder\nreads one value at a time and can name the exact field where a payload "
            "is truncated or wrong:\n\n"
            "| # | object | msgpack | meaning |\n| --- | --- | --- | --- |\n"
            "| 1 | `version` | uint | wire format, %d |\n"
            "| 2 | `type` | uint | message type id (below; application types from %d) |\n"
            "| 3 | `flags` | uint < 2^32 | envelope: `TR_MSG_F_*` |\n"
            "| 4 | `sender` | uint | envelope: sending actor's id, 0 for none |\n"
            "| 5 | `receiver` | uint | envelope: receiving actor's id |\n"
            "| 6 | `seq` | uint | envelope: per-sender sequence number |\n"
            "| 7 | `step` | uint | envelope: training step |\n"
            "| 8 | `micro_step` | uint < 2^32 | envelope: micro-step |\n"
            "| 9 | `flow_id` | uint | envelope: trace flow id |\n"
            "| 10 | `send_ns` | uint | envelope: monotonic send time |\n"
            "| 11 | `n_fields` | uint | number of body fields that follow |\n"
            "| 12.. | `name`, `value` | str, per kind | each body field: its name, then its "
            "value |\n\n",
            TR_MSG_WIRE_VERSION, TR_MSG_WIRE_VERSION, TR_MSG_USER);
    fprintf(f, "Values by field kind:\n\n| kind | msgpack |\n| --- | --- |\n");
    for (int k = 0; k < TR_FIELD_KIND_COUNT_; k++) {
        fprintf(f, "| %s | %s", kind_name(k), wire_kind(k));
        if (k == TR_FIELD_TENSOR)
            fprintf(f,
                    "%d; its payload is one msgpack array `[buffer_id, offset, length, "
                    "dtype, device_type, device_index, [shape...]]`: uints, except device_index "
                    "(int16, -1 "
                    "for none) and the shape's dimensions (int64 >= 0); dtype a `tr_dtype_t`, "
                    "device_type a `tr_device_type_t` (troupe/msg.h) |\n",
                    TR_MSGPACK_EXT_TENSOR);
        else
            fprintf(f, " |\n");
    }
    fprintf(f,
            "\nEncoders write every field in table order; decoders accept any order. A "
            "decoder rejects, with\n`TR_EDECODE` and one log line naming the type and the "
            "field: a message over %u bytes,\nnesting deeper than %d levels, a truncated "
            "value, an unknown format version or type, an unknown,\nrepeated or missing field, "
            "a value of the wrong kind or out of range, a string as long as its\ncapacity, "
            "a tensor reference with dtype >= %d, device_type >= %d, device_index < -1, more "
            "than %d\ndimensions, a negative dimension or offset + length overflowing 64 bits, "
            "an array or map claiming\nmore elements than bytes remain, and trailing "
            "bytes.\n\n",
            TR_MSG_MAX_ENCODED, TR_MSG_MAX_DEPTH, TR_DTYPE_COUNT_, TR_DEVICE_COUNT_,
            TR_TENSOR_MAX_DIMS);
}

static void print_type(FILE *f, const tr_msg_desc_t *d)
{
    fprintf(f, "### `%s` (%u)\n\n%s\n\n", d->name, d->type, d->doc ? d->doc : "");
    fprintf(f, "Body: %u bytes, `tr_msg_%s_t`.\n\n| field | kind | doc |\n| --- | --- | --- |\n",
            d->body_size, d->name);
    for (uint32_t i = 0; i < d->n_fields; i++) {
        const tr_field_desc_t *fd = &d->fields[i];
        if (fd->kind == TR_FIELD_STR)
            fprintf(f, "| `%s` | str[%u] | %s |\n", fd->name, fd->size, fd->doc ? fd->doc : "");
        else
            fprintf(f, "| `%s` | %s | %s |\n", fd->name, kind_name(fd->kind),
                    fd->doc ? fd->doc : "");
    }
    fprintf(f, "\n");
}

static void print_page(FILE *f)
{
    fprintf(f, "# Messages\n\n"
               "<!-- Generated by tools/gen_msgdoc from include/troupe/msg_types.def; do not "
               "edit.\n     Regenerate: build/tools/gen_msgdoc > docs/messages.md -->\n\n"
               "Every built-in message type, its fields, and the msgpack form in which "
               "messages cross a process\nboundary or are stored (`tr_msg_encode`, "
               "`tr_msg_decode`). Between actors of one process a body\ntravels as its C "
               "struct and is never encoded.\n\n");
    print_layout(f);
    fprintf(f, "## Types\n\n| id | name |\n| --- | --- |\n");
    for (uint32_t t = 1; t < TR_MSG_BUILTIN_COUNT_; t++)
        fprintf(f, "| %u | `%s` |\n", t, tr_msg_type_name(t));
    fprintf(f, "\n");
    for (uint32_t t = 1; t < TR_MSG_BUILTIN_COUNT_; t++)
        print_type(f, tr_msg_desc(t));
}

/* 0 when path holds exactly text, 1 when it differs, 2 when it cannot be read. */
static int check(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 2;
    }
    char *old = malloc(len + 2);
    size_t n = old ? fread(old, 1, len + 1, f) : 0;
    fclose(f);
    int same = old && n == len && !memcmp(old, text, len);
    free(old);
    if (!same)
        fprintf(stderr, "gen_msgdoc: %s is stale; regenerate it: gen_msgdoc > %s\n", path, path);
    return same ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 1) {
        print_page(stdout);
        return ferror(stdout) ? 2 : 0;
    }
    if (argc != 3 || strcmp(argv[1], "--check")) {
        fprintf(stderr, "usage: gen_msgdoc [--check FILE]\n");
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return 2;
    print_page(mem);
    fclose(mem);
    int rc = check(argv[2], text, len);
    free(text);
    return rc;
}
