/* The comm watchdog's words for an operation (tr__watch_describe), as its diagnosis and the
 * collective headers' divergence message print them: dtypes by name ("f32", "bf16"; "an
 * invalid dtype" for a value no rank should send), and a pipeline link's transfer with its
 * direction, peer rank, stages, kind, micro-batch and step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "actors/comm/watchdog.h"

static void describes(const tr__watch_op_t *o, const char *want)
{
    char got[320];
    tr__watch_describe(o, got, sizeof(got));
    printf("%s\n", got);
    if (strcmp(got, want)) fail_msg("described as\n  %s\nexpected\n  %s", got, want);
}

static void test_watchdog_describe_names_dtypes(void **state)
{
    (void)state;
    tr__watch_op_t o = {
        .op = TR__COLL_ALL_REDUCE, .dtype = TR_DTYPE_F32, .seq = 3, .bytes = 244, .step = 1};
    describes(&o, "collective #3, the all-reduce of bucket 0, 244 bytes of f32, step 1, "
                  "micro-step 0");
    o = (tr__watch_op_t){.op = TR__COLL_SCALAR,
                         .dtype = TR_DTYPE_F64,
                         .seq = 4,
                         .bytes = 16,
                         .step = 2,
                         .micro_step = 1,
                         .exchange = true};
    describes(&o, "the header exchange before collective #4, a scalar all-reduce, 16 bytes of "
                  "f64, step 2, micro-step 1");
    o.dtype = TR_DTYPE_BF16;
    o.exchange = false;
    describes(&o, "collective #4, a scalar all-reduce, 16 bytes of bf16, step 2, micro-step 1");
    o.dtype = 99; /* a corrupt header's */
    describes(&o, "collective #4, a scalar all-reduce, 16 bytes of an invalid dtype, step 2, "
                  "micro-step 1");
}

static void test_watchdog_describe_names_pipeline_transfers(void **state)
{
    (void)state;
    tr__watch_op_t o = {.op = TR__COLL_PIPE_RECV,
                        .dtype = TR_DTYPE_U8,
                        .bytes = 256,
                        .step = 5,
                        .micro_step = 2,
                        .peer = 1,
                        .stage = 0,
                        .peer_stage = 1,
                        .grad = true};
    assert_true(tr__watch_is_pipe(&o));
    describes(&o, "the pipeline's receive from rank 1 (stage 1 to stage 0) of the gradient of "
                  "micro-batch 2, step 5 (its header)");
    o = (tr__watch_op_t){.op = TR__COLL_PIPE_SEND,
                         .dtype = TR_DTYPE_F32,
                         .bytes = 2048,
                         .step = 7,
                         .micro_step = 3,
                         .peer = 3,
                         .stage = 0,
                         .peer_stage = 1,
                         .tensor = true};
    describes(&o, "the pipeline's send to rank 3 (stage 0 to stage 1) of the activation of "
                  "micro-batch 3, step 7 (its tensor, 2048 bytes of f32)");
    o.op = TR__COLL_ALL_GATHER;
    assert_false(tr__watch_is_pipe(&o));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_watchdog_describe_names_dtypes),
        cmocka_unit_test(test_watchdog_describe_names_pipeline_transfers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
