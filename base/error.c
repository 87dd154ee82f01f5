/* error.c: tr_strerror and tr_err_name, generated from TR_ERRNO_MAP in troupe/error.h, and
 * the thread's last error text (tr_last_error). */
#include "troupe/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/errf.h"

static _Thread_local char last_error[256];

const char *tr_last_error(void)
{
    return last_error;
}

int tr__error(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return err;
}

const char *tr_strerror(int err)
{
    if (err == 0) return "success";
    switch (err) {
#define TR__ERR_MSG(name, value, msg)                                                              \
    case (value):                                                                                  \
        return msg;
        TR_ERRNO_MAP(TR__ERR_MSG)
#undef TR__ERR_MSG
    default:
        break;
    }
    if (err < 0 && err > -4000) {
        const char *s = strerrordesc_np(-err);
        return s ? s : "unknown error";
    }
    return "unknown error";
}

const char *tr_err_name(int err)
{
    if (err == 0) return "TR_OK";
    switch (err) {
#define TR__ERR_NAME(name, value, msg)                                                             \
    case (value):                                                                                  \
        return "TR_" #name;
        TR_ERRNO_MAP(TR__ERR_NAME)
#undef TR__ERR_NAME
    default:
        return "TR_UNKNOWN";
    }
}

int tr__errf(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}
