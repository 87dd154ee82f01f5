/* errf.h: the library's one "explain and return" helper, for `return tr__errf(err, len, rc,
 * "...", ...)`. Any thread. */
#ifndef TR_RUNTIME_ERRF_H
#define TR_RUNTIME_ERRF_H

#include <stddef.h>

/* Writes the explanation into err (errlen bytes; nothing when err is NULL or errlen 0) and
 * returns rc. */
int tr__errf(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
