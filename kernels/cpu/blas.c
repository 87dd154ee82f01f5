/* blas.c: checks that OpenBLAS runs kernels fit for this CPU (see troupe/blas.h).
 *
 * Both sides are reduced to a vector class: 0 SSE, 1 AVX, 2 AVX2 + FMA, 3 AVX-512 (F, BW,
 * VL, DQ, CD: what OpenBLAS's SkylakeX kernels use). The CPU's class comes from
 * __builtin_cpu_supports; OpenBLAS's from the name of the core it chose, through the table
 * of OpenBLAS 0.3.21's x86-64 DYNAMIC_ARCH targets below. OpenBLAS is "slow" when its class
 * is below what the CPU needs to reach its peak (needed_class). The best core for a class:
 * Cooperlake (AVX-512 with BF16), SkylakeX, Zen (AMD) or Haswell, Sandybridge; all exist in
 * 0.3.21's DYNAMIC_ARCH builds.
 */
#include "troupe/blas.h"

#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "kernels/cpu/blas_internal.h"

static const struct {
    const char *core;
    int cls;
} cores[] = {
    {"SapphireRapids", 3}, {"Cooperlake", 3},  {"SkylakeX", 3},
    {"Haswell", 2},        {"Zen", 2},         {"Excavator", 2},
    {"Sandybridge", 1},    {"Steamroller", 1}, {"Piledriver", 1},
    {"Bulldozer", 1},
};

static const char *class_names[] = {"sse", "avx", "avx2", "avx512"};

int tr__blas_core_class(const char *core)
{
    for (size_t i = 0; i < sizeof(cores) / sizeof(cores[0]); i++)
        if (strcasecmp(core, cores[i].core) == 0) return cores[i].cls;
    return 0; // Prescott, Core2, Nehalem, Barcelona, Atom...: SSE kernels
}

void tr__blas_cpu(tr__blas_cpu_t *cpu)
{
    memset(cpu, 0, sizeof(*cpu));
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512cd"))
        cpu->cls = 3;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        cpu->cls = 2;
    else if (__builtin_cpu_supports("avx"))
        cpu->cls = 1;
    cpu->bf16 = __builtin_cpu_supports("avx512bf16") != 0;
    cpu->amd = __builtin_cpu_is("amd") != 0;
#endif
}

static const char *best_core(const tr__blas_cpu_t *cpu)
{
    switch (cpu->cls) {
    case 3:
        return cpu->bf16 ? "Cooperlake" : "SkylakeX";
    case 2:
        return cpu->amd ? "Zen" : "Haswell";
    case 1:
        return "Sandybridge";
    default:
        return "Prescott";
    }
}

/* The lowest kernel class that runs this CPU near its peak. AMD's AVX-512 (Zen 4) executes
 * 512-bit FMAs as two 256-bit halves, so AVX2 kernels lose nothing there: measured on a Zen 4
 * with OpenBLAS 0.3.21, one core, sgemm 1024^3: Haswell/Zen kernels 100-108 GFLOP/s,
 * SkylakeX/Cooperlake 90-102, Prescott 39. */
static int needed_class(const tr__blas_cpu_t *cpu)
{
    return cpu->amd && cpu->cls == 3 ? 2 : cpu->cls;
}

void tr__blas_assess(tr_blas_info_t *info, const char *core, const char *config,
                     const tr__blas_cpu_t *cpu)
{
    memset(info, 0, sizeof(*info));
    snprintf(info->corename, sizeof(info->corename), "%s", core);
    snprintf(info->config, sizeof(info->config), "%s", config);
    snprintf(info->cpu_isa, sizeof(info->cpu_isa), "%s", class_names[cpu->cls]);
    snprintf(info->best_core, sizeof(info->best_core), "%s", best_core(cpu));
    int have = tr__blas_core_class(core);
    info->slow = have < needed_class(cpu);
    snprintf(info->description, sizeof(info->description),
             "%s; core %s (%s kernels); CPU class %s, best core %s", config, core,
             class_names[have], class_names[cpu->cls], info->best_core);
    if (!info->slow) return;
    const char *fix = strstr(config, "DYNAMIC_ARCH")
                          ? "set OPENBLAS_CORETYPE=%s in the environment before the program "
                            "starts (OpenBLAS reads it only when it loads)"
                          : "this OpenBLAS is built for one CPU only (no DYNAMIC_ARCH): install "
                            "a DYNAMIC_ARCH build (Debian's libopenblas0-pthread), then set "
                            "OPENBLAS_CORETYPE=%s";
    char how[256];
    snprintf(how, sizeof(how), fix, info->best_core);
    snprintf(info->warning, sizeof(info->warning),
             "troupe: WARNING: OpenBLAS runs %s kernels (core %s) on a CPU with %s: matrix "
             "products will run several times below this CPU's speed. Fix: %s.",
             class_names[have], core, class_names[cpu->cls], how);
}

void tr_blas_check(tr_blas_info_t *info)
{
    tr__blas_cpu_t cpu;
    tr__blas_cpu(&cpu);
    const char *core = openblas_get_corename();
    const char *pretend = getenv("TR_BLAS_PRETEND_CORE");
    if (pretend && *pretend && !getenv("OPENBLAS_CORETYPE")) core = pretend;
    tr__blas_assess(info, core ? core : "unknown", openblas_get_config(), &cpu);
}

static pthread_once_t warn_once = PTHREAD_ONCE_INIT;

static void warn_if_slow(void)
{
    tr_blas_info_t info;
    tr_blas_check(&info);
    if (info.slow) fprintf(stderr, "%s\n", info.warning);
}

void tr__blas_warn_once(void)
{
    pthread_once(&warn_once, warn_if_slow);
}

int tr_blas_reexec_if_needed(int argc, char **argv)
{
    tr_blas_info_t info;
    tr_blas_check(&info);
    bool fix_core = info.slow && !getenv("OPENBLAS_CORETYPE");
    bool fix_threads = !getenv("OPENBLAS_NUM_THREADS");
    if ((fix_core || fix_threads) && !getenv("TR_BLAS_REEXEC") && argc > 0 && argv && !argv[argc]) {
        if (fix_core) setenv("OPENBLAS_CORETYPE", info.best_core, 1);
        if (fix_threads) setenv("OPENBLAS_NUM_THREADS", "1", 1);
        setenv("TR_BLAS_REEXEC", "1", 1);
        fflush(NULL);
        execv("/proc/self/exe", argv);
        int err = -errno;
        if (fix_core) unsetenv("OPENBLAS_CORETYPE");
        if (fix_threads) unsetenv("OPENBLAS_NUM_THREADS");
        unsetenv("TR_BLAS_REEXEC");
        fprintf(stderr, "%s%sre-executing to fix OpenBLAS's set-up failed: %s\n", info.warning,
                info.warning[0] ? " (" : "", strerror(-err));
        return err;
    }
    tr__blas_warn_once();
    return 0;
}

void tr__blas_one_thread(void)
{
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}
