/* Checkpoint files: round trip, every truncation and every corrupted byte refused with a
 * clear error, `latest` validated, a process killed between file writes leaves the
 * previous file and `latest` intact, and the temporary file of a process killed in the middle
 * of a write is removed by the next clean of that folder (a live writer's is kept). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "io/ckpt_file.h"
#include "base/crc32c.h"
#include "base/file.h"
#include "troupe/aio.h"
#include "troupe/error.h"

static char dir[256];
static char err[512];

static int setup(void **state)
{
    snprintf(dir, sizeof(dir), "/tmp/tr_ckpt_test.XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd);
}

static void path_of(char *out, const char *name)
{
    assert_int_equal(tr__path_join(out, 512, dir, name), 0);
}

static void write_sample(const char *path, unsigned char fill, size_t n)
{
    unsigned char *a = malloc(n), hdr[5] = {0x93, 1, 2, 3, 0xc0};
    memset(a, fill, n);
    tr_ckpt_blob_t blobs[2] = {{a, n / 2}, {a + n / 2, n - n / 2}};
    assert_int_equal(tr__ckpt_file_write(path, hdr, sizeof(hdr), blobs, 2, err, sizeof(err)), 0);
    free(a);
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *m = malloc(*len + 1);
    assert_int_equal(fread(m, 1, *len, f), *len);
    fclose(f);
    return m;
}

/* An image written through the aio engine (two I/O threads, O_DIRECT for its aligned part)
 * is byte for byte the file tr__ckpt_file_write writes, at sizes around the alignment. */
static void test_ckpt_image_through_aio_is_the_same_file(void **state)
{
    tr_aio_options_t o;
    tr_aio_options_default(&o);
    o.block_size = 4096;
    o.intra_op_parallelism = 2;
    tr_aio_t *aio;
    assert_int_equal(tr_aio_create(&o, &aio, err, sizeof(err)), 0);
    const size_t sizes[] = {0, 1000, 8192 - 72, 3 * 4096 + 17, (1 << 20) + 5};
    tr_ckpt_image_t im = {0};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        char plain[512], viaaio[512];
        path_of(plain, "plain.bin");
        path_of(viaaio, "aio.bin");
        size_t n = sizes[k];
        unsigned char *a = malloc(n + 1), hdr[3] = {0x92, 7, 9};
        for (size_t i = 0; i < n; i++)
            a[i] = (unsigned char)(i * 131 + k);
        tr_ckpt_blob_t blob = {a, n};
        assert_int_equal(tr__ckpt_file_write(plain, hdr, sizeof(hdr), &blob, 1, err, sizeof(err)),
                         0);
        assert_int_equal(tr__ckpt_image_begin(&im, hdr, sizeof(hdr), n, err, sizeof(err)), 0);
        if (n) memcpy(tr__ckpt_image_payload(&im), a, n);
        tr__ckpt_image_end(&im);
        assert_int_equal(tr__ckpt_image_write(&im, aio, viaaio, err, sizeof(err)), 0);
        size_t la, lb;
        unsigned char *fa = slurp(plain, &la), *fb = slurp(viaaio, &lb);
        assert_int_equal(la, lb);
        assert_memory_equal(fa, fb, la);
        tr_ckpt_file_t f;
        assert_int_equal(tr__ckpt_file_read(viaaio, &f, err, sizeof(err)), 0);
        assert_int_equal(f.payload_len, n);
        tr__ckpt_file_free(&f);
        free(fa);
        free(fb);
        free(a);
    }
    tr__ckpt_image_free(&im);
    tr_aio_destroy(aio);
}

