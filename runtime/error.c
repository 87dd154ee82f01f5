/* error.c: tr_strerror and tr_err_name, generated from TR_ERRNO_MAP in troupe/error.h. */
#include "troupe/error.h"

#include <string.h>

const char *tr_strerror(int err)
{
    if (err == 0)
        return "success";
    switch (err) {
#define TR__ERR_MSG(name, value, msg)                                                          \
    case (value):                                                                              \
        return msg;
        TR_ERRNO_MAP(TR__ERR_MSG)
#undef TR__ERR_MSG
    default:
        break;
    }
    if (err < 0 && err > -4000)
        {
        const char *s = strerrordesc_np(-err);
        return s ? s : "unknown error";
    }
    return "unknown error";
}

const char *tr_err_name(int err)
{
    if (err == 0)
        return "TR_OK";
    switch (err) {
#define TR__ERR_NAME(name, value, msg)                                                         \
    case (value):                                                                              \
        return "TR_" #name;
        TR_ERRNO_MAP(TR__ERR_NAME)
#undef TR__ERR_NAME
    default:
        return "TR_UNKNOWN";
    }
}
