/* test_aio.c: the libaio engine. Round trips at random sizes, offsets and buffer addresses
 * (the seed is printed; TR_TEST_SEED replays one), the intra-op split, sliding window against
 * lock-step, and faults injected through the linker's --wrap of io_submit, io_getevents,
 * open and mlock (see tests/io/CMakeLists.txt). */
#include <errno.h>
#include <fcntl.h>
#include <libaio.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "troupe/aio.h"
#include "troupe/error.h"
#include "troupe/log.h"

/* ---- injected faults ---------------------------------------------------------------- */

static struct {
    int submit_eagain;   /* io_submit calls still to refuse with EAGAIN */
    int getevents_eintr; /* io_getevents calls still to fail with EINTR */
    int short_events;    /* events still to report as half done */
    int eio_events;      /* events still to report as EIO */
    int open_einval;     /* refuse O_DIRECT at open */
    int mlock_fail;
    int submits, getevents_calls, max_min_nr;
    pthread_t submitters[8];
    int nsubmitters;
} fault;
static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;

int __real_io_submit(io_context_t ctx, long nr, struct iocb *ios[]);
int __real_io_getevents(io_context_t ctx, long min_nr, long nr, struct io_event *events,
                        struct timespec *timeout);
int __real_open(const char *path, int flags, ...);
int __real_mlock(const void *addr, size_t len);

int __wrap_io_submit(io_context_t ctx, long nr, struct iocb *ios[])
{
    pthread_mutex_lock(&fault_mu);
    fault.submits++;
    int seen = 0;
    for (int i = 0; i < fault.nsubmitters; i++)
        seen |= pthread_equal(fault.submitters[i], pthread_self());
    if (!seen && fault.nsubmitters < 8) fault.submitters[fault.nsubmitters++] = pthread_self();
    int refuse = fault.submit_eagain > 0 ? fault.submit_eagain-- : 0;
    pthread_mutex_unlock(&fault_mu);
    return refuse ? -EAGAIN : __real_io_submit(ctx, nr, ios);
}

int __wrap_io_getevents(io_context_t ctx, long min_nr, long nr, struct io_event *events,
                        struct timespec *timeout)
{
    pthread_mutex_lock(&fault_mu);
    fault.getevents_calls++;
    if (min_nr > fault.max_min_nr) fault.max_min_nr = (int)min_nr;
    int eintr = fault.getevents_eintr > 0 ? fault.getevents_eintr-- : 0;
    pthread_mutex_unlock(&fault_mu);
    if (eintr) return -EINTR;
    int n = __real_io_getevents(ctx, min_nr, nr, events, timeout);
    pthread_mutex_lock(&fault_mu);
    for (int i = 0; i < n; i++) {
        struct iocb *cb = events[i].obj;
        if (fault.eio_events > 0) {
            fault.eio_events--;
            events[i].res = (unsigned long)(long)-EIO;
        } else if (fault.short_events > 0 && cb->u.c.nbytes >= 8192 &&
                   events[i].res == cb->u.c.nbytes) {
            fault.short_events--;
            events[i].res = cb->u.c.nbytes / 2 / 4096 * 4096;
        }
    }
    pthread_mutex_unlock(&fault_mu);
    return n;
}

int __wrap_open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    int mode = va_arg(ap, int);
    va_end(ap);
    if (fault.open_einval && (flags & O_DIRECT)) {
        errno = EINVAL;
        return -1;
    }
    return __real_open(path, flags, mode);
}

int __wrap_mlock(const void *addr, size_t len)
{
    if (fault.mlock_fail) {
        errno = ENOMEM;
        return -1;
    }
    return __real_mlock(addr, len);
}

/* ---- helpers ------------------------------------------------------------------------ */

static char dir[] = "/tmp/test_aio_XXXXXX";
static unsigned seed;
static int warnings;
static char last_warning[1024];

static void count_warnings(void *user, int level, const char *line)
{
    (void)user;
    if (level == TR_LOG_WARN) {
        warnings++;
        snprintf(last_warning, sizeof last_warning, "%s", line);
    }
}

