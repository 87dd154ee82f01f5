/* The logger: levels filter lines, TROUPE_LOG_LEVEL sets the start level (an invalid value
 * is named in one warning), a sink receives whole lines, concurrent writers never interleave.
 * The environment is read once per process, so those cases run this binary again (--child)
 * with the variable set. */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe.h"

/* --- a capturing sink -------------------------------------------------------------------- */

typedef struct capture {
    int n;
    int levels[16];
    char lines[16][160];
    size_t longest;
} capture_t;

static void capture_sink(void *user, int level, const char *line)
{
    capture_t *c = user;
    size_t len = strlen(line);
    if (len > c->longest) c->longest = len;
    if (c->n < 16) {
        c->levels[c->n] = level;
        snprintf(c->lines[c->n], sizeof(c->lines[0]), "%s", line);
    }
    c->n++;
}

static void log_all_levels(void)
{
    tr_log(TR_LOG_DEBUG, "d %d", 1);
    tr_log(TR_LOG_INFO, "i %d", 2);
    tr_log(TR_LOG_WARN, "w %d", 3);
    tr_log(TR_LOG_ERROR, "e %d", 4);
}

static void test_log_levels_filter_lines(void **state)
{
    capture_t c = {0};
    tr_log_set_sink(capture_sink, &c);
    assert_int_equal(tr_log_set_level(TR_LOG_WARN), 0);
    log_all_levels();
    assert_int_equal(c.n, 2);
    assert_string_equal(c.lines[0], "troupe: warning: w 3");
    assert_int_equal(c.levels[0], TR_LOG_WARN);
    assert_string_equal(c.lines[1], "troupe: error: e 4");

    c.n = 0;
    assert_int_equal(tr_log_set_level(TR_LOG_DEBUG), 0);
    log_all_levels();
    assert_int_equal(c.n, 4);
    assert_string_equal(c.lines[0], "troupe: debug: d 1");
    assert_string_equal(c.lines[1], "troupe: i 2");

    c.n = 0;
    assert_int_equal(tr_log_set_level(TR_LOG_OFF), 0);
    log_all_levels();
    assert_int_equal(c.n, 0);

    assert_int_equal(tr_log_set_level(TR_LOG_OFF + 1), TR_EINVAL);
    assert_int_equal(tr_log_set_level(-1), TR_EINVAL);
    assert_int_equal(tr_log_level(), TR_LOG_OFF); /* a refused level changes nothing */
    tr_log_set_level(TR_LOG_INFO);
    tr_log_set_sink(NULL, NULL);
}

static void test_log_level_names_parse(void **state)
{
    static const struct {
        const char *s;
        int level;
    } ok[] = {{"debug", TR_LOG_DEBUG}, {"info", TR_LOG_INFO},    {"warning", TR_LOG_WARN},
              {"warn", TR_LOG_WARN},   {"WARNING", TR_LOG_WARN}, {"error", TR_LOG_ERROR},
              {"off", TR_LOG_OFF},     {"quiet", TR_LOG_OFF},    {"Info", TR_LOG_INFO}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        int l = -7;
        assert_int_equal(tr_log_level_parse(ok[i].s, &l), 0);
        assert_int_equal(l, ok[i].level);
    }
    static const char *const bad[] = {"", "loud", "warnings", "3", " info"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int l = -7;
        assert_int_equal(tr_log_level_parse(bad[i], &l), TR_EINVAL);
        assert_int_equal(l, -7); /* untouched */
    }
    int l = -7;
    assert_int_equal(tr_log_level_parse(NULL, &l), TR_EINVAL);
    assert_string_equal(tr_log_level_name(TR_LOG_WARN), "warning");
    assert_string_equal(tr_log_level_name(TR_LOG_OFF), "off");
    assert_string_equal(tr_log_level_name(9), "?");
}

static void test_log_long_line_is_not_cut(void **state)
{
    capture_t c = {0};
    char text[5001];
    memset(text, 'x', sizeof(text) - 1);
    text[sizeof(text) - 1] = '\0';
    tr_log_set_sink(capture_sink, &c);
    tr_log(TR_LOG_INFO, "%s", text);
    tr_log(TR_LOG_INFO, "own newline\n"); /* one newline kept, not two */
    tr_log_set_sink(NULL, NULL);
    assert_int_equal(c.n, 2);
    assert_int_equal(c.longest, strlen("troupe: ") + 5000);
    assert_string_equal(c.lines[1], "troupe: own newline");
}

/* --- stderr: one write per line ---------------------------------------------------------- */

#define WRITERS    8
#define LINES_EACH 2000
#define PAYLOAD    300 /* well past stdio's and a pipe's small atomic sizes */

static void *writer(void *arg)
{
    int k = (int)(intptr_t)arg;
    char pad[PAYLOAD + 1];
    memset(pad, 'a' + k, PAYLOAD);
    pad[PAYLOAD] = '\0';
    for (int i = 0; i < LINES_EACH; i++)
        tr_log(TR_LOG_WARN, "w%d %05d %s", k, i, pad);
    return NULL;
}

