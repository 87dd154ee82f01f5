/* Troupe BLAS check: is OpenBLAS running kernels that match this CPU?
 *
 * A DYNAMIC_ARCH OpenBLAS picks its kernels ("core type") when it loads, from the CPU it
 * recognises; a CPU newer than the OpenBLAS release may get the generic Prescott (SSE3)
 * kernels, several times slower (measured: 32 vs 155 GFLOP/s per core on an AVX-512 Xeon
 * with OpenBLAS 0.3.21). The core type can only be changed before the library loads, with
 * the OPENBLAS_CORETYPE environment variable. tr_blas_check compares the core OpenBLAS chose
 * with the CPU's own feature flags; tr_blas_reexec_if_needed fixes a program by re-executing
 * it once with the variable set. A library embedded in someone else's trainer cannot do
 * that, so it prints the warning, which names the exact fix, to stderr once per process
 * when the first model is created (tr_model_create).
 */
#ifndef TR_INCLUDE_TROUPE_BLAS_H
#define TR_INCLUDE_TROUPE_BLAS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char corename[32];     /* the kernels OpenBLAS runs: "Prescott", "Haswell", "SkylakeX"... */
    char config[160];      /* openblas_get_config(): version, DYNAMIC_ARCH or not */
    char cpu_isa[16];      /* the CPU's best vector class: "avx512", "avx2", "avx", "sse" */
    char best_core[32];    /* the OPENBLAS_CORETYPE that fits the CPU */
    int slow;              /* 1: OpenBLAS uses a lower vector class than the CPU has */
    char description[256]; /* one line: OpenBLAS version, core, CPU class */
    char warning[512];     /* "" unless slow; otherwise what is wrong and the exact fix */
} tr_blas_info_t;

/* Fills info. Never fails. For tests, TR_BLAS_PRETEND_CORE=<name> makes it act as if
 * OpenBLAS had chosen that core (only while OPENBLAS_CORETYPE is unset). Any thread. */
void tr_blas_check(tr_blas_info_t *info);

/* For programs, first thing in main: OpenBLAS reads two settings only when it loads, so
 * unless TR_BLAS_REEXEC (the loop guard) is set, re-executes the program (/proc/self/exe,
 * same argv, TR_BLAS_REEXEC=1) when either is missing: OPENBLAS_CORETYPE=<best core> when
 * OpenBLAS runs slow kernels, and OPENBLAS_NUM_THREADS=1 when it is unset (Troupe calls
 * OpenBLAS one thread per call inside its own thread budget, docs/threads.md; OpenBLAS's own
 * idle threads would only hold memory, and one that cannot allocate under a memory limit
 * hangs the process's exit). Does not return then. Otherwise returns 0, after printing the
 * warning to stderr if BLAS is still slow; -errno if the exec failed (with a line saying
 * so). Main thread, before threads. */
int tr_blas_reexec_if_needed(int argc, char **argv);

/* The CPU kernels' process-wide knobs (used by the models of troupe/model.h). */

/* 1 when this CPU multiplies bf16 itself (AVX512-BF16), so that bf16 is faster than fp32; 0
 * when its bf16 products are emulated. Any thread. */
int tr_bf16_native(void);

/* Sets the process's budget of compute threads for the CPU kernels, callers included (0 = the
 * CPUs this process may run on); concurrent callers share it (docs/threads.md). Safe while
 * kernels run: a lower budget applies from each job's next chunk. Process-wide, any thread. */
void tr_kernels_set_threads(int n);

#ifdef __cplusplus
}
#endif
#endif
