/* ckpt_file.c: checkpoint files written atomically and read back verified (see the header
 * for the layout and the crash-safety argument). */
#include "io/ckpt_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/file.h"
#include "troupe/aio.h"
#include "troupe/error.h"
#include "base/errf.h"

#define MAGIC       "TRCKPT\0\1"
#define END_MAGIC   "TEND"
#define FIXED       24 /* magic, header length, reserved, payload length */
#define ALIGN       64
#define IMAGE_ALIGN 4096 /* an image's memory: O_DIRECT's alignment on any file system here */

static size_t padded(size_t header_len)
{
    return (FIXED + header_len + ALIGN - 1) / ALIGN * ALIGN;
}

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const unsigned char *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static int fsync_dir_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy) return TR_ENOMEM;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    free(copy);
    if (fd < 0) return -errno;
    int rc = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return rc;
}

/* Renames tmp over path and syncs the directory, or removes tmp: the last step of every
 * write, whether rc (the writing so far) succeeded or not. */
static int commit(const char *tmp, const char *path, int rc, char *err, size_t errlen)
{
    if (!rc && rename(tmp, path) < 0) rc = -errno;
    if (!rc) rc = fsync_dir_of(path);
    if (rc) {
        unlink(tmp);
        return tr__errf(err, errlen, rc, "%s: write failed: %s", path, tr_strerror(rc));
    }
    return 0;
}

static void maybe_crash(void)
{
    static int renamed;
    const char *after = getenv("TR_CKPT_CRASH_AFTER");
    if (after && ++renamed >= atoi(after)) {
        fprintf(stderr, "troupe: TR_CKPT_CRASH_AFTER=%s: exiting after %d checkpoint file(s)\n",
                after, renamed);
        _exit(TR_CKPT_CRASH_EXIT);
    }
}

/* --- images ----------------------------------------------------------------------------- */

int tr__ckpt_image_begin(tr_ckpt_image_t *im, const void *header, size_t header_len,
                         size_t payload_len, char *err, size_t errlen)
{
    if (header_len > UINT32_MAX)
        return tr__errf(err, errlen, TR_EINVAL, "a checkpoint header of %zu bytes is too large",
                        header_len);
    size_t at = padded(header_len), len = at + payload_len + 8;
    if (len > im->cap) {
        size_t cap = (len + IMAGE_ALIGN - 1) / IMAGE_ALIGN * IMAGE_ALIGN;
        void *mem = NULL;
        if (posix_memalign(&mem, IMAGE_ALIGN, cap))
            return tr__errf(err, errlen, TR_ENOMEM,
                            "no memory for a checkpoint file's copy "
                            "(%zu bytes)",
                            len);
        free(im->mem);
        im->mem = mem;
        im->cap = cap;
    }
    im->len = len;
    im->payload_at = at;
    memset(im->mem, 0, at);
    memcpy(im->mem, MAGIC, 8);
    put32(im->mem + 8, (uint32_t)header_len);
    put64(im->mem + 16, payload_len);
    memcpy(im->mem + FIXED, header, header_len);
    return 0;
}

void tr__ckpt_image_end(tr_ckpt_image_t *im)
{
    size_t body = im->len - 8;
    put32(im->mem + body, tr__crc32c(0, im->mem, body));
    memcpy(im->mem + body + 4, END_MAGIC, 4);
}

void tr__ckpt_image_free(tr_ckpt_image_t *im)
{
    free(im->mem);
    *im = (tr_ckpt_image_t){0};
}

static int pwrite_all(int fd, const unsigned char *p, size_t len, off_t at)
{
    while (len) {
        ssize_t n = pwrite(fd, p, len, at);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -errno;
        p += n;
        len -= (size_t)n;
        at += n;
    }
    return 0;
}

/* The image's bytes into fd (the temporary file, opened plainly): with aio, the part that
 * divides into intra_op_parallelism aligned slices through the engine (O_DIRECT where the
 * file system allows), the short rest with pwrite; then fsync. */
