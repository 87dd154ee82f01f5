/* Rank discovery: each launcher's variables, their order, values given by the caller, bad
 * values named with the variable, and a torchrun-style launch answered with how to use MPI. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/comm/ranks.h"
#include "troupe.h"

static const char *const vars[] = {"OMPI_COMM_WORLD_RANK",
                                   "OMPI_COMM_WORLD_SIZE",
                                   "OMPI_COMM_WORLD_LOCAL_RANK",
                                   "PMI_RANK",
                                   "PMI_SIZE",
                                   "SLURM_PROCID",
                                   "SLURM_NTASKS",
                                   "SLURM_LOCALID",
                                   "RANK",
                                   "WORLD_SIZE",
                                   "LOCAL_RANK"};

static int clean(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        unsetenv(vars[i]);
    return 0;
}

static void expect(int rank, int world, int local, const char *source)
{
    tr_ranks_t r;
    char why[256];
    assert_int_equal(tr_ranks_discover(NULL, &r, why, sizeof(why)), 0);
    assert_int_equal(r.rank, rank);
    assert_int_equal(r.world, world);
    assert_int_equal(r.local_rank, local);
    assert_string_equal(r.source, source);
}

static void expect_error(const char *text)
{
    tr_ranks_t r;
    char why[256];
    assert_int_equal(tr_ranks_discover(NULL, &r, why, sizeof(why)), TR_EINVAL);
    if (!strstr(why, text)) fail_msg("'%s' does not say '%s'", why, text);
}

static void test_ranks_single_process_without_a_launcher(void **state)
{
    (void)state;
    expect(0, 1, 0, "single process");
}

static void test_ranks_each_launcher_in_order(void **state)
{
    (void)state;
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_LOCALID", "1", 1);
    expect(5, 8, 1, "Slurm");
    /* PMI before Slurm */
    setenv("PMI_RANK", "2", 1);
    setenv("PMI_SIZE", "4", 1);
    expect(2, 4, 0, "PMI");
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1); /* Open MPI first */
    expect(3, 4, 1, "Open MPI");
    tr_ranks_t given = {.rank = 1, .world = 2}, r; /* the caller's values win */
    assert_int_equal(tr_ranks_discover(&given, &r, NULL, 0), 0);
    assert_int_equal(r.world, 2);
    assert_string_equal(r.source, "api");
    given.rank = 2;
    char why[128];
    assert_int_equal(tr_ranks_discover(&given, &r, why, sizeof(why)), TR_EINVAL);
    assert_non_null(strstr(why, "rank 2 of world 2"));
}

static void test_ranks_bad_values_name_the_variable(void **state)
{
    (void)state;
    setenv("OMPI_COMM_WORLD_SIZE", "two", 1);
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    expect_error("OMPI_COMM_WORLD_SIZE=\"two\": expected an integer from 1 to");
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    expect_error("Open MPI: OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2");
    unsetenv("OMPI_COMM_WORLD_RANK");
    expect_error("Open MPI sets OMPI_COMM_WORLD_SIZE but not OMPI_COMM_WORLD_RANK");
    clean(NULL);
    setenv("PMI_RANK", "-1", 1);
    setenv("PMI_SIZE", "2", 1);
    expect_error("PMI_RANK=\"-1\"");
}

static void test_ranks_torchrun_is_answered_with_mpi(void **state)
{
    (void)state;
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("LOCAL_RANK", "0", 1);
    expect_error("launch with `mpirun -np 2 ...` or `srun -n 2 ...`");
    setenv("WORLD_SIZE", "1", 1); /* a torchrun of one process is one process */
    expect(0, 1, 0, "single process");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_ranks_single_process_without_a_launcher, clean),
        cmocka_unit_test_setup(test_ranks_each_launcher_in_order, clean),
        cmocka_unit_test_setup(test_ranks_bad_values_name_the_variable, clean),
        cmocka_unit_test_setup(test_ranks_torchrun_is_answered_with_mpi, clean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
