/* ckpt_file: crash-safe checkpoint files and the `latest` pointer.
 *
 * A checkpoint file is: magic "TRCKPT\0\1" | u32 header length | u32 0 | u64 payload length |
 * header (msgpack, the caller's) | zero padding to a 64-byte boundary | payload | u32 CRC-32C
 * of everything before it | "TEND". All integers little-endian. The payload is 64-byte
 * aligned in the file so it can be read straight into aligned buffers.
 *
 * Writing goes to "<path>.tmp.<pid>", is fsynced, renamed over <path>, and the directory is
 * fsynced: a crash at any instant leaves either the old file or the new one, never a torn
 * one. `latest` (a file holding a tag) is written the same way, and callers write it last.
 *
 * For crash tests, the environment variable TR_CKPT_CRASH_AFTER=N makes the process exit
 * with status 86 right after the N-th file of the process has been renamed into place.
 */
#ifndef TR_IO_CKPT_FILE_H
#define TR_IO_CKPT_FILE_H

#include <stddef.h>
#include <stdint.h>

#define TR_CKPT_CRASH_EXIT 86

typedef struct tr_ckpt_blob {
    const void *data;
    size_t len;
} tr_ckpt_blob_t;

/* Writes header and the blobs (concatenated as the payload) to path, atomically. On error
 * the previous file at path, if any, is untouched and err says what failed on which path.
 * Any thread. */
int tr__ckpt_file_write(const char *path, const void *header, size_t header_len,
                        const tr_ckpt_blob_t *blobs, size_t n_blobs, char *err, size_t errlen);

/* A checkpoint file assembled in memory, so a save can copy the state once (a snapshot)
 * and write it later, off the training path. mem is 4096-byte aligned and kept between
 * saves (cap); zero-initialise, free with tr__ckpt_image_free. */
typedef struct tr_ckpt_image {
    unsigned char *mem;
    size_t cap, len;   /* allocated; the file's bytes */
    size_t payload_at; /* where the payload starts */
} tr_ckpt_image_t;

/* Lays out a file of header and payload_len payload bytes in im (growing it): fill the
 * payload at tr__ckpt_image_payload, then tr__ckpt_image_end computes the CRC and trailer.
 * TR_ENOMEM or TR_EINVAL with err. Any thread. */
int tr__ckpt_image_begin(tr_ckpt_image_t *im, const void *header, size_t header_len,
                         size_t payload_len, char *err, size_t errlen);
static inline unsigned char *tr__ckpt_image_payload(tr_ckpt_image_t *im)
{
    return im->mem + im->payload_at;
}
void tr__ckpt_image_end(tr_ckpt_image_t *im);
void tr__ckpt_image_free(tr_ckpt_image_t *im);

/* Writes the image to path as tr__ckpt_file_write does (a temporary name, fsync, rename,
 * directory fsync): through aio when given (its aligned part with O_DIRECT where the file
 * system allows, the short rest with pwrite), else with pwrite. Any thread. */
struct tr_aio;
int tr__ckpt_image_write(const tr_ckpt_image_t *im, struct tr_aio *aio, const char *path, char *err,
                         size_t errlen);

/* A file read back and verified: magic, lengths, trailer and CRC. */
typedef struct tr_ckpt_file {
    void *mem; /* the whole file; header and payload point into it */
    const void *header;
    size_t header_len;
    const void *payload; /* 64-byte aligned */
    size_t payload_len;
} tr_ckpt_file_t;

/* Reads and verifies path. TR_EFORMAT (bad magic, a corrupted header: lengths that do not
 * fit a file whose end marker is in place, or a truncated file), TR_ECHECKSUM, or an
 * errno code; err names the file and the field. Free with tr__ckpt_file_free. Any thread. */
int tr__ckpt_file_read(const char *path, tr_ckpt_file_t *out, char *err, size_t errlen);
void tr__ckpt_file_free(tr_ckpt_file_t *f);

/* Reads only path's header: magic and lengths are checked against the file's size, the CRC
 * is not (it covers the payload, which is not read). out->payload is NULL and payload_len the
 * payload's length. For a reader that needs a file's header to decide whether it needs the
 * file (a checkpoint's optimizer partitions); read it with tr__ckpt_file_read before using
 * the payload. Free with tr__ckpt_file_free. Any thread. */
int tr__ckpt_file_read_header(const char *path, tr_ckpt_file_t *out, char *err, size_t errlen);

/* Removes the "<file>.tmp.<pid>" files that a writer killed during a save left in dir and in
 * its immediate subfolders (the tags), when no process <pid> is alive (one that is may still
 * be writing; a pid from another host sharing the folder is taken for this host's). Returns
 * how many were removed, their bytes in *bytes (may be NULL), or an errno code when dir
 * cannot be read (a missing dir: 0). Any thread; run it before this process's own writes. */
int tr__ckpt_clean_tmp(const char *dir, uint64_t *bytes);

/* Writes <dir>/latest holding tag, atomically. Any thread. */
int tr__ckpt_latest_write(const char *dir, const char *tag, char *err, size_t errlen);

/* Reads <dir>/latest into tag (cap bytes). TR_ENOENT when there is none; TR_EFORMAT for an
 * empty or oversized tag or one that is not a plain directory name. Any thread. */
int tr__ckpt_latest_read(const char *dir, char *tag, size_t cap, char *err, size_t errlen);

#endif