static int write_image(const tr_ckpt_image_t *im, tr_aio_t *aio, int fd, const char *tmp, char *err,
                       size_t errlen)
{
    size_t direct = 0;
    int rc = 0;
    if (aio) {
        tr_aio_file_t *f;
        rc = tr_aio_open(aio, tmp, TR_AIO_WRITE, &f, err, errlen);
        if (rc < 0) return rc;
        size_t unit = tr_aio_file_alignment(f) * (size_t)tr_aio_parallelism(aio);
        direct = im->len / unit * unit;
        if (direct) rc = tr_aio_pwrite_sync(aio, f, im->mem, direct, 0, err, errlen);
        tr_aio_close(f);
        if (rc < 0) return rc;
    }
    rc = pwrite_all(fd, im->mem + direct, im->len - direct, (off_t)direct);
    if (!rc && fsync(fd) < 0) rc = -errno;
    return rc < 0 ? tr__errf(err, errlen, rc, "%s: write failed: %s", tmp, tr_strerror(rc)) : 0;
}

int tr__ckpt_image_write(const tr_ckpt_image_t *im, tr_aio_t *aio, const char *path, char *err,
                         size_t errlen)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp))
        return tr__errf(err, errlen, TR_EINVAL, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return tr__errf(err, errlen, -errno, "%s: cannot create: %s", tmp, strerror(errno));
    int rc = write_image(im, aio, fd, tmp, err, errlen);
    if (close(fd) < 0 && !rc)
        rc = tr__errf(err, errlen, -errno, "%s: close: %s", tmp, strerror(errno));
    if (rc < 0) {
        unlink(tmp);
        return rc;
    }
    if ((rc = commit(tmp, path, rc, err, errlen)) == 0) maybe_crash();
    return rc;
}

int tr__ckpt_file_write(const char *path, const void *header, size_t header_len,
                        const tr_ckpt_blob_t *blobs, size_t n_blobs, char *err, size_t errlen)
{
    tr_ckpt_image_t im = {0};
    size_t payload = 0;
    for (size_t i = 0; i < n_blobs; i++)
        payload += blobs[i].len;
    int rc = tr__ckpt_image_begin(&im, header, header_len, payload, err, errlen);
    if (rc < 0) return rc;
    unsigned char *p = tr__ckpt_image_payload(&im);
    for (size_t i = 0; i < n_blobs; i++) {
        if (blobs[i].len) memcpy(p, blobs[i].data, blobs[i].len);
        p += blobs[i].len;
    }
    tr__ckpt_image_end(&im);
    rc = tr__ckpt_image_write(&im, NULL, path, err, errlen);
    tr__ckpt_image_free(&im);
    return rc;
}

/* The lengths the fixed part gives (header_len, payload) against the file's len bytes: 0, or
 * TR_EFORMAT with err. `whole`: the file ends with its end marker, so it was not cut short and
 * lengths that do not fit it are a corrupted header (naming the length that is impossible);
 * without the marker the file is taken for truncated. */
static int check_lengths(const char *path, uint64_t header_len, uint64_t payload, uint64_t len,
                         bool whole, char *err, size_t errlen)
{
    if (header_len <= len && payload <= len && padded(header_len) + payload + 8 == len) return 0;
    if (!whole)
        return tr__errf(err, errlen, TR_EFORMAT,
                        "%s: length: header %llu + payload %llu bytes do not match the file's %llu "
                        "bytes (truncated?)",
                        path, (unsigned long long)header_len, (unsigned long long)payload,
                        (unsigned long long)len);
    if (header_len > len || payload > len)
        return tr__errf(err, errlen, TR_EFORMAT,
                        "%s: corrupted header: %s length %llu bytes is more than the whole "
                        "file's %llu (its end marker is in place: not truncated)",
                        path, header_len > len ? "header" : "payload",
                        (unsigned long long)(header_len > len ? header_len : payload),
                        (unsigned long long)len);
    return tr__errf(err, errlen, TR_EFORMAT,
                    "%s: corrupted header: header length %llu + payload length %llu bytes do not "
                    "add up to the file's %llu (its end marker is in place: not truncated)",
                    path, (unsigned long long)header_len, (unsigned long long)payload,
                    (unsigned long long)len);
}

