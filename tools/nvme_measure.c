/* The measurement behind `troupe nvme-bench` and `troupe nvme-tune`: one file written then
 * read back through the aio engine, each pass timed on the monotonic clock. The read follows
 * the write with O_DIRECT, so it measures the device, not the page cache (unless the file
 * system refuses O_DIRECT; the engine then warns).
 */
#include "nvme_measure.h"
#include "commands.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "troupe/error.h"

/* One timed pass over the whole file: GB/s into *gbs. */
static int pass(tr_aio_t *aio, tr_aio_file_t *f, int write, void *buf, uint64_t n, double *gbs,
                char *why, size_t why_len)
{
    double t0 = tr__now_s();
    int rc = write ? tr_aio_pwrite_sync(aio, f, buf, (size_t)n, 0, why, why_len)
                   : tr_aio_pread_sync(aio, f, buf, (size_t)n, 0, why, why_len);
    double dt = tr__now_s() - t0;
    if (rc == 0) *gbs = (double)n / (dt > 0 ? dt : 1e-9) / 1e9;
    return rc;
}

/* Both passes through an open file. */
static int write_then_read(tr_aio_t *aio, tr_aio_file_t *f, uint64_t n, double *w, double *r,
                           char *why, size_t why_len)
{
    void *buf = NULL;
    int rc = tr_aio_buffer_alloc(aio, (size_t)n, &buf);
    if (rc) {
        snprintf(why, why_len, "no memory for a %llu-byte buffer", (unsigned long long)n);
        return rc;
    }
    memset(buf, 0x5a, (size_t)n);
    rc = pass(aio, f, 1, buf, n, w, why, why_len);
    if (rc == 0) rc = pass(aio, f, 0, buf, n, r, why, why_len);
    tr_aio_buffer_free(aio, buf, (size_t)n);
    return rc;
}

int tr__nvme_measure(const char *dir, uint64_t io_size, const tr_aio_options_t *o,
                     double *write_gbs, double *read_gbs, char *why, size_t why_len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/troupe_nvme_bench.%ld", dir, (long)getpid());
    tr_aio_t *aio = NULL;
    tr_aio_file_t *f = NULL;
    int rc = tr_aio_create(o, &aio, why, why_len);
    if (rc == 0)
        rc = tr_aio_open(aio, path, TR_AIO_READ | TR_AIO_WRITE | TR_AIO_CREATE, &f, why, why_len);
    if (rc == 0) rc = write_then_read(aio, f, io_size, write_gbs, read_gbs, why, why_len);
    tr_aio_close(f);
    unlink(path); /* ours (named by our pid), also when the open made it and then failed */
    tr_aio_destroy(aio);
    return rc;
}

int tr__nvme_bad_flag(const char *cmd, const char *flag, const char *value, const char *expected)
{
    fprintf(stderr, "troupe %s: %s: expected %s, got '%s'\n(troupe %s --help lists the flags)\n",
            cmd, flag, expected, value, cmd);
    return 2;
}

int tr__nvme_parse_size(const char *cmd, const char *flag, const char *s, uint64_t lo, uint64_t hi,
                        uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mul = *end == 'K' ? 1u << 10 : *end == 'M' ? 1u << 20 : *end == 'G' ? 1u << 30 : 1;
    if (mul > 1) end++;
    char expected[96];
    snprintf(expected, sizeof expected, "a size from %llu to %llu bytes (K, M, G allowed)",
             (unsigned long long)lo, (unsigned long long)hi);
    if (errno || end == s || *end || s[0] == '-' || v > hi / mul || v * mul < lo)
        return tr__nvme_bad_flag(cmd, flag, s, expected);
    *out = v * mul;
    return 0;
}
