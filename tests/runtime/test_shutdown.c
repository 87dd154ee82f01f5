/* Ending cleanly: a pinned actor whose thread cannot be created fails its spawn with the
 * reason and leaves a runtime that runs and closes; and the signal rule (troupe/runtime.h):
 * one SIGTERM always ends the process (a graceful stop, then exit after the grace period), a
 * second signal exits at once, and so does a signal when no actor is alive.
 *
 * Each case runs in a fresh process (this binary again, with --child <case>), so a hang or
 * an exit is observed from outside, with a deadline. */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1 /* their shadow memory cannot live under RLIMIT_AS */
#else
#define UNDER_SANITIZER 0
#endif
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#else
#define UNDER_TSAN 0
#endif

/* --- the children ------------------------------------------------------------------------ */

static int ignores_stop(tr_ctx_t *ctx, tr_msg_t *msg)
{
    return 0; /* spawned with defer_stop and never calls tr_actor_stop: a stuck stop */
}

static int plain(tr_ctx_t *ctx, tr_msg_t *msg)
{
    return 0; /* stops after TR_MSG_STOP */
}

static size_t vm_bytes(void)
{
    unsigned long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%lu", &pages) != 1) pages = 0;
    if (f) fclose(f);
    return pages * (size_t)sysconf(_SC_PAGESIZE);
}

/* A pinned spawn under an address-space limit that leaves no room for a thread's stack. */
static int child_pinned_no_thread(void)
{
    tr_runtime_t *rt;
    if (tr_runtime_init(&rt, &(tr_runtime_opts_t){.n_workers = 2}) < 0) return 3;
    tr_actor_t by, ex;
    if (tr_actor_spawn(rt, plain, NULL, &(tr_actor_opts_t){.name = "bystander"}, &by) < 0) return 4;
    struct rlimit old, low;
    getrlimit(RLIMIT_AS, &old);
    low = old;
    low.rlim_cur = vm_bytes() + (1u << 20); /* 1 MiB: less than any thread stack */
    if (setrlimit(RLIMIT_AS, &low) < 0) return 5;
    tr_actor_opts_t o = {.name = "executor", .pinned = 1};
    int rc = tr_actor_spawn(rt, plain, NULL, &o, &ex);
    setrlimit(RLIMIT_AS, &old);
    printf("spawn=%d why=%s\n", rc, tr_last_error());
    printf("lookup=%s\n", tr_actor_is_none(tr_actor_lookup(rt, "executor")) ? "none" : "some");
    /* the runtime is as before: the name is free, a pinned actor can be had again */
    printf("respawn=%d\n", tr_actor_spawn(rt, plain, NULL, &o, &ex));
    fflush(stdout);
    tr_runtime_shutdown(rt, "test");
    printf("run=%d\n", tr_runtime_run(rt));
    tr_runtime_close(rt);
    printf("closed\n");
    return 0;
}

/* A runtime with handle_signals; `stuck` keeps an actor that never stops. */
static int child_signals(int stuck, unsigned grace_ms, int actors)
{
    tr_runtime_t *rt;
    tr_runtime_opts_t ro = {.n_workers = 1, .handle_signals = 1, .signal_grace_ms = grace_ms};
    if (tr_runtime_init(&rt, &ro) < 0) return 3;
    tr_actor_t a;
    tr_actor_opts_t o = {.name = "trainer", .defer_stop = stuck};
    if (actors && tr_actor_spawn(rt, stuck ? ignores_stop : plain, NULL, &o, &a) < 0) return 4;
    printf("ready\n");
    fflush(stdout);
    if (!actors) {
        for (int i = 0; i < 300; i++) /* the signal must end this (a sleep it interrupts */
            usleep(100000);           /* on this thread goes on) */
        return 5;
    }
    int rc = tr_runtime_run(rt);
    tr_runtime_close(rt);
    printf("run=%d\n", rc);
    return 0;
}

static int child_main(const char *which)
{
    if (strcmp(which, "pinned") == 0) return child_pinned_no_thread();
    if (strcmp(which, "graceful") == 0) return child_signals(0, 0, 1);
    if (strcmp(which, "stuck") == 0) return child_signals(1, 300, 1);
    if (strcmp(which, "stuck-long") == 0) return child_signals(1, 60000, 1);
    if (strcmp(which, "idle") == 0) return child_signals(0, 60000, 0);
    return 2;
}

/* --- the parent: run a child, signal it, watch it end ------------------------------------- */

typedef struct child {
    pid_t pid;
    int out; /* the child's stdout and stderr */
    char text[8192];
    size_t len;
    int status;
} child_t;

static double now_s(void)
{
    return (double)tr_now_ns() * 1e-9;
}