static int setup(void **state)
{
    (void)state;
    memset(&fault, 0, sizeof fault);
    warnings = 0;
    tr_log_set_sink(count_warnings, NULL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tr_log_set_sink(NULL, NULL);
    memset(&fault, 0, sizeof fault);
    return 0;
}

static void path_of(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", dir, name);
}

static tr_aio_t *engine(size_t block, int depth, int threads, int single, int overlap)
{
    tr_aio_options_t o;
    tr_aio_options_default(&o);
    o.block_size = block;
    o.queue_depth = depth;
    o.intra_op_parallelism = threads;
    o.single_submit = single;
    o.overlap_events = overlap;
    tr_aio_t *aio = NULL;
    char why[256];
    int rc = tr_aio_create(&o, &aio, why, sizeof why);
    if (rc) fail_msg("tr_aio_create: %s", why);
    return aio;
}

static tr_aio_file_t *open_file(tr_aio_t *aio, const char *name, int flags)
{
    char path[256], why[512];
    path_of(path, sizeof path, name);
    tr_aio_file_t *f = NULL;
    if (tr_aio_open(aio, path, flags, &f, why, sizeof why)) fail_msg("tr_aio_open: %s", why);
    return f;
}

static void fill_random(unsigned char *p, size_t n, unsigned *s)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(rand_r(s) >> 7);
}

static void write_sync(tr_aio_t *aio, tr_aio_file_t *f, const void *p, size_t n, uint64_t off)
{
    char why[512];
    if (tr_aio_pwrite_sync(aio, f, p, n, off, why, sizeof why)) fail_msg("pwrite_sync: %s", why);
}

static void read_sync(tr_aio_t *aio, tr_aio_file_t *f, void *p, size_t n, uint64_t off)
{
    char why[512];
    if (tr_aio_pread_sync(aio, f, p, n, off, why, sizeof why)) fail_msg("pread_sync: %s", why);
}

/* ---- round trips ------------------------------------------------------------------------ */

#define FILE_MAX (4u << 20)

/* Random writes then random reads, each at a random offset, size and buffer shift, checked
 * against an image of the file kept in memory. */
static void round_trips(tr_aio_t *aio, const char *name, unsigned s)
{
    tr_aio_file_t *f = open_file(aio, name, TR_AIO_READ | TR_AIO_WRITE | TR_AIO_CREATE);
    unsigned char *image = calloc(1, FILE_MAX), *buf = NULL;
    assert_int_equal(tr_aio_buffer_alloc(aio, FILE_MAX + 4096, (void **)&buf), 0);
    size_t size = 0;
    for (int i = 0; i < 60; i++) {
        int aligned = rand_r(&s) % 3 == 0;
        size_t shift = aligned ? 0 : (size_t)(rand_r(&s) % 64);
        size_t n = 1 + (size_t)rand_r(&s) % (FILE_MAX / 4);
        uint64_t off = (uint64_t)rand_r(&s) % (FILE_MAX - n);
        if (aligned) {
            n = (n + 4095) / 4096 * 4096;
            off = off / 4096 * 4096;
            if (off + n > FILE_MAX) off = FILE_MAX - n;
        }
        int write = i < 20 || rand_r(&s) % 2 || size == 0;
        if (write) {
            fill_random(buf + shift, n, &s);
            write_sync(aio, f, buf + shift, n, off);
            memcpy(image + off, buf + shift, n);
            if (off + n > size) size = off + n;
            continue;
        }
        if (off + n > size) n = (size_t)(size - off > 0 && off < size ? size - off : 0);
        if (n == 0) continue;
        read_sync(aio, f, buf + shift, n, off);
        if (memcmp(buf + shift, image + off, n))
            fail_msg("read %zu bytes at %llu (shift %zu) differ from what was written (seed %u)", n,
                     (unsigned long long)off, shift, seed);
    }
    struct stat st;
    char path[256];
    path_of(path, sizeof path, name);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal((size_t)st.st_size, size); /* unaligned writes never pad the file */
    tr_aio_buffer_free(aio, buf, FILE_MAX + 4096);
    free(image);
    tr_aio_close(f);
}

static void test_aio_round_trips_at_random_sizes_and_offsets(void **state)
{
    (void)state;
    tr_aio_t *aio = engine(65536, 4, 1, 0, 1);
    round_trips(aio, "random", seed);
    tr_aio_destroy(aio);
}

