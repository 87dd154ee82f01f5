/* csv_monitor.c: DeepSpeed's csv_monitor, byte for byte.
 *
 * Files live in <output_path>/<job_name>/ (os.path.join: an empty output_path means
 * job_name alone). A tag's file is the tag with '/' and ' ' replaced by '_', plus ".csv";
 * its header is "step,<last '/'-component of the tag>"; each event appends
 * "<step>,<value>" with the value as Python's str(float). Rows end in "\r\n", the csv
 * module's default line terminator, and fields with a comma, quote or line break are quoted
 * as it quotes them. Like DeepSpeed, each write opens the file in append mode and closes
 * it, so a crash loses nothing already written. Unlike DeepSpeed, the header is written
 * only when the file is empty, so a resumed run does not add a second one.
 */
#include "troupe/monitor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "troupe/log.h"

struct tr_csv_monitor {
    char *dir;
};

int tr_csv_monitor_create(const char *output_path, const char *job_name, tr_csv_monitor_t **out)
{
    *out = NULL;
    if (!job_name || !*job_name) return TR_EINVAL;
    tr_csv_monitor_t *c = calloc(1, sizeof(*c));
    size_t n = strlen(output_path ? output_path : "") + strlen(job_name) + 2;
    if (!c || !(c->dir = malloc(n))) {
        free(c);
        return TR_ENOMEM;
    }
    tr__path_join(c->dir, n, output_path, job_name); /* n has room for both and a '/' */
    int err = tr__mkdir_p(c->dir);
    if (err) {
        tr_log(TR_LOG_ERROR, "csv_monitor: cannot create %s: %s", c->dir, tr_strerror(err));
        tr_csv_monitor_destroy(c);
        return err;
    }
    *out = c;
    return 0;
}

void tr_csv_monitor_destroy(tr_csv_monitor_t *c)
{
    if (!c) return;
    free(c->dir);
    free(c);
}

const char *tr_csv_monitor_dir(const tr_csv_monitor_t *c)
{
    return c->dir;
}

/* One field as csv.writer (QUOTE_MINIMAL) writes it. */
static void put_field(FILE *f, const char *s)
{
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

/* Appends "<step>,<value>" (value already formatted) to the tag's file. */
static int write_row(tr_csv_monitor_t *c, const char *tag, const char *value, uint64_t step)
{
    size_t n = strlen(c->dir) + strlen(tag) + 8;
    char *path = malloc(n);
    if (!path) return TR_ENOMEM;
    int k = snprintf(path, n, "%s/", c->dir);
    for (const char *s = tag; *s; s++)
        path[k++] = *s == '/' || *s == ' ' ? '_' : *s;
    snprintf(path + k, n - (size_t)k, ".csv");
    FILE *f = fopen(path, "a");
    int err = f ? 0 : -errno;
    if (f) {
        const char *slash = strrchr(tag, '/');
        fseek(f, 0, SEEK_END);
        if (ftell(f) == 0) {
            fputs("step,", f);
            put_field(f, slash ? slash + 1 : tag);
            fputs("\r\n", f);
        }
        fprintf(f, "%llu,%s\r\n", (unsigned long long)step, value);
        if (ferror(f) | fclose(f)) err = errno ? -errno : TR_EIO;
    }
    if (err) tr_log(TR_LOG_ERROR, "csv_monitor: cannot write %s: %s", path, tr_strerror(err));
    free(path);
    return err;
}

int tr_csv_monitor_write(tr_csv_monitor_t *c, const char *tag, double value, uint64_t step)
{
    char v[40];
    tr_pyfloat_format(value, v, sizeof(v));
    return write_row(c, tag, v, step);
}

int tr_csv_monitor_write_int(tr_csv_monitor_t *c, const char *tag, int64_t value, uint64_t step)
{
    char v[24];
    snprintf(v, sizeof(v), "%lld", (long long)value);
    return write_row(c, tag, v, step);
}
