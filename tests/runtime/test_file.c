/* base/file.c: whole-file reads (content, spare bytes, alignment, refusals with the path named)
 * and path joins (slashes, empty folders, truncation). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/file.h"
#include "troupe/error.h"

static void write_file(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
}

static void test_file_read_whole_with_spare_bytes(void **state)
{
    char path[] = "/tmp/tr_test_file_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(path, "{\"a\": 1}", 8);
    char *buf, err[256];
    size_t len;
    assert_int_equal(tr__file_read(path, 0, "a JSON file", &buf, &len, err, sizeof(err)), 0);
    assert_int_equal(len, 8);
    assert_memory_equal(buf, "{\"a\": 1}", 8);
    assert_int_equal(buf[8], '\0');
    assert_int_equal((uintptr_t)buf % 64, 0);
    memset(buf + 8, 'x', TR__FILE_SPARE); /* the spare bytes are the caller's */
    free(buf);

    write_file(path, "", 0);
    assert_int_equal(tr__file_read(path, 0, "a JSON file", &buf, &len, err, sizeof(err)), 0);
    assert_int_equal(len, 0);
    free(buf);
    unlink(path);
}

static void test_file_read_refusals_name_the_path(void **state)
{
    char path[] = "/tmp/tr_test_file_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(path, "0123456789", 10);
    char *buf = (char *)1, err[256], want[300];
    size_t len;
    assert_int_equal(tr__file_read(path, 9, "a JSON file", &buf, &len, err, sizeof(err)),
                     TR_EFORMAT);
    assert_null(buf);
    snprintf(want, sizeof(want), "%s: larger than 9 bytes, expected a JSON file", path);
    assert_string_equal(err, want);
    assert_int_equal(tr__file_read(path, 10, "a JSON file", &buf, &len, err, sizeof(err)), 0);
    free(buf);
    unlink(path);

    assert_int_equal(tr__file_read("/tmp", 0, "a JSON file", &buf, &len, err, sizeof(err)),
                     TR_EISDIR);
    assert_string_equal(err, "/tmp: is a directory, expected a JSON file");
    assert_int_equal(tr__file_read(path, 0, "a JSON file", &buf, &len, NULL, 0), TR_ENOENT);
    assert_int_equal(tr__file_read(path, 0, "a JSON file", &buf, &len, err, sizeof(err)),
                     TR_ENOENT);
    assert_non_null(strstr(err, ": cannot open: "));
}

static void test_file_path_join_adds_one_slash(void **state)
{
    char out[16];
    assert_int_equal(tr__path_join(out, sizeof(out), "a/b", "c"), 0);
    assert_string_equal(out, "a/b/c");
    assert_int_equal(tr__path_join(out, sizeof(out), "a/b/", "c"), 0);
    assert_string_equal(out, "a/b/c");
    assert_int_equal(tr__path_join(out, sizeof(out), "", "c"), 0);
    assert_string_equal(out, "c");
    assert_int_equal(tr__path_join(out, sizeof(out), NULL, "c"), 0);
    assert_string_equal(out, "c");
    assert_int_equal(tr__path_join(out, 6, "a/b", "c"), 0); /* exactly fits */
    assert_int_equal(tr__path_join(out, 5, "a/b", "c"), TR_EINVAL);
    assert_string_equal(out, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_read_whole_with_spare_bytes),
        cmocka_unit_test(test_file_read_refusals_name_the_path),
        cmocka_unit_test(test_file_path_join_adds_one_slash),
    };
    return cmocka_run_group_tests_name("file", tests, NULL, NULL);
}