static void test_aio_reads_what_pwrite_wrote(void **state)
{
    (void)state;
    unsigned s = seed + 1;
    char path[256];
    path_of(path, sizeof path, "posix");
    size_t n = 3 * 1000 * 1000 + 17;
    unsigned char *data = malloc(n), *back = malloc(n);
    fill_random(data, n, &s);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, data, n, 0), (ssize_t)n);
    close(fd);
    tr_aio_t *aio = engine(131072, 8, 1, 0, 1);
    tr_aio_file_t *f = open_file(aio, "posix", TR_AIO_READ);
    assert_true(tr_aio_file_direct(f));
    for (int i = 0; i < 20; i++) {
        uint64_t off = (uint64_t)rand_r(&s) % n;
        size_t len = 1 + (size_t)rand_r(&s) % (n - off);
        read_sync(aio, f, back, len, off);
        assert_memory_equal(back, data + off, len);
    }
    read_sync(aio, f, back, n, 0);
    assert_memory_equal(back, data, n);
    char why[512];
    assert_int_equal(tr_aio_pread_sync(aio, f, back, 4096, n - 100, why, sizeof why), TR_ERANGE);
    assert_non_null(strstr(why, "ends at byte 3000017"));
    tr_aio_close(f);
    tr_aio_destroy(aio);
    free(data);
    free(back);
}

/* ---- intra-op parallelism ------------------------------------------------------------- */

static void test_aio_intra_op_split_moves_a_share_per_thread(void **state)
{
    (void)state;
    tr_aio_t *aio = engine(65536, 4, 4, 0, 1);
    tr_aio_file_t *f = open_file(aio, "split", TR_AIO_READ | TR_AIO_WRITE | TR_AIO_CREATE);
    size_t n = 4 * (1u << 20);
    unsigned char *a, *b;
    assert_int_equal(tr_aio_buffer_alloc(aio, n, (void **)&a), 0);
    assert_int_equal(tr_aio_buffer_alloc(aio, n, (void **)&b), 0);
    unsigned s = seed + 2;
    fill_random(a, n, &s);
    write_sync(aio, f, a, n, 8192);
    read_sync(aio, f, b, n, 8192);
    assert_memory_equal(a, b, n);
    assert_int_equal(fault.nsubmitters, 4); /* every thread submitted its share */
    /* 4 shares of 1,000,002 bytes: unaligned slices still round-trip */
    write_sync(aio, f, a + 3, 4000008, 5);
    memset(b, 0, n);
    read_sync(aio, f, b + 1, 4000008, 5);
    assert_memory_equal(a + 3, b + 1, 4000008);
    char why[512];
    assert_int_equal(tr_aio_pwrite_sync(aio, f, a, 1001, 0, why, sizeof why), TR_EINVAL);
    assert_non_null(strstr(why, "size 1001 does not divide by aio.intra_op_parallelism 4"));
    assert_int_equal(tr_aio_pread(aio, f, a, 6, 0, NULL, NULL, why, sizeof why), TR_EINVAL);
    tr_aio_buffer_free(aio, a, n);
    tr_aio_buffer_free(aio, b, n);
    tr_aio_close(f);
    tr_aio_destroy(aio);
}

/* ---- sliding window against lock-step ------------------------------------------------- */

static void write_and_read_with(int single, int overlap, const unsigned char *data, size_t n,
                                unsigned char *back)
{
    memset(&fault, 0, sizeof fault);
    tr_aio_t *aio = engine(16384, 8, 2, single, overlap);
    char name[32];
    snprintf(name, sizeof name, "mode%d%d", single, overlap);
    tr_aio_file_t *f = open_file(aio, name, TR_AIO_READ | TR_AIO_WRITE | TR_AIO_CREATE);
    write_sync(aio, f, data, n, 0);
    memset(back, 0, n);
    read_sync(aio, f, back, n, 0);
    tr_aio_close(f);
    tr_aio_destroy(aio);
    /* lock-step waits for a whole batch; the window for one completion at a time */
    assert_int_equal(fault.max_min_nr, overlap ? 1 : 8);
    if (single) /* one io_submit per iocb: 2 x (n / 2 / 16384) iocbs each way */
        assert_true(fault.submits >= (int)(2 * n / 16384));
}

static void test_aio_window_and_lock_step_give_the_same_bytes(void **state)
{
    (void)state;
    size_t n = 3 << 20;
    unsigned char *data, *back;
    assert_int_equal(posix_memalign((void **)&data, 4096, n), 0);
    assert_int_equal(posix_memalign((void **)&back, 4096, n), 0);
    unsigned s = seed + 3;
    fill_random(data, n, &s);
    for (int single = 0; single < 2; single++)
        for (int overlap = 0; overlap < 2; overlap++) {
            write_and_read_with(single, overlap, data, n, back);
            assert_memory_equal(back, data, n);
        }
    free(data);
    free(back);
}

