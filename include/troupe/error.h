/* Troupe error codes.
 *
 * Fallible functions return 0 or a negative TR_E* code. System errors pass through as
 * -errno (TR_EINVAL == -EINVAL), so codes from libuv and libaio need no translation.
 * Troupe's own codes live below -4000. One table, TR_ERRNO_MAP, generates the enum,
 * tr_strerror() and tr_err_name().
 */
#ifndef TR_INCLUDE_TROUPE_ERROR_H
#define TR_INCLUDE_TROUPE_ERROR_H

#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TR_ERRNO_MAP(XX)                                                                           \
    XX(EPERM, -EPERM, "operation not permitted")                                                   \
    XX(ENOENT, -ENOENT, "no such file or directory")                                               \
    XX(EINTR, -EINTR, "interrupted system call")                                                   \
    XX(EIO, -EIO, "i/o error")                                                                     \
    XX(EBADF, -EBADF, "bad file descriptor")                                                       \
    XX(EAGAIN, -EAGAIN, "resource temporarily unavailable")                                        \
    XX(ENOMEM, -ENOMEM, "not enough memory")                                                       \
    XX(EACCES, -EACCES, "permission denied")                                                       \
    XX(EBUSY, -EBUSY, "resource busy")                                                             \
    XX(EEXIST, -EEXIST, "file already exists")                                                     \
    XX(ENOTDIR, -ENOTDIR, "not a directory")                                                       \
    XX(EISDIR, -EISDIR, "is a directory")                                                          \
    XX(EINVAL, -EINVAL, "invalid argument")                                                        \
    XX(ENOSPC, -ENOSPC, "no space left on device")                                                 \
    XX(EPIPE, -EPIPE, "broken pipe")                                                               \
    XX(ERANGE, -ERANGE, "result out of range")                                                     \
    XX(ENAMETOOLONG, -ENAMETOOLONG, "name too long")                                               \
    XX(ENOTSUP, -ENOTSUP, "operation not supported")                                               \
    XX(EOVERFLOW, -EOVERFLOW, "value too large")                                                   \
    XX(ECANCELED, -ECANCELED, "operation canceled")                                                \
    XX(ETIMEDOUT, -ETIMEDOUT, "timed out")                                                         \
    XX(ESTOPPED, -4001, "actor or runtime has stopped")                                            \
    XX(ENOACTOR, -4002, "no such actor")                                                           \
    XX(EDECODE, -4003, "malformed message payload")                                                \
    XX(ECONFIG, -4004, "invalid configuration")                                                    \
    XX(EFORMAT, -4005, "malformed file")                                                           \
    XX(ECHECKSUM, -4006, "checksum mismatch")                                                      \
    XX(ENONFINITE, -4007, "non-finite value")                                                      \
    XX(EFAILED, -4008, "actor failed")                                                             \
    XX(EMISMATCH, -4009, "incompatible with what was saved or configured")                         \
    XX(EDEVICE, -4010, "device error")                                                             \
    XX(ECOMM, -4011, "communication backend error")                                                \
    XX(ESHUTDOWN, -4012, "runtime is shutting down")                                               \
    XX(ELAYER, -4013, "layer failed")                                                              \
    XX(ERESTARTS, -4014, "restarted too often (restart intensity reached)")

typedef enum {
#define TR__ERR_ENUM(name, value, msg) TR_##name = (value),
    TR_ERRNO_MAP(TR__ERR_ENUM)
#undef TR__ERR_ENUM
        TR_ERRNO_MAX_ = -4999
} tr_errno_t;

/* A static, human-readable message for err (0 gives "success"; an errno value not in the
 * table is described by the C library). Any thread. */
const char *tr_strerror(int err);

/* The symbolic name ("TR_EINVAL"); "TR_UNKNOWN" for a code not in the table. Any thread. */
const char *tr_err_name(int err);

/* What the last failing call on this thread said about its error, beyond the code: one line
 * naming the actor, name or thread concerned (e.g. "cannot spawn actor 'loader': the name is
 * taken by actor #3"); "" when that call left no text. Set by the runtime's tr_actor_*,
 * tr_timer_* and tr_poll_* calls.
 * Thread-local: valid until the next failing call on the same thread. */
const char *tr_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
