/* tb_writer.c: TensorBoard event files written by our own small encoder.
 *
 * An event file is a TFRecord stream: each record is its length (uint64, little endian),
 * the masked CRC-32C of those 8 bytes, the data, and the masked CRC-32C of the data; the
 * mask is ((crc >> 15) | (crc << 17)) + 0xa282ead8. Each record's data is an Event
 * protobuf: wall_time (1, double), step (2, int64 varint), and either file_version (3,
 * string, "brain.Event:2" in the first record) or summary (5, a Summary whose repeated
 * value (1) holds tag (1, string) and simple_value (2, float)). That is what DeepSpeed's
 * TensorBoard monitor writes through torch's SummaryWriter, into <output_path>/<job_name>/.
 * One thread per writer.
 */
#include "base/crc32c.h"
#include "base/file.h"
#include "troupe/monitor.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct tr_tb_writer {
    FILE *file;
    char *path;
};

/* --- CRC-32C (Castagnoli): base/crc32c.c has the one implementation ------------------- */

uint32_t tr_crc32c(uint32_t crc, const void *data, size_t len)
{
    return tr__crc32c(crc, data, len);
}

uint32_t tr_crc32c_masked(const void *data, size_t len)
{
    uint32_t crc = tr_crc32c(0, data, len);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* --- protobuf encoding ------------------------------------------------------------------- */

typedef struct pb {
    uint8_t buf[1024];
    size_t len;
} pb_t;

static void pb_byte(pb_t *b, uint8_t v)
{
    if (b->len < sizeof(b->buf))
        b->buf[b->len++] = v;
    else
        b->len = sizeof(b->buf) + 1; /* overflow: the caller sees len > capacity */
}

static void pb_varint(pb_t *b, uint64_t v)
{
    while (v >= 0x80) {
        pb_byte(b, (uint8_t)(v | 0x80));
        v >>= 7;
    }
    pb_byte(b, (uint8_t)v);
}

static void pb_le(pb_t *b, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        pb_byte(b, (uint8_t)(v >> (8 * i)));
}

static void pb_bytes(pb_t *b, int field, const void *data, size_t len)
{
    pb_varint(b, (uint64_t)field << 3 | 2);
    pb_varint(b, len);
    for (size_t i = 0; i < len; i++)
        pb_byte(b, ((const uint8_t *)data)[i]);
}

/* Event{wall_time, step} followed by the caller's oneof field. */
static void pb_event_head(pb_t *b, double wall_time, int64_t step)
{
    uint64_t bits;
    memcpy(&bits, &wall_time, 8);
    pb_varint(b, 1 << 3 | 1);
    pb_le(b, bits, 8);
    pb_varint(b, 2 << 3 | 0);
    pb_varint(b, (uint64_t)step);
}

/* --- records ----------------------------------------------------------------------------- */

static int write_record(tr_tb_writer_t *w, const pb_t *b)
{
    if (b->len > sizeof(b->buf)) return TR_EINVAL;
    uint8_t head[12];
    for (int i = 0; i < 8; i++)
        head[i] = (uint8_t)((uint64_t)b->len >> (8 * i));
    uint32_t c = tr_crc32c_masked(head, 8), d = tr_crc32c_masked(b->buf, b->len);
    for (int i = 0; i < 4; i++)
        head[8 + i] = (uint8_t)(c >> (8 * i));
    uint8_t tail[4] = {(uint8_t)d, (uint8_t)(d >> 8), (uint8_t)(d >> 16), (uint8_t)(d >> 24)};
    if (fwrite(head, 1, 12, w->file) != 12 || fwrite(b->buf, 1, b->len, w->file) != b->len ||
        fwrite(tail, 1, 4, w->file) != 4)
        return errno ? -errno : TR_EIO;
    return 0;
}

int tr_tb_writer_scalar(tr_tb_writer_t *w, const char *tag, float value, int64_t step,
                        double wall_time)
{
    pb_t val = {.len = 0}, sum = {.len = 0}, ev = {.len = 0};
    uint32_t bits;
    memcpy(&bits, &value, 4);
    pb_bytes(&val, 1, tag, strlen(tag));
    pb_varint(&val, 2 << 3 | 5);
    pb_le(&val, bits, 4);
    pb_bytes(&sum, 1, val.buf, val.len);
    pb_event_head(&ev, wall_time, step);
    pb_bytes(&ev, 5, sum.buf, sum.len);
    if (val.len > sizeof(val.buf) || sum.len > sizeof(sum.buf))
        return TR_EINVAL; /* a tag longer than our record buffer */
    return write_record(w, &ev);
}

int tr_tb_writer_flush(tr_tb_writer_t *w)
{
    return fflush(w->file) ? -errno : 0;
}

const char *tr_tb_writer_path(const tr_tb_writer_t *w)
{
    return w->path;
}

/* --- lifetime ---------------------------------------------------------------------------- */

static int open_file(tr_tb_writer_t *w, const char *output_path, const char *job_name)
{
    char dir[4096], host[256] = "localhost";
    gethostname(host, sizeof(host) - 1);
    if (tr__path_join(dir, sizeof(dir), output_path, job_name)) return TR_EINVAL;
    int err = tr__mkdir_p(dir);
    if (err) return err;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    size_t len = strlen(dir) + strlen(host) + 64;
    if (!(w->path = malloc(len))) return TR_ENOMEM;
    snprintf(w->path, len, "%s/events.out.tfevents.%010lld.%s.%d.0", dir, (long long)now.tv_sec,
             host, (int)getpid());
    w->file = fopen(w->path, "wb");
    if (!w->file) return -errno;
    pb_t ev = {.len = 0};
    pb_event_head(&ev, (double)now.tv_sec + now.tv_nsec / 1e9, 0);
    pb_bytes(&ev, 3, "brain.Event:2", 13);
    return write_record(w, &ev);
}

int tr_tb_writer_create(const char *output_path, const char *job_name, tr_tb_writer_t **out)
{
    *out = NULL;
    if (!job_name || !*job_name) return TR_EINVAL;
    tr_tb_writer_t *w = calloc(1, sizeof(*w));
    if (!w) return TR_ENOMEM;
    int err = open_file(w, output_path, job_name);
    if (err) {
        tr_tb_writer_destroy(w);
        return err;
    }
    *out = w;
    return 0;
}

void tr_tb_writer_destroy(tr_tb_writer_t *w)
{
    if (!w) return;
    if (w->file) fclose(w->file);
    free(w->path);
    free(w);
}
