/* What `troupe nvme-bench` and `troupe nvme-tune` share: one timed write-then-read of a file
 * through the aio engine, and the parsing of their size flags. */
#ifndef TR_TOOLS_NVME_MEASURE_H
#define TR_TOOLS_NVME_MEASURE_H

#include <stddef.h>
#include <stdint.h>

#include "troupe/aio.h"

/* Writes io_size bytes from one locked buffer into a fresh file under dir, then reads them
 * back (both with the synchronous calls of an engine made with o), and sets *write_gbs and
 * *read_gbs (GB = 1e9 bytes). The file is removed. On failure returns TR_EINVAL when o does
 * not suit the file (why names the option), another negative TR_E* code for a failed open,
 * allocation or I/O, with why naming the file, offset and size. Any thread. */
int tr__nvme_measure(const char *dir, uint64_t io_size, const tr_aio_options_t *o,
                     double *write_gbs, double *read_gbs, char *why, size_t why_len);

/* Parses a size with an optional K, M or G suffix (powers of 1024) into *out, from lo to
 * hi. On a bad value prints "troupe CMD: FLAG: expected ..., got 'S'" to stderr and returns
 * 2 (the exit status); else 0. */
int tr__nvme_parse_size(const char *cmd, const char *flag, const char *s, uint64_t lo, uint64_t hi,
                        uint64_t *out);

/* Prints "troupe CMD: FLAG: expected EXPECTED, got 'VALUE'" and where the flags are listed
 * to stderr; returns 2, the exit status for bad usage. */
int tr__nvme_bad_flag(const char *cmd, const char *flag, const char *value, const char *expected);

#endif