/* Runs fn with fd 2 going to a fresh temporary file; returns that file's contents. */
static char *with_stderr_captured(void (*fn)(void), size_t *len)
{
    char path[] = "/tmp/tr_test_log_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    fcntl(fd, F_SETFL, O_APPEND);
    int saved = dup(2);
    dup2(fd, 2);
    fn();
    dup2(saved, 2);
    close(saved);
    off_t size = lseek(fd, 0, SEEK_END);
    char *buf = malloc((size_t)size + 1);
    assert_non_null(buf);
    assert_int_equal(pread(fd, buf, (size_t)size, 0), size);
    buf[size] = '\0';
    close(fd);
    *len = (size_t)size;
    return buf;
}

static void run_writers(void)
{
    pthread_t t[WRITERS];
    for (int k = 0; k < WRITERS; k++)
        pthread_create(&t[k], NULL, writer, (void *)(intptr_t)k);
    for (int k = 0; k < WRITERS; k++)
        pthread_join(t[k], NULL);
}

static void test_log_concurrent_writers_write_whole_lines(void **state)
{
    size_t len;
    char *out = with_stderr_captured(run_writers, &len);
    int seen[WRITERS] = {0};
    int lines = 0;
    for (char *line = out, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
        *nl = '\0';
        int k, i;
        char tail[PAYLOAD + 2];
        assert_int_equal(sscanf(line, "troupe: warning: w%d %d %301s", &k, &i, tail), 3);
        assert_true(k >= 0 && k < WRITERS);
        assert_int_equal(i, seen[k]); /* each writer's lines in order, none lost */
        seen[k]++;
        assert_int_equal(strlen(tail), PAYLOAD);
        assert_int_equal(strspn(tail, (char[]){(char)('a' + k), 0}), PAYLOAD); /* not mixed */
        lines++;
    }
    assert_int_equal(lines, WRITERS * LINES_EACH);
    free(out);
}

static void log_one_line(void)
{
    tr_log(TR_LOG_ERROR, "to stderr");
}

static void test_log_null_sink_restores_stderr(void **state)
{
    capture_t c = {0};
    tr_log_set_sink(capture_sink, &c);
    tr_log_set_sink(NULL, NULL);
    size_t len;
    char *out = with_stderr_captured(log_one_line, &len);
    assert_string_equal(out, "troupe: error: to stderr\n");
    assert_int_equal(c.n, 0);
    free(out);
}

/* --- TROUPE_LOG_LEVEL, in a fresh process ------------------------------------------------- */

/* The child: all four levels, then a config's level (debug) and one debug line. */
static int child_main(void)
{
    log_all_levels();
    tr_log(TR_LOG_INFO, "i again");
    tr_log_set_default_level(TR_LOG_DEBUG);
    tr_log(TR_LOG_DEBUG, "d2");
    return 0;
}

/* Runs this binary with --child and TROUPE_LOG_LEVEL=value (NULL: unset); its stderr. */
static char *run_child(const char *value)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        if (value)
            setenv("TROUPE_LOG_LEVEL", value, 1);
        else
            unsetenv("TROUPE_LOG_LEVEL");
        execl("/proc/self/exe", "test_log", "--child", (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    static char buf[4096];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof(buf) - 1 && (r = read(p[0], buf + n, sizeof(buf) - 1 - n)) > 0)
        n += (size_t)r;
    buf[n] = '\0';
    close(p[0]);
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return buf;
}

static void test_log_env_sets_the_level(void **state)
{
    assert_string_equal(run_child(NULL), "troupe: i 2\n"
                                         "troupe: warning: w 3\n"
                                         "troupe: error: e 4\n"
                                         "troupe: i again\n"
                                         "troupe: debug: d2\n");
    /* the environment wins over a config's level */
    assert_string_equal(run_child("ERROR"), "troupe: error: e 4\n");
    assert_string_equal(run_child("quiet"), "");
    assert_string_equal(run_child("debug"), "troupe: debug: d 1\n"
                                            "troupe: i 2\n"
                                            "troupe: warning: w 3\n"
                                            "troupe: error: e 4\n"
                                            "troupe: i again\n"
                                            "troupe: debug: d2\n");
}

static void test_log_env_invalid_is_named_once(void **state)
{
    /* one warning naming the variable, the value and the accepted names; then info (until the
     * config's level, which an invalid variable does not override) */
    assert_string_equal(run_child("loud"),
                        "troupe: warning: TROUPE_LOG_LEVEL: 'loud' is not a log level (expected "
                        "debug, info, warning, error or off); using info\n"
                        "troupe: i 2\n"
                        "troupe: warning: w 3\n"
                        "troupe: error: e 4\n"
                        "troupe: i again\n"
                        "troupe: debug: d2\n");
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--child") == 0) return child_main();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_levels_filter_lines),
        cmocka_unit_test(test_log_level_names_parse),
        cmocka_unit_test(test_log_long_line_is_not_cut),
        cmocka_unit_test(test_log_concurrent_writers_write_whole_lines),
        cmocka_unit_test(test_log_null_sink_restores_stderr),
        cmocka_unit_test(test_log_env_sets_the_level),
        cmocka_unit_test(test_log_env_invalid_is_named_once),
    };
    return cmocka_run_group_tests_name("log", tests, NULL, NULL);
}
