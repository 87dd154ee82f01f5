/* comms_log.c: DeepSpeed's comms logger (monitor/comms_log.h). Records are kept per (op,
 * message size) in insertion order of the ops, as DeepSpeed's dict is, with every latency
 * and bandwidth, so the summary's trimmed means are exact. */
#include "monitor/comms_log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "troupe/error.h"

typedef struct series {
    char op[32];
    double bytes;
    size_t n, cap;
    double *lat, *alg, *bus;
} series_t;

struct tr_comms_log {
    int world;
    series_t *s;
    size_t n, cap;
};

int tr_comms_bw(const char *op, double bytes, double ms, int n, double *algbw, double *busbw)
{
    double size = bytes, t = ms > 0 ? ms : 1e-9, frac = n > 0 ? (double)(n - 1) / n : 0;
    if (!strcmp(op, "all_to_all_single")) {
        *algbw = size / t;
        *busbw = size / t * frac;
    } else if (!strcmp(op, "all_gather") || !strcmp(op, "all_gather_into_tensor") ||
               !strcmp(op, "reduce_scatter") || !strcmp(op, "reduce_scatter_tensor")) {
        size *= n;
        *algbw = size / t;
        *busbw = size / t * frac;
    } else if (!strcmp(op, "all_reduce") || !strcmp(op, "all_reduce_coalesced") ||
               !strcmp(op, "inference_all_reduce")) {
        *algbw = size * 2 / t;
        *busbw = size / t * 2 * frac;
    } else if (!strcmp(op, "send") || !strcmp(op, "recv") || !strcmp(op, "isend") ||
               !strcmp(op, "irecv") || !strcmp(op, "broadcast") || !strcmp(op, "reduce") ||
               !strcmp(op, "gather") || !strcmp(op, "scatter") || !strcmp(op, "barrier")) {
        *algbw = *busbw = size / t;
    } else {
        return TR_EINVAL;
    }
    *algbw = *algbw * 8 / 1e6; /* bytes per ms -> Gbps */
    *busbw = *busbw * 8 / 1e6;
    return 0;
}

void tr_comms_size_str(double bytes, char *out, size_t len)
{
    static const char *const names[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
    if (bytes == 0) {
        snprintf(out, len, "0B");
        return;
    }
    int i = (int)floor(log(bytes) / log(1024));
    if (i < 0) i = 0;
    if (i > 8) i = 8;
    double v = round(bytes / pow(1024, i) * 100) / 100; /* Python's round(x, 2) */
    char num[64];
    if (v == floor(v))
        snprintf(num, sizeof(num), "%.1f", v); /* Python prints 512.0 */
    else
        snprintf(num, sizeof(num), "%.15g", v);
    snprintf(out, len, "%s %s", num, names[i]);
}

void tr_comms_line(const char *op, double ms, double bytes, int n, char *out, size_t len)
{
    double alg = 0, bus = 0;
    char size[48];
    tr_comms_bw(op, bytes, ms, n, &alg, &bus);
    tr_comms_size_str(bytes, size, sizeof(size));
    snprintf(out, len,
             "comm op: %s | time (ms): %.2f | msg size: %s | algbw (Gbps): %.2f | "
             "busbw (Gbps): %.2f",
             op, ms, size, alg, bus);
}

int tr_comms_log_create(int world, tr_comms_log_t **out)
{
    *out = calloc(1, sizeof(**out));
    if (!*out) return TR_ENOMEM;
    (*out)->world = world;
    return 0;
}

void tr_comms_log_destroy(tr_comms_log_t *log)
{
    if (!log) return;
    for (size_t i = 0; i < log->n; i++) {
        free(log->s[i].lat);
        free(log->s[i].alg);
        free(log->s[i].bus);
    }
    free(log->s);
    free(log);
}

static series_t *series_of(tr_comms_log_t *log, const char *op, double bytes)
{
    for (size_t i = 0; i < log->n; i++)
        if (!strcmp(log->s[i].op, op) && log->s[i].bytes == bytes) return &log->s[i];
    if (log->n == log->cap) {
        size_t cap = log->cap ? 2 * log->cap : 16;
        series_t *s = realloc(log->s, cap * sizeof(*s));
        if (!s) return NULL;
        log->s = s;
        log->cap = cap;
    }
    series_t *s = &log->s[log->n++];
    *s = (series_t){.bytes = bytes};
    snprintf(s->op, sizeof(s->op), "%s", op);
    return s;
}

int tr_comms_log_add(tr_comms_log_t *log, const char *op, double bytes, double ms)
{
    double alg, bus;
    if (tr_comms_bw(op, bytes, ms, log->world, &alg, &bus) < 0) return TR_EINVAL;
    series_t *s = series_of(log, op, bytes);
    if (!s) return TR_ENOMEM;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        double *l = realloc(s->lat, cap * sizeof(double));
        if (l) s->lat = l;
        double *a = realloc(s->alg, cap * sizeof(double));
        if (a) s->alg = a;
        double *b = realloc(s->bus, cap * sizeof(double));
        if (b) s->bus = b;
        if (!l || !a || !b) return TR_ENOMEM;
        s->cap = cap;
    }
    s->lat[s->n] = ms;
    s->alg[s->n] = alg;
    s->bus[s->n] = bus;
    s->n++;
    return 0;
}

