/* errf.h: the library's "explain and return" helpers: tr__errf, for `return tr__errf(err, len, rc,
 * "...", ...)`. Any thread. */
#ifndef TR_BASE_ERRF_H
#define TR_BASE_ERRF_H

#include <stddef.h>

/* Writes the explanation into err (errlen bytes; nothing when err is NULL or errlen 0) and
 * returns rc. */
int tr__errf(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Sets the thread's tr_last_error text; returns err, for `return tr__error(...)`. */
int tr__error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
