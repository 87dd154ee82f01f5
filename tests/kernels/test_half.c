/* Half-precision conversion: hand-picked rounding cases (ties to even, overflow to Inf,
 * subnormals, NaN), every fp16 value decoded exactly and round-tripped, and the vector
 * paths (F16C, AVX-512) writing the same bits as the scalar one on random bit patterns. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu/half.h"
#include "kernels/cpu/parallel.h"
#include "kernel_testing.h"

static float f(uint32_t bits)
{
    return tr__f32_from_bits(bits);
}

static void test_half_fp16_rounds_to_nearest_even(void **state)
{
    struct {
        float in;
        uint16_t want;
    } cases[] = {
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {1.0f + 0x1p-11f, 0x3c00}, /* tie: stays on even 1.0 */
        {1.0f + 0x3p-11f, 0x3c02}, /* tie: up to even */
        {f(0x3f801001), 0x3c01},   /* just above the tie */
        {65504.0f, 0x7bff},
        {65519.996f, 0x7bff},
        {65520.0f, 0x7c00}, /* tie between max and 2^16: even is Inf */
        {1e6f, 0x7c00},
        {-1e6f, 0xfc00},
        {0x1p-14f, 0x0400}, /* smallest normal */
        {0x1p-24f, 0x0001}, /* smallest subnormal */
        {0x1p-25f, 0x0000}, /* tie: to even zero */
        {0x1.000002p-25f, 0x0001},
        {0x3p-25f, 0x0002},     /* tie: to even 2 */
        {0x1.ffcp-15f, 0x0400}, /* tie above the largest subnormal: up to the smallest normal */
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {f(0x7f800000), 0x7c00},
        {f(0xff800000), 0xfc00},
        {f(0x7fc00000), 0x7e00},
        {f(0xffc00000), 0xfe00},
        {f(0x7f800001), 0x7e00}, /* signalling NaN becomes quiet */
        {f(0x7fd02000), 0x7e81}, /* payload's top bits kept */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint16_t got = tr_half_from_float(cases[i].in);
        if (got != cases[i].want)
            printf("case %zu: %a -> %04x, want %04x\n", i, cases[i].in, got, cases[i].want);
        assert_int_equal(got, cases[i].want);
    }
}

static void test_half_bf16_rounds_to_nearest_even(void **state)
{
    struct {
        float in;
        uint16_t want;
    } cases[] = {
        {1.0f, 0x3f80},           {1.0f + 0x1p-8f, 0x3f80},
        {1.0f + 0x3p-8f, 0x3f82}, {f(0x3f808001), 0x3f81},
        {-3.0f, 0xc040},          {f(0x7f7fffff), 0x7f80}, /* max float rounds to Inf */
        {f(0x00000001), 0x0000},  {f(0x00008000), 0x0000},
        {f(0x00018000), 0x0002},  {f(0x7f800000), 0x7f80},
        {f(0x7f800001), 0x7fc0},  {f(0xffc00000), 0xffc0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(tr_bf16_from_float(cases[i].in), cases[i].want);
}

static void test_half_every_fp16_decodes_exactly_and_round_trips(void **state)
{
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t e = (h >> 10) & 31, m = h & 1023;
        float got = tr_half_to_float((uint16_t)h);
        if (e == 31 && m) {
            assert_true(isnan(got));
            assert_int_equal(tr_half_from_float(got), h | 0x200);
            continue;
        }
        double mag = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(1024 + m, (int)e - 25);
        assert_true((double)got == (h & 0x8000 ? -mag : mag));
        assert_int_equal(tr_half_from_float(got), h);
        assert_int_equal(tr_bf16_from_float(tr_bf16_to_float((uint16_t)h)), h | ((e == 0xff) << 6));
    }
}

/* Random bit patterns cover every exponent, NaNs included; lengths not a multiple of 16
 * exercise the tails. */
static void test_half_vector_paths_write_scalar_bits(void **state)
{
    enum { N = (1 << 20) + 13 };
    uint64_t s = 42;
    float *src = malloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++)
        src[i] = f((uint32_t)kt_next(&s));
    uint16_t *want = malloc(N * sizeof(uint16_t)), *got = malloc(N * sizeof(uint16_t));
    tr_isa_t isas[2];
    int k = kt_vector_isas(isas);
    for (int kind = TR_HALF_FP16; kind <= TR_HALF_BF16; kind++) {
        tr__isa_set(TR_ISA_SCALAR);
        tr_half_from_float_array(want, src, N, (tr_half_kind_t)kind);
        for (int i = 0; i < k; i++) {
            tr__isa_set(isas[i]);
            tr_half_from_float_array(got, src, N, (tr_half_kind_t)kind);
            assert_memory_equal(got, want, N * sizeof(uint16_t));
        }
    }
    float *back = malloc(N * sizeof(float));
    tr_half_to_float_array(back, want, N, TR_HALF_BF16);
    for (size_t i = 0; i < N; i++)
        assert_true(tr__f32_bits(back[i]) == (uint32_t)want[i] << 16);
    tr__isa_set(tr__isa_best());
    tr_parallel_shutdown();
    free(src);
    free(want);
    free(got);
    free(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_fp16_rounds_to_nearest_even),
        cmocka_unit_test(test_half_bf16_rounds_to_nearest_even),
        cmocka_unit_test(test_half_every_fp16_decodes_exactly_and_round_trips),
        cmocka_unit_test(test_half_vector_paths_write_scalar_bits),
    };
    return cmocka_run_group_tests_name("half", tests, NULL, NULL);
}
