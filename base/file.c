/* file.c: whole-file reads, path joins and `mkdir -p` (file.h). */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/errf.h"
#include "troupe/error.h"

#define READ_ALIGN 64

/* A buffer of 64-byte alignment for cap bytes of content and the spare bytes after them, with
 * the first n bytes of old copied in; old is freed. NULL when out of memory (old freed too). */
static char *grow(char *old, size_t n, size_t cap)
{
    size_t bytes = (cap + TR__FILE_SPARE + READ_ALIGN - 1) / READ_ALIGN * READ_ALIGN;
    char *b = aligned_alloc(READ_ALIGN, bytes);
    if (b && n) memcpy(b, old, n);
    free(old);
    return b;
}

/* "16 MiB" or "1000 bytes", for the message about a file over the limit. */
static void size_text(char *out, size_t cap, size_t bytes)
{
    if (bytes && bytes % (1u << 20) == 0)
        snprintf(out, cap, "%zu MiB", bytes >> 20);
    else
        snprintf(out, cap, "%zu bytes", bytes);
}

/* Reads fd to its end into *out; 0, or -errno with *got the bytes read before the failure.
 * Stops once more than limit bytes are in (the caller checks). */
static int read_all(int fd, size_t cap, size_t limit, char **out, size_t *got)
{
    char *b = grow(NULL, 0, cap);
    size_t n = 0;
    while (b) {
        if (n == cap) {
            if (n > limit) break;
            cap *= 2;
            if (!(b = grow(b, n, cap))) break;
        }
        ssize_t r = read(fd, b + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(b);
            *got = n;
            return -e;
        }
        if (r == 0 || (n += (size_t)r) > limit) break;
    }
    *out = b;
    *got = n;
    return b ? 0 : TR_ENOMEM;
}

int tr__file_read(const char *path, size_t max, const char *what, char **out, size_t *len,
                  char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return tr__errf(err, errlen, -e, "%s: cannot open: %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return tr__errf(err, errlen, TR_EISDIR, "%s: is a directory, expected %s", path, what);
    }
    size_t limit = max ? max : SIZE_MAX / 4;
    char limit_text[32];
    size_text(limit_text, sizeof(limit_text), limit);
    if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > limit) {
        close(fd);
        return tr__errf(err, errlen, TR_EFORMAT, "%s: larger than %s, expected %s", path,
                        limit_text, what);
    }
    /* one byte over the size, so that the read that finds the end needs no second buffer */
    size_t cap = (size_t)1 << 16;
    if (S_ISREG(st.st_mode) && st.st_size > 0) cap = (size_t)st.st_size + 1;
    char *b = NULL;
    size_t n = 0;
    int rc = read_all(fd, cap, limit, &b, &n);
    close(fd);
    if (rc == TR_ENOMEM) return tr__errf(err, errlen, rc, "%s: no memory for %zu bytes", path, n);
    if (rc)
        return tr__errf(err, errlen, rc, "%s: read failed at byte %zu: %s", path, n, strerror(-rc));
    if (n > limit) {
        free(b);
        return tr__errf(err, errlen, TR_EFORMAT, "%s: larger than %s, expected %s", path,
                        limit_text, what);
    }
    b[n] = '\0';
    *out = b;
    *len = n;
    return 0;
}

int tr__path_join(char *out, size_t cap, const char *dir, const char *name)
{
    size_t d = dir ? strlen(dir) : 0;
    const char *slash = d && dir[d - 1] != '/' ? "/" : "";
    int n = snprintf(out, cap, "%s%s%s", d ? dir : "", slash, name);
    if (n < 0 || (size_t)n >= cap) {
        if (cap) out[0] = '\0';
        return TR_EINVAL;
    }
    return 0;
}

int tr__mkdir_p(const char *path)
{
    char tmp[4096];
    if (!*path || snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp)) return TR_EINVAL;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0777) && errno != EEXIST) return -errno;
        *p = '/';
    }
    if (mkdir(tmp, 0777) && errno != EEXIST) return -errno;
    struct stat st; /* EEXIST also for a file of that name */
    return stat(tmp, &st) == 0 && !S_ISDIR(st.st_mode) ? -ENOTDIR : 0;
}
