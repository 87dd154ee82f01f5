/* Troupe's logger: one process-wide level for every line the library prints.
 *
 * A line is "troupe: <text>", with "warning: ", "error: " or "debug: " after the prefix for
 * those levels, written to stderr with one write call (lines from different threads never
 * interleave) or handed to a sink. Lines below the level are dropped. The level starts from
 * the environment variable TROUPE_LOG_LEVEL (read once, at the first use of the logger;
 * default info); a config's troupe.log_level is applied with tr_log_set_default_level, which
 * the environment overrides; tr_log_set_level overrides both.
 *
 * Level names (any case): debug, info, warning (or warn), error, off (or quiet).
 */
#ifndef TR_INCLUDE_TROUPE_LOG_H
#define TR_INCLUDE_TROUPE_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

enum {
    TR_LOG_DEBUG = 0, /* what the runtime decided and why: for finding a problem */
    TR_LOG_INFO = 1,  /* start-up summaries, progress */
    TR_LOG_WARN = 2,  /* something is ignored or degraded; the run goes on */
    TR_LOG_ERROR = 3, /* something failed */
    TR_LOG_OFF = 4    /* as a level: print nothing */
};

/* Receives each line that passes the level: the whole text with its prefix, without the
 * trailing newline. Called under the logger's lock (lines never overlap; a sink must not log).
 * Any thread. */
typedef void (*tr_log_sink_cb)(void *user, int level, const char *line);

/* Prints one line at level (TR_LOG_DEBUG..TR_LOG_ERROR) if the level lets it through. fmt is
 * the text without a trailing newline (one is added); a long line is never cut. Any thread. */
void tr_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Sets the level: lines below it are dropped (TR_LOG_OFF drops all). TR_EINVAL for a value
 * outside TR_LOG_DEBUG..TR_LOG_OFF. Any thread. */
int tr_log_set_level(int level);

/* Sets the level unless TROUPE_LOG_LEVEL holds a valid level: for a config's level, which the
 * environment of one run overrides. TR_EINVAL as tr_log_set_level. Any thread. */
int tr_log_set_default_level(int level);

/* The current level. Any thread. */
int tr_log_level(void);

/* Parses a level name (see the top of this header) into *level. TR_EINVAL for anything else
 * (s NULL or empty included); *level is then untouched. Any thread. */
int tr_log_level_parse(const char *s, int *level);

/* The name of a level ("debug", "info", "warning", "error", "off"); "?" out of range. */
const char *tr_log_level_name(int level);

/* Sends lines to sink(user, ...) instead of stderr; NULL restores stderr. When it returns, the
 * old sink is not called any more. Any thread. */
void tr_log_set_sink(tr_log_sink_cb sink, void *user);

#ifdef __cplusplus
}
#endif
#endif