/* ---- faults ------------------------------------------------------------------------- */

static void test_aio_eagain_eintr_and_short_completions_are_retried(void **state)
{
    (void)state;
    tr_aio_t *aio = engine(65536, 4, 1, 0, 1);
    tr_aio_file_t *f = open_file(aio, "faults", TR_AIO_READ | TR_AIO_WRITE | TR_AIO_CREATE);
    size_t n = 1 << 20;
    unsigned char *a, *b;
    assert_int_equal(tr_aio_buffer_alloc(aio, n, (void **)&a), 0);
    assert_int_equal(tr_aio_buffer_alloc(aio, n, (void **)&b), 0);
    unsigned s = seed + 4;
    fill_random(a, n, &s);
    fault.submit_eagain = 3;
    fault.getevents_eintr = 2;
    fault.short_events = 5;
    write_sync(aio, f, a, n, 0);
    assert_int_equal(fault.submit_eagain, 0);
    assert_int_equal(fault.short_events, 0);
    fault.short_events = 5;
    fault.submit_eagain = 2;
    read_sync(aio, f, b, n, 0);
    assert_int_equal(fault.short_events, 0);
    assert_memory_equal(a, b, n);
    tr_aio_buffer_free(aio, a, n);
    tr_aio_buffer_free(aio, b, n);
    tr_aio_close(f);
    tr_aio_destroy(aio);
}

static void test_aio_eio_is_an_error_naming_file_offset_and_size(void **state)
{
    (void)state;
    tr_aio_t *aio = engine(65536, 4, 1, 0, 1);
    tr_aio_file_t *f = open_file(aio, "eio", TR_AIO_READ | TR_AIO_WRITE | TR_AIO_CREATE);
    size_t n = 1 << 20;
    void *a;
    assert_int_equal(tr_aio_buffer_alloc(aio, n, &a), 0);
    memset(a, 7, n);
    char why[512];
    fault.eio_events = 1;
    assert_int_equal(tr_aio_pwrite_sync(aio, f, a, n, 4096, why, sizeof why), TR_EIO);
    char path[256];
    path_of(path, sizeof path, "eio");
    assert_non_null(strstr(why, path));
    assert_non_null(strstr(why, "pwrite"));
    assert_non_null(strstr(why, "offset 4096, size 65536"));
    assert_non_null(strstr(why, "i/o error"));
    /* the engine is still usable afterwards */
    write_sync(aio, f, a, n, 0);
    tr_aio_buffer_free(aio, a, n);
    tr_aio_close(f);
    tr_aio_destroy(aio);
}

static void test_aio_without_o_direct_falls_back_to_pread_pwrite(void **state)
{
    (void)state;
    tr_aio_t *aio = engine(65536, 4, 1, 0, 1);
    fault.open_einval = 1;
    tr_aio_file_t *f = open_file(aio, "fallback", TR_AIO_READ | TR_AIO_WRITE | TR_AIO_CREATE);
    tr_aio_file_t *g = open_file(aio, "fallback2", TR_AIO_READ | TR_AIO_WRITE | TR_AIO_CREATE);
    assert_false(tr_aio_file_direct(f));
    assert_int_equal(warnings, 1); /* one warning, not one per file */
    assert_non_null(strstr(last_warning, "refuses O_DIRECT"));
    tr_aio_close(g);
    round_trips(aio, "fallback3", seed + 5);
    assert_int_equal(fault.submits, 0); /* nothing went through libaio */
    assert_int_equal(warnings, 1);
    tr_aio_close(f);
    tr_aio_destroy(aio);
}

static void test_aio_mlock_refused_degrades_with_one_warning(void **state)
{
    (void)state;
    tr_aio_t *aio = engine(65536, 4, 1, 0, 1);
    fault.mlock_fail = 1;
    void *a, *b;
    assert_int_equal(tr_aio_buffer_alloc(aio, 100000, &a), 0);
    assert_int_equal(tr_aio_buffer_alloc(aio, 100000, &b), 0);
    assert_int_equal((uintptr_t)a % 4096, 0);
    assert_int_equal(warnings, 1);
    assert_non_null(strstr(last_warning, "RLIMIT_MEMLOCK"));
    tr_aio_buffer_free(aio, a, 100000);
    tr_aio_buffer_free(aio, b, 100000);
    tr_aio_destroy(aio);
}

