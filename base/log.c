/* log.c: the process-wide logger (troupe/log.h).
 *
 * Design: the level is one atomic int, read relaxed by tr_log (a line racing with a level
 * change may go either way; nothing else depends on it). TROUPE_LOG_LEVEL is read once, under
 * pthread_once, by the first call into the logger; an invalid value is remembered there and
 * reported by whichever caller wins the `warned` exchange, outside the once (reporting logs,
 * and logging inside the once would wait on itself). Each line is formatted into one buffer
 * and written with one write(2), so concurrent lines never interleave; a sink is called under
 * `mu`, so sink calls never overlap and a replaced sink is never called after
 * tr_log_set_sink returns.
 */
#include "troupe/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "troupe/error.h"

#define ENV_NAME       "TROUPE_LOG_LEVEL"
#define LINE_MAX_STACK 512

static pthread_once_t once = PTHREAD_ONCE_INIT;
static _Atomic int level = TR_LOG_INFO;
static _Atomic int env_valid; /* TROUPE_LOG_LEVEL held a level: set_default_level yields */
static char env_bad[64];      /* written in the once, read after it: an invalid value */
static _Atomic int warned;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static tr_log_sink_cb sink; /* under mu */
static void *sink_user;     /* under mu */

static const struct {
    const char *name;
    int level;
} names[] = {
    {"debug", TR_LOG_DEBUG}, {"info", TR_LOG_INFO}, {"warning", TR_LOG_WARN}, {"warn", TR_LOG_WARN},
    {"error", TR_LOG_ERROR}, {"off", TR_LOG_OFF},   {"quiet", TR_LOG_OFF},
};

int tr_log_level_parse(const char *s, int *out)
{
    if (!s || !out) return TR_EINVAL;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcasecmp(s, names[i].name) == 0) {
            *out = names[i].level;
            return 0;
        }
    return TR_EINVAL;
}

const char *tr_log_level_name(int l)
{
    static const char *const n[] = {"debug", "info", "warning", "error", "off"};
    return l >= TR_LOG_DEBUG && l <= TR_LOG_OFF ? n[l] : "?";
}

static void read_env(void)
{
    const char *s = getenv(ENV_NAME);
    int l;
    if (!s) return;
    if (tr_log_level_parse(s, &l) == 0) {
        atomic_store_explicit(&level, l, memory_order_relaxed);
        atomic_store_explicit(&env_valid, 1, memory_order_relaxed);
    } else {
        snprintf(env_bad, sizeof(env_bad), "%s", s);
        if (strlen(s) >= sizeof(env_bad)) /* say it was cut, never cut silently */
            memcpy(env_bad + sizeof(env_bad) - 4, "...", 4);
    }
}

static void write_all(const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(STDERR_FILENO, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return; /* stderr is gone: nowhere to say so */
        p += w;
        n -= (size_t)w;
    }
}

/* Hands a formatted line (ending in '\n', len bytes with it) to the sink or stderr. */
static void emit(int l, char *line, size_t len)
{
    pthread_mutex_lock(&mu);
    if (sink) {
        line[len - 1] = '\0';
        sink(sink_user, l, line);
        pthread_mutex_unlock(&mu);
        return;
    }
    pthread_mutex_unlock(&mu);
    write_all(line, len);
}

static const char *prefix_of(int l)
{
    switch (l) {
    case TR_LOG_DEBUG:
        return "troupe: debug: ";
    case TR_LOG_WARN:
        return "troupe: warning: ";
    case TR_LOG_ERROR:
        return "troupe: error: ";
    default:
        return "troupe: ";
    }
}

static void vlog(int l, const char *fmt, va_list ap)
{
    char stack[LINE_MAX_STACK];
    const char *prefix = prefix_of(l);
    size_t np = strlen(prefix);
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) return;
    size_t len = np + (size_t)n + 1; /* with the newline */
    char *buf = len + 1 <= sizeof(stack) ? stack : malloc(len + 1);
    if (!buf) { /* no memory for a long line: say so rather than cut it silently */
        static const char oom[] = "troupe: error: out of memory formatting a log line\n";
        write_all(oom, sizeof(oom) - 1);
        return;
    }
    memcpy(buf, prefix, np);
    vsnprintf(buf + np, (size_t)n + 1, fmt, ap);
    if (n > 0 && buf[np + (size_t)n - 1] == '\n') /* a caller's own newline: keep one */
        len--;
    buf[len - 1] = '\n';
    buf[len] = '\0';
    emit(l, buf, len);
    if (buf != stack) free(buf);
}

static void log_direct(int l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_direct(int l, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(l, fmt, ap);
    va_end(ap);
}

static void ensure_init(void)
{
    pthread_once(&once, read_env);
    if (env_bad[0] && !atomic_exchange_explicit(&warned, 1, memory_order_relaxed))
        log_direct(TR_LOG_WARN,
                   "%s: '%s' is not a log level (expected debug, info, warning, error or off); "
                   "using info",
                   ENV_NAME, env_bad);
}

void tr_log(int l, const char *fmt, ...)
{
    ensure_init();
    if (l < TR_LOG_DEBUG) l = TR_LOG_DEBUG;
    if (l > TR_LOG_ERROR) l = TR_LOG_ERROR;
    if (l < atomic_load_explicit(&level, memory_order_relaxed)) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(l, fmt, ap);
    va_end(ap);
}

int tr_log_set_level(int l)
{
    if (l < TR_LOG_DEBUG || l > TR_LOG_OFF) return TR_EINVAL;
    ensure_init();
    atomic_store_explicit(&level, l, memory_order_relaxed);
    return 0;
}

int tr_log_set_default_level(int l)
{
    if (l < TR_LOG_DEBUG || l > TR_LOG_OFF) return TR_EINVAL;
    ensure_init();
    if (!atomic_load_explicit(&env_valid, memory_order_relaxed))
        atomic_store_explicit(&level, l, memory_order_relaxed);
    return 0;
}

int tr_log_level(void)
{
    ensure_init();
    return atomic_load_explicit(&level, memory_order_relaxed);
}

void tr_log_set_sink(tr_log_sink_cb fn, void *user)
{
    pthread_mutex_lock(&mu);
    sink = fn;
    sink_user = fn ? user : NULL;
    pthread_mutex_unlock(&mu);
}