static int verify(const char *path, unsigned char *m, size_t len, tr_ckpt_file_t *out, char *err,
                  size_t errlen)
{
    if (len < FIXED + 8 || memcmp(m, MAGIC, 8) != 0)
        return tr__errf(err, errlen, TR_EFORMAT, "%s: magic: not a troupe checkpoint file", path);
    uint64_t header_len = get32(m + 8), payload = get64(m + 16);
    int rc = check_lengths(path, header_len, payload, len, !memcmp(m + len - 4, END_MAGIC, 4), err,
                           errlen);
    if (rc) return rc;
    if (memcmp(m + len - 4, END_MAGIC, 4) != 0)
        return tr__errf(err, errlen, TR_EFORMAT, "%s: trailer: end marker missing (truncated?)",
                        path);
    uint32_t want = get32(m + len - 8), got = tr__crc32c(0, m, len - 8);
    if (want != got)
        return tr__errf(err, errlen, TR_ECHECKSUM,
                        "%s: checksum: CRC-32C is %08x, the file says %08x (corrupted)", path, got,
                        want);
    out->mem = m;
    out->header = m + FIXED;
    out->header_len = header_len;
    out->payload = m + padded(header_len);
    out->payload_len = payload;
    return 0;
}

int tr__ckpt_file_read(const char *path, tr_ckpt_file_t *out, char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    memset(out, 0, sizeof(*out));
    int rc = tr__file_read(path, 0, "a troupe checkpoint file", &text, &len, err, errlen);
    if (rc == TR_EISDIR) rc = TR_EFORMAT; /* a directory is a malformed checkpoint, as before */
    if (rc) return rc;
    /* 64-byte aligned, so the payload at padded(header_len) is too */
    rc = verify(path, (unsigned char *)text, len, out, err, errlen);
    if (rc) free(text);
    return rc;
}

void tr__ckpt_file_free(tr_ckpt_file_t *f)
{
    if (f) {
        free(f->mem);
        memset(f, 0, sizeof(*f));
    }
}

