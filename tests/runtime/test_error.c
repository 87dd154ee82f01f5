/* The error table: codes, names and messages come from one place and agree with errno. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "tr_build_config.h"
#include "troupe/error.h"
#include "troupe/runtime.h"

static void test_error_errno_values_pass_through(void **state)
{
    assert_int_equal(TR_EINVAL, -EINVAL);
    assert_int_equal(TR_ENOMEM, -ENOMEM);
    assert_string_equal(tr_err_name(-EINVAL), "TR_EINVAL");
    assert_string_equal(tr_strerror(TR_EINVAL), "invalid argument");
}

static void test_error_own_codes_have_names_and_messages(void **state)
{
    assert_string_equal(tr_err_name(TR_EDECODE), "TR_EDECODE");
    assert_string_equal(tr_strerror(TR_EDECODE), "malformed message payload");
    assert_string_equal(tr_err_name(0), "TR_OK");
    assert_string_equal(tr_strerror(0), "success");
}

static void test_error_unknown_codes_are_described(void **state)
{
    assert_string_equal(tr_err_name(-4999), "TR_UNKNOWN");
    assert_string_equal(tr_strerror(-4999), "unknown error");
    /* an errno value outside the table comes from the C library */
    assert_true(strlen(tr_strerror(-ENOLINK)) > 0);
    assert_string_not_equal(tr_strerror(-ENOLINK), "unknown error");
}

/* tr_build_info answers what the configure step found, so an embedding program can tell. */
static void test_build_info_says_what_was_built(void **state)
{
    (void)state;
    tr_build_info_t b;
    tr_build_info(&b);
    assert_string_equal(b.version, TR_VERSION_STRING);
    assert_int_equal(b.mpi, TR_HAVE_MPI);
    assert_int_equal(b.cuda, TR_HAVE_CUDA);
    assert_int_equal(b.nccl, TR_HAVE_NCCL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_errno_values_pass_through),
        cmocka_unit_test(test_error_own_codes_have_names_and_messages),
        cmocka_unit_test(test_error_unknown_codes_are_described),
        cmocka_unit_test(test_build_info_says_what_was_built),
    };
    return cmocka_run_group_tests_name("error", tests, NULL, NULL);
}
