/* kernel_internals.h: the CPU kernels' internals that the benchmarks time and the tests check,
 * in one test-only header: Adam (kernels/cpu/adam.h), the gradient norm (gradnorm.h), the
 * kernels' thread pool (parallel.h), fp16/bf16 conversion (half.h), the instruction-set switch
 * (isa.h), the GEMM back ends (blas_internal.h) and the vectorised loops (vec.h: bench_collectives
 * scales bare MPI's mean with the comm actor's own kernel).
 *
 * Programs under bench/ include this, never a private header: what they measure is below the
 * public API, and this header is the one place that says so. It lives with the tests because
 * it is not part of the installed API; nothing here is stable. Any thread, per the contracts
 * in the headers it includes.
 */
#ifndef TR_TESTS_SUPPORT_KERNEL_INTERNALS_H
#define TR_TESTS_SUPPORT_KERNEL_INTERNALS_H

#include "kernels/cpu/adam.h"
#include "kernels/cpu/blas_internal.h"
#include "kernels/cpu/gradnorm.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vec.h"

#endif