static void start_child(child_t *c, const char *which)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    memset(c, 0, sizeof(*c));
    c->pid = fork();
    assert_true(c->pid >= 0);
    if (c->pid == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        unsetenv("TROUPE_LOG_LEVEL");
        execl("/proc/self/exe", "test_shutdown", "--child", which, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    c->out = p[0];
}

/* Reads the child's output until `want` appears (NULL: until EOF) or seconds pass. */
static bool read_until(child_t *c, const char *want, double seconds)
{
    double end = now_s() + seconds;
    for (;;) {
        if (want && strstr(c->text, want)) return true;
        double left = end - now_s();
        if (left <= 0) return false;
        struct pollfd pfd = {c->out, POLLIN, 0};
        if (poll(&pfd, 1, (int)(left * 1000) + 1) <= 0) continue;
        ssize_t r = read(c->out, c->text + c->len, sizeof(c->text) - 1 - c->len);
        if (r <= 0) return want == NULL;
        c->len += (size_t)r;
        c->text[c->len] = '\0';
    }
}

/* Waits for the child to end within seconds; kills it (and fails) if it does not. */
static void wait_child(child_t *c, double seconds)
{
    bool eof = read_until(c, NULL, seconds);
    if (!eof) kill(c->pid, SIGKILL);
    waitpid(c->pid, &c->status, 0);
    close(c->out);
    if (!eof)
        fail_msg("the child did not end within %.0f s (a hang); it said:\n%s", seconds, c->text);
}

static int exit_code(const child_t *c)
{
    return WIFEXITED(c->status) ? WEXITSTATUS(c->status) : 1000 + WTERMSIG(c->status);
}

static void test_shutdown_pinned_thread_failure_is_clean(void **state)
{
    if (UNDER_SANITIZER) skip();
    child_t c;
    start_child(&c, "pinned");
    wait_child(&c, 20);
    assert_int_equal(exit_code(&c), 0);
    char want[160];
    snprintf(want, sizeof(want),
             "spawn=%d why=cannot spawn actor 'executor': cannot create its "
             "thread: %s\n",
             TR_EAGAIN, tr_strerror(TR_EAGAIN));
    if (!strstr(c.text, want)) fail_msg("expected '%s' in:\n%s", want, c.text);
    assert_non_null(strstr(c.text, "lookup=none\n"));
    assert_non_null(strstr(c.text, "respawn=0\n"));
    assert_non_null(strstr(c.text, "run=0\n"));
    assert_non_null(strstr(c.text, "closed\n"));
}

/* Under ThreadSanitizer a child loses the signal about once in 30 runs of this file, in any
 * of the cases below (never in 200 runs of the plain build): with every runtime thread blocking
 * it, gdb shows main waiting inside a TSan interceptor, nothing pending anywhere and no byte in
 * libuv's signal pipe. TSan defers and redelivers signals itself (LLVM issues 83561, 83844 are
 * of this kind), so these cases run in the plain and ASan builds only. */
static void skip_signals_under_tsan(void)
{
    if (UNDER_TSAN) skip();
}

static void test_shutdown_one_sigterm_stops_gracefully(void **state)
{
    skip_signals_under_tsan();
    child_t c;
    start_child(&c, "graceful");
    assert_true(read_until(&c, "ready\n", 20));
    kill(c.pid, SIGTERM);
    wait_child(&c, 20);
    assert_int_equal(exit_code(&c), 0);
    assert_non_null(strstr(c.text, "troupe: SIGTERM received: stopping gracefully"));
    assert_non_null(strstr(c.text, "run=0\n"));
}

static void test_shutdown_one_sigterm_ends_a_stuck_stop(void **state)
{
    skip_signals_under_tsan();
    child_t c;
    start_child(&c, "stuck");
    assert_true(read_until(&c, "ready\n", 20));
    double t0 = now_s();
    kill(c.pid, SIGTERM); /* once: the actor never stops, the grace period (300 ms) ends it */
    wait_child(&c, 20);
    assert_int_equal(exit_code(&c), 128 + SIGTERM);
    assert_true(now_s() - t0 >= 0.25);
    assert_non_null(strstr(c.text, "troupe: SIGTERM received: stopping gracefully"));
    assert_non_null(strstr(c.text, "troupe: error: SIGTERM: the graceful stop did not end the "
                                   "process within 300 ms: exiting now"));
}

static void test_shutdown_second_signal_exits_at_once(void **state)
{
    skip_signals_under_tsan();
    child_t c;
    start_child(&c, "stuck-long"); /* a 60 s grace period */
    assert_true(read_until(&c, "ready\n", 20));
    kill(c.pid, SIGTERM);
    assert_true(read_until(&c, "stopping gracefully", 20));
    double t0 = now_s();
    kill(c.pid, SIGINT);
    wait_child(&c, 20);
    assert_true(now_s() - t0 < 10);
    assert_int_equal(exit_code(&c), 128 + SIGINT);
    assert_non_null(strstr(c.text, "troupe: warning: second SIGINT: exiting now"));
}

static void test_shutdown_signal_with_no_actor_exits(void **state)
{
    skip_signals_under_tsan();
    child_t c;
    start_child(&c, "idle");
    assert_true(read_until(&c, "ready\n", 20));
    kill(c.pid, SIGTERM);
    wait_child(&c, 20);
    assert_int_equal(exit_code(&c), 128 + SIGTERM);
    assert_non_null(strstr(c.text, "SIGTERM received and no actor is running: exiting now"));
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "--child") == 0) return child_main(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shutdown_pinned_thread_failure_is_clean),
        cmocka_unit_test(test_shutdown_one_sigterm_stops_gracefully),
        cmocka_unit_test(test_shutdown_one_sigterm_ends_a_stuck_stop),
        cmocka_unit_test(test_shutdown_second_signal_exits_at_once),
        cmocka_unit_test(test_shutdown_signal_with_no_actor_exits),
    };
    return cmocka_run_group_tests_name("shutdown", tests, NULL, NULL);
}