static int read_at(int fd, void *buf, size_t len, off_t at)
{
    for (size_t got = 0; got < len;) {
        ssize_t n = pread(fd, (char *)buf + got, len - got, at + (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return n < 0 ? -errno : TR_EFORMAT;
        got += (size_t)n;
    }
    return 0;
}

int tr__ckpt_file_read_header(const char *path, tr_ckpt_file_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tr__errf(err, errlen, -errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    unsigned char fixed[FIXED];
    int rc = fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ? TR_EFORMAT
             : (size_t)st.st_size < FIXED + 8           ? TR_EFORMAT
                                                        : read_at(fd, fixed, FIXED, 0);
    if (rc == 0 && memcmp(fixed, MAGIC, 8) != 0) rc = TR_EFORMAT;
    if (rc < 0) {
        close(fd);
        return rc == TR_EFORMAT
                   ? tr__errf(err, errlen, rc, "%s: magic: not a troupe checkpoint file", path)
                   : tr__errf(err, errlen, rc, "%s: read failed: %s", path, tr_strerror(rc));
    }
    uint64_t header_len = get32(fixed + 8), payload = get64(fixed + 16), len = (uint64_t)st.st_size;
    unsigned char end[4] = {0};
    bool whole = read_at(fd, end, 4, (off_t)(len - 4)) == 0 && !memcmp(end, END_MAGIC, 4);
    if ((rc = check_lengths(path, header_len, payload, len, whole, err, errlen))) {
        close(fd);
        return rc;
    }
    unsigned char *m = malloc(header_len ? header_len : 1);
    rc = m ? read_at(fd, m, header_len, FIXED) : TR_ENOMEM;
    close(fd);
    if (rc < 0) {
        free(m);
        return tr__errf(err, errlen, rc, "%s: header: %s", path, tr_strerror(rc));
    }
    *out =
        (tr_ckpt_file_t){.mem = m, .header = m, .header_len = header_len, .payload_len = payload};
    return 0;
}

/* --- stale temporary files -------------------------------------------------------------- */

/* The pid of a name this file's writers give their temporary files ("<x>.trck.tmp.<pid>",
 * "latest.tmp.<pid>"), or 0 for any other name. */
static pid_t tmp_pid(const char *name)
{
    const char *t = strstr(name, ".tmp.");
    if (!t) return 0;
    size_t stem = (size_t)(t - name);
    int ours =
        (stem == 6 && !strncmp(name, "latest", 6)) || (stem > 5 && !strncmp(t - 5, ".trck", 5));
    const char *d = t + 5;
    if (!ours || !*d || strlen(d) > 9) return 0;
    for (const char *c = d; *c; c++)
        if (*c < '0' || *c > '9') return 0;
    return (pid_t)atoi(d);
}

static int pid_alive(pid_t pid)
{
    return kill(pid, 0) == 0 || errno == EPERM;
}

/* Removes the stale tmp files directly in path; with depth 1 also in its subfolders. */
static int clean_dir(const char *path, int depth, uint64_t *bytes)
{
    DIR *d = opendir(path);
    if (!d) return errno == ENOENT ? 0 : -errno;
    int removed = 0;
    char p[4200];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (tr__path_join(p, sizeof(p), path, e->d_name)) continue;
        struct stat st;
        if (lstat(p, &st) < 0) continue;
        pid_t pid = S_ISREG(st.st_mode) ? tmp_pid(e->d_name) : 0;
        if (S_ISDIR(st.st_mode) && depth > 0) {
            int n = clean_dir(p, depth - 1, bytes);
            removed += n > 0 ? n : 0;
        } else if (pid > 0 && !pid_alive(pid) && unlink(p) == 0) {
            removed++;
            *bytes += (uint64_t)st.st_size;
        }
    }
    closedir(d);
    return removed;
}

int tr__ckpt_clean_tmp(const char *dir, uint64_t *bytes)
{
    uint64_t ignored = 0;
    if (!bytes) bytes = &ignored;
    *bytes = 0;
    return clean_dir(dir, 1, bytes);
}

int tr__ckpt_latest_write(const char *dir, const char *tag, char *err, size_t errlen)
{
    char path[4096];
    if (tr__path_join(path, sizeof(path), dir, "latest"))
        return tr__errf(err, errlen, TR_EINVAL, "%s: path too long", dir);
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return tr__errf(err, errlen, -errno, "%s: cannot create: %s", tmp, strerror(errno));
    int ok = fputs(tag, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int rc = ok ? 0 : -errno;
    if (fclose(f) != 0 && !rc) rc = -errno;
    return commit(tmp, path, rc, err, errlen);
}

int tr__ckpt_latest_read(const char *dir, char *tag, size_t cap, char *err, size_t errlen)
{
    char path[4096];
    if (tr__path_join(path, sizeof(path), dir, "latest"))
        return tr__errf(err, errlen, TR_EINVAL, "%s: path too long", dir);
    FILE *f = fopen(path, "r");
    if (!f) return tr__errf(err, errlen, -errno, "%s: %s", path, strerror(errno));
    size_t n = fread(tag, 1, cap, f);
    fclose(f);
    while (n && (tag[n - 1] == '\n' || tag[n - 1] == ' '))
        n--;
    if (n == 0 || n >= cap)
        return tr__errf(err, errlen, TR_EFORMAT, "%s: expected a tag of 1 to %zu bytes", path,
                        cap - 1);
    tag[n] = '\0';
    if (strchr(tag, '/') || !strcmp(tag, ".") || !strcmp(tag, ".."))
        return tr__errf(err, errlen, TR_EFORMAT, "%s: tag '%s' is not a directory name", path, tag);
    return 0;
}