size_t tr_comms_log_count(const tr_comms_log_t *log)
{
    size_t n = 0;
    for (size_t i = 0; i < log->n; i++)
        n += log->s[i].n;
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* DeepSpeed's trim_mean(data, 0.1): sort, drop round(n * 0.1) from each end, average. */
static double trim_mean(const double *v, size_t n)
{
    if (n == 0) return 0;
    double *s = malloc(n * sizeof(double));
    if (!s) return NAN;
    memcpy(s, v, n * sizeof(double));
    qsort(s, n, sizeof(double), cmp_double);
    size_t k = (size_t)llround((double)n * 0.1), m = n - 2 * k;
    double sum = 0;
    for (size_t i = k; i < n - k; i++)
        sum += s[i];
    free(s);
    return m ? sum / (double)m : NAN;
}

/* The series of one op, in message-size order (DeepSpeed sorts the sizes). */
static size_t op_series(const tr_comms_log_t *log, const char *op, const series_t **out)
{
    size_t n = 0;
    for (size_t i = 0; i < log->n; i++)
        if (!strcmp(log->s[i].op, op)) out[n++] = &log->s[i];
    for (size_t i = 1; i < n; i++) /* insertion sort by size */
        for (size_t j = i; j > 0 && out[j - 1]->bytes > out[j]->bytes; j--) {
            const series_t *t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return n;
}

/* Calls fn for each op name once, in first-recorded order. */
static void each_op(const tr_comms_log_t *log,
                    void (*fn)(const tr_comms_log_t *, const char *, FILE *, int), FILE *f)
{
    for (size_t i = 0; i < log->n; i++) {
        size_t j = 0;
        while (j < i && strcmp(log->s[j].op, log->s[i].op))
            j++;
        if (j == i) fn(log, log->s[i].op, f, i == 0);
    }
}

static void table_op(const tr_comms_log_t *log, const char *op, FILE *f, int first)
{
    (void)first;
    const series_t *s[log->n ? log->n : 1];
    size_t n = op_series(log, op, s);
    fprintf(f, "%s\n", op);
    for (size_t i = 0; i < n; i++) {
        char size[48], count[24];
        double total = 0;
        for (size_t k = 0; k < s[i]->n; k++)
            total += s[i]->lat[k];
        tr_comms_size_str(s[i]->bytes, size, sizeof(size));
        snprintf(count, sizeof(count), "%zu", s[i]->n);
        fprintf(f, "%-20s%-20s%-20s%-20.2f%-20.2f%-20.2f%-20.2f\n", " ", size, count, total,
                trim_mean(s[i]->lat, s[i]->n), trim_mean(s[i]->alg, s[i]->n),
                trim_mean(s[i]->bus, s[i]->n));
    }
}

void tr_comms_log_summary(const tr_comms_log_t *log, FILE *f)
{
    fprintf(f, "%-20s%-20s%-20s%-20s%-20s%-20s%-20s\n", "Comm. Op", "Message Size", "Count",
            "Total Latency(ms)", "Avg Latency(ms)", "tput_avg (Gbps)", "busbw_avg (Gbps)");
    each_op(log, table_op, f);
}

static void json_op(const tr_comms_log_t *log, const char *op, FILE *f, int first)
{
    const series_t *s[log->n ? log->n : 1];
    size_t n = op_series(log, op, s);
    fprintf(f, "%s\"%s\": {", first ? "" : ", ", op);
    for (size_t i = 0; i < n; i++) {
        char size[48];
        double total = 0;
        for (size_t k = 0; k < s[i]->n; k++)
            total += s[i]->lat[k];
        tr_comms_size_str(s[i]->bytes, size, sizeof(size));
        fprintf(f,
                "%s\"%.0f\": {\"count\": %zu, \"total_latency_ms\": %.6g, "
                "\"avg_latency_ms\": %.6g, \"tput_avg_gbps\": %.6g, \"busbw_avg_gbps\": %.6g, "
                "\"msg_size_bytes\": %.0f, \"msg_size_str\": \"%s\"}",
                i ? ", " : "", s[i]->bytes, s[i]->n, total, trim_mean(s[i]->lat, s[i]->n),
                trim_mean(s[i]->alg, s[i]->n), trim_mean(s[i]->bus, s[i]->n), s[i]->bytes, size);
    }
    fprintf(f, "}");
}

void tr_comms_log_json(const tr_comms_log_t *log, FILE *f)
{
    fprintf(f, "{\"world_size\": %d, \"summary\": {", log->world);
    each_op(log, json_op, f);
    fprintf(f, "}}\n");
}
