/* gemm.c: one single-threaded fp32 matrix product, row-major, on oneDNN or OpenBLAS.
 *
 * The kernels split every product over their own thread pool (kernels/cpu/linear.c), so each
 * call here is single-threaded. oneDNN (Debian's libdnnl, the library PyTorch's CPU kernels
 * use) is built on OpenMP: each pool thread sets its OpenMP thread count to 1 before its first
 * oneDNN call (a per-thread setting), so no OpenMP team is ever started beside the pool. The
 * setter is looked up in the process (libgomp comes with libdnnl) rather than linked, so no
 * compiler's OpenMP flags are needed to build the library.
 *
 * Which library: fixed per CPU by a table, from measurements, because a choice measured at
 * start-up could flip between processes and a resumed run would then not match an unbroken one
 * bitwise. AMD (Zen 4, 2 threads, the model's shapes 1024 x {384, 1152, 1536, 8192} x {384,
 * 1536}): OpenBLAS 104-182 GFLOP/s, oneDNN 169-208, so oneDNN. Intel (Ice Lake, this project's
 * CI machine): single-threaded oneDNN 156-172 against OpenBLAS's 149-159 with its best core,
 * but the GPT-2 step no faster (bench_gpt2_step, 6 runs each alternating: median 1,771 tokens/s
 * on oneDNN, 1,833 on OpenBLAS), so OpenBLAS. TROUPE_GEMM=openblas or onednn overrides the
 * table, for comparisons. The attention's small per-head products follow the same choice, on
 * oneDNN through cached matmul primitives (gemm_bf16.c) rather than dnnl_sgemm, whose per-call
 * set-up made it no faster than OpenBLAS at those shapes (attention.c).
 */
#include <cblas.h>
#include <dlfcn.h>
#include <dnnl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/blas_internal.h"

static _Thread_local bool omp_single;
static void (*omp_set_threads)(int);
static pthread_once_t omp_once = PTHREAD_ONCE_INIT;

static void find_omp(void)
{
    *(void **)&omp_set_threads = dlsym(RTLD_DEFAULT, "omp_set_num_threads");
}

int tr__gemm_choice(const char *var, const char *name0, const char *name1, int dflt)
{
    const char *e = getenv(var);
    if (!e || !e[0]) return dflt;
    if (!strcmp(e, name0)) return 0;
    if (!strcmp(e, name1)) return 1;
    fprintf(stderr, "troupe: warning: %s=%s: expected %s or %s; using the default, %s\n", var, e,
            name0, name1, dflt ? name1 : name0);
    return dflt;
}

int tr__gemm_backend(void)
{
    static _Atomic int chosen = -1; /* TR__GEMM_* once the environment was read */
    int b = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (b < 0) {
        tr__blas_cpu_t cpu;
        tr__blas_cpu(&cpu);
        _Static_assert(TR__GEMM_OPENBLAS == 0 && TR__GEMM_ONEDNN == 1, "choice order");
        b = tr__gemm_choice("TROUPE_GEMM", "openblas", "onednn",
                            cpu.amd ? TR__GEMM_ONEDNN : TR__GEMM_OPENBLAS);
        atomic_store_explicit(&chosen, b, memory_order_relaxed);
    }
    return b;
}

const char *tr__gemm_backend_name(int backend)
{
    return backend == TR__GEMM_ONEDNN ? "oneDNN" : "OpenBLAS";
}

void tr__onednn_one_thread(void)
{
    if (omp_single) return;
    pthread_once(&omp_once, find_omp);
    if (omp_set_threads) omp_set_threads(1);
    omp_single = true;
}

void tr__sgemm(int backend, int ta, int tb, int M, int N, int K, float alpha, const float *A,
               int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (backend == TR__GEMM_ONEDNN) {
        tr__onednn_one_thread();
        if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
                       ldc) == dnnl_success)
            return;
        /* oneDNN refuses only arguments it finds invalid, which OpenBLAS then reports too */
    }
    tr__blas_one_thread();
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
}