static void test_crc32c_standard_check_value(void **state)
{
    assert_int_equal(tr__crc32c(0, "123456789", 9), 0xE3069283u);
    /* incremental equals one shot */
    assert_int_equal(tr__crc32c(tr__crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
}

static void test_ckpt_file_round_trip(void **state)
{
    char path[512];
    path_of(path, "model.bin");
    write_sample(path, 0x5a, 1000);
    tr_ckpt_file_t f;
    assert_int_equal(tr__ckpt_file_read(path, &f, err, sizeof(err)), 0);
    assert_int_equal(f.header_len, 5);
    assert_int_equal(((const unsigned char *)f.header)[0], 0x93);
    assert_int_equal(f.payload_len, 1000);
    assert_int_equal((uintptr_t)f.payload % 64, 0);
    for (size_t i = 0; i < 1000; i++)
        assert_int_equal(((const unsigned char *)f.payload)[i], 0x5a);
    tr__ckpt_file_free(&f);
}

/* The header alone: the same header and payload length as a whole read, no payload; a
 * truncated file is refused by its lengths (the CRC, over the payload, is not checked). */
static void test_ckpt_file_header_alone(void **state)
{
    char path[512];
    path_of(path, "optim.bin");
    write_sample(path, 0x33, 1000);
    tr_ckpt_file_t f;
    assert_int_equal(tr__ckpt_file_read_header(path, &f, err, sizeof(err)), 0);
    assert_int_equal(f.header_len, 5);
    assert_int_equal(((const unsigned char *)f.header)[4], 0xc0);
    assert_int_equal(f.payload_len, 1000);
    assert_null(f.payload);
    tr__ckpt_file_free(&f);
    assert_int_equal(truncate(path, 500), 0);
    assert_int_equal(tr__ckpt_file_read_header(path, &f, err, sizeof(err)), TR_EFORMAT);
    assert_non_null(strstr(err, "length"));
    path_of(path, "missing.bin");
    assert_int_equal(tr__ckpt_file_read_header(path, &f, err, sizeof(err)), -ENOENT);
    assert_non_null(strstr(err, "cannot open"));
}

static size_t file_size(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (size_t)st.st_size;
}

static void test_ckpt_file_every_truncation_is_refused(void **state)
{
    char path[512], cut[512];
    path_of(path, "full.bin");
    path_of(cut, "cut.bin");
    write_sample(path, 1, 300);
    size_t n = file_size(path);
    FILE *in = fopen(path, "rb");
    unsigned char *buf = malloc(n);
    assert_int_equal(fread(buf, 1, n, in), n);
    fclose(in);
    for (size_t len = 0; len < n; len++) {
        FILE *out = fopen(cut, "wb");
        fwrite(buf, 1, len, out);
        fclose(out);
        tr_ckpt_file_t f;
        int rc = tr__ckpt_file_read(cut, &f, err, sizeof(err));
        assert_true(rc == TR_EFORMAT || rc == TR_ECHECKSUM);
        assert_non_null(strstr(err, cut)); /* the error names the file */
    }
    free(buf);
}

static void test_ckpt_file_corruption_is_refused(void **state)
{
    char path[512];
    path_of(path, "flip.bin");
    write_sample(path, 7, 200);
    size_t n = file_size(path);
    for (size_t at = 0; at < n; at += 3) {
        write_sample(path, 7, 200);
        int fd = open(path, O_RDWR);
        unsigned char b;
        assert_int_equal(pread(fd, &b, 1, (off_t)at), 1);
        b ^= 0x10;
        assert_int_equal(pwrite(fd, &b, 1, (off_t)at), 1);
        close(fd);
        tr_ckpt_file_t f;
        int rc = tr__ckpt_file_read(path, &f, err, sizeof(err));
        assert_true(rc == TR_EFORMAT || rc == TR_ECHECKSUM);
    }
    tr_ckpt_file_t f;
    path_of(path, "missing.bin");
    assert_int_equal(tr__ckpt_file_read(path, &f, err, sizeof(err)), TR_ENOENT);
    assert_int_equal(tr__ckpt_file_read(dir, &f, err, sizeof(err)), TR_EFORMAT); /* a dir */
}

static void test_ckpt_latest_round_trip_and_validation(void **state)
{
    char tag[64];
    assert_int_equal(tr__ckpt_latest_read(dir, tag, sizeof(tag), err, sizeof(err)), TR_ENOENT);
    assert_int_equal(tr__ckpt_latest_write(dir, "global_step10", err, sizeof(err)), 0);
    assert_int_equal(tr__ckpt_latest_read(dir, tag, sizeof(tag), err, sizeof(err)), 0);
    assert_string_equal(tag, "global_step10");
    assert_int_equal(tr__ckpt_latest_write(dir, "../etc", err, sizeof(err)), 0);
    assert_int_equal(tr__ckpt_latest_read(dir, tag, sizeof(tag), err, sizeof(err)), TR_EFORMAT);
    assert_non_null(strstr(err, "not a directory name"));
    assert_int_equal(tr__ckpt_latest_write(dir, "", err, sizeof(err)), 0);
    assert_int_equal(tr__ckpt_latest_read(dir, tag, sizeof(tag), err, sizeof(err)), TR_EFORMAT);
}

static void test_ckpt_crash_between_files_keeps_previous(void **state)
{
    char a[512], b[512], tag[64];
    path_of(a, "a.bin");
    path_of(b, "b.bin");
    write_sample(a, 1, 100); /* the previous checkpoint: a.bin, latest = old */
    write_sample(b, 1, 100);
    assert_int_equal(tr__ckpt_latest_write(dir, "old", err, sizeof(err)), 0);
    pid_t pid = fork();
    if (pid == 0) { /* a new save that dies after its first file */
        setenv("TR_CKPT_CRASH_AFTER", "1", 1);
        write_sample(a, 2, 100);
        write_sample(b, 2, 100);
        tr__ckpt_latest_write(dir, "new", err, sizeof(err));
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), TR_CKPT_CRASH_EXIT);
    assert_int_equal(tr__ckpt_latest_read(dir, tag, sizeof(tag), err, sizeof(err)), 0);
    assert_string_equal(tag, "old");
    tr_ckpt_file_t f;
    assert_int_equal(tr__ckpt_file_read(b, &f, err, sizeof(err)), 0); /* untouched, whole */
    assert_int_equal(((const unsigned char *)f.payload)[0], 1);
    tr__ckpt_file_free(&f);
    assert_int_equal(tr__ckpt_file_read(a, &f, err, sizeof(err)), 0); /* new, but whole */
    tr__ckpt_file_free(&f);
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* A child writes a 1 MiB checkpoint file under a 4 KiB file-size limit: SIGXFSZ kills it in
 * the middle of the write, as a kill during a save would, leaving "<path>.tmp.<its pid>". */
static pid_t killed_writer(const char *path, char *tmp)
{
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit r = {4096, 4096};
        setrlimit(RLIMIT_FSIZE, &r);
        size_t n = 1 << 20;
        void *a = calloc(1, n);
        tr_ckpt_blob_t blob = {a, n};
        tr__ckpt_file_write(path, "h", 1, &blob, 1, err, sizeof(err));
        _exit(0); /* not reached: the write past 4 KiB raises SIGXFSZ */
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGXFSZ);
    snprintf(tmp, 600, "%s.tmp.%d", path, (int)pid);
    return pid;
}

static void test_ckpt_clean_tmp_removes_only_dead_writers_files(void **state)
{
    char tag[512], model[600], latest[600], dead[600], dead_top[600], live[600], other[600];
    path_of(tag, "global_step5");
    assert_int_equal(mkdir(tag, 0755), 0);
    snprintf(model, sizeof(model), "%s/model_states.trck", tag);
    killed_writer(model, dead);
    assert_true(exists(dead));
    path_of(latest, "latest");
    killed_writer(latest, dead_top);
    assert_true(exists(dead_top));
    /* a live process's temporary file (this one's: it may be writing) and a name that is not
     * a checkpoint writer's stay */
    snprintf(live, sizeof(live), "%s/optim_states_rank0.trck.tmp.%d", tag, (int)getpid());
    snprintf(other, sizeof(other), "%s/notes.tmp.1", tag);
    fclose(fopen(live, "w"));
    fclose(fopen(other, "w"));
    uint64_t bytes = 0;
    assert_int_equal(tr__ckpt_clean_tmp(dir, &bytes), 2);
    assert_true(bytes >= 4096); /* what the killed model writer had written */
    assert_false(exists(dead));
    assert_false(exists(dead_top));
    assert_true(exists(live));
    assert_true(exists(other));
    assert_int_equal(tr__ckpt_clean_tmp(dir, NULL), 0);
    char missing[512];
    path_of(missing, "no/such/dir");
    assert_int_equal(tr__ckpt_clean_tmp(missing, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_standard_check_value),
        cmocka_unit_test_setup_teardown(test_ckpt_file_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_file_header_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_image_through_aio_is_the_same_file, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_file_every_truncation_is_refused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_file_corruption_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_latest_round_trip_and_validation, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_crash_between_files_keeps_previous, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ckpt_clean_tmp_removes_only_dead_writers_files, setup,
                                        teardown),
    };
    return cmocka_run_group_tests_name("ckpt_file", tests, NULL, NULL);
}
