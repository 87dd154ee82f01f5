/* The BLAS check: the right verdict for made-up CPU/core pairs (the Intel AVX-512 machine on
 * which OpenBLAS 0.3.21 fell back to Prescott among them), a consistent verdict on this
 * machine, and a re-exec that happens once, with the right OPENBLAS_CORETYPE, and does not
 * loop; a library inside someone else's program warns once, at its first model.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>
#include <cmocka.h>

#include "kernels/cpu/blas_internal.h"
#include "troupe/model.h"

static const char *dyn = "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Prescott";

static void test_blas_verdicts_for_known_cpus(void **state)
{
    tr_blas_info_t info;
    tr__blas_cpu_t sapphire = {.cls = 3, .bf16 = 1}, skx = {.cls = 3}, zen2 = {.cls = 2, .amd = 1};
    tr__blas_assess(&info, "Prescott", dyn, &sapphire);
    assert_true(info.slow);
    assert_string_equal(info.best_core, "Cooperlake");
    assert_non_null(strstr(info.warning, "OPENBLAS_CORETYPE=Cooperlake"));
    tr__blas_assess(&info, "Haswell", dyn, &skx);
    assert_true(info.slow);
    assert_non_null(strstr(info.warning, "OPENBLAS_CORETYPE=SkylakeX"));
    tr__blas_assess(&info, "SkylakeX", dyn, &skx);
    assert_false(info.slow);
    assert_string_equal(info.warning, "");
    tr__blas_assess(&info, "Zen", dyn, &zen2);
    assert_false(info.slow);
    tr__blas_assess(&info, "Prescott", dyn, &zen2);
    assert_true(info.slow);
    assert_string_equal(info.best_core, "Zen");
    tr__blas_cpu_t zen4 = {.cls = 3, .bf16 = 1, .amd = 1}; // 512-bit FMAs as two 256-bit halves
    tr__blas_assess(&info, "Zen", dyn, &zen4);
    assert_false(info.slow);
    tr__blas_assess(&info, "Prescott", dyn, &zen4);
    assert_true(info.slow);
    assert_string_equal(info.best_core, "Cooperlake"); // what OpenBLAS 0.3.21 picks itself
    tr__blas_assess(&info, "Prescott", "OpenBLAS 0.3.21 Prescott", &zen2); // not DYNAMIC_ARCH
    assert_non_null(strstr(info.warning, "DYNAMIC_ARCH"));
}

static void test_blas_check_on_this_machine_is_consistent(void **state)
{
    tr_blas_info_t info;
    tr__blas_cpu_t cpu;
    tr_blas_check(&info);
    tr__blas_cpu(&cpu);
    print_message("blas: %s\n", info.description);
    assert_string_equal(info.corename, openblas_get_corename());
    assert_int_equal(info.slow,
                     tr__blas_core_class(info.corename) < (cpu.amd && cpu.cls == 3 ? 2 : cpu.cls));
    assert_int_equal(info.slow, info.warning[0] != '\0');
}

/* The child half: re-exec if needed, then report what it runs with. */
static int child(int argc, char **argv)
{
    tr_blas_reexec_if_needed(argc, argv);
    const char *ct = getenv("OPENBLAS_CORETYPE"), *marker = getenv("TR_BLAS_REEXEC");
    const char *nt = getenv("OPENBLAS_NUM_THREADS");
    printf("coretype=%s marker=%s core=%s threads=%s\n", ct ? ct : "-", marker ? marker : "-",
           openblas_get_corename(), nt ? nt : "-");
    return 0;
}

/* Runs this test binary as "reexec-child" under the environment `env` (an env(1) argument
 * list, %s-formatted with arg) and returns its one line. */
static void run_child(const char *env, const char *arg, char *line, size_t len)
{
    char self[512], envs[300], cmd[900];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    assert_true(n > 0);
    self[n] = '\0';
    snprintf(envs, sizeof(envs), env, arg);
    snprintf(cmd, sizeof(cmd), "env %s '%s' reexec-child 2>/dev/null", envs, self);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    line[0] = '\0';
    assert_non_null(fgets(line, (int)len, p));
    assert_int_equal(pclose(p), 0);
}

static void test_blas_reexec_sets_coretype_once(void **state)
{
    tr__blas_cpu_t cpu;
    tr__blas_cpu(&cpu);
    if (cpu.cls == 0) skip(); // an SSE-only CPU: Prescott is its best core, nothing to fix
    tr_blas_info_t info;
    tr__blas_assess(&info, "Prescott", dyn, &cpu);
    char line[256], want[256];
    run_child("-u OPENBLAS_CORETYPE -u TR_BLAS_REEXEC -u OPENBLAS_NUM_THREADS "
              "TR_BLAS_PRETEND_CORE=Prescott%s",
              "", line, sizeof(line));
    snprintf(want, sizeof(want), "coretype=%s marker=1 core=%s threads=1\n", info.best_core,
             info.best_core);
    assert_string_equal(line, want);
    // a fast core but no OPENBLAS_NUM_THREADS: re-executed with one OpenBLAS thread only
    run_child("-u TR_BLAS_REEXEC -u OPENBLAS_NUM_THREADS OPENBLAS_CORETYPE=%s", info.best_core,
              line, sizeof(line));
    assert_non_null(strstr(line, "marker=1"));
    assert_non_null(strstr(line, "threads=1"));
    // the caller's own OPENBLAS_NUM_THREADS is kept, and nothing else needs fixing: no exec
    run_child("-u TR_BLAS_REEXEC OPENBLAS_NUM_THREADS=2 OPENBLAS_CORETYPE=%s", info.best_core, line,
              sizeof(line));
    assert_non_null(strstr(line, "marker=- "));
    assert_non_null(strstr(line, "threads=2"));
    // already re-executed once: the marker stops a second exec even if still "slow"
    run_child("-u OPENBLAS_CORETYPE TR_BLAS_REEXEC=1 TR_BLAS_PRETEND_CORE=Prescott%s", "", line,
              sizeof(line));
    assert_non_null(strstr(line, "coretype=- marker=1"));
}

