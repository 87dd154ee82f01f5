/* isa.c: the run-time choice of instruction set for the CPU kernels.
 *
 * The first call of tr__isa_get() probes the CPU with __builtin_cpu_supports and reads
 * TR_KERNELS_ISA; the result is cached in an atomic (relaxed: it is a single word that
 * every racing first caller computes to the same value).
 */
#include "kernels/cpu/isa.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_int chosen = -1;

tr_isa_t tr__isa_best(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return TR_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return TR_ISA_AVX2;
    return TR_ISA_SCALAR;
}

/* TR_KERNELS_ISA, or the best when unset or unknown. */
static tr_isa_t from_env(void)
{
    const char *s = getenv("TR_KERNELS_ISA");
    if (s && strcmp(s, "scalar") == 0) return TR_ISA_SCALAR;
    if (s && strcmp(s, "avx2") == 0) return TR_ISA_AVX2;
    return TR_ISA_AVX512;
}

tr_isa_t tr__isa_set(tr_isa_t isa)
{
    tr_isa_t best = tr__isa_best();
    if (isa > best) isa = best;
    atomic_store_explicit(&chosen, (int)isa, memory_order_relaxed);
    return isa;
}

tr_isa_t tr__isa_get(void)
{
    int isa = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (isa >= 0) return (tr_isa_t)isa;
    return tr__isa_set(from_env());
}

const char *tr__isa_name(tr_isa_t isa)
{
    switch (isa) {
    case TR_ISA_AVX512:
        return "avx512";
    case TR_ISA_AVX2:
        return "avx2";
    default:
        return "scalar";
    }
}