/* ---- asynchronous completions ---------------------------------------------------------- */

typedef struct done {
    int calls, status;
} done_t;

static void on_done(void *user, int status, const char *why)
{
    done_t *d = user;
    d->calls++;
    if (status && !d->status) d->status = status;
    assert_true(status ? why[0] != 0 : why[0] == 0);
}

static void test_aio_completions_wake_the_eventfd_and_run_callbacks(void **state)
{
    (void)state;
    tr_aio_t *aio = engine(65536, 4, 2, 0, 1);
    tr_aio_file_t *f = open_file(aio, "async", TR_AIO_READ | TR_AIO_WRITE | TR_AIO_CREATE);
    size_t n = 1 << 20;
    unsigned char *a, *b;
    assert_int_equal(tr_aio_buffer_alloc(aio, 8 * n, (void **)&a), 0);
    assert_int_equal(tr_aio_buffer_alloc(aio, 8 * n, (void **)&b), 0);
    unsigned s = seed + 6;
    fill_random(a, 8 * n, &s);
    done_t d = {0, 0};
    char why[256];
    for (int i = 0; i < 8; i++)
        assert_int_equal(tr_aio_pwrite(aio, f, a + i * n, n, i * n, on_done, &d, why, sizeof why),
                         0);
    assert_int_equal(tr_aio_wait(aio), 8);
    assert_int_equal(d.calls, 8);
    assert_int_equal(d.status, 0);
    for (int i = 0; i < 8; i++)
        assert_int_equal(tr_aio_pread(aio, f, b + i * n, n, i * n, on_done, &d, why, sizeof why),
                         0);
    int ran = 0;
    while (ran < 8) {
        struct pollfd p = {.fd = tr_aio_fd(aio), .events = POLLIN};
        assert_int_equal(poll(&p, 1, 10000), 1); /* blocks until a request finishes */
        ran += tr_aio_poll(aio);
    }
    assert_int_equal(d.calls, 16);
    assert_memory_equal(a, b, 8 * n);
    struct pollfd p = {.fd = tr_aio_fd(aio), .events = POLLIN};
    assert_int_equal(poll(&p, 1, 0), 0); /* drained: not readable any more */
    tr_aio_buffer_free(aio, a, 8 * n);
    tr_aio_buffer_free(aio, b, 8 * n);
    tr_aio_close(f);
    tr_aio_destroy(aio);
}

static void test_aio_options_out_of_range_are_named(void **state)
{
    (void)state;
    tr_aio_options_t o;
    tr_aio_options_default(&o);
    o.block_size = 1000;
    tr_aio_t *aio = NULL;
    char why[256];
    assert_int_equal(tr_aio_create(&o, &aio, why, sizeof why), TR_EINVAL);
    assert_non_null(strstr(why, "aio.block_size is 1000"));
    tr_aio_options_default(&o);
    o.queue_depth = 0;
    assert_int_equal(tr_aio_create(&o, &aio, why, sizeof why), TR_EINVAL);
    assert_non_null(strstr(why, "aio.queue_depth"));
    assert_null(aio);
    tr_aio_destroy(NULL);
}

int main(void)
{
    const char *env = getenv("TR_TEST_SEED");
    seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    printf("test_aio: seed %u (TR_TEST_SEED=%u replays it)\n", seed, seed);
    if (!mkdtemp(dir)) return 1;
    const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
        T(test_aio_round_trips_at_random_sizes_and_offsets),
        T(test_aio_reads_what_pwrite_wrote),
        T(test_aio_intra_op_split_moves_a_share_per_thread),
        T(test_aio_window_and_lock_step_give_the_same_bytes),
        T(test_aio_eagain_eintr_and_short_completions_are_retried),
        T(test_aio_eio_is_an_error_naming_file_offset_and_size),
        T(test_aio_without_o_direct_falls_back_to_pread_pwrite),
        T(test_aio_mlock_refused_degrades_with_one_warning),
        T(test_aio_completions_wake_the_eventfd_and_run_callbacks),
        T(test_aio_options_out_of_range_are_named),
#undef T
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "test_aio: could not remove %s\n", dir);
    return failed;
}