/* Another child: a program embedding the library, creating two models. */
static int warn_child(void)
{
    int widths[] = {3, 2};
    for (int i = 0; i < 2; i++) {
        tr_model_t *m;
        if (tr_model_mlp_create(&m, widths, 2, NULL, 0)) return 1;
        tr_model_destroy(m);
    }
    return 0;
}

static void test_blas_library_warns_once_at_first_model(void **state)
{
    tr__blas_cpu_t cpu;
    tr__blas_cpu(&cpu);
    if (cpu.cls == 0) skip();
    char self[512], cmd[700], out[4096] = "";
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    assert_true(n > 0);
    self[n] = '\0';
    snprintf(cmd, sizeof(cmd),
             "env -u OPENBLAS_CORETYPE TR_BLAS_PRETEND_CORE=Prescott '%s' warn-child 2>&1", self);
    FILE *p = popen(cmd, "r");
    size_t got = fread(out, 1, sizeof(out) - 1, p);
    out[got] = '\0';
    assert_int_equal(pclose(p), 0);
    const char *first = strstr(out, "OPENBLAS_CORETYPE=");
    assert_non_null(first);
    assert_null(strstr(first + 1, "OPENBLAS_CORETYPE=")); // once, not per model
}

/* The two matrix-product libraries agree with a double-precision reference (within fp32
 * rounding) for every transposition, odd shapes, alpha and beta, and leading dimensions wider
 * than the rows, leaving the padding alone; the linear layers' library is the CPU's in
 * gemm.c's table unless TROUPE_GEMM names one. */
static double ref_at(const float *X, int t, int ld, int i, int k) /* op(X)[i][k] */
{
    return t ? X[(size_t)k * ld + i] : X[(size_t)i * ld + k];
}

static float c0(size_t i)
{
    return (float)(i % 5);
}

static void test_gemm_libraries_agree(void **state)
{
    (void)state;
    const int shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {64, 96, 128}, {130, 67, 257}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
                size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb;
                size_t nc = (size_t)M * ldc;
                float *A = malloc(na * 4), *B = malloc(nb * 4), *C[2];
                for (size_t i = 0; i < na; i++)
                    A[i] = (float)((int)(i * 37 % 29) - 14) / 16;
                for (size_t i = 0; i < nb; i++)
                    B[i] = (float)((int)(i * 53 % 31) - 15) / 32;
                for (int b = 0; b < 2; b++) {
                    C[b] = malloc(nc * 4);
                    for (size_t i = 0; i < nc; i++)
                        C[b][i] = c0(i);
                    tr__sgemm(b ? TR__GEMM_ONEDNN : TR__GEMM_OPENBLAS, ta, tb, M, N, K, 0.5f, A,
                              lda, B, ldb, 2.0f, C[b], ldc);
                }
                for (int b = 0; b < 2; b++)
                    for (int i = 0; i < M; i++)
                        for (int j = 0; j < ldc; j++) {
                            size_t at = (size_t)i * ldc + j;
                            double r = j < N ? 2.0 * c0(at) : c0(at);
                            for (int k = 0; j < N && k < K; k++)
                                r += 0.5 * ref_at(A, ta, lda, i, k) * ref_at(B, tb, ldb, k, j);
                            if (fabs(C[b][at] - r) > 1e-4 * (1 + fabs(r)))
                                fail_msg("%s, %dx%dx%d, ta %d, tb %d: C[%d][%d] = %g, expected %g",
                                         tr__gemm_backend_name(b), M, N, K, ta, tb, i, j, C[b][at],
                                         r);
                        }
                free(A);
                free(B);
                free(C[0]);
                free(C[1]);
            }
    const char *e = getenv("TROUPE_GEMM");
    tr__blas_cpu_t cpu;
    tr__blas_cpu(&cpu);
    int want = e && !strcmp(e, "openblas") ? TR__GEMM_OPENBLAS
               : e && !strcmp(e, "onednn") ? TR__GEMM_ONEDNN
               : cpu.amd                   ? TR__GEMM_ONEDNN
                                           : TR__GEMM_OPENBLAS;
    assert_int_equal(tr__gemm_backend(), want);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "reexec-child") == 0) return child(argc, argv);
    if (argc > 1 && strcmp(argv[1], "warn-child") == 0) return warn_child();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blas_verdicts_for_known_cpus),
        cmocka_unit_test(test_blas_check_on_this_machine_is_consistent),
        cmocka_unit_test(test_blas_reexec_sets_coretype_once),
        cmocka_unit_test(test_blas_library_warns_once_at_first_model),
        cmocka_unit_test(test_gemm_libraries_agree),
    };
    return cmocka_run_group_tests_name("blas", tests, NULL, NULL);
}
