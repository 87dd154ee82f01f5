/* comms_log: DeepSpeed's comms logger (deepspeed/utils/comms_logging.py), its numbers and its
 * formats.
 *
 * Each record is an operation's name ("all_reduce", "reduce_scatter", ...), its message size
 * in bytes and its latency in ms. The bandwidths follow DeepSpeed's calc_bw_log (in Gbps:
 * bytes * 8 / 1e6 / ms): all_reduce algbw = 2S/t, busbw = S/t * 2(n-1)/n; all_gather and
 * reduce_scatter take S = S * n, algbw = S/t, busbw = S/t * (n-1)/n; all_to_all_single algbw
 * = S/t, busbw = S/t * (n-1)/n; broadcast, send, recv, reduce, gather, scatter, barrier
 * algbw = busbw = S/t. The summary is DeepSpeed's seven-column table, one block per operation
 * and a row per message size, averages being 10% trimmed means (DeepSpeed's trim_mean). One
 * thread at a time (the comm actor's).
 */
#ifndef TR_MONITOR_COMMS_LOG_H
#define TR_MONITOR_COMMS_LOG_H

#include <stddef.h>
#include <stdio.h>

typedef struct tr_comms_log tr_comms_log_t;

/* DeepSpeed's algbw and busbw of op on a world of n ranks, in Gbps. TR_EINVAL for an op name
 * DeepSpeed does not know. */
int tr_comms_bw(const char *op, double bytes, double ms, int n, double *algbw, double *busbw);

/* DeepSpeed's convert_size: "0B", "512.0 B", "1.5 KB", "678.86 MB" (powers of 1024). */
void tr_comms_size_str(double bytes, char *out, size_t len);

/* The verbose line: `comm op: NAME | time (ms): x | msg size: y | algbw (Gbps): a | busbw
 * (Gbps): b`. */
void tr_comms_line(const char *op, double ms, double bytes, int n, char *out, size_t len);

int tr_comms_log_create(int world, tr_comms_log_t **out);
void tr_comms_log_destroy(tr_comms_log_t *log);

/* Records one operation. TR_EINVAL for an unknown op, TR_ENOMEM. */
int tr_comms_log_add(tr_comms_log_t *log, const char *op, double bytes, double ms);

/* Operations recorded so far. */
size_t tr_comms_log_count(const tr_comms_log_t *log);

/* Writes DeepSpeed's summary table to f. */
void tr_comms_log_summary(const tr_comms_log_t *log, FILE *f);

/* Writes the summary as JSON ({"world_size": n, "summary": {op: {"bytes": {...}}}}) to f. */
void tr_comms_log_json(const tr_comms_log_t *log, FILE *f);

#endif
