/* aio_file.c: files opened for the aio engine (O_DIRECT, or pread/pwrite where the file
 * system refuses it), their alignment from statx, and page-aligned locked buffers. */
#include "io/aio_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "troupe/error.h"
#include "troupe/log.h"
#include "base/errf.h"

#define DEFAULT_ALIGN 4096

/* The file's O_DIRECT offset and memory alignment from statx, else DEFAULT_ALIGN for both. */
static void read_alignment(tr_aio_file_t *f)
{
    f->align = f->mem_align = DEFAULT_ALIGN;
#ifdef STATX_DIOALIGN
    struct statx st;
    if (statx(f->fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &st) == 0 &&
        (st.stx_mask & STATX_DIOALIGN) && st.stx_dio_offset_align) {
        f->align = st.stx_dio_offset_align;
        f->mem_align = st.stx_dio_mem_align ? st.stx_dio_mem_align : 1;
    }
#endif
}

static int open_flags(int flags)
{
    int rw = (flags & TR_AIO_READ) && (flags & TR_AIO_WRITE) ? O_RDWR
             : (flags & TR_AIO_WRITE)                        ? O_WRONLY
                                                             : O_RDONLY;
    return rw | O_CLOEXEC | ((flags & TR_AIO_CREATE) ? O_CREAT : 0);
}

/* Opens f->path with O_DIRECT, or without when the file system says EINVAL to it. */
static int open_direct_or_not(tr_aio_file_t *f, int oflags, char *why, size_t why_len)
{
    f->fd = open(f->path, oflags | O_DIRECT, 0600);
    f->direct = f->fd >= 0;
    if (f->fd < 0 && errno == EINVAL) {
        f->fd = open(f->path, oflags, 0600);
        if (f->fd >= 0) {
            char msg[512];
            snprintf(msg, sizeof msg,
                     "aio: the file system of '%s' refuses O_DIRECT: its files are read and "
                     "written with pread/pwrite on the I/O threads, through the page cache",
                     f->path);
            tr__aio_warn_once(f->aio, &f->aio->warned_direct, msg);
        }
    }
    if (f->fd < 0)
        return tr__errf(why, why_len, -errno, "cannot open '%s': %s", f->path, tr_strerror(-errno));
    return 0;
}

int tr_aio_open(tr_aio_t *aio, const char *path, int flags, tr_aio_file_t **out, char *why,
                size_t why_len)
{
    if (!(flags & (TR_AIO_READ | TR_AIO_WRITE)))
        return tr__errf(why, why_len, TR_EINVAL, "cannot open '%s': neither read nor write asked",
                        path);
    size_t n = strlen(path) + 1;
    tr_aio_file_t *f = calloc(1, sizeof *f + n);
    if (!f) return tr__errf(why, why_len, TR_ENOMEM, "cannot open '%s': no memory", path);
    memcpy(f->path, path, n);
    f->aio = aio;
    f->flags = flags;
    f->fd_buffered = -1;
    f->align = f->mem_align = 1;
    int oflags = open_flags(flags);
    int rc = open_direct_or_not(f, oflags, why, why_len);
    if (!rc && f->direct) {
        read_alignment(f);
        f->fd_buffered = open(path, oflags & ~O_CREAT);
        if (f->fd_buffered < 0)
            rc = tr__errf(why, why_len, -errno, "cannot open '%s' a second time: %s", path,
                          tr_strerror(-errno));
        else if (aio->o.block_size % f->align)
            rc = tr__errf(why, why_len, TR_EINVAL,
                          "aio.block_size %zu is not a multiple of the O_DIRECT alignment of "
                          "'%s' (%zu bytes)",
                          aio->o.block_size, path, f->align);
    }
    if (rc) {
        tr_aio_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

void tr_aio_close(tr_aio_file_t *f)
{
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    if (f->fd_buffered >= 0) close(f->fd_buffered);
    free(f);
}

int tr_aio_file_direct(const tr_aio_file_t *f)
{
    return f->direct;
}

size_t tr_aio_file_alignment(const tr_aio_file_t *f)
{
    return f->align;
}

static size_t page_round(size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (size + page - 1) / page * page;
}

int tr_aio_buffer_alloc(tr_aio_t *aio, size_t size, void **out)
{
    void *p = NULL;
    size_t bytes = page_round(size ? size : 1);
    if (posix_memalign(&p, (size_t)sysconf(_SC_PAGESIZE), bytes)) return TR_ENOMEM;
    if (mlock(p, bytes) != 0) {
        struct rlimit rl = {0, 0};
        getrlimit(RLIMIT_MEMLOCK, &rl);
        char msg[256];
        snprintf(msg, sizeof msg,
                 "aio: cannot lock %zu bytes of I/O buffer in memory (%s; RLIMIT_MEMLOCK is "
                 "%llu bytes): buffers stay unlocked and may be paged out",
                 bytes, tr_strerror(-errno), (unsigned long long)rl.rlim_cur);
        tr__aio_warn_once(aio, &aio->warned_mlock, msg);
    }
    *out = p;
    return 0;
}

void tr_aio_buffer_free(tr_aio_t *aio, void *p, size_t size)
{
    (void)aio;
    if (!p) return;
    munlock(p, page_round(size ? size : 1));
    free(p);
}
